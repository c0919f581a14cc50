"""``python -m rollout.bench pool``: the main job at high concurrency against a latency-bound server.

It runs the episodes ``python -m rollout run`` runs (the configured domain and split, the
configured user simulator, ``rollout.n_samples_per_task`` samples per task, the task list repeated
until ``--episodes`` are submitted) through :func:`rollout.app.wiring.open_pool`, once per row: for each
``--concurrency`` C and each ``--actors`` A, ``pool.num_actors = A`` and
``pool.max_concurrent_episodes = C / A`` (C concurrent episodes in all)::

    python -m rollout.bench pool --concurrency 256,1024 --actors 1,2 --latency 1.0 [--episodes N]
        [--config configs/local.yaml] [--baseline KEY=VALUE ...] [--baseline-rows first|all] [--json FILE]
        [--plot FILE.png] [key=value ...]

**The server.** With ``local.enabled=true`` one local stack (the configured backend, gold replay
by default, behind the real ``sglang-router``) serves every row, and every ``/generate`` answer
waits ``--latency`` seconds first (``local.generate_latency_s``: an asyncio sleep on the server's
event loop that holds no thread and no step lock, so 1024 requests wait at once as on a GPU
server). Against your own router (``local.enabled=false policy.router_url=...``) nothing is
injected: the figures are your servers' own.

**The measured window.** All C slots start together, so the first completions are not a steady
state (short episodes finish first). With N >= 3C episodes (the default N is 3C) the window
starts at the C-th delivered episode and ends at the delivery after which fewer than C episodes
are outstanding (the last moment every slot was busy); with C < N < 3C it starts at submission
(biased low: the synchronised start is inside it). Every figure below is over that window:

* ``eps/s``: episodes delivered in the window / its length.
* ``ideal``: C / (mean ``/generate`` calls per episode x latency per call): the rate if the
  calls were the only cost. Calls per episode are counted by the episodes themselves
  (``metadata["requests"]``, mean over every episode of the row); the latency per call is the
  injected one, or against your own router the mean measured one (``timings.generate_s /
  requests`` over the window's episodes). ``ratio`` = eps/s / ideal. ``call s`` is the measured
  mean time of one call as the actors saw it (injected latency + generation + queueing at the
  server and the actor) and ``ep s`` the mean episode wall time, against ``calls x latency``.
* ``CPU s/ep``: CPU seconds (user + system, ``psutil``) of the actor processes and their
  descendants (the tool sandbox) over the window, divided by the episodes delivered in it.
  The driver (this process, where the pool's dispatch loop runs) and the local stack are not
  counted; their use is reported apart (``stack cores``; ``driver_cores`` in the JSON).
* ``actor cores``: the busiest actor's own process CPU over the window / its length (1.0 = one
  core; the event loop and the tau2 threads share one GIL, so about 1.0 is an actor's ceiling),
  ``sandbox`` excluded. ``machine busy``: the whole machine's busy fraction (``psutil.cpu_times``,
  every process, other users' included). A row is **CPU-bound** when either is >= 0.85.
* ``driver cores``: the driver's CPU over the window / its length (its one thread: dispatch,
  results, the journal and the streams).
* ``bound by``: which resource bounds the row (:func:`bound_by`): ``call latency`` (ratio >= 0.9),
  ``actor CPU``, ``driver``, ``machine CPU``, ``local server`` (calls queued at the server: a
  call took >= 1.5x the injected latency with nothing above saturated) or ``unknown``.
* ``lag p50 / p99``: event-loop lag of the actors (:class:`rollout.core.loop_health.LoopLagProbe`, a
  coroutine sleeping 10 ms in a loop, started by :meth:`rollout.core.pool.RolloutPool.loop_lags`):
  p50 is the median over actors, p99 the worst actor's.
* ``floor p99``: the p99 lag of the same 10 ms probe in an idle process on this machine over
  the window (:class:`FloorProbe`): what the machine alone gives, under the actors' figure.
* ``loop cpu/wait``: the actors' event-loop threads, mean over actors (Linux; from the
  kernel's ``schedstat``): seconds on a CPU per second of the window, and seconds runnable but
  waiting for a CPU that other threads or processes held. A wait well above the CPU share says
  the lag is the machine's load; a CPU share near 1 says the loop itself is saturated.
* ``--stack-nice N``: the local stack (servers and router) runs at niceness N; by default at the
  actors' own. Ray starts its workers, the actors among them, at niceness 15
  (``RAY_worker_niceness``), while processes started otherwise run at 0. On a cluster the SGLang
  servers are on other machines; here the stand-in server and router take about one of the
  machine's cores, and at niceness 0 they would get it before the actors whenever both are
  ready (the kernel's weights for niceness 0 and 15 are 1024 and 36), which shows up as the
  actors' loop lag. The floor probe runs at the actors' niceness too. ``actor_niceness`` and
  ``stack_niceness`` in the JSON give what the processes reported.
* ``RSS MiB/actor``: resident memory of an actor process plus its sandbox (as
  :mod:`rollout.devtools.sizing` counts it), sampled every 0.5 s; the peak, largest over the actors.

**Targets** (issue 8), printed per row as met / not met: actor CPU per episode at most 1/10 of
the reference; loop lag p99 under 50 ms at 1024 concurrent episodes (or more); episodes/s at
least 0.9 of the ideal wherever the row is not CPU-bound. The reference CPU per episode is
measured in the same run when ``--baseline`` overrides are given (one extra row at the smallest
concurrency, one actor, the same latency, with those overrides, e.g. ``env.evaluator=tau2``
for tau2's own environment and reward path; that is the default when the config has the key,
``--baseline none`` skips it); otherwise the figure measured before issue 8
(:data:`TODAY_CPU_S_PER_EPISODE`).

**Side by side.** ``--baseline-rows all`` measures a reference row right before every main row
(same concurrency and actors) and prints main / reference for episodes/s, CPU per episode and
the lag; the CPU target then stays against the figure from before issue 8. A baseline that
changes ``local.*`` (not ``local.enabled``) runs each reference row on a local stack of its own,
started for it (and the main stack again after). For example, the event loops
(:mod:`rollout.core.eventloop`)::

    python -m rollout.bench pool --concurrency 1024 --actors 2 --latency 1.0 \
        --baseline pool.event_loop=asyncio --baseline local.event_loop=asyncio --baseline-rows all

The ``loop actors/stack`` column gives the event loop the actors and the servers report
(``uvloop`` or ``asyncio``).

Exit status: 0 when every row ran (whatever the targets say), 2 on a bad config or option, 1
when a row failed to run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from rollout.app.args import plain_text
from rollout.app.preflight import check_config
from rollout.core.config import Config, ConfigError, load_config

if TYPE_CHECKING:
    from rollout.devtools.local.stack import LocalStack

logger = logging.getLogger(__name__)

# Actor CPU seconds per episode before issue 8, measured with this very bench (and its probe
# and latency additions) on the tree of commit af7fb1a (tau2's get_environment() per episode,
# evaluate_simulation in the tool sandbox for the reward), on the project's shared 2-core machine:
# `python -m rollout.bench pool --concurrency 8 --actors 1 --latency 0 --episodes 64
# --baseline none pool.ray_address=local` (local stack, gold replay, scripted user, base split;
# the window held 49 episodes): retail 0.683 s, airline (env.domain=airline) 1.359 s. The issue
# quotes about 0.75 s and 1.4 s for the whole job, start-up included.
TODAY_CPU_S_PER_EPISODE = {"retail": 0.683, "airline": 1.359}
TODAY_HOW = "commit af7fb1a, 8 concurrent episodes, 1 actor, latency 0, this machine"

CPU_TARGET_FRACTION = 0.1  # actor CPU per episode at most this fraction of the reference
LAG_TARGET_MS = 50.0  # loop lag p99 under this ...
LAG_TARGET_CONCURRENCY = 1024  # ... at this many concurrent episodes (or more)
RATIO_TARGET = 0.9  # episodes/s at least this fraction of the ideal where the CPU is not the bound
CPU_BOUND_AT = 0.85  # an actor's cores or the machine's busy fraction from which a row is CPU-bound
RSS_SAMPLE_S = 0.5
MIB = 2**20

# Applied before the user's overrides.
POOL_DEFAULTS = ["logging.level=WARNING"]


# --------------------------------------------------------------------------- processes
def _tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its live descendants (empty when ``pid`` is gone)."""
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _proc_cpu(p: psutil.Process, with_reaped_children: bool = True) -> float:
    """CPU seconds (user + system) of ``p``, plus those of its reaped children; 0 when gone."""
    try:
        t = p.cpu_times()
    except psutil.Error:
        return 0.0
    own = t.user + t.system
    return own + (t.children_user + t.children_system if with_reaped_children else 0.0)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` and its descendants (live ones, and the
    children they have reaped: a restarted sandbox's predecessor counts). Seconds, float."""
    return sum(_proc_cpu(p) for p in _tree(pid))


def own_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` alone (all its threads); 0 when it is gone."""
    try:
        return _proc_cpu(psutil.Process(pid), with_reaped_children=False)
    except psutil.Error:
        return 0.0


def tree_rss(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants, bytes, as the memory bench counts it
    (:func:`rollout.devtools.sizing.sample_tree`: a child between ``vfork`` and ``exec`` is not counted
    with its parent's memory a second time); 0 when ``pid`` is gone."""
    from rollout.devtools.sizing import sample_tree

    try:
        return sample_tree(psutil.Process(pid)).rss
    except psutil.Error:
        return 0


