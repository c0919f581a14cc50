"""The run journal: an output directory that is appended as a run goes, so that a run stopped by
anything (SIGINT, SIGKILL, a lost Ray head, a reboot) can be resumed without losing or
duplicating an episode.

Files (all in ``rollout.output_dir``; each line is handed to the operating system as it is
written, so that a killed process loses none of them, and made durable as said below):

* ``run.json``: the run's state: ``status`` (``running`` | ``finished`` | ``interrupted``), the
  config hash and the hashed config, start times, the wall time of earlier sessions;
* ``specs.jsonl``: every episode spec submitted, one :class:`~rollout.core.records.EpisodeSpec` per
  line, written *before* the episodes start;
* ``episodes.jsonl``: every episode delivered, one :class:`~rollout.core.records.TrainingSample` per
  line, in delivery order, written the moment the pool delivers it (before grouping or
  filtering: this is the write-ahead log; ``samples.jsonl`` and the other files of
  :mod:`rollout.core.output` are views of it). Each line's ``metadata`` also holds
  :data:`DELIVERY_VERSION_KEY`: the trainer's weight version when the pool delivered the episode
  (what ``rollout.max_staleness`` judged it against); reading the journal takes it out again, so
  the samples read back equal those the trainer was handed;
* ``events.jsonl``: what the trainer did to the streams besides taking from them, one JSON object
  per line in order: ``{"event": "cancel_outstanding", "delivered": D, "specs": S,
  "weight_version": V}`` for each :meth:`rollout.core.pool.RolloutPool.cancel_outstanding`
  (``D`` episodes journaled and ``S`` specs submitted before it, at trainer version ``V``).

A resumed run (:meth:`RunJournal.open` with ``resume=True``, ``rollout run --resume``) runs the
specs that are not in ``episodes.jsonl`` (what was in flight or queued) and replays the delivered
samples into the pool's group streams (:meth:`rollout.core.pool.RolloutPool.restore`), so groups,
re-runs of failed members and filters come out as if the run had never stopped. A config that
changed in a key that shapes the data (:func:`config_fingerprint`) is refused.

:func:`load_run` reads a finished (or stopped) run back for
:class:`rollout.core.pool.replay.ReplayPool`, which streams it through the training streams again
without running anything. Journals written before the delivery versions and ``events.jsonl``
existed still load (:attr:`RunRecord.exact_versions` and :attr:`RunRecord.cancels` say what they
lack).

When each line is durable (``fsync``: it survives a crash of the machine, not only of the
process):

* a ``specs.jsonl`` line and an ``events.jsonl`` line: when :meth:`RunJournal.record_specs` /
  :meth:`RunJournal.record_cancel` return (a cancel event first makes every episode line before it
  durable, so that its counts never point past the durable episodes);
* an ``episodes.jsonl`` line: when :meth:`RunJournal.record` returns, or, with ``sync=False``,
  at the next :meth:`RunJournal.commit` (or ``record_cancel``, or ``close``). The pool records
  with ``sync=False`` and commits when its call ends, before that call hands anything out
  (:class:`rollout.core.pool.steps.StepRunner`): so every episode is durable before the trainer,
  the CLI's files or any other consumer can see it, and one ``fsync`` covers all the episodes one
  call delivered (a GRPO group, in ``groups()`` / ``stream()``) instead of one each.

So after a crash, whatever was handed out is in the journal and ``--resume`` does not run it
again, and whatever is not in the journal was never handed out and runs again: nothing is lost or
delivered twice. A line written but not yet committed may or may not survive a machine crash;
either way it was not handed out yet, and the resumed run hands it out once. Lines are written as
JSON by :func:`rollout.core.fastjson.dumps_line` (``orjson``; the standard library's text for a
record with a non-finite float): read back, each equals what ``json.dumps`` would have written.

A write the operating system refuses (the disk is full) raises
:class:`~rollout.core.jsonl.OutputWriteError` naming the file, with the line taken back: the
files hold whole lines only, every one written before; the pool stops the run on it
(:class:`~rollout.core.pool.JournalWriteError`), and a resume once space is freed finishes it.
A resumed run sets damaged lines aside (:func:`rollout.core.jsonl.recover`): a torn last line (a
crash mid-write) or a corrupted line, each logged with its file and line number, moved to
``journal_damage.jsonl`` and recorded in ``run.json`` (``journal_repairs``); an episode whose
line was set aside runs again. An ``episodes.jsonl`` line of a group ``specs.jsonl`` lacks (another
run's) is set aside the same way. A corrupted ``specs.jsonl`` line refuses the resume.

The cost: each sample is stored twice (``episodes.jsonl`` and its view), about 2x the disk of
the samples alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rollout.core.config import Config, load_config
from rollout.core.fastjson import dumps_line
from rollout.core.journal_lines import (  # noqa: F401  (public here)
    CONFIG_FILE,
    DAMAGE_FILE,
    DATA_FILES,
    DELIVERY_VERSION_KEY,
    EPISODES_FILE,
    EVENTS_FILE,
    RUN_FILES,
    SPECS_FILE,
    STATE_FILE,
    check_run_folder,
    check_run_target,
    foreign_entries,
    holds_run,
    read_state,
    sample_line,
)
from rollout.core.journal_lines import episode_from_line as _episode
from rollout.core.jsonl import JournalError, LineDamage, OutputWriteError, append_whole, read_lines, recover
from rollout.core.records import EpisodeSpec, TrainingSample

logger = logging.getLogger(__name__)

# Keys that do not change the data a run produces: they may differ on --resume.
_VOLATILE = {
    "pool",  # actor counts, timeouts, Ray address
    "logging",
    "policy.router_url", "policy.request_timeout_s", "policy.max_request_retries", "policy.backend_outage_timeout_s", "policy.api_key_env",
    "env.user.base_url", "env.user.api_key_env", "env.user.timeout_s", "env.user.max_retries", "env.user.retry_backoff_s", "env.user.max_retry_wait_s",
    "env.judge.base_url", "env.judge.api_key_env", "env.judge.timeout_s", "env.judge.max_retries", "env.judge.retry_backoff_s", "env.judge.max_retry_wait_s",
    "env.step_timeout_s", "env.reward_timeout_s", "env.evaluator",  # both evaluators give the same rewards
    "rollout.output_dir", "rollout.keep_messages",  # where results go, and whether they carry the conversation
    "local.enabled", "local.num_servers", "local.host", "local.router_port", "local.startup_timeout_s",
}


def config_fingerprint(cfg: Config) -> tuple[str, dict[str, Any]]:
    """``(sha256 hex, flat dict)`` of the config keys that shape the data (everything but the
    keys in ``_VOLATILE``: actor counts, endpoints, timeouts, logging, the output dir)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, d: dict[str, Any]) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if key in _VOLATILE:
                continue
            if isinstance(v, dict):
                walk(key + ".", v)
            else:
                flat[key] = v

    walk("", cfg.to_dict())
    digest = hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()
    return digest, flat


