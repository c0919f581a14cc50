"""The ``logging`` section: log levels (:func:`rollout.core.logs.setup_logging`)."""

from __future__ import annotations

from dataclasses import dataclass

from rollout.core.config.base import Choice, setting


class LogLevel(Choice):
    """``logging.level`` / ``logging.tau2_level``: a level name, in any case (``info`` is ``INFO``)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"

    @classmethod
    def _missing_(cls, value: object) -> LogLevel | None:
        upper = value.upper() if isinstance(value, str) else None
        return next((m for m in cls if m.value == upper), None)


@dataclass
class LoggingConfig:
    """``logging``: log levels (:func:`rollout.core.logs.setup_logging`)."""

    level: LogLevel = setting(LogLevel.INFO, doc="Our logs' level.")
    tau2_level: LogLevel = setting(LogLevel.ERROR, doc="""
        tau2's loguru logs' level: tau2 logs every tool response at DEBUG, and its evaluator warns at WARNING whenever one
        of a task's own gold actions fails on replay (a tau2 data quirk, harmless).""")
