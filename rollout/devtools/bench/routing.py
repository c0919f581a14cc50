"""``python -m rollout.bench routing``: prefix-cache routing and KV-aware concurrency, side by side.

The main job (the configured domain, retail by default, gold replay and the scripted user on the
local stack) runs on ``--workers`` local servers behind the real ``sglang-router``, once per row,
each row on a fresh stack (empty caches, counters from zero) and a fresh pool::

    python -m rollout.bench routing [--workers 4] [--concurrency 512] [--n 8] [--tasks 64]
        [--rows round_robin,cache_aware,episode,group] [--adaptive both|on|off]
        [--config configs/local.yaml] [--json FILE] [--plot FILE.png] [key=value ...]

**Rows.** ``round_robin`` and ``cache_aware``: the router's own policies, no routing key sent
(``policy.routing=none``); ``episode`` and ``group``: our ``X-SMG-Routing-Key`` (the episode id,
or the GRPO group id), routed by the router policy that honours the key
(``local.router_policy=auto``). Each with and without adaptive concurrency
(``pool.adaptive_concurrency.enabled``). ``--tasks`` tasks x ``--n`` samples are submitted at
once with ``--concurrency`` slots (``pool.max_concurrent_episodes`` = concurrency / actors).

**The servers** run the KV model of :mod:`rollout.devtools.local.kvmodel` with
:data:`BENCH_KV` unless overridden (``local.kv.*=...``). Why these numbers:

* ``think_tokens=800``: a gold-replay answer alone is ~60 tokens, so a running request hardly
  grows and a budget filled by admission is almost never passed (an earlier try without it lost
  < 3% of prefill in every row); with a reasoning block of 800 tokens per answer, as a thinking
  agent writes, each request grows by ~860 tokens while it runs and contexts grow to 10-15k
  tokens, so the budget is really pressed (a trial: 15% of requests retracted, 26% of prefill
  lost, without adaptive concurrency).
* ``kv_budget_tokens=48000``: 3-4 running requests of such contexts per worker, while 512
  episodes on 4 workers keep up to ~128 calls per worker outstanding: queues form, admission
  fills the budget, and growth passes it.
* ``cache_tokens=200000``: under gold replay a group's members make identical calls, so a worker
  that holds whole groups (``group``: 16 groups, ~200k tokens) keeps what its calls need, while a
  worker that sees every group (``round_robin``, ``episode``: ~64 groups) cannot: the tight regime
  where routing matters.
* costs: prefill 20 us per uncached token (one prefill at a time: a 10k-token miss is 0.2 s of a
  worker), decode 0.1 ms per token plus 50 us per running request (~0.1 s per answer): misses and
  retractions cost time, and a row takes about two minutes here.

**Figures** per row, summed over the workers' ``/metrics`` (the difference between the start
and the end of the row):

* ``hit``: prefix-cache hit ratio, ``sglang:cached_tokens_total / sglang:prompt_tokens_total``.
* ``ideal``: the hit ratio of one unbounded prefix cache that sees every call of the row, each
  episode's calls in order (each call's prompt matched, then its prompt + output inserted),
  computed from the calls the episodes actually made (their token records: call ``j``'s prompt
  is the episode's first prompt plus its response tokens up to the start of ``generation_spans[j]``).
  It counts what every call can find: every turn after the first finds its own prefix (its
  previous prompt and answer), every group member after the first finds the shared prompt, and
  every episode finds the part of the prompt all tasks share (the system prompt and tool list).
  So ``ideal = sum_calls LCP(call prompt, anything sent before) / sum_calls len(prompt)``; no
  routing over finite per-worker caches can beat it.
* ``lost``: the share of prefill thrown away by retractions,
  ``rollout_local_retracted_prefill_tokens_total / rollout_local_prefill_tokens_total``
  (tokens prefilled, redone ones included).
* ``imbalance``: ``max / mean`` of the requests each worker served (``sglang:num_requests_total``).
* ``eps/s``: episodes delivered / seconds from submission to the last delivery.

Exit status: 0 when every row ran (targets met or not), 1 when a row failed, 2 on a bad config.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rollout.core.telemetry import promtext
from rollout.devtools.local.radix import RadixCache

logger = logging.getLogger(__name__)

# The local servers' KV model for this bench (see the module docstring for why these numbers).
BENCH_KV = {
    "local.kv.cache_tokens": 200_000,
    "local.kv.kv_budget_tokens": 48_000,
    "local.kv.prefill_s_per_token": 0.00002,
    "local.kv.decode_s_per_token": 0.0001,
    "local.kv.s_per_running_request": 0.00005,
    "local.kv.think_tokens": 800,
}
ROUTINGS = {  # row name -> (policy.routing, local.router_policy, the KV gate's placement under --placement auto)
    "round_robin": ("none", "round_robin", "router"),
    "cache_aware": ("none", "cache_aware", "router"),
    "episode": ("episode", "auto", "gate"),
    "group": ("group", "auto", "gate"),
}
KEYED = ("episode", "group")  # rows whose calls carry a routing key (the gate may place them)
METRICS = ("sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:num_requests_total",
           "rollout_local_prefill_tokens_total", "rollout_local_retracted_prefill_tokens_total",
           "rollout_local_retractions_total")


# --------------------------------------------------------------------------- pure parts
def episode_calls(prompt_ids: Sequence[int], response_ids: Sequence[int],
                  spans: Iterable[Sequence[int]]) -> list[tuple[list[int], list[int]]]:
    """The ``(prompt, output)`` of each ``/generate`` call of one episode, from its token record:
    call ``j``'s prompt is ``prompt_ids + response_ids[:start_j]`` and its output
    ``response_ids[start_j:end_j]`` (``generation_spans``; an episode with one segment)."""
    tokens = list(prompt_ids) + list(response_ids)
    p0 = len(prompt_ids)
    return [(tokens[:p0 + s], tokens[p0 + s:p0 + e]) for s, e in spans]


def ideal_hits(episodes: Iterable[Sequence[tuple[Sequence[int], Sequence[int]]]]) -> tuple[int, int]:
    """``(ideal cached tokens, prompt tokens)`` of a workload: one unbounded prefix cache sees
    each episode's calls in order (match the prompt, then insert prompt + output). See the module
    docstring for the formula."""
    cache = RadixCache(None)
    cached = total = 0
    for calls in episodes:
        for prompt, output in calls:
            cached += cache.match(prompt)
            total += len(prompt)
            cache.insert(list(prompt) + list(output))
    return cached, total


def parse_worker_metrics(text: str) -> dict[str, float]:
    """The counters this bench reads (:data:`METRICS`) from one worker's ``/metrics`` text
    (summed over label sets; absent ones are 0)."""
    return _counters(promtext.parse(text))


def _counters(samples: list[promtext.Sample]) -> dict[str, float]:
    return {name: promtext.total(samples, name) for name in METRICS}


def metrics_delta(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per worker, ``after - before`` of each counter (the lists are in the same worker order)."""
    return [{k: a.get(k, 0.0) - b.get(k, 0.0) for k in METRICS} for b, a in zip(before, after)]


