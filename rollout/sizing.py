"""Resident memory of one rollout actor against its concurrency (``python -m rollout.bench memory``).

For each domain and each concurrency ``c``, one actor (``pool.max_concurrent_episodes=c``) runs
``2 * c`` episodes (two of each of the first ``c`` tasks) while a thread samples, every 0.2 s, the
memory of the actor's process plus its children (the tool sandbox, which loads tau2 too, started
on the first database-free tool call). Reported per row, in MiB: the resident set size (RSS) when
started and idle, its peak while running, and that peak per concurrent episode above idle; and the
peak proportional set size (PSS, Linux: shared pages divided among the processes that map them,
so the actor and its sandbox do not both count the shared libraries they map; the RSS sum does).
Uses the local stack (gold replay) unless ``local.enabled=false``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil

from rollout.config import Config


def _tree_rss(proc: psutil.Process) -> int:
    """RSS of ``proc`` and its descendants, bytes (processes that vanish meanwhile count 0)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _tree_pss(proc: psutil.Process) -> int | None:
    """PSS of ``proc`` and its descendants, bytes; None where the platform has no PSS."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            pss = getattr(p.memory_full_info(), "pss", None)
        except psutil.AccessDenied:
            return None
        except psutil.Error:
            continue
        if pss is None:
            return None
        total += pss
    return total


def measure(cfg: Config, concurrencies: list[int]) -> list[dict[str, Any]]:
    """One row per concurrency for ``cfg.env.domain``: ``{"domain", "concurrency", "episodes",
    "idle_mib", "peak_mib", "per_episode_mib", "peak_pss_mib", "wall_s"}`` (``peak_pss_mib`` None
    without PSS).

    Raises:
        RuntimeError: the local stack or the actor failed to start.
    """
    import dataclasses

    from rollout.wiring import open_pool

    rows = []
    for c in concurrencies:
        pool_cfg = dataclasses.replace(cfg.pool, num_actors=1, max_concurrent_episodes=c)
        with open_pool(dataclasses.replace(cfg, pool=pool_cfg), log_dir_name="bench_stack_logs") as (_, pool, task_ids):
            proc = psutil.Process(pool.worker_infos()[0]["pid"])
            idle = _tree_rss(proc)
            peak = [idle]
            pss = _tree_pss(proc)
            peak_pss = [pss]
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], _tree_rss(proc))
                    if peak_pss[0] is not None:
                        now = _tree_pss(proc)
                        peak_pss[0] = None if now is None else max(peak_pss[0], now)
                    time.sleep(0.2)

            watcher = threading.Thread(target=sample, daemon=True)
            watcher.start()
            t0 = time.monotonic()
            n = 0
            pool.submit_tasks(task_ids[:c], n_samples_per_task=2)  # 2 * c episodes (fewer if the split is smaller)
            for _ in pool.results():
                n += 1
            stop.set()
            watcher.join()
            mib = 2**20
            rows.append({
                "domain": cfg.env.domain, "concurrency": c, "episodes": n, "idle_mib": round(idle / mib),
                "peak_mib": round(peak[0] / mib), "per_episode_mib": round((peak[0] - idle) / mib / c, 1),
                "peak_pss_mib": None if peak_pss[0] is None else round(peak_pss[0] / mib), "wall_s": round(time.monotonic() - t0, 1),
            })
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table ``python -m rollout.bench memory`` prints."""
    head = (f"{'domain':<8} {'concurrency':>11} {'episodes':>8} {'idle RSS MiB':>12} {'peak RSS MiB':>12} {'RSS MiB/episode':>15} "
            f"{'peak PSS MiB':>12} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        pss = "-" if r.get("peak_pss_mib") is None else r["peak_pss_mib"]
        lines.append(f"{r['domain']:<8} {r['concurrency']:>11} {r['episodes']:>8} {r['idle_mib']:>12} {r['peak_mib']:>12} "
                     f"{r['per_episode_mib']:>15} {pss:>12} {r['wall_s']:>7}")
    return "\n".join(lines)
