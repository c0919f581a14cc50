"""One fault's scenario state (:class:`Fault`): its runs of the main job (:class:`Job`), its
helpers, notes, checks and what it injected; and the helpers the scenarios share."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from rollout.devtools.chaos.procs import ProcessWatcher, alive, cmdline, kill_tree, proc_key, stop_proc
from rollout.devtools.chaos.progress import JournalProgress, Progress, Strike, strike_concurrency

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[3]  # the repository (rollout/devtools/chaos/job.py)
DEFAULT_TASKS = 24
LEFT_WAIT_S = 90.0  # seconds to wait for a run's processes to go
PACE_S = 0.1  # local.generate_latency_s of every job: seconds each /generate waits on the local servers
JOB_TIMEOUT_S = 900.0  # one CLI run (seconds); past it the run is killed and the fault fails
OK_EXIT_CODES = (0, 3)  # 3: some episodes ended with an infrastructure failure (typed, delivered)
# Applied before the user's overrides.
BASE_OVERRIDES = ["rollout.n_samples_per_task=1", "pool.num_actors=2", "logging.level=INFO", f"local.generate_latency_s={PACE_S:g}"]


# -- the job ----------------------------------------------------------------------------------
class Job:
    """One ``python -m rollout run`` (or another driver, ``command``) in a subprocess in its own
    session; output to ``log_path``.

    Args:
        args: the CLI arguments after ``python -m rollout run``.
        out_dir: where the bench reads the run's ``rollout.output_dir`` (the folder itself, or
            its path seen from outside a mount namespace the run is in).
        env: the environment of the subprocess.
        watcher: records the driver and its descendants.
        command: the driver's command before ``args`` (default ``python -m rollout run``).
        prefix: put before it (e.g. ``nsenter ...``: the run in a mount namespace; ``exec``s, so
            the pid is the driver's).
    """

    def __init__(self, args: list[str], out_dir: Path, log_path: Path, env: dict[str, str], watcher: ProcessWatcher,
                 command: list[str] | None = None, prefix: list[str] | None = None):
        self.args = args
        self.out_dir = out_dir
        self.log_path = log_path
        self._fh = open(log_path, "w")  # noqa: SIM115 (closed by wait())
        self.t0 = time.monotonic()
        argv = [*(prefix or []), *(command or [sys.executable, "-m", "rollout", "run"]), *args]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.wall_s: float | None = None
        self.timed_out = False
        self._progress = JournalProgress(out_dir)
        watcher.add(self.pid)

    def running(self) -> bool:
        """Whether the driver process is still running."""
        return self.proc.poll() is None

    def progress(self) -> Progress:
        """The run's progress now (:class:`JournalProgress`; a ``--resume`` run of the same
        folder counts the earlier sessions' lines too)."""
        return self._progress()

    def delivered(self) -> int:
        """Episodes journaled as delivered so far (lines of ``episodes.jsonl``)."""
        return self.progress().delivered

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, timeout_s: float = JOB_TIMEOUT_S) -> int:
        """Wait for the run to end (killing its process group past ``timeout_s`` seconds);
        returns its exit code."""
        try:
            self.proc.wait(timeout=max(0.0, timeout_s - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            kill_tree(self.pid)
            self.proc.wait(30)
        if self.wall_s is None:
            self.wall_s = time.monotonic() - self.t0
        self._fh.close()
        return self.proc.returncode

    def summary(self) -> dict:
        try:
            return json.loads((self.out_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return {}

    def record(self) -> dict:
        """What the report keeps of this run."""
        s = self.summary()
        return {"args": self.args, "rc": self.proc.returncode, "wall_s": round(self.wall_s or 0.0, 2), "timed_out": self.timed_out,
                "summary_status": s.get("status"), "summary_reason": s.get("reason"), "log": str(self.log_path)}


@dataclasses.dataclass
class ChaosOptions:
    """What the bench runs.

    Attributes:
        config: the YAML config of the job (``--config``).
        tasks: tasks per fault: the first ``tasks`` of the configured split (``env.task_split``,
            or ``env.task_ids``), one episode each.
        overrides: ``key=value`` overrides for every run (after the bench's own defaults, before
            each fault's own keys).
        out_dir: where each fault's run folder and logs go (a new temporary folder if ``None``).
        left_wait_s: seconds to wait for a fault's processes to go.
    """

    config: str = "configs/local.yaml"
    tasks: int = DEFAULT_TASKS
    overrides: list[str] = dataclasses.field(default_factory=list)
    out_dir: Path | None = None
    left_wait_s: float = LEFT_WAIT_S


class Fault:
    """The state of one fault's scenario: its runs, its helpers, its notes, checks and what it
    injected (:meth:`inject`)."""

    def __init__(self, name: str, opts: ChaosOptions, root: Path, cfg, ray_tmp: str, task_ids: list[str]):
        self.name = name
        self.task_ids = task_ids
        self.opts = opts
        self.cfg = cfg
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.out = self.dir / "run"
        self.watcher = ProcessWatcher()
        self.jobs: list[Job] = []
        self.notes: list[str] = []
        self.checks: dict[str, bool] = {}
        self.extra: dict[str, Any] = {}
        self.injected: dict[str, Any] | None = None
        self.cleanups: list[Callable[[], None]] = []
        self.env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", TOKENIZERS_PARALLELISM="false", RAY_TMPDIR=ray_tmp)
        self.env.pop("RAY_ADDRESS", None)
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), self.env.get("PYTHONPATH", "")) if p)

    @property
    def n_episodes(self) -> int:
        """Episodes a run submits (one per task: ``rollout.n_samples_per_task=1``)."""
        return len(self.task_ids) * self.cfg.rollout.n_samples_per_task

    def args(self, *fault_overrides: str, resume: bool = False) -> list[str]:
        ids = ",".join(json.dumps(str(i)) for i in self.task_ids)
        a = ["--config", self.opts.config, "--no-progress", f"env.task_ids=[{ids}]", *BASE_OVERRIDES, "pool.ray_address=local",
             f"rollout.output_dir={self.out}", *self.opts.overrides, *fault_overrides]
        return [*a, "--resume"] if resume else a

    def start(self, *fault_overrides: str, resume: bool = False, command: list[str] | None = None, prefix: list[str] | None = None,
              view: Path | None = None) -> Job:
        """Start a run of the main job (or of ``command``, with the same arguments) on this
        fault's folder; ``prefix`` and ``view``: see :class:`Job` (``view``: its ``out_dir``)."""
        job = Job(self.args(*fault_overrides, resume=resume), view or self.out, self.dir / f"job-{len(self.jobs)}.log", self.env, self.watcher,
                  command=command, prefix=prefix)
        self.jobs.append(job)
        logger.info("%s: started run %d (pid %d)%s", self.name, len(self.jobs), job.pid, " --resume" if resume else "")
        return job

    def finish(self, job: Job, what: str = "run") -> int:
        rc = job.wait()
        logger.info("%s: %s ended with exit code %s after %.1f s", self.name, what, rc, job.wall_s or 0.0)
        if job.timed_out:
            self.notes.append(f"{what} did not end within {JOB_TIMEOUT_S:.0f} s and was killed")
        return rc

    def check(self, name: str, ok: bool, note: str | None = None) -> None:
        """Record a check on the outcome (a guarantee: a failed one makes the row ``broken``)."""
        self.checks[name] = bool(ok)
        if note is not None:
            self.notes.append(note)

    def check_final(self, job: Job, *, completed: bool = False) -> None:
        """The last run must end ``finished`` with exit code 0 or 3 (0 when ``completed``)."""
        s = job.summary()
        ok_codes = (0,) if completed else OK_EXIT_CODES
        self.check("final_run_finished", job.proc.returncode in ok_codes and s.get("status") == "finished",
                   None if job.proc.returncode in ok_codes and s.get("status") == "finished" else
                   f"last run: exit code {job.proc.returncode}, summary status {s.get('status')!r} ({s.get('reason')}); log {job.log_path}")

    def inject(self, unit: str, done: int, planned: int, missed: str | None = None, **extra: Any) -> None:
        """Record what the fault injected: ``done`` of ``planned`` ``unit`` (e.g. 3 of 3
        ``kills``), why the rest was not (``missed``), and details (``strikes``: the progress
        at each). The row is ``not_injected`` unless ``done >= planned``."""
        self.injected = {"unit": unit, unit: done, "planned": planned, "complete": done >= planned, **extra}
        if missed is not None:
            self.injected["missed"] = missed

    def run_without_fault(self, unit: str, planned: int, what: str, error: Exception) -> None:
        """The fault could not be set up (``what`` failed with ``error``): record it not
        injected, saying why, and run the job once without it, checking its guarantees as usual."""
        self.notes.append(f"{what} ({error}); the run goes on without the fault")
        self.inject(unit, 0, planned, missed=str(error))
        job = self.start()
        self.finish(job)
        self.check_final(job)

    def concurrency_for(self, strike: Strike) -> list[str]:
        """The override lowering ``pool.max_concurrent_episodes`` so that ``strike`` stays due
        for at least one episode (:func:`strike_concurrency`); none when the config's is low
        enough."""
        per_actor = self.cfg.pool.max_concurrent_episodes
        cap = strike_concurrency(self.n_episodes, strike, self.cfg.pool.num_actors, per_actor)
        if cap >= per_actor:
            return []
        self.notes.append(f"pool.max_concurrent_episodes={cap} (was {per_actor}), so that the strike ({strike}) stays due for an episode or more")
        return [f"pool.max_concurrent_episodes={cap}"]

    def own_stack(self):
        """Start a local stack owned by the bench (the config's ``local`` section), its
        processes watched and stopped with the fault; returns the
        :class:`~rollout.devtools.local.stack.LocalStack`. Runs use it with ``local.enabled=false
        policy.router_url=<its router>``."""
        from rollout.devtools.local.stack import LocalStack

        local = dataclasses.replace(self.cfg.local, enabled=True)
        stack = LocalStack(local, self.cfg.env.domain, self.cfg.policy.tokenizer, log_dir=self.dir / "bench_stack_logs",
                           chat_format=self.cfg.policy.chat_format)
        self.cleanups.append(stack.stop)
        stack.start()
        for pid in stack.pids():
            self.watcher.add(pid)
        return stack


def strike_text(what: str, strikes: list[dict], planned: int, missed: str | None, detail: Callable[[dict], str] = lambda s: "") -> str:
    """One note: ``<what>: <done>/<planned>: #1 at D delivered / O outstanding <detail>; ...``."""
    parts = [f"#{s['n']} at {s['delivered']} delivered / {s['outstanding']} outstanding{detail(s)}" for s in strikes]
    text = f"{what}: {len(strikes)}/{planned}" + (": " + "; ".join(parts) if parts else "")
    return text + (f"; missed: {missed}" if missed else "")


def actor_procs(f: Fault, job: Job, under: list[int] | None = None) -> list[psutil.Process]:
    """Live ``ray::RolloutWorker`` processes under ``job``'s driver (or under the pids ``under``)."""
    procs = [p for pid in (under if under is not None else [job.pid]) for p in f.watcher.descendants(pid)]
    return [p for p in procs if cmdline(p).startswith("ray::RolloutWorker") and alive(p)]


def started_at(p: psutil.Process) -> float:
    k = proc_key(p)
    return k[1] if k is not None else 0.0


def start_server(f: Fault, port: int, name: str = "server") -> subprocess.Popen:
    """A ``rollout.devtools.local.server`` of the config's ``local`` section on ``port``, stopped
    with the fault; its log ``<name>.log`` in the fault's folder."""
    c = f.cfg
    cmd = [sys.executable, "-m", "rollout.devtools.local.server", "--host", "127.0.0.1", "--port", str(port), "--backend", c.local.backend,
           "--domain", c.env.domain, "--tokenizer", c.policy.tokenizer, "--tiny-config", json.dumps(dataclasses.asdict(c.local.tiny)),
           "--weight-version", str(c.local.weight_version), "--generate-latency-s", repr(float(c.local.generate_latency_s)),
           "--log-level", "WARNING", "--parent-pid", str(os.getpid())]
    fh = open(f.dir / f"{name}.log", "w")  # noqa: SIM115 (closed with the fault)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=f.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    f.cleanups.append(fh.close)
    f.cleanups.append(lambda: stop_proc(proc))
    f.watcher.add(proc.pid)
    return proc


def start_router(f: Fault, *worker_urls: str, policy: tuple[str, ...] = ("--policy", "cache_aware")) -> tuple[subprocess.Popen, str]:
    """A real ``sglang-router`` (``policy``: its arguments; its retries and circuit breaker off:
    every fault reaches the client) over ``worker_urls``, stopped with the fault; returns it and
    its URL."""
    from rollout.core.tokenizer import resolve_tokenizer_path
    from rollout.devtools.local.stack import free_port

    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls, *policy,
            "--tokenizer-path", resolve_tokenizer_path(f.cfg.policy.tokenizer), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warn", "--worker-startup-timeout-secs", "120",
            "--worker-startup-check-interval", "1", "--disable-retries", "--disable-circuit-breaker"]
    fh = open(f.dir / "router.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "rollout.devtools.local.stack", "router", "--parent-pid", str(os.getpid()), "--", *args],
                            cwd=ROOT, env=f.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    f.cleanups.append(fh.close)
    f.cleanups.append(lambda: stop_proc(proc))
    f.watcher.add(proc.pid)
    return proc, f"http://127.0.0.1:{port}"


def wait_http(f: Fault, what: str, cond: Callable[[], bool], procs: list[subprocess.Popen], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"{f.name}: {what} did not come up (logs in {f.dir})")
        time.sleep(0.3)


def first_at_text(first_at: dict[str, dict | None]) -> str:
    return ", ".join(f"first {k} at {v['delivered']} delivered / {v['outstanding']} outstanding" if v else f"first {k} at ?"
                     for k, v in first_at.items())
