"""What every section of the config schema is made of: a documented key (:func:`setting`), a closed
choice (:class:`Choice`), a problem a section reports (:data:`Problem`) and the errors loading raises.

Each section module (``policy``, ``env``, ``pool``, ``rollout``, ``local``, ``logging``) declares
its keys as ``name: type = setting(default, ge=1, doc="...")``: the type, the default, the range
and the doc of a key on one line or block, the doc kept in the field's metadata (``dataclasses.fields(cls)[i].metadata
["doc"]``) where :func:`rollout.core.config.schema_keys`, ``python -m rollout config --keys`` and
the test that holds docs/configuration.md to the schema read it. A section's ``problems()``
method, beside its keys, yields its own rules' violations; rules between sections are
:mod:`rollout.core.config.rules`'.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import typing
from collections.abc import Iterator
from typing import Any

Problem = tuple[str, str]
"""``(full key, what is wrong)``: a section's ``problems()`` yields these; validation raises the
first as :class:`ConfigError` ``"{key}: {what}"``."""

Problems = Iterator[Problem]


class ConfigError(ValueError):
    """A configuration key is missing, unknown, of the wrong type or out of range."""


class TaskSelectionError(ConfigError, KeyError):
    """``env.task_split`` or ``env.task_ids`` names a split or tasks the domain lacks (found when
    the domain loads; the message names the key). A ``KeyError`` too, as a lookup that failed."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A numeric key's range: ``ge`` / ``gt`` below, ``le`` above (``None``: open), checked by
    :func:`bound_problems`."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is in range (``nan`` is not)."""
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le))

    def message(self) -> str:
        """``must be >= 1``, ``must be > 0``, ``must be in (0, 1]``."""
        low = f"[{self.ge}" if self.ge is not None else f"({self.gt}"
        if self.le is not None:
            return f"must be in {low}, {self.le}]"
        return f"must be >= {self.ge}" if self.ge is not None else f"must be > {self.gt}"


def setting(default: Any, *, doc: str, ge: float | None = None, gt: float | None = None, le: float | None = None) -> Any:
    """A key of the schema: its default, its range (a number's) and its doc, for the class body
    line ``name: type = setting(default, ge=1, doc="...")``, or that line and the doc's prose in a
    triple-quoted block below it. The doc is kept in ``metadata["doc"]`` (its white space folded
    to single spaces), the range in ``metadata["bounds"]``.

    Args:
        default: the value when neither YAML nor an override sets the key; a list is copied for
            each instance (a ``default_factory``), anything else is shared as it is.
        doc: what the key does, its unit and what its values mean (one sentence or more).
        ge, gt, le: the range (``>= ge``, ``> gt``, ``<= le``), refused by :func:`bound_problems`
            as ``{key}: must be >= 1`` / ``must be > 0`` / ``must be in (0, 1]``; rules that
            need more words are the section's ``problems()``.

    Returns:
        a :func:`dataclasses.field`.

    Raises:
        ValueError: ``doc`` is empty (every key is documented), or a range without one lower
            bound (both ``ge`` and ``gt``, or ``le`` alone).
    """
    if not doc.strip():
        raise ValueError("every config key needs a doc")
    if (ge, gt, le) != (None, None, None) and (ge is None) == (gt is None):
        raise ValueError("a range has one lower bound: ge or gt")
    metadata: dict[str, Any] = {"doc": " ".join(doc.split())}
    if (ge, gt, le) != (None, None, None):
        metadata["bounds"] = Bounds(ge, gt, le)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def masked(value: str) -> str:
    """``value`` as a message may show what may be a secret: its first characters (at most 3, fewer
    for a short value) and its length, e.g. ``'sk-…' (51 characters)``; never the whole value."""
    return f"'{value[:min(3, len(value) // 4)]}…' ({len(value)} characters)"


def _looks_like_a_key(name: str) -> bool:
    """A variable name as long as an API key and mixing upper case, lower case and digits, as
    keys do (``hf_…``, ``ghp_…``) and variable names do not."""
    return len(name) >= 32 and any(c.isupper() for c in name) and any(c.islower() for c in name) and any(c.isdigit() for c in name)


