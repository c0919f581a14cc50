"""Replaying a finished run into a trainer: :class:`ReplayPool`, the trainer API of
:class:`~rollout.core.pool.RolloutPool` over a run's journal instead of actors (pure Python: no
Ray is started, no router or server is called, no episode runs).

    pool = RolloutPool.replay("outputs/grpo_tiny")       # or ReplayPool.open(dir, cfg)
    for step in range(steps):
        groups = pool.collect_groups(B, tasks, abort_surplus=False)
        for ex in pool.excluded(): ...
        train(groups)
        pool.update_weights_from_disk(path, weight_version=step + 1)   # only the version moves on

The run's delivered episodes (``episodes.jsonl``, in delivery order) go through the same
:class:`~rollout.core.pool.streams.TrainingStreams` as in a live pool: the same
:class:`~rollout.core.groups.TrainingPolicy` (``rollout.train_statuses``, ``rollout.max_staleness``),
:class:`~rollout.core.groups.GroupAssembler` (re-runs, ``rollout.on_group_failure``,
``rollout.filter_groups``) and sample mode (``rollout.sample_mode``), with the run's settings (its
``config.yaml``) unless a config is passed. A trainer that makes the calls the run's trainer made
gets the same groups in the same order and the same exclusions; how versions, re-runs and cancels
are replayed is :mod:`rollout.core.pool.replay_feed`'s docstring. When the journal is exhausted
the streams end as a finished run's do, and ``collect_groups`` returns fewer groups (logged), as
when a task source runs out.

What differs from a live pool: nothing is submitted (``submit``, ``submit_tasks`` and
``attach_journal`` raise; ``prefetch`` submits nothing and returns 0; ``collect_groups`` does not
read ``task_source``: the journal's groups are the tasks); ``poll`` delivers what the run had
delivered by the trainer's current weight version and does not wait for more; the weight calls
(``pause``, ``resume``, ``update_weights_from_disk``) call no server: an update only moves the
trainer's weight version on. ``stats()`` has the live pool's keys plus ``replay_episodes_left``
and ``replay_skipped``.
"""

from __future__ import annotations

import collections
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

from rollout.core.config import Config
from rollout.core.groups import Excluded, TrainingPolicy
from rollout.core.journal import RunRecord, load_run, load_run_config
from rollout.core.pool.aio import AsyncPoolAPI
from rollout.core.pool.replay_feed import ReplayFeed
from rollout.core.pool.specs import as_weight_version
from rollout.core.pool.steps import END, AsyncStream, StepRunner
from rollout.core.pool.streams import TrainingStreams
from rollout.core.pool.weights import PAUSE_MODES, PauseReport, WeightCycleAPI
from rollout.core.records import EpisodeSpec, InteractionResult, TrainingSample

logger = logging.getLogger(__name__)

# The longest poll() waits when nothing is due (seconds): a trainer that polls in a loop while
# it trains does not spin.
POLL_IDLE_S = 0.05


