"""Rollout replay (pure: no Ray, no server): a run journaled by a live pool's parts is replayed
through ReplayPool, and a trainer that makes the run's calls gets the same groups, in the same
order, with the same exclusions, although the replay delivers at other moments than the run did.

The "live" pool here is RolloutPool's own parts (EpisodeLedger, TrainingStreams, RunJournal) over a
simulated scheduler: episodes run a few at a time and end in a random order; each samples at the
trainer's version when it starts; some fail (env_error) and are re-run; slow ones go stale across
weight updates; polls deliver a random number of episodes (timing).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import random

import pytest

from rollout.core.config import load_config
from rollout.core.groups import Excluded
from rollout.core.journal import DELIVERY_VERSION_KEY, EPISODES_FILE, EVENTS_FILE, JournalError, RunJournal, load_run
from rollout.core.pool import ReplayPool, RolloutPool
from rollout.core.pool.ledger import EpisodeLedger
from rollout.core.pool.replay_feed import result_from_sample
from rollout.core.pool.specs import make_specs
from rollout.core.pool.streams import Feed, TrainingStreams
from rollout.core.records import EpisodeStatus, InteractionResult
from rollout.core.trajectory import Trajectory


def _cfg(out, *overrides: str):
    return load_config(None, ["policy.router_url=http://127.0.0.1:9", "pool.num_actors=1", "pool.max_concurrent_episodes=6",
                              "rollout.n_samples_per_task=2", "rollout.filter_groups=zero_variance", "rollout.max_staleness=1",
                              "rollout.max_member_reruns=1", f"rollout.output_dir={out}", *overrides])


class SimulatedPool:
    """RolloutPool's trainer API over its own parts and a simulated scheduler (see the module
    docstring); journals into ``journal`` as the live pool does."""

    def __init__(self, cfg, journal: RunJournal, seed: int):
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.version = 0
        self.ledger = EpisodeLedger(weight_version=lambda: self.version)
        self.ledger.attach_journal(journal)
        self.pending: collections.deque = collections.deque()
        self.running: list = []  # (spec, version at start)
        self.streams = TrainingStreams(cfg, Feed(next_delivery=self._next, resubmit=self._resubmit, submit_tasks=self.submit_tasks,
                                                 weight_version=lambda: self.version, num_outstanding=self._outstanding))
        self.batches = itertools.count()
        self.cancelling = False

    def _outstanding(self) -> int:
        return len(self.pending) + len(self.running)

    def submit_tasks(self, task_ids, n_samples_per_task=None, weight_version=None):
        specs = make_specs("retail", task_ids, n_samples_per_task or self.cfg.rollout.n_samples_per_task, prefix=f"b{next(self.batches)}:",
                           weight_version=self.version)
        self.streams.expect(specs)
        self.ledger.register(specs)
        for s in specs:
            self.ledger.submitted(s)
            self.pending.append(s)
        return specs

    def _resubmit(self, reruns):
        for rr in reruns:
            spec = self.ledger.rerun_spec(rr, self.version)
            self.ledger.submitted(spec)
            self.pending.append(spec)

    def _dispatch(self):
        while self.pending and len(self.running) < self.cfg.pool.max_concurrent_episodes:
            self.running.append((self.pending.popleft(), self.version))

    def _outcome(self, spec, version) -> InteractionResult:
        digest = sum(map(ord, spec.episode_id)) + 7 * spec.sample_index
        status = EpisodeStatus.ENV_ERROR if digest % 9 == 0 and "~r" not in spec.episode_id else EpisodeStatus.COMPLETED
        reward = float(self.rng.random() < 0.5) if status == EpisodeStatus.COMPLETED else 0.0
        traj = Trajectory(prompt_ids=[1, 2, digest % 50], response_ids=[3, 4, 5], loss_mask=[1, 1, 0],
                          rollout_log_probs=[-0.1 * (digest % 7), -0.25, 0.0], weight_versions=[str(version)], generation_spans=[(0, 2)])
        return InteractionResult(spec, status, reward, traj, messages=[{"role": "user", "content": spec.task_id}],
                                 metadata={"termination_reason": "user_stop", "turns": 1})

    def _next(self, timeout_s):
        if self.cancelling:
            if not self.running:
                return None
            spec, _ = self.running.pop(0)
            return self.ledger.deliver(InteractionResult(spec, EpisodeStatus.CANCELLED, 0.0, None,
                                                         metadata={"termination_reason": "cancelled", "error": None}))
        self._dispatch()
        if not self.running:
            return None
        # the oldest usually ends first, but not always: a slow one lingers across updates
        i = 0 if self.rng.random() < 0.6 else self.rng.randrange(len(self.running))
        spec, version = self.running.pop(i)
        return self.ledger.deliver(self._outcome(spec, version))

    # -- the trainer API (RolloutPool's, over the parts) ---------------------------------------
    def prefetch(self, n, tasks, n_samples_per_task=None, in_flight=False):
        return self.streams.prefetch(n, tasks, n_samples_per_task, in_flight)

    def poll(self, timeout_s=0.0):
        n = 0
        for _ in range(self.rng.randrange(0, 4)):  # what ends within the timeout: timing
            if not self.streams.pump(None):
                break
            n += 1
        return n

    def collect_groups(self, b, tasks, *, abort_surplus=True, max_outstanding_groups=None, timeout_s=None):
        step = self.streams.collect(b, tasks, None, max_outstanding_groups)
        while not step(None):
            pass
        if abort_surplus:
            self.cancel_outstanding()
        return self.streams.take_groups(b)

    def cancel_outstanding(self, timeout_s=None):
        n = self._outstanding()
        self.ledger.journal_cancel(self.version)
        self.streams.abandon_open_groups()
        while self.pending:  # never started: delivered cancelled, not journaled (as RolloutPool does)
            r = InteractionResult(self.pending.popleft(), EpisodeStatus.CANCELLED, 0.0, None,
                                  metadata={"termination_reason": "cancelled", "error": None})
            self.streams.add(self.ledger.deliver(r, journal=False))
        self.cancelling = True  # running: cancelled on the actors, delivered as they return (journaled)
        while self.streams.pump(None):
            pass
        self.cancelling = False
        return n

    def update_weights_from_disk(self, path, weight_version):
        self.version = int(weight_version)
        return {}

    def excluded(self):
        while (e := self.streams.take_excluded()) is not None:
            yield e

    def groups(self):
        while self.streams.ensure_item(None, excluded=False):
            yield self.streams.take_item(excluded=False)

    @property
    def submitted_ids(self):
        return self.ledger.submitted_ids


def train_like_grpo(pool, steps: int, b: int, abort_surplus: bool, seed: int) -> list[dict]:
    """launch/train_grpo_tiny.py's calls on the pool (training replaced by a random number of
    polls); returns per step the groups handed out and the exclusions, as (id, reason)."""
    rng = random.Random(seed)
    tasks = itertools.cycle([str(t) for t in range(10)])
    log = []
    pool.prefetch(b, tasks)
    for step in range(steps):
        last = step + 1 == steps
        groups = pool.collect_groups(b, tasks, abort_surplus=abort_surplus, max_outstanding_groups=b)
        for _ in range(rng.randrange(1, 5)):  # "training": the rollout goes on meanwhile
            if not last:
                pool.prefetch(b - 1, tasks)
            pool.poll(timeout_s=0.0)
        if not last:
            pool.prefetch(b, tasks)
            pool.poll(timeout_s=0.0)
        pool.update_weights_from_disk("unused", weight_version=step + 1)
        log.append({"groups": [[(s.episode_id, s.tokens, s.loss_mask, s.rollout_log_probs, s.reward) for s in g] for g in groups],
                    "excluded": [(e.sample.episode_id, e.reason) for e in pool.excluded()]})
    pool.cancel_outstanding()
    log.append({"groups": [[(s.episode_id, s.tokens, s.loss_mask, s.rollout_log_probs, s.reward) for s in g] for g in pool.groups()],
                "excluded": [(e.sample.episode_id, e.reason) for e in pool.excluded()]})
    return log


def _live_run(tmp_path, seed: int, abort_surplus: bool, steps: int = 6, b: int = 3, *overrides: str):
    out = tmp_path / f"run{seed}"
    cfg = _cfg(out, *overrides)
    journal = RunJournal.open(out, cfg)
    (out / "config.yaml").write_text(cfg.to_yaml())
    live = SimulatedPool(cfg, journal, seed)
    log = train_like_grpo(live, steps, b, abort_surplus, seed)
    journal.close("finished")
    return out, cfg, live, log


def _reasons(log) -> collections.Counter:
    return collections.Counter(r for step in log for _, r in step["excluded"])


@pytest.mark.parametrize("seed,abort_surplus", [(1, False), (2, False), (3, True), (4, True), (5, False)])
def test_a_trainer_making_the_runs_calls_gets_the_same_groups_in_the_same_order_with_the_same_exclusions(tmp_path, seed, abort_surplus):
    out, cfg, live, live_log = _live_run(tmp_path, seed, abort_surplus)
    reasons = _reasons(live_log)
    assert reasons["zero_variance"] and reasons["env_error"], reasons  # the run had exclusions to reproduce
    replay = RolloutPool.replay(out)
    replay_log = train_like_grpo(replay, 6, 3, abort_surplus, seed)
    assert replay_log == live_log
    assert replay.submitted_ids == live.submitted_ids
    st = replay.stats()
    assert st["replay_episodes_left"] == 0 and st["replay_skipped"] == 0 and st["weight_updates"] == 6


def test_staleness_at_delivery_and_at_hand_over_is_judged_at_the_runs_versions(tmp_path):
    """Across seeds, the runs drop stale episodes (at delivery and at hand-over, where a waiting
    group loses a member that went stale); the replays drop the same ones. (Groups with a failed
    member are dropped here, not re-run: GroupAssembler.pop_ready can schedule a late re-run for a
    group it then drops, whose delivery the live pool refuses with a KeyError.)"""
    stale = 0
    for seed in range(10, 14):
        out, cfg, live, live_log = _live_run(tmp_path, seed, False, 6, 3, "rollout.max_staleness=0", "rollout.on_group_failure=drop")
        stale += _reasons(live_log)["stale"]
        assert train_like_grpo(ReplayPool.open(out), 6, 3, False, seed) == live_log
    assert stale > 0


def test_cancels_are_replayed_where_the_run_made_them(tmp_path):
    """collect_groups(abort_surplus=True): each call's cancel hands back what was running
    (journaled, cancelled) and what had not started (never journaled: the replay makes it
    cancelled, as the run did); the open groups' members are group_cancelled."""
    out, cfg, live, live_log = _live_run(tmp_path, 3, True, 6, 3, "pool.max_concurrent_episodes=4")
    record = load_run(out)
    assert len(record.cancels) == 7  # one per collect_groups, and the last one
    assert _reasons(live_log)["group_cancelled"] > 0
    never_journaled = {s.episode_id for s in record.specs} - {s.episode_id for s, _ in record.episodes}
    assert never_journaled  # queued when a cancel came: delivered cancelled, not journaled
    replay = ReplayPool.open(out)
    assert train_like_grpo(replay, 6, 3, True, 3) == live_log
    assert replay.stats()["episodes_cancelled_outstanding"] > 0


