"""What one pytest session shares across its processes: a folder and the pid of the process that owns it.

``tests/conftest.py``'s ``pytest_configure`` calls :func:`begin` in the controller (the process
that starts the xdist workers, or the only process without ``-n``), before any worker starts: the
workers inherit ``TAU_ROLLOUT_SESSION_DIR`` and ``TAU_ROLLOUT_SESSION_PID`` through their
environment, and so does every process a test starts. What is started once for the whole session
(the shared Ray head, ``support.shared_ray``) is recorded in that folder under a file lock
(:func:`locked`), and stopped by the owner at the end (:func:`end`, from ``pytest_unconfigure``):
an xdist worker ends as soon as it has no more files to run, while the other one may still use
what it started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

DIR_ENV = "TAU_ROLLOUT_SESSION_DIR"
PID_ENV = "TAU_ROLLOUT_SESSION_PID"


def begin() -> Path:
    """Make the session's folder and name it (and this process as its owner) in the environment,
    in place of an enclosing session's (a pytest run that a test starts, e.g. in a framework's own
    venv, shares nothing with the session that started it)."""
    # short: Ray's socket paths under it (support.shared_ray) must fit in 107 bytes
    path = Path(tempfile.mkdtemp(prefix="trs-", dir="/tmp"))
    os.environ[DIR_ENV] = str(path)
    os.environ[PID_ENV] = str(os.getpid())
    return path


def owns() -> bool:
    """Whether this process began the session named in the environment (:func:`begin`)."""
    return os.environ.get(PID_ENV) == str(os.getpid())


def folder() -> Path:
    """The session's folder.

    Raises:
        RuntimeError: no session was begun (a helper used outside pytest, or before ``pytest_configure``).
    """
    path = os.environ.get(DIR_ENV)
    if not path or not Path(path).is_dir():
        raise RuntimeError(f"no pytest session folder (${DIR_ENV}): tests/conftest.py's pytest_configure makes it")
    return Path(path)


def owner_pid() -> int:
    """The pid of the process that began the session (what the session's shared processes watch)."""
    return int(os.environ.get(PID_ENV) or os.getpid())


@contextlib.contextmanager
def locked(name: str) -> Iterator[Path]:
    """Hold the session-wide lock ``name`` (``fcntl.flock`` on ``<folder>/<name>.lock``: one holder
    across every process of the session; released when the holder exits, also when it is killed).
    Yields the session's folder."""
    path = folder()
    with open(path / f"{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def end() -> None:
    """Remove the session's folder (the owner, once what was started in it is stopped)."""
    if owns():
        shutil.rmtree(os.environ[DIR_ENV], ignore_errors=True)