def _read_jsonl(path: Path) -> list[dict]:
    """Lines of a JSONL file, read only; a torn last line (its writer stopped mid-line) is ignored.

    Raises:
        JournalError: a corrupt line (``rollout.core.jsonl``), naming the file and its line.
    """
    out, damage = read_lines(path)
    for d in damage:
        if d.kind != "torn":
            raise JournalError(f"{path}:{d.line} is corrupt ({d.reason}); `python -m rollout run --resume` sets it aside")
        logger.warning("%s: ignoring a torn last line (line %d, %d bytes)", path, d.line, d.size)
    return out


def _of_run(episode: tuple[TrainingSample, int | None], groups: set[str]) -> tuple[TrainingSample, int | None]:
    """``episode`` (a parsed ``episodes.jsonl`` line) if its group is one of the run's ``groups``.

    Raises:
        ValueError: it is not (a line of another run: :func:`rollout.core.jsonl.recover` sets it aside).
    """
    sample = episode[0]
    if sample.group_id not in groups:
        raise ValueError(f"another run's episode? its group is not in {SPECS_FILE}: {sample.group_id}")  # the reason's first 80 characters are kept
    return episode


def _repaired(d: Path, name: str, parse) -> tuple[list, list[LineDamage]]:
    """:func:`rollout.core.jsonl.recover` of journal file ``name`` on resume; a corrupt spec line
    refuses the resume (the episode it named cannot be known)."""
    why = "the episode it named cannot be known, so the run cannot be resumed" if name == SPECS_FILE else None
    return recover(d / name, parse, d / DAMAGE_FILE, refuse_corrupt=why)


