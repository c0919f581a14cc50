"""How the pool's calls run (pure: threads and an event loop, no Ray): one lock for sync and async
calls, async steps in slices, and a cancelled async step that loses nothing."""

from __future__ import annotations

import asyncio
import collections
import threading
import time

import pytest

from rollout.core.pool.errors import RunAborted
from rollout.core.pool.steps import END, SLICE_S, AsyncStream, StepRunner


class SlowSource:
    """A stream whose ``ensure`` takes ``delay_s`` in its thread to make each item (a counter)."""

    def __init__(self, n_items: int, delay_s: float):
        self.buffer: collections.deque[int] = collections.deque()
        self.made = 0
        self.n_items = n_items
        self.delay_s = delay_s
        self.delivered = 0  # the runner's progress
        self.inside = threading.Event()

    def ensure(self, timeout_s):
        if self.buffer:
            return True
        if self.made == self.n_items:
            return False
        self.inside.set()
        time.sleep(self.delay_s)
        self.made += 1
        self.delivered += 1
        self.buffer.append(self.made)
        return True

    def take(self):
        return self.buffer.popleft() if self.buffer else None


async def test_a_cancelled_async_step_hands_its_item_to_the_next_call():
    """The awaiting task is cancelled while the step works in its thread: the step finishes, and
    its item is the first the next call (the same iterator, then a sync call) hands out."""
    src = SlowSource(3, delay_s=0.3)
    runner = StepRunner(progress=lambda: src.delivered)
    it = AsyncStream(runner, src.ensure, src.take, None)
    task = asyncio.create_task(it.__anext__())
    await asyncio.to_thread(src.inside.wait, 5)  # the step is under way in its thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert src.made == 0  # cancelled before the item was made
    assert await it.__anext__() == 1  # made by the cancelled step, handed out now
    assert src.made == 1
    assert runner.next(src.ensure, src.take, None) == 2  # a sync call goes on from there
    assert [x async for x in AsyncStream(runner, src.ensure, src.take, None)] == [3]
    assert runner.next(src.ensure, src.take, None) is END


async def test_a_run_aborted_no_caller_saw_is_raised_by_the_next_call():
    started = threading.Event()
    undelivered = ["spec-a", "spec-b"]

    def ensure(timeout_s):
        started.set()
        time.sleep(0.2)
        raise RunAborted("no actor", undelivered)

    runner = StepRunner(progress=lambda: 0)
    task = asyncio.create_task(runner.next_async(ensure, lambda: None, None))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(RunAborted) as e:  # waits for the lock, i.e. for the step to end
        runner.next(lambda t: False, lambda: None, None)
    assert e.value.undelivered == undelivered
    assert runner.next(lambda t: False, lambda: None, None) is END  # raised once


async def test_async_slices_free_the_lock_for_other_calls_and_time_out_without_progress():
    """An async stream waiting for an episode holds the lock one slice at a time: a sync call from
    another thread gets in between two slices, never during one; timeout_s counts time without
    progress.

    Each slice reports progress until the call got in, so the stream cannot time out before it:
    a lock held across slices would keep the call out for ever (the hang guard says so), however
    fast or slow the machine."""
    spans: list[tuple[str, float, float]] = []
    asked: list[float] = []  # the timeout_s of each slice
    call_done, first_slice = threading.Event(), threading.Event()
    state = {"delivered": 0}

    def ensure(timeout_s):  # nothing ever arrives: each slice waits its time, then times out
        asked.append(timeout_s)
        first_slice.set()
        t0 = time.monotonic()
        time.sleep(timeout_s)
        if not call_done.is_set():
            state["delivered"] += 1  # progress (another stream's episode): the timeout starts again
        spans.append(("slice" if call_done.is_set() else "slice+progress", t0, time.monotonic()))
        raise TimeoutError("slice")

    runner = StepRunner(progress=lambda: state["delivered"])

    def work():  # a sync call's work, under the lock
        t_in = time.monotonic()
        time.sleep(0.05)
        spans.append(("call", t_in, time.monotonic()))
        call_done.set()

    consumer = asyncio.create_task(runner.next_async(ensure, lambda: None, 1.2))
    assert await asyncio.to_thread(first_slice.wait, 120), "the stream's first slice never started"
    await asyncio.wait_for(asyncio.to_thread(runner.call, work), 120)  # a lock held across slices: this hangs
    with pytest.raises(TimeoutError, match="no episode finished within 1.2s"):
        await asyncio.wait_for(consumer, 120)
    timed_out_at = time.monotonic()
    (call,) = [s for s in spans if s[0] == "call"]
    slices = [s for s in spans if s[0] != "call"]
    # the call ran between two slices, never inside one, and the stream went on waiting after it
    assert not any(a < call[2] and call[1] < b for _, a, b in slices)
    assert any(a >= call[2] for _, a, _ in slices)
    # every slice held the lock for at most SLICE_S; the stream gave up timeout_s after the last progress, not sooner
    assert asked and all(0 <= t <= SLICE_S for t in asked)
    last_progress = max(b for kind, _, b in slices if kind == "slice+progress")
    assert timed_out_at - last_progress >= 1.2


async def test_progress_in_a_slice_restarts_the_timeout():
    """Episodes delivered (the runner's progress) without an item for the stream: no timeout."""
    state = {"delivered": 0, "slices": 0}

    def ensure(timeout_s):
        state["slices"] += 1
        time.sleep(min(timeout_s, 0.2))
        if state["slices"] == 8:  # 1.6 s in, more than timeout_s, but each slice delivered one
            return True
        state["delivered"] += 1
        raise TimeoutError("slice")

    runner = StepRunner(progress=lambda: state["delivered"])
    assert await runner.next_async(ensure, lambda: "item", 0.5) == "item"


def test_a_refused_journal_write_in_a_call_or_its_commit_becomes_the_pools_error_under_the_lock():
    import errno

    from rollout.core.jsonl import OutputWriteError

    full = OutputWriteError("/out/episodes.jsonl", OSError(errno.ENOSPC, "No space left on device"))
    held_when_converted: list[bool] = []
    commits = {"fail": False}

    def commit() -> None:
        if commits["fail"]:
            raise full

    def stop(e: OutputWriteError) -> RunAborted:
        held_when_converted.append(runner.lock._lock._is_owned())
        return RunAborted(f"stopped: {e}", [])

    runner = StepRunner(progress=lambda: 0, on_release=commit, on_write_error=stop)
    with pytest.raises(RunAborted, match="stopped: cannot write /out/episodes.jsonl") as e:
        runner.call(lambda: (_ for _ in ()).throw(full))  # the call's own write refused
    assert e.value.__cause__ is full
    commits["fail"] = True
    with pytest.raises(RunAborted, match="the disk is full"):
        runner.call(lambda: 1)  # the commit as the call ends refused
    assert held_when_converted == [True, True]
    commits["fail"] = False
    assert runner.call(lambda: 7) == 7 and runner.lock._depth == 0  # the lock is free and whole again
    with pytest.raises(RunAborted):
        with runner.lock:
            runner.call(lambda: (_ for _ in ()).throw(full))  # nested: passed up as it is, converted at the outermost hold
    assert len(held_when_converted) == 3 and runner.lock._depth == 0
