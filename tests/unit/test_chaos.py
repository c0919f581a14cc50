"""The chaos bench (``python -m rollout.bench chaos``): its counting, its progress-placed strikes
(against a stand-in run far faster than the bench polls), its verdicts and exit codes; and, in
the extended set, two cheap faults for real.

The real bench runs the main job in a subprocess on the local stack, SIGTERMs its driver and
resumes it, and SIGKILLs a rollout actor three times; every row must report what it injected
and 0 lost, 0 duplicated and 0 processes left behind (see :mod:`rollout.devtools.chaos`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.devtools.chaos import (
    EXIT_BROKEN,
    EXIT_NOT_INJECTED,
    EXIT_OK,
    FaultInjectingProxy,
    JournalProgress,
    Progress,
    Strike,
    exit_code,
    format_table,
    mid_run,
    run_strikes,
    strike_concurrency,
    tally,
    verdict,
)

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_tally_counts_lost_duplicated_and_reruns(tmp_path):
    _write(tmp_path / "specs.jsonl", [{"episode_id": e} for e in ("a", "b", "c", "d")])
    _write(tmp_path / "samples.jsonl", [{"status": "completed", "metadata": {"episode_id": e}} for e in ("a", "b~r1")])
    _write(tmp_path / "failed.jsonl", [{"status": "policy_error", "metadata": {"episode_id": e}} for e in ("b", "c")])
    _write(tmp_path / "filtered.jsonl", [{"status": "completed", "metadata": {"episode_id": "a"}}])
    _write(tmp_path / "episodes.jsonl", [{"metadata": {"episode_id": e}} for e in ("a", "b", "b~r1", "c", "c")])
    t = tally(tmp_path)
    assert t["submitted"] == 5  # a b c d + the re-run b~r1
    assert t["delivered"] == 4 and t["lost"] == 1 and t["lost_ids"] == ["d"]
    assert t["duplicated"] == 2 and t["duplicated_ids"] == ["a", "c"]  # a twice in the files, c twice in the journal
    assert t["statuses"] == {"completed": 2, "policy_error": 2} and t["reruns"] == 1


def test_fault_proxy_picks_faults_by_rid_only_for_episode_calls():
    proxy = FaultInjectingProxy("http://127.0.0.1:1", {"503": 0.5, "abort": 0.5}, hang_s=1.0)
    assert proxy.pick(None) is None and proxy.pick("probe") is None
    picks = [proxy.pick(f"b0:retail/{i}#0@0#{n}") for i in range(20) for n in range(5)]
    assert set(picks) == {"503", "abort"}  # rates summing to 1: every episode call is hit
    assert proxy.pick("b0:retail/1#0@0#3") == proxy.pick("b0:retail/1#0@0#3")  # deterministic


def test_fault_proxy_tops_up_every_kind_the_hash_left_out():
    kinds = ("503", "reset", "hang", "truncated", "abort")
    proxy = FaultInjectingProxy("http://127.0.0.1:1", dict.fromkeys(kinds, 0.0), hang_s=1.0, topup_every=3,
                                progress=lambda: Progress(delivered=2, submitted=10))
    assert proxy.choose("probe") is None and proxy.episode_calls == 0  # not an episode call: not counted
    got = [proxy.choose(f"b0:retail/{i}#0@0#0") for i in range(30)]
    assert [k for k in got if k] == list(kinds)  # every 3rd call until each kind was injected once, then none
    assert [i for i, k in enumerate(got) if k] == [2, 5, 8, 11, 14]
    assert dict(proxy.counts) == dict.fromkeys(kinds, 1) == dict(proxy.topped_up)
    assert proxy.first_at["hang"] == {"delivered": 2, "outstanding": 8}


def test_journal_progress_counts_complete_lines_incrementally(tmp_path):
    progress = JournalProgress(tmp_path)
    assert progress() == Progress(0, 0)  # no journal yet
    with open(tmp_path / "specs.jsonl", "w") as specs, open(tmp_path / "episodes.jsonl", "w") as eps:
        specs.write('{"episode_id": "a"}\n{"episode_id": "b"}\n\n{"episode_id": "c"}\n')
        eps.write('{"metadata": {"episode_id": "a"}}\n{"metadata": {"epi')  # the second line is being written
        specs.flush()
        eps.flush()
        p = progress()
        assert (p.delivered, p.submitted, p.outstanding) == (1, 3, 2)
        eps.write('sode_id": "b"}}\n')
        eps.flush()
        assert progress() == Progress(delivered=2, submitted=3) and str(progress()) == "2 delivered / 1 outstanding"


def test_strike_conditions():
    s = Strike(delivered=2, outstanding=5)
    assert not s.due(Progress(1, 24)) and s.due(Progress(2, 24)) and s.due(Progress(19, 24)) and not s.due(Progress(20, 24))
    assert mid_run(24) == Strike(1, 8) and mid_run(24, 8) == Strike(8, 8) and mid_run(1) == Strike(1, 1)
    with pytest.raises(ValueError):
        Strike(delivered=1, outstanding=0)  # a strike with nothing in flight is never placed
    # d + o + C <= N + 1: the config's 8 per actor fits a strike at 1 / 8 of 24; one at 8 / 8 needs 4
    assert strike_concurrency(24, Strike(1, 8), num_actors=2, per_actor=8) == 8
    assert strike_concurrency(24, Strike(8, 8), num_actors=2, per_actor=8) == 4
    assert strike_concurrency(4, Strike(2, 2), num_actors=2, per_actor=8) == 1  # too few tasks: at least 1


class FastRun:
    """A stand-in run far faster than the bench's polling: each poll interval (one call of
    :meth:`sleep`) it delivers ``per_poll`` episodes, except while generation is held, when only
    the ``in_flight`` episodes past their generation may still be delivered (one a poll). A
    killed actor is back ``restart_polls`` polls after the kill. Time is counted in polls."""

    def __init__(self, total: int = 24, per_poll: int = 3, in_flight: int = 4, restart_polls: int = 40):
        self.total, self.per_poll, self.in_flight, self.restart_polls = total, per_poll, in_flight, restart_polls
        self.delivered = self.polls = self.drained = 0
        self.held = False
        self.killed_at: int | None = None
        self.kills: list[Progress] = []
        self.held_at_kill: list[bool] = []

    def sleep(self, _s: float) -> None:
        self.polls += 1
        if self.held:
            n = min(1, self.in_flight - self.drained)
            self.drained += n
        else:
            n = self.per_poll
        self.delivered = min(self.total, self.delivered + n)

    def progress(self) -> Progress:
        return Progress(self.delivered, self.total)

    def running(self) -> bool:
        return self.delivered < self.total

    def strike(self, k: int, p: Progress) -> dict:
        self.kills.append(p)
        self.held_at_kill.append(self.held)
        self.killed_at = self.polls
        return {"victim": k}

    def hold(self) -> None:
        self.held, self.drained = True, 0

    def release(self) -> None:
        self.held = False

    def recovered(self, k: int) -> bool:
        return self.polls - self.killed_at >= self.restart_polls


def _strikes(run: FastRun, first: Strike, count: int, hold: bool = True, recover: bool = True):
    return run_strikes(first, count, progress=run.progress, running=run.running, strike=run.strike,
                       hold=run.hold if hold else None, release=run.release if hold else None,
                       recovered=run.recovered if recover else None, sleep=run.sleep, clock=lambda: float(run.polls), timeout_s=1e6)


def test_held_strikes_land_three_kills_on_a_fast_run_and_each_is_placed_in_flight():
    run = FastRun()
    strikes, missed = _strikes(run, Strike(delivered=1, outstanding=5), 3)
    assert missed is None and len(strikes) == 3 and len(run.kills) == 3
    assert all(p.delivered >= 1 and p.outstanding >= 5 for p in run.kills)  # only while work is in flight
    assert run.held_at_kill == [False, False, False]  # each kill strikes a running system; the hold comes after
    assert [s["delivered"] for s in strikes] == [p.delivered for p in run.kills]
    for before, s in zip(strikes, strikes[1:]):  # the next kill one delivery (or more) after the hold ended
        assert s["delivered"] >= before["after"]["delivered"] + 1
    assert all(s["after"]["delivered"] - s["delivered"] <= run.in_flight for s in strikes)  # the hold let through at most those
    assert not run.held and run.running()  # released; the run goes on


def test_without_the_hold_the_same_fast_run_ends_before_the_second_kill():
    run = FastRun()
    strikes, missed = _strikes(run, Strike(delivered=1, outstanding=5), 3, hold=False)
    assert len(strikes) == 1 and "not back when the run ended" in missed and not run.running()


def test_a_strike_is_never_placed_when_nothing_is_outstanding_and_says_so():
    run = FastRun(total=6, per_poll=3)  # 3 delivered / 3 outstanding, then the end: never 5 outstanding
    strikes, missed = _strikes(run, Strike(delivered=1, outstanding=5), 1, recover=False)
    assert strikes == [] and run.kills == [] and "not due before the run ended" in missed


def _row(fault: str, v: str, injected: dict | None = None, **counts) -> dict:
    return {"fault": fault, "ok": v == "ok", "verdict": v, "injected": injected, "wall_s": 1.0, "notes": [],
            "submitted": 24, "delivered": 24, "lost": 0, "duplicated": 0, "left_behind": 0, **counts}


def test_a_fault_not_injected_is_told_apart_from_a_broken_guarantee():
    done = {"unit": "kills", "kills": 3, "planned": 3, "complete": True}
    short = {"unit": "kills", "kills": 1, "planned": 3, "complete": False}
    assert verdict(True, done) == "ok"
    assert verdict(True, short) == "not_injected" and verdict(True, None) == "not_injected"
    assert verdict(False, done) == "broken" and verdict(False, short) == "broken"
    ok, n_i, broken = _row("a", "ok", done), _row("b", "not_injected", short), _row("c", "broken", done, lost=2)
    assert exit_code([ok, ok]) == EXIT_OK == 0
    assert exit_code([ok, n_i]) == EXIT_NOT_INJECTED != EXIT_BROKEN
    assert exit_code([n_i, broken]) == EXIT_BROKEN == 1  # a broken guarantee takes precedence
    assert exit_code([{"fault": "old", "ok": False}]) == EXIT_BROKEN  # a row without a verdict is not a pass
    table = format_table([ok, n_i, broken])
    lines = {line.split()[0]: line.split() for line in table.splitlines()[2:5]}
    assert lines["a"][1:4] == ["yes", "3/3", "kills"] and lines["b"][1:4] == ["n/i", "1/3", "kills"] and lines["c"][1] == "NO"


RAYLET_LOG = """[2026-11-27 19:57:09,149 I 18357 18377] (raylet) threshold_memory_monitor.cc:128: Node memory usage above threshold, used: 3872460800, threshold_bytes: 3865470720, total bytes: 6442450944, threshold fraction: 0.600000
[2026-11-27 19:57:10,278 I 18357 18357] (raylet) node_manager.cc:3199: Killing 1 worker(s), kill details: Memory on the node (IP: 192.0.2.2, ID: 2a7b) was 3.86GB used / 6.00GB limit (0.644119)
OOM kill reason: Memory usage 3872460800B exceeded threshold of 3865470720B (60.0% of 6442450944B limit)
Ray killed 1 worker(s) based on the killing policy
Considered workers: [
Selected to kill: (Actor(c954804a35ec7cf59fa88b6101000000): job ID=01000000, lease ID=0100, task name=A.__init__, required resources={CPU: 1}, pid=18524, actual memory used=0.05GB, worker ID=75f3
]
"""


def test_oom_kills_reads_which_worker_rays_memory_monitor_chose_and_why(tmp_path):
    from rollout.devtools.chaos.memory import oom_kills

    (tmp_path / "raylet.2.out").write_text(RAYLET_LOG)  # the victim node's (a real log, shortened)
    (tmp_path / "raylet.out").write_text("[2026-11-27 19:57:17,416 I 17952 17952] (raylet) agent_manager.cc:116: Killing agent x, pid 17980.\n")
    assert oom_kills(tmp_path) == {"kills": [{"raylet_pid": 18357, "pid": 18524, "what": "Actor(c954804a35ec7cf59fa88b6101000000)",
                                              "reason": "Memory usage 3872460800B exceeded threshold of 3865470720B (60.0% of 6442450944B limit)"}]}


def test_the_bench_knows_every_fault_of_issue_32_each_with_a_scenario():
    from rollout.devtools.chaos import FAULTS, SCENARIOS

    assert len(FAULTS) >= 12 and list(FAULTS) == list(SCENARIOS) and len(set(FAULTS)) == len(FAULTS)
    assert {"disk_full", "journal_torn_tail", "journal_corrupt_line", "weight_update_half_done", "straggler", "user_sim_server_death",
            "actor_oom", "network_partition", "engine_server_kill"} <= set(FAULTS)
