"""Logging set-up for the processes of a run (the CLI's driver, the actors, the tools).

Modules log through ``logging.getLogger(__name__)``; :func:`setup_logging` gives a process one
handler (with the pid) and the levels of ``logging.level``; it is idempotent.
"""

from __future__ import annotations

import logging

from rollout.core.config import LoggingConfig


def setup_logging(cfg: LoggingConfig) -> None:
    """Configure the root logger once per process (idempotent)."""
    root = logging.getLogger()
    if not any(getattr(h, "_rollout", False) for h in root.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"))
        h._rollout = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(cfg.level.upper())
    # litellm logs every completion call at INFO; the user simulator calls it once per turn.
    for noisy in ("LiteLLM", "litellm", "httpx"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