def make_row(routing: str, adaptive: bool, per_worker: list[dict[str, float]], ideal: tuple[int, int],
             episodes: int, seconds: float, statuses: dict[str, int] | None = None,
             placement: str | None = None) -> dict[str, Any]:
    """One row of the bench from its measurements (pure).

    Args:
        routing: the row's name (a key of :data:`ROUTINGS`).
        adaptive: whether adaptive concurrency was on.
        per_worker: each worker's counter differences over the row (:func:`metrics_delta`).
        ideal: :func:`ideal_hits` of the row's calls.
        episodes: episodes delivered; seconds: from submission to the last delivery.
        statuses: episode statuses counted (for the record).
        placement: ``pool.adaptive_concurrency.placement`` of an adaptive row (``router`` or
            ``gate``); None for a row without adaptive concurrency.

    Returns:
        ``{"routing", "adaptive", "placement", "hit_ratio", "ideal_hit_ratio", "hit_vs_ideal", "imbalance",
        "prefill_lost", "episodes_per_s", ...}`` (ratios in [0, 1] but ``imbalance`` >= 1 and
        ``hit_vs_ideal``; None where a denominator is 0).
    """
    def tot(k: str) -> float:
        return sum(w[k] for w in per_worker)

    prompt, cached = tot("sglang:prompt_tokens_total"), tot("sglang:cached_tokens_total")
    prefill, lost = tot("rollout_local_prefill_tokens_total"), tot("rollout_local_retracted_prefill_tokens_total")
    reqs = [w["sglang:num_requests_total"] for w in per_worker]
    mean = sum(reqs) / len(reqs) if reqs else 0.0
    hit = cached / prompt if prompt else None
    ideal_ratio = ideal[0] / ideal[1] if ideal[1] else None
    return {
        "routing": routing, "adaptive": bool(adaptive), "placement": placement if adaptive else None,
        "hit_ratio": hit, "ideal_hit_ratio": ideal_ratio,
        "hit_vs_ideal": hit / ideal_ratio if hit is not None and ideal_ratio else None,
        "imbalance": max(reqs) / mean if mean else None,
        "prefill_lost": lost / prefill if prefill else 0.0,
        "episodes_per_s": episodes / seconds if seconds > 0 else None,
        "episodes": episodes, "seconds": seconds, "requests_per_worker": reqs,
        "prompt_tokens": prompt, "cached_tokens": cached, "ideal_prompt_tokens": ideal[1],
        "retractions": tot("rollout_local_retractions_total"), "statuses": statuses or {},
    }


