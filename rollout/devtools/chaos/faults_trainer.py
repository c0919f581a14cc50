"""The faults a trainer meets (run by the bench's own trainer, ``python -m rollout.devtools.chaos
trainer``): a weight update failing on one worker while the other takes it (a half-done cycle),
and a straggler worker many times slower than the other (see the package docstring). Both run on
two local servers behind a real ``sglang-router`` (``manual``, ``min_group``: each episode's calls
stay on one worker), the second server behind a :class:`~rollout.devtools.chaos.proxies.WorkerProxy`."""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path

from rollout.core.jsonl import read_lines
from rollout.devtools.chaos.job import OK_EXIT_CODES, Fault, start_router, start_server, strike_text, wait_http
from rollout.devtools.chaos.progress import JournalProgress, Progress, Strike, mid_run, run_strikes
from rollout.devtools.chaos.proxies import WorkerProxy
from rollout.devtools.chaos.report import tally
from rollout.devtools.chaos.servers import http_ok

logger = logging.getLogger(__name__)

TRAINER = [sys.executable, "-m", "rollout.devtools.chaos", "trainer"]
UPDATE_EVERY = 3  # weight_update_half_done: the trainer updates the weights after every 3 deliveries
STRAGGLER_FACTOR = 30  # straggler: each of the slow worker's /generate calls waits 30 x the pace (PACE_S) more
STEPS = 5  # straggler: training steps per run
STEP_GROUPS = 3  # straggler: groups per step
STEP_OUTSTANDING = 8  # straggler: max_outstanding_groups (over-sampling: 8 in flight for 3 kept; the pool's capacity with 2 x 4)
STRAGGLER_EPISODE_TIMEOUT_S = 20.0  # straggler: pool.episode_timeout_s (an episode the step still waits for ends `timeout`)
STEP_BOUND = 3.0  # straggler: a step is on time when it takes at most 3 x the median step of the run without it


