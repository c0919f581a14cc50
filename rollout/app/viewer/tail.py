"""Reading a JSONL file as it grows: only the bytes appended since the last read.

A run's files (:mod:`rollout.core.journal`, :mod:`rollout.core.output`) are appended line by line
while the run goes on, each line flushed whole. :class:`JsonlTail` remembers the byte offset after
the last complete line it read, so each refresh costs what was appended, not the whole file. A last
line without its newline yet (the writer is mid-write, or was killed there) is left for a later
read; a complete line that is not a JSON object is skipped with a warning and never stops the
reading.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson

logger = logging.getLogger(__name__)

# Bytes read at a time: a large file is indexed in pieces, never loaded whole.
CHUNK_BYTES = 16 * 1024 * 1024


@dataclass
class TailLine:
    """One complete, valid line of a JSONL file.

    Attributes:
        offset: byte offset of the line's first byte in the file.
        length: the line's length in bytes, without its newline.
        number: the line's number in the file, from 1.
        value: the parsed JSON object, or what :meth:`JsonlTail.read_new`'s ``digest`` made of it.
    """

    offset: int
    length: int
    number: int
    value: Any


@dataclass
class TailRead:
    """What one :meth:`JsonlTail.read_new` found.

    Attributes:
        lines: the complete, valid lines appended since the previous read, in file order.
        reset: True when the file was replaced or shrank since the previous read (a run started
            afresh in the same folder, ``--overwrite``): ``lines`` then start from the file's first
            line, and everything read from it before is stale.
        skipped: complete lines that were not a JSON object (each logged once as a warning).
    """

    lines: list[TailLine] = field(default_factory=list)
    reset: bool = False
    skipped: int = 0


class JsonlTail:
    """Incremental reader of one JSONL file (see the module docstring).

    Args:
        path: the file; it may not exist yet (reads then find nothing).

    Attributes:
        offset: bytes of the file consumed so far (the end of the last complete line).
        lines_seen: complete lines consumed so far, valid or not.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self.lines_seen = 0
        self._inode: int | None = None

    def read_new(self, digest: Callable[[dict[str, Any]], Any] | None = None) -> TailRead:
        """Read the complete lines appended since the last call.

        Args:
            digest: applied to each parsed object as it is read; :attr:`TailLine.value` holds what
                it returns, so a caller that needs a few fields of each line (not its tokens) never
                holds every parsed line of a large file at once. None keeps the object. A digest
                that raises ``TypeError``, ``ValueError``, ``AttributeError`` or ``KeyError`` (or
                returns None) marks the line malformed.

        Returns:
            A :class:`TailRead`; empty when nothing complete was appended or the file is missing.

        Raises:
            OSError: the file exists but cannot be read (a permission problem); a file that
                disappeared between the check and the read reads as missing.
        """
        out = TailRead()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self.offset or self._inode is not None:
                self._restart(out)
            return out
        if (self._inode is not None and st.st_ino != self._inode) or st.st_size < self.offset:
            self._restart(out)
        self._inode = st.st_ino
        if st.st_size == self.offset:
            return out
        try:
            f = open(self.path, "rb")  # noqa: SIM115 (closed below; a read in pieces)
        except FileNotFoundError:
            return out
        with f:
            f.seek(self.offset)
            carry = b""
            while True:
                chunk = f.read(CHUNK_BYTES)
                if not chunk:
                    break
                data = carry + chunk
                end = data.rfind(b"\n")
                if end < 0:
                    carry = data
                    continue
                self._parse(data[: end + 1], out, digest)
                carry = data[end + 1 :]
        return out

    def _restart(self, out: TailRead) -> None:
        logger.info("%s was replaced or truncated: reading it again from its start", self.path)
        self.offset = 0
        self.lines_seen = 0
        self._inode = None
        out.reset = True
        out.lines.clear()

    def _parse(self, block: bytes, out: TailRead, digest: Callable[[dict[str, Any]], Any] | None) -> None:
        """Parse ``block`` (complete lines, ending with a newline) found at :attr:`offset`."""
        pos = 0
        while pos < len(block):
            nl = block.index(b"\n", pos)
            raw = block[pos:nl]
            start = self.offset + pos
            self.lines_seen += 1
            pos = nl + 1
            if not raw.strip():
                continue
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                value, why = None, str(e).splitlines()[0]
            else:
                why = f"a JSON {type(value).__name__}, not an object"
            if not isinstance(value, dict):
                value = None
            elif digest is not None:
                why = "not a record of the expected shape"
                try:
                    value = digest(value)
                except (TypeError, ValueError, AttributeError, KeyError) as e:  # an object of the wrong shape
                    value, why = None, f"{type(e).__name__}: {e}"
            if value is None:
                logger.warning("%s:%d: skipping a malformed line (%s)", self.path, self.lines_seen, why)
                out.skipped += 1
                continue
            out.lines.append(TailLine(offset=start, length=len(raw), number=self.lines_seen, value=value))
        self.offset += len(block)


def read_line_at(path: str | Path, offset: int, length: int) -> dict[str, Any]:
    """Read back the JSON object of one line that a :class:`JsonlTail` indexed.

    Raises:
        OSError: the file cannot be read.
        ValueError: the bytes there are not a JSON object any more (the file was replaced).
    """
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    value = orjson.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"{path} at byte {offset}: not a JSON object")
    return value