def _f(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table."""
    head = f"{'routing':<12} {'adaptive':>8} {'placement':>9} {'hit':>6} {'ideal':>6} {'hit/ideal':>9} {'imbalance':>9} {'lost':>7} {'retracts':>8} {'eps/s':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['routing']:<12} {('on' if r['adaptive'] else 'off'):>8} {r.get('placement') or '-':>9} {_f(r['hit_ratio'], '.3f'):>6} "
                     f"{_f(r['ideal_hit_ratio'], '.3f'):>6} {_f(r['hit_vs_ideal'], '.3f'):>9} {_f(r['imbalance'], '.2f'):>9} "
                     f"{_f(r['prefill_lost'], '.1%'):>7} {int(r['retractions']):>8} {_f(r['episodes_per_s'], '.2f'):>7}")
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, one line each, met or not (from the rows of one run)."""
    out = []
    ok = [r for r in rows if r["hit_vs_ideal"] is not None]
    if ok:
        best = max(ok, key=lambda r: (round(r["hit_ratio"], 3), -(r["imbalance"] or 0.0)))  # ties: the better balanced
        ca = max((r["hit_ratio"] for r in ok if r["routing"] == "cache_aware"), default=None)
        met = best["hit_vs_ideal"] >= 0.95 and (ca is None or best["hit_ratio"] > ca)
        out.append(f"best hit ratio {best['hit_ratio']:.3f} ({best['routing']}, adaptive {best['adaptive']}) = "
                   f"{best['hit_vs_ideal']:.3f} x ideal (>= 0.95), cache_aware {_f(ca, '.3f')}: {'met' if met else 'NOT met'}")
        out.append(f"imbalance of that row {_f(best['imbalance'], '.2f')} (<= 1.10): "
                   f"{'met' if best['imbalance'] is not None and best['imbalance'] <= 1.10 else 'NOT met'}")
    for name in dict.fromkeys(r["routing"] for r in rows):
        off = next((r for r in rows if r["routing"] == name and not r["adaptive"]), None)
        for on in (r for r in rows if r["routing"] == name and r["adaptive"]):
            if off is None:
                break
            eps_ok = (on["episodes_per_s"] or 0) >= (off["episodes_per_s"] or 0)
            if off["prefill_lost"] <= 0.10:
                verdict = "not a target row (<= 10% lost without it)"
            else:
                verdict = "met" if on["prefill_lost"] <= 0.01 and eps_ok else "NOT met"
            out.append(f"{name} (placement {on.get('placement') or '-'}): prefill lost {off['prefill_lost']:.1%} -> "
                       f"{on['prefill_lost']:.1%} with adaptive (<= 1% where > 10%), eps/s {_f(off['episodes_per_s'], '.2f')} -> "
                       f"{_f(on['episodes_per_s'], '.2f')}: {verdict}")
    return out


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Bar charts of hit ratio (against ideal), prefill lost, imbalance and episodes/s per row.

    Raises:
        ImportError: matplotlib is not installed (an optional dependency).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['routing']} {('adaptive/' + (r.get('placement') or '?')) if r['adaptive'] else 'fixed'}" for r in rows]
    x = range(len(rows))
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5))
    axes[0].bar(x, [r["hit_ratio"] or 0 for r in rows], label="hit ratio")
    axes[0].plot(list(x), [r["ideal_hit_ratio"] or 0 for r in rows], "k_", markersize=24, label="ideal")
    axes[0].set_title("prefix-cache hit ratio")
    axes[0].legend(loc="lower right")
    axes[1].bar(x, [100 * r["prefill_lost"] for r in rows], color="tab:red")
    axes[1].set_title("prefill lost to retractions (%)")
    axes[2].bar(x, [r["imbalance"] or 0 for r in rows], color="tab:gray")
    axes[2].axhline(1.10, color="k", linestyle=":")
    axes[2].set_title("load imbalance (max / mean requests)")
    axes[3].bar(x, [r["episodes_per_s"] or 0 for r in rows], color="tab:green")
    axes[3].set_title("episodes / s")
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7, rotation=35, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- running a row
def _scrape(urls: list[str]) -> list[dict[str, float]]:
    return [_counters(promtext.scrape(u.rstrip("/") + "/metrics", timeout_s=10)) for u in urls]


