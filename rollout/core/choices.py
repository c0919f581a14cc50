"""The closed choices of the config schema, importable from here as before: each :class:`Choice`
enum lives beside the keys it types, in its section's module of :mod:`rollout.core.config`
(``policy``, ``env``, ``pool``, ``rollout``, ``local``, ``logging``), and :class:`Choice` itself in
:mod:`rollout.core.config.base`."""

from __future__ import annotations

from rollout.core.config.base import Choice, choice_of, plain_values, values_to_names
from rollout.core.config.env import Evaluator, OpenIssues, UserKind
from rollout.core.config.local import LocalBackend, RouterPolicy
from rollout.core.config.logging import LogLevel
from rollout.core.config.policy import History, OnLength, OnParseError, Routing
from rollout.core.config.pool import EventLoop, KVSignal, Placement
from rollout.core.config.rollout import GroupFilter, OnGroupFailure, OnStale, PartialRollout, SampleMode

__all__ = [
    "Choice", "choice_of", "plain_values", "values_to_names",
    "UserKind", "Evaluator", "OpenIssues", "OnParseError", "OnLength", "History", "Routing", "PartialRollout", "SampleMode", "OnStale",
    "GroupFilter", "OnGroupFailure", "EventLoop", "KVSignal", "Placement", "LocalBackend", "RouterPolicy", "LogLevel",
]