class RunJournal:
    """The journal of one run in ``output_dir`` (see the module docstring). Use :meth:`open`.

    Attributes:
        dir: the output directory.
        resumed: True when this session continues an earlier one.
        specs: the specs journaled so far (in submission order).
        delivered: episode id -> sample, for every episode journaled as delivered, in order.
        state: the content of ``run.json``.
        repairs: the damaged lines this session's :meth:`open` set aside (torn or corrupt, each
            with its file and line number: :class:`rollout.core.jsonl.LineDamage`); their
            episodes count as undelivered and run again.
    """

    def __init__(self, output_dir: Path, state: dict[str, Any], specs: list[EpisodeSpec], delivered: dict[str, TrainingSample], resumed: bool):
        self.dir = output_dir
        self.state = state
        self.specs = specs
        self.delivered = delivered
        self.resumed = resumed
        self._t0 = time.monotonic()
        self._closed_wall: float | None = None
        self._wall_before = float(state.get("wall_s_before", 0.0))  # the earlier sessions' (at open)
        self._spec_ids = {s.episode_id for s in specs}
        # unbuffered: every write() reaches the operating system at once (a killed process loses
        # no line it wrote); durability is the fsync's job (see the module docstring)
        self._specs_f = open(self.dir / SPECS_FILE, "ab", buffering=0)  # noqa: SIM115 (closed by close())
        self._episodes_f = open(self.dir / EPISODES_FILE, "ab", buffering=0)  # noqa: SIM115
        # events.jsonl exists from the start, so that a replay tells "no cancel" from a journal
        # written before events were recorded
        self._events_f = open(self.dir / EVENTS_FILE, "ab", buffering=0)  # noqa: SIM115
        self._uncommitted = 0  # episode lines written since the last fsync of episodes.jsonl
        self.repairs: list[LineDamage] = []
        self.fsyncs = 0  # fsync calls made (for benchmarks and tests)

    @classmethod
    def open(cls, output_dir: str | Path, cfg: Config, resume: bool = False, overwrite: bool = False,
             session_start: float | None = None) -> "RunJournal":
        """Open the journal for a new, resumed or replacing run.

        Args:
            output_dir: created if missing.
            cfg: the run's config (unresolved endpoints are fine: they are not hashed).
            resume: continue the run the directory holds (from the beginning, saying so in a
                warning, where it stopped before it submitted an episode; refused where no run
                started).
            overwrite: remove an earlier run's files (only those, see ``RUN_FILES``) first.
            session_start: ``time.monotonic()`` when this session began, where :attr:`wall_s`
                counts it from (``None``: now; the CLI passes its command's start, so that the wall
                time holds the start-up, :func:`rollout.app.cli.run_job`).

        Raises:
            JournalError: (one line, before anything is created) the directory holds a run and
                neither ``resume`` nor ``overwrite`` was given; without ``overwrite``, it holds
                files but no run (:func:`check_run_target`); ``resume`` where no run started;
                ``resume`` with a config that changed in a key that shapes the data (naming the
                keys); both flags; a corrupt journal or ``run.json``.
        """
        d = Path(output_dir)
        check_run_target(d, resume=resume, overwrite=overwrite)
        d.mkdir(parents=True, exist_ok=True)
        digest, flat = config_fingerprint(cfg)
        exists = holds_run(d)
        if exists and overwrite:
            for f in RUN_FILES:
                (d / f).unlink(missing_ok=True)
            exists = False
        if resume and not exists:
            logger.warning("%s: the run there stopped before it submitted any episode: --resume starts it from the beginning", d)
        if exists:
            if not (d / STATE_FILE).is_file():
                raise JournalError(f"{d} holds results but no {STATE_FILE} (written by an older version?): cannot resume it; use --overwrite or another rollout.output_dir")
            state = read_state(d)
            if state.get("config_hash") != digest:
                old = state["config"] if isinstance(state.get("config"), dict) else {}
                changed = sorted(k for k in set(old) | set(flat) if old.get(k) != flat.get(k))
                raise JournalError(f"{d}: the config changed since the run started ({', '.join(changed[:8]) or 'unknown keys'}); "
                                   "resume with the same config, or pass --overwrite")
            specs, damage = _repaired(d, SPECS_FILE, lambda x: EpisodeSpec(**x))
            groups = {s.group_id for s in specs}
            episodes, more = _repaired(d, EPISODES_FILE, lambda x: _of_run(_episode(x), groups))
            damage += more + _repaired(d, EVENTS_FILE, lambda x: x)[1]
            delivered: dict[str, TrainingSample] = {}
            for s, _ in episodes:
                delivered.setdefault(s.episode_id, s)
            state.update(status="running", resumed=int(state.get("resumed", 0)) + 1, resumed_at=time.time())
            state["journal_repairs"] = state.get("journal_repairs", []) + [{**x.as_dict(), "session": state["resumed"]} for x in damage]
            j = cls(d, state, specs, delivered, resumed=True)
            j.repairs = damage
        else:
            state = {"format": 1, "status": "running", "config_hash": digest, "config": flat, "started_at": time.time(), "resumed": 0, "wall_s_before": 0.0}
            j = cls(d, state, [], {}, resumed=False)
        if session_start is not None:
            j._t0 = min(j._t0, session_start)
        j._write_state()
        return j

    # -- recording ---------------------------------------------------------------------------
    def record_specs(self, specs: list[EpisodeSpec]) -> None:
        """Append submitted specs (before they run), durable when it returns; specs journaled
        before are skipped."""
        new = [s for s in specs if s.episode_id not in self._spec_ids]
        if not new:
            return
        self._write(self._specs_f, b"".join(dumps_line(dataclasses.asdict(dataclasses.replace(s, attempt=0))) for s in new))
        self._fsync(self._specs_f)
        self._spec_ids.update(s.episode_id for s in new)
        self.specs += new

    def record(self, sample: TrainingSample, weight_version: int | None = None, sync: bool = True) -> None:
        """Append one delivered episode; ``weight_version``: the trainer's version at its delivery
        (kept in the line's metadata as :data:`DELIVERY_VERSION_KEY`; ``sample`` is not changed).

        Args:
            sync: make the line durable before returning; ``False``: at the next :meth:`commit`
                (the caller commits before it hands the episode out; see the module docstring).
        """
        self._write(self._episodes_f, sample_line(sample, weight_version))
        self._uncommitted += 1
        self.delivered[sample.episode_id] = sample
        if sync:
            self.commit()

    def commit(self) -> int:
        """Make every episode line written so far durable (one ``fsync``, none when there is
        nothing new); returns how many lines it made durable."""
        n, self._uncommitted = self._uncommitted, 0
        if n:
            self._fsync(self._episodes_f)
        return n

    def record_cancel(self, weight_version: int) -> None:
        """Append a ``cancel_outstanding`` event to ``events.jsonl``: the episodes journaled and
        the specs submitted so far, and the trainer's weight version (see the module docstring).
        The episodes journaled before it are committed first; the event is durable when it returns."""
        self.commit()
        event = {"event": "cancel_outstanding", "delivered": len(self.delivered), "specs": len(self.specs), "weight_version": int(weight_version)}
        self._write(self._events_f, dumps_line(event))
        self._fsync(self._events_f)

    @staticmethod
    def _write(f, data: bytes) -> None:
        """All of ``data`` to the operating system, or none of it (:func:`rollout.core.jsonl.append_whole`).

        Raises:
            OutputWriteError: the write was refused (e.g. the disk is full), naming the file.
        """
        append_whole(f, data)

    def _fsync(self, f) -> None:
        try:
            os.fsync(f.fileno())
        except OSError as e:
            raise OutputWriteError(f.name, e, "make durable") from None
        self.fsyncs += 1

    def undelivered(self) -> list[EpisodeSpec]:
        """Journaled specs with no delivered episode (re-runs of group members not included)."""
        return [s for s in self.specs if s.episode_id not in self.delivered]

    @property
    def wall_s(self) -> float:
        """Wall time of this run across its sessions (seconds), frozen at :meth:`close`."""
        if self._closed_wall is not None:
            return self._closed_wall
        return float(self.state.get("wall_s_before", 0.0)) + time.monotonic() - self._t0

    @property
    def session_wall_s(self) -> float:
        """This session's part of :attr:`wall_s` (seconds; all of it unless :attr:`resumed`), frozen at :meth:`close`."""
        return self.wall_s - self._wall_before

    def _write_state(self) -> None:
        tmp = self.dir / (STATE_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(self.state, indent=2, default=str) + "\n")
            os.replace(tmp, self.dir / STATE_FILE)
        except OSError as e:
            tmp.unlink(missing_ok=True)  # the old run.json stays whole
            raise OutputWriteError(self.dir / STATE_FILE, e) from None

    def close(self, status: str, reason: str | None = None) -> None:
        """Mark the run ``finished`` or ``interrupted`` (with ``reason``) and close the files.

        Raises:
            OutputWriteError: the last commit or ``run.json`` could not be written (the files are
                closed all the same; ``run.json`` keeps its earlier content, and ``--resume``
                finishes the run).
        """
        try:
            if not self._episodes_f.closed:
                self.commit()
            self._closed_wall = self.wall_s
            self.state.update(status=status, reason=reason, wall_s_before=self._closed_wall, updated_at=time.time(),
                              episodes_delivered=len(self.delivered), episodes_undelivered=len(self.undelivered()))
            self._write_state()
        finally:
            for f in (self._specs_f, self._episodes_f, self._events_f):
                if not f.closed:
                    f.close()