def test_a_consumer_that_never_updates_follows_the_runs_versions_and_cancels(tmp_path):
    """The CLI's way (stream(excluded=True), no weight update) over a GRPO-like run: every
    episode reaches it exactly once, kept or excluded, and the run's cancels are replayed."""
    out, cfg, live, live_log = _live_run(tmp_path, 4, True)
    pool = ReplayPool.open(out)
    seen = []
    for item in pool.stream(excluded=True):
        seen += [item.sample.episode_id] if isinstance(item, Excluded) else [s.episode_id for s in item]
    assert sorted(seen) == sorted(live.submitted_ids) == sorted(pool.submitted_ids)
    last = max(v for _, v in load_run(out).episodes)
    assert last >= 5 and pool.weight_version == pool.stats()["weight_version"] == last  # the run's, followed
    assert pool.stats()["groups_cancelled"] > 0


def test_collect_groups_returns_fewer_groups_when_the_journal_is_exhausted(tmp_path, caplog):
    out, cfg, live, live_log = _live_run(tmp_path, 5, False)
    n_groups = sum(len(step["groups"]) for step in live_log)
    pool = ReplayPool.open(out)
    caplog.set_level(logging.WARNING, logger="rollout.core.pool.streams")
    got = pool.collect_groups(1000, itertools.cycle(["never", "read"]), abort_surplus=False)
    assert 0 < len(got) <= n_groups
    assert any("no task left to submit" in r.getMessage() for r in caplog.records)
    assert pool.collect_groups(1, None) == [] and list(pool.groups()) == []
    assert pool.prefetch(4, iter(["x"])) == 0 and pool.poll(0.5) == 0 and pool.num_outstanding == 0
    with pytest.raises(RuntimeError, match="runs nothing"):
        pool.submit_tasks(["0"])