def _machine_times() -> tuple[float, float]:
    """``(busy seconds, total seconds)`` summed over every CPU of the machine, so far."""
    t = psutil.cpu_times()
    total = sum(t)
    idle = t.idle + getattr(t, "iowait", 0.0)
    return total - idle, total


def renice(pids: list[int], niceness: int) -> list[int]:
    """Set the niceness of each process in ``pids`` and of its live descendants (``setpriority``,
    0-19; raising it needs no privilege). Returns the pids changed; gone processes are skipped.

    Raises:
        psutil.AccessDenied: a process may not be changed (not ours).
    """
    changed = []
    for pid in pids:
        for p in _tree(pid):
            try:
                p.nice(niceness)
            except psutil.NoSuchProcess:
                continue
            changed.append(p.pid)
    return changed


def _niceness(pid: int) -> int | None:
    """The niceness of process ``pid`` (None when it is gone)."""
    try:
        return psutil.Process(pid).nice()
    except psutil.Error:
        return None


def _local_actor_pids(pids: list[int]) -> bool:
    """Whether every pid is a live Ray rollout actor process on this machine."""
    for pid in pids:
        try:
            title = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            return False
        if "RolloutWorker" not in title and "ray" not in title.lower():
            return False
    return True


class _RssSampler:
    """A thread sampling each actor's tree RSS every :data:`RSS_SAMPLE_S` seconds; keeps the peaks."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = [tree_rss(p) for p in pids]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            for i, pid in enumerate(self.pids):
                self.peak[i] = max(self.peak[i], tree_rss(pid))

    def start(self) -> _RssSampler:
        self._thread.start()
        return self

    def stop(self) -> list[int]:
        """Stop sampling; returns each actor's peak, bytes."""
        self._stop.set()
        self._thread.join(timeout=10)
        for i, pid in enumerate(self.pids):
            self.peak[i] = max(self.peak[i], tree_rss(pid))
        return list(self.peak)


