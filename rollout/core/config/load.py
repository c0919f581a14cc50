"""Loading: defaults, then a YAML file, then ``key=value`` overrides, merged by omegaconf over the
schema (:class:`rollout.core.config.Config`) and validated (:func:`rollout.core.config.validate`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rollout.core.config.base import ConfigError, choice_error, choice_of, field_types, values_to_names
from rollout.core.config.schema import Config, validate


def _omegaconf_error(e: OmegaConfBaseException) -> ConfigError:
    """One line naming the key for what omegaconf refused; for a choice, the valid values (omegaconf's
    own message lists the members' names: ``expected one of [TRUNCATE, KEEP]``)."""
    key = getattr(e, "full_key", None) or getattr(e, "key", None)
    owner, name = getattr(e, "object_type", None), getattr(e, "key", None)
    if key and dataclasses.is_dataclass(owner) and isinstance(name, str) and name in field_types(owner):
        choice, nullable = choice_of(field_types(owner)[name])
        if choice is not None:
            return choice_error(str(key), choice, nullable, getattr(e, "value", None))
    msg = str(e).splitlines()[0]
    return ConfigError(f"{key}: {msg}" if key else msg)


def _load_yaml(path: Path) -> DictConfig:
    """The YAML file ``path`` as omegaconf's mapping.

    Raises:
        ConfigError: one line naming the file: not YAML (with the line and column), not text, or
            not a mapping of sections.
    """
    try:
        node = OmegaConf.load(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or " ".join(str(e).split())
        raise ConfigError(f"{path}: not valid YAML: {what}{where}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a YAML config is UTF-8 text)") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: not a YAML mapping of sections (pool, policy, env, rollout, local, logging) but a list or a value")
    return node


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from defaults, an optional YAML file and overrides.

    Args:
        path: YAML file; its keys must exist in the schema.
        overrides: ``key=value`` strings (omegaconf dot-list syntax).

    Raises:
        ConfigError: unknown key, wrong type, malformed override or invalid value (the message
            names the key); a file that is not a YAML mapping (the message names the file);
            FileNotFoundError if ``path`` does not exist.
    """
    schema = OmegaConf.structured(Config)
    try:
        merged = schema
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise FileNotFoundError(f"config file not found: {p}")
            merged = OmegaConf.merge(merged, values_to_names(_load_yaml(p), Config))
        if overrides:
            for o in overrides:
                if "=" not in o:
                    raise ConfigError(f"override {o!r} is not of the form key=value")
            merged = OmegaConf.merge(merged, values_to_names(OmegaConf.from_dotlist(list(overrides)), Config))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e) from None
    assert isinstance(cfg, Config)
    return validate(cfg)


def config_from_dict(d: dict[str, Any]) -> Config:
    """Rebuild a validated :class:`Config` from :meth:`Config.to_dict` output (e.g. in a Ray job).

    Raises:
        ConfigError: as :func:`load_config`.
    """
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), values_to_names(OmegaConf.create(d), Config)))
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e) from None
    return validate(cfg)
