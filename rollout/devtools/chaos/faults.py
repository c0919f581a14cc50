"""The first eight faults' scenarios: actor, server, router and driver kills, a faulty server, a
failing user simulator, a node removal (see the package docstring)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from typing import Any, Callable

import psutil

from rollout.devtools.chaos.cluster import ClusterHelper
from rollout.devtools.chaos.job import (
    Fault,
    Job,
    actor_procs,
    first_at_text,
    start_router,
    start_server,
    started_at,
    strike_text,
    wait_http,
)
from rollout.devtools.chaos.procs import alive, cmdline
from rollout.devtools.chaos.progress import JournalProgress, Progress, Strike, mid_run, run_strikes
from rollout.devtools.chaos.report import tally
from rollout.devtools.chaos.servers import FakeUserLLM, FaultInjectingProxy, http_ok, set_generation

logger = logging.getLogger(__name__)
ROUTER_DOWN_S = 5.0  # seconds the router stays down in router_restart (the fault's length, not its placement)
ROUTER_KILL_AT = 2  # router_restart kills the router once this many episodes are delivered
ACTOR_KILLS = 3  # actor_sigkill_x3: kills planned
ACTOR_KILL_CONCURRENCY = 2  # actor_sigkill_x3: pool.max_concurrent_episodes (bounds what a hold lets through)

TOPUP_EVERY = 8  # faulty_server: every 8th episode /generate call left alone gets a kind not injected yet
FAULTY_REQUEST_TIMEOUT_S = 20.0  # policy.request_timeout_s in faulty_server (seconds)
FAULTY_HANG_S = 35.0  # a hung /generate answers 504 after this long (seconds; > the timeout)
# Fraction of the episodes' /generate calls answered with each fault in faulty_server.
FAULT_RATES = {"503": 0.05, "reset": 0.04, "hang": 0.015, "truncated": 0.02, "abort": 0.02}



_ACTOR_BACK = re.compile(r"actor \d+ is back")


def fault_actor_sigkill_x3(f: Fault) -> None:
    # The bench owns the stack so that it can hold generation from each kill until the victim is
    # back (~20 s on a loaded 2-core machine): the other actor then cannot finish the run first.
    stack = f.own_stack()
    job = f.start("local.enabled=false", f"policy.router_url={stack.router_url}", f"pool.max_concurrent_episodes={ACTOR_KILL_CONCURRENCY}")
    n_actors = f.cfg.pool.num_actors
    first = Strike(delivered=1, outstanding=n_actors * ACTOR_KILL_CONCURRENCY + 1)  # every actor full, and a queue
    state: dict[str, Any] = {}

    def strike(k: int, p: Progress) -> dict | None:
        actors = actor_procs(f, job)
        if len(actors) < n_actors:
            return None
        victim = min(actors, key=lambda a: (started_at(a), a.pid))
        state["seen"] = {a.pid for a in actors}
        state["backs"] = len(_ACTOR_BACK.findall(job.log()))
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.Error:
            return None
        logger.info("%s: SIGKILLed actor pid %d (kill %d/%d at %s)", f.name, victim.pid, k + 1, ACTOR_KILLS, p)
        return {"pid": victim.pid}

    def recovered(k: int) -> bool:
        new = {a.pid for a in actor_procs(f, job)} - state["seen"]
        return bool(new) and len(_ACTOR_BACK.findall(job.log())) > state["backs"]

    urls = stack.worker_urls
    strikes, missed = run_strikes(first, ACTOR_KILLS, progress=job.progress, running=job.running, strike=strike,
                                  hold=lambda: set_generation(urls, True), release=lambda: set_generation(urls, False),
                                  recovered=recovered)
    f.extra["kills"] = strikes
    f.inject("kills", len(strikes), ACTOR_KILLS, missed=missed, strikes=strikes)
    f.notes.append(strike_text("actor kills", strikes, ACTOR_KILLS, missed, lambda s: (
        f" (pid {s['pid']}, back after {s['recovered_s']} s, generation held meanwhile: "
        f"{s['after']['delivered']} delivered / {s['after']['outstanding']} outstanding then)" if s.get("recovered_s") is not None
        else f" (pid {s['pid']}, not back)")))
    f.finish(job)
    f.check_final(job)
    retries = job.log().count("retrying (attempt")
    f.notes.append(f"{retries} episode attempt(s) re-run after their actor died (driver log)")


def fault_server_kill(f: Fault) -> None:
    cond = mid_run(f.n_episodes)
    job = f.start("local.num_servers=2", *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict | None:
        servers = [s for s in f.watcher.descendants(job.pid) if "rollout.devtools.local.server" in cmdline(s) and alive(s)]
        if len(servers) < 2:
            return None
        victim = min(servers, key=lambda s: s.pid)
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.Error:
            return None
        return {"pid": victim.pid, "servers": len(servers)}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.inject("kills", len(strikes), 1, missed=missed, strikes=strikes)
    f.notes.append(strike_text("server kill", strikes, 1, missed, lambda s: f" (pid {s['pid']} of {s['servers']} servers)"))
    f.finish(job)
    f.check_final(job)


def fault_router_restart(f: Fault) -> None:
    stack = f.own_stack()
    # Once episodes are delivered every actor has had /generate calls succeed: its circuit breaker
    # is armed (a router that never answered is not waited for), see BackendBreaker.
    cond = mid_run(f.n_episodes, ROUTER_KILL_AT)
    job = f.start("local.enabled=false", f"policy.router_url={stack.router_url}", *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict | None:
        routers = []
        for pid in stack.pids():
            try:
                if "rollout.devtools.local.stack router" in cmdline(psutil.Process(pid)) and alive(psutil.Process(pid)):
                    routers.append(pid)
            except psutil.Error:
                pass
        try:
            pgid = os.getpgid(routers[0]) if routers else None
        except ProcessLookupError:
            pgid = None
        if pgid is None or pgid == os.getpgid(0):
            return None
        t0 = time.monotonic()
        os.killpg(pgid, signal.SIGKILL)  # the wrapper and the router it forked: one process group
        time.sleep(ROUTER_DOWN_S)
        stack.restart_router()
        for pid in stack.pids():
            f.watcher.add(pid)
        return {"pid": routers[-1], "down_s": round(time.monotonic() - t0, 1), "after": job.progress().as_dict()}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.inject("restarts", len(strikes), 1, missed=missed, strikes=strikes)
    f.notes.append(strike_text("router SIGKILLed and restarted", strikes, 1, missed, lambda s: (
        f" (pid {s['pid']}, back on the same port {s['down_s']} s later, at {s['after']['delivered']} delivered / "
        f"{s['after']['outstanding']} outstanding)")))
    f.finish(job)
    log = job.log()
    f.notes.append(f"circuit breaker opened {log.count('policy backend unreachable')} time(s), closed "
                   f"{log.count('policy backend is back')} time(s) (actor logs)")
    f.check_final(job)
    st = tally(f.out)["statuses"]
    f.check("all_completed", set(st) == {"completed"}, None if set(st) == {"completed"} else f"not every episode completed: {st}")


def fault_faulty_server(f: Fault) -> None:
    from rollout.devtools.local.stack import free_port

    port = free_port()
    server = start_server(f, port)
    server_url = f"http://127.0.0.1:{port}"
    wait_http(f, "the server", lambda: http_ok(server_url + "/health")[0] == 200, [server])
    proxy = FaultInjectingProxy(server_url, FAULT_RATES, FAULTY_HANG_S, topup_every=TOPUP_EVERY, progress=JournalProgress(f.out)).start()
    f.cleanups.append(proxy.stop)
    router, router_url = start_router(f, proxy.url)

    def router_ready() -> bool:
        st, body = http_ok(router_url + "/workers")
        if st != 200 or not any(w.get("is_healthy") for w in json.loads(body).get("workers", [])):
            return False
        st, body = http_ok(router_url + "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}, 30)
        return st == 200

    wait_http(f, "the router", router_ready, [server, router])
    job = f.start("local.enabled=false", f"policy.router_url={router_url}", f"policy.request_timeout_s={FAULTY_REQUEST_TIMEOUT_S:g}")
    f.finish(job)
    f.check_final(job)
    counts = {k: proxy.counts.get(k, 0) for k in (*FAULT_RATES, "forwarded")}
    kinds = [k for k in FAULT_RATES if counts[k] > 0]
    missing = [k for k in FAULT_RATES if counts[k] == 0]
    f.inject("kinds", len(kinds), len(FAULT_RATES), missed=f"never injected: {', '.join(missing)} ({proxy.episode_calls} episode calls)" if missing else None,
             by_kind=counts, topped_up=dict(proxy.topped_up), first_at=dict(proxy.first_at))
    f.notes.append(f"injected into /generate ({proxy.episode_calls} episode calls): " + ", ".join(f"{k} {v}" for k, v in counts.items())
                   + (f" ({', '.join(f'{k} {v}' for k, v in proxy.topped_up.items())} of them topped up)" if proxy.topped_up else "")
                   + "; " + first_at_text(proxy.first_at) + (f"; never injected: {', '.join(missing)}" if missing else ""))


def fault_user_sim_429_500(f: Fault) -> None:
    user = FakeUserLLM(progress=JournalProgress(f.out)).start()
    f.cleanups.append(user.stop)
    job = f.start("env.user.kind=llm", f"env.user.base_url={user.url}/v1", "env.user.model=sim", "env.user.retry_backoff_s=0.2")
    f.finish(job)
    f.check_final(job)
    f.extra["user_calls"] = dict(user.counts)
    faults = {k: user.counts.get(k, 0) for k in ("429", "500")}
    missing = [k for k, v in faults.items() if not v]
    f.inject("kinds", len(faults) - len(missing), len(faults), missed=f"never answered: {', '.join(missing)}" if missing else None,
             by_kind=faults, first_at=dict(user.first_at))
    f.notes.append("user simulator calls: " + ", ".join(f"{k} {v}" for k, v in sorted(user.counts.items())) + "; "
                   + first_at_text(user.first_at) + (f"; never answered: {', '.join(missing)}" if missing else ""))
    st = tally(f.out)["statuses"]
    bad = {k: v for k, v in st.items() if k not in ("completed", "user_error")}
    f.check("completed_or_user_error", not bad, None if not bad else f"statuses other than completed / user_error: {bad}")


def driver_stop_resume(f: Fault, sig: int, damage: Callable[[Fault], Callable[[Job], None]] | None = None) -> None:
    """Signal the driver at ``N/3`` delivered (see the package docstring), then ``--resume``.
    ``damage``: called between the two runs (it damages the stopped run's journal and records
    what it injected); what it returns is called with the resumed run once it ended (its checks)."""
    cond = mid_run(f.n_episodes, max(2, f.n_episodes // 3))
    caps = f.concurrency_for(cond)
    job = f.start(*caps)
    name = signal.Signals(sig).name
    sent: dict[str, Any] = {}

    def strike(k: int, p: Progress) -> dict | None:
        f.watcher.scan()
        sent["stopped"] = list(f.watcher.seen)
        sent["t0"] = time.monotonic()
        try:
            os.kill(job.pid, sig)
        except ProcessLookupError:
            return None
        return {"signal": name, "pid": job.pid}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    if not strikes:
        f.inject("signals", 0, 1, missed=missed)
        f.notes.append(strike_text(f"driver {name}", strikes, 1, missed))
        f.finish(job)
        f.check_final(job)
        return
    at = strikes[0]
    try:
        job.proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    took = time.monotonic() - sent["t0"]
    rc = f.finish(job, f"{name}ed run")
    s = job.summary()
    f.extra["stop"] = {"signal": name, "delivered_at_signal": at["delivered"], "outstanding_at_signal": at["outstanding"],
                       "exit_s": round(took, 2), "rc": rc}
    if sig == signal.SIGTERM and rc == 0 and s.get("status") == "finished":
        # it finished on its own as the signal came: nothing was interrupted, nothing to check
        f.inject("signals", 0, 1, missed=f"the driver finished before the {name} took effect", strikes=strikes)
        f.notes.append(strike_text(f"driver {name}", [], 1, f"the driver finished (exit 0) as the {name} was sent at {at['delivered']} delivered"))
        f.check_final(job)
        return
    f.inject("signals", 1, 1, strikes=strikes)
    f.notes.append(strike_text(f"driver {name}", strikes, 1, None, lambda _: f" (exit code {rc} after {took:.1f} s)"))
    if sig == signal.SIGTERM:
        f.check("exit_143_within_10s", rc == 143 and took < 10.0 and s.get("status") == "interrupted",
                f"SIGTERM at {at['delivered']} delivered: exit code {rc} after {took:.1f} s, summary status {s.get('status')!r} "
                f"({s.get('undelivered')} undelivered)")
    else:
        state = json.loads((f.out / "run.json").read_text()) if (f.out / "run.json").is_file() else {}
        f.check("driver_killed", rc == -signal.SIGKILL, f"SIGKILL at {at['delivered']} delivered ({job.delivered()} journaled); "
                f"run.json status {state.get('status')!r}")
    verify = damage(f) if damage is not None else None
    again = f.start(*caps, resume=True)
    f.finish(again, "resumed run")
    if verify is not None:
        verify(again)
    f.watcher.scan()
    gone = f.watcher.gone_after(sent["stopped"], sent["t0"])
    f.notes.append(f"the {len(sent['stopped'])} processes of the {name}ed run were all gone {gone:.1f} s after the {name}" if gone is not None
                   else f"some of the {len(sent['stopped'])} processes of the {name}ed run were still alive when the resumed run ended")
    f.check_final(again)
    s = again.summary()
    f.check("resumed_once", s.get("resumed_sessions") == 1, None if s.get("resumed_sessions") == 1 else f"resumed_sessions {s.get('resumed_sessions')}")


def fault_driver_sigkill_resume(f: Fault) -> None:
    driver_stop_resume(f, signal.SIGKILL)


def fault_driver_sigterm_resume(f: Fault) -> None:
    driver_stop_resume(f, signal.SIGTERM)


def fault_node_removal(f: Fault) -> None:
    helper = ClusterHelper(f.dir, f.env, watcher=f.watcher)
    f.cleanups.append(helper.stop)
    raylets = {n["raylet_pid"]: n for n in helper.info["workers"]}
    f.env["RAY_AUTH_MODE"] = "disabled"
    cond = mid_run(f.n_episodes)
    job = f.start(f"pool.ray_address={helper.info['address']}", *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict | None:
        # the actors run under a worker node's raylet, not under the driver: look for them there
        actors = actor_procs(f, job, list(raylets))
        if len(actors) < f.cfg.pool.num_actors:
            return None
        for a in sorted(actors, key=lambda a: a.pid):
            try:
                node = next((x.pid for x in a.parents() if x.pid in raylets), None)
            except psutil.Error:
                continue
            if node is not None:
                r = helper.remove(node)
                logger.info("%s: removed node %s (raylet pid %d, actor pid %d) at %s", f.name, r.get("node_id"), node, a.pid, p)
                return {"raylet_pid": node, "actor_pid": a.pid, **r}
        return None

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.extra["removed"] = strikes[0] if strikes else None
    f.inject("nodes_removed", len(strikes), 1, missed=missed, strikes=strikes)
    f.notes.append(strike_text("worker node removed", strikes, 1, missed, lambda s: (
        f" (node {str(s.get('node_id'))[:12]}, actor pid {s['actor_pid']}, removed in {s.get('s')} s)")))
    f.finish(job)
    f.check_final(job)
    helper.stop()