@dataclasses.dataclass
class _Snapshot:
    """Counters at one moment of a row (seconds)."""

    t: float
    actor_tree_cpu: list[float]
    actor_own_cpu: list[float]
    stack_cpu: float
    driver_cpu: float
    machine_busy: float
    machine_total: float

    @staticmethod
    def take(actor_pids: list[int], stack_pids: list[int]) -> _Snapshot:
        busy, total = _machine_times()
        return _Snapshot(
            t=time.monotonic(),
            actor_tree_cpu=[tree_cpu_s(p) for p in actor_pids],
            actor_own_cpu=[own_cpu_s(p) for p in actor_pids],
            stack_cpu=sum(own_cpu_s(p) for p in stack_pids),
            driver_cpu=own_cpu_s(os.getpid()),
            machine_busy=busy,
            machine_total=total,
        )


# --------------------------------------------------------------------------- one row
def _submit(pool, task_ids: list[str], n_episodes: int, group_size: int) -> int:
    """Submit at least ``n_episodes`` episodes (``group_size`` samples of each task, the task
    list repeated as often as needed; each pass is a new submission); returns how many."""
    total = 0
    while total < n_episodes:
        k = min(len(task_ids), -(-(n_episodes - total) // group_size))
        total += len(pool.submit_tasks(task_ids[:k], n_samples_per_task=group_size))
    return total


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Derive a row's figures from its raw measurements (pure; see the module docstring).

    Args:
        raw: ``{"concurrency", "actors", "latency_s" (None: not injected), "episodes",
            "statuses", "window_from", "window_episodes", "window_s", "calls_per_episode",
            "window_generate_s", "window_requests", "window_episode_s" (mean episode wall time,
            s), "actor_cpu_s" (list per actor, None when the actors are not local),
            "actor_own_cpu_s" (list), "stack_cpu_s", "driver_cpu_s", "machine_busy_fraction",
            "loop_lags" (list of :meth:`rollout.core.loop_health.LoopLagProbe.stats` dicts),
            "floor_lag" (:meth:`FloorProbe.stats`, optional), "rss_peak_bytes" (list per actor
            or None), "wall_s", "label"}``.

    Returns:
        ``raw`` plus ``episodes_per_s``, ``call_s``, ``ideal_call_s``, ``ideal_basis``,
        ``ideal_episodes_per_s``, ``ratio``, ``actor_cpu_s_per_episode``, ``actor_cores_max``,
        ``stack_cores``, ``driver_cores``, ``cpu_bound``, ``loop_lag_p50_ms``,
        ``loop_lag_p99_ms``, ``floor_lag_p99_ms``, ``loop_cpu_share``, ``loop_wait_share`` (means over
        actors), ``rss_mib_per_actor`` (None where unknown).
    """
    r = dict(raw)
    w_s = r["window_s"]
    n_w = r["window_episodes"]
    r["episodes_per_s"] = n_w / w_s if w_s > 0 else None
    r["call_s"] = r["window_generate_s"] / r["window_requests"] if r["window_requests"] else None
    if r["latency_s"] is not None:
        r["ideal_call_s"], r["ideal_basis"] = (r["latency_s"] or None), "injected latency"
    else:
        r["ideal_call_s"], r["ideal_basis"] = r["call_s"], "measured /generate latency"
    calls = r["calls_per_episode"]
    if r["ideal_call_s"] and calls:
        r["ideal_episode_s"] = calls * r["ideal_call_s"]
        r["ideal_episodes_per_s"] = r["concurrency"] / r["ideal_episode_s"]
    else:
        r["ideal_episode_s"] = r["ideal_episodes_per_s"] = None
    r["ratio"] = (r["episodes_per_s"] / r["ideal_episodes_per_s"]
                  if r["episodes_per_s"] is not None and r["ideal_episodes_per_s"] else None)
    cpu = r["actor_cpu_s"]
    r["actor_cpu_s_per_episode"] = sum(cpu) / n_w if cpu is not None and n_w else None
    own = r["actor_own_cpu_s"]
    r["actor_cores_max"] = max(own) / w_s if own and w_s > 0 else None
    r["stack_cores"] = r["stack_cpu_s"] / w_s if r["stack_cpu_s"] is not None and w_s > 0 else None
    r["driver_cores"] = r["driver_cpu_s"] / w_s if w_s > 0 else None
    busy = r["machine_busy_fraction"]
    r["cpu_bound"] = bool((r["actor_cores_max"] or 0.0) >= CPU_BOUND_AT or (busy or 0.0) >= CPU_BOUND_AT)
    r["bound_by"] = bound_by(r)
    lags = [x for x in r["loop_lags"] if x.get("samples")]
    r["loop_lag_p50_ms"] = statistics.median(x["p50_ms"] for x in lags) if lags else None
    r["loop_lag_p99_ms"] = max(x["p99_ms"] for x in lags) if lags else None
    r["floor_lag_p99_ms"] = (r.get("floor_lag") or {}).get("p99_ms")
    for key in ("loop_cpu_share", "loop_wait_share"):
        shares = [x[key] for x in lags if x.get(key) is not None]
        r[key] = statistics.fmean(shares) if shares else None
    rss = r["rss_peak_bytes"]
    r["rss_mib_per_actor"] = max(rss) / MIB if rss else None
    return r


# A /generate call that takes this many times the injected latency (as the actors saw it) waited
# at the server, not in the actors: the local server is the bound.
SERVER_QUEUE_AT = 1.5


def bound_by(r: dict[str, Any]) -> str:
    """Which resource bounds a row's episodes/s (first that applies; the README and
    docs/performance.md name it per row):

    * ``call latency``: ratio >= :data:`RATIO_TARGET`; the calls' own latency is the bound (the ideal);
    * ``actor CPU``: the busiest actor's own process used >= :data:`CPU_BOUND_AT` of a core (its
      event loop and tau2 threads share one GIL);
    * ``driver``: the driver (dispatch, journal, streams: one thread) used >= that share of a core;
    * ``machine CPU``: the whole machine was >= that busy (actors, local server and router share it);
    * ``local server``: a call took >= :data:`SERVER_QUEUE_AT` x the injected latency as the
      actors saw it with none of the above: the requests queued at the server;
    * ``unknown``: none of these (e.g. no injected latency to compare with).
    """
    ratio, busy = r.get("ratio"), r.get("machine_busy_fraction")
    if ratio is not None and ratio >= RATIO_TARGET:
        return "call latency"
    if (r.get("actor_cores_max") or 0.0) >= CPU_BOUND_AT:
        return "actor CPU"
    if (r.get("driver_cores") or 0.0) >= CPU_BOUND_AT:
        return "driver"
    if (busy or 0.0) >= CPU_BOUND_AT:
        return "machine CPU"
    call, ideal = r.get("call_s"), r.get("ideal_call_s")
    if r.get("latency_s") and call and ideal and call >= SERVER_QUEUE_AT * ideal:
        return "local server"
    return "unknown"


def judge(row: dict[str, Any], reference_cpu_s: float | None) -> dict[str, Any]:
    """The row's verdict on each target: ``target_cpu``, ``target_lag``, ``target_ratio``, each
    ``"met"``, ``"not met"`` or ``None`` (does not apply: no reference, a row below 1024
    concurrent episodes, a CPU-bound row or a row without an ideal; ``*_why`` says which)."""
    out: dict[str, Any] = {}
    cpu = row.get("actor_cpu_s_per_episode")
    if reference_cpu_s and cpu is not None:
        out["target_cpu"] = "met" if cpu <= CPU_TARGET_FRACTION * reference_cpu_s else "not met"
    else:
        out["target_cpu"], out["target_cpu_why"] = None, "no reference or no actor CPU"
    lag = row.get("loop_lag_p99_ms")
    if row["concurrency"] < LAG_TARGET_CONCURRENCY:
        out["target_lag"], out["target_lag_why"] = None, f"the target is at {LAG_TARGET_CONCURRENCY} concurrent episodes"
    elif lag is None:
        out["target_lag"], out["target_lag_why"] = None, "no lag samples"
    else:
        out["target_lag"] = "met" if lag < LAG_TARGET_MS else "not met"
    if row.get("ratio") is None:
        out["target_ratio"], out["target_ratio_why"] = None, "no ideal (latency 0)"
    elif row["cpu_bound"]:
        out["target_ratio"], out["target_ratio_why"] = None, "CPU-bound"
    else:
        out["target_ratio"] = "met" if row["ratio"] >= RATIO_TARGET else "not met"
    return out


def measure_row(cfg: Config, concurrency: int, actors: int, episodes: int, latency_s: float | None,
                stack_pids: list[int], label: str = "", stack_nice: int | None = None,
                stack_event_loop: str | None = None) -> dict[str, Any]:
    """Run one row: ``episodes`` episodes with ``actors`` actors and ``concurrency`` episodes in
    flight in all (``concurrency`` must be a multiple of ``actors``), through
    :func:`rollout.app.wiring.open_pool` with ``cfg`` (its router resolved); returns :func:`summarize`'s
    row.

    Args:
        latency_s: the injected latency per /generate (None: not injected, your own router).
        stack_pids: the local stack's processes (their CPU is reported apart), or [].
        stack_nice: niceness to give the stack's processes once the actors run; None: the
            actors' own (Ray starts its workers at ``RAY_worker_niceness``, 15 by default).
        stack_event_loop: the local stack's event loop (``local.event_loop``), for the row's
            record; None without a local stack.

    Raises:
        ValueError: ``episodes <= concurrency`` or ``concurrency`` not a multiple of ``actors``.
        RuntimeError: an actor failed to start.
    """
    from rollout.app.wiring import open_pool

    if concurrency % actors:
        raise ValueError(f"concurrency {concurrency} is not a multiple of {actors} actors")
    if episodes <= concurrency:
        raise ValueError(f"{episodes} episodes cannot keep {concurrency} slots busy: give more than the concurrency")
    pool_cfg = dataclasses.replace(cfg.pool, num_actors=actors, max_concurrent_episodes=concurrency // actors)
    cfg = dataclasses.replace(cfg, pool=pool_cfg)
    skip = concurrency if episodes >= 3 * concurrency else 0
    t_row = time.monotonic()
    with open_pool(cfg, log_dir_name="bench_stack_logs") as (cfg, pool, task_ids):
        pids = [i["pid"] for i in pool.worker_infos()]
        local = _local_actor_pids(pids)
        if not local:
            logger.warning("the actors (pids %s) are not processes of this machine: no CPU or memory figures", pids)
        pool.loop_lags()  # starts the probes
        actor_nice = _niceness(pids[0]) if local else None
        if stack_pids and (stack_nice is not None or actor_nice is not None):
            renice(stack_pids, actor_nice if stack_nice is None else stack_nice)
        # the floor: an idle process with the actors' priority, so the two lags compare
        floor = FloorProbe(niceness=actor_nice or 0) if local else None
        floor_lag: dict | None = None
        submitted = _submit(pool, task_ids, episodes, cfg.rollout.n_samples_per_task)
        records: list[tuple[int, float, float, str]] = []  # (requests, generate_s, total_s, status) per episode
        start: _Snapshot | None = None
        end: _Snapshot | None = None
        sampler: _RssSampler | None = None
        lags: list[dict] = []
        rss: list[int] | None = None
        window: list[int] = []  # indices into records

        def open_window() -> tuple[_Snapshot, _RssSampler | None]:
            pool.loop_lags(reset=True)
            if floor is not None:
                floor.reset()
            return _Snapshot.take(pids if local else [], stack_pids), (_RssSampler(pids).start() if local else None)

        if skip == 0:
            start, sampler = open_window()
        for res in pool.results():
            meta = res.metadata or {}
            tim = meta.get("timings") or {}
            records.append((int(meta.get("requests") or 0), float(tim.get("generate_s") or 0.0),
                            float(tim.get("total_s") or 0.0), res.status.value))
            if start is not None and end is None:
                window.append(len(records) - 1)
                if pool.num_outstanding < concurrency:  # a slot just went idle for good: the window ends here
                    end = _Snapshot.take(pids if local else [], stack_pids)
                    lags = pool.loop_lags()
                    floor_lag = floor.stats() if floor is not None else None
                    rss = sampler.stop() if sampler is not None else None
            elif start is None and len(records) >= skip:
                start, sampler = open_window()
        if floor is not None:
            floor.close()
        if end is None:  # cannot happen with episodes > concurrency; kept for safety
            raise RuntimeError("the measured window never closed")
        wall = time.monotonic() - t_row
    statuses: dict[str, int] = {}
    for *_, st in records:
        statuses[st] = statuses.get(st, 0) + 1
    w_s = end.t - start.t
    raw = {
        "label": label, "concurrency": concurrency, "actors": actors, "per_actor": concurrency // actors,
        "latency_s": latency_s, "episodes": len(records), "submitted": submitted, "statuses": statuses,
        "window_from": "the C-th delivery" if skip else "submission (N < 3C: biased low)",
        "window_episodes": len(window), "window_s": w_s,
        "calls_per_episode": statistics.fmean(r[0] for r in records) if records else None,
        "window_requests": sum(records[i][0] for i in window),
        "window_generate_s": sum(records[i][1] for i in window),
        "window_episode_s": statistics.fmean(records[i][2] for i in window) if window else None,
        "actor_cpu_s": [b - a for a, b in zip(start.actor_tree_cpu, end.actor_tree_cpu)] if local else None,
        "actor_own_cpu_s": [b - a for a, b in zip(start.actor_own_cpu, end.actor_own_cpu)] if local else None,
        "stack_cpu_s": (end.stack_cpu - start.stack_cpu) if stack_pids else None,
        "driver_cpu_s": end.driver_cpu - start.driver_cpu,
        "machine_busy_fraction": ((end.machine_busy - start.machine_busy) / (end.machine_total - start.machine_total)
                                  if local and end.machine_total > start.machine_total else None),  # this machine's, if it is the actors' one
        "loop_lags": lags, "floor_lag": floor_lag, "rss_peak_bytes": rss, "wall_s": wall,
        "event_loop": "/".join(sorted({lag.get("event_loop") or "?" for lag in lags})) or None,
        "stack_event_loop": stack_event_loop if stack_pids else None,
        "actor_niceness": actor_nice, "stack_niceness": sorted({n for n in map(_niceness, stack_pids) if n is not None}) or None,
    }
    return summarize(raw)


def stack_event_loops(stack: LocalStack) -> str:
    """The event loops a :class:`rollout.devtools.local.stack.LocalStack`'s servers report
    (:meth:`~rollout.devtools.local.stack.LocalStack.server_infos`), sorted and joined by ``/``:
    ``"uvloop"`` when all run uvloop; ``"?"`` for a server that does not say."""
    return "/".join(sorted({info.get("event_loop") or "?" for info in stack.server_infos()}))


# --------------------------------------------------------------------------- the machine's floor
def floor_probe_main() -> None:
    """Entry point of the floor probe's child process (see :class:`FloorProbe`): an event loop
    that runs only a :class:`rollout.core.loop_health.LoopLagProbe`, and a thread that answers ``reset``
    and ``stats`` lines on stdin with the probe's stats as a JSON line on stdout (read on the
    loop; ``reset`` forgets the samples after reading them); stdin closed ends it."""
    import asyncio

    from rollout.core.loop_health import LoopLagProbe

    async def main() -> None:
        loop = asyncio.get_running_loop()
        probe = LoopLagProbe()
        probe.start()

        async def read(reset: bool) -> dict[str, Any]:
            return probe.stats(reset=reset)

        def serve() -> None:
            for line in sys.stdin:
                stats = asyncio.run_coroutine_threadsafe(read(line.strip() == "reset"), loop).result()
                print(json.dumps(stats), flush=True)
            os._exit(0)

        threading.Thread(target=serve, daemon=True).start()
        await asyncio.Event().wait()

    asyncio.run(main())


class FloorProbe:
    """The event-loop lag of an idle process on this machine: the floor under the actors' lag.

    A child process (:func:`floor_probe_main`) runs the actors' probe,
    :class:`rollout.core.loop_health.LoopLagProbe` (10 ms sleeps), with nothing else to do: whatever lag it sees comes
    from the machine (cores busy with other processes), not from work on its loop. A row prints
    it beside the actors' lag, so a user can tell what their actors add to what the machine gives.

    Args:
        niceness: the child's niceness: the actors' own, so that its lag and theirs compare
            (Ray runs its workers at niceness 15 by default).

    Raises:
        OSError: the child could not be started.
    """

    def __init__(self, niceness: int = 0) -> None:
        import subprocess

        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from rollout.devtools.bench.pool import floor_probe_main; floor_probe_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        if niceness:
            renice([self._proc.pid], niceness)

    def _ask(self, cmd: str) -> dict[str, Any] | None:
        try:
            self._proc.stdin.write(cmd + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None

    def reset(self) -> None:
        """Forget the samples so far (the window starts)."""
        self._ask("reset")

    def stats(self) -> dict[str, Any] | None:
        """:meth:`rollout.core.loop_health.LoopLagProbe.stats` since the last reset; None if the child is gone."""
        return self._ask("stats")

    def close(self) -> None:
        """End the child (closing its stdin; killed if it does not exit within 5 s)."""
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=5)
        except Exception:  # noqa: BLE001  (already gone, or stuck: kill it)
            self._proc.kill()
            self._proc.wait()


# --------------------------------------------------------------------------- output
def _f(x: Any, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The table ``python -m rollout.bench pool`` prints (one line per row, see the module docstring)."""
    head = (f"{'row':<9} {'conc':>5} {'actors':>6} {'eps':>5} {'window':>6} {'eps/s':>7} {'ideal':>7} {'ratio':>6} "
            f"{'calls/ep':>8} {'call s':>7} {'ep s':>7} {'CPU s/ep':>8} {'actor cores':>11} {'machine busy':>12} "
            f"{'stack cores':>11} {'lag p50 ms':>10} {'lag p99 ms':>10} {'floor p99':>9} {'loop cpu/wait':>13} "
            f"{'RSS MiB/actor':>13} {'CPU-bound':>9} {'driver cores':>12} {'bound by':>12} "
            f"{'loop actors/stack':>17}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.get('label') or 'main':<9} {r['concurrency']:>5} {r['actors']:>6} {r['episodes']:>5} {r['window_episodes']:>6} "
            f"{_f(r['episodes_per_s'], '.2f'):>7} {_f(r['ideal_episodes_per_s'], '.2f'):>7} {_f(r['ratio'], '.2f'):>6} "
            f"{_f(r['calls_per_episode'], '.2f'):>8} {_f(r['call_s'], '.3f'):>7} {_f(r['window_episode_s'], '.2f'):>7} "
            f"{_f(r['actor_cpu_s_per_episode'], '.3f'):>8} {_f(r['actor_cores_max'], '.2f'):>11} "
            f"{_f(r['machine_busy_fraction'], '.0%'):>12} {_f(r['stack_cores'], '.2f'):>11} "
            f"{_f(r['loop_lag_p50_ms'], '.1f'):>10} {_f(r['loop_lag_p99_ms'], '.1f'):>10} "
            f"{_f(r.get('floor_lag_p99_ms'), '.1f'):>9} "
            f"{_f(r.get('loop_cpu_share'), '.2f') + '/' + _f(r.get('loop_wait_share'), '.2f'):>13} "
            f"{_f(r['rss_mib_per_actor'], '.0f'):>13} {'yes' if r['cpu_bound'] else 'no':>9} "
            f"{_f(r.get('driver_cores'), '.2f'):>12} {r.get('bound_by') or '-':>12} "
            f"{(r.get('event_loop') or '-') + '/' + (r.get('stack_event_loop') or '-'):>17}")
    return "\n".join(lines)


