"""A weight update that some workers took and others failed (a cycle left half done: two versions
live) is settled before generation goes on: rolled forward (the update is sent again to the workers
that failed it, ``pool.weight_update_retries`` times) or, when that does not take, rolled back (the
workers that took it load the weights they served before), so that every worker serves one version
and the pool says which (:class:`WeightUpdateReport`, ``pool.last_weight_update``). Generation is
paused throughout (the pool's cycle, :mod:`rollout.core.pool.weights`): no ``/generate`` call meets
two versions. An update no worker took leaves every worker on the old version: nothing to settle.

The previous weights are the folder of the last update the pool made, or, before its first, the
``model_path`` each worker reports in ``GET /model_info`` (SGLang's: the weights it was started
with), read before the update is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Callable

from rollout.core.policy import EngineAdmin, WeightSyncError

logger = logging.getLogger(__name__)

OUTCOMES = ("updated", "rolled_forward", "rolled_back", "split")


@dataclasses.dataclass(frozen=True)
class WeightUpdateReport:
    """What one ``update_weights_from_disk`` did.

    Attributes:
        version: the version asked for.
        model_path: the folder asked for.
        outcome: ``updated`` (every worker took it at once), ``rolled_forward`` (some failed it,
            took it when sent again), ``rolled_back`` (some could not take it: those that had
            went back to ``previous_version``), ``split`` (neither held: the workers serve
            different versions, generation stays paused).
        workers: every worker URL.
        failed: worker URL -> why it failed the first attempt.
        retried: the workers the update was sent to again (roll forward), each as often as needed.
        rolled_back: the workers that loaded the previous weights again.
        serving: worker URL -> the version it reports afterwards.
        paths: worker URL -> the folder of the weights it serves afterwards (``None``: unknown).
        previous_version: the version before the update.
        seconds: how long it took, the pause not included.
        answers: worker URL -> its last answer to ``/update_weights_from_disk``.
    """

    version: int
    model_path: str
    outcome: str
    workers: list[str]
    failed: dict[str, str]
    retried: list[str]
    rolled_back: list[str]
    serving: dict[str, str | None]
    paths: dict[str, str | None]
    previous_version: int
    seconds: float
    answers: dict[str, dict]

    def as_dict(self) -> dict:
        """The report as a JSON-able dict."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        serving = sorted({str(v) for v in self.serving.values()})
        text = f"weight update to version {self.version}: {self.outcome} ({len(self.workers)} worker(s) serve version {', '.join(serving)})"
        if self.failed:
            text += f"; failed at first on {', '.join(self.failed)}"
        if self.retried:
            text += f"; sent again to {', '.join(self.retried)}"
        if self.rolled_back:
            text += f"; rolled back to version {self.previous_version} on {', '.join(self.rolled_back)}"
        return text


class HalfDoneUpdateError(WeightSyncError):
    """An update some workers took and others could not: rolled back (every worker serves the
    previous version) or, failing that, split. Generation stays paused either way (as after any
    failed update): retry the update, or resume knowingly.

    Attributes:
        report: the :class:`WeightUpdateReport` (``outcome`` ``rolled_back`` or ``split``).
    """

    def __init__(self, report: WeightUpdateReport, failures: dict[str, str]):
        super().__init__(f"update_weights_from_disk({report.model_path!r}, weight_version={report.version}) half done, {report.outcome}",
                         failures)
        self.report = report


async def _one(admin: EngineAdmin, url: str, model_path: str, version: str) -> tuple[str, dict | None, str | None]:
    try:
        return url, (await admin.update_weights_from_disk(model_path, version, [url]))[url], None
    except WeightSyncError as e:
        return url, None, e.failures.get(url, str(e))


async def _send(admin: EngineAdmin, urls: list[str], model_path: str, version: str) -> tuple[dict[str, dict], dict[str, str]]:
    """``POST /update_weights_from_disk`` on each of ``urls`` at once: ``(answers, failures)``,
    worker URL -> its answer, or why it failed."""
    done = await asyncio.gather(*[_one(admin, u, model_path, version) for u in urls])
    return {u: a for u, a, _ in done if a is not None}, {u: why for u, _, why in done if why is not None}


async def previous_paths(admin: EngineAdmin, urls: list[str]) -> dict[str, str | None]:
    """Each worker's ``model_path`` from ``GET /model_info`` (``None`` where it reports none or
    does not answer): the weights to roll back to before the pool's first update."""
    return {u: (info.get("model_path") or None) for u, info in (await admin.model_infos(urls)).items()}


async def settle_update(admin: EngineAdmin, urls: list[str], model_path: str, version: int, previous: dict[str, str | None],
                        previous_version: int, retries: int, on_report: Callable[[WeightUpdateReport], None]) -> WeightUpdateReport:
    """Send the update to ``urls`` and settle a half-done one (see the module docstring).

    Args:
        previous: worker URL -> the folder of the weights it serves now (what a roll back loads);
            empty: read from the workers first (:func:`previous_paths`).
        previous_version: the version every worker serves now.
        retries: how many times the update is sent again to the workers that failed it.
        on_report: called with the report of every update some worker took (before an error is
            raised: the pool records it either way).

    Returns:
        The report, ``outcome`` ``updated`` or ``rolled_forward``: every worker serves ``version``.

    Raises:
        WeightSyncError: no worker took the update (each failure named; all serve the old version),
            or a worker reports another version than it was given.
        HalfDoneUpdateError: some took it and the others could not: rolled back, or split.
    """
    t0 = time.monotonic()
    previous = dict(previous) or await previous_paths(admin, urls)
    answers, failed = await _send(admin, urls, model_path, str(version))
    if len(failed) == len(urls):
        raise WeightSyncError(f"update_weights_from_disk({model_path!r}, weight_version={version!r})", failed)
    left, retried = dict(failed), []
    for _ in range(retries):
        if not left:
            break
        retried += [u for u in left if u not in retried]
        again, left = await _send(admin, list(left), model_path, str(version))
        answers.update(again)
    rolled, back_failed = [], {}
    outcome = "rolled_forward" if failed and not left else "updated"
    if left:
        took = [u for u in urls if u not in left]
        rolled = [u for u in took if previous.get(u)]
        for u in rolled:  # each to its own previous folder (the same for all after the pool's first update)
            back_failed.update((await _send(admin, [u], str(previous[u]), str(previous_version)))[1])
        outcome = "rolled_back" if len(rolled) == len(took) and not back_failed else "split"
    serving = await admin.weight_versions(urls)
    if outcome in ("updated", "rolled_forward"):
        wrong = {u: f"reports weight_version {v!r} after the update" for u, v in serving.items() if v != str(version)}
        if wrong:
            raise WeightSyncError(f"update_weights_from_disk({model_path!r}, weight_version={version})", wrong)
    elif outcome == "rolled_back" and any(v != str(previous_version) for v in serving.values()):
        outcome = "split"
    paths = {u: (model_path if serving.get(u) == str(version) else previous.get(u)) for u in urls}
    report = WeightUpdateReport(version, model_path, outcome, list(urls), failed, retried, rolled, serving, paths, previous_version,
                                round(time.monotonic() - t0, 3), answers)
    on_report(report)
    if outcome in ("rolled_back", "split"):
        raise HalfDoneUpdateError(report, {**left, **{u: f"roll back failed: {why}" for u, why in back_failed.items()}})
    return report
