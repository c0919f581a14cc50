"""Ray start-up and the set of rollout actors: the one place ``ray.remote`` is applied to
:class:`rollout.core.worker.RolloutWorker`.

:class:`ActorSet` connects to (or starts) Ray, creates ``pool.num_actors`` async actors, checks
that they run the configured event loop, and wraps every call the pool makes on them (``run``,
``cancel``, ``info``, ``event_loop``, ``loop_lag``, ``pause_generation``, ``resume_generation``,
``close``). It knows nothing of episodes' bookkeeping: see :mod:`rollout.core.pool.scheduler`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from rollout.core.config import Config
from rollout.core.environment import domain_key
from rollout.core.pool import cluster, raycalls
from rollout.core.pool.fingerprint import SoftwareFingerprint, mismatch_line, software_fingerprint
from rollout.core.pool.raymetrics import RayRecorder
from rollout.core.records import EpisodeSpec, TaskIssue
from rollout.core.registry import registered_paths, restore_paths
from rollout.core.startup import PreflightError, check_ray_address
from rollout.core.worker import RolloutWorker as _Worker

logger = logging.getLogger(__name__)


class RolloutWorker(_Worker):
    """The rollout actor: a :class:`rollout.core.worker.RolloutWorker` built after the driver's
    registry path entries (``registry_paths``, :func:`rollout.core.registry.registered_paths`) are
    registered in the actor's process, so that a benchmark, chat format or context strategy
    registered by path in the driver is found there too (same name: the actor's process is
    ``ray::RolloutWorker``)."""

    def __init__(self, *args: Any, registry_paths: Mapping[str, Mapping[str, str]] | None = None, **kwargs: Any):
        restore_paths(registry_paths or {})
        super().__init__(*args, **kwargs)

    def software(self) -> dict[str, Any]:
        """What this actor's process runs (:func:`rollout.core.pool.fingerprint.software_fingerprint`
        of its ``env`` section), as plain values: :meth:`SoftwareFingerprint.to_dict`."""
        return software_fingerprint(self.env_cfg).to_dict()


RemoteRolloutWorker = ray.remote(RolloutWorker)
# True: a new local Ray cluster prestarts its idle task workers, as before issue 23 (see _init_ray;
# `python -m rollout.bench startup` turns it on for its "before" rows).
PRESTART_IDLE_WORKERS = False


def gcs_reachable(address: str | None, timeout_s: float = 1.0) -> bool:
    """True when a TCP connection to the GCS ``host:port`` opens within ``timeout_s`` seconds
    (``None`` or no port: unknown, True)."""
    if not address or ":" not in address:
        return True
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def head_lost() -> bool:
    """Whether this process is connected to a Ray cluster (``ray.init``) whose head's GCS no
    longer answers (:func:`gcs_reachable`); False when it is not connected."""
    if not ray.is_initialized():
        return False
    return not gcs_reachable(ray.get_runtime_context().gcs_address)  # the address is the worker's own (no call)


def ray_address(configured: str | None) -> str | None:
    """``pool.ray_address``, or, when it is null and ``RAY_ADDRESS`` is unset: ``None`` (Ray
    connects to the cluster ``ray start`` last recorded on this machine) when that cluster
    answers, else ``"local"``: a new local cluster (``ray.init()`` would wait for ever on a dead
    recorded one)."""
    if configured is not None or os.environ.get("RAY_ADDRESS"):
        return configured
    try:
        from ray._private.utils import read_ray_address

        recorded = read_ray_address()
    except Exception:  # a Ray without it: leave the choice to Ray
        return None
    if recorded and gcs_reachable(recorded):
        return None
    if recorded:
        logger.warning("the Ray cluster recorded on this machine (%s) does not answer; starting a local one", recorded)
    return "local"


#: What Ray's bare ``Exception`` says when a new local node's raylet did not register in time
#: (``ray/_private/node.py``, Ray 2.x); :func:`_init_ray` turns it into one line.
RAY_START_TIMED_OUT = "timed out during startup"


def _init_ray(configured: str | None) -> bool:
    """``ray.init`` on :func:`ray_address`, after preflight's one-line check of a named address; a
    new local cluster listens on 127.0.0.1 only (:func:`rollout.core.pool.cluster.loopback_only`).
    Returns whether it started a new local cluster.

    Raises:
        rollout.core.startup.PreflightError: ``configured`` does not answer; or a new local
            cluster did not start (Ray gives its raylet a fixed 30 s to register,
            ``ray/_private/node.py``, and raises a bare ``Exception`` saying so): one line saying
            what to do, instead of Ray's traceback. The half-started Ray processes share the
            driver's fate (Ray's kernel fate-sharing on Linux) and end with it.
    """
    check_ray_address(configured)
    address = ray_address(configured)
    # Ray >= 2.5x turns token auth on for a new local cluster and warns that it did at every
    # start; the local cluster is ours and the behaviour is the one we want.
    quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = quiet.level
    if address == "local" and "RAY_AUTH_MODE" not in os.environ:
        quiet.setLevel(logging.ERROR)
    # A new local cluster prestarts one idle worker per CPU for tasks the pool never runs (its
    # actors get workers of their own: their runtime_env differs): on a small machine they take
    # CPU from the actors' start-up, so none is prestarted (only settable on a new cluster).
    extra = {"_system_config": {"prestart_worker_first_driver": False}} if address == "local" and not PRESTART_IDLE_WORKERS else {}
    local = address == "local"
    try:
        # a new local cluster serves this driver alone: its ports (GCS, raylet, workers, agents, the
        # Prometheus export) listen on the loopback address, not on every interface
        with cluster.loopback_only() if local else contextlib.nullcontext():
            ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=True,
                     **({"_node_ip_address": cluster.LOOPBACK} if local else {}), **extra)
        return local
    except Exception as e:
        if RAY_START_TIMED_OUT not in str(e):
            raise
        raise PreflightError("Ray's new local cluster did not start (its raylet did not register within Ray's fixed 30 s: "
                             "the machine is busy?): run again, or start Ray once with `ray start --head` and set "
                             "pool.ray_address=auto") from None
    finally:
        quiet.setLevel(level)


class ActorSet:
    """The rollout actors of one pool, indexed ``0 .. num_actors - 1`` (Ray restarts a dead one
    under the same handle: ``max_restarts=-1``).

    Args:
        cfg: the whole config (``pool``, ``policy``, ``env``, ``logging``, ``rollout.partial_rollout``).

    Attributes:
        actors: the actor handles (empty before :meth:`launch` and after :meth:`close`).
        gcs_address: the Ray head's ``host:port`` once started (``None``: unknown, no head-loss
            detection).
        task_ids: every task id of the actors' domain, in the benchmark's order, once they are
            ready (:meth:`wait_ready`; ``None`` before).
        task_issues: ``{task id: its open issues}`` for the domain's tasks that have any
            (:meth:`RolloutWorker.domain_open_issues`), once the actors are ready (empty before).
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.actors: list = []
        self.gcs_address: str | None = None
        self.task_ids: list[str] | None = None
        self.task_issues: dict[str, list[TaskIssue]] = {}
        self.local_cluster = False  # the pool started a new local Ray cluster (it cannot grow)
        self._launched_at = 0.0  # time.monotonic() when the actors were created

    def launch(self, env_vars: dict[str, str]) -> None:
        """Connect to (or start) Ray and create the actors, without waiting for them: each
        starts in its own process (imports, the domain, the tokenizer, the chat-template probe)
        while the caller goes on; :meth:`wait_ready` waits for them.

        Args:
            env_vars: the actors' ``runtime_env`` environment (e.g. ``RAY_USE_UVLOOP``, from
                :func:`rollout.core.eventloop.ray_env_vars`).

        Raises:
            rollout.core.startup.PreflightError: ``policy.tokenizer`` names nothing loadable here,
                ``pool.ray_address`` does not answer, or ``pool.num_actors`` actors of
                ``pool.num_cpus_per_actor`` CPUs can never all run on the cluster
                (:func:`rollout.core.pool.cluster.fit_problem`): one line, before any actor starts.
        """
        from rollout.core.tokenizer import TokenizerSourceError, check_tokenizer_source

        try:  # one line in seconds, where Ray would wait minutes or every actor fail to start
            check_tokenizer_source(self.cfg.policy.tokenizer)
        except TokenizerSourceError as e:
            raise PreflightError(str(e)) from None
        if not ray.is_initialized():
            self.local_cluster = _init_ray(self.cfg.pool.ray_address)
        p = self.cfg.pool
        groups = None if self.local_cluster else cluster.autoscaling_node_groups()
        problem = cluster.fit_problem(p.num_actors, p.num_cpus_per_actor, cluster.node_cpus(), groups, local=self.local_cluster)
        if problem:
            raise PreflightError(problem)
        # the actors' event loop (pool.event_loop): Ray builds it, from RAY_USE_UVLOOP
        opts = dict(num_cpus=p.num_cpus_per_actor, max_concurrency=p.max_concurrent_episodes + 8, max_restarts=-1, max_task_retries=0,
                    runtime_env={"env_vars": env_vars})
        domain = domain_key(self.cfg.env.benchmark, self.cfg.env.domain)
        paths = registered_paths()  # what the driver registered by path, registered in each actor first
        self._launched_at = time.monotonic()
        self.actors = [
            RemoteRolloutWorker.options(**opts).remote(
                self.cfg.policy, self.cfg.env, self.cfg.logging, p.max_concurrent_episodes, self.cfg.rollout.partial_rollout,
                own_process=True, gil_switch_interval_ms=p.gil_switch_interval_ms, adaptive_concurrency=p.adaptive_concurrency,
                kv_actor=(i, p.num_actors),  # its place among the actors (the KV gate's part of the servers' KV)
                # its metrics, tagged with its index (made in the actor's process, kept by a restart);
                # None (pool.metrics=false): the worker records nothing
                recorder=RayRecorder({"domain": domain, "actor": str(i)}) if p.metrics else None,
                reward_shaping=self.cfg.rollout.reward_shaping,
                registry_paths=paths,
            )
            for i in range(p.num_actors)
        ]
        try:
            self.gcs_address = ray.get_runtime_context().gcs_address
        except Exception:  # older Ray: no head-loss detection
            self.gcs_address = None

    def wait_ready(self) -> list[dict]:
        """Wait until every actor :meth:`launch` created is ready, at most until
        ``pool.actor_start_timeout_s`` after their creation; check that each runs the driver's
        software (:mod:`rollout.core.pool.fingerprint`) and event loop; return each one's
        ``info()`` (and keep the domain's task ids, from the first actor, in :attr:`task_ids`).

        Raises:
            rollout.core.startup.PreflightError: an actor was not ready in time
                (:func:`rollout.core.pool.cluster.start_timeout_line`), or runs other software than
                the driver (:func:`rollout.core.pool.fingerprint.mismatch_line`): one line; the
                actors are stopped and no episode ran.
            RuntimeError: an actor failed to start (e.g. bad tokenizer or chat template), with
                the actor's error; or an actor runs another event loop than ``pool.event_loop``
                (uvloop missing on its node; the actors are stopped).
        """
        p = self.cfg.pool
        n = len(self.actors)
        mine = software_fingerprint(self.cfg.env)  # the driver's (once per process), while the actors start
        infos_refs = [a.info.remote() for a in self.actors]
        left = max(0.0, self._launched_at + p.actor_start_timeout_s - time.monotonic())
        try:
            answers = raycalls.get(infos_refs + [a.event_loop.remote() for a in self.actors]
                                   + [self.actors[0].domain_task_ids.remote(), self.actors[0].domain_open_issues.remote()], timeout=left)
            infos, loops, self.task_ids, self.task_issues = answers[:n], answers[n:2 * n], answers[-2], answers[-1]
        except GetTimeoutError:
            ready, _ = raycalls.wait(infos_refs, num_returns=n, timeout=0)
            free = ray.available_resources().get("CPU", 0.0)  # Ray leaves out a resource none of which is free
            self.close(graceful=False)
            raise PreflightError(cluster.start_timeout_line(p.actor_start_timeout_s, n, len(ready), p.num_cpus_per_actor, free)) from None
        except RayActorError as e:
            raise RuntimeError(f"a rollout actor failed to start: {e}") from None
        self._check_software(mine)
        wrong = [(i["pid"], k) for i, k in zip(infos, loops) if k != p.event_loop]
        if wrong:
            self.close(timeout_s=5.0)
            raise RuntimeError(f"pool.event_loop={p.event_loop}, but rollout actors (pid, loop) {wrong} run another loop: "
                               f"is uvloop installed on their nodes? (or set pool.event_loop=asyncio)")
        recording = sum(bool(i.get("metrics")) for i in infos)
        metrics = "metrics on" if recording == len(infos) else "metrics off" if not recording else f"metrics on in {recording}"
        logger.info("%d rollout actors ready (pids %s, event loop %s, %s)", len(infos), [i["pid"] for i in infos], p.event_loop, metrics)
        return infos

    def _check_software(self, mine: SoftwareFingerprint) -> None:
        """Refuse (one line, the actors stopped) when an actor runs other software than the
        driver's ``mine``, or cannot say what it runs (a rollout without :meth:`RolloutWorker.software`)."""
        try:
            theirs = [SoftwareFingerprint.from_dict(d) for d in raycalls.get([a.software.remote() for a in self.actors], timeout=60)]
        except (RayTaskError, GetTimeoutError) as e:
            self.close(timeout_s=5.0)
            raise PreflightError(f"the rollout actors do not say what software they run ({type(e).__name__}): they run another "
                                 f"rollout than this driver ({mine.values['rollout']}, {mine.python}); start the Ray cluster from this "
                                 "environment, or set pool.ray_address=local for a new local cluster") from None
        line = mismatch_line(mine, theirs)
        if line is not None:
            self.close(timeout_s=5.0)
            raise PreflightError(line)

    def close(self, timeout_s: float = 10.0, graceful: bool = True) -> None:
        """Stop the actors within about ``timeout_s`` seconds: each cancels its running episodes
        (aborting their requests on the workers) and closes; then the actors are killed (when the
        Ray head still answers). ``graceful=False``: killed at once (actors still starting, that
        ran nothing). Leaves Ray itself running."""
        if self.actors and not graceful:
            for a in self.actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception as e:
                    logger.debug("ray.kill: %r", e)
        elif self.actors and self.head_reachable():
            refs = []
            for a in self.actors:
                try:
                    refs.append(a.close.remote())
                except Exception:  # the actor may already be gone
                    pass
            try:
                raycalls.wait(refs, num_returns=len(refs), timeout=timeout_s)
            except Exception as e:
                logger.debug("closing actors: %r", e)
            for a in self.actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception as e:
                    logger.debug("ray.kill: %r", e)
        self.actors = []

    def forget(self) -> None:
        """Drop the handles without calling the actors (the Ray head is gone)."""
        self.actors = []

    def head_reachable(self) -> bool:
        """Whether the Ray head's GCS port answers (see :func:`gcs_reachable`)."""
        return gcs_reachable(self.gcs_address)

    # -- calls on one actor ------------------------------------------------------------------
    def run(self, index: int, spec: EpisodeSpec, timeout_s: float | None) -> ray.ObjectRef:
        """Start episode ``spec`` on actor ``index`` (``timeout_s``: the episode's bound, seconds);
        returns the ref of its :class:`~rollout.core.records.InteractionResult`."""
        return self.actors[index].run.remote(spec, timeout_s)

    def ping(self, index: int) -> ray.ObjectRef:
        """Ask actor ``index`` for its ``info()``: the ref resolves once it answers (health ping)."""
        return self.actors[index].info.remote()

    # -- calls on several actors -------------------------------------------------------------
    def arm_breakers(self, timeout_s: float = 30.0) -> None:
        """Tell every actor that the backend was seen answering
        (:meth:`rollout.core.worker.RolloutWorker.arm_breaker`); best effort (logged at DEBUG)."""
        try:
            raycalls.get([a.arm_breaker.remote() for a in self.actors], timeout=timeout_s)
        except Exception as e:
            logger.debug("arm_breaker: %r", e)

    def cancel(self, by_actor: dict[int, list[str]]) -> None:
        """Cancel episodes on their actors (actor index -> episode ids), waiting up to 30 s for
        each actor's answer; an actor that fails to answer is logged (WARNING), not raised."""
        for i, ids in by_actor.items():
            try:
                raycalls.get(self.actors[i].cancel.remote(ids), timeout=30)
            except (RayActorError, RayTaskError, GetTimeoutError) as e:
                logger.warning("cancel on actor %d failed: %r", i, e)

    def cancel_within(self, by_actor: dict[int, list[str]], timeout_s: float) -> None:
        """Cancel episodes on their actors (actor index -> episode ids) all at once, waiting up
        to ``timeout_s`` seconds in all; best effort (errors are logged at DEBUG)."""
        refs = []
        for i, ids in by_actor.items():
            try:
                refs.append(self.actors[i].cancel.remote(ids))
            except Exception as e:
                logger.debug("cancel on actor %d: %r", i, e)
        try:
            raycalls.wait(refs, num_returns=len(refs), timeout=timeout_s)
        except Exception as e:
            logger.debug("cancel: %r", e)

    def set_gates(self, open_: bool, indices: list[int]) -> list[dict | int]:
        """Open (``resume_generation``) or close (``pause_generation``) the generation gates of
        the actors ``indices``; returns the answers of those that answered within 30 s (closing:
        dicts with ``episodes_running`` and ``generate_calls_out``). An actor that does not
        answer is logged (WARNING): a dead actor's episodes are re-run elsewhere."""
        refs = {i: (self.actors[i].resume_generation if open_ else self.actors[i].pause_generation).remote() for i in indices}
        answers = []
        for i, ref in refs.items():
            try:
                answers.append(raycalls.get(ref, timeout=30))
            except (RayActorError, RayTaskError, GetTimeoutError) as e:
                logger.warning("actor %d: could not %s its generation gate: %r", i, "open" if open_ else "close", e)
        return answers

    def infos(self) -> list[dict]:
        """Each actor's :meth:`rollout.core.worker.RolloutWorker.info`, in actor order.

        Raises:
            ray.exceptions.RayActorError: an actor is dead.
        """
        return raycalls.get([a.info.remote() for a in self.actors])

    def loop_lags(self, reset: bool = False, timeout_s: float | None = 60.0) -> list[dict]:
        """Each actor's :meth:`rollout.core.worker.RolloutWorker.loop_lag`, in actor order.

        Raises:
            ray.exceptions.GetTimeoutError: an actor did not answer within ``timeout_s``.
            ray.exceptions.RayActorError: an actor is dead.
        """
        return raycalls.get([a.loop_lag.remote(reset) for a in self.actors], timeout=timeout_s)
