"""Reading a JSONL file as it grows: only the bytes appended since the last read.

A run's files (:mod:`rollout.core.journal`, :mod:`rollout.core.output`) are appended line by line
while the run goes on, each line flushed whole. :class:`JsonlTail` remembers the byte offset after
the last complete line it read, so each refresh costs what was appended, not the whole file. A last
line without its newline yet (the writer is mid-write, or was killed there) is kept in memory and
completed by later reads, which read only the bytes appended after it; a complete line that is not a
JSON object, or longer than :data:`MAX_LINE_BYTES`, is skipped with a warning and never stops the
reading.

Only regular files are read (:func:`open_regular`, symbolic links followed): a FIFO, a device
(``/dev/zero``) or a socket under a run file's name is never opened for a blocking read, and is
read as empty with one warning.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import orjson

logger = logging.getLogger(__name__)

# Bytes read at a time: a large file is indexed in pieces, never loaded whole.
CHUNK_BYTES = 16 * 1024 * 1024
# The longest line kept (bytes): an episode sample of a 64k-token context is a few MB; a longer
# "line" (a file that is not JSONL, a missing newline) is skipped rather than held in memory.
MAX_LINE_BYTES = 256 * 1024 * 1024


class NotRegularFileError(OSError):
    """A run file's name holds a FIFO, a device or a socket, not a regular file."""


def open_regular(path: str | Path) -> tuple[BinaryIO, os.stat_result]:
    """Open ``path`` for reading when it is a regular file (a symbolic link is followed), without
    ever blocking: a FIFO is opened non-blocking and refused, as any other non-regular file.

    Returns:
        ``(binary file, its stat)``; the caller closes the file.

    Raises:
        FileNotFoundError: no such file.
        NotRegularFileError: it is not a regular file (a FIFO, ``/dev/zero``, a socket, a folder).
        OSError: it cannot be opened (permissions).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


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
        bytes_read: bytes read from the file so far, over every read (each byte once, whatever
            the number of reads that waited for a line's newline).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self.lines_seen = 0
        self.bytes_read = 0
        self._inode: int | None = None
        self._pending = bytearray()  # the unterminated last line read so far, from ``offset``
        self._overlong = False  # the line at ``offset`` passed MAX_LINE_BYTES: dropped up to its newline,
        self._skip_to = 0  # which the reads look for from here
        self._refused: str | None = None  # why the file was not read (warned once)

    @property
    def _read_to(self) -> int:
        """The file position the next read starts at: past the unterminated line held so far."""
        return self.offset + len(self._pending) if not self._overlong else self._skip_to

    def read_new(self, digest: Callable[[dict[str, Any]], Any] | None = None) -> TailRead:
        """Read the complete lines appended since the last call.

        Args:
            digest: applied to each parsed object as it is read; :attr:`TailLine.value` holds what
                it returns, so a caller that needs a few fields of each line (not its tokens) never
                holds every parsed line of a large file at once. None keeps the object. A digest
                that raises ``TypeError``, ``ValueError``, ``AttributeError`` or ``KeyError`` (or
                returns None) marks the line malformed.

        Returns:
            A :class:`TailRead`; empty when nothing complete was appended, the file is missing or
            is not a regular file (a FIFO, a device: logged once as a warning).

        Raises:
            OSError: the file exists but cannot be read (a permission problem); a file that
                disappeared between the check and the read reads as missing.
        """
        out = TailRead()
        try:
            f, st = open_regular(self.path)
        except FileNotFoundError:
            if self._read_to or self._inode is not None:
                self._restart(out)
            return out
        except NotRegularFileError as e:
            if self._refused is None:
                logger.warning("%s: not read (only regular files are)", e)
            self._refused = str(e)
            return out
        self._refused = None
        with f:
            if (self._inode is not None and st.st_ino != self._inode) or st.st_size < self._read_to:
                self._restart(out)
            self._inode = st.st_ino
            if st.st_size == self._read_to:
                return out
            f.seek(self._read_to)
            while True:
                chunk = f.read(CHUNK_BYTES)
                if not chunk:
                    break
                self.bytes_read += len(chunk)
                self._take(chunk, out, digest)
        return out

    def _take(self, chunk: bytes, out: TailRead, digest: Callable[[dict[str, Any]], Any] | None) -> None:
        """Consume ``chunk``, the bytes that follow :attr:`_read_to` in the file."""
        end = chunk.rfind(b"\n")
        if self._overlong:
            first = chunk.find(b"\n")
            if first < 0:
                self._skip_to += len(chunk)
                return
            self._end_overlong(self._skip_to + first + 1, out)
            chunk = chunk[first + 1:]
            end -= first + 1
        if end >= 0:
            block = bytes(self._pending) + chunk[: end + 1] if self._pending else chunk[: end + 1]
            self._pending.clear()
            self._parse(block, out, digest)
            chunk = chunk[end + 1:]
        self._pending += chunk
        if len(self._pending) > MAX_LINE_BYTES:
            self._skip_to = self.offset + len(self._pending)
            self._pending.clear()
            self._overlong = True

    def _end_overlong(self, end: int, out: TailRead) -> None:
        """The overlong line at :attr:`offset` ended at byte ``end`` (past its newline): skip it."""
        self.lines_seen += 1
        logger.warning("%s:%d: skipping a malformed line (longer than %d bytes)", self.path, self.lines_seen, MAX_LINE_BYTES)
        out.skipped += 1
        self.offset = end
        self._overlong = False

    def _restart(self, out: TailRead) -> None:
        logger.info("%s was replaced or truncated: reading it again from its start", self.path)
        self.offset = 0
        self.lines_seen = 0
        self._inode = None
        self._pending.clear()
        self._overlong = False
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
    f, _ = open_regular(path)
    with f:
        f.seek(offset)
        raw = f.read(length)
    value = orjson.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"{path} at byte {offset}: not a JSON object")
    return value
