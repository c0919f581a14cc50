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
from rollout.core.records import EpisodeSpec, TrainingSample

logger = logging.getLogger(__name__)

STATE_FILE = "run.json"
SPECS_FILE = "specs.jsonl"
EPISODES_FILE = "episodes.jsonl"
EVENTS_FILE = "events.jsonl"
CONFIG_FILE = "config.yaml"
# Everything a run writes; --overwrite removes these and nothing else.
RUN_FILES = (STATE_FILE, SPECS_FILE, EPISODES_FILE, EVENTS_FILE, "samples.jsonl", "failed.jsonl", "filtered.jsonl", "summary.json", CONFIG_FILE)
# The metadata key of an episodes.jsonl line that holds the trainer's weight version at delivery
# (written by the journal, taken out when it is read).
DELIVERY_VERSION_KEY = "delivered_at_weight_version"

# Keys that do not change the data a run produces: they may differ on --resume.
_VOLATILE = {
    "pool",  # actor counts, timeouts, Ray address
    "logging",
    "policy.router_url", "policy.request_timeout_s", "policy.max_request_retries", "policy.backend_outage_timeout_s", "policy.api_key_env",
    "env.user.base_url", "env.user.api_key_env", "env.user.timeout_s", "env.user.max_retries", "env.user.retry_backoff_s", "env.user.max_retry_wait_s",
    "env.step_timeout_s", "env.reward_timeout_s", "env.evaluator",  # both evaluators give the same rewards
    "rollout.output_dir", "rollout.keep_messages",  # where results go, and whether they carry the conversation
    "local.enabled", "local.num_servers", "local.host", "local.router_port", "local.startup_timeout_s",
}


class JournalError(RuntimeError):
    """The output directory cannot be used as asked (one line, for the CLI)."""


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
    """Lines of a JSONL file; a torn last line (the writer was killed mid-write) is ignored."""
    if not path.is_file():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                logger.warning("%s: ignoring a torn last line", path)
                continue
            raise JournalError(f"{path}:{n + 1} is not valid JSON") from None
    return out


# The files whose content is a run's data: a directory where all are empty or missing holds no
# run, whatever else is there (a run that stopped before submitting anything, e.g. on a failed
# preflight, leaves only run.json, summary.json and config.yaml: nothing to resume or to lose).
DATA_FILES = (SPECS_FILE, EPISODES_FILE, "samples.jsonl", "failed.jsonl", "filtered.jsonl")


def holds_run(output_dir: str | Path) -> bool:
    """True when ``output_dir`` holds data of a run: a journaled spec or episode, or a result line
    (see :data:`DATA_FILES`)."""
    d = Path(output_dir)
    return any((d / f).is_file() and (d / f).stat().st_size > 0 for f in DATA_FILES)


_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSample))


def sample_line(sample: TrainingSample, weight_version: int | None = None) -> bytes:
    """``sample``'s journal line: the JSON of :meth:`TrainingSample.to_dict` (``weight_version``,
    when given, in its metadata as :data:`DELIVERY_VERSION_KEY`), encoded from the sample's own
    containers without copying them (encoding does not change them); a sample whose containers
    the encoder does not take (e.g. an ``array.array``) goes through ``to_dict``'s copies."""
    line = {name: getattr(sample, name) for name in _SAMPLE_FIELDS}
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


def _episode(line: dict[str, Any]) -> tuple[TrainingSample, int | None]:
    """A journaled episode line as ``(sample, the trainer's version at delivery or None)``; the
    version is taken out of the sample's metadata."""
    v = (line.get("metadata") or {}).pop(DELIVERY_VERSION_KEY, None)
    return TrainingSample.from_dict(line), (None if v is None else int(v))


