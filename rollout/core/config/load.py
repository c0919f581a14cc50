"""Loading: defaults, then a YAML file, then ``key=value`` overrides, merged by omegaconf over the
schema (:class:`rollout.core.config.Config`) and validated (:func:`rollout.core.config.validate`).

Whatever the file or an override holds, loading fails with one :class:`ConfigError` line naming
the file (with YAML's line and column) or the key: a file that is no YAML, not UTF-8 or holds a
Python tag, a top level that is not a mapping of sections, a section given a value, a list key
given a scalar or a mapping, a scalar key given a container; omegaconf's own errors (an unknown
key, a value of the wrong type) are worded by :func:`_omegaconf_error`.
"""

from __future__ import annotations

import dataclasses
import io
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rollout.core.config.base import ConfigError, choice_error, choice_of, field_types, values_to_names
from rollout.core.config.schema import Config, validate

_NULL_TAG = "tag:yaml.org,2002:null"  # a file holding only ``~`` or ``null``: no keys, as an empty file
# What a list key holds, in its refusal (``{key}: expects ...``); other list keys hold strings.
_LIST_OF = {"env.task_ids": "a list of task ids (ints or strings, as the benchmark names its tasks: [0, 1] or [test-0, test-1])"}


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


def _yaml_problem(e: yaml.YAMLError, marks: bool = True) -> str:
    """YAML's error in one line: ``line L, column C: {problem} ({context} at line ...)`` (without
    the lines and columns when ``marks`` is false: a one-line override's value); a Python tag
    (``!!python/...``) as not allowed."""
    problem = getattr(e, "problem", None)
    mark = getattr(e, "problem_mark", None) if marks else None
    if problem is None:  # a reader error (a character YAML refuses), or one without marks
        return f"not valid YAML: {' '.join(str(e).split())}"
    tag = problem.partition("constructor for the tag ")[2].strip("'")
    if tag:
        problem = (f"the tag {tag.replace('tag:yaml.org,2002:', '!!')} is not allowed: a config holds plain values "
                   "(strings, numbers, booleans, lists, mappings)")
    context = getattr(e, "context", None)
    cmark = getattr(e, "context_mark", None) if marks else None
    if context:
        started = f" at line {cmark.line + 1}, column {cmark.column + 1}" if cmark is not None and cmark is not mark else ""
        problem += f" ({context}{started})"
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def _kind(value: Any) -> str:
    """What a YAML value is, in a message."""
    if isinstance(value, (dict, DictConfig)):
        return "a mapping"
    if isinstance(value, (list, ListConfig)):
        return "a list"
    return "null" if value is None else f"{value!r}"


def _line_column(text: str | bytes, offset: int) -> str:
    """``line L, column C`` (from 1) of ``offset`` in ``text``."""
    newline = "\n" if isinstance(text, str) else b"\n"
    return f"line {text.count(newline, 0, offset) + 1}, column {offset - (text.rfind(newline, 0, offset) + 1) + 1}"


