"""How long this process has been running, counted from when its Python interpreter started.

The operating system's own start time of a process (``/proc/self/stat``) is that of its process
id, which ``exec`` keeps: ``bash -c "sleep 20; exec python -m rollout run ..."`` runs Python in a
process 20 s old, and a start-up counted from there came out at 362.9 s of a 61.7 s run (issue 28).
So the clock starts when this module is first imported: :mod:`rollout`'s ``__init__`` imports it
before anything else, and ``python -m rollout`` (like ``-m rollout.bench`` and ``-m rollout.check``)
imports the package first, so :data:`STARTED_AT` is the interpreter's start give or take its own
initialisation (tens of milliseconds, not counted). A program that imports :mod:`rollout` late (a
trainer, after its own imports) counts from that import.
"""

from __future__ import annotations

import time

__all__ = ["STARTED_AT", "process_age_s"]

# time.monotonic() when this process imported the package (see the module docstring)
STARTED_AT: float = time.monotonic()


def process_age_s() -> float:
    """Seconds since this process's interpreter started (:data:`STARTED_AT`), monotonic clock."""
    return time.monotonic() - STARTED_AT