class RunJournal:
    """The journal of one run in ``output_dir`` (see the module docstring). Use :meth:`open`.

    Attributes:
        dir: the output directory.
        resumed: True when this session continues an earlier one.
        specs: the specs journaled so far (in submission order).
        delivered: episode id -> sample, for every episode journaled as delivered, in order.
        state: the content of ``run.json``.
    """

    def __init__(self, output_dir: Path, state: dict[str, Any], specs: list[EpisodeSpec], delivered: dict[str, TrainingSample], resumed: bool):
        self.dir = output_dir
        self.state = state
        self.specs = specs
        self.delivered = delivered
        self.resumed = resumed
        self._t0 = time.monotonic()
        self._closed_wall: float | None = None
        self._spec_ids = {s.episode_id for s in specs}
        # unbuffered: every write() reaches the operating system at once (a killed process loses
        # no line it wrote); durability is the fsync's job (see the module docstring)
        self._specs_f = open(self.dir / SPECS_FILE, "ab", buffering=0)  # noqa: SIM115 (closed by close())
        self._episodes_f = open(self.dir / EPISODES_FILE, "ab", buffering=0)  # noqa: SIM115
        # events.jsonl exists from the start, so that a replay tells "no cancel" from a journal
        # written before events were recorded
        self._events_f = open(self.dir / EVENTS_FILE, "ab", buffering=0)  # noqa: SIM115
        self._uncommitted = 0  # episode lines written since the last fsync of episodes.jsonl
        self.fsyncs = 0  # fsync calls made (for benchmarks and tests)

    @classmethod
    def open(cls, output_dir: str | Path, cfg: Config, resume: bool = False, overwrite: bool = False) -> "RunJournal":
        """Open the journal for a new, resumed or replacing run.

        Args:
            output_dir: created if missing.
            cfg: the run's config (unresolved endpoints are fine: they are not hashed).
            resume: continue the run the directory holds (a new run if it holds none).
            overwrite: remove an earlier run's files (only those, see ``RUN_FILES``) first.

        Raises:
            JournalError: the directory holds a run and neither ``resume`` nor ``overwrite`` was
                given; ``resume`` with a config that changed in a key that shapes the data
                (naming the keys); both flags; a corrupt journal.
        """
        if resume and overwrite:
            raise JournalError("--resume and --overwrite exclude each other")
        d = Path(output_dir)
        d.mkdir(parents=True, exist_ok=True)
        digest, flat = config_fingerprint(cfg)
        exists = holds_run(d)
        if exists and overwrite:
            for f in RUN_FILES:
                (d / f).unlink(missing_ok=True)
            exists = False
        if exists and not resume:
            raise JournalError(f"{d} holds a run ({_describe(d)}); pass --resume to finish it or --overwrite to replace it")
        if exists:
            state_path = d / STATE_FILE
            if not state_path.is_file():
                raise JournalError(f"{d} holds results but no {STATE_FILE} (written by an older version?): cannot resume it; use --overwrite or another rollout.output_dir")
            state = json.loads(state_path.read_text())
            if state.get("config_hash") != digest:
                old = state.get("config", {})
                changed = sorted(k for k in set(old) | set(flat) if old.get(k) != flat.get(k))
                raise JournalError(f"{d}: the config changed since the run started ({', '.join(changed[:8]) or 'unknown keys'}); "
                                   "resume with the same config, or pass --overwrite")
            specs = [EpisodeSpec(**x) for x in _read_jsonl(d / SPECS_FILE)]
            delivered: dict[str, TrainingSample] = {}
            for x in _read_jsonl(d / EPISODES_FILE):
                s, _ = _episode(x)
                delivered.setdefault(s.episode_id, s)
            state.update(status="running", resumed=int(state.get("resumed", 0)) + 1, resumed_at=time.time())
            j = cls(d, state, specs, delivered, resumed=True)
        else:
            state = {"format": 1, "status": "running", "config_hash": digest, "config": flat, "started_at": time.time(), "resumed": 0, "wall_s_before": 0.0}
            j = cls(d, state, [], {}, resumed=False)
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
        """All of ``data`` to the operating system (an unbuffered write may be partial)."""
        view = memoryview(data)
        while view:
            view = view[f.write(view):]

    def _fsync(self, f) -> None:
        os.fsync(f.fileno())
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

    def _write_state(self) -> None:
        tmp = self.dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, default=str) + "\n")
        os.replace(tmp, self.dir / STATE_FILE)

    def close(self, status: str, reason: str | None = None) -> None:
        """Mark the run ``finished`` or ``interrupted`` (with ``reason``) and close the files."""
        if not self._episodes_f.closed:
            self.commit()
        self._closed_wall = self.wall_s
        self.state.update(status=status, reason=reason, wall_s_before=self._closed_wall, updated_at=time.time(),
                          episodes_delivered=len(self.delivered), episodes_undelivered=len(self.undelivered()))
        self._write_state()
        for f in (self._specs_f, self._episodes_f, self._events_f):
            if not f.closed:
                f.close()


