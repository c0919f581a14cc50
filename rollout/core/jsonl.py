"""Append-only JSONL files that survive a full disk, a torn last line and a corrupted line: the run
journal's (:mod:`rollout.core.journal`) and the result files' (:mod:`rollout.core.output`) way of
writing and reading lines.

Writing (:func:`append_whole`): a line reaches the file whole or not at all. When the operating
system refuses a write (``ENOSPC``: the disk is full; ``EDQUOT``, ``EIO``, ``EROFS``, ...) after
part of the line was written, the file is truncated back to where the line began (truncating frees
space, so it works on a full disk) and :class:`OutputWriteError` names the file: every line written
before is kept, and nothing half-written is left for a reader.

Reading (:func:`read_lines`): each line must be a JSON object that the caller's ``parse`` accepts.
Two kinds of damage are told apart, each with its 1-based line number (:class:`LineDamage`):

* ``torn``: the last line has no newline and does not parse: its writer stopped mid-line (the
  machine crashed, or the disk filled and the truncation above could not run). Nothing after it
  was written, so dropping it loses only the line being written when the writer stopped.
* ``corrupt``: any other line that does not parse (bytes changed on the disk, a copy gone wrong):
  the record it held is unknown.

A last line without a newline that parses is whole (its newline was not written yet): it is kept.
:func:`repair` rewrites a file without its damaged lines (atomically: a new file, made durable,
then renamed over the old one), ends an unterminated whole last line with its newline, and appends
each damaged line, with its file, line number, kind and bytes, to a side file (the journal's
``journal_damage.jsonl``), so that what was set aside can still be looked at.
"""

from __future__ import annotations

import dataclasses
import errno as errno_codes
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)

__all__ = ["JournalError", "LineDamage", "OutputWriteError", "append_whole", "read_lines", "recover", "repair"]

# errno values that say the storage is out of room (rather than broken)
_FULL = (errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG)


class JournalError(RuntimeError):
    """The output directory cannot be used as asked (one line, for the CLI)."""


class OutputWriteError(JournalError):
    """The operating system refused a write to a run's output (the disk is full, or broken).

    The line being written was taken back (see the module docstring): the file holds whole lines
    only, every one written before.

    Attributes:
        path: the file that could not be written.
        error: the operating system's error (``error.errno``: ``ENOSPC`` for a full disk).
        disk_full: whether the storage is out of room (``ENOSPC``, ``EDQUOT``, ``EFBIG``): freeing
            space is the fix.
    """

    def __init__(self, path: str | Path, error: OSError, what: str = "write"):
        self.path = Path(path)
        self.error = error
        self.disk_full = error.errno in _FULL
        cause = "the disk is full" if self.disk_full else "the storage refused it"
        super().__init__(f"cannot {what} {self.path}: {os.strerror(error.errno) if error.errno else error} "
                         f"(errno {error.errno}: {cause})")


@dataclasses.dataclass(frozen=True)
class LineDamage:
    """A damaged line of a JSONL file.

    Attributes:
        file: the file's name (e.g. ``episodes.jsonl``).
        line: its 1-based line number in the file as it was read.
        kind: ``torn`` (an unterminated last line that does not parse) or ``corrupt`` (any other
            line that does not parse); see the module docstring.
        size: the line's length in bytes (without its newline).
        reason: why it does not parse (one line).
    """

    file: str
    line: int
    kind: str
    size: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.kind} ({self.size} bytes: {self.reason})"

    def as_dict(self) -> dict[str, Any]:
        """The damage as a JSON-able dict (what ``run.json`` and ``summary.json`` record)."""
        return dataclasses.asdict(self)


