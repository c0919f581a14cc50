"""The whole schema: :class:`Config` (one field per section, in the order YAML and
:meth:`Config.to_dict` write them), :func:`validate` (every choice, each section's rules, then the
rules between sections) and :func:`schema_keys` (every key with its type, default and doc)."""

from __future__ import annotations

import dataclasses
import json
import textwrap
import typing
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from rollout.core.config.base import Bounds, ConfigError, choice_error, choice_of, field_types, plain_values
from rollout.core.config.env import EnvConfig
from rollout.core.config.local import LocalConfig
from rollout.core.config.logging import LoggingConfig
from rollout.core.config.policy import PolicyConfig
from rollout.core.config.pool import PoolConfig
from rollout.core.config.rollout import RolloutConfig
from rollout.core.config.rules import cross_section_problems


@dataclass
class Config:
    """The whole configuration; each component takes its own section."""

    pool: PoolConfig = field(default_factory=PoolConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as nested dicts of plain values (a choice as its value string), in schema
        order: what :func:`config_from_dict` rebuilds and the journal fingerprints."""
        return plain_values(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        """The config as YAML (plain values, schema order), e.g. ``config.yaml`` of a run."""
        return OmegaConf.to_yaml(OmegaConf.create(self.to_dict()))


def _check_choices(section: Any, prefix: str = "") -> None:
    """Check every choice of ``section`` (a schema dataclass, walked recursively), turning a plain
    value string into its member (a config built in code with strings).

    Raises:
        ConfigError: naming the first key whose value is not one of its choice's values.
    """
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _check_choices(value, key + ".")
            continue
        choice, nullable = choice_of(field_types(type(section))[f.name])
        if choice is None or (value is None and nullable) or isinstance(value, choice):
            continue
        try:
            setattr(section, f.name, choice(value))
        except ValueError:
            raise choice_error(key, choice, nullable, value) from None


def validate(cfg: Config) -> Config:
    """Check values beyond their types, without I/O (nothing imported; the one read is installed
    packages' entry-point metadata, for an ``env.benchmark`` the registry does not hold), in this
    order: every choice (schema order), ``~`` in ``rollout.output_dir`` expanded
    (:meth:`~rollout.core.config.RolloutConfig.expand_paths`), the rules of the sections ``env``, ``pool``, ``policy``,
    ``rollout`` and ``local`` (each section's ``problems()``), then the rules between sections
    (:func:`rollout.core.config.rules.cross_section_problems`). What the config names on this
    machine (a tau2 domain, uvloop for the local stack) is :func:`rollout.app.preflight.check_config`'s.

    Returns:
        ``cfg`` itself, its choices given as plain strings turned into their members and its
        ``rollout.output_dir`` with ``~`` expanded.

    Raises:
        ConfigError: ``"{key}: {what is wrong}"`` for the first bad key.
    """
    _check_choices(cfg)
    cfg.rollout.expand_paths()
    for problems in (cfg.env.problems(), cfg.pool.problems(), cfg.policy.problems(), cfg.rollout.problems(),
                     cfg.local.problems(), cross_section_problems(cfg.env, cfg.policy, cfg.rollout, cfg.local)):
        for key, msg in problems:
            raise ConfigError(f"{key}: {msg}")
    return cfg


@dataclass(frozen=True)
class SchemaKey:
    """One key of the schema: ``name`` (the full dotted key), ``type`` (the field's resolved type),
    ``default`` (as YAML writes it: a choice as its value string), ``doc`` (its
    ``metadata["doc"]``), ``choices`` (a choice's values; ``()`` for an open value), ``nullable``
    and ``bounds`` (a number's declared range; ``None``: none declared)."""

    name: str
    type: Any
    default: Any
    doc: str
    choices: tuple[str, ...]
    nullable: bool
    bounds: Bounds | None = None

    def type_text(self) -> str:
        """The type as a user reads it: ``int``, ``list[str] | null``, ``truncate | keep``."""
        if self.choices:
            text = " | ".join(self.choices)
        else:
            args = [a for a in typing.get_args(self.type) if a is not type(None)]
            tp = args[0] if self.nullable and len(args) == 1 else self.type
            text = tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp).replace("typing.", "")
        return f"{text} | null" if self.nullable else text

    def describe(self, width: int = 100) -> str:
        """``name: type = default`` (then the range, as ``(>= 1)``) and the doc wrapped below it,
        indented by 4."""
        head = f"{self.name}: {self.type_text()} = {json.dumps(self.default)}"
        if self.bounds is not None:
            head += f"  ({self.bounds.message().removeprefix('must be ')})"
        return head + "\n" + textwrap.fill(self.doc, width=width, initial_indent="    ", subsequent_indent="    ")


def schema_keys(cls: type = Config, prefix: str = "") -> list[SchemaKey]:
    """Every key of the schema ``cls`` (a section or the whole :class:`Config`), depth first in
    schema order, with its type, default and doc as declared beside the field.

    Raises:
        ValueError: a field that is neither a section nor a documented key (no ``metadata["doc"]``).
    """
    out: list[SchemaKey] = []
    defaults = cls()
    for f in dataclasses.fields(cls):
        tp = field_types(cls)[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += schema_keys(tp, name + ".")
            continue
        if not f.metadata.get("doc"):
            raise ValueError(f"{name}: a config key without a doc (declare it with rollout.core.config.setting)")
        choice, nullable = choice_of(tp)
        nullable = nullable or type(None) in typing.get_args(tp)
        out.append(SchemaKey(name, tp, plain_values(getattr(defaults, f.name)), f.metadata["doc"],
                             choice.values() if choice is not None else (), nullable, f.metadata.get("bounds")))
    return out
