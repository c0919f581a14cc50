"""Chaos bench: the main job under faults, checked for exactly-once delivery and clean exits.

``python -m rollout.bench chaos [--config configs/local.yaml] [--tasks N] [--faults a,b,...]
[--json FILE] [key=value ...]`` runs the main job (``python -m rollout run``, the CLI, in a
subprocess in its own session; gold replay on the local stack, ``N`` tasks of the configured
domain, ``rollout.n_samples_per_task=1``, ``pool.num_actors=2``, a Ray cluster of its own) once
per fault (the first ``N`` tasks of ``env.task_split``; the faults only a trainer meets run the
bench's own trainer instead, :mod:`rollout.devtools.chaos.trainer`) and reports, per fault:

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
``disk_full``
    The run folder is a tmpfs of :data:`~rollout.devtools.chaos.faults_storage.DISK_BYTES` (64
    MiB) in a mount namespace of its own (:class:`~rollout.devtools.chaos.faults_storage.TmpfsMount`:
    ``unshare -m`` as root, ``unshare -Urm`` otherwise; the runs join it with ``nsenter``, the
    bench reads it through ``/proc/<holder>/root``; nothing is mounted where any other process
    sees it). At 1 delivered with ``ceil(N/3)`` outstanding the bench fills it with zeros until
    the kernel answers ``ENOSPC``. The run must stop with exit code 4 and a ``cannot write
    <file of the run folder>: No space left on device`` error, its journal whole lines only,
    every episode journaled before the fill kept; the bench frees the space and ``--resume``
    must finish the run. Injected: ``fills``. Where no tmpfs can be mounted the run goes on
    without the fault (not injected, saying why).
``journal_torn_tail``
    As ``driver_sigkill_resume``; then, before the ``--resume``, the first half of the next
    episode's line (an undelivered episode's id in the bytes of the last line's shape) is
    appended to ``episodes.jsonl`` without a newline: the file a crash of the machine mid-write
    leaves (a killed process cannot leave it: each line is one ``write()``). The resumed run must
    set that line aside, naming its line number (its summary's ``journal_repairs`` and its log).
    Injected: ``lines``.
``journal_corrupt_line``
    Likewise, with 4 KiB of zeros written over the middle of the middle line of
    ``episodes.jsonl`` (bytes lost on the disk; the line's episode was delivered and written to
    ``samples.jsonl`` before the kill): the resumed run must name that line, run its episode
    again and hold it in the journal once. Injected: ``lines``.
``weight_update_half_done``
    The bench's own trainer (:mod:`rollout.devtools.chaos.trainer`, ``--mode weights``: the
    trainer API with the CLI's journal and files, a weight update every 3 deliveries) on two
    local servers behind a real ``sglang-router`` (``manual``, ``min_group``), the second behind
    a :class:`~rollout.devtools.chaos.proxies.WorkerProxy`; at 1 delivered with ``ceil(N/3)``
    outstanding the proxy is armed to fail the next weight update (HTTP 400, ``success: false``,
    as SGLang answers a failed load). The pool must roll it forward (``rolled_forward`` in
    ``weight_updates.jsonl``, every worker then on the new version) and no episode's calls may
    go back to an older version. Injected: ``updates_failed``.
``straggler``
    The same trainer in ``--mode steps`` (5 steps of ``collect_groups(3, max_outstanding_groups=8)``,
    ``pool.episode_timeout_s=20``), first without a straggler (``baseline/``), then with the
    second worker made 30x slower from the first delivery on (each ``/generate`` it serves waits
    3 s more): every later step must take at most 3x the baseline's median step. The row
    reports both runs' step times side by side. Injected: ``stragglers``.
``user_sim_server_death``
    ``env.user.kind=llm`` against a user simulator served by its own process (``python -m
    rollout.devtools.chaos user-sim``), SIGKILLed at 1 delivered with ``ceil(N/3)`` outstanding
    and started again on the same port 6 s later; statuses ``completed`` or ``user_error`` only.
    Injected: ``kills``.
``actor_oom``
    Ray's memory monitor kills an actor (:mod:`rollout.devtools.chaos.memory`): a throwaway
    cluster in a memory cgroup of its own (6 GiB), bind-mounted over ``/sys/fs/cgroup/memory``
    in its mount namespace so that its raylets read only its own usage; one actor per worker
    node, the second node's ``RAY_memory_usage_threshold`` 0.6 (the first's Ray's 0.95). At 1
    delivered with both actors busy and a queue, a process in the cgroup allocates what takes
    the usage past 0.6 (and far below 0.95); released once the victim is dead. Injected:
    ``oom_kills``, counted only when the victim node's raylet logged the kill of that pid.
``network_partition``
    The actors reach the router through a :class:`~rollout.devtools.chaos.proxies.PartitionProxy`
    (TCP, ``policy.router_url``, ``policy.request_timeout_s=4``); at 1 delivered with
    ``ceil(N/3)`` outstanding it stops forwarding both ways for 12 s without closing anything
    (no FIN, no RST; new connections accepted and held), then heals. The calls must time out,
    be retried and go through; statuses ``completed`` or ``policy_error`` only. Injected:
    ``partitions``.
``engine_server_kill``
    The real vLLM engine (:mod:`rollout.devtools.chaos.faults_engine`): the bench starts two vLLM
    CPU servers behind vllm-router (the checkpoint ``local.backend=vllm`` writes) and runs the job
    against them with ``policy.engine=vllm``; at 1 delivered with ``ceil(N/3)`` outstanding it
    SIGKILLs the server running the most calls (its process group) and starts it again on the same
    port (vllm-router re-sends the dead worker's calls to the live one itself; the row counts them
    from its log); statuses a random model's episodes end with, or ``policy_error``, and the server
    back and listed healthy. Injected: ``kills``. Where vLLM is not installed (``bash
    launch/install_vllm.sh``) the run goes on without the fault (not injected, saying why).

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

from rollout.devtools.chaos.job import (
    BASE_OVERRIDES,
    DEFAULT_TASKS,
    JOB_TIMEOUT_S,
    LEFT_WAIT_S,
    OK_EXIT_CODES,
    PACE_S,
    ChaosOptions,
    Fault,
    Job,
)
from rollout.devtools.chaos.procs import ProcessWatcher, wait_gone
from rollout.devtools.chaos.progress import (
    KILL_WAIT_S,
    POLL_S,
    RECOVER_POLL_S,
    JournalProgress,
    LineCounter,
    Progress,
    Strike,
    mid_run,
    run_strikes,
    strike_concurrency,
)
from rollout.devtools.chaos.report import (
    EXIT_BROKEN,
    EXIT_NOT_INJECTED,
    EXIT_OK,
    VERDICTS,
    exit_code,
    format_table,
    injected_text,
    tally,
    verdict,
)
from rollout.devtools.chaos.run import run_chaos, run_fault
from rollout.devtools.chaos.scenarios import FAULTS, SCENARIOS
from rollout.devtools.chaos.servers import USER_FAULT_PATTERN, FakeUserLLM, FaultInjectingProxy, ThreadedApp, set_generation

__all__ = [
    "BASE_OVERRIDES", "DEFAULT_TASKS", "EXIT_BROKEN", "EXIT_NOT_INJECTED", "EXIT_OK", "FAULTS", "JOB_TIMEOUT_S", "KILL_WAIT_S",
    "LEFT_WAIT_S", "OK_EXIT_CODES", "PACE_S", "POLL_S", "RECOVER_POLL_S", "SCENARIOS", "USER_FAULT_PATTERN", "VERDICTS",
    "ChaosOptions", "FakeUserLLM", "Fault", "FaultInjectingProxy", "Job", "JournalProgress", "LineCounter", "ProcessWatcher",
    "Progress", "Strike", "ThreadedApp", "exit_code", "format_table", "injected_text", "mid_run", "run_chaos", "run_fault",
    "run_strikes", "set_generation", "strike_concurrency", "tally", "verdict", "wait_gone",
]