def format_side_by_side(rows: list[dict[str, Any]]) -> str:
    """For each main row with a reference row at the same concurrency and actor count (measured
    in the same run, ``--baseline-rows all``): main / reference for episodes/s, actor CPU per
    episode and loop-lag p50 and p99. An empty string when no row has its pair."""
    refs = {(r["concurrency"], r["actors"]): r for r in rows if r.get("label")}
    lines = []
    for r in rows:
        ref = refs.get((r["concurrency"], r["actors"]))
        if r.get("label") or ref is None:
            continue

        def ratio(key: str) -> str:
            a, b = r.get(key), ref.get(key)
            return f"x{a / b:.2f}" if a is not None and b else "n/a"

        lines.append(f"  {r['concurrency']}x{r['actors']}: episodes/s {ratio('episodes_per_s')}, actor CPU/episode "
                     f"{ratio('actor_cpu_s_per_episode')}, loop lag p50 {ratio('loop_lag_p50_ms')}, p99 {ratio('loop_lag_p99_ms')}")
    return ("main / reference, measured side by side in this run:\n" + "\n".join(lines)) if lines else ""


def format_targets(rows: list[dict[str, Any]], reference_cpu_s: float | None, reference_how: str) -> str:
    """One line per target with each main row's verdict (and the figure behind it)."""
    main = [r for r in rows if not r.get("label")]

    def name(r: dict) -> str:
        return f"{r['concurrency']}x{r['actors']}"

    def verdict(r: dict, key: str, figure: str) -> str:
        v = r[key]
        return f"{name(r)} {v if v is not None else 'n/a (' + r[key + '_why'] + ')'} ({figure})"

    cap = None if reference_cpu_s is None else CPU_TARGET_FRACTION * reference_cpu_s
    lines = ["targets (issue 8):"]
    lines.append(f"  actor CPU/episode <= {_f(cap, '.3f')} s (1/10 of {_f(reference_cpu_s, '.3f')} s, {reference_how}): "
                 + "; ".join(verdict(r, "target_cpu", f"{_f(r['actor_cpu_s_per_episode'], '.3f')} s") for r in main))
    at = [r for r in main if r["concurrency"] >= LAG_TARGET_CONCURRENCY]
    lines.append(f"  loop lag p99 < {LAG_TARGET_MS:.0f} ms at {LAG_TARGET_CONCURRENCY} concurrent episodes: "
                 + ("; ".join(verdict(r, "target_lag", f"{_f(r['loop_lag_p99_ms'], '.1f')} ms") for r in at)
                    or f"not measured (no row at {LAG_TARGET_CONCURRENCY}; the p99 of the rows run is in the table)"))
    lines.append(f"  episodes/s >= {RATIO_TARGET} x ideal where the CPU is not the bound: "
                 + "; ".join(verdict(r, "target_ratio", f"ratio {_f(r['ratio'], '.2f')}") for r in main))
    return "\n".join(lines)


