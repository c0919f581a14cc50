"""The pool's pure parts (no Ray, no server): the exactly-once ledger, and the training streams
fed by hand (samples made once, the zero-variance warning of collect_groups, groups made and
not taken)."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging

import pytest

from rollout.core.config import load_config
from rollout.core.groups import Rerun
from rollout.core.pool.ledger import POOL_COUNTERS, EpisodeLedger
from rollout.core.pool.specs import make_specs
from rollout.core.pool.streams import FILTERED_WARN_EVERY, Feed, TrainingStreams
from rollout.core.records import EpisodeStatus, InteractionResult


class CountingToSample:
    """InteractionResult.to_sample (the ledger's default), counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, result):
        self.calls += 1
        return result.to_sample()


class FakeJournal:
    def __init__(self, specs=(), delivered=()):
        self.specs = list(specs)
        self.delivered = {s.episode_id: s for s in delivered}
        self.recorded = []
        self.committed = 0  # samples made durable by commit()

    def record_specs(self, specs):
        self.specs += [s for s in specs if s not in self.specs]

    def record(self, sample, weight_version=None, sync=True):
        self.recorded.append(sample)
        if sync:
            self.commit()

    def commit(self):
        self.committed = len(self.recorded)


def _result(spec, reward=1.0, status=EpisodeStatus.COMPLETED, **meta) -> InteractionResult:
    return InteractionResult(spec, status, reward, None, metadata=dict(meta))


def test_the_ledger_refuses_repeats_counts_deliveries_and_hands_back_only_the_undelivered():
    ledger = EpisodeLedger(CountingToSample())
    specs = make_specs("retail", ["0", "1"], 2, prefix="b0:")
    ledger.check_new(specs)
    ledger.register(specs)
    for s in specs:
        ledger.submitted(s)
    with pytest.raises(ValueError, match=f"episode {specs[0].episode_id} was already submitted"):
        ledger.check_new(specs[:1])
    with pytest.raises(ValueError, match="already submitted"):
        ledger.check_new([*make_specs("retail", ["9"], 1), *make_specs("retail", ["9"], 1)])
    ledger.deliver(_result(specs[0], interruptions=1, continued_turns=1))
    ledger.deliver(_result(specs[1], status=EpisodeStatus.ENV_ERROR, reward=0.0))
    assert ledger.is_delivered(specs[0].episode_id) and not ledger.is_delivered(specs[2].episode_id)
    retried = [dataclasses.replace(s, attempt=2) for s in specs[1:]]  # a retry of each, as in flight
    back = ledger.hand_back(retried)
    assert [s.episode_id for s in back] == [s.episode_id for s in specs[2:]] and {s.attempt for s in back} == {0}
    c = ledger.counts
    assert set(POOL_COUNTERS) <= set(c) and c["episodes_submitted"] == 4 and c["episodes_delivered"] == 2
    assert (c["status_completed"], c["status_env_error"], c["episodes_interrupted"], c["episodes_continued"]) == (1, 1, 1, 1)
    assert c["episodes_undelivered"] == 2 and c["episodes_restarted"] == 0
    assert ledger.submitted_ids == {s.episode_id for s in specs}
    rerun = ledger.rerun_spec(Rerun(specs[1].group_id, 1, 2), weight_version=7)
    assert (rerun.episode_id, rerun.attempt, rerun.weight_version, rerun.seed) == (specs[1].episode_id + "~r2", 0, 7, specs[1].seed)


def test_restore_replays_the_delivered_in_order_and_returns_the_undelivered_and_their_reruns():
    ledger = EpisodeLedger(CountingToSample())
    specs = make_specs("retail", ["0", "1"], 2, prefix="b0:")
    done = [ledger.deliver(_result(s)).sample for s in specs[:3]]  # samples as a journal holds them
    fresh = EpisodeLedger(CountingToSample())
    replayed = []

    def replay(sample):  # member 1 of group 0 asks for a re-run
        replayed.append(sample.episode_id)
        return [Rerun(sample.group_id, 1, 1)] if sample.episode_id == specs[1].episode_id else []

    todo = fresh.restore(FakeJournal(specs, done), replay, weight_version=3)
    assert replayed == [s.episode_id for s in specs[:3]]
    assert [s.episode_id for s in todo] == [specs[3].episode_id, specs[1].episode_id + "~r1"]
    assert todo[1].weight_version == 3 and fresh.counts["episodes_restored"] == 3 and fresh.counts["episodes_submitted"] == 0
    assert all(fresh.is_delivered(s.episode_id) for s in specs[:3]) and fresh.any_submitted
    assert fresh.submitted_ids == {s.episode_id for s in specs} | {specs[1].episode_id + "~r1"}


def _cfg(*overrides: str):
    return load_config(None, ["policy.router_url=http://127.0.0.1:9", "pool.num_actors=1", "pool.max_concurrent_episodes=2",
                              "rollout.n_samples_per_task=2", *overrides])


class HandFeed:
    """A pool stand-in: each submitted task's episodes end at once with the reward ``reward_of(task_id, index)``."""

    def __init__(self, reward_of):
        self.ledger = EpisodeLedger()
        self.queue: collections.deque[InteractionResult] = collections.deque()
        self.reward_of = reward_of
        self.batches = itertools.count()
        self.streams: TrainingStreams | None = None

    def submit_tasks(self, task_ids, n_samples_per_task=None):
        specs = make_specs("retail", task_ids, n_samples_per_task or 2, prefix=f"b{next(self.batches)}:")
        self.streams.expect(specs)
        self.queue.extend(_result(s, reward=self.reward_of(s.task_id, s.sample_index)) for s in specs)
        return specs

    def feed(self) -> Feed:
        return Feed(next_delivery=lambda t: self.ledger.deliver(self.queue.popleft()) if self.queue else None,
                    resubmit=lambda rr: None, submit_tasks=self.submit_tasks, weight_version=lambda: 0,
                    num_outstanding=lambda: len(self.queue))


def test_a_journaled_delivery_is_exported_once_and_the_streams_get_the_same_sample():
    """With a journal attached, each delivered result becomes a TrainingSample once: the journal
    records it and the groups hand out that same object."""
    exporter = CountingToSample()
    ledger = EpisodeLedger(exporter)
    journal = FakeJournal()
    ledger.attach_journal(journal)
    specs = make_specs("retail", ["0"], 2, prefix="b0:")
    ledger.register(specs)
    assert journal.specs == specs
    todo = collections.deque(_result(s, reward=float(s.sample_index)) for s in specs)
    streams = TrainingStreams(_cfg(), Feed(next_delivery=lambda t: ledger.deliver(todo.popleft()) if todo else None,
                                           resubmit=lambda rr: None, submit_tasks=lambda *a: [], weight_version=lambda: 0,
                                           num_outstanding=lambda: len(todo)))
    streams.expect(specs)
    assert streams.ensure_item(None, excluded=False)
    group = streams.take_item(excluded=False)
    assert exporter.calls == 2 and len(journal.recorded) == 2
    assert [id(s) for s in group] == [id(s) for s in journal.recorded]


def test_collect_groups_warns_every_50_groups_filtered_in_a_row_and_goes_on(caplog):
    """Every group filtered (equal rewards): collect_groups would go on for ever (unchanged), but a
    WARNING says so every FILTERED_WARN_EVERY groups; a kept group ends the streak."""
    solved = {"mixed": False}
    hand = HandFeed(lambda tid, i: float(i) if solved["mixed"] else 1.0)
    streams = hand.streams = TrainingStreams(_cfg("rollout.filter_groups=zero_variance"), hand.feed())
    step = streams.collect(1, itertools.cycle(["0", "1"]), None, None)
    caplog.set_level(logging.WARNING, logger="rollout.core.pool.streams")
    while streams.counts["groups_filtered"] < 2 * FILTERED_WARN_EVERY + 10:
        assert not step(None)
    warnings = [r for r in caplog.records if "were all filtered" in r.getMessage()]
    assert len(warnings) == 2 and all(r.levelno == logging.WARNING for r in warnings)
    assert "last 50 complete groups" in warnings[0].getMessage() and "rollout.filter_groups=null" in warnings[0].getMessage()
    solved["mixed"] = True  # the next groups have a spread: one is kept, collect_groups returns
    while not step(None):
        pass
    (group,) = streams.take_groups(1)
    assert [s.reward for s in group] == [0.0, 1.0] and streams.counts["groups_kept"] == 1
    caplog.clear()
    solved["mixed"] = False
    step = streams.collect(1, itertools.cycle(["0"]), None, None)
    for _ in range(2 * (FILTERED_WARN_EVERY - 1)):  # 49 filtered after the kept one: no warning yet
        assert not step(None)
    assert not [r for r in caplog.records if "were all filtered" in r.getMessage()]


def test_a_group_made_and_not_taken_is_handed_out_by_the_next_group_call():
    """What a cancelled async step leaves behind: ensure_item delivered a group, take_item never
    ran. The next stream call, or collect_groups, hands that group out first."""
    hand = HandFeed(lambda tid, i: float(i))
    streams = hand.streams = TrainingStreams(_cfg(), hand.feed())
    hand.submit_tasks(["0", "1"])
    assert streams.ensure_item(None, excluded=False)  # group 0 is waiting; its taker was "cancelled"
    assert hand.queue  # group 1 not delivered yet
    step = streams.collect(1, None, None, None)
    assert step(None)  # done at once: the waiting group counts
    (first,) = streams.take_groups(1)
    assert first[0].metadata["task_id"] == "0"
    assert streams.ensure_item(None, excluded=False)
    second = streams.take_item(excluded=False)
    assert second[0].metadata["task_id"] == "1"
    assert not streams.ensure_item(None, excluded=True) and streams.take_item(excluded=True) is None


def test_a_pool_call_commits_the_journal_before_it_hands_out_what_it_delivered_one_commit_per_call():
    """The pool's lock runs the ledger's commit when a call's outermost hold ends: a group handed
    out by a stream call was durable before it came out, both members with one commit; a nested
    hold (a call inside a call) commits only at the outer end."""
    from rollout.core.pool.steps import StepRunner

    commits: list[int] = []

    class CountingJournal(FakeJournal):
        def commit(self):
            if len(self.recorded) > self.committed:
                commits.append(len(self.recorded) - self.committed)
            super().commit()

    ledger = EpisodeLedger(CountingToSample())
    journal = CountingJournal()
    ledger.attach_journal(journal)
    runner = StepRunner(progress=lambda: ledger.counts["episodes_delivered"], on_release=ledger.commit)
    specs = make_specs("retail", ["0", "1"], 2, prefix="b0:")
    ledger.register(specs)
    todo = collections.deque(_result(s, reward=float(s.sample_index)) for s in specs)
    seen_at_delivery = []

    def next_delivery(t):
        seen_at_delivery.append(journal.committed)
        return ledger.deliver(todo.popleft()) if todo else None

    streams = TrainingStreams(_cfg(), Feed(next_delivery=next_delivery, resubmit=lambda rr: None, submit_tasks=lambda *a: [],
                                           weight_version=lambda: 0, num_outstanding=lambda: len(todo)))
    streams.expect(specs)
    group = runner.next(lambda t: streams.ensure_item(t, False), lambda: streams.take_item(False), None)
    assert [s.episode_id for s in group] == [s.episode_id for s in specs[:2]]
    assert journal.committed == 2 and commits == [2] and seen_at_delivery == [0, 0]  # written during the call, durable at its end
    with runner.lock:
        with runner.lock:
            group = runner.next(lambda t: streams.ensure_item(t, False), lambda: streams.take_item(False), None)
        assert commits == [2]  # inner holds ended: nothing committed yet
    assert commits == [2, 2] and journal.committed == 4


def test_an_actor_death_names_rays_memory_monitor_when_rays_error_does():
    from ray.exceptions import ActorUnavailableError, OutOfMemoryError, RayActorError

    from rollout.core.pool.scheduler import death_cause

    oom = RayActorError(error_msg="The actor died unexpectedly before finishing this task. Worker exit type: NODE_OUT_OF_MEMORY "
                                  "Worker exit detail: Task was killed due to the node running low on memory.")
    assert death_cause(oom) == "RayActorError (killed by Ray's memory monitor: its node ran low on memory)"
    assert "memory monitor" in death_cause(OutOfMemoryError("Task was killed due to the node running low on memory."))
    restarted = ActorUnavailableError("The actor is temporarily unavailable: IOError: The actor was restarted", None)
    assert death_cause(restarted) == "ActorUnavailableError"  # Ray does not say why a restarted actor died