def test_the_sample_mode_and_the_trainer_api_streams_over_a_replay(tmp_path):
    """samples() yields every journaled episode's trainable samples once, re-runs included (others
    through excluded()), in the run's order, each split by the sample mode; results() rebuilds
    each journaled result (to_sample gives the sample back)."""
    out, cfg, live, live_log = _live_run(tmp_path, 1, False)
    record = load_run(out)
    pool = ReplayPool.open(out, dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, sample_mode="per_turn")))
    trained = [s.episode_id for s in pool.samples()]
    excluded = [e.sample.episode_id for e in pool.excluded()]
    assert any("~r" in i for i in trained) and pool.stats()["replay_skipped"] == 0
    assert sorted(trained + excluded) == sorted(s.episode_id for s, _ in record.episodes)
    results = list(ReplayPool.open(out).results())
    assert [r.spec.episode_id for r in results] == [s.episode_id for s, _ in record.episodes]
    for r, (s, _) in zip(results, record.episodes):
        assert r.to_sample().to_dict() == {**s.to_dict(), "messages": s.messages}
    assert result_from_sample(record.episodes[0][0]).trajectory.tokens == record.episodes[0][0].tokens


def test_every_replayed_sample_carries_episode_id_and_turn_indices_also_from_an_older_journal(tmp_path):
    """The journal's lines have them at the top level; a replay hands them out on every stream,
    from a journal written before they were top-level too (read from the metadata)."""
    out, cfg, live, live_log = _live_run(tmp_path, 3, True)  # with cancels: journaled episodes without a call
    lines = [json.loads(x) for x in (out / EPISODES_FILE).read_text().splitlines()]
    assert all(x["episode_id"] == x["metadata"]["episode_id"] and x["turn_indices"] == ([0] if x["generation_spans"] else []) for x in lines)
    assert {len(x["turn_indices"]) for x in lines} == {0, 1}  # one-turn episodes and cancelled ones without a call
    for older in (False, True):
        if older:
            for x in lines:
                del x["episode_id"], x["turn_indices"]
            (out / EPISODES_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
        per_turn = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, sample_mode="per_turn"))
        got = []
        for item in ReplayPool.open(out, per_turn).stream(excluded=True):
            got += [item.sample] if isinstance(item, Excluded) else item
        assert sorted({s.episode_id for s in got}) == sorted(live.submitted_ids), older
        assert all(s.episode_id == s.metadata["episode_id"] and s.turn_indices == ([0] if s.generation_spans else []) for s in got), older
        assert all(s.to_dict()["episode_id"] == s.episode_id for s in got)


