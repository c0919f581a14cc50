"""The async counterparts of :class:`rollout.core.pool.RolloutPool`'s calls, for a trainer
running its own event loop (mixed into the pool: :class:`AsyncPoolAPI`).

``async for g in pool.groups_async(): ...``, ``await pool.collect_groups_async(B, tasks)``,
``await pool.update_weights_from_disk_async(path, v)``; likewise ``results_async``,
``samples_async``, ``stream_async``, ``cancel_outstanding_async``, ``pause_async`` and
``resume_async``. Same arguments, results and errors as the synchronous calls.

The contract (:mod:`rollout.core.pool.steps`):

* **Threads.** The pool's state is not thread-safe, so every call, sync or async, runs under one
  lock: sync calls in the caller's thread, async ones in a worker thread (``asyncio.to_thread``,
  the loop's default executor). Nothing runs on the event loop's thread but the hand-over of an
  item. A sync call made on the loop's thread waits for the lock there: call the async API from
  the loop.
* **Slices.** An async stream or ``collect_groups_async`` holds the lock for at most about
  :data:`~rollout.core.pool.steps.SLICE_S` seconds at a time, so a weight update or a pause
  awaited in another task gets in between; ``timeout_s`` counts seconds without any episode
  delivered, as in the sync calls.
* **Cancellation loses nothing.** The step under way when the awaiting task is cancelled runs to
  its end in its thread. An item it delivered and did not hand out is handed out first by the
  next call of the same stream (the same iterator, or a new one; groups go to any group stream or
  ``collect_groups``). Groups ``collect_groups_async`` had gathered are returned first by the next
  group call. A :class:`~rollout.core.pool.errors.RunAborted` that the cancelled task did not see
  is raised by the next stream call. A pause, resume, weight update or ``cancel_outstanding``
  whose awaiting task is cancelled still completes.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable, Iterator

from rollout.core.groups import Excluded
from rollout.core.pool.steps import AsyncStream, StepRunner
from rollout.core.pool.streams import TrainingStreams
from rollout.core.pool.weights import WeightSync
from rollout.core.records import InteractionResult, TrainingSample


class AsyncPoolAPI:
    """The async calls of :class:`rollout.core.pool.RolloutPool` (see the module docstring), and
    the group collection its ``collect_groups`` shares with them (:meth:`_collect_groups`).

    The pool provides the step runner, the streams, the weight sync and ``cancel_outstanding``
    (the annotations below). :class:`rollout.core.pool.replay.ReplayPool` mixes it in too.
    """

    _runner: StepRunner
    _streams: TrainingStreams
    _weights: WeightSync
    cancel_outstanding: Callable[..., int]

    def results_async(self, timeout_s: float | None = None) -> AsyncIterator[InteractionResult]:
        """:meth:`results` for a caller on an event loop: ``async for r in pool.results_async()``
        yields each episode's :class:`~rollout.core.records.InteractionResult` once, in completion
        order, until none is outstanding.

        Args:
            timeout_s: seconds without any episode delivered before giving up (``None``: wait).

        Raises:
            TimeoutError: ``timeout_s`` passed without an episode delivered.
            rollout.core.pool.errors.RunAborted: the run cannot go on (its kinds carry the
                undelivered specs), as :meth:`results`.
        """
        return AsyncStream(self._runner, self._streams.ensure_result, self._streams.take_result, timeout_s)

    def samples_async(self, timeout_s: float | None = None) -> AsyncIterator[TrainingSample]:
        """:meth:`samples` as an async iterator of trainable
        :class:`~rollout.core.records.TrainingSample` s (the others go to :meth:`excluded`);
        ``timeout_s`` and errors as :meth:`results_async`."""
        return AsyncStream(self._runner, self._streams.ensure_sample, self._streams.take_sample, timeout_s)

    def groups_async(self, timeout_s: float | None = None) -> AsyncIterator[list[TrainingSample]]:
        """:meth:`groups` as an async iterator: each complete, trainable group, a list of
        ``n_samples_per_task`` samples sorted by ``sample_index``; ``timeout_s`` and errors as
        :meth:`results_async`."""
        return self.stream_async(timeout_s)  # type: ignore[return-value]  (no Excluded without excluded=True)

    def stream_async(self, timeout_s: float | None = None, excluded: bool = False) -> AsyncIterator[list[TrainingSample] | Excluded]:
        """:meth:`stream` as an async iterator: the groups of :meth:`groups_async`, and with
        ``excluded`` every :class:`~rollout.core.groups.Excluded` in delivery order; ``timeout_s``
        and errors as :meth:`results_async`."""
        s = self._streams
        return AsyncStream(self._runner, lambda t: s.ensure_item(t, excluded), lambda: s.take_item(excluded), timeout_s)

    async def collect_groups_async(self, num_groups: int, task_source: Iterator[str] | None = None, *, n_samples_per_task: int | None = None,
                                   abort_surplus: bool = True, max_outstanding_groups: int | None = None,
                                   timeout_s: float | None = None) -> list[list[TrainingSample]]:
        """:meth:`collect_groups` for a caller on an event loop: the same arguments, and
        ``num_groups`` groups (or fewer when ``task_source`` ran out), each a list of samples
        sorted by ``sample_index``. ``task_source`` is read in a worker thread. Cancelled, it
        loses nothing: the groups gathered so far are returned first by the next group call.

        Raises:
            ValueError: ``num_groups < 1`` (at once).
            TimeoutError: ``timeout_s`` seconds passed without an episode delivered.
            rollout.core.pool.errors.RunAborted: as :meth:`results_async`.
        """
        step = self._collect_step(num_groups, task_source, n_samples_per_task, max_outstanding_groups)
        while not await self._runner.run_sliced(step, timeout_s):
            pass
        if abort_surplus:
            await self.cancel_outstanding_async(timeout_s)
        return self._streams.take_groups(num_groups)

    def _collect_step(self, num_groups: int, task_source: Iterator[str] | None, n_samples_per_task: int | None,
                      max_outstanding_groups: int | None) -> Callable[[float | None], bool]:
        """The step of one ``collect_groups`` call, sync or async
        (:meth:`~rollout.core.pool.streams.TrainingStreams.collect`); a pool that reads no task
        source overrides it (the replay: the journal's groups are the tasks).

        Raises:
            ValueError: ``num_groups < 1``.
        """
        return self._streams.collect(num_groups, task_source, n_samples_per_task, max_outstanding_groups)

    def _collect_groups(self, num_groups: int, task_source: Iterator[str] | None, n_samples_per_task: int | None,
                        abort_surplus: bool, max_outstanding_groups: int | None, timeout_s: float | None) -> list[list[TrainingSample]]:
        """The synchronous ``collect_groups`` of both pools: :meth:`_collect_step` run under the
        lock until it is done, then with ``abort_surplus`` the pool's ``cancel_outstanding``, then
        the first ``num_groups`` groups taken.

        Raises:
            ValueError: ``num_groups < 1``.
            TimeoutError: no episode ended within ``timeout_s`` seconds.
        """
        step = self._collect_step(num_groups, task_source, n_samples_per_task, max_outstanding_groups)
        with self._runner.lock:
            self._runner.until(step, timeout_s)
            if abort_surplus:
                self.cancel_outstanding(timeout_s=timeout_s)
            return self._streams.take_groups(num_groups)

    async def cancel_outstanding_async(self, timeout_s: float | None = 120.0) -> int:
        """:meth:`cancel_outstanding` in a worker thread; returns how many episodes were
        outstanding. Cancelled, it still completes. Raises as :meth:`cancel_outstanding`."""
        return await self._runner.call_async(self.cancel_outstanding, timeout_s)

    async def pause_async(self, mode: str = "abort") -> list[str]:
        """:meth:`pause` in a worker thread; returns the worker URLs paused. Cancelled, it still
        completes. Raises as :meth:`pause` (``ValueError``, ``WeightSyncError``, ``PolicyServerError``)."""
        return await self._runner.call_async(self._weights.pause, mode)

    async def resume_async(self) -> list[str]:
        """:meth:`resume` in a worker thread; returns the worker URLs. Cancelled, it still
        completes. Raises as :meth:`resume` (``WeightSyncError``)."""
        return await self._runner.call_async(self._weights.resume)

    async def update_weights_from_disk_async(self, model_path: str, weight_version: int | str) -> dict[str, dict]:
        """:meth:`update_weights_from_disk` in a worker thread, between two slices of any stream
        running in another task: pause, load ``model_path`` on every worker, check they report
        ``weight_version`` (an integer), continue. Returns worker URL -> its answer (``success``,
        ``message``, ``num_paused_requests``). Cancelled, the update still completes.

        Raises:
            ValueError: ``weight_version`` is not an integer.
            rollout.core.policy.WeightSyncError: a worker failed the update or reports
                another version (generation stays paused), as :meth:`update_weights_from_disk`.
        """
        return await self._runner.call_async(self._weights.update_weights_from_disk, model_path, weight_version)
