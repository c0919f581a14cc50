"""``python -m rollout.bench engine``: the pool's episodes/s on a real engine against a plain
asyncio loop calling the same endpoint with the same episodes, side by side in one run.

::

    python -m rollout.bench engine [--engine vllm] [--episodes 16] [--concurrency 8] [--reps 1]
        [--config configs/vllm_cpu.yaml] [--json FILE] [key=value ...]

**The engine.** With ``--engine vllm`` (the default and, today, the only choice) the bench starts
the real vLLM on the CPU behind vllm-router itself (``configs/vllm_cpu.yaml`` with
``local.backend=vllm``, :class:`rollout.devtools.local.vllm.VllmEngine`: one server by default, a random-weight Qwen3
checkpoint written for ``policy.tokenizer``) through :func:`rollout.app.wiring.open_pool`, and
stops both by process group when it ends. :data:`DEFAULTS` are applied before the user's
overrides: the scripted user (the engine then serves only the policy's calls; the config's llm user would
load the engine in the pool's phase only), every task of the split, short turns
(``policy.sampling.max_new_tokens=48``) and a few of them (``env.max_steps=3``;
``policy.on_length=keep``, so a turn the random model runs to the limit does not end its
episode).

**Each rep**, on the same running stack:

1. *pool*: ``--episodes`` episodes through the pool (``pool.num_actors`` actors,
   ``--concurrency`` episodes in flight in all), from the submission to the last delivery.
2. *plain*: the same episodes replayed by :func:`replay_plain`, one asyncio task per episode
   (at most ``--concurrency`` at once, an :class:`asyncio.Semaphore`), each posting its calls one
   after the other to the same router's ``/inference/v1/generate`` with aiohttp. A call is the
   pool's call as its trajectory recorded it (:func:`episode_calls`): the same prompt ids and
   exactly as many generated tokens (``max_tokens`` = the ids the pool's call got,
   ``ignore_eos``, no stop strings), the same temperature, top-p and top-k, log-probs on, and the
   same ``X-Session-ID`` routing key. No environment, tool, user simulator, tokenizer, Ray or
   record: only the engine's work.

Every worker's prefix cache is reset before each phase (``POST /reset_prefix_cache``), so neither
reuses the other's KV. One short call warms the engine before the first rep.

**Figures.** ``eps/s`` = episodes / the phase's wall time; ``ratio`` = pool eps/s / plain eps/s
(1.0: the pool adds nothing to the engine's own time; the pool's overhead is ``1 - ratio`` of the
rate). Calls and generated tokens are printed for both phases, which must be equal (the report
says ``MISMATCH`` otherwise and the command exits 1). With ``--reps`` > 1 the median ratio is
printed with its range. The plain phase always runs second (it replays what the pool's phase
recorded); the cache resets keep the order from favouring it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

logger = logging.getLogger(__name__)

__all__ = ["DEFAULTS", "ENGINES", "Call", "episode_calls", "replay_plain", "reset_prefix_caches", "compare", "format_report", "run_engine_bench",
           "add_parser", "main_engine"]

GENERATE_PATH = "/inference/v1/generate"  # vLLM's token-in token-out route (rollout.core.policy.vllm)
ROUTING_HEADER = "X-Session-ID"  # vllm-router's consistent_hash key, as the pool sends it

# --engine -> (its default config, the overrides that select it, applied first)
ENGINES: dict[str, tuple[str, list[str]]] = {
    "vllm": ("configs/vllm_cpu.yaml", ["local.enabled=true", "local.backend=vllm", "policy.engine=vllm"])}
# Applied after --engine's and before the user's overrides (see the module docstring).
DEFAULTS = ["local.num_servers=1", "env.user.kind=scripted", "env.task_ids=null", "env.max_steps=3",
            "policy.sampling.max_new_tokens=48", "policy.on_length=keep", "pool.num_actors=1", "logging.level=WARNING"]

# (prompt ids, generated ids count, routing key) of one /generate call
Call = tuple[list[int], int, str]


def episode_calls(trajectory, routing_key: str) -> list[Call]:
    """The ``/generate`` calls an episode's trajectory records, in order, as the plain loop replays them.

    Call ``j`` sampled the response positions ``generation_spans[j] == (a, b)``; its prompt was the
    live segment up to ``a`` (from the last ``segment_starts`` entry at or before ``a``, else the
    whole record). Calls that sampled nothing (``a == b``: aborted before their first token, or
    their tokens discarded) are left out: they cost the engine a prefill at most.

    Args:
        trajectory: a :class:`rollout.core.trajectory.Trajectory` (list form, as delivered).
        routing_key: the key the pool routed the episode's calls by (sent as ``X-Session-ID``).

    Returns:
        ``[(prompt_ids, n_generated, routing_key), ...]``.
    """
    tokens = list(trajectory.prompt_ids) + list(trajectory.response_ids)
    n_prompt = len(trajectory.prompt_ids)
    starts = list(trajectory.segment_starts)
    calls: list[Call] = []
    for a, b in trajectory.generation_spans:
        if b <= a:
            continue
        seg = max((s for s in starts if s <= a), default=None)
        begin = 0 if seg is None else n_prompt + seg
        calls.append((tokens[begin:n_prompt + a], int(b - a), routing_key))
    return calls


async def _post_generate(session, url: str, call: Call, rid: str, sampling: dict[str, Any]) -> tuple[int, str]:
    prompt, n, key = call
    sp = {**sampling, "max_tokens": n, "ignore_eos": True, "logprobs": 0, "skip_special_tokens": False}
    async with session.post(url, json={"request_id": rid, "token_ids": prompt, "sampling_params": sp},
                            headers={ROUTING_HEADER: key}) as r:
        data = await r.json(content_type=None)
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {str(data)[:300]}")
    choice = data["choices"][0]
    return len(choice["token_ids"]), str(choice.get("finish_reason"))


async def replay_plain(router_url: str, episodes: Sequence[Sequence[Call]], concurrency: int,
                       sampling: dict[str, Any]) -> dict[str, Any]:
    """Replay ``episodes`` against ``router_url`` with a plain asyncio loop (see the module docstring).

    Args:
        router_url: the router's ``http://host:port``.
        episodes: each episode's calls (:func:`episode_calls`), posted one after the other.
        concurrency: episodes in flight at once, at most.
        sampling: ``temperature``, ``top_p``, ``top_k`` (vLLM's names) for every call.

    Returns:
        ``{"episodes", "calls", "tokens", "wall_s", "finish_reasons"}``: ``tokens`` is the
        generated ids the engine returned in all; ``wall_s`` seconds from the first call to the
        last answer; ``finish_reasons`` counts the calls per vLLM ``finish_reason``.

    Raises:
        RuntimeError: a call answered other than 200 (the bench has no retries: a failure is a
            failed measurement).
    """
    import aiohttp

    url = router_url.rstrip("/") + GENERATE_PATH
    gate = asyncio.Semaphore(concurrency)
    counts = {"calls": 0, "tokens": 0}
    finishes: dict[str, int] = {}

    async def one(i: int, calls: Sequence[Call]) -> None:
        async with gate:
            for j, call in enumerate(calls):
                n, finish = await _post_generate(session, url, call, f"plain-{i}-{j}", sampling)
                counts["tokens"] += n
                counts["calls"] += 1
                finishes[finish] = finishes.get(finish, 0) + 1
                if n != call[1]:
                    logger.warning("plain call %d of episode %d: %d ids asked, %d returned (%s; prompt %d ids)", j, i, call[1], n,
                                   finish, len(call[0]))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(one(i, calls) for i, calls in enumerate(episodes)))
        wall = time.monotonic() - t0
    return {"episodes": len(episodes), **counts, "wall_s": wall, "finish_reasons": finishes}


async def reset_prefix_caches(router_url: str) -> list[str]:
    """``POST /reset_prefix_cache`` on every worker vllm-router lists (a control call through the
    router reaches one worker only); returns the worker URLs."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.get(router_url.rstrip("/") + "/workers") as r:
            urls = [w["url"] for w in (await r.json(content_type=None))["workers"]]
        for u in urls:
            async with session.post(u + "/reset_prefix_cache") as r:
                if r.status != 200:
                    raise RuntimeError(f"{u}/reset_prefix_cache answered {r.status}")
    return urls


def compare(pool_phase: dict[str, Any], plain_phase: dict[str, Any]) -> dict[str, Any]:
    """One rep's row from its two phases (each ``{"episodes", "calls", "tokens", "wall_s"}``).

    Returns:
        ``{"pool": ..., "plain": ..., "pool_eps_per_s", "plain_eps_per_s", "ratio", "same_work"}``:
        episodes per second of each; ``ratio`` = pool / plain; ``same_work`` whether both ran the
        same episodes, calls and generated tokens.

    Raises:
        ValueError: a phase with no episodes or a wall time that is not positive.
    """
    for name, p in (("pool", pool_phase), ("plain", plain_phase)):
        if p["episodes"] < 1 or not p["wall_s"] > 0:
            raise ValueError(f"{name} phase: {p['episodes']} episodes in {p['wall_s']} s cannot give a rate")
    pool_rate = pool_phase["episodes"] / pool_phase["wall_s"]
    plain_rate = plain_phase["episodes"] / plain_phase["wall_s"]
    same = all(pool_phase[k] == plain_phase[k] for k in ("episodes", "calls", "tokens"))
    return {"pool": pool_phase, "plain": plain_phase, "pool_eps_per_s": pool_rate, "plain_eps_per_s": plain_rate,
            "ratio": pool_rate / plain_rate, "same_work": same}


def format_report(rows: list[dict[str, Any]], engine: str, concurrency: int) -> str:
    """The printed report: one line per rep and phase, then the ratio (the median and range over reps)."""
    out = [f"engine bench: {engine}, {concurrency} episodes in flight, pool against a plain asyncio loop on the same endpoint"]
    out.append(f"{'rep':>3} {'phase':<6} {'episodes':>8} {'calls':>6} {'tokens':>7} {'wall s':>8} {'eps/s':>8}")
    for i, r in enumerate(rows, 1):
        for name in ("pool", "plain"):
            p = r[name]
            rate = r[f"{name}_eps_per_s"]
            out.append(f"{i:>3} {name:<6} {p['episodes']:>8} {p['calls']:>6} {p['tokens']:>7} {p['wall_s']:>8.2f} {rate:>8.3f}")
        out.append(f"{i:>3} ratio pool/plain {r['ratio']:.3f}" + ("" if r["same_work"] else "  MISMATCH: the phases did different work"))
    ratios = [r["ratio"] for r in rows]
    pool = statistics.median(r["pool_eps_per_s"] for r in rows)
    plain = statistics.median(r["plain_eps_per_s"] for r in rows)
    spread = f" (range {min(ratios):.3f}-{max(ratios):.3f} over {len(rows)} reps)" if len(rows) > 1 else ""
    out.append(f"pool {pool:.3f} eps/s, plain loop {plain:.3f} eps/s: ratio {statistics.median(ratios):.3f}{spread}; "
               f"the pool's overhead {100 * (1 - statistics.median(ratios)):.1f}% of the rate")
    return "\n".join(out)


def _pool_phase(pool, task_ids: list[str], episodes: int, group_size: int) -> tuple[dict[str, Any], list[list[Call]], dict[str, int]]:
    from rollout.devtools.bench.pool import _submit

    t0 = time.monotonic()
    _submit(pool, task_ids, episodes, group_size)
    recorded: list[list[Call]] = []
    statuses: dict[str, int] = {}
    for res in pool.results():
        statuses[res.status.value] = statuses.get(res.status.value, 0) + 1
        if res.trajectory is not None:
            recorded.append(episode_calls(res.trajectory, res.spec.episode_id))
        else:
            recorded.append([])
    wall = time.monotonic() - t0
    phase = {"episodes": len(recorded), "calls": sum(map(len, recorded)),
             "tokens": sum(n for calls in recorded for _, n, _ in calls), "wall_s": wall}
    return phase, recorded, statuses


def run_engine_bench(cfg, episodes: int, concurrency: int, reps: int = 1) -> list[dict[str, Any]]:
    """Start the engine and the pool (:func:`rollout.app.wiring.open_pool`), run ``reps`` reps of
    the two phases (module docstring), stop everything; returns :func:`compare`'s rows, each with
    the pool's ``statuses``.

    Args:
        cfg: the whole config (``local.backend`` the engine; ``pool.num_actors`` actors).
        episodes: episodes per phase (the task list repeated as needed, ``rollout.n_samples_per_task``
            samples of each).
        concurrency: episodes in flight in all (``pool.max_concurrent_episodes`` = concurrency /
            actors, rounded up; the plain loop's bound).
        reps: how many times the two phases run.
    """
    import dataclasses

    from rollout.app.wiring import open_pool

    per_actor = -(-concurrency // cfg.pool.num_actors)
    cfg = dataclasses.replace(cfg, pool=dataclasses.replace(cfg.pool, max_concurrent_episodes=per_actor))
    sp = cfg.policy.sampling
    sampling = {"temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k}
    rows = []
    with open_pool(cfg, log_dir_name="bench_engine_logs") as (cfg, pool, task_ids):
        router = cfg.policy.router_url
        asyncio.run(replay_plain(router, [[([1, 2, 3], 4, "warm-up")]], 1, sampling))
        for rep in range(reps):
            workers = asyncio.run(reset_prefix_caches(router))
            pool_phase, recorded, statuses = _pool_phase(pool, task_ids, episodes, cfg.rollout.n_samples_per_task)
            asyncio.run(reset_prefix_caches(router))
            plain_phase = asyncio.run(replay_plain(router, recorded, concurrency, sampling))
            row = {**compare(pool_phase, plain_phase), "statuses": statuses, "workers": workers}
            logger.info("rep %d: pool %.3f eps/s, plain %.3f eps/s, ratio %.3f", rep + 1, row["pool_eps_per_s"],
                        row["plain_eps_per_s"], row["ratio"])
            rows.append(row)
    return rows


def add_parser(sub) -> None:
    """Add the ``engine`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("engine", help="the pool's episodes/s on a real engine against a plain asyncio loop, same endpoint and episodes")
    p.add_argument("--episodes", type=int, default=16, help="episodes per phase")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight in all, in both phases")
    p.add_argument("--reps", type=int, default=1, help="pool + plain reps on the same stack (median ratio)")
    p.add_argument("--engine", choices=sorted(ENGINES), default="vllm", help="the engine the bench starts (local.backend)")
    p.add_argument("--config", "-c", default=None, help="YAML config (default: the engine's, configs/vllm_cpu.yaml for vllm)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (after the bench's defaults)")
    p.set_defaults(run=main_engine)


def main_engine(args) -> int:
    """Run the ``engine`` bench; 0, 1 when the two phases did different work, 2 for bad arguments or config."""
    from rollout.core.logs import setup_logging
    from rollout.devtools.bench.cli import load_checked_config

    if args.episodes < 1 or args.concurrency < 1 or args.reps < 1:
        print("error: --episodes, --concurrency and --reps must be >= 1", file=sys.stderr)
        return 2
    default_config, select = ENGINES[args.engine]
    cfg = load_checked_config(args.config or default_config, select + DEFAULTS + list(args.overrides))
    if cfg is None:
        return 2
    setup_logging(cfg.logging)
    rows = run_engine_bench(cfg, args.episodes, args.concurrency, args.reps)
    print(format_report(rows, args.engine, args.concurrency))
    for i, r in enumerate(rows, 1):
        print(f"rep {i}: pool statuses {r['statuses']}, workers {r['workers']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"json: {args.json}")
    return 0 if all(r["same_work"] for r in rows) else 1
