"""A GRPO loop that trains the local stack's tiny model on the CPU, around the rollout pool.

    python launch/train_grpo_tiny.py --config configs/local.yaml local.backend=tiny --steps 3 [--logger tensorboard]
    python launch/train_grpo_tiny.py --replay outputs/grpo_tiny --steps 3    # the same groups again, nothing started

It is a plain torch trainer written the way a Ray-based trainer uses the pool (one step
off-policy, as slime and AReaL run asynchronously). B is ``--groups-per-step``:

1. ``pool.collect_groups(B, tasks, max_outstanding_groups=B)``: B GRPO groups kept by dynamic
   sampling (``rollout.filter_groups=zero_variance``: groups whose rewards are all equal carry no
   gradient); at most B groups are complete or on their way at any time.
2. The training step runs in a thread while the main thread keeps the rollout going
   (``pool.prefetch(ahead, tasks)`` and ``pool.poll()``): ``ahead`` (``--rollout-ahead``, default
   and at most B - 1) of the next step's groups run during training.
3. For every sample, the log-probs of its loss-masked tokens are recomputed with the trainer's own
   copy of the weights that sampled each token (``TrainingSample.token_weight_versions``), and
   ``max_abs_logprob_diff`` is the largest |trainer - rollout| difference of the step.
4. Group-normalised advantages ``(r - mean(group)) / (std(group) + 1e-6)`` over the group's
   episodes, each applied to all of the episode's samples (``rollout.sample_mode``;
   ``rollout.core.groups.episode_advantages``) (GRPO, Shao et al. 2024, arXiv:2402.03300) and the clipped policy-gradient loss ``-min(rho A, clip(rho, 1-eps, 1+eps) A)``
   with ``rho = exp(logp_now - logp_rollout)`` (PPO, Schulman et al. 2017), averaged over all the
   step's loss-masked tokens (DAPO's token-level mean, arXiv:2503.14476); one Adam step.
5. The rest of the next step's batch is submitted (``pool.prefetch(B, tasks)``), the weights are
   saved (``save_pretrained``), the loop waits, polling the pool, until a ``/generate`` call is
   being generated on a server, and ``pool.update_weights_from_disk(path, weight_version=step +
   1)`` pauses the servers, loads the weights and continues: the calls it interrupts are continued
   (``rollout.partial_rollout=continue``), so the next step's batch has tokens of two versions.

Why the update meets generation whatever the machine's speed. Keeping the next batch running
during training is not enough: on a fast machine it all ends before training does, and the update
then finds nothing in flight. So the update is placed by state, not by time:

* at most B groups are complete or on their way during a step's collection (item 1 above), and
  at most B - 1 during its training (item 2), so when training ends fewer than B complete groups
  wait;
* ``pool.prefetch(B, tasks)`` then submits the next batch's missing group(s): episodes that have
  not started yet, each with a turn to generate, and part of the next step's batch (the next
  collection needs at least one group that is not complete);
* the update is called once a server reports a ``/generate`` request admitted and generating
  (``GET /get_server_info`` of every worker the router lists: ``num_inflight_requests`` less the
  held and paused ones), not after a delay; ``pool.last_pause`` then says what the update met.
  A request admitted on a server is one the pause aborts (``abort`` mode) unless it ends in the
  few milliseconds before the pause reaches the server (a fresh turn runs up to 512 tokens); the
  pool's own ``worker_infos()`` only has ``running`` episodes, which include episodes that have
  not sent their first call yet (a fresh episode sets up before it generates), so they are not
  used.

With B = 1 no group of the next step runs during training (B - 1 = 0): the overlap is then the
update alone. The last step's update has no next step to meet: nothing is started for it, it
still loads the trained weights (the servers end on the final version, as a trainer's last sync
does), whatever surplus of the collection still runs is interrupted and then cancelled, and it
is not checked. The waste of starting a batch only to cancel it is not worth a check there.

Each step appends a line to ``<rollout.output_dir>/train_log.jsonl``. What this step's update met:
``update_checked`` (false for the last step), ``update_generating_requests`` (requests generating
on the servers just before the update), ``update_waited_s`` (the wait for them, seconds),
``update_episodes_running`` and ``update_interrupted_calls`` (``pool.last_pause``: episodes
running and ``/generate`` calls under way when the update closed the actors' gates: the calls it
interrupted), and ``episodes_outstanding_at_update``. An interruption is delivered when its
episode ends, i.e. during the next step: ``episodes_interrupted`` / ``episodes_continued`` are the
episodes delivered during this step (its collection and training) that an update interrupted /
whose turn was continued, which are the previous step's update's (step 0's are 0).

Each line also says what the pool handed the trainer: ``group_episode_ids`` (each group's
episodes, in the order the groups came) and ``excluded_episodes`` (``[episode id, reason]`` of
what ``pool.excluded()`` gave during the step). With ``--logger tensorboard`` or ``--logger
wandb`` the line's numbers also go to TensorBoard (an event file under
``<output_dir>/tensorboard``) or to W&B in offline mode (``<output_dir>/wandb/offline-run-*``);
the packages are the ``logging`` extra, and a missing one is one line (exit 2) before anything
starts.

The run is journaled in ``rollout.output_dir`` (``specs.jsonl``, ``episodes.jsonl``,
``events.jsonl``, ``run.json``, ``config.yaml``; replaced on each run, as ``train_log.jsonl`` is).
``--replay DIR`` trains on it again with nothing started (no Ray, no router, no server): the
pool is :class:`rollout.core.pool.ReplayPool` over DIR's journal, the config DIR's own, the output
``DIR/replay``. The loop makes the same calls, so each step gets the groups the run's step got, in
the same order, with the same exclusions; the weight updates only move the trainer's version on,
and the check that updates interrupted generation is skipped (it needs live generation). The
training is deterministic on the CPU, so the replay's log-prob check passes too: its trainer
reaches the weights the run's servers sampled with.

At the end the script checks that every submitted episode id was delivered exactly once (in a
kept group or through ``pool.excluded()``), that no step's ``max_abs_logprob_diff`` exceeds
``--max-logprob-diff``, and that every checked update interrupted at least one ``/generate`` call
(unless ``--allow-idle-updates``; not with ``--replay``); it exits 1 when one fails, 2 on a bad
configuration.

The tiny model is random and will not get good at tau2. Its reward signal: the script's default
tasks are the retail tasks whose correct outcome leaves the database unchanged (tau2 gives 1.0
when the conversation ends), with one agent turn per episode; a turn that asks the scripted user
a question runs past it and earns 0. The loop's point is that the cycle loses nothing and stays
exact. Run it through ``launch/submit.sh --entry launch/train_grpo_tiny.py -- ...`` on a cluster.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import itertools
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# Ray uploads the working directory and runs the job from it (see launch/job.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollout.integrations.step_logger import LOGGERS  # noqa: E402  (after the path above)

logger = logging.getLogger("train_grpo_tiny")

# Applied before the user's overrides (each can be overridden on the command line).
TRAIN_DEFAULTS = [
    "env.task_ids=[10,25,50,57,65]",  # retail tasks whose gold outcome is "no database change"
    "env.max_steps=1",
    # The scripted user: the conversation ends after the agent's one turn, and a task whose gold
    # outcome leaves the database unchanged earns 1.0 (configs/vllm_cpu.yaml's llm user would make
    # every episode max_steps with reward 0: every group filtered, no batch ever complete).
    "env.user.kind=scripted",
    # Long turns make generation, not training, the bottleneck, as on a real cluster: the update
    # then meets the next batch mid-turn, and each step trains on two versions' tokens.
    "policy.sampling.max_new_tokens=512",
    # The random model's turns nearly all run to max_new_tokens: kept as the turn (parsed and sent
    # on), they earn 0 or 1; with on_length=truncate every episode would end `truncated` with
    # reward 0, every group would be filtered (zero variance) and no batch would ever be complete.
    "policy.on_length=keep",
    "rollout.n_samples_per_task=4",
    "rollout.filter_groups=zero_variance",
    "rollout.max_staleness=1",  # one step off-policy; older episodes are dropped and re-run
    "rollout.partial_rollout=continue",
    "rollout.output_dir=outputs/grpo_tiny",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="train_grpo_tiny.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", "-c", default=None, help="YAML config (default configs/local.yaml; with --replay: the run's own)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups-per-step", type=int, default=4, help="B: kept GRPO groups per step")
    p.add_argument("--rollout-ahead", type=int, default=None,
                   help="groups of the next step started while the trainer trains (default and at most B - 1; the rest start after the "
                        "training step, so that the update meets them generating)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip range epsilon")
    p.add_argument("--max-logprob-diff", type=float, default=1e-3, help="exit 1 if a step's max |trainer - rollout| log-prob exceeds it")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="give up when no episode ends, or no generation starts, for this long")
    p.add_argument("--allow-idle-updates", action="store_true",
                   help="do not exit 1 when a step's update (the last step's excepted) interrupted no /generate call")
    p.add_argument("--logger", choices=LOGGERS, default="none",
                   help="also log each step's figures to TensorBoard (OUT/tensorboard) or W&B in offline mode (OUT/wandb); "
                        "needs the 'logging' extra")
    p.add_argument("--replay", metavar="DIR", default=None,
                   help="train on the groups a finished run of this script delivered (its output folder DIR: the journal), in the "
                        "same order, with nothing started (no Ray, no server); the config is the run's, the output DIR/replay")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    from rollout.app.cli import parse_args_with_overrides

    return parse_args_with_overrides(p, argv)


def check_args(args: argparse.Namespace) -> str | None:
    """The error message for inconsistent loop options (``--steps``, ``--groups-per-step``,
    ``--rollout-ahead``), or ``None``; fills ``args.rollout_ahead`` in (default B - 1)."""
    b = args.groups_per_step
    if args.steps < 1 or b < 1:
        return f"--steps and --groups-per-step must be >= 1, got {args.steps} and {b}"
    if args.rollout_ahead is None:
        args.rollout_ahead = b - 1
    if not 0 <= args.rollout_ahead <= b - 1:
        return (f"--rollout-ahead must be in [0, B - 1] = [0, {b - 1}], got {args.rollout_ahead}: with B groups of the next step "
                f"started during training they may all end before the update, which then meets nothing in flight")
    return None


class ServerProbe:
    """Counts the generate requests the local stack's servers are generating now.

    Reads every worker the router lists (``GET /workers``). The local stack's servers (SGLang's
    protocol): ``GET /get_server_info``, where a request is generating when it is in flight and
    neither held nor paused (``num_inflight_requests - num_held_requests - num_paused_requests``),
    i.e. admitted past the server's pause gate, so that a pause in ``abort`` mode aborts it. vLLM
    (``engine="vllm"``): ``GET /metrics``' ``vllm:num_requests_running`` (requests scheduled on
    the engine, which ``/pause?mode=abort`` aborts; a request waiting for KV is not counted).

    Args:
        router_url: ``http://host:port`` of the router (``policy.router_url``, resolved).
        api_key: sent as ``Authorization: Bearer <key>`` (``policy.api_key_env``'s key), or ``None``.
        timeout_s: bound on each HTTP call, seconds.
        engine: ``policy.engine`` (``sglang`` or ``vllm``).
    """

    def __init__(self, router_url: str, api_key: str | None = None, timeout_s: float = 10.0, engine: str = "sglang"):
        self.router_url = router_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.engine = engine
        self._urls: list[str] | None = None

    def _get(self, url: str, text: bool = False):
        req = urllib.request.Request(url, method="GET")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw = r.read()
                return raw.decode() if text else json.loads(raw)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"GET {url} answered {e.code}") from None

    def worker_urls(self) -> list[str]:
        """The worker URLs the router lists (read once).

        Raises:
            RuntimeError: the router answered with a status other than 200.
            OSError: the router did not answer within ``timeout_s``.
        """
        if self._urls is None:
            data = self._get(self.router_url + "/workers")
            workers = data.get("workers", []) if isinstance(data, dict) else data
            self._urls = [str(w.get("url") if isinstance(w, dict) else w).rstrip("/") for w in workers]
        return list(self._urls)

    def generating(self) -> int:
        """Requests being generated now, over every worker (>= 0).

        Raises:
            RuntimeError: a server answered with a status other than 200.
            OSError: a server did not answer within ``timeout_s``.
        """
        n = 0
        for url in self.worker_urls():
            if self.engine == "vllm":
                n += sum(int(float(line.rsplit(" ", 1)[1])) for line in self._get(url + "/metrics", text=True).splitlines()
                         if line.startswith("vllm:num_requests_running"))
                continue
            info = self._get(url + "/get_server_info")
            n += max(0, int(info["num_inflight_requests"]) - int(info.get("num_held_requests", 0)) - int(info.get("num_paused_requests", 0)))
        return n


def wait_for_generation(pool, probe: ServerProbe, tasks, num_groups: int, timeout_s: float) -> tuple[int, float]:
    """Poll ``pool`` (dispatching queued episodes, delivering ended ones) until ``probe`` reports a
    ``/generate`` request generating. Should every outstanding episode end first, the next batch is
    topped up again (``pool.prefetch(num_groups, tasks)``).

    Returns:
        ``(requests generating, seconds waited)``; ``(0, seconds)`` when nothing is outstanding
        and the next batch is already complete (nothing can be met: the update will be idle).

    Raises:
        TimeoutError: no generation started within ``timeout_s`` seconds.
        RuntimeError, OSError: a server or the router did not answer (:class:`ServerProbe`).
    """
    t0 = time.monotonic()
    while True:
        n = probe.generating()
        if n > 0:
            return n, time.monotonic() - t0
        if not pool.num_outstanding and not pool.prefetch(num_groups, tasks):
            return 0, time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"no /generate call started within {timeout_s}s ({pool.num_outstanding} episode(s) outstanding)")
        pool.poll(timeout_s=0.05)


def idle_updates(log: list[dict]) -> list[int]:
    """The steps whose update was checked (``update_checked``: every step but the last) and
    interrupted no ``/generate`` call (``update_interrupted_calls == 0``)."""
    return [line["step"] for line in log if line["update_checked"] and line["update_interrupted_calls"] == 0]


def run_ok(summary: dict, max_logprob_diff: float, allow_idle_updates: bool) -> bool:
    """True when the run summary (:func:`train`'s) says every submitted episode was delivered
    exactly once, no step's ``max_abs_logprob_diff`` exceeds ``max_logprob_diff``, and (unless
    ``allow_idle_updates``) no checked update was idle (``idle_updates``, :func:`idle_updates`)."""
    if not summary["exactly_once"] or summary["max_abs_logprob_diff"] > max_logprob_diff:
        return False
    return allow_idle_updates or not summary["idle_updates"]


def start_model(cfg, vocab_size: int):
    """The servers' initial weights as the trainer's own model: the ``tiny`` backend's, rebuilt from
    ``local.tiny``, or, with ``local.backend=vllm``, the checkpoint the vLLM servers start from
    (written now if it is not there yet; the engine then finds it)."""
    if cfg.local.backend == "vllm":
        from rollout.devtools.check_engine import starting_weights

        return starting_weights(cfg, None, vocab_size)
    from rollout.devtools.local.tiny import build_tiny_model

    return build_tiny_model(vocab_size, cfg.local.tiny)


class TinyTrainer:
    """The trainer's side: its own copy of the servers' model, snapshots of the weights of every
    version still in use, the GRPO loss and the log-prob check.

    Args:
        model: the servers' initial weights (:func:`start_model`: version ``start_version``), a
            ``transformers`` causal LM with ``.model`` and ``.lm_head``.
        temperature: the sampling temperature (log-probs are of ``softmax(logits / T)``).
    """

    def __init__(self, model, temperature: float, lr: float, clip: float, start_version: int):
        import torch

        self.torch = torch
        self.model = model
        self.model.requires_grad_(True)
        self.temperature = temperature if temperature > 0 else 1.0
        self.clip = clip
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.snapshots: dict[int, object] = {start_version: self._snapshot()}

    def _snapshot(self):
        """A frozen copy of the current weights (the model is 9.8 M parameters, 40 MB)."""
        frozen = copy.deepcopy(self.model)
        frozen.requires_grad_(False)
        return frozen

    def _log_probs(self, model, tokens: list[int], positions: list[int]):
        """log softmax(logits / T) of ``tokens[p]`` given ``tokens[:p]`` for each ``p``, one
        forward pass; differentiable when ``model`` requires grad. Shape ``[len(positions)]``."""
        torch = self.torch
        ids = torch.tensor([tokens], dtype=torch.long)
        hidden = model.model(input_ids=ids).last_hidden_state[0]
        rows = torch.tensor([p - 1 for p in positions], dtype=torch.long)
        logits = model.lm_head(hidden[rows]).float() / self.temperature
        target = torch.tensor([tokens[p] for p in positions], dtype=torch.long)
        return logits.gather(1, target[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)

    def logprob_check(self, samples) -> tuple[float, int, list[str]]:
        """Recompute every loss-masked token's log-prob under the weights of the version that
        sampled it. Returns (max |trainer - rollout|, tokens checked, versions seen)."""
        torch = self.torch
        worst, n, seen = 0.0, 0, set()
        for s in samples:
            p = s.prompt_length
            by_version: dict[int, list[int]] = {}
            for i, v in enumerate(s.token_weight_versions()):
                if v is not None:
                    by_version.setdefault(int(v), []).append(i)
            for v, idx in by_version.items():
                if v not in self.snapshots:
                    raise RuntimeError(f"episode {s.metadata['episode_id']}: no snapshot of weight version {v}")
                with torch.inference_mode():
                    lp = self._log_probs(self.snapshots[v], s.tokens, [p + i for i in idx])
                ref = torch.tensor([s.rollout_log_probs[i] for i in idx])
                worst = max(worst, float((lp - ref).abs().max()))
                n += len(idx)
                seen.add(str(v))
        return worst, n, sorted(seen, key=int)

    def step(self, groups) -> dict:
        """One GRPO step over ``groups`` (lists of TrainingSample); returns loss statistics."""
        from rollout.core.groups import episode_advantages

        torch = self.torch
        total = sum(sum(s.loss_mask) for g in groups for s in g)
        self.opt.zero_grad(set_to_none=True)
        loss_sum, clipped = 0.0, 0
        for g in groups:
            # one advantage per episode, applied to each of its samples (rollout.sample_mode)
            for s, a in zip(g, episode_advantages(g)):
                idx = [i for i, m in enumerate(s.loss_mask) if m]
                if not idx:
                    continue
                p = s.prompt_length
                lp = self._log_probs(self.model, s.tokens, [p + i for i in idx])
                old = torch.tensor([s.rollout_log_probs[i] for i in idx])
                ratio = torch.exp(lp - old)
                surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * a)
                loss = -surrogate.sum() / total
                loss.backward()
                loss_sum += loss.item()
                clipped += int(((ratio - 1).abs() > self.clip).sum())
        before = [p.detach().clone() for p in self.model.parameters()]
        self.opt.step()
        delta = sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(self.model.parameters(), before)) ** 0.5
        return {"loss": loss_sum, "tokens": total, "clipped_tokens": clipped, "update_norm": delta}

    def save(self, path: Path, version: int) -> Path:
        """Write the current weights for the servers and keep a snapshot under ``version``."""
        from rollout.devtools.local.tiny import save_weights

        self.snapshots[version] = self._snapshot()
        return save_weights(self.model, path)

    def forget_before(self, version: int) -> None:
        """Drop snapshots older than ``version`` (no episode can carry them any more)."""
        for v in [v for v in self.snapshots if v < version]:
            del self.snapshots[v]


@contextlib.contextmanager
def episode_source(cfg, args):
    """What the loop takes its groups from: ``(cfg, pool, task_ids, probe)``.

    Live: the local stack's pool (:func:`rollout.open_pool`; ``cfg`` with its endpoints resolved),
    the run journaled into ``rollout.output_dir`` (replaced on each run, as ``train_log.jsonl`` is)
    so that ``--replay`` can read it, and a :class:`ServerProbe`. With ``args.replay``: the finished
    run's :class:`rollout.core.pool.ReplayPool` (no Ray, no server: ``probe`` is ``None``, the task
    ids are not used).
    """
    if args.replay is not None:
        from rollout.core.pool import ReplayPool

        yield cfg, ReplayPool.open(args.replay, cfg), [], None
        return
    from rollout.app.wiring import open_pool
    from rollout.core.journal import CONFIG_FILE, RunJournal
    from rollout.core.policy import api_key_from_env

    out = Path(cfg.rollout.output_dir)
    journal = RunJournal.open(out, cfg, overwrite=True)
    status, reason = "interrupted", "the run stopped before it ended"
    try:
        with open_pool(cfg, log_dir_name="train_stack_logs") as (rcfg, pool, task_ids):
            (out / CONFIG_FILE).write_text(cfg.to_yaml())  # names of key variables only, as rollout run writes
            pool.attach_journal(journal)
            yield rcfg, pool, task_ids, ServerProbe(rcfg.policy.router_url, api_key_from_env(rcfg.policy.api_key_env),
                                                    engine=rcfg.policy.engine)
        status, reason = "finished", None
    except BaseException as e:
        reason = f"{type(e).__name__}: {e}"
        raise
    finally:
        journal.close(status, reason)


def train(cfg, args) -> dict:
    """Run the loop (see the module docstring); returns the run summary.

    Raises:
        ValueError: the config does not use the local stack's tiny backend, or the loop options
            are inconsistent (:func:`check_args`).
        TimeoutError: no episode ended, or no generation started before an update, within
            ``args.timeout_s`` seconds.
        rollout.core.journal.JournalError: ``--replay`` names no run folder.
    """
    problem = check_args(args)
    if problem is not None:
        raise ValueError(problem)
    import torch

    from rollout.core.tokenizer import load_tokenizer
    from rollout.integrations.step_logger import open_step_logger, scalar_figures

    if not (cfg.local.enabled and cfg.local.backend in ("tiny", "vllm")):
        raise ValueError("train_grpo_tiny.py trains the local stack's tiny model or the vLLM checkpoint: set local.enabled=true and "
                         "local.backend=tiny (or use configs/vllm_cpu.yaml)")
    torch.set_num_threads(1)  # the servers and actors share this machine's cores
    out = Path(cfg.rollout.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_log.jsonl").write_text("")
    tokenizer = load_tokenizer(cfg.policy.tokenizer)
    trainer = TinyTrainer(start_model(cfg, len(tokenizer)), cfg.policy.sampling.temperature, args.lr, args.clip, cfg.rollout.weight_version)
    delivered: list[str] = []
    log: list[dict] = []
    b, ahead = args.groups_per_step, args.rollout_ahead
    tlog_config = {"args": {k: v for k, v in vars(args).items() if k != "overrides"}, "overrides": list(args.overrides), "config": cfg.to_dict()}
    with episode_source(cfg, args) as (cfg, pool, task_ids, probe), \
            open_step_logger(args.logger, out, run_name=out.name, config=tlog_config) as tlog:
        tasks = itertools.cycle(task_ids)
        prev = pool.stats()
        pool.prefetch(b, tasks)
        for step in range(args.steps):
            t0 = time.monotonic()
            last = step + 1 == args.steps
            # At most B groups complete or on their way: when B are kept, at most B - 1 are left.
            groups = pool.collect_groups(b, tasks, abort_surplus=False, max_outstanding_groups=b, timeout_s=args.timeout_s)
            samples = [s for g in groups for s in g]
            ep_rewards = {s.episode_id: s.reward for s in samples}

            def work():
                return trainer.logprob_check(samples), trainer.step(groups)

            # Train while the rollout goes on: up to `ahead` (<= B - 1) of the next step's groups
            # run meanwhile (one step off-policy, as slime and AReaL run).
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                fut = ex.submit(work)
                while not fut.done():
                    if not last:
                        pool.prefetch(ahead, tasks)
                    pool.poll(timeout_s=0.5)
                (diff, checked, versions), stats = fut.result()
            if not last:
                pool.prefetch(b, tasks)  # fewer than B complete groups wait: the rest of the next batch starts now
            path = trainer.save(out / "weights" / f"step_{step + 1}", step + 1)
            if probe is None:  # a replay: no server to wait for
                generating, waited = 0, 0.0
            else:
                generating, waited = wait_for_generation(pool, probe, tasks, b, args.timeout_s) if not last else (probe.generating(), 0.0)
            outstanding = pool.num_outstanding
            pool.update_weights_from_disk(str(path), weight_version=step + 1)  # a replay: the version only
            met = pool.last_pause
            excluded = list(pool.excluded())
            delivered += [s.metadata["episode_id"] for s in samples] + [e.sample.metadata["episode_id"] for e in excluded]
            trainer.forget_before(step + 1 - (cfg.rollout.max_staleness if cfg.rollout.max_staleness is not None else step + 1))
            now = pool.stats()

            def d(key: str) -> int:
                return int(now.get(key, 0) - prev.get(key, 0))

            line = {
                "step": step, "weight_version": step + 1, "groups_used": len(groups), "groups_filtered": d("groups_filtered"),
                "episodes_submitted": d("episodes_submitted"), "episodes_delivered": d("episodes_delivered"),
                "episodes_interrupted": d("episodes_interrupted"), "episodes_continued": d("episodes_continued"),
                "episodes_excluded": len(excluded), "episodes_outstanding_at_update": outstanding,
                "update_checked": not last and probe is not None, "update_generating_requests": generating, "update_waited_s": round(waited, 3),
                "update_episodes_running": met.episodes_running, "update_interrupted_calls": met.generate_calls_out,
                "weight_versions_seen": versions,
                "reward_mean": sum(ep_rewards.values()) / max(len(ep_rewards), 1),  # per episode, whatever rollout.sample_mode
                "max_abs_logprob_diff": diff, "logprob_tokens_checked": checked, **stats,
                "seconds": round(time.monotonic() - t0, 2),
                # what the pool handed the trainer: each group's episodes, in order, and what it kept out (--replay compares them)
                "group_episode_ids": [list(dict.fromkeys(s.episode_id for s in g)) for g in groups],
                "excluded_episodes": [[e.sample.episode_id, e.reason] for e in excluded],
            }
            prev = now
            log.append(line)
            tlog.log(step, scalar_figures(line))
            with open(out / "train_log.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
            print(json.dumps({k: v for k, v in line.items() if k not in ("group_episode_ids", "excluded_episodes")}), flush=True)
        pool.cancel_outstanding(timeout_s=args.timeout_s)
        unused = [s.metadata["episode_id"] for g in pool.groups() for s in g]  # complete, never handed out
        delivered += unused + [e.sample.metadata["episode_id"] for e in pool.excluded()]
        submitted = pool.submitted_ids
        final = pool.stats()
    dup = len(delivered) - len(set(delivered))
    summary = {
        "steps": len(log), "episodes_submitted": len(submitted), "episodes_delivered": len(delivered), "duplicates": dup,
        "episodes_in_unused_groups": len(unused),
        "missing": len(submitted - set(delivered)), "unexpected": len(set(delivered) - submitted),
        "exactly_once": dup == 0 and set(delivered) == submitted,
        "weight_versions_seen": sorted({v for line in log for v in line["weight_versions_seen"]}, key=int),
        "max_abs_logprob_diff": max((line["max_abs_logprob_diff"] for line in log), default=0.0),
        "episodes_interrupted": int(final.get("episodes_interrupted", 0)), "episodes_continued": int(final.get("episodes_continued", 0)),
        "update_interrupted_calls": [line["update_interrupted_calls"] for line in log], "idle_updates": idle_updates(log),
        "replay_of": args.replay, "pool": final,
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def load_train_config(args):
    """The config: ``--config`` (default configs/local.yaml) with :data:`TRAIN_DEFAULTS` and the
    overrides; with ``--replay DIR`` the run's own (``DIR/config.yaml``, or ``--config``) with the
    overrides, its output in ``DIR/replay`` unless ``rollout.output_dir`` is overridden.

    Raises:
        rollout.core.config.ConfigError, FileNotFoundError, rollout.core.journal.JournalError.
    """
    from rollout.core.config import load_config

    if args.replay is not None:
        from rollout.app.replay import replay_config

        return replay_config(args.replay, args.config, list(args.overrides))
    return load_config(args.config or "configs/local.yaml", TRAIN_DEFAULTS + list(args.overrides))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rollout.core.config import ConfigError
    from rollout.core.journal import JournalError
    from rollout.core.logs import setup_logging
    from rollout.integrations.step_logger import MissingLoggerPackage, check_logger

    problem = check_args(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        check_logger(args.logger)  # one line, before anything starts
        cfg = load_train_config(args)
    except (MissingLoggerPackage, JournalError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg.logging)
    try:
        summary = train(cfg, args)
    except (ValueError, JournalError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exactly once: {summary['episodes_submitted']} submitted, {summary['episodes_delivered']} delivered, "
          f"{summary['duplicates']} duplicates, {summary['missing']} missing")
    print(f"weight versions seen {summary['weight_versions_seen']}; episodes interrupted {summary['episodes_interrupted']}, "
          f"continued {summary['episodes_continued']}; max |trainer - rollout| log-prob {summary['max_abs_logprob_diff']:.3e}")
    if args.replay is not None:
        print(f"replay of {args.replay}: no server, no weight update on one; the check that every update interrupted /generate calls "
              "needs live generation and is skipped")
    else:
        print(f"/generate calls interrupted by each step's update {summary['update_interrupted_calls']} (the last step's is not checked); "
              f"idle checked updates: {summary['idle_updates'] or 'none'}" + (" (allowed: --allow-idle-updates)" if args.allow_idle_updates else ""))
    print(f"train log: {Path(cfg.rollout.output_dir) / 'train_log.jsonl'}")
    return 0 if run_ok(summary, args.max_logprob_diff, args.allow_idle_updates or args.replay is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