def env_var_problems(key: str, name: str | None) -> Problems:
    """``(key, ...)`` when ``name`` (an ``*.api_key_env`` value: ``None`` or the name of an
    environment variable) is not a variable's name, e.g. the key itself pasted in. The message
    never holds the value, only :func:`masked`'s few first characters and its length."""
    if name is None:
        return
    if not name.isidentifier() or _looks_like_a_key(name):
        yield key, (f"must name the environment variable that holds the key (e.g. OPENAI_API_KEY), not the key itself, "
                    f"got {masked(name)}")


def bound_problems(section: Any, prefix: str) -> Problems:
    """``(key, "must be ...")`` for each key of ``section`` (a schema dataclass, not walked into its
    own sections) outside the range its :func:`setting` declares, in field order; no I/O."""
    for f in dataclasses.fields(section):
        bounds = f.metadata.get("bounds")
        if bounds is not None and not bounds.holds(getattr(section, f.name)):
            yield f"{prefix}.{f.name}", bounds.message()


class Choice(str, enum.Enum):
    """A closed config choice: a ``str`` whose value is what YAML and ``key=value`` write.

    A member equals, hashes and formats as its value (``PartialRollout.DROP == "drop"``,
    ``f"{m}"`` and ``json.dumps`` give ``drop``), so code comparing with strings keeps working.
    omegaconf's structured config checks a choice as the value is merged (it accepts the value or
    the member's name and refuses anything else); a refusal reads ``{key}: must be one of a, b,
    got 'x'`` (:func:`choice_error`).
    """

    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The valid values, in declaration order."""
        return tuple(m.value for m in cls)


def choice_error(key: str, choice: type[Choice], nullable: bool, value: Any) -> ConfigError:
    """The one-line error for a bad choice: ``{key}: must be one of a, b, got 'x'`` (values, not
    member names; ``must be null or one of`` for a nullable key)."""
    allowed = ", ".join(choice.values())
    return ConfigError(f"{key}: must be {'null or ' if nullable else ''}one of {allowed}, got {value!r}")


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """``{field name: resolved type}`` of a schema dataclass (cached)."""
    return typing.get_type_hints(cls)


def plain_values(value: Any) -> Any:
    """``value`` with every :class:`Choice` replaced by its value string (dicts and lists walked)."""
    if isinstance(value, Choice):
        return value.value
    if isinstance(value, dict):
        return {k: plain_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_values(v) for v in value]
    return value


def choice_of(tp: Any) -> tuple[type[Choice] | None, bool]:
    """``(the Choice enum, nullable)`` of a field type (``X`` or ``Optional[X]``); ``(None, False)``
    for any other type."""
    args = typing.get_args(tp)
    nullable = type(None) in args
    if nullable:
        tp = next((a for a in args if a is not type(None)), None)
    if isinstance(tp, type) and issubclass(tp, Choice):
        return tp, nullable
    return None, False


def values_to_names(node: Any, schema: type) -> Any:
    """Rewrite, in place, every choice value in ``node`` to its member's name, and return ``node``.

    omegaconf 2.4 accepts a member's value (``keep``) or name (``KEEP``) for an enum field;
    omegaconf 2.3 (which hydra-core 1.3 pins, so every environment with verl has it) accepts
    the name only and refuses ``policy.on_length: keep``. Names are accepted by both, so YAML and
    ``key=value`` overrides are rewritten before they are merged into the schema. Anything that is
    not a choice's value is left for omegaconf (and the schema's checks) to refuse.

    Args:
        node: an omegaconf ``DictConfig`` (a loaded YAML file or a dot-list), or anything else
            (returned as it is).
        schema: the dataclass whose fields ``node``'s keys are (:class:`rollout.core.config.Config`).
    """
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig) or not dataclasses.is_dataclass(schema):
        return node
    hints = field_types(schema)
    for key in list(node.keys()):
        tp = hints.get(str(key))
        if tp is None:
            continue
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
        if dataclasses.is_dataclass(tp):
            values_to_names(node[key], tp)
        elif isinstance(tp, type) and issubclass(tp, Choice):
            value = node._get_node(key)._value()
            member = None
            if isinstance(value, str):  # a value, else a value or name in another case (omegaconf 2.4 takes any case)
                member = next((m for m in tp if value == m.value), None) or next(
                    (m for m in tp if value.lower() in (m.value.lower(), m.name.lower())), None)
            if member is not None:
                node[key] = member.name
    return node