@dataclasses.dataclass(frozen=True)
class CancelEvent:
    """One ``cancel_outstanding`` of a run (a line of ``events.jsonl``).

    Attributes:
        delivered: episodes journaled before it (an index into :attr:`RunRecord.episodes`).
        specs: specs submitted before it (an index into :attr:`RunRecord.specs`).
        weight_version: the trainer's weight version when it was called.
    """

    delivered: int
    specs: int
    weight_version: int


@dataclasses.dataclass
class RunRecord:
    """A run read back from its output directory (:func:`load_run`).

    Attributes:
        dir: the output directory.
        state: ``run.json`` (empty when missing).
        specs: every spec submitted, in submission order (re-runs of group members are not
            specs: they are made from their member's spec).
        episodes: every episode delivered, in delivery order, each episode id once (the first
            line wins, as on resume): ``(sample, the trainer's weight version at its delivery,
            or None where the journal predates that record)``.
        cancels: the run's ``cancel_outstanding`` calls in order; ``None`` when the journal has no
            ``events.jsonl`` (written before they were recorded: which episodes a cancel handed
            back is then unknown).
    """

    dir: Path
    state: dict[str, Any]
    specs: list[EpisodeSpec]
    episodes: list[tuple[TrainingSample, int | None]]
    cancels: list[CancelEvent] | None

    @property
    def exact_versions(self) -> bool:
        """Whether every episode carries the trainer's weight version at its delivery."""
        return all(v is not None for _, v in self.episodes)