def _read_yaml(path: str | Path) -> DictConfig:
    """The YAML file ``path`` as a ``DictConfig`` (an empty file: an empty one).

    Raises:
        FileNotFoundError: nothing is at ``path``.
        ConfigError: a folder, an unreadable file, not UTF-8, not YAML, a Python tag, or a top
            level that is not a mapping; the message names the file (and YAML's line and column).
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder, not a YAML file (e.g. --config configs/local.yaml)")
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"{p}: cannot be read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}, {_line_column(data, e.start)}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as UTF-8") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # the top level's kind, before anything is built
        if root is not None and not isinstance(root, yaml.MappingNode) and root.tag != _NULL_TAG:
            kind = "a list" if isinstance(root, yaml.SequenceNode) else f"{root.value!r}"
            raise ConfigError(f"{p}: the top level must be a mapping of sections (pool:, policy:, env:, rollout:, local:, "
                              f"logging:), got {kind}")
        node = OmegaConf.load(io.StringIO(text))
    except yaml.reader.ReaderError as e:  # a character YAML refuses (a control character, say)
        code = ord(e.character) if isinstance(e.character, str) else e.character
        raise ConfigError(f"{p}, {_line_column(text, e.position)}: {e.reason} (character U+{code:04X})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}, {_yaml_problem(e)}" if getattr(e, "problem_mark", None) else f"{p}: {_yaml_problem(e)}") from None
    assert isinstance(node, DictConfig)
    return node


def _check_override(override: str) -> None:
    """One ``key=value`` override is of that form and its value reads as YAML (as omegaconf's dot-list reads it).

    Raises:
        ConfigError: not ``key=value``, or a value YAML cannot read (naming the key).
    """
    key, eq, value = override.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"override {override!r} is not of the form key=value")
    try:
        OmegaConf.from_dotlist([override])
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: cannot read the value {value!r} as YAML: {_yaml_problem(e, marks=False)}") from None


def _check_list(key: str, value: Any, nullable: bool) -> None:
    """``value`` (a loaded node's) fits the list key ``key``: a list of scalars (or null, if ``nullable``).

    Raises:
        ConfigError: naming ``key``, what it expects and what it got.
    """
    what = _LIST_OF.get(key, "a list of strings (e.g. [a, b])")
    if not (isinstance(value, ListConfig) or (value is None and nullable)):
        raise ConfigError(f"{key}: expects {what}, got {_kind(value)}")
    for i in range(len(value) if value is not None else 0):
        item = value._get_node(i)
        if isinstance(item, (DictConfig, ListConfig)):
            raise ConfigError(f"{key}: expects {what}, got {_kind(item)} at position {i}")
        if not item._is_interpolation() and item._value() is None:
            raise ConfigError(f"{key}: expects {what}, got null at position {i}")


def _check_shape(node: DictConfig, schema: type, prefix: str = "") -> None:
    """Every key of ``node`` (a loaded file or overrides, not merged yet) has a value of the shape
    ``schema``'s field takes: a section a mapping, a list key a list of scalars, any other key a
    single value. omegaconf refuses these with a ``TypeError`` or a message without the key; keys
    the schema lacks and interpolations are left to omegaconf.

    Raises:
        ConfigError: naming the first key whose value has the wrong shape.
    """
    hints = field_types(schema)
    for key in node.keys():
        tp = hints.get(str(key))
        if tp is None or OmegaConf.is_interpolation(node, str(key)):
            continue
        full = f"{prefix}{key}"
        child = node._get_node(key)
        value = child if isinstance(child, (DictConfig, ListConfig)) else child._value()
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = type(None) in typing.get_args(tp)
        tp = args[0] if nullable and len(args) == 1 else tp
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, DictConfig):
                keys = ", ".join(f.name for f in dataclasses.fields(tp))
                raise ConfigError(f"{full}: is a section (its keys: {keys}), got {_kind(value)}")
            _check_shape(value, tp, full + ".")
        elif typing.get_origin(tp) is list:
            _check_list(full, value, nullable)
        elif isinstance(value, (DictConfig, ListConfig)):
            raise ConfigError(f"{full}: expects a single value, got {_kind(value)}")


def _merge(merged: Any, node: DictConfig) -> Any:
    """``node`` (a file or the overrides) merged over ``merged``, its shape checked first."""
    _check_shape(node, Config)
    return OmegaConf.merge(merged, values_to_names(node, Config))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from defaults, an optional YAML file and overrides.

    Args:
        path: YAML file (UTF-8; a mapping of sections at the top level); its keys must exist in the schema.
        overrides: ``key=value`` strings (omegaconf dot-list syntax).

    Raises:
        ConfigError: one line naming the file (with YAML's line and column) or the key: a folder,
            a file that is not UTF-8 or not YAML or holds a Python tag (``!!python/...``), a top
            level that is not a mapping; an unknown key, a value of the wrong type or shape, a
            malformed override or an invalid value. FileNotFoundError if nothing is at ``path``.
    """
    try:
        merged = OmegaConf.structured(Config)
        if path is not None:
            merged = _merge(merged, _read_yaml(path))
        if overrides:
            for o in overrides:
                _check_override(o)  # each refused on its own, naming its key
            merged = _merge(merged, OmegaConf.from_dotlist(list(overrides)))
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
        cfg = OmegaConf.to_object(_merge(OmegaConf.structured(Config), OmegaConf.create(d)))
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e) from None
    return validate(cfg)