def _describe(d: Path) -> str:
    try:
        state = json.loads((d / STATE_FILE).read_text())
    except (OSError, ValueError):
        return "results without a journal"
    n_specs = sum(1 for _ in _read_jsonl(d / SPECS_FILE))
    n_done = len({x.get("metadata", {}).get("episode_id") for x in _read_jsonl(d / EPISODES_FILE)})
    return f"{state.get('status', '?')}, {n_done} of {n_specs} episodes delivered"


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


def load_run(output_dir: str | Path) -> RunRecord:
    """Read the journal of the run in ``output_dir`` (finished, or stopped: what it delivered).

    Raises:
        JournalError: ``output_dir`` is not a folder, or holds no run journal (no ``specs.jsonl``
            with a spec in it), or the journal is corrupt (a line that is not JSON; an episode
            of a group ``specs.jsonl`` lacks). One line naming the folder or the file.
    """
    d = Path(output_dir)
    check_run_folder(d)
    specs_path = d / SPECS_FILE
    try:
        specs = [EpisodeSpec(**x) for x in _read_jsonl(specs_path)]
    except TypeError as e:
        raise JournalError(f"{specs_path}: not a spec per line ({e})") from None
    groups = {s.group_id for s in specs}
    episodes: list[tuple[TrainingSample, int | None]] = []
    seen: set[str] = set()
    for n, x in enumerate(_read_jsonl(d / EPISODES_FILE)):
        try:
            sample, version = _episode(x)
        except TypeError as e:
            raise JournalError(f"{d / EPISODES_FILE}: line {n + 1} is not a sample ({e})") from None
        if sample.group_id not in groups:
            raise JournalError(f"{d / EPISODES_FILE}: episode {sample.episode_id} is of group {sample.group_id}, which {SPECS_FILE} lacks")
        if sample.episode_id not in seen:
            seen.add(sample.episode_id)
            episodes.append((sample, version))
    cancels = None
    if (d / EVENTS_FILE).is_file():
        cancels = [CancelEvent(int(e["delivered"]), int(e["specs"]), int(e["weight_version"]))
                   for e in _read_jsonl(d / EVENTS_FILE) if e.get("event") == "cancel_outstanding"]
    state = json.loads((d / STATE_FILE).read_text()) if (d / STATE_FILE).is_file() else {}
    return RunRecord(d, state, specs, episodes, cancels)


def load_run_config(output_dir: str | Path, overrides: list[str] | None = None) -> Config:
    """The config of the run in ``output_dir``: its ``config.yaml``, else the config hashed into
    ``run.json`` (the keys that shape the data; endpoints are not recorded there, and a replay
    needs none), with ``overrides`` (``key=value``) on top.

    Raises:
        JournalError: the folder has neither file.
        rollout.core.config.ConfigError: the config or an override is invalid (naming the key).
    """
    d = Path(output_dir)
    if (d / CONFIG_FILE).is_file():
        return load_config(d / CONFIG_FILE, overrides)
    state_path = d / STATE_FILE
    flat = json.loads(state_path.read_text()).get("config") if state_path.is_file() else None
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