def _worker_urls(router_url: str) -> list[str]:
    with urllib.request.urlopen(router_url.rstrip("/") + "/workers", timeout=10) as r:
        data = json.loads(r.read())
    return sorted(w["url"] for w in data.get("workers", []))


def run_row(cfg, routing: str, adaptive: bool, tasks: int, n: int, placement: str | None = None) -> dict[str, Any]:
    """Run one row: a fresh local stack and pool for ``cfg``, ``tasks`` tasks x ``n`` samples
    submitted at once; returns :func:`make_row`'s row."""
    from rollout.app.wiring import open_pool

    with open_pool(cfg, log_dir_name="bench_stack_logs") as (cfg, pool, task_ids):
        urls = _worker_urls(cfg.policy.router_url)
        before = _scrape(urls)
        t0 = time.monotonic()
        pool.submit_tasks(task_ids[:tasks], n_samples_per_task=n)
        calls, statuses, last, held = [], {}, t0, 0.0
        for res in pool.results():
            statuses[res.status.value] = statuses.get(res.status.value, 0) + 1
            held += float((res.metadata or {}).get("kv_held_s") or 0.0)
            last = time.monotonic()
            tr = res.trajectory
            if tr is not None and not tr.segment_starts:
                tr = tr.expand() if getattr(tr, "is_compact", False) else tr
                calls.append(episode_calls(tr.prompt_ids, tr.response_ids, tr.generation_spans))
        after = _scrape(urls)
    row = make_row(routing, adaptive, metrics_delta(before, after), ideal_hits(calls),
                   sum(statuses.values()), last - t0, statuses, placement)
    row["kv_held_s_per_episode"] = held / max(1, row["episodes"])  # calls held by the KV gate (adaptive rows)
    return row


def row_overrides(routing: str, adaptive: bool, workers: int, concurrency: int, actors: int, n: int, out_dir: str,
                  placement: str = "router") -> list[str]:
    """The config overrides of one row (before the user's own, which win)."""
    key, router, _ = ROUTINGS[routing]
    name = f"adaptive_{placement}" if adaptive else "fixed"
    return [*(f"{k}={v}" for k, v in BENCH_KV.items()),
            "local.enabled=true", f"local.num_servers={workers}", f"policy.routing={key}", f"local.router_policy={router}",
            f"pool.adaptive_concurrency.enabled={str(adaptive).lower()}", f"pool.adaptive_concurrency.placement={placement}",
            f"pool.num_actors={actors}", f"pool.max_concurrent_episodes={concurrency // actors}", f"rollout.n_samples_per_task={n}",
            "logging.level=WARNING", f"rollout.output_dir={out_dir}/{routing}_{name}"]


