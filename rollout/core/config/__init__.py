"""Configuration schema and loading.

The schema is a tree of typed dataclasses, one module per section: :mod:`~rollout.core.config.pool`,
:mod:`~rollout.core.config.policy`, :mod:`~rollout.core.config.env`,
:mod:`~rollout.core.config.rollout`, :mod:`~rollout.core.config.local` (the local stack's 23 keys)
and :mod:`~rollout.core.config.logging`. Each holds its dataclasses, where every key is one line
or block ``name: type = setting(default, ge=1, doc="...")`` (:func:`setting`), its closed choices
(:class:`Choice` enums) beside them, and a ``problems()`` method with the section's own rules; the
rules between sections are :mod:`rollout.core.config.rules`'. :func:`schema_keys` lists every key
with its type, default and doc (``python -m rollout config --keys``; docs/configuration.md is held
to it by tests/unit/test_config_schema.py).

:func:`load_config` merges, in this order, the schema defaults, a YAML file and CLI overrides
``key=value`` (omegaconf dot-list syntax, e.g. ``pool.num_actors=4 env.task_ids=[0,1]``), then
validates. Unknown keys, wrong types and shapes and bad values raise :class:`ConfigError` naming the
full key; a file that is no config (a folder, not UTF-8, not YAML, a ``!!python/...`` tag, a top
level that is not a mapping) raises it naming the file, with YAML's line and column.
Each component receives only its own section (``PolicyConfig`` for the policy client,
``EnvConfig`` for the environment, ...).

Closed choices are :class:`Choice` enums whose values are the strings YAML holds (a ``Choice`` is a
``str``: ``cfg.rollout.partial_rollout == "continue"``), checked by omegaconf's structured config as
the value is merged; :meth:`Config.to_yaml` and :meth:`Config.to_dict` write the plain values.
``env.benchmark``, ``policy.chat_format`` and ``policy.context_strategy`` are open (registries) and
checked against the names registered so far. :func:`validate` checks ranges and cross-field rules
and does no I/O: what the config names on this machine (tau2's ``env.domain``, read from tau2's
source; uvloop for the local stack) is checked by :func:`rollout.app.preflight.check_config`,
before anything starts.
"""

from __future__ import annotations

from rollout.core.config.base import (
    Choice,
    ConfigError,
    Problem,
    TaskSelectionError,
    choice_of,
    plain_values,
    setting,
    values_to_names,
)
from rollout.core.config.env import TASK_SPLITS, EnvConfig, Evaluator, JudgeConfig, JudgeKind, OpenIssues, UserConfig, UserKind
from rollout.core.config.load import config_from_dict, load_config
from rollout.core.config.local import (
    LocalBackend,
    LocalConfig,
    LocalKVConfig,
    LocalVllmConfig,
    RouterPolicy,
    TinyModelConfig,
    VllmRouterPolicy,
)
from rollout.core.config.logging import LoggingConfig, LogLevel
from rollout.core.config.policy import History, OnLength, OnParseError, PolicyConfig, Routing, SamplingConfig
from rollout.core.config.pool import AdaptiveConcurrencyConfig, EventLoop, KVSignal, Placement, PoolConfig
from rollout.core.config.rollout import (
    GroupFilter,
    OnGroupFailure,
    OnStale,
    PartialRollout,
    RewardShapingConfig,
    RolloutConfig,
    SampleMode,
)
from rollout.core.config.rules import cross_section_problems
from rollout.core.config.schema import Config, SchemaKey, schema_keys, validate

__all__ = [
    # loading and errors
    "Config", "ConfigError", "TaskSelectionError", "load_config", "config_from_dict", "validate",
    # the schema, read as data
    "SchemaKey", "schema_keys", "setting", "Problem", "cross_section_problems",
    # the sections
    "PoolConfig", "AdaptiveConcurrencyConfig", "PolicyConfig", "SamplingConfig", "EnvConfig", "UserConfig", "JudgeConfig",
    "RolloutConfig", "RewardShapingConfig", "LocalConfig", "TinyModelConfig", "LocalKVConfig", "LocalVllmConfig",
    "VllmRouterPolicy", "LoggingConfig",
    # the closed choices
    "Choice", "EventLoop", "KVSignal", "Placement", "OnParseError", "OnLength", "History", "Routing", "UserKind", "JudgeKind",
    "Evaluator", "OpenIssues", "PartialRollout", "SampleMode", "OnStale", "GroupFilter", "OnGroupFailure", "LocalBackend",
    "RouterPolicy", "LogLevel",
    # helpers of the choices
    "choice_of", "plain_values", "values_to_names", "TASK_SPLITS",
]