def test_the_journal_records_each_deliverys_trainer_version_and_reads_it_back_out(tmp_path):
    out, cfg, live, live_log = _live_run(tmp_path, 2, False)
    lines = [json.loads(x) for x in (out / EPISODES_FILE).read_text().splitlines()]
    versions = [x["metadata"][DELIVERY_VERSION_KEY] for x in lines]
    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] >= 5
    assert all(DELIVERY_VERSION_KEY not in s.metadata for s, _ in load_run(out).episodes)
    resumed = RunJournal.open(out, cfg, resume=True)  # resume reads the samples as they were handed out
    assert all(DELIVERY_VERSION_KEY not in s.metadata for s in resumed.delivered.values())
    resumed.close("finished")


def test_an_older_journal_still_replays_and_says_what_it_cannot_reproduce(tmp_path, caplog):
    """No delivery versions, no events.jsonl: every episode is due at once (a poll delivers what
    the run delivered after the next update), no cancel is replayed; without staleness the groups
    are still the same, in the same order, and so are the exclusions up to the final cancel."""
    out, cfg, live, live_log = _live_run(tmp_path, 1, False, 6, 3, "rollout.max_staleness=null")
    lines = [json.loads(x) for x in (out / EPISODES_FILE).read_text().splitlines()]
    for x in lines:
        del x["metadata"][DELIVERY_VERSION_KEY]
    (out / EPISODES_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    (out / EVENTS_FILE).unlink()
    caplog.set_level(logging.WARNING)
    replay = ReplayPool.open(out)
    replay_log = train_like_grpo(replay, 6, 3, False, 1)
    assert [s["groups"] for s in replay_log[:-1]] == [s["groups"] for s in live_log[:-1]]
    live_excluded = [x for s in live_log for x in s["excluded"] if x[1] != "group_cancelled"]
    assert [x for s in replay_log for x in s["excluded"]][:len(live_excluded)] == live_excluded
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "predates the journaled weight versions" in messages and "predates the record of cancel_outstanding" in messages


def test_a_folder_that_is_not_a_run_is_named_in_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(JournalError, match=f"{tmp_path} is not a run folder: it has no journal") as e:
        ReplayPool.open(tmp_path)
    assert "\n" not in str(e.value) and "notes.txt" in str(e.value)
    with pytest.raises(JournalError, match="no such folder"):
        RolloutPool.replay(str(tmp_path / "missing"))


def test_a_config_passed_replaces_the_runs_rollout_settings(tmp_path, caplog):
    """What a different training policy would have made of the same data: no filter, every
    complete group is kept; the difference is logged."""
    out, cfg, live, live_log = _live_run(tmp_path, 2, False)
    caplog.set_level(logging.INFO, logger="rollout.core.pool.replay")
    other = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, filter_groups=None))
    pool = ReplayPool.open(out, other)
    assert "filter_groups=None (run: 'zero_variance')" in caplog.text
    list(pool.groups())
    assert pool.stats()["groups_filtered"] == 0 and pool.stats()["groups_kept"] > sum(len(s["groups"]) for s in live_log)


