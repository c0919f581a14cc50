"""Command-line entry points that print, made pipe-safe: ``python -m rollout formats | head -n 1``
ends quietly instead of with a ``BrokenPipeError`` traceback.

Python ignores ``SIGPIPE``, so a write to a pipe whose reader has gone raises ``BrokenPipeError``;
the standard recipe (Python's documentation of the :mod:`signal` module, "Note on SIGPIPE") is
to catch it at the entry point and point standard output at ``os.devnull``, so that the
interpreter's own flush at exit does not fail again. :func:`pipe_safe` does that, and only when
standard output's reader is really gone: a ``BrokenPipeError`` from anything else (a socket, a
child's pipe) is a bug and propagates with its traceback.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Callable

__all__ = ["EXIT_PIPE_CLOSED", "pipe_safe"]

# 128 + SIGPIPE: what a shell reports for a command that SIGPIPE ended (as `yes | head` ends `yes`)
EXIT_PIPE_CLOSED = 128 + int(signal.SIGPIPE)


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe (or socket) whose reading end is closed (``poll`` reports
    an error or a hang-up on it); False when it cannot tell."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def pipe_safe(main: Callable[[], int]) -> int:
    """Run an entry point's ``main()`` and flush standard output (also when it raises
    ``SystemExit``, as argparse's ``--help`` does); when the reader of standard output went away (``BrokenPipeError`` with its reading end closed), point standard output at
    ``os.devnull`` and return :data:`EXIT_PIPE_CLOSED` (141) without a traceback.

    Returns:
        ``main()``'s exit status, or 141.

    Raises:
        BrokenPipeError: one that did not come from standard output (see the module docstring);
            whatever else ``main`` raises.
    """
    try:
        try:
            code = main()
        except SystemExit:  # argparse's --help and usage errors print, then exit
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at exit: a reader that left shows now
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE_CLOSED
