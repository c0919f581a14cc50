"""Infrastructure faults around the pool: the user simulator's model server dying, a network
partition between the actors and the router, and an actor killed by Ray's memory monitor (see
the package docstring)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

import psutil

from rollout.devtools.chaos.cluster import ClusterHelper
from rollout.devtools.chaos.job import ROOT, Fault, actor_procs, strike_text, wait_http
from rollout.devtools.chaos.procs import stop_proc
from rollout.devtools.chaos.progress import Progress, Strike, mid_run, run_strikes
from rollout.devtools.chaos.proxies import PartitionProxy
from rollout.devtools.chaos.report import tally
from rollout.devtools.chaos.servers import http_ok

logger = logging.getLogger(__name__)

USER_DOWN_S = 6.0  # user_sim_server_death: seconds the user simulator's server stays dead (the fault's length)
PARTITION_S = 12.0  # network_partition: seconds the traffic is dropped (the fault's length; > the request timeout)
PARTITION_REQUEST_TIMEOUT_S = 4.0  # network_partition: policy.request_timeout_s (a partition is only seen by timeouts)
OOM_LIMIT = 6 * 2**30  # actor_oom: the throwaway cluster's memory cgroup limit (bytes)
OOM_VICTIM_THRESHOLD = 0.6  # actor_oom: the victim node's RAY_memory_usage_threshold (the other node's: Ray's 0.95)
OOM_MARGIN = 256 * 2**20  # actor_oom: bytes of pressure past the victim node's threshold
OOM_KILL_WAIT_S = 60.0  # actor_oom: how long the pressure is held waiting for the memory monitor's kill (seconds)


# -- the user simulator's server dies ---------------------------------------------------------
class UserSimServer:
    """The user simulator's model server in a process of its own (``python -m
    rollout.devtools.chaos user-sim PORT``: an OpenAI-compatible endpoint answering every call),
    which the bench can SIGKILL and start again on the same port."""

    def __init__(self, f: Fault, port: int):
        self.f, self.port, self.starts = f, port, 0
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.starts += 1
        fh = open(self.f.dir / f"user-sim-{self.starts}.log", "w")  # noqa: SIM115 (closed with the fault)
        self.f.cleanups.append(fh.close)
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout.devtools.chaos", "user-sim", str(self.port)], cwd=ROOT, env=self.f.env,
                                     stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.f.watcher.add(self.proc.pid)
        wait_http(self.f, "the user simulator's server", lambda: http_ok(self.url + "/v1/models")[0] == 200, [self.proc], 60.0)

    def kill(self) -> int:
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return pid

    def stop(self) -> None:
        if self.proc is not None:
            stop_proc(self.proc)


def fault_user_sim_server_death(f: Fault) -> None:
    """``env.user.kind=llm`` against a user simulator served by its own server; SIGKILL it at 1
    delivered / N/3 outstanding and start it again on the same port :data:`USER_DOWN_S` seconds
    later: the user's calls retry with back-off (connection refused is transient); an episode
    whose retries ran out ends ``user_error`` (delivered, its group member re-run)."""
    from rollout.devtools.local.stack import free_port

    server = UserSimServer(f, free_port())
    f.cleanups.append(server.stop)
    cond = mid_run(f.n_episodes)
    job = f.start("env.user.kind=llm", f"env.user.base_url={server.url}/v1", "env.user.model=sim", "env.user.retry_backoff_s=0.5",
                  *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict:
        t0 = time.monotonic()
        pid = server.kill()
        time.sleep(USER_DOWN_S)
        server.start()
        return {"pid": pid, "new_pid": server.proc.pid, "down_s": round(time.monotonic() - t0, 1), "after": job.progress().as_dict()}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.finish(job)
    f.check_final(job)
    f.inject("kills", len(strikes), 1, missed=missed, strikes=strikes)
    log = job.log()
    f.notes.append(strike_text("user simulator's server SIGKILLed and started again", strikes, 1, missed, lambda s: (
        f" (pid {s['pid']}, back on the same port as pid {s['new_pid']} {s['down_s']} s later, at {s['after']['delivered']} delivered)"))
        + f"; user simulator calls retried {log.count('user simulator call failed')} time(s) (actor logs)")
    st = tally(f.out)["statuses"]
    bad = {k: v for k, v in st.items() if k not in ("completed", "user_error")}
    f.check("completed_or_user_error", not bad, None if not bad else f"statuses other than completed / user_error: {bad}")


# -- a network partition between the actors and the router ----------------------------------------
def fault_network_partition(f: Fault) -> None:
    """The actors reach the router through a :class:`~rollout.devtools.chaos.proxies.PartitionProxy`
    (``policy.router_url``); at 1 delivered / N/3 outstanding it drops the traffic both ways without
    closing anything for :data:`PARTITION_S` seconds, then heals: the calls must time out
    (``policy.request_timeout_s`` = :data:`PARTITION_REQUEST_TIMEOUT_S`), be retried with fresh
    request ids, and go through once it heals."""
    stack = f.own_stack()
    proxy = PartitionProxy(stack.router_url).start()
    f.cleanups.append(proxy.stop)
    cond = mid_run(f.n_episodes)
    job = f.start("local.enabled=false", f"policy.router_url={proxy.url}", f"policy.request_timeout_s={PARTITION_REQUEST_TIMEOUT_S:g}",
                  *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict:
        t0 = time.monotonic()
        open_then = proxy.partition()
        time.sleep(PARTITION_S)
        proxy.heal()
        return {"connections_open": open_then, "held": proxy.held, "partition_s": round(time.monotonic() - t0, 1),
                "after": job.progress().as_dict()}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.finish(job)
    f.check_final(job)
    f.inject("partitions", len(strikes), 1, missed=missed, strikes=strikes)
    log = job.log()
    timeouts = log.count("(timed out after")
    f.notes.append(strike_text("actors <-> router partitioned (no reset)", strikes, 1, missed, lambda s: (
        f" ({s['connections_open']} connections open then, {s['held']} held, healed after {s['partition_s']} s at "
        f"{s['after']['delivered']} delivered)")) + f"; /generate attempts timed out and retried: {timeouts} (actor logs)")
    f.check("seen_by_timeouts", not strikes or timeouts > 0, None if not strikes or timeouts else "no /generate call timed out: the partition was not met")
    st = tally(f.out)["statuses"]
    bad = {k: v for k, v in st.items() if k not in ("completed", "policy_error")}
    f.check("completed_or_policy_error", not bad, None if not bad else f"statuses other than completed / policy_error: {bad}")


# -- an actor killed by Ray's memory monitor ----------------------------------------------------------
def _wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def fault_actor_oom(f: Fault) -> None:
    """A throwaway cluster whose raylets read a memory cgroup of its own
    (:mod:`rollout.devtools.chaos.memory`), one actor per worker node, the second node's threshold
    low; at 1 delivered with both actors busy and a queue, a process in the cgroup allocates what
    takes the usage past that node's threshold: its raylet kills its one busy worker, the victim
    actor; the pressure goes as soon as it is dead. Ray restarts the actor, the pool re-runs its
    episodes and must log the memory monitor as the cause."""
    from rollout.devtools.chaos.memory import available_on_machine

    try:
        helper = ClusterHelper(f.dir, f.env, memory_limit=OOM_LIMIT, victim_threshold=OOM_VICTIM_THRESHOLD, watcher=f.watcher)
    except (RuntimeError, OSError) as e:
        f.run_without_fault("oom_kills", 1, "no cluster in a memory cgroup of its own", e)
        return
    f.cleanups.append(helper.stop)
    f.env["RAY_AUTH_MODE"] = "disabled"
    victim_raylet = helper.info["victim_raylet_pid"]
    n_actors = f.cfg.pool.num_actors
    cond = Strike(1, n_actors * 2 + 1)
    job = f.start(f"pool.ray_address={helper.info['address']}", "pool.num_cpus_per_actor=1", "pool.max_concurrent_episodes=2")

    def strike(k: int, p: Progress) -> dict | None:
        actors = actor_procs(f, job, [n["raylet_pid"] for n in helper.info["workers"]])
        victims = [a for a in actors if victim_raylet in {x.pid for x in a.parents()}]
        if len(actors) < n_actors or not victims:
            return None
        before = helper.ask({"usage": True})
        need = int(OOM_VICTIM_THRESHOLD * before["limit"]) - before["used"] + OOM_MARGIN
        room = int(0.95 * before["limit"]) - before["used"] - OOM_MARGIN  # the other node's monitor must not fire
        if need > room or need + 2 * 2**30 > available_on_machine():
            raise RuntimeError(f"no safe pressure: {need} bytes needed, {room} under the other node's threshold, "
                               f"{available_on_machine()} available on the machine")
        t0 = time.monotonic()
        held = helper.ask({"pressure": need})
        dead = _wait_dead(victims[0].pid, OOM_KILL_WAIT_S)
        released = helper.ask({"release": True})
        return {"victim_pid": victims[0].pid, "killed": dead, "pressure_bytes": need, "used_before": before["used"],
                "used_with_pressure": held["used"], "limit": before["limit"], "used_after": released["used"],
                "killed_within_s": round(time.monotonic() - t0, 1)}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.finish(job)
    f.check_final(job)
    kills = helper.ask({"oom_kills": True})["kills"]
    by_monitor = [s for s in strikes if s.get("killed") and any(k["pid"] == s["victim_pid"] and k["raylet_pid"] == victim_raylet for k in kills)]
    f.inject("oom_kills", len(by_monitor), 1, strikes=strikes, raylet_kills=kills,
             missed=missed or (None if by_monitor else f"the victim was not killed by the memory monitor (its kills: {kills})"))
    gib = 2**30
    f.notes.append(strike_text("memory pressure on the victim's node", strikes, 1, missed, lambda s: (
        f" (actor pid {s['victim_pid']} dead: {s['killed']} within {s['killed_within_s']} s; cgroup usage {s['used_before'] / gib:.2f} -> "
        f"{s['used_with_pressure'] / gib:.2f} GiB with {s['pressure_bytes'] / gib:.2f} GiB of pressure, limit {s['limit'] / gib:.0f} GiB, "
        f"victim threshold {OOM_VICTIM_THRESHOLD:g}, the other node's 0.95)"))
        + "; the victim node's raylet logged: " + ("; ".join(f"killed {k['what']} pid {k['pid']} ({k['reason']})" for k in kills
                                                            if k["raylet_pid"] == victim_raylet) or "no kill")
        + f"; episodes re-run after their actor died: {job.log().count('retrying (attempt')} (driver log)")