def plot_rows(rows: list[dict[str, Any]], path: str) -> None:
    """Draw episodes/s (measured, ideal dashed) and loop lag p50/p99 against concurrency, one
    line per actor count, to ``path`` (PNG).

    Raises:
        ImportError: matplotlib is not installed (``pip install 'tau-rollout[plot]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = [r for r in rows if not r.get("label")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for a in sorted({r["actors"] for r in main}):
        rs = sorted((r for r in main if r["actors"] == a), key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rs]
        line, = ax1.plot(xs, [r["episodes_per_s"] for r in rs], marker="o", label=f"{a} actor(s)")
        ideal = [(x, r["ideal_episodes_per_s"]) for x, r in zip(xs, rs) if r["ideal_episodes_per_s"]]
        if ideal:
            ax1.plot(*zip(*ideal), linestyle="--", color=line.get_color(), label=f"{a} actor(s): ideal")
        lag = [(x, r["loop_lag_p50_ms"], r["loop_lag_p99_ms"]) for x, r in zip(xs, rs) if r["loop_lag_p99_ms"] is not None]
        if lag:
            lx, p50, p99 = zip(*lag)
            line2, = ax2.plot(lx, p99, marker="o", label=f"{a} actor(s): p99")
            ax2.plot(lx, p50, marker=".", linestyle=":", color=line2.get_color(), label=f"{a} actor(s): p50")
    ax2.axhline(LAG_TARGET_MS, color="grey", linewidth=0.8, label=f"target p99 < {LAG_TARGET_MS:.0f} ms")
    ticks = sorted({r["concurrency"] for r in main})
    for ax, title, ylabel in ((ax1, "episodes/s", "episodes / s"), (ax2, "actor event-loop lag", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("concurrent episodes")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI
def add_parser(sub) -> None:
    """Add the ``pool`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("pool", help="the main job at 256 / 1024 concurrent episodes against a server with injected latency",
                       description=plain_text(__doc__.split("\n\n")[0]), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", default="configs/local.yaml")
    p.add_argument("--concurrency", default="256,1024", help="comma-separated concurrent episodes (all actors together)")
    p.add_argument("--actors", default="1,2", help="comma-separated actor counts")
    p.add_argument("--latency", type=float, default=None,
                   help="seconds injected per /generate on the local stack: sets local.generate_latency_s (default: 1.0, or "
                        "the value of a local.generate_latency_s=... override); nothing is injected with local.enabled=false")
    p.add_argument("--episodes", type=int, default=None, help="episodes per row (default: 3 x concurrency)")
    p.add_argument("--baseline", action="append", default=None, metavar="KEY=VALUE",
                   help="overrides of a reference row measured in the same run (repeatable; default env.evaluator=tau2 "
                        "when the config has that key; 'none': no reference row)")
    p.add_argument("--baseline-rows", choices=("first", "all"), default="first",
                   help="first: one reference row (the smallest concurrency, one actor: the reference CPU per episode); "
                        "all: a reference row right before every main row, and their ratios printed side by side")
    p.add_argument("--stack-nice", type=int, default=None, metavar="N",
                   help="run the local stack's servers and router at this niceness (0-19; default: the actors' own, which "
                        "Ray sets to 15), so that the stand-in for GPU servers does not outrank the actors (see --help)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows (and the run's facts) as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="plot episodes/s and loop lag against concurrency (needs the plot extra)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    p.set_defaults(run=main_pool)


def _ints(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{what} must be comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise ValueError(f"--{what} must be integers >= 1, got {text!r}")
    return out


def main_pool(args) -> int:
    """``pool``: run the rows, print the table and the targets, write ``--json`` / ``--plot``.

    Returns:
        0 when every row ran, 2 on a bad option or config, 1 when a row failed.
    """
    from rollout.app.wiring import resolve_endpoints
    from rollout.core.logs import setup_logging

    try:
        concurrencies = _ints(args.concurrency, "concurrency")
        actor_counts = _ints(args.actors, "actors")
        bad = [(c, a) for c in concurrencies for a in actor_counts if c % a]
        if bad:
            raise ValueError(f"--concurrency values must be multiples of every --actors value ({bad[0][0]} and {bad[0][1]} are not)")
        if args.episodes is not None and args.episodes <= max(concurrencies):
            raise ValueError(f"--episodes {args.episodes} must exceed the largest concurrency ({max(concurrencies)}) "
                             f"to keep every slot busy; 3x is better (see --help)")
        if args.latency is not None and args.latency < 0:
            raise ValueError("--latency must be >= 0 seconds")
        if args.stack_nice is not None and not 0 <= args.stack_nice <= 19:
            raise ValueError(f"--stack-nice must be 0-19, got {args.stack_nice}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib: pip install 'tau-rollout[plot]' (or pip install matplotlib)", file=sys.stderr)
            return 2
    overrides = [*POOL_DEFAULTS, *args.overrides]
    if args.latency is not None or not any(o.startswith("local.generate_latency_s=") for o in args.overrides):
        overrides.append(f"local.generate_latency_s={1.0 if args.latency is None else args.latency}")
    try:
        cfg = load_config(args.config, overrides)
        check_config(cfg)
        baseline = args.baseline
        if baseline is None:
            baseline = ["env.evaluator=tau2"] if getattr(cfg.env, "evaluator", "tau2") != "tau2" else []
        baseline = [] if [b.lower() for b in baseline] == ["none"] else baseline
        ref_cfg = load_config(args.config, [*overrides, *baseline]) if baseline else None
        if ref_cfg is not None and (ref_cfg.local.enabled != cfg.local.enabled or ref_cfg.env.domain != cfg.env.domain
                                    or ref_cfg.policy.router_url != cfg.policy.router_url):
            raise ConfigError("--baseline may not change local.enabled, env.domain or policy.router_url "
                              "(a change to another local.* key runs the reference rows on a local stack of their own)")
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg.logging)
    latency = cfg.local.generate_latency_s if cfg.local.enabled else None
    domain = cfg.env.domain
    print(f"python -m rollout.bench pool: {domain}, {cfg.env.task_split} split, user {cfg.env.user.kind}; "
          f"os.cpu_count() = {os.cpu_count()}", flush=True)
    if cfg.local.enabled:
        print(f"server: local stack ({cfg.local.backend}, {cfg.local.num_servers} server(s)) behind sglang-router; "
              + (f"injected latency {latency:g} s per /generate (ideal = concurrency / (calls per episode x {latency:g} s))"
                 if latency else "no latency injected (latency 0): no ideal")
              + f"; stack at niceness {'of the actors' if args.stack_nice is None else args.stack_nice}", flush=True)
    else:
        print(f"server: your router {cfg.policy.router_url}; no latency injected (local.enabled=false): "
              "the ideal uses the mean /generate latency the actors measured", flush=True)

    stack = None
    rows: list[dict[str, Any]] = []
    reference_cpu, reference_how = TODAY_CPU_S_PER_EPISODE.get(domain), f"before issue 8: {TODAY_HOW}"
    facts: dict[str, Any] = {
        "args": {"config": args.config, "concurrency": concurrencies, "actors": actor_counts, "latency": latency,
                 "episodes": args.episodes, "overrides": list(args.overrides), "stack_nice": args.stack_nice,
                 "baseline_rows": args.baseline_rows},
        "cpu_count": os.cpu_count(), "domain": domain, "task_split": cfg.env.task_split, "user": cfg.env.user.kind,
        "server": f"local:{cfg.local.backend}" if cfg.local.enabled else cfg.policy.router_url, "latency_s": latency,
        "today_cpu_s_per_episode": TODAY_CPU_S_PER_EPISODE.get(domain), "today_how": TODAY_HOW, "baseline_overrides": baseline,
        "targets": {"cpu_fraction": CPU_TARGET_FRACTION, "lag_p99_ms": LAG_TARGET_MS, "lag_at_concurrency": LAG_TARGET_CONCURRENCY,
                    "ratio": RATIO_TARGET, "cpu_bound_at": CPU_BOUND_AT},
    }

    def write() -> None:
        if args.json:
            out = {**facts, "reference_cpu_s_per_episode": reference_cpu, "reference_how": reference_how, "rows": rows}
            Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")

    plan = [(c, a, "") for c in concurrencies for a in actor_counts]
    if ref_cfg is not None:
        # a reference row right before each main row (all: measured as close in time as they can
        # be, on a machine whose load drifts), or once first at the smallest concurrency with one
        # actor; on a stack of their own when the baseline changes local.* (restarted per row)
        if args.baseline_rows == "all":
            plan = [row for c, a, _ in plan for row in ((c, a, "reference"), (c, a, ""))]
        else:
            plan.insert(0, (min(concurrencies), 1, "reference"))
    stack_loop: str | None = None  # the event loop the running stack's servers report
    try:
        for k, (c, a, label) in enumerate(plan, 1):
            row_cfg = ref_cfg if label else cfg
            assert row_cfg is not None
            run_cfg, row_latency, stack_pids = row_cfg, None, []
            if row_cfg.local.enabled:
                if stack is None or stack.local != row_cfg.local:
                    from rollout.devtools.local.stack import LocalStack

                    if stack is not None:
                        stack.stop(remove_logs=False)
                    stack = LocalStack(row_cfg.local, domain, row_cfg.policy.tokenizer,
                                       log_dir=Path(row_cfg.rollout.output_dir) / "bench_stack_logs",
                                       api_key_env=row_cfg.policy.api_key_env, chat_format=row_cfg.policy.chat_format).start()
                    stack_loop = stack_event_loops(stack)
                run_cfg = resolve_endpoints(row_cfg, stack.router_url)
                run_cfg = dataclasses.replace(run_cfg, local=dataclasses.replace(run_cfg.local, enabled=False))
                row_latency, stack_pids = row_cfg.local.generate_latency_s, stack.pids()
            n = args.episodes or 3 * c
            what = f"{label} row ({' '.join(baseline)})" if label else "row"
            print(f"[{k}/{len(plan)}] {what}: {c} concurrent episodes on {a} actor(s), {n} episodes ...", file=sys.stderr, flush=True)
            row = measure_row(run_cfg, c, a, n, row_latency, stack_pids, label=label, stack_nice=args.stack_nice,
                              stack_event_loop=stack_loop)
            if label and args.baseline_rows == "first":  # the one reference row gives the reference CPU per episode
                if row["actor_cpu_s_per_episode"] is not None:
                    reference_cpu = row["actor_cpu_s_per_episode"]
                    reference_how = f"measured in this run: {c} concurrent, {a} actor(s), {' '.join(baseline)}"
            rows.append(row)
            for r in rows:
                for key in ("target_cpu_why", "target_lag_why", "target_ratio_why"):
                    r.pop(key, None)
                r.update(judge(r, reference_cpu))
            print(f"      {row['episodes']} episodes ({', '.join(f'{s} {n}' for s, n in sorted(row['statuses'].items()))}) "
                  f"in {row['wall_s']:.0f} s; window {row['window_episodes']} episodes over {row['window_s']:.1f} s",
                  file=sys.stderr, flush=True)
            write()
    except Exception as e:  # noqa: BLE001  (report which row failed, keep what ran)
        logger.exception("pool bench failed")
        print(f"error: the pool bench failed after {len(rows)} row(s): {type(e).__name__}: {e}", file=sys.stderr)
        if rows:
            print(format_table(rows))
        write()
        return 1
    finally:
        if stack is not None:
            stack.stop(remove_logs=False)
    print(format_table(rows))
    print(f"reference CPU/episode: {_f(reference_cpu, '.3f')} s ({reference_how}); "
          f"before issue 8 ({TODAY_HOW}): {_f(TODAY_CPU_S_PER_EPISODE.get(domain), '.3f')} s")
    print(format_targets(rows, reference_cpu, reference_how))
    side = format_side_by_side(rows)
    if side:
        print(side)
    print("columns: eps/s and every figure over the window when all slots were busy (see --help); CPU s/ep = actor processes "
          "+ their sandboxes, the driver and the stack excluded; actor cores = the busiest actor's own process; "
          f"CPU-bound = actor cores or machine busy >= {CPU_BOUND_AT:.0%}; lag p50 = median over actors, p99 = worst actor; floor p99 = an idle process on this machine; "
          "loop cpu/wait = the actors' loop threads: seconds on a CPU / waiting for one, per second")
    if args.json:
        write()
        print(f"json: {args.json}")
    if args.plot:
        plot_rows(rows, args.plot)
        print(f"plot: {args.plot}")
    return 0
