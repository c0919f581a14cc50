"""A GRPO loop that trains the local stack's tiny model on the CPU, around the rollout pool.

    python launch/train_grpo_tiny.py --config configs/local.yaml local.backend=tiny --steps 3

It is a plain torch trainer written the way a Ray-based trainer uses the pool (one step
off-policy, as slime and AReaL run asynchronously):

1. ``pool.collect_groups(B, tasks)``: B GRPO groups kept by dynamic sampling
   (``rollout.filter_groups=zero_variance``: groups whose rewards are all equal carry no gradient).
2. The training step runs in a thread while the main thread keeps the rollout going
   (``pool.prefetch(B, tasks, in_flight=True)`` and ``pool.poll()``): the next step's episodes run
   during training, as in an asynchronous trainer (slime, AReaL).
3. For every sample, the log-probs of its loss-masked tokens are recomputed with the trainer's own
   copy of the weights that sampled each token (``TrainingSample.token_weight_versions``), and
   ``max_abs_logprob_diff`` is the largest |trainer - rollout| difference of the step.
4. Group-normalised advantages ``(r - mean(group)) / (std(group) + 1e-6)`` (GRPO, Shao et al. 2024,
   arXiv:2402.03300) and the clipped policy-gradient loss ``-min(rho A, clip(rho, 1-eps, 1+eps) A)``
   with ``rho = exp(logp_now - logp_rollout)`` (PPO, Schulman et al. 2017), averaged over all the
   step's loss-masked tokens (DAPO's token-level mean, arXiv:2503.14476); one Adam step.
5. The weights are saved (``save_pretrained``) and ``pool.update_weights_from_disk(path,
   weight_version=step + 1)`` pauses the servers, loads them and continues, while the prefetched
   episodes are in flight: their interrupted turns are continued (``rollout.partial_rollout``).

Each step appends a line to ``<rollout.output_dir>/train_log.jsonl``; at the end the script checks
that every submitted episode id was delivered exactly once (in a kept group or through
``pool.excluded()``) and exits 1 otherwise, or when a step's ``max_abs_logprob_diff`` exceeds
``--max-logprob-diff``.

The tiny model is random and will not get good at tau2. Its reward signal: the script's default
tasks are the retail tasks whose correct outcome leaves the database unchanged (tau2 gives 1.0
when the conversation ends), with one agent turn per episode; a turn that asks the scripted user
a question runs past it and earns 0. The loop's point is that the cycle loses nothing and stays
exact. Run it through ``launch/submit.sh --entry launch/train_grpo_tiny.py -- ...`` on a cluster.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import itertools
import json
import logging
import os
import sys
import time
from pathlib import Path

# Ray uploads the working directory and runs the job from it (see launch/job.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

logger = logging.getLogger("train_grpo_tiny")

# Applied before the user's overrides (each can be overridden on the command line).
TRAIN_DEFAULTS = [
    "env.task_ids=[10,25,50,57,65]",  # retail tasks whose gold outcome is "no database change"
    "env.max_steps=1",
    # Long turns make generation, not training, the bottleneck, as on a real cluster: the update
    # then meets the next batch mid-turn, and each step trains on two versions' tokens.
    "policy.sampling.max_new_tokens=512",
    "rollout.n_samples_per_task=4",
    "rollout.filter_groups=zero_variance",
    "rollout.max_staleness=1",  # one step off-policy; older episodes are dropped and re-run
    "rollout.partial_rollout=continue",
    "rollout.output_dir=outputs/grpo_tiny",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="train_grpo_tiny.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", "-c", default="configs/local.yaml")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups-per-step", type=int, default=4, help="B: kept GRPO groups per step")
    p.add_argument("--rollout-ahead", type=int, default=None, help="groups kept generating while the trainer trains (default B)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip range epsilon")
    p.add_argument("--max-logprob-diff", type=float, default=1e-3, help="exit 1 if a step's max |trainer - rollout| log-prob exceeds it")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="give up when no episode ends for this long")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    from rollout.cli import parse_args_with_overrides

    return parse_args_with_overrides(p, argv)


class TinyTrainer:
    """The trainer's side: its own tiny model, snapshots of the weights of every version still in
    use, the GRPO loss and the log-prob check.

    Args:
        tiny_cfg: ``local.tiny`` (the servers' initial weights are rebuilt from it: version
            ``start_version``).
        vocab_size: ``len(tokenizer)``.
        temperature: the sampling temperature (log-probs are of ``softmax(logits / T)``).
    """

    def __init__(self, tiny_cfg, vocab_size: int, temperature: float, lr: float, clip: float, start_version: int):
        import torch

        from rollout.local.tiny import build_tiny_model

        self.torch = torch
        self.model = build_tiny_model(vocab_size, tiny_cfg)
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
        torch = self.torch
        total = sum(sum(s.loss_mask) for g in groups for s in g)
        self.opt.zero_grad(set_to_none=True)
        loss_sum, clipped = 0.0, 0
        for g in groups:
            rewards = torch.tensor([s.reward for s in g])
            adv = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-6)
            for s, a in zip(g, adv.tolist()):
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
        from rollout.local.tiny import save_weights

        self.snapshots[version] = self._snapshot()
        return save_weights(self.model, path)

    def forget_before(self, version: int) -> None:
        """Drop snapshots older than ``version`` (no episode can carry them any more)."""
        for v in [v for v in self.snapshots if v < version]:
            del self.snapshots[v]


def train(cfg, args) -> dict:
    """Run the loop (see the module docstring); returns the run summary.

    Raises:
        ValueError: the config does not use the local stack's tiny backend.
    """
    import torch

    from rollout.tokenizer import load_tokenizer
    from rollout.wiring import open_pool

    if not (cfg.local.enabled and cfg.local.backend == "tiny"):
        raise ValueError("train_grpo_tiny.py trains the local stack's tiny model: set local.enabled=true local.backend=tiny")
    torch.set_num_threads(1)  # the servers and actors share this machine's cores
    out = Path(cfg.rollout.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_log.jsonl").write_text("")
    tokenizer = load_tokenizer(cfg.policy.tokenizer)
    trainer = TinyTrainer(cfg.local.tiny, len(tokenizer), cfg.policy.sampling.temperature, args.lr, args.clip, cfg.rollout.weight_version)
    delivered: list[str] = []
    log: list[dict] = []
    with open_pool(cfg, log_dir_name="train_stack_logs") as (cfg, pool, task_ids):
        tasks = itertools.cycle(task_ids)
        prev = pool.stats()
        ahead = args.rollout_ahead if args.rollout_ahead is not None else args.groups_per_step
        pool.prefetch(ahead, tasks)
        for step in range(args.steps):
            t0 = time.monotonic()
            groups = pool.collect_groups(args.groups_per_step, tasks, abort_surplus=False, timeout_s=args.timeout_s)
            samples = [s for g in groups for s in g]

            def work():
                return trainer.logprob_check(samples), trainer.step(groups)

            # Train while the rollout goes on: the next step's episodes run meanwhile, and the
            # update below meets them mid-turn (one step off-policy, as slime and AReaL run).
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                fut = ex.submit(work)
                while not fut.done():
                    if step + 1 < args.steps:
                        pool.prefetch(ahead, tasks, in_flight=True)
                    pool.poll(timeout_s=0.5)
                (diff, checked, versions), stats = fut.result()
            path = trainer.save(out / "weights" / f"step_{step + 1}", step + 1)
            outstanding = pool.num_outstanding
            pool.update_weights_from_disk(str(path), weight_version=step + 1)
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
                "episodes_excluded": len(excluded), "episodes_outstanding_at_update": outstanding, "weight_versions_seen": versions,
                "reward_mean": sum(s.reward for s in samples) / max(len(samples), 1),
                "max_abs_logprob_diff": diff, "logprob_tokens_checked": checked, **stats,
                "seconds": round(time.monotonic() - t0, 2),
            }
            prev = now
            log.append(line)
            with open(out / "train_log.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
            print(json.dumps(line), flush=True)
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
        "pool": final,
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rollout.config import ConfigError, load_config
    from rollout.worker import setup_logging

    try:
        cfg = load_config(args.config, TRAIN_DEFAULTS + list(args.overrides))
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg.logging)
    try:
        summary = train(cfg, args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exactly once: {summary['episodes_submitted']} submitted, {summary['episodes_delivered']} delivered, "
          f"{summary['duplicates']} duplicates, {summary['missing']} missing")
    print(f"weight versions seen {summary['weight_versions_seen']}; episodes interrupted {summary['episodes_interrupted']}, "
          f"continued {summary['episodes_continued']}; max |trainer - rollout| log-prob {summary['max_abs_logprob_diff']:.3e}")
    print(f"train log: {Path(cfg.rollout.output_dir) / 'train_log.jsonl'}")
    ok = summary["exactly_once"] and summary["max_abs_logprob_diff"] <= args.max_logprob_diff
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
