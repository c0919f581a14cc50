"""Chaos bench: the main job under faults, checked for exactly-once delivery and clean exits.

``python -m rollout.bench chaos [--config configs/local.yaml] [--tasks N] [--faults a,b,...]
[--json FILE] [key=value ...]`` runs the main job (``python -m rollout run``, the CLI, in a
subprocess in its own session; gold replay on the local stack, ``N`` tasks of the configured
domain, ``rollout.n_samples_per_task=1``, ``pool.num_actors=2``, a Ray cluster of its own) once
per fault (the first ``N`` tasks of ``env.task_split``) and reports, per fault:

* ``submitted``: episode ids in the run's ``specs.jsonl``, plus the re-runs of group members
  (``<id>~r<n>``) found in the results;
* ``delivered``: distinct episode ids in ``samples.jsonl`` / ``failed.jsonl`` /
  ``filtered.jsonl`` at the end (after the ``--resume`` when the fault needs one);
* ``lost``: submitted minus delivered; ``duplicated``: ids on more than one line of those files,
  or on more than one line of the journal ``episodes.jsonl``;
* ``statuses``: episodes per status; ``wall_s``: seconds from the start of the fault's first
  run to the end of its last one (bench-owned helpers' start-up included);
* ``left_behind``: processes the fault started (every descendant of each CLI driver, captured
  with psutil every 0.5 s while it runs, and every process the bench started for the fault)
  still alive, zombies excepted, once the bench has waited up to ``--left-wait`` seconds (90 by
  default: after a SIGKILLed driver, Ray's own agents exit on their own about 60 s later) for
  them to go; ``left_wait_s`` says how long that took. What is left is reported, then killed
  by pid;
* ``injected``: what the fault planned against what was done, e.g. ``{"kills": 3, "planned": 3,
  "strikes": [...]}`` (each strike with the run's progress at that moment), see below.

**Faults are placed by progress, never by the clock.** A run's progress (:class:`Progress`) is
read from its journal: ``delivered`` = lines of ``episodes.jsonl``, ``submitted`` = lines of
``specs.jsonl`` (re-runs included), ``outstanding`` = submitted - delivered (running or queued).
A strike (:class:`Strike`) is due once ``delivered >= d`` *and* ``outstanding >= o``, so it only
happens while work is in flight; the bench reads the journal every :data:`POLL_S` seconds
(incrementally: only the bytes appended since the last read) and strikes at the first read that
finds it due (:func:`run_strikes`). The progress read at each strike goes into the row's notes
and its ``injected.strikes``. Two mechanisms make every strike reachable however fast or slow
the machine is:

* **A window of at least one episode.** A strike due at ``d`` delivered with ``o`` outstanding
  stays due until the ``(N - o + 1)``-th delivery (``N`` episodes). With at most ``C`` episodes
  in flight (``pool.num_actors`` x ``pool.max_concurrent_episodes``), only ``C`` episodes start
  before the first delivery, so when ``d + o + C <= N + 1`` the last delivery of the window is
  of an episode that started after the ``d``-th: the strike stays due for at least one whole
  episode. Each fault lowers ``pool.max_concurrent_episodes`` where needed to keep that true
  (:func:`strike_concurrency`), and every server of the local stack waits
  :data:`PACE_S` seconds before each ``/generate`` (``local.generate_latency_s``, a GPU server's
  latency; in :data:`BASE_OVERRIDES`), so that an episode (6-8 turns in retail) lasts at least
  about half a second on any machine: many polls. (Against a router of your own,
  ``local.enabled=false``, the pace is your servers' own latency.)
* **A hold between strikes.** Where the next strike can only come after a slow recovery (an
  actor restart takes ~20 s while the other actor keeps delivering), the bench owns the local
  stack (:class:`rollout.devtools.local.stack.LocalStack`, the job runs with ``local.enabled=false
  policy.router_url=<its router>``) and pauses generation on its servers (``POST
  /pause_generation {"mode": "in_place"}``, SGLang's endpoint, as a weight update does) from
  the strike until the victim is back, then ``POST /continue_generation``: episodes held in a
  ``/generate`` call cannot be delivered, so the work left keeps the next strike reachable (only
  episodes in flight, ``C`` at most, that finish without another ``/generate`` call, e.g. in
  their reward evaluation, are delivered during a hold).

A strike that could not be placed (the run ended first, the victim did not come back within
:data:`KILL_WAIT_S`) is reported as not injected: the row's verdict is ``not_injected``, told
apart from a broken guarantee (see the verdicts and exit codes below).

Faults (:data:`FAULTS`), each with its strike condition:

``actor_sigkill_x3``
    SIGKILL a ``ray::RolloutWorker`` actor process (a descendant of this run's driver), the
    oldest one alive, three times (:data:`ACTOR_KILLS`), on the bench's own stack with
    ``pool.max_concurrent_episodes=2`` (:data:`ACTOR_KILL_CONCURRENCY`). Kill 1 is due at 1
    delivered with ``C + 1`` outstanding (both actors full and a queue: the victim runs
    episodes); each kill is followed by a hold until the victim is back (a new actor process
    exists and the driver logged ``actor N is back``: it answered a health ping); kill ``k+1``
    is due at one more delivery after the hold ended, again with ``C + 1`` outstanding.
    Injected: ``kills``.
``server_kill``
    ``local.num_servers=2``; SIGKILL one ``rollout.devtools.local.server`` process (a descendant of the
    driver) at 1 delivered with ``ceil(N/3)`` outstanding (the other episodes generating).
    Episodes on it may end ``policy_error`` (delivered; their group member is re-run).
    Injected: ``kills``.
``router_restart``
    The bench owns the local stack, SIGKILLs the router's process group at :data:`ROUTER_KILL_AT`
    delivered with ``ceil(N/3)`` outstanding, and restarts it on the same port
    :data:`ROUTER_DOWN_S` seconds later (:meth:`~rollout.devtools.local.stack.LocalStack.restart_router`);
    the outage itself holds the run (every ``/generate`` waits). The policy client's circuit
    breaker should let every episode complete (check ``all_completed``). It is armed per actor
    only once a call of that actor succeeded: a router lost in the first second of a run,
    before that, ends the episodes ``policy_error`` after their retries (seen here; by design).
    Injected: ``restarts``.
``faulty_server``
    A real ``sglang-router`` (``--disable-retries --disable-circuit-breaker``, so that every
    fault reaches the client) whose only worker is :class:`FaultInjectingProxy` in front of a
    real ``rollout.devtools.local.server``; the proxy answers a fraction of the episodes' ``/generate``
    calls (chosen by a hash of their ``rid``, so a retry is a fresh draw) with 503, a connection
    reset, a hang past ``policy.request_timeout_s`` (set to :data:`FAULTY_REQUEST_TIMEOUT_S`),
    a truncated JSON body or ``finish_reason.type == "abort"`` (:data:`FAULT_RATES`). Placed by
    calls, i.e. by progress: every :data:`TOPUP_EVERY`-th episode call the hash left alone gets
    a kind not injected yet, so all five kinds are injected within the first
    ``5 x TOPUP_EVERY`` calls. Injected: ``kinds`` (planned 5), counted by the proxy, with the
    run's progress at each kind's first injection.
``user_sim_429_500``
    ``env.user.kind=llm`` against :class:`FakeUserLLM`, an OpenAI-compatible server that answers
    429 (``Retry-After: 1``) or 500 to 4 in 10 of the chat calls, in arrival order
    (:data:`USER_FAULT_PATTERN`: the first 429 is the 2nd call, the first 500 the 4th), and
    otherwise a fixed reply that says ``###STOP###`` at the user's second turn;
    ``env.user.retry_backoff_s=0.2``. Injected: ``kinds`` (429 and 500, planned 2), counted by
    the server, with the progress at each kind's first answer.
``driver_sigkill_resume``
    SIGKILL the driver at ``max(2, N // 3)`` delivered with ``ceil(N/3)`` outstanding, then
    ``--resume``. Injected: ``signals`` (the driver died of the SIGKILL).
``driver_sigterm_resume``
    SIGTERM the driver likewise (it must exit within 10 s with code 143 and the summary status
    ``interrupted``), then ``--resume``. Injected: ``signals`` (the driver was running when
    signalled and did not finish on its own).
``node_removal``
    A ``ray.cluster_utils.Cluster`` (head without CPUs, two worker nodes with one CPU each) run
    by a helper subprocess (``python -m rollout.devtools.chaos cluster``, so that Ray is imported only
    there); the job joins it (``pool.ray_address``) and the bench removes the worker node that
    hosts an actor (found through the actor process's raylet ancestor) at 1 delivered with
    ``ceil(N/3)`` outstanding. Injected: ``nodes_removed``.

**Verdicts** (the row's ``verdict``; ``ok`` is true only for ``ok``):

* ``broken``: a guarantee broke: lost, duplicated or left-behind processes, an episode id
  delivered that was never submitted, a check on the outcome failed (``checks``: e.g. the last
  run finished with exit code 0 or 3, exit code 143 within 10 s of the SIGTERM), or the
  scenario itself failed;
* ``not_injected``: every guarantee held, but the fault did not inject all it plans
  (``injected`` below ``planned``; ``notes`` says why);
* ``ok``: both.

**Exit codes** of ``python -m rollout.bench chaos`` (:func:`exit_code`): 0 every row ``ok``;
1 (:data:`EXIT_BROKEN`) some row ``broken`` (takes precedence); 5 (:data:`EXIT_NOT_INJECTED`)
no row broken but some fault not (fully) injected: the bench proved nothing for that fault;
2 a usage or config error.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]  # the repository (rollout/devtools/chaos.py)
FAULTS = ("actor_sigkill_x3", "server_kill", "router_restart", "faulty_server", "user_sim_429_500",
          "driver_sigkill_resume", "driver_sigterm_resume", "node_removal")
DEFAULT_TASKS = 24
LEFT_WAIT_S = 90.0  # seconds to wait for a run's processes to go
ROUTER_DOWN_S = 5.0  # seconds the router stays down in router_restart (the fault's length, not its placement)
ROUTER_KILL_AT = 2  # router_restart kills the router once this many episodes are delivered
ACTOR_KILLS = 3  # actor_sigkill_x3: kills planned
ACTOR_KILL_CONCURRENCY = 2  # actor_sigkill_x3: pool.max_concurrent_episodes (bounds what a hold lets through)
POLL_S = 0.05  # seconds between two reads of a run's journal while a strike is not due
RECOVER_POLL_S = 0.5  # seconds between two checks that a victim is back (progress is held meanwhile)
PACE_S = 0.1  # local.generate_latency_s of every job: seconds each /generate waits on the local servers
TOPUP_EVERY = 8  # faulty_server: every 8th episode /generate call left alone gets a kind not injected yet
FAULTY_REQUEST_TIMEOUT_S = 20.0  # policy.request_timeout_s in faulty_server (seconds)
FAULTY_HANG_S = 35.0  # a hung /generate answers 504 after this long (seconds; > the timeout)
# Fraction of the episodes' /generate calls answered with each fault in faulty_server.
FAULT_RATES = {"503": 0.05, "reset": 0.04, "hang": 0.015, "truncated": 0.02, "abort": 0.02}
# user_sim_429_500: the user simulator's chat calls, in arrival order, are answered by this
# pattern, repeated: 2 in 10 with 429 (Retry-After: 1), 2 in 10 with 500.
USER_FAULT_PATTERN = ("ok", "429", "ok", "500", "ok", "ok", "429", "ok", "ok", "500")
JOB_TIMEOUT_S = 900.0  # one CLI run (seconds); past it the run is killed and the fault fails
KILL_WAIT_S = 240.0  # seconds to wait for a strike to be due, or for its victim to be back
OK_EXIT_CODES = (0, 3)  # 3: some episodes ended with an infrastructure failure (typed, delivered)
# Applied before the user's overrides.
BASE_OVERRIDES = ["rollout.n_samples_per_task=1", "pool.num_actors=2", "logging.level=INFO", f"local.generate_latency_s={PACE_S:g}"]
# Row verdicts and the bench's exit codes (see the module docstring).
VERDICTS = ("ok", "broken", "not_injected")
EXIT_OK = 0
EXIT_BROKEN = 1  # a guarantee broke (lost, duplicated, left behind, a check on the outcome failed)
EXIT_NOT_INJECTED = 5  # every guarantee held, but some fault could not be (fully) injected

# -- processes ---------------------------------------------------------------------------------
def _key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return None


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessWatcher:
    """Records every process under some root pids, polling every ``interval_s`` seconds in a
    thread (a SIGKILLed driver's children are re-parented: they stay recorded).

    Attributes:
        seen: ``(pid, create time) -> psutil.Process`` of every process recorded (roots included).
        gone_at: ``(pid, create time) -> time.monotonic()`` of the poll that first found it gone.
    """

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self.gone_at: dict[tuple[int, float], float] = {}
        self._roots: list[psutil.Process] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-watcher", daemon=True)
        self._thread.start()

    def add(self, pid: int) -> None:
        """Watch ``pid`` and its descendants (recorded at once and then every poll)."""
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            return
        with self._lock:
            self._roots.append(p)
        self.scan()

    def scan(self) -> None:
        """Record the roots' live descendants now."""
        with self._lock:
            roots = list(self._roots)
        for root in roots:
            found = [root]
            try:
                if root.is_running():
                    found += root.children(recursive=True)
            except psutil.Error:
                pass
            for p in found:
                k = _key(p)
                if k is not None:
                    with self._lock:
                        self.seen.setdefault(k, p)
        with self._lock:
            todo = [(k, p) for k, p in self.seen.items() if k not in self.gone_at]
        now = time.monotonic()
        for k, p in todo:
            if not _alive(p):
                with self._lock:
                    self.gone_at[k] = now

    def gone_after(self, keys: list[tuple[int, float]], since: float) -> float | None:
        """Seconds from ``since`` (``time.monotonic()``) until every process of ``keys`` was
        found gone; ``None`` while one is still alive."""
        with self._lock:
            if any(k not in self.gone_at for k in keys):
                return None
            return max([self.gone_at[k] - since for k in keys] + [0.0])

    def descendants(self, pid: int) -> list[psutil.Process]:
        """Live descendants of ``pid`` now (not only recorded ones)."""
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []

    def alive(self) -> list[psutil.Process]:
        """Recorded processes still alive (zombies excepted)."""
        with self._lock:
            procs = list(self.seen.values())
        return [p for p in procs if _alive(p)]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scan()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_gone(watcher: ProcessWatcher, timeout_s: float) -> tuple[list[psutil.Process], float]:
    """Wait up to ``timeout_s`` seconds for every recorded process to exit; returns what is
    still alive and the seconds waited."""
    t0 = time.monotonic()
    while True:
        left = watcher.alive()
        if not left or time.monotonic() - t0 >= timeout_s:
            return left, time.monotonic() - t0
        time.sleep(0.5)


def _kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid``'s process group (it was started in a session of its own)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- the job ----------------------------------------------------------------------------------
class Job:
    """One ``python -m rollout run`` in a subprocess in its own session; output to ``log_path``.

    Args:
        args: the CLI arguments after ``python -m rollout run``.
        out_dir: the run's ``rollout.output_dir``.
        env: the environment of the subprocess.
        watcher: records the driver and its descendants.
    """

    def __init__(self, args: list[str], out_dir: Path, log_path: Path, env: dict[str, str], watcher: ProcessWatcher):
        self.args = args
        self.out_dir = out_dir
        self.log_path = log_path
        self._fh = open(log_path, "w")  # noqa: SIM115 (closed by wait())
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout", "run", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True)
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
            _kill_tree(self.pid)
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


# -- progress and strikes ---------------------------------------------------------------------
class LineCounter:
    """Counts the complete, non-blank lines of a file that is only appended to, reading only the
    bytes appended since the last call (a journal line can be ~100 KB: reading whole files 20
    times a second would cost more than the run). A line is counted once its ``\n`` is written;
    a file that shrank (replaced) is counted again from its start.

    Args:
        path: the file (it may not exist yet: 0 lines).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._lines = 0
        self._partial = False  # whether the unterminated line read so far holds non-blank bytes

    def count(self) -> int:
        """Complete non-blank lines now."""
        try:
            size = self.path.stat().st_size
            if size < self._offset:
                self._offset, self._lines, self._partial = 0, 0, False
            if size == self._offset:
                return self._lines
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read(size - self._offset)
        except OSError:
            return self._lines
        self._offset += len(data)
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            if self._partial or data[start:nl].strip():
                self._lines += 1
            self._partial = False
            start = nl + 1
        if data[start:].strip():
            self._partial = True
        return self._lines


@dataclasses.dataclass(frozen=True)
class Progress:
    """A run's progress, from its journal.

    Attributes:
        delivered: lines of ``episodes.jsonl`` (episodes delivered, every status).
        submitted: lines of ``specs.jsonl`` (episodes submitted, re-runs of group members included).
    """

    delivered: int
    submitted: int

    @property
    def outstanding(self) -> int:
        """Episodes submitted and not delivered yet (running or queued); never negative."""
        return max(0, self.submitted - self.delivered)

    def as_dict(self) -> dict[str, int]:
        """``{"delivered", "outstanding"}``, as the rows record a strike's moment."""
        return {"delivered": self.delivered, "outstanding": self.outstanding}

    def __str__(self) -> str:
        return f"{self.delivered} delivered / {self.outstanding} outstanding"


class JournalProgress:
    """A run folder's :class:`Progress`, read incrementally from its ``specs.jsonl`` and
    ``episodes.jsonl`` (files that do not exist yet count 0); callable from any thread.

    Args:
        out_dir: the run's ``rollout.output_dir``.
    """

    def __init__(self, out_dir: Path):
        self._specs = LineCounter(Path(out_dir) / "specs.jsonl")
        self._episodes = LineCounter(Path(out_dir) / "episodes.jsonl")
        self._lock = threading.Lock()

    def __call__(self) -> Progress:
        with self._lock:
            delivered = self._episodes.count()  # first: a spec is journaled before its episode
            return Progress(delivered=delivered, submitted=self._specs.count())


@dataclasses.dataclass(frozen=True)
class Strike:
    """When a fault may strike: once ``delivered`` episodes are delivered while at least
    ``outstanding`` are still outstanding (so only while work is in flight).

    Attributes:
        delivered: episodes delivered, at least (>= 0).
        outstanding: episodes outstanding, at least (>= 1).
    """

    delivered: int
    outstanding: int = 1

    def __post_init__(self) -> None:
        if self.delivered < 0 or self.outstanding < 1:
            raise ValueError(f"a strike needs delivered >= 0 and outstanding >= 1, not {self}")

    def due(self, p: Progress) -> bool:
        """Whether ``p`` satisfies this strike's condition."""
        return p.delivered >= self.delivered and p.outstanding >= self.outstanding

    def __str__(self) -> str:
        return f">= {self.delivered} delivered and >= {self.outstanding} outstanding"


def mid_run(n_episodes: int, delivered: int = 1) -> Strike:
    """The bench's single-strike condition for a run of ``n_episodes``: ``delivered`` delivered
    (at least 1) with ``ceil(n_episodes / 3)`` (at least 1) still outstanding."""
    return Strike(delivered=max(1, delivered), outstanding=max(1, -(-n_episodes // 3)))


def strike_concurrency(n_episodes: int, strike: Strike, num_actors: int, per_actor: int) -> int:
    """The largest ``pool.max_concurrent_episodes`` (at most ``per_actor``, at least 1) for which
    ``strike`` stays due for at least one whole episode in a run of ``n_episodes`` on
    ``num_actors`` actors: ``strike.delivered + strike.outstanding + C <= n_episodes + 1`` with
    ``C = num_actors * max_concurrent_episodes`` episodes in flight (see the module docstring).
    Where even 1 does not satisfy it (too few tasks) the answer is 1 and the window is not
    guaranteed: the strike may be reported as not injected."""
    room = n_episodes + 1 - strike.delivered - strike.outstanding
    return max(1, min(per_actor, room // max(1, num_actors)))


def run_strikes(first: Strike, count: int, *, progress: Callable[[], Progress], running: Callable[[], bool],
                strike: Callable[[int, Progress], dict | None], hold: Callable[[], None] | None = None,
                release: Callable[[], None] | None = None, recovered: Callable[[int], bool] | None = None,
                spacing: int = 1, timeout_s: float = KILL_WAIT_S, poll_s: float = POLL_S,
                recover_poll_s: float = RECOVER_POLL_S, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> tuple[list[dict], str | None]:
    """Strike ``count`` times, each time at a progress condition.

    Strike 0 is due at ``first``; strike ``k + 1`` at ``spacing`` more deliveries than the
    progress read when strike ``k`` was over (its victim back and the hold released), with
    ``first.outstanding`` outstanding. For each strike: read ``progress()`` every ``poll_s``
    seconds until the strike is due, then call ``strike(k, p)`` at once: it injects the fault
    and returns what it did (a dict), or ``None`` when there is nothing to strike yet (e.g. no
    actor process up): polled again. Then, when ``recovered`` is given: ``hold()`` (if given),
    wait until ``recovered(k)`` (checked every ``recover_poll_s`` seconds), ``release()``
    (always, once held). The strikes stop early when the run ended (``running()`` false) or
    ``timeout_s`` seconds passed while waiting for a strike to be due or a victim to be back.
    An exception of a callback propagates (after ``release()`` once ``hold()`` was called).

    Args:
        first: the first strike's condition.
        count: strikes planned (>= 1).
        progress, running, strike, hold, release, recovered: see above; ``hold`` and
            ``release`` go together.
        spacing: deliveries between the end of a strike and the next one (>= 0).
        sleep, clock: ``time.sleep`` / ``time.monotonic`` (a stand-in run passes its own).

    Returns:
        ``(strikes, missed)``: one dict per strike done, ``{"n", "delivered", "outstanding",
        **what strike() returned}`` plus, with ``recovered``, ``"recovered_s"`` (seconds to be
        back; the hold lasted as long) and ``"after"`` (the progress when it was over, as
        ``{"delivered", "outstanding"}``); ``missed``: ``None`` when all ``count`` were done,
        else why the next one was not (with the progress then).

    Raises:
        ValueError: ``count`` < 1, ``spacing`` < 0, or only one of ``hold`` / ``release``.
    """
    if count < 1 or spacing < 0 or (hold is None) != (release is None):
        raise ValueError("run_strikes: count >= 1, spacing >= 0, and hold / release together")
    strikes: list[dict] = []
    cond = first
    for k in range(count):
        deadline = clock() + timeout_s
        while True:
            p = progress()
            if not running():
                return strikes, f"strike {k + 1} ({cond}) not due before the run ended (at {progress()})"
            if cond.due(p):
                done = strike(k, p)
                if done is not None:
                    break
            if clock() > deadline:
                return strikes, f"strike {k + 1} ({cond}) not due within {timeout_s:.0f} s (at {p})"
            sleep(poll_s)
        rec = {"n": k + 1, **p.as_dict(), **done}
        strikes.append(rec)
        logger.info("strike %d/%d at %s: %s", k + 1, count, p, done)
        if recovered is None:
            cond = Strike(p.delivered + spacing, first.outstanding)
            continue
        t0 = clock()
        back = False
        try:
            if hold is not None:
                hold()
            deadline = t0 + timeout_s
            while not (back := recovered(k)) and running() and clock() <= deadline:
                sleep(recover_poll_s)
        finally:
            if release is not None:
                release()
        after = progress()
        rec["recovered_s"] = round(clock() - t0, 1) if back else None
        rec["after"] = after.as_dict()
        if not back:
            why = "the run ended" if not running() else f"{timeout_s:.0f} s passed"
            return strikes, f"the victim of strike {k + 1} was not back when {why} (at {after})"
        cond = Strike(after.delivered + spacing, first.outstanding)
    return strikes, None


def exit_code(rows: list[dict[str, Any]]) -> int:
    """The chaos bench's exit code for its rows (see the module docstring):
    :data:`EXIT_BROKEN` if a row's verdict is ``broken`` (or a row has none), else
    :data:`EXIT_NOT_INJECTED` if one is ``not_injected``, else :data:`EXIT_OK` (also for no rows)."""
    verdicts = [r.get("verdict") for r in rows]
    if any(v not in ("ok", "not_injected") for v in verdicts):
        return EXIT_BROKEN
    return EXIT_NOT_INJECTED if "not_injected" in verdicts else EXIT_OK


def verdict(guarantees_held: bool, injected: dict[str, Any] | None) -> str:
    """A row's verdict: ``broken`` unless ``guarantees_held``; else ``not_injected`` unless
    ``injected`` (a row's ``injected`` record) shows every planned fault done; else ``ok``."""
    if not guarantees_held:
        return "broken"
    return "ok" if injected is not None and injected.get("complete") else "not_injected"


# -- counting ---------------------------------------------------------------------------------
def _jsonl(path: Path, notes: list[str]) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            notes.append(f"{path.name}:{n + 1} is not valid JSON (torn line)")
    return out


def _episode_id(d: dict) -> str:
    return str(d.get("episode_id") or (d.get("metadata") or {}).get("episode_id") or "")


def tally(out_dir: Path) -> dict[str, Any]:
    """Count a run's episodes (see the module docstring for the definitions).

    Returns:
        ``{"submitted", "delivered", "lost", "duplicated", "statuses", "reruns", "lost_ids",
        "duplicated_ids", "unexpected_ids", "notes"}``.
    """
    notes: list[str] = []
    specs = [_episode_id(d) for d in _jsonl(out_dir / "specs.jsonl", notes)]
    rows = [d for f in ("samples.jsonl", "failed.jsonl", "filtered.jsonl") for d in _jsonl(out_dir / f, notes)]
    written = [_episode_id(d) for d in rows]
    journal = [_episode_id(d) for d in _jsonl(out_dir / "episodes.jsonl", notes)]
    spec_set = set(specs)
    reruns = {i for i in set(written) | set(journal) if "~r" in i and i.split("~r", 1)[0] in spec_set}
    submitted = spec_set | reruns
    delivered = set(written)
    dup = {i for i, n in collections.Counter(written).items() if n > 1} | {i for i, n in collections.Counter(journal).items() if n > 1}
    if len(specs) != len(spec_set):
        notes.append(f"specs.jsonl names {len(specs) - len(spec_set)} episode(s) twice")
    statuses: collections.Counter[str] = collections.Counter()
    first: set[str] = set()
    for d, i in zip(rows, written):
        if i not in first:
            first.add(i)
            statuses[str(d.get("status"))] += 1
    return {
        "submitted": len(submitted), "delivered": len(delivered), "lost": len(submitted - delivered), "duplicated": len(dup),
        "statuses": dict(sorted(statuses.items())), "reruns": len(reruns), "lost_ids": sorted(submitted - delivered)[:20],
        "duplicated_ids": sorted(dup)[:20], "unexpected_ids": sorted(delivered - submitted)[:20], "notes": notes,
    }


# -- helper servers (each runs its own event loop in a thread) ---------------------------------
class ThreadedApp:
    """An aiohttp application on 127.0.0.1 (a free port) served from a thread of its own, for
    callers whose own code is synchronous (the bench, Ray drivers in tests). Subclasses build the
    app in ``_app()`` and may open and close resources in ``_on_start`` / ``_on_stop``;
    ``start()`` returns once :attr:`url` serves, ``stop()`` tears it down."""

    def __init__(self) -> None:
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None

    def _app(self):  # pragma: no cover - overridden
        raise NotImplementedError

    async def _on_start(self) -> None:
        pass

    async def _on_stop(self) -> None:
        pass

    async def _start(self) -> None:
        from aiohttp import web

        await self._on_start()
        self._runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._on_stop()

    def start(self):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=type(self).__name__, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        except Exception as e:  # noqa: BLE001 (best effort at the end of a fault)
            logger.debug("stopping %s: %r", type(self).__name__, e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None


_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class FaultInjectingProxy(ThreadedApp):
    """An HTTP proxy that stands for an SGLang worker in front of ``upstream`` (a real server):
    every request is forwarded, except that a fraction of the episodes' ``/generate`` calls (a
    ``rid`` of the form ``<episode>@<attempt>#<n>[.r<k>]``) get a fault instead, picked by a hash
    of ``seed`` and the ``rid`` (deterministic; a retry has a new ``rid``, so a fresh draw):

    * ``503``: HTTP 503 with a JSON error;
    * ``reset``: the connection is reset (RST) without an answer;
    * ``hang``: no answer for ``hang_s`` seconds (then 504);
    * ``truncated``: the server's answer cut to half its bytes, HTTP 200;
    * ``abort``: the server's answer with ``meta_info.finish_reason = {"type": "abort"}``.

    With ``topup_every`` = ``n`` > 0, every ``n``-th episode call (in arrival order) that the
    hash leaves alone gets the first kind of ``rates`` not injected yet, so that every kind is
    injected within the first ``n x len(rates)`` episode calls, whatever the hash draws.

    Args:
        upstream: the server's base URL.
        rates: fault -> fraction of those calls (their sum at most 1).
        hang_s: seconds a hung call waits.
        topup_every: see above (0: the hash alone).
        progress: called at each kind's first injection (e.g. a :class:`JournalProgress`).

    Attributes:
        counts: fault -> calls it was injected into; ``forwarded``: calls passed through.
        episode_calls: episode ``/generate`` calls seen.
        topped_up: fault -> calls it was injected into by the top-up.
        first_at: fault -> ``progress()`` at its first injection, as ``{"delivered",
            "outstanding"}`` (``None`` without ``progress``).
    """

    def __init__(self, upstream: str, rates: dict[str, float], hang_s: float, seed: int = 0, topup_every: int = 0,
                 progress: Callable[[], Progress] | None = None):
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.rates = dict(rates)
        self.hang_s = hang_s
        self.seed = seed
        self.topup_every = topup_every
        self.progress = progress
        self.counts: collections.Counter[str] = collections.Counter()
        self.topped_up: collections.Counter[str] = collections.Counter()
        self.episode_calls = 0
        self.first_at: dict[str, dict | None] = {}

    @staticmethod
    def _episode_call(rid: str | None) -> bool:
        return bool(rid) and "@" in rid and "#" in rid  # not the stack's / preflight's own probes

    def pick(self, rid: str | None) -> str | None:
        """The fault the hash draws for the call with this ``rid`` (``None``: forward it)."""
        if not self._episode_call(rid):
            return None
        u = int.from_bytes(hashlib.sha256(f"{self.seed}:{rid}".encode()).digest()[:8], "big") / 2**64
        acc = 0.0
        for kind, rate in self.rates.items():
            acc += rate
            if u < acc:
                return kind
        return None

    def choose(self, rid: str | None) -> str | None:
        """The fault for the next call, with this ``rid``: :meth:`pick`, or the top-up (see the
        class docstring); counts it (``counts``, ``first_at``). ``None``: forward it."""
        if not self._episode_call(rid):
            return None
        self.episode_calls += 1
        kind = self.pick(rid)
        if kind is None and self.topup_every > 0 and self.episode_calls % self.topup_every == 0:
            kind = next((k for k in self.rates if self.counts.get(k, 0) == 0), None)
            if kind is not None:
                self.topped_up[kind] += 1
        if kind is not None:
            self.counts[kind] += 1
            if kind not in self.first_at:
                self.first_at[kind] = self.progress().as_dict() if self.progress is not None else None
        return kind

    def _app(self):
        from aiohttp import web

        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _on_start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))

    async def _on_stop(self) -> None:
        await self._session.close()

    async def _handle(self, request):
        from aiohttp import web

        body = await request.read()
        kind = None
        if request.method == "POST" and request.path == "/generate":
            try:
                rid = json.loads(body).get("rid")
            except (ValueError, AttributeError):
                rid = None
            kind = self.choose(rid if isinstance(rid, str) else None)  # counts an injected kind
        if kind is None:
            self.counts["forwarded" if request.path == "/generate" else "other"] += 1
        if kind == "503":
            return web.json_response({"error": {"message": "injected: service unavailable"}}, status=503)
        if kind == "reset":
            sock = request.transport.get_extra_info("socket") if request.transport else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)  # never sent: the connection is gone
        if kind == "hang":
            await asyncio.sleep(self.hang_s)
            return web.json_response({"error": {"message": "injected: gateway timeout"}}, status=504)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body or None, headers=headers) as r:
            data = await r.read()
            status, ctype = r.status, r.headers.get("Content-Type", "application/json")
        if kind == "truncated" and status == 200:
            return web.Response(body=data[: len(data) // 2], status=200, content_type="application/json")
        if kind == "abort" and status == 200:
            d = json.loads(data)
            d.setdefault("meta_info", {})["finish_reason"] = {"type": "abort", "message": "injected abort"}
            return web.json_response(d)
        return web.Response(body=data, status=status, headers={"Content-Type": ctype})


class FakeUserLLM(ThreadedApp):
    """An OpenAI-compatible user simulator endpoint (``GET /v1/models``, ``POST
    /v1/chat/completions``): the chat calls, in arrival order, are answered as ``pattern`` says
    (repeated): ``429`` (with ``Retry-After: 1``), ``500``, or ``ok``: a fixed user line, which
    says ``###STOP###`` from the user's ``stop_at``-th turn on (counted by the simulator's own
    earlier turns in the request, role ``assistant``).

    Args:
        pattern: ``"ok"`` / ``"429"`` / ``"500"`` per chat call, repeated.
        stop_at: the user's turn from which it says ``###STOP###``.
        progress: called at the first 429 and the first 500 (e.g. a :class:`JournalProgress`).

    Attributes:
        counts: ``429`` / ``500`` / ``ok`` / ``stop`` -> calls answered so.
        first_at: ``429`` / ``500`` -> ``progress()`` at the first such answer, as
            ``{"delivered", "outstanding"}`` (``None`` without ``progress``).
    """

    def __init__(self, pattern: tuple[str, ...] = USER_FAULT_PATTERN, stop_at: int = 2, progress: Callable[[], Progress] | None = None):
        super().__init__()
        self.pattern = pattern
        self.stop_at = stop_at
        self.progress = progress
        self._calls = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.first_at: dict[str, dict | None] = {}

    def _app(self):
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        msgs = body.get("messages") or []
        if not (len(msgs) == 1 and msgs[0].get("content") == "ping"):  # not the pre-flight probe
            action = self.pattern[self._calls % len(self.pattern)]
            self._calls += 1
            if action in ("429", "500") and action not in self.first_at:
                self.first_at[action] = self.progress().as_dict() if self.progress is not None else None
            if action == "429":
                self.counts["429"] += 1
                return web.json_response({"error": {"message": "injected: rate limited"}}, status=429, headers={"Retry-After": "1"})
            if action == "500":
                self.counts["500"] += 1
                return web.json_response({"error": {"message": "injected: internal error"}}, status=500)
        turn = sum(1 for m in msgs if m.get("role") == "assistant") + 1
        if turn >= self.stop_at:
            text = "Thank you, that is everything I needed. ###STOP###"
            self.counts["stop"] += 1
        else:
            text = "Hi, I need some help with my order, please go ahead with what is needed."
            self.counts["ok"] += 1
        return web.json_response({
            "id": "chatcmpl-chaos", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "sim"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })


def _http_ok(url: str, body: dict | None = None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


# -- the faults -------------------------------------------------------------------------------
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


class _Fault:
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

    def start(self, *fault_overrides: str, resume: bool = False) -> Job:
        job = Job(self.args(*fault_overrides, resume=resume), self.out, self.dir / f"job-{len(self.jobs)}.log", self.env, self.watcher)
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


def _strike_text(what: str, strikes: list[dict], planned: int, missed: str | None, detail: Callable[[dict], str] = lambda s: "") -> str:
    """One note: ``<what>: <done>/<planned>: #1 at D delivered / O outstanding <detail>; ...``."""
    parts = [f"#{s['n']} at {s['delivered']} delivered / {s['outstanding']} outstanding{detail(s)}" for s in strikes]
    text = f"{what}: {len(strikes)}/{planned}" + (": " + "; ".join(parts) if parts else "")
    return text + (f"; missed: {missed}" if missed else "")


def _actor_procs(f: _Fault, job: Job, under: list[int] | None = None) -> list[psutil.Process]:
    """Live ``ray::RolloutWorker`` processes under ``job``'s driver (or under the pids ``under``)."""
    procs = [p for pid in (under if under is not None else [job.pid]) for p in f.watcher.descendants(pid)]
    return [p for p in procs if _cmdline(p).startswith("ray::RolloutWorker") and _alive(p)]


def _started_at(p: psutil.Process) -> float:
    k = _key(p)
    return k[1] if k is not None else 0.0


def set_generation(urls: list[str], paused: bool, timeout_s: float = 30.0) -> None:
    """Pause generation in place on every server of ``urls`` (``POST /pause_generation {"mode":
    "in_place"}``: running requests stop between two steps and keep their state, new ones are
    held), or continue it (``POST /continue_generation``), as SGLang's endpoints do.

    Raises:
        RuntimeError: a server did not answer 200 within ``timeout_s`` seconds (after every
            server was asked, so that a continue reaches all that answer).
    """
    path, body = ("/pause_generation", {"mode": "in_place"}) if paused else ("/continue_generation", {})
    bad = []
    for url in urls:
        status, text = _http_ok(url.rstrip("/") + path, body, timeout_s)
        if status != 200:
            bad.append(f"{url}{path}: HTTP {status} {text[:200]!r}")
    if bad:
        raise RuntimeError("; ".join(bad))


_ACTOR_BACK = re.compile(r"actor \d+ is back")


def fault_actor_sigkill_x3(f: _Fault) -> None:
    # The bench owns the stack so that it can hold generation from each kill until the victim is
    # back (~20 s on a loaded 2-core machine): the other actor then cannot finish the run first.
    stack = f.own_stack()
    job = f.start("local.enabled=false", f"policy.router_url={stack.router_url}", f"pool.max_concurrent_episodes={ACTOR_KILL_CONCURRENCY}")
    n_actors = f.cfg.pool.num_actors
    first = Strike(delivered=1, outstanding=n_actors * ACTOR_KILL_CONCURRENCY + 1)  # every actor full, and a queue
    state: dict[str, Any] = {}

    def strike(k: int, p: Progress) -> dict | None:
        actors = _actor_procs(f, job)
        if len(actors) < n_actors:
            return None
        victim = min(actors, key=lambda a: (_started_at(a), a.pid))
        state["seen"] = {a.pid for a in actors}
        state["backs"] = len(_ACTOR_BACK.findall(job.log()))
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.Error:
            return None
        logger.info("%s: SIGKILLed actor pid %d (kill %d/%d at %s)", f.name, victim.pid, k + 1, ACTOR_KILLS, p)
        return {"pid": victim.pid}

    def recovered(k: int) -> bool:
        new = {a.pid for a in _actor_procs(f, job)} - state["seen"]
        return bool(new) and len(_ACTOR_BACK.findall(job.log())) > state["backs"]

    urls = stack.worker_urls
    strikes, missed = run_strikes(first, ACTOR_KILLS, progress=job.progress, running=job.running, strike=strike,
                                  hold=lambda: set_generation(urls, True), release=lambda: set_generation(urls, False),
                                  recovered=recovered)
    f.extra["kills"] = strikes
    f.inject("kills", len(strikes), ACTOR_KILLS, missed=missed, strikes=strikes)
    f.notes.append(_strike_text("actor kills", strikes, ACTOR_KILLS, missed, lambda s: (
        f" (pid {s['pid']}, back after {s['recovered_s']} s, generation held meanwhile: "
        f"{s['after']['delivered']} delivered / {s['after']['outstanding']} outstanding then)" if s.get("recovered_s") is not None
        else f" (pid {s['pid']}, not back)")))
    f.finish(job)
    f.check_final(job)
    retries = job.log().count("retrying (attempt")
    f.notes.append(f"{retries} episode attempt(s) re-run after their actor died (driver log)")


def fault_server_kill(f: _Fault) -> None:
    cond = mid_run(f.n_episodes)
    job = f.start("local.num_servers=2", *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict | None:
        servers = [s for s in f.watcher.descendants(job.pid) if "rollout.devtools.local.server" in _cmdline(s) and _alive(s)]
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
    f.notes.append(_strike_text("server kill", strikes, 1, missed, lambda s: f" (pid {s['pid']} of {s['servers']} servers)"))
    f.finish(job)
    f.check_final(job)


def fault_router_restart(f: _Fault) -> None:
    stack = f.own_stack()
    # Once episodes are delivered every actor has had /generate calls succeed: its circuit breaker
    # is armed (a router that never answered is not waited for), see BackendBreaker.
    cond = mid_run(f.n_episodes, ROUTER_KILL_AT)
    job = f.start("local.enabled=false", f"policy.router_url={stack.router_url}", *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict | None:
        routers = []
        for pid in stack.pids():
            try:
                if "rollout.devtools.local.stack router" in _cmdline(psutil.Process(pid)) and _alive(psutil.Process(pid)):
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
    f.notes.append(_strike_text("router SIGKILLed and restarted", strikes, 1, missed, lambda s: (
        f" (pid {s['pid']}, back on the same port {s['down_s']} s later, at {s['after']['delivered']} delivered / "
        f"{s['after']['outstanding']} outstanding)")))
    f.finish(job)
    log = job.log()
    f.notes.append(f"circuit breaker opened {log.count('policy backend unreachable')} time(s), closed "
                   f"{log.count('policy backend is back')} time(s) (actor logs)")
    f.check_final(job)
    st = tally(f.out)["statuses"]
    f.check("all_completed", set(st) == {"completed"}, None if set(st) == {"completed"} else f"not every episode completed: {st}")


def _start_server(f: _Fault, port: int) -> subprocess.Popen:
    c = f.cfg
    cmd = [sys.executable, "-m", "rollout.devtools.local.server", "--host", "127.0.0.1", "--port", str(port), "--backend", c.local.backend,
           "--domain", c.env.domain, "--tokenizer", c.policy.tokenizer, "--tiny-config", json.dumps(dataclasses.asdict(c.local.tiny)),
           "--weight-version", str(c.local.weight_version), "--generate-latency-s", repr(float(c.local.generate_latency_s)),
           "--log-level", "WARNING", "--parent-pid", str(os.getpid())]
    fh = open(f.dir / "server.log", "w")  # noqa: SIM115 (closed with the fault)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=f.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    f.cleanups.append(fh.close)
    f.cleanups.append(lambda: _stop_proc(proc))
    f.watcher.add(proc.pid)
    return proc


def _start_router(f: _Fault, worker_url: str) -> tuple[subprocess.Popen, str]:
    from rollout.core.tokenizer import resolve_tokenizer_path
    from rollout.devtools.local.stack import free_port

    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", worker_url, "--policy", "cache_aware",
            "--tokenizer-path", resolve_tokenizer_path(f.cfg.policy.tokenizer), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warn", "--worker-startup-timeout-secs", "120",
            "--worker-startup-check-interval", "1", "--disable-retries", "--disable-circuit-breaker"]
    fh = open(f.dir / "router.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "rollout.devtools.local.stack", "router", "--parent-pid", str(os.getpid()), "--", *args],
                            cwd=ROOT, env=f.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    f.cleanups.append(fh.close)
    f.cleanups.append(lambda: _stop_proc(proc))
    f.watcher.add(proc.pid)
    return proc, f"http://127.0.0.1:{port}"


def _stop_proc(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL it after ``grace_s`` seconds."""
    if proc.poll() is None:
        _kill_tree(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            proc.wait(10)


def _wait_http(f: _Fault, what: str, cond: Callable[[], bool], procs: list[subprocess.Popen], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"{f.name}: {what} did not come up (logs in {f.dir})")
        time.sleep(0.3)


def _first_at_text(first_at: dict[str, dict | None]) -> str:
    return ", ".join(f"first {k} at {v['delivered']} delivered / {v['outstanding']} outstanding" if v else f"first {k} at ?"
                     for k, v in first_at.items())


def fault_faulty_server(f: _Fault) -> None:
    from rollout.devtools.local.stack import free_port

    port = free_port()
    server = _start_server(f, port)
    server_url = f"http://127.0.0.1:{port}"
    _wait_http(f, "the server", lambda: _http_ok(server_url + "/health")[0] == 200, [server])
    proxy = FaultInjectingProxy(server_url, FAULT_RATES, FAULTY_HANG_S, topup_every=TOPUP_EVERY, progress=JournalProgress(f.out)).start()
    f.cleanups.append(proxy.stop)
    router, router_url = _start_router(f, proxy.url)

    def router_ready() -> bool:
        st, body = _http_ok(router_url + "/workers")
        if st != 200 or not any(w.get("is_healthy") for w in json.loads(body).get("workers", [])):
            return False
        st, body = _http_ok(router_url + "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}, 30)
        return st == 200

    _wait_http(f, "the router", router_ready, [server, router])
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
                   + "; " + _first_at_text(proxy.first_at) + (f"; never injected: {', '.join(missing)}" if missing else ""))


def fault_user_sim_429_500(f: _Fault) -> None:
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
                   + _first_at_text(user.first_at) + (f"; never answered: {', '.join(missing)}" if missing else ""))
    st = tally(f.out)["statuses"]
    bad = {k: v for k, v in st.items() if k not in ("completed", "user_error")}
    f.check("completed_or_user_error", not bad, None if not bad else f"statuses other than completed / user_error: {bad}")


def _driver_stop_resume(f: _Fault, sig: int) -> None:
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
        f.notes.append(_strike_text(f"driver {name}", strikes, 1, missed))
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
        f.notes.append(_strike_text(f"driver {name}", [], 1, f"the driver finished (exit 0) as the {name} was sent at {at['delivered']} delivered"))
        f.check_final(job)
        return
    f.inject("signals", 1, 1, strikes=strikes)
    f.notes.append(_strike_text(f"driver {name}", strikes, 1, None, lambda _: f" (exit code {rc} after {took:.1f} s)"))
    if sig == signal.SIGTERM:
        f.check("exit_143_within_10s", rc == 143 and took < 10.0 and s.get("status") == "interrupted",
                f"SIGTERM at {at['delivered']} delivered: exit code {rc} after {took:.1f} s, summary status {s.get('status')!r} "
                f"({s.get('undelivered')} undelivered)")
    else:
        state = json.loads((f.out / "run.json").read_text()) if (f.out / "run.json").is_file() else {}
        f.check("driver_killed", rc == -signal.SIGKILL, f"SIGKILL at {at['delivered']} delivered ({job.delivered()} journaled); "
                f"run.json status {state.get('status')!r}")
    again = f.start(*caps, resume=True)
    f.finish(again, "resumed run")
    f.watcher.scan()
    gone = f.watcher.gone_after(sent["stopped"], sent["t0"])
    f.notes.append(f"the {len(sent['stopped'])} processes of the {name}ed run were all gone {gone:.1f} s after the {name}" if gone is not None
                   else f"some of the {len(sent['stopped'])} processes of the {name}ed run were still alive when the resumed run ended")
    f.check_final(again)
    s = again.summary()
    f.check("resumed_once", s.get("resumed_sessions") == 1, None if s.get("resumed_sessions") == 1 else f"resumed_sessions {s.get('resumed_sessions')}")


def fault_driver_sigkill_resume(f: _Fault) -> None:
    _driver_stop_resume(f, signal.SIGKILL)


def fault_driver_sigterm_resume(f: _Fault) -> None:
    _driver_stop_resume(f, signal.SIGTERM)


class _ClusterHelper:
    """``python -m rollout.devtools.chaos cluster``: a ``ray.cluster_utils.Cluster`` in a subprocess (its
    own session), driven through stdin / stdout, one JSON object a line."""

    def __init__(self, f: _Fault, workers: int = 2, cpus: float = 1.0):
        self._fh = open(f.dir / "cluster.log", "w")  # noqa: SIM115
        env = dict(f.env, RAY_AUTH_MODE="disabled")
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout.devtools.chaos", "cluster", "--workers", str(workers), "--cpus", str(cpus)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._fh, text=True,
                                     start_new_session=True)
        f.watcher.add(self.proc.pid)
        self.info = self._read(180.0)

    def _read(self, timeout_s: float) -> dict:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout_s)
        if not out or not out[0]:
            raise RuntimeError(f"the cluster helper did not answer within {timeout_s:.0f} s (log {self._fh.name})")
        return json.loads(out[0])

    def remove(self, raylet_pid: int) -> dict:
        self.proc.stdin.write(json.dumps({"remove": raylet_pid}) + "\n")
        self.proc.stdin.flush()
        return self._read(120.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"stop": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                _stop_proc(self.proc)
        self._fh.close()


def fault_node_removal(f: _Fault) -> None:
    helper = _ClusterHelper(f)
    f.cleanups.append(helper.stop)
    raylets = {n["raylet_pid"]: n for n in helper.info["workers"]}
    f.env["RAY_AUTH_MODE"] = "disabled"
    cond = mid_run(f.n_episodes)
    job = f.start(f"pool.ray_address={helper.info['address']}", *f.concurrency_for(cond))

    def strike(k: int, p: Progress) -> dict | None:
        # the actors run under a worker node's raylet, not under the driver: look for them there
        actors = _actor_procs(f, job, list(raylets))
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
    f.notes.append(_strike_text("worker node removed", strikes, 1, missed, lambda s: (
        f" (node {str(s.get('node_id'))[:12]}, actor pid {s['actor_pid']}, removed in {s.get('s')} s)")))
    f.finish(job)
    f.check_final(job)
    helper.stop()


_SCENARIOS: dict[str, Callable[[_Fault], None]] = {
    "actor_sigkill_x3": fault_actor_sigkill_x3, "server_kill": fault_server_kill, "router_restart": fault_router_restart,
    "faulty_server": fault_faulty_server, "user_sim_429_500": fault_user_sim_429_500,
    "driver_sigkill_resume": fault_driver_sigkill_resume, "driver_sigterm_resume": fault_driver_sigterm_resume,
    "node_removal": fault_node_removal,
}


def run_fault(name: str, opts: ChaosOptions, root: Path, cfg, ray_tmp: str, task_ids: list[str]) -> dict[str, Any]:
    """Run one fault's scenario on ``task_ids`` and report it (a row of the table; see the module
    docstring)."""
    f = _Fault(name, opts, root, cfg, ray_tmp, task_ids)
    t0 = time.monotonic()
    error = None
    try:
        _SCENARIOS[name](f)
    except Exception as e:  # noqa: BLE001 (reported in the row: the bench goes on with the next fault)
        error = f"{type(e).__name__}: {e}"
        logger.exception("%s: the scenario failed", name)
    finally:
        for job in f.jobs:
            if job.running():
                _kill_tree(job.pid)
                job.wait(30)
        wall = time.monotonic() - t0
        for fn in reversed(f.cleanups):
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                f.notes.append(f"clean-up failed: {e!r}")
        f.watcher.scan()
        left, waited = wait_gone(f.watcher, opts.left_wait_s)
        f.watcher.close()
    left_desc = []
    for p in left:
        left_desc.append(f"{p.pid} {_cmdline(p)[:100]}")
        try:
            p.kill()  # ours: recorded as a descendant of this fault's run
        except psutil.Error:
            pass
    counts = tally(f.out)
    notes = list(f.notes) + counts.pop("notes")
    if counts["reruns"]:
        notes.append(f"{counts['reruns']} group member(s) re-run under a new id (counted as submitted)")
    if counts["unexpected_ids"]:
        notes.append(f"delivered ids that were never submitted: {counts['unexpected_ids']}")
    if counts["lost_ids"]:
        notes.append(f"lost: {counts['lost_ids']}")
    if counts["duplicated_ids"]:
        notes.append(f"duplicated: {counts['duplicated_ids']}")
    if error:
        notes.append(f"scenario error: {error}")
    notes.append(f"processes recorded {len(f.watcher.seen)}, all gone {waited:.1f} s after the last run" if not left else
                 f"{len(left)} process(es) still alive {waited:.0f} s after the last run (killed now): {left_desc[:5]}")
    held = (error is None and counts["lost"] == 0 and counts["duplicated"] == 0 and not left and counts["submitted"] > 0
            and not counts["unexpected_ids"] and all(f.checks.values()))
    v = verdict(held, f.injected)
    if f.injected is None:
        notes.append("NOT INJECTED: the scenario recorded no injection")
    elif not f.injected["complete"]:
        unit = f.injected["unit"]
        notes.append(f"NOT INJECTED: {f.injected[unit]} of {f.injected['planned']} {unit} planned (why: above)")
    row = {"fault": name, "ok": v == "ok", "verdict": v, "guarantees_held": held, "injected": f.injected,
           "submitted": counts["submitted"], "delivered": counts["delivered"], "lost": counts["lost"],
           "duplicated": counts["duplicated"], "left_behind": len(left), "statuses": counts["statuses"], "wall_s": round(wall, 1),
           "left_wait_s": round(waited, 1), "checks": f.checks, "notes": notes, "left_processes": left_desc,
           "runs": [j.record() for j in f.jobs], "dir": str(f.dir), **f.extra}
    logger.info("%s: %s", name, {"ok": "ok", "broken": "FAILED (a guarantee broke)", "not_injected": "NOT INJECTED (guarantees held)"}[v])
    return row


def run_chaos(opts: ChaosOptions, faults: list[str], on_row: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Run each fault in turn (see the module docstring); returns one row per fault.

    Args:
        on_row: called with the rows so far after each fault (e.g. to write them out).

    Raises:
        ValueError: an unknown fault name, ``opts.tasks`` < 1, or more tasks than the configured
            split (``env.task_split`` / ``env.task_ids``) holds.
    """
    from rollout.benchmarks.tau2.environment import Tau2Domain
    from rollout.core.config import load_config

    bad = [x for x in faults if x not in _SCENARIOS]
    if bad:
        raise ValueError(f"unknown fault(s) {bad}; known: {', '.join(FAULTS)}")
    if opts.tasks < 1:
        raise ValueError("--tasks must be >= 1")
    cfg = load_config(opts.config, [*BASE_OVERRIDES, *opts.overrides])
    task_ids = list(Tau2Domain(cfg.env.domain, tau2_log_level=cfg.logging.tau2_level).task_ids(cfg.env.task_split, cfg.env.task_ids))
    if len(task_ids) < opts.tasks:
        raise ValueError(f"--tasks {opts.tasks}: the {cfg.env.domain} split {cfg.env.task_split!r} holds {len(task_ids)} tasks")
    task_ids = task_ids[: opts.tasks]
    root = Path(opts.out_dir) if opts.out_dir else Path(tempfile.mkdtemp(prefix="rollout-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    logger.info("chaos bench: %d fault(s), %d tasks each, folders in %s", len(faults), opts.tasks, root)
    rows = []
    try:
        for name in faults:
            rows.append(run_fault(name, opts, root, cfg, ray_tmp, task_ids))
            if on_row is not None:
                on_row(rows)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return rows


def injected_text(injected: dict[str, Any] | None) -> str:
    """A row's ``injected`` record as the table shows it: ``3/3 kills`` (``-`` for none)."""
    if not injected:
        return "-"
    unit = injected.get("unit", "")
    return f"{injected.get(unit, 0)}/{injected.get('planned', '?')} {unit}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The bench's table: one row per fault (``ok``: ``yes``, ``NO`` for a broken guarantee,
    ``n/i`` for a fault not (fully) injected whose guarantees held; ``injected``: done / planned),
    then each fault's notes."""
    head = ("fault", "ok", "injected", "submitted", "delivered", "lost", "dup", "left", "wall s", "statuses")
    shown = {"ok": "yes", "broken": "NO", "not_injected": "n/i"}
    body = []
    for r in rows:
        st = " ".join(f"{k}={v}" for k, v in r.get("statuses", {}).items()) or "-"
        v = r.get("verdict") or ("ok" if r.get("ok") else "broken")
        body.append((r["fault"], "skip" if r.get("skipped") else shown.get(v, v), injected_text(r.get("injected")),
                     *(str(r.get(k, "-")) for k in ("submitted", "delivered", "lost", "duplicated", "left_behind")),
                     f"{r['wall_s']:.0f}" if isinstance(r.get("wall_s"), (int, float)) else "-", st))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i in (0, 2, 9) else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), "  ".join("-" * w for w in widths), *(fmt.format(*b) for b in body), "", "notes:"]
    for r in rows:
        lines.append(f"  {r['fault']}: " + "; ".join(r.get("notes", [])))
    return "\n".join(lines)


# -- the cluster helper (the only place here that imports Ray) ---------------------------------
def _cluster_main(argv: list[str]) -> int:
    """``python -m rollout.devtools.chaos cluster [--workers 2] [--cpus 1]``: start a Ray
    ``Cluster`` (a head without CPUs, ``--workers`` worker nodes with ``--cpus`` CPUs each), print
    ``{"address", "head_raylet_pid", "workers": [{"node_id", "raylet_pid"}]}`` as one JSON line,
    then obey JSON lines on stdin: ``{"remove": raylet_pid}`` removes that worker node (answering
    ``{"node_id", "s"}``, seconds), ``{"stop": true}`` or end of input shuts the cluster down."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m rollout.devtools.chaos cluster")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cpus", type=float, default=1.0)
    args = p.parse_args(argv)
    from ray.cluster_utils import Cluster

    from rollout.core.fate import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: shut the cluster down
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        nodes = [cluster.add_node(num_cpus=args.cpus) for _ in range(args.workers)]
        cluster.wait_for_nodes()

        def raylet_pid(node) -> int:
            from ray._private import ray_constants

            return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid

        by_pid = {raylet_pid(n): n for n in nodes}
        print(json.dumps({"address": cluster.address, "head_raylet_pid": raylet_pid(cluster.head_node),
                          "workers": [{"node_id": n.node_id, "raylet_pid": pid} for pid, n in by_pid.items()]}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("stop"):
                break
            node = by_pid.pop(int(cmd["remove"]))
            t0 = time.monotonic()
            cluster.remove_node(node, allow_graceful=False)
            print(json.dumps({"node_id": node.node_id, "s": round(time.monotonic() - t0, 2)}), flush=True)
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["cluster"]:
        sys.exit(_cluster_main(sys.argv[2:]))
    sys.exit("usage: python -m rollout.devtools.chaos cluster [--workers N] [--cpus C]  (the bench: python -m rollout.bench chaos)")