def two_workers(f: Fault, progress: JournalProgress) -> tuple[str, WorkerProxy, str]:
    """Two local servers, the second behind a :class:`WorkerProxy`, behind a real router that
    keeps each routing key on one worker; returns ``(router URL, the proxy, the first server's
    URL)`` once the router serves both."""
    from rollout.devtools.local.stack import free_port, router_policy_args

    ports = [free_port(), free_port()]
    servers = [start_server(f, p, name=f"server-{i}") for i, p in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for u in urls:
        wait_http(f, u, lambda u=u: http_ok(u + "/health")[0] == 200, servers)
    proxy = WorkerProxy(urls[1], progress=progress).start()
    f.cleanups.append(proxy.stop)
    router, router_url = start_router(f, urls[0], proxy.url, policy=tuple(router_policy_args("auto")))

    def ready() -> bool:
        st, body = http_ok(router_url + "/workers")
        return st == 200 and sum(1 for w in json.loads(body).get("workers", []) if w.get("is_healthy")) == 2

    wait_http(f, "the router", ready, [*servers, router])
    return router_url, proxy, urls[0]


def _samples(out: Path) -> list[dict]:
    return [d for name in ("samples.jsonl", "failed.jsonl", "filtered.jsonl") for d in read_lines(out / name)[0]]


def fault_weight_update_half_done(f: Fault) -> None:
    """The trainer updates the weights every :data:`UPDATE_EVERY` deliveries; from 1 delivered / N/3
    outstanding on, the second worker fails the next update it gets (the first takes it): the pool
    must roll it forward (sent again: it takes it) and say so, and no episode meets two versions
    unrecorded (each episode's calls never go back to an older version)."""
    router_url, proxy, _ = two_workers(f, JournalProgress(f.out))
    cond = mid_run(f.n_episodes)
    job = f.start("local.enabled=false", f"policy.router_url={router_url}", *f.concurrency_for(cond),
                  command=[*TRAINER, "--mode", "weights", "--update-every", str(UPDATE_EVERY)])

    def strike(k: int, p: Progress) -> dict:
        proxy.fail_updates(1)
        return {"armed": "the next weight update fails on " + proxy.url}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.finish(job)
    f.check_final(job)
    hit = proxy.counts.get("update_failed", 0)
    reports = read_lines(f.out / "weight_updates.jsonl")[0]
    half = [r for r in reports if proxy.url in (r.get("failed") or {})]
    f.inject("updates_failed", hit, 1, missed=missed or (None if hit else "armed, but no weight update came after"), strikes=strikes,
             first_at=proxy.first_at.get("update_failed"))
    f.notes.append(strike_text("one worker's next weight update made to fail", strikes, 1, missed)
                   + f"; {hit} update(s) failed on {proxy.url}, at {proxy.first_at.get('update_failed')}")
    f.extra["weight_updates"] = reports
    f.notes.append(f"{len(reports)} weight update(s): " + ", ".join(f"v{r.get('version')} {r.get('outcome')}" for r in reports))
    ok_half = bool(half) and all(r["outcome"] == "rolled_forward" and proxy.url in r["retried"]
                                 and set(r["serving"].values()) == {str(r["version"])} for r in half)
    f.check("rolled_forward_and_said_so", ok_half, "the half-done update: " + ("; ".join(
        f"v{r['version']} {r['outcome']} (failed at first on {list(r['failed'])}, sent again to {r['retried']}, every worker then serves "
        f"{sorted(set(r['serving'].values()))})" for r in half) if half else "none reported"))
    served = {"0"} | {str(r["version"]) for r in reports if r.get("outcome") in ("updated", "rolled_forward")}
    back, unknown = [], set()
    for d in _samples(f.out):
        versions = [v for v in d.get("weight_versions") or [] if v is not None]
        unknown |= set(map(str, versions)) - served
        if any(int(b) < int(a) for a, b in zip(versions, versions[1:])):
            back.append((d.get("metadata") or {}).get("episode_id"))
    f.check("one_version_at_a_time", not back and not unknown, f"episodes whose calls went back to an older version: {back[:5] or 'none'}; "
            f"versions served that no update reported: {sorted(unknown) or 'none'}")


def _step_times(out: Path) -> list[float]:
    return [float(r["seconds"]) for r in read_lines(out / "steps.jsonl")[0]]


def fault_straggler(f: Fault) -> None:
    """The trainer runs :data:`STEPS` steps of :data:`STEP_GROUPS` groups with over-sampling, first
    without a straggler (a baseline, in ``baseline/``), then again with the second worker made
    :data:`STRAGGLER_FACTOR` x slower from the first delivery on (every ``/generate`` it serves
    waits that much more): each step must still take at most :data:`STEP_BOUND` x the baseline's
    median step (its stragglers are over-sampled around, cancelled as surplus, or end ``timeout``
    at ``pool.episode_timeout_s``)."""
    from rollout.devtools.chaos.job import PACE_S

    router_url, proxy, _ = two_workers(f, JournalProgress(f.out))
    args = ["local.enabled=false", f"policy.router_url={router_url}", "pool.max_concurrent_episodes=4",
            f"pool.episode_timeout_s={STRAGGLER_EPISODE_TIMEOUT_S:g}"]
    command = [*TRAINER, "--mode", "steps", "--steps", str(STEPS), "--groups", str(STEP_GROUPS), "--outstanding", str(STEP_OUTSTANDING)]
    base_dir = f.dir / "baseline"
    base = f.start(*args, f"rollout.output_dir={base_dir}", command=command, view=base_dir)
    f.finish(base, "run without the straggler")
    counts = tally(base_dir)
    f.check("baseline_whole", base.proc.returncode in OK_EXIT_CODES and base.summary().get("status") == "finished"
            and counts["lost"] == 0 and counts["duplicated"] == 0 and counts["submitted"] > 0,
            f"the run without the straggler: exit code {base.proc.returncode}, {counts['delivered']} of {counts['submitted']} delivered, "
            f"{counts['duplicated']} duplicated, statuses {counts['statuses']}")
    delay = STRAGGLER_FACTOR * PACE_S
    job = f.start(*args, command=command)

    def strike(k: int, p: Progress) -> dict:
        proxy.slow_down(delay)
        return {"slowed": proxy.url, "delay_s": delay}

    strikes, missed = run_strikes(Strike(1, 1), 1, progress=job.progress, running=job.running, strike=strike)
    f.finish(job, "run with the straggler")
    f.check_final(job)
    slowed = proxy.counts.get("generate_delayed", 0)
    f.inject("stragglers", 1 if slowed else 0, 1, missed=missed or (None if slowed else "no call reached the slow worker"), strikes=strikes,
             delayed_calls=slowed)
    b, s = _step_times(base_dir), _step_times(f.out)
    bound = STEP_BOUND * statistics.median(b) if b else 0.0
    after = s[1:]  # the first step is where the straggler began
    f.extra["steps"] = {"baseline_s": b, "straggler_s": s, "bound_s": round(bound, 2)}
    st = tally(f.out)["statuses"]
    f.notes.append(strike_text(f"worker {proxy.url} made {STRAGGLER_FACTOR}x slower (+{delay:g} s a call)", strikes, 1, missed)
                   + f"; {slowed} calls delayed; step times (s): without {[round(x, 1) for x in b]} (median {statistics.median(b) if b else 0:.1f}), "
                   f"with {[round(x, 1) for x in s]} (median {statistics.median(s) if s else 0:.1f}, x{(statistics.median(s) / statistics.median(b)) if b and s else 0:.2f}); "
                   f"cancelled as surplus {st.get('cancelled', 0)}, timed out {st.get('timeout', 0)}")
    f.check("steps_on_time", len(s) == STEPS and bool(after) and max(after) <= bound,
            f"every step after the straggler began took at most {bound:.1f} s ({STEP_BOUND:g} x the median without it): "
            f"{max(after) if after else None}")