def append_whole(f, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``f``, an unbuffered binary file opened for appending:
    all of it, or nothing (see the module docstring).

    Raises:
        OutputWriteError: the operating system refused the write (the file is as it was before).
    """
    start = f.tell()
    view = memoryview(data)
    try:
        while view:  # an unbuffered write may be partial
            view = view[f.write(view):]
    except OSError as e:
        try:
            os.ftruncate(f.fileno(), start)
        except OSError as t:
            logger.warning("%s: could not take back the part of a line written before the write failed (%s); "
                           "the next resume sets it aside as a torn line", f.name, t)
        raise OutputWriteError(f.name, e) from None


def _parse(raw: bytes, parse: Callable[[dict], Any]) -> tuple[Any, str | None]:
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"not JSON: {str(e).splitlines()[0][:80]}"
    if not isinstance(obj, dict):
        return None, f"JSON {type(obj).__name__}, not an object"
    try:
        return parse(obj), None
    except (TypeError, KeyError, ValueError) as e:
        return None, f"not a record: {str(e).splitlines()[0][:80] if str(e) else type(e).__name__}"


def read_lines(path: str | Path, parse: Callable[[dict], Any] = lambda d: d) -> tuple[list[Any], list[LineDamage]]:
    """Read a JSONL file: ``(records, damage)``; a missing file is empty.

    Args:
        parse: turns a line's JSON object into the record (e.g. ``EpisodeSpec(**d)``); a
            ``TypeError``, ``KeyError`` or ``ValueError`` it raises makes the line damaged.

    Returns:
        The records of the good lines in file order (blank lines skipped), and the damaged lines
        (:class:`LineDamage`) in file order.
    """
    p = Path(path)
    if not p.is_file():
        return [], []
    data = p.read_bytes()
    lines = data.split(b"\n")
    terminated = data.endswith(b"\n")
    if terminated:
        lines.pop()  # the empty piece after the last newline
    out, damage = [], []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        record, why = _parse(raw, parse)
        if why is None:
            out.append(record)
            continue
        last = n == len(lines) and not terminated
        damage.append(LineDamage(p.name, n, "torn" if last else "corrupt", len(raw), why))
    return out, damage


def repair(path: str | Path, damage: list[LineDamage], side_file: str | Path) -> None:
    """Rewrite ``path`` without the lines ``damage`` names (as :func:`read_lines` found them in
    the file as it is now), ending an unterminated whole last line with its newline; append each
    damaged line to ``side_file`` as ``{"file", "line", "kind", "size", "reason", "text"}``
    (``text``: the line's bytes, decoded with replacement). Nothing is rewritten when the file
    needs nothing; the rewrite is atomic (a new file, fsynced, renamed over ``path``).

    Raises:
        OutputWriteError: the side file or the new file could not be written.
    """
    p = Path(path)
    data = p.read_bytes() if p.is_file() else b""
    if not damage and (not data or data.endswith(b"\n")):
        return
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    bad = {d.line: d for d in damage}
    if bad:
        side = Path(side_file)
        try:
            with open(side, "ab", buffering=0) as fh:
                append_whole(fh, b"".join(json.dumps({**bad[n].as_dict(), "text": lines[n - 1].decode("utf-8", "replace")}).encode() + b"\n"
                                          for n in sorted(bad)))
                os.fsync(fh.fileno())
        except OSError as e:
            raise OutputWriteError(side, e) from None
    kept = b"".join(raw + b"\n" for n, raw in enumerate(lines, start=1) if n not in bad)
    tmp = p.with_name(p.name + ".repair")
    try:
        with open(tmp, "wb", buffering=0) as fh:
            append_whole(fh, kept)
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except (OSError, OutputWriteError) as e:
        tmp.unlink(missing_ok=True)
        raise e if isinstance(e, OutputWriteError) else OutputWriteError(p, e) from None
    for d in damage:
        logger.warning("%s: set aside line %d, %s (%d bytes: %s); kept in %s", p, d.line, d.kind, d.size, d.reason, Path(side_file).name)


def recover(path: str | Path, parse: Callable[[dict], Any], side_file: str | Path, refuse_corrupt: str | None = None) -> tuple[list[Any], list[LineDamage]]:
    """:func:`read_lines` then :func:`repair`: the records of ``path``'s good lines and its damaged
    lines, which are set aside into ``side_file`` (and logged, each with its line number).

    Args:
        refuse_corrupt: when given, a ``corrupt`` line is not set aside but refused, with this as
            the consequence in the message (a torn last line is still set aside).

    Raises:
        JournalError: a corrupt line while ``refuse_corrupt`` (nothing is changed).
        OutputWriteError: the repair could not be written.
    """
    records, damage = read_lines(path, parse)
    bad = [d for d in damage if d.kind == "corrupt"]
    if bad and refuse_corrupt:
        raise JournalError(f"{path}:{bad[0].line} is corrupt ({bad[0].reason}): {refuse_corrupt}; restore the file from a copy, "
                           "or pass --overwrite")
    repair(path, damage, side_file)
    return records, damage