def row_plan(names: Sequence[str], adaptive: Sequence[bool], placement: str) -> list[tuple[str, bool, str | None]]:
    """The rows to run, ``(routing, adaptive, placement)`` in order: per routing its fixed row,
    then its adaptive rows; ``placement`` ``auto`` gives each routing its own
    (:data:`ROUTINGS`: ``gate`` for the keyed rows, ``router`` for the router's policies),
    ``both`` the keyed rows both placements, ``router`` or ``gate`` that one (``gate`` only for
    the keyed rows: without a key the router's policy would not be the one measured)."""
    plan: list[tuple[str, bool, str | None]] = []
    for name in names:
        for a in adaptive:
            if not a:
                plan.append((name, False, None))
                continue
            if placement == "auto":
                places = [ROUTINGS[name][2]]
            elif placement == "both":
                places = ["router", "gate"] if name in KEYED else ["router"]
            else:
                places = [placement if name in KEYED else "router"]
            plan += [(name, True, p) for p in places]
    return plan


def main_routing(args) -> int:
    """Run the ``routing`` benchmark (see the module docstring); the exit status."""
    from rollout.core.logs import setup_logging
    from rollout.devtools.bench.cli import load_checked_config

    names = [x.strip() for x in args.rows.split(",") if x.strip()]
    bad = [x for x in names if x not in ROUTINGS]
    adaptive = {"both": [False, True], "on": [True], "off": [False]}[args.adaptive]
    if bad or args.concurrency % args.actors or args.workers < 1:
        print(f"error: unknown rows {bad} (known: {', '.join(ROUTINGS)})" if bad
              else "error: --concurrency must be a multiple of --actors, --workers >= 1", file=sys.stderr)
        return 2
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="bench-routing-")
    plan = []
    for name, a, place in row_plan(names, adaptive, args.placement):
        cfg = load_checked_config(args.config, row_overrides(name, a, args.workers, args.concurrency, args.actors, args.n, out_dir,
                                                             place or "router") + list(args.overrides))
        if cfg is None:
            return 2
        plan.append((name, a, place, cfg))
    setup_logging(plan[0][3].logging)
    kv = dataclasses.asdict(plan[0][3].local.kv)
    print(f"routing bench: {args.workers} workers, {args.concurrency} concurrent episodes, {args.tasks} tasks x n={args.n}, "
          f"{args.actors} actors; local.kv {kv}", flush=True)
    rows = []
    for name, a, place, cfg in plan:
        t = time.monotonic()
        try:
            rows.append(run_row(cfg, name, a, args.tasks, args.n, place))
        except Exception:  # noqa: BLE001  (report and stop: a row that fails is a bench failure)
            logger.exception("row %s adaptive=%s placement=%s failed", name, a, place)
            return 1
        print(f"  row {name} adaptive={a}{f' placement={place}' if place else ''}: {time.monotonic() - t:.0f} s", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(format_table(rows))
    for line in targets(rows):
        print("target: " + line)
    if args.json:
        print(f"json: {args.json}")
    if args.plot:
        try:
            plot(rows, args.plot)
            print(f"plot: {args.plot}")
        except ImportError:
            print("plot skipped: matplotlib is not installed", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    """Add the ``routing`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("routing", help="prefix-cache routing and adaptive concurrency on N local workers, side by side")
    p.add_argument("--config", "-c", default="configs/local.yaml")
    p.add_argument("--workers", type=int, default=4, help="local servers behind the router")
    p.add_argument("--concurrency", type=int, default=512, help="concurrent episodes in all")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--n", type=int, default=8, help="samples per task (GRPO group size)")
    p.add_argument("--tasks", type=int, default=64, help="tasks submitted (x n episodes)")
    p.add_argument("--rows", default=",".join(ROUTINGS), help="comma-separated: " + ", ".join(ROUTINGS))
    p.add_argument("--adaptive", default="both", choices=["both", "on", "off"], help="rows with adaptive concurrency on, off or both")
    p.add_argument("--placement", default="auto", choices=["auto", "router", "gate", "both"],
                   help="the KV gate's placement in adaptive rows: auto = gate for the keyed rows (episode, group), router "
                        "for the router's policies; both = the keyed rows with each")
    p.add_argument("--out-dir", default=None, help="where the rows' runs go (default: a new temporary folder)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as a JSON list")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw the rows (needs matplotlib)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (win over the bench's own)")
    p.set_defaults(run=main_routing)
