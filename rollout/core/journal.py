"""The run journal: an output directory that is appended as a run goes, so that a run stopped by
anything (SIGINT, SIGKILL, a lost Ray head, a reboot) can be resumed without losing or
duplicating an episode.

Files (all in ``rollout.output_dir``, each line flushed as it is written):

* ``run.json``: the run's state: ``status`` (``running`` | ``finished`` | ``interrupted``), the
  config hash and the hashed config, start times, the wall time of earlier sessions;
* ``specs.jsonl``: every episode spec submitted, one :class:`~rollout.core.records.EpisodeSpec` per
  line, written *before* the episodes start;
* ``episodes.jsonl``: every episode delivered, one :class:`~rollout.core.records.TrainingSample` per
  line, in delivery order, written the moment the pool delivers it (before grouping or
  filtering: this is the write-ahead log; ``samples.jsonl`` and the other files of
  :mod:`rollout.core.output` are views of it).

A resumed run (:meth:`RunJournal.open` with ``resume=True``, ``rollout run --resume``) runs the
specs that are not in ``episodes.jsonl`` (what was in flight or queued) and replays the delivered
samples into the pool's group streams (:meth:`rollout.core.pool.RolloutPool.restore`), so groups,
re-runs of failed members and filters come out as if the run had never stopped. A config that
changed in a key that shapes the data (:func:`config_fingerprint`) is refused.

The cost: each sample is stored twice (``episodes.jsonl`` and its view), about 2x the disk of
the samples alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from rollout.core.config import Config
from rollout.core.records import EpisodeSpec, TrainingSample

logger = logging.getLogger(__name__)

STATE_FILE = "run.json"
SPECS_FILE = "specs.jsonl"
EPISODES_FILE = "episodes.jsonl"
# Everything a run writes; --overwrite removes these and nothing else.
RUN_FILES = (STATE_FILE, SPECS_FILE, EPISODES_FILE, "samples.jsonl", "failed.jsonl", "filtered.jsonl", "summary.json", "config.yaml")

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
    lines = path.read_text().splitlines()
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
        self._specs_f = open(self.dir / SPECS_FILE, "a")  # noqa: SIM115 (closed by close())
        self._episodes_f = open(self.dir / EPISODES_FILE, "a")  # noqa: SIM115

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
                s = TrainingSample.from_dict(x)
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
        """Append submitted specs (before they run); specs journaled before are skipped."""
        new = [s for s in specs if s.episode_id not in self._spec_ids]
        if not new:
            return
        self._specs_f.write("".join(json.dumps(dataclasses.asdict(dataclasses.replace(s, attempt=0))) + "\n" for s in new))
        self._flush(self._specs_f)
        self._spec_ids.update(s.episode_id for s in new)
        self.specs += new

    def record(self, sample: TrainingSample) -> None:
        """Append one delivered episode."""
        self._episodes_f.write(json.dumps(sample.to_dict()) + "\n")
        self._flush(self._episodes_f)
        self.delivered[sample.episode_id] = sample

    @staticmethod
    def _flush(f) -> None:
        f.flush()
        os.fsync(f.fileno())

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
        self._closed_wall = self.wall_s
        self.state.update(status=status, reason=reason, wall_s_before=self._closed_wall, updated_at=time.time(),
                          episodes_delivered=len(self.delivered), episodes_undelivered=len(self.undelivered()))
        self._write_state()
        for f in (self._specs_f, self._episodes_f):
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
