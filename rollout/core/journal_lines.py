"""The run journal's files (:mod:`rollout.core.journal`): their names, the
checks of the folder a run goes into (what is refused, by reading only, before anything is
written there: :func:`check_run_target`), ``run.json`` (:func:`read_state`) and the episode line
(``episodes.jsonl``): a delivered sample's JSON with the trainer's weight version at delivery in
its metadata, written and read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rollout.core.fastjson import dumps_line
from rollout.core.jsonl import JournalError, read_lines
from rollout.core.records import TrainingSample

STATE_FILE = "run.json"
SPECS_FILE = "specs.jsonl"
EPISODES_FILE = "episodes.jsonl"
EVENTS_FILE = "events.jsonl"
CONFIG_FILE = "config.yaml"
DAMAGE_FILE = "journal_damage.jsonl"  # the damaged lines a resume set aside (rollout.core.jsonl.repair)
# Everything a run writes; --overwrite removes these and nothing else.
RUN_FILES = (STATE_FILE, SPECS_FILE, EPISODES_FILE, EVENTS_FILE, "samples.jsonl", "failed.jsonl", "filtered.jsonl", "summary.json", CONFIG_FILE,
             DAMAGE_FILE, "regrade.json")  # the last: python -m rollout regrade's report on the run


# The files whose content is a run's data: a directory where all are empty or missing holds no
# run, whatever else is there (a run that stopped before submitting anything, e.g. on a failed
# preflight, leaves only run.json, summary.json and config.yaml: nothing to resume or to lose).
DATA_FILES = (SPECS_FILE, EPISODES_FILE, "samples.jsonl", "failed.jsonl", "filtered.jsonl")


def holds_run(output_dir: str | Path) -> bool:
    """True when ``output_dir`` holds data of a run: a journaled spec or episode, or a result line
    (see :data:`DATA_FILES`)."""
    d = Path(output_dir)
    return any((d / f).is_file() and (d / f).stat().st_size > 0 for f in DATA_FILES)


def read_state(output_dir: str | Path) -> dict[str, Any]:
    """The run's ``run.json`` in ``output_dir``; ``{}`` when there is none.

    Raises:
        JournalError: ``run.json`` cannot be read, is not JSON or is not a JSON object; one line
            naming it.
    """
    path = Path(output_dir) / STATE_FILE
    if not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        why = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
        raise JournalError(f"{path} is not the run's state ({why}): restore it from a copy, or start the run again with --overwrite") from None
    if not isinstance(state, dict):
        raise JournalError(f"{path} holds a JSON {type(state).__name__}, not the run's state (a JSON object): restore it from a copy, "
                           "or start the run again with --overwrite")
    return state


def _started_here(d: Path) -> bool:
    """Whether ``d`` holds a run's ``run.json`` (a journal was opened there: its other files are the run's)."""
    try:
        return "config_hash" in read_state(d)
    except JournalError:
        return False


def foreign_entries(output_dir: str | Path) -> list[str]:
    """The names of what ``output_dir`` holds that no run of this project wrote there, sorted; ``[]``
    for a missing or empty folder or one a run started in (its ``run.json``). A run's own file
    names count as foreign unless the file is empty (a user's ``config.yaml`` is not a run's);
    folders named ``*_logs`` (the engine's logs that :func:`rollout.app.wiring.open_pool` writes
    before a trainer opens its journal) and the pre-start check's probe files are not."""
    d = Path(output_dir)
    if not d.is_dir() or _started_here(d):
        return []
    out = []
    for p in d.iterdir():
        if p.name.startswith(".preflight-") or (p.is_dir() and p.name.endswith("_logs")):
            continue
        if p.name in RUN_FILES and p.is_file() and p.stat().st_size == 0:
            continue
        out.append(p.name)
    return sorted(out)