def test_the_async_api_over_a_replay_gives_the_same_groups_without_the_runs_polls(tmp_path):
    """A trainer on an event loop (collect_groups_async, update_weights_from_disk_async, no poll
    and no prefetch at all): a weight update first delivers what the run delivered before its own
    update, so every step still gets the run's groups and exclusions."""
    import asyncio

    out, cfg, live, live_log = _live_run(tmp_path, 2, False)
    pool = ReplayPool.open(out)

    async def trainer():
        log = []
        for step in range(6):
            groups = await pool.collect_groups_async(3, None, abort_surplus=False)
            await pool.update_weights_from_disk_async("unused", step + 1)
            log.append({"groups": [[(s.episode_id, s.tokens, s.loss_mask, s.rollout_log_probs, s.reward) for s in g] for g in groups],
                        "excluded": [(e.sample.episode_id, e.reason) for e in pool.excluded()]})
        await pool.cancel_outstanding_async()
        rest = [g async for g in pool.groups_async()]
        log.append({"groups": [[(s.episode_id, s.tokens, s.loss_mask, s.rollout_log_probs, s.reward) for s in g] for g in rest],
                    "excluded": [(e.sample.episode_id, e.reason) for e in pool.excluded()]})
        return log

    assert asyncio.run(trainer()) == live_log
    assert pool.last_pause is not None and pool.last_pause.workers == [] and pool.paused is None


def test_without_config_yaml_the_config_hashed_into_run_json_is_used(tmp_path):
    """run.json keeps every key that shapes the data (not the endpoints, which a replay does not
    need): enough to replay the same groups."""
    out, cfg, live, live_log = _live_run(tmp_path, 2, False)
    (out / "config.yaml").unlink()
    pool = ReplayPool.open(out)
    assert pool.cfg.rollout.filter_groups == "zero_variance" and pool.cfg.rollout.max_staleness == 1
    assert train_like_grpo(pool, 6, 3, False, 2) == live_log
