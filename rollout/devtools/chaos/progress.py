"""A run's progress read from its journal (:class:`Progress`), and strikes placed by it
(:class:`Strike`, :func:`run_strikes`): never by the clock."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

POLL_S = 0.05  # seconds between two reads of a run's journal while a strike is not due
RECOVER_POLL_S = 0.5  # seconds between two checks that a victim is back (progress is held meanwhile)

KILL_WAIT_S = 240.0  # seconds to wait for a strike to be due, or for its victim to be back



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