def check_run_target(output_dir: str | Path, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse what :meth:`RunJournal.open` refuses about the folder itself, by reading only
    (nothing is created), so that a caller can refuse before it creates the folder.

    Raises:
        JournalError: one line naming the folder: both flags; ``resume`` on a folder where no
            run started; without ``overwrite``, a folder that holds files no run wrote
            (:func:`foreign_entries`), or a run (``--resume`` / ``--overwrite``, or for a
            finished run ``--overwrite`` alone); ``run.json`` that is not a JSON object.
    """
    if resume and overwrite:
        raise JournalError("--resume and --overwrite exclude each other")
    d = Path(output_dir)
    exists = holds_run(d)
    if resume and not exists and not _started_here(d):
        read_state(d)  # a damaged run.json is named as such
        what = "no such folder" if not d.exists() else "nothing in it" if d.is_dir() and not any(d.iterdir()) else f"no {STATE_FILE} in it"
        raise JournalError(f"{d} holds no run to resume ({what}): check rollout.output_dir, or drop --resume to start a run there")
    if overwrite or resume:
        return
    if exists:
        if read_state(d).get("status") == "finished":
            raise JournalError(f"{d} holds a finished run ({_describe(d)}): nothing to resume; pass --overwrite to run it again, "
                               "or name another rollout.output_dir")
        raise JournalError(f"{d} holds a run ({_describe(d)}); pass --resume to finish it or --overwrite to replace it")
    foreign = foreign_entries(d)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise JournalError(f"{d} holds files but no run ({shown}): name a new or empty rollout.output_dir, or pass --overwrite to write "
                           "the run there all the same (files of a run's names are replaced, nothing else)")


def _describe(d: Path) -> str:
    try:
        state = read_state(d)
    except JournalError:
        return f"its {STATE_FILE} damaged"
    if not state:
        return "results without a journal"
    n_specs = len(read_lines(d / SPECS_FILE)[0])  # damaged lines are not counted (a resume sets them aside)
    n_done = len({x.get("episode_id") or (x.get("metadata") or {}).get("episode_id") for x in read_lines(d / EPISODES_FILE)[0]})
    return f"{state.get('status', '?')}, {n_done} of {n_specs} episodes delivered"


def check_run_folder(output_dir: str | Path) -> None:
    """Check that ``output_dir`` holds a run's journal (a ``specs.jsonl`` with a spec in it).

    Raises:
        JournalError: it does not, or is no folder; one line naming it and what it holds.
    """
    d = Path(output_dir)
    if not d.is_dir():
        raise JournalError(f"{d}: no such folder (expected a run's output directory)")
    specs_path = d / SPECS_FILE
    if not specs_path.is_file() or specs_path.stat().st_size == 0:
        found = ", ".join(sorted(p.name for p in d.iterdir())[:6]) or "nothing"
        raise JournalError(f"{d} is not a run folder: it has no journal ({SPECS_FILE}, {EPISODES_FILE}, {STATE_FILE}, written by "
                           f"`python -m rollout run` and launch/train_grpo_tiny.py); found {found}")


# The metadata key of an episodes.jsonl line that holds the trainer's weight version at delivery
# (written by the journal, taken out when it is read).
DELIVERY_VERSION_KEY = "delivered_at_weight_version"

_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSample))


def sample_line(sample: TrainingSample, weight_version: int | None = None) -> bytes:
    """``sample``'s journal line: the JSON of :meth:`TrainingSample.to_dict` (``weight_version``,
    when given, in its metadata as :data:`DELIVERY_VERSION_KEY`), encoded from the sample's own
    containers without copying them (encoding does not change them); a sample whose containers
    the encoder does not take (e.g. an ``array.array``) goes through ``to_dict``'s copies."""
    line = {name: getattr(sample, name) for name in _SAMPLE_FIELDS}
    line["task_issues"] = [i.to_dict() for i in sample.task_issues]  # records, as to_dict writes them (usually none)
    if not line["segment_starts"]:
        del line["segment_starts"]  # as to_dict leaves it out
    if weight_version is not None:
        line["metadata"] = {**line["metadata"], DELIVERY_VERSION_KEY: int(weight_version)}
    try:
        return dumps_line(line)
    except TypeError:
        full = sample.to_dict()
        if weight_version is not None:
            full["metadata"][DELIVERY_VERSION_KEY] = int(weight_version)
        return dumps_line(full)


def episode_from_line(line: dict[str, Any]) -> tuple[TrainingSample, int | None]:
    """A journaled episode line as ``(sample, the trainer's version at delivery or None)``; the
    version is taken out of the sample's metadata."""
    v = (line.get("metadata") or {}).pop(DELIVERY_VERSION_KEY, None)
    return TrainingSample.from_dict(line), (None if v is None else int(v))
