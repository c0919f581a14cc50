"""A rollout driver for the metrics test (tests/ray/test_metrics.py) and the dashboard screenshot
(docs/observability.md), run in its own process so that its Ray connection is to the given head
(the one whose metrics export port is scraped) and to nothing else.

It opens a :class:`RolloutPool` (2 actors) on the Ray head ``--address`` against the gold-replay
router ``--router-url``, behind a :class:`FaultProxy` that makes chosen episodes end otherwise:
every ``/generate`` of an episode whose id holds ``fail`` answers 500 (``policy_error``, after one
retry), and one whose id holds ``wrong`` is answered with a reply that solves nothing (the
scripted user gives up: ``completed``, reward 0). With
``rollout.filter_groups=zero_variance`` and ``rollout.on_group_failure=drop`` every group is
filtered or dropped, so each episode reaches the exclusions with a reason.

``--rounds`` rounds, each: ``--ok-tasks`` gold tasks, one ``fail`` and one ``wrong`` task, ``--samples``
episodes each, consumed through ``pool.stream(excluded=True)``; between rounds a weight update
(``update_weights_from_disk``: pause, relabel, continue; the gold server loads nothing) to the
round's number. A last round runs one gold task with 4 samples (both actors answer the new
version). Then it writes the report (``--out``, JSON: every episode's figures, the pool's stats,
the actors' pids in actor order) and prints ``READY``; it keeps the pool open (the actors' and
the driver's metrics stay exported) until its standard input closes, then shuts down.

Usage: python tests/support/metrics_driver.py --address HOST:PORT --router-url URL --out report.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # support.*
sys.path.insert(0, str(HERE.parents[1]))  # rollout, when run from anywhere
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WRONG = "I am sorry, I cannot look into that."


def _rule(key: str, body: dict):
    if "fail" in key:
        return ("status", 500)
    if "wrong" in key:
        return ("text", WRONG)
    return None


def _figures(sample, reason: str | None) -> dict:
    from support.metrics_figures import input_tokens, tool_calls, user_turns

    md = sample.metadata
    timings = md.get("timings") or {}
    return {
        "episode_id": sample.episode_id, "status": sample.status, "reward": sample.reward, "excluded": reason,
        "requests": md.get("requests", 0), "turns": md.get("turns", 0), "generated_tokens": md.get("generated_tokens", 0),
        "input_tokens": input_tokens(sample), "user_turns": user_turns(sample.messages or [], md.get("termination_reason") or ""),
        "tool_calls": tool_calls(sample.messages or []), "tool_errors": md.get("tool_errors", 0), "timings": timings,
        "worker_pid": md.get("worker_pid"), "weight_versions": sample.weight_versions,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", required=True, help="the Ray head's GCS host:port")
    ap.add_argument("--router-url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ok-tasks", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4, help="pool.max_concurrent_episodes")
    ap.add_argument("--max-steps", type=int, default=6, help="env.max_steps (the unsolved episodes end there or when the user gives up)")
    args = ap.parse_args(argv)

    from rollout.core.config import load_config
    from rollout.core.groups import Excluded
    from rollout.core.pool import RolloutPool, make_specs
    from rollout.core.tokenizer import load_tokenizer
    from support.fault_proxy import FaultProxy

    tokenizer = load_tokenizer("builtin:qwen3")
    episodes: list[dict] = []
    with FaultProxy(args.router_url, tokenizer, _rule) as proxy, tempfile.TemporaryDirectory() as weights:
        cfg = load_config(None, [f"policy.router_url={proxy.url}", f"pool.ray_address={args.address}", "pool.num_actors=2",
                                 f"pool.max_concurrent_episodes={args.concurrency}", "pool.num_cpus_per_actor=0.5",
                                 "policy.max_request_retries=1", f"env.max_steps={args.max_steps}", "rollout.filter_groups=zero_variance",
                                 "rollout.on_group_failure=drop"])
        pool = RolloutPool(cfg).start()
        try:
            def run(specs) -> None:
                pool.submit(specs)
                for item in pool.stream(excluded=True):
                    if isinstance(item, Excluded):
                        episodes.append(_figures(item.sample, item.reason))
                    else:
                        episodes.extend(_figures(s, None) for s in item)

            tasks = [str(t) for t in range(40)]
            for r in range(args.rounds):
                ok = tasks[(r * args.ok_tasks) % 30:][: args.ok_tasks]
                run(make_specs("retail", ok, args.samples, prefix=f"r{r}:", weight_version=r)
                    + make_specs("retail", ["35"], args.samples, prefix=f"r{r}fail:", weight_version=r)
                    + make_specs("retail", ["36"], args.samples, prefix=f"r{r}wrong:", weight_version=r))
                pool.update_weights_from_disk(weights, weight_version=r + 1)
                proxy.weight_version = str(r + 1)  # its made-up answers report the servers' version too
            run(make_specs("retail", ["0"], 4, prefix="last:", weight_version=args.rounds))
            report = {"episodes": episodes, "stats": pool.stats(), "actor_pids": [i["pid"] for i in pool.worker_infos()],
                      "excluded": collections.Counter(e["excluded"] for e in episodes if e["excluded"]),
                      "weight_version": pool.weight_version}
            Path(args.out).write_text(json.dumps(report))
            print("READY", flush=True)
            sys.stdin.read()  # hold the pool (and its metrics) until the caller closes our stdin
        finally:
            pool.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