def load_run(output_dir: str | Path) -> RunRecord:
    """Read the journal of the run in ``output_dir`` (finished, or stopped: what it delivered).

    Raises:
        JournalError: ``output_dir`` is not a folder, or holds no run journal (no ``specs.jsonl``
            with a spec in it), or the journal is corrupt (a line that is not JSON; an episode
            of a group ``specs.jsonl`` lacks; a ``run.json`` that is not a JSON object). One line
            naming the folder or the file.
    """
    d = Path(output_dir)
    check_run_folder(d)
    specs_path = d / SPECS_FILE
    try:
        specs = [EpisodeSpec(**x) for x in _read_jsonl(specs_path)]
    except (TypeError, ValueError) as e:
        raise JournalError(f"{specs_path}: not a spec per line ({e})") from None
    groups = {s.group_id for s in specs}
    episodes: list[tuple[TrainingSample, int | None]] = []
    seen: set[str] = set()
    for n, x in enumerate(_read_jsonl(d / EPISODES_FILE)):
        try:
            sample, version = _episode(x)
        except (TypeError, ValueError, KeyError) as e:
            raise JournalError(f"{d / EPISODES_FILE}: line {n + 1} is not a sample ({e}); `python -m rollout run --resume` sets it aside") from None
        if sample.group_id not in groups:
            raise JournalError(f"{d / EPISODES_FILE}: episode {sample.episode_id} is of group {sample.group_id}, which {SPECS_FILE} lacks "
                               "(another run's line?); `python -m rollout run --resume` sets it aside")
        if sample.episode_id not in seen:
            seen.add(sample.episode_id)
            episodes.append((sample, version))
    cancels = None
    if (d / EVENTS_FILE).is_file():
        cancels = [CancelEvent(int(e["delivered"]), int(e["specs"]), int(e["weight_version"]))
                   for e in _read_jsonl(d / EVENTS_FILE) if e.get("event") == "cancel_outstanding"]
    return RunRecord(d, read_state(d), specs, episodes, cancels)


def load_run_config(output_dir: str | Path, overrides: list[str] | None = None) -> Config:
    """The config of the run in ``output_dir``: its ``config.yaml``, else the config hashed into
    ``run.json`` (the keys that shape the data; endpoints are not recorded there, and a replay
    needs none), with ``overrides`` (``key=value``) on top.

    Raises:
        JournalError: the folder has neither file, or its ``run.json`` is not a JSON object.
        rollout.core.config.ConfigError: the config or an override is invalid (naming the key),
            or ``config.yaml`` is not a YAML mapping (naming the file).
    """
    d = Path(output_dir)
    if (d / CONFIG_FILE).is_file():
        return load_config(d / CONFIG_FILE, overrides)
    flat = read_state(d).get("config")
    if not isinstance(flat, dict):
        raise JournalError(f"{d}: neither {CONFIG_FILE} nor {STATE_FILE} records the run's config; pass one (--config FILE)")
    nested: dict[str, Any] = {"local": {"enabled": True}}  # run.json keeps no endpoint, and a replay needs none
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    with tempfile.TemporaryDirectory() as tmp:  # through load_config: its checks and its one-line errors
        path = Path(tmp) / CONFIG_FILE
        OmegaConf.save(OmegaConf.create(nested), path)
        return load_config(path, overrides)