class ReplayWeights:
    """The weight calls of a replay (:class:`~rollout.core.pool.weights.WeightSync`'s, with no
    server): a pause and a resume only change :attr:`paused`; an update moves the trainer's
    version on (:meth:`ReplayFeed.advance`).

    Args:
        feed: the replay's feed (it holds the versions).

    Attributes:
        last_pause: what the last pause met (always nothing: no episode runs), ``None`` before one.
        counts: ``weight_updates`` and ``generate_calls_paused`` (0), as a live pool's.
    """

    def __init__(self, feed: ReplayFeed):
        self._feed = feed
        self._paused: str | None = None
        self.last_pause: PauseReport | None = None
        self.counts: collections.Counter[str] = collections.Counter(weight_updates=0, generate_calls_paused=0)

    @property
    def weight_version(self) -> int:
        """The replay's weight version (:meth:`ReplayFeed.weight_version`)."""
        return self._feed.weight_version()

    @property
    def paused(self) -> str | None:
        return self._paused

    def set_weight_version(self, version: int | str) -> None:
        """The trainer's version becomes ``version``.

        Raises:
            ValueError: ``version`` is not an integer.
        """
        self._feed.advance(as_weight_version(version))

    def pause(self, mode: str = "abort") -> list[str]:
        """Record a pause (no server); returns no worker URL.

        Raises:
            ValueError: unknown ``mode``.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        self._paused = mode
        self.last_pause = PauseReport(mode=mode, workers=[], seconds=0.0, episodes_running=0, generate_calls_out=0)
        return []

    def resume(self) -> list[str]:
        """End a pause; returns no worker URL."""
        self._paused = None
        return []

    def update_weights_from_disk(self, model_path: str, weight_version: int | str) -> dict[str, dict]:
        """Move the trainer's version on to ``weight_version`` (``model_path`` is not read: no
        server); returns no worker answer.

        Raises:
            ValueError: ``weight_version`` is not an integer.
        """
        version = as_weight_version(weight_version)
        self.pause("abort")
        self._feed.advance(version)
        self.counts["weight_updates"] += 1
        self.resume()
        logger.debug("replay: weight version %d (%s not loaded: no server)", version, model_path)
        return {}

    def close(self) -> None:
        """Nothing to stop."""


class ReplayPool(WeightCycleAPI, AsyncPoolAPI):
    """The trainer API over a finished run's journal (see the module docstring). Use :meth:`open`
    (or :meth:`rollout.core.pool.RolloutPool.replay`).

    Args:
        record: the run (:func:`rollout.core.journal.load_run`).
        cfg: the config whose ``rollout`` section the streams apply.

    Attributes:
        cfg: the config.
        record: the run.
    """

    def __init__(self, record: RunRecord, cfg: Config):
        self.cfg = cfg
        self.record = record
        self._feed = ReplayFeed(record, as_weight_version(cfg.rollout.weight_version), keep_messages=cfg.rollout.keep_messages)
        self._weights = ReplayWeights(self._feed)
        self._streams = TrainingStreams(cfg, self._feed.feed())
        self._feed.attach(self._streams)
        self._runner = StepRunner(progress=lambda: self._feed.ledger.counts["episodes_delivered"])

    @classmethod
    def open(cls, output_dir: str | Path, cfg: Config | None = None) -> "ReplayPool":
        """A replay of the run in ``output_dir``.

        Args:
            output_dir: a run's output directory (its journal: ``specs.jsonl``, ``episodes.jsonl``,
                ``events.jsonl``, ``run.json``, ``config.yaml``).
            cfg: the config to replay with; ``None``: the run's own (``config.yaml``, else the
                config hashed into ``run.json``). Rollout keys that differ from the run's are logged.

        Raises:
            rollout.core.journal.JournalError: ``output_dir`` is not a run folder (one line naming
                it), or its journal is corrupt.
            rollout.core.config.ConfigError: the run's config does not load.
        """
        record = load_run(output_dir)
        run_cfg = None
        try:
            run_cfg = load_run_config(output_dir)
        except Exception as e:  # noqa: BLE001  (only needed when no config is passed)
            if cfg is None:
                raise
            logger.info("replay: the run's config could not be read (%s); using the one passed", e)
        if cfg is None:
            cfg = run_cfg
        elif run_cfg is not None:
            ours, theirs = cfg.to_dict()["rollout"], run_cfg.to_dict()["rollout"]
            changed = sorted(k for k in ours if k != "output_dir" and ours[k] != theirs.get(k))
            if changed:
                logger.info("replay: rollout settings differ from the run's: %s", ", ".join(f"{k}={ours[k]!r} (run: {theirs.get(k)!r})"
                                                                                         for k in changed))
        assert cfg is not None
        status = record.state.get("status", "unknown")
        undelivered = len({s.episode_id for s in record.specs} - {s.episode_id for s, _ in record.episodes})
        logger.info("replaying %s: %d episode(s) delivered in the run (status %s, %d spec(s) never delivered)", record.dir,
                    len(record.episodes), status, undelivered)
        if not record.exact_versions:
            logger.warning("replay: %s predates the journaled weight versions: staleness (rollout.max_staleness) is judged at the "
                           "replay's version when an episode is delivered, which may differ from the run's", record.dir)
        return cls(record, cfg)

    # -- lifecycle (nothing to start or stop) ------------------------------------------------
    def start(self) -> "ReplayPool":
        """Nothing to start; returns the pool."""
        return self

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Nothing to stop."""

    def __enter__(self) -> "ReplayPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def actors(self) -> list:
        """No actors: ``[]``."""
        return []

    @property
    def policy(self) -> TrainingPolicy:
        """The training policy every training stream applies."""
        return self._streams.policy

    # -- submission (the journal's) ----------------------------------------------------------
    def submit(self, specs) -> list[EpisodeSpec]:
        """Refused: a replay runs nothing.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("a replay pool runs nothing: its episodes are the journal's (use RolloutPool to run episodes)")

    def submit_tasks(self, task_ids, n_samples_per_task: int | None = None, weight_version: int | None = None) -> list[EpisodeSpec]:
        """Refused, as :meth:`submit`."""
        return self.submit(task_ids)

    def attach_journal(self, journal) -> None:
        """Refused: a replay delivers a journal, it writes none.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("a replay pool writes no journal")

    @property
    def submitted_ids(self) -> frozenset[str]:
        """Every episode id counted as submitted so far: the groups delivered or cancelled so far
        and the re-runs the streams asked for (the run's whole set once the journal is exhausted)."""
        with self._runner.lock:
            return self._feed.ledger.submitted_ids

    @property
    def num_outstanding(self) -> int:
        """Episodes the run still delivers here (journal entries not delivered yet)."""
        return self._feed.num_outstanding()

    def episodes_in_flight(self, actor: int | None = None) -> list[str]:
        """None run: ``[]``."""
        return []

    # -- the streams (as RolloutPool's) ------------------------------------------------------
    def results(self, timeout_s: float | None = None) -> Iterator[InteractionResult]:
        """Each journaled episode's result once, in the run's delivery order (rebuilt from its
        sample: :func:`rollout.core.pool.replay_feed.result_from_sample`); no training policy."""
        s = self._streams
        while (r := self._runner.next(self._feed.raw(s.ensure_result), s.take_result, timeout_s)) is not END:
            yield r

    def samples(self, timeout_s: float | None = None) -> Iterator[TrainingSample]:
        """Each trainable sample of every journaled episode (re-runs included), as
        :meth:`rollout.core.pool.RolloutPool.samples`; the rest go to :meth:`excluded`."""
        s = self._streams
        while (x := self._runner.next(self._feed.raw(s.ensure_sample), s.take_sample, timeout_s)) is not END:
            yield x

    def results_async(self, timeout_s: float | None = None) -> AsyncIterator[InteractionResult]:
        """:meth:`results` as an async iterator (see :mod:`rollout.core.pool.aio`)."""
        return AsyncStream(self._runner, self._feed.raw(self._streams.ensure_result), self._streams.take_result, timeout_s)

    def samples_async(self, timeout_s: float | None = None) -> AsyncIterator[TrainingSample]:
        """:meth:`samples` as an async iterator (see :mod:`rollout.core.pool.aio`)."""
        return AsyncStream(self._runner, self._feed.raw(self._streams.ensure_sample), self._streams.take_sample, timeout_s)

    def groups(self, timeout_s: float | None = None) -> Iterator[list[TrainingSample]]:
        """Each complete, trainable group, as :meth:`rollout.core.pool.RolloutPool.groups`."""
        yield from self.stream(timeout_s)  # type: ignore[misc]  (no Excluded without excluded=True)

    def stream(self, timeout_s: float | None = None, excluded: bool = False) -> Iterator[list[TrainingSample] | Excluded]:
        """The groups, and with ``excluded=True`` every :class:`~rollout.core.groups.Excluded` in
        delivery order, until the journal is exhausted (what ``python -m rollout run --replay``
        writes)."""
        s = self._streams
        while (x := self._runner.next(lambda t: s.ensure_item(t, excluded), lambda: s.take_item(excluded), timeout_s)) is not END:
            yield x

    def excluded(self) -> Iterator[Excluded]:
        """Everything kept out of training since the last call, once each."""
        while (e := self._streams.take_excluded()) is not None:
            yield e

    # -- dynamic sampling --------------------------------------------------------------------
    def prefetch(self, num_groups: int, task_source: Iterator[str] | None = None, n_samples_per_task: int | None = None,
                 in_flight: bool = False) -> int:
        """Submits nothing (the journal's groups are submitted as the run submitted them;
        ``task_source`` is not read); returns 0."""
        return 0

    def poll(self, timeout_s: float = 0.0) -> int:
        """Deliver into the streams what the run had delivered by the trainer's current weight
        version (stopping where the run cancelled, or re-ran a member the streams have not asked
        for); returns how many were delivered. When none is, waits at most
        ``min(timeout_s, POLL_IDLE_S)`` seconds (nothing more will come by waiting)."""
        n = self._runner.call(self._feed.poll_due)
        if n == 0 and self.num_outstanding and timeout_s > 0:
            time.sleep(min(timeout_s, POLL_IDLE_S))
        return n

    def collect_groups(self, num_groups: int, task_source: Iterator[str] | None = None, *, n_samples_per_task: int | None = None,
                       abort_surplus: bool = True, max_outstanding_groups: int | None = None,
                       timeout_s: float | None = None) -> list[list[TrainingSample]]:
        """``num_groups`` kept groups, as :meth:`rollout.core.pool.RolloutPool.collect_groups`
        makes them from the run's deliveries (``task_source`` is not read: the journal's groups
        are the tasks); fewer when the journal is exhausted (logged). With ``abort_surplus``,
        :meth:`cancel_outstanding` then replays the run's cancel if it made one here.

        Raises:
            ValueError: ``num_groups < 1``.
        """
        return self._collect_groups(num_groups, task_source, n_samples_per_task, abort_surplus, max_outstanding_groups, timeout_s)

    def _collect_step(self, num_groups: int, task_source: Iterator[str] | None, n_samples_per_task: int | None,
                      max_outstanding_groups: int | None) -> Callable[[float | None], bool]:
        """The step of :meth:`collect_groups` and ``collect_groups_async``
        (:meth:`~rollout.core.pool.aio.AsyncPoolAPI.collect_groups_async`, in slices, in a worker
        thread): ``task_source`` is not read, the journal's groups are the tasks.

        Raises:
            ValueError: ``num_groups < 1``.
        """
        return self._streams.collect(num_groups, None, n_samples_per_task, max_outstanding_groups)

    def cancel_outstanding(self, timeout_s: float | None = 120.0) -> int:
        """Replay the run's ``cancel_outstanding`` if it made one here (see
        :mod:`rollout.core.pool.replay_feed`): open groups are abandoned (their members go to
        :meth:`excluded` as ``group_cancelled``) and what the run handed back is delivered.
        Returns how many episodes the run found outstanding (0 when it made no cancel here)."""
        return self._runner.call(self._feed.cancel)

    def abort_outstanding(self, cancel_on_actors: bool = True, timeout_s: float = 5.0) -> list[EpisodeSpec]:
        """Nothing runs: ``[]``."""
        return []

    # -- introspection -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The live pool's running totals (:meth:`rollout.core.pool.RolloutPool.stats`), plus
        ``replay_episodes_left`` (journal entries not delivered yet) and ``replay_skipped``
        (journaled re-runs the streams never asked for)."""
        with self._runner.lock:
            out: dict[str, Any] = dict(self._feed.ledger.counts)
            out.update(self._weights.counts)
            out.update(self._streams.counts)
            out.update(episodes_outstanding=self.num_outstanding, weight_version=self.weight_version,
                       replay_episodes_left=self.num_outstanding, replay_skipped=self._feed.skipped)
            return out

    def worker_infos(self) -> list[dict]:
        """No workers: ``[]``."""
        return []
