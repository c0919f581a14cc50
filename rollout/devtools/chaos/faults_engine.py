"""The real engine's fault: a vLLM server SIGKILLed mid-run (issue 30's engine; see the package
docstring). The bench owns a vLLM stack (two CPU servers behind vllm-router, the checkpoint
``local.backend=vllm`` writes) and runs the main job against it with the vLLM client."""

from __future__ import annotations

import logging
import threading
import time

from rollout.devtools.chaos.job import Fault, strike_text
from rollout.devtools.chaos.progress import Progress, mid_run, run_strikes
from rollout.devtools.chaos.report import tally

logger = logging.getLogger(__name__)

ENGINE_SERVERS = 2  # engine_server_kill: vLLM servers behind the router (one is killed, the other serves on)
ENGINE_BACK_TIMEOUT_S = 900.0  # engine_server_kill: bound on the killed server's restart (seconds; minutes on a loaded 2-core machine)
# The job's keys against the bench's vLLM stack: the vLLM client, the checkpoint's vocabulary, a
# random model's short turns (as configs/vllm_cpu.yaml), and retries enough to outlast the router's
# health checks (it sends a dead worker calls until about 3 of them fail).
ENGINE_OVERRIDES = ("local.enabled=false", "policy.engine=vllm", "policy.tokenizer=builtin:qwen3", "policy.chat_format=hermes",
                    "policy.sampling.temperature=0.7", "policy.sampling.max_new_tokens=64", "policy.on_length=keep",
                    "policy.max_context_tokens=16384", "policy.max_request_retries=6", "env.max_steps=3")
# A random-weight model's episodes end these ways, besides the kill's typed failure.
ENGINE_STATUSES = ("completed", "max_steps", "truncated", "parse_error", "policy_error")


def _running(url: str) -> float:
    """``vllm:num_requests_running`` on one server (0 when it does not answer)."""
    from rollout.core.telemetry import promtext
    from rollout.devtools.local.vllm.processes import http_json

    try:
        status, text = http_json("GET", url + "/metrics", timeout=10)
    except OSError:
        return 0.0
    return promtext.total(promtext.parse(str(text), "vllm:", strict=False), "vllm:num_requests_running") if status == 200 else 0.0


def _router_failed_sends(stack) -> int:
    """Calls vllm-router could not send to a worker (its log's ``Failed to send`` lines): it opens
    that worker's circuit and sends them to another one itself."""
    try:
        return stack.router.log_path.read_text(errors="replace").count("Failed to send")
    except OSError:
        return 0


def fault_engine_server_kill(f: Fault) -> None:
    """The main job on the real vLLM (``policy.engine=vllm``) against the bench's stack of
    :data:`ENGINE_SERVERS` CPU servers behind vllm-router; at 1 delivered / N/3 outstanding the
    server running the most calls is SIGKILLed (its process group: API server and engine core)
    and started again on the same port, as a supervisor would. Its calls fail at the router, which
    opens the dead worker's circuit, takes it off its hash ring and sends them to the live server
    itself (measured in three runs: 10-15 failed sends re-sent, none seen by the client); a failure that reaches the
    client is retried with a fresh request id, and an episode whose retries ran out ends
    ``policy_error`` and is re-run. Not
    injected (the job still runs once, on the local stack) where vLLM is not installed
    (``bash launch/install_vllm.sh``)."""
    from rollout.core.config import load_config
    from rollout.core.engines import EngineJob
    from rollout.devtools.local.vllm.engine import VllmEngine
    from rollout.devtools.local.vllm.processes import vllm_missing

    why = vllm_missing(None)
    if why:
        f.run_without_fault("kills", 1, "the vLLM engine is not installed", RuntimeError(why))
        return
    local = load_config(None, ["local.enabled=true", "local.backend=vllm", "policy.engine=vllm", f"local.num_servers={ENGINE_SERVERS}",
                               f"local.vllm.checkpoint_dir={f.dir / 'checkpoints'}"]).local
    engine = VllmEngine(local, EngineJob(f.cfg.env.domain, "builtin:qwen3", "hermes", None, f.dir / "vllm_logs"))
    f.cleanups.append(engine.stop)
    t0 = time.monotonic()
    stack = engine.start()
    f.notes.append(f"vLLM stack of {ENGINE_SERVERS} servers up in {time.monotonic() - t0:.0f} s")
    for pid in stack.pids():
        f.watcher.add(pid)
    cond = mid_run(f.n_episodes)
    job = f.start(*ENGINE_OVERRIDES, f"policy.router_url={stack.router_url}", *f.concurrency_for(cond))
    back: dict[str, object] = {}

    def bring_back(i: int, killed_at: float) -> None:
        try:
            stack.restart_server(i, timeout_s=ENGINE_BACK_TIMEOUT_S)
            back["s"] = round(time.monotonic() - killed_at, 1)
            for pid in stack.pids():
                f.watcher.add(pid)
        except Exception as e:  # noqa: BLE001 (reported as a failed check)
            back["error"] = f"{type(e).__name__}: {e}"

    threads: list[threading.Thread] = []

    def strike(k: int, p: Progress) -> dict | None:
        running = [_running(u) for u in stack.worker_urls]
        victim = max(range(len(running)), key=lambda i: running[i])
        pid = stack.servers[victim].pid
        stack.kill_server(victim)
        logger.info("%s: SIGKILLed vLLM server %d (pid %s, %s calls running) at %s", f.name, victim, pid, running[victim], p)
        t = threading.Thread(target=bring_back, args=(victim, time.monotonic()), name="engine-server-back", daemon=True)
        t.start()
        threads.append(t)
        return {"server": victim, "pid": pid, "running": running}

    strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
    f.finish(job)
    for t in threads:
        t.join(ENGINE_BACK_TIMEOUT_S)
    f.inject("kills", len(strikes), 1, missed=missed, strikes=strikes)
    log = job.log()
    f.notes.append(strike_text("vLLM server SIGKILLed and started again", strikes, 1, missed, lambda s: (
        f" (server {s['server']}, pid {s['pid']}, calls running per server {s['running']}; "
        + (f"back and listed healthy by the router {back['s']} s later)" if "s" in back else f"not back: {back.get('error')})")))
        + f"; sends to the dead worker that vllm-router retried itself: {_router_failed_sends(stack)} (its log)"
        + f"; /generate calls the client retried: {log.count('; retrying')} (actor logs)")
    if strikes:
        f.check("server_back", "s" in back, None if "s" in back else f"the killed vLLM server did not come back: {back.get('error')}")
    f.check_final(job)
    st = tally(f.out)["statuses"]
    bad = {k: v for k, v in st.items() if k not in ENGINE_STATUSES}
    f.check("typed_statuses", not bad, None if not bad else f"statuses other than {', '.join(ENGINE_STATUSES)}: {bad}")
