"""The tokenizer checks: ``policy.tokenizer`` loads, and matches the served model's tokenizer as far
as the server reports it (see :mod:`rollout.app.preflight` for what servers report); and the facts
a server reports about its tokenizer (:func:`tokenizer_facts`, served by the local test server).

The facts the checks compare (:func:`tokenizer_facts`: size, EOS, the chat template's special
tokens) are cached on disk (:func:`cached_tokenizer_facts`), keyed by the tokenizer's files (path,
size and modification time of each) and the ``transformers`` version: a job started again with the
same tokenizer neither imports ``transformers`` nor loads the tokenizer in the driver (1.5-2 s
here, 7-8 s measured on a 16-core machine), while the actors load it anyway. Changing any file
changes the key; a hub id that is not a local folder is never cached (it is loaded, as before).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from rollout.app.preflight.errors import PreflightError, one_line

logger = logging.getLogger(__name__)


def chat_template_special_tokens(tokenizer) -> dict[str, int]:
    """The added tokens that the tokenizer's chat template writes, as ``{token text: id}``.

    These are the tokens whose ids must agree between the client (which renders prompts) and the
    server (which samples them): for Qwen3 ``<|im_start|>``, ``<|im_end|>``, ``<think>``,
    ``</think>``, ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``.

    Args:
        tokenizer: a ``transformers`` tokenizer (its ``added_tokens_decoder`` and
            ``chat_template``, a string or a dict of named templates).

    Returns:
        The mapping, sorted by id; empty when the tokenizer has no chat template.
    """
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "\n".join(str(t) for t in template.values())
    elif isinstance(template, list):  # [{"name": ..., "template": ...}] in some configs
        template = "\n".join(str(t.get("template", "")) if isinstance(t, dict) else str(t) for t in template)
    if not template:
        return {}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {str(getattr(tok, "content", tok)): int(i) for i, tok in decoder.items()
             if str(getattr(tok, "content", tok)) and str(getattr(tok, "content", tok)) in template}
    return dict(sorted(found.items(), key=lambda kv: kv[1]))


def _eos_ids(tokenizer) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else sorted(int(e) for e in eos)


def tokenizer_facts(tokenizer) -> dict[str, Any]:
    """What a server reports about its tokenizer, so that clients can compare (see module doc).

    Returns:
        ``{"tokenizer_vocab_size": int (len(tokenizer), added tokens included), "eos_token_id":
        int | list[int] | None, "special_tokens": {token: id}}``.
    """
    eos = _eos_ids(tokenizer)
    return {
        "tokenizer_vocab_size": len(tokenizer),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "special_tokens": chat_template_special_tokens(tokenizer),
    }


# False: the checks load the tokenizer every time, as before the cache (python -m rollout.bench
# startup turns it off for its "before" rows).
FACTS_CACHE = True
_FACTS_FORMAT = 1  # bump when tokenizer_facts changes what it computes


def _facts_key(name: str) -> str | None:
    """The cache key of ``policy.tokenizer`` ``name``'s facts: a hash of its local files (path,
    size, mtime), the name, the ``transformers`` version and the facts' format; ``None`` where
    nothing local identifies the tokenizer (a hub id), or ``transformers`` is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    from rollout.core.tokenizer import BUILTIN_QWEN3, _vocabulary_module, builtin_qwen3_path

    try:
        if name == BUILTIN_QWEN3:
            where = builtin_qwen3_path()
        elif name.startswith("builtin:"):
            module = _vocabulary_module(name)
            where = Path(module.vocabulary_files(name.removeprefix("builtin:")))
        else:
            where = Path(os.path.expanduser(name))
            if not where.is_dir():
                return None
        files = sorted(p for p in where.iterdir() if p.is_file()) if where.is_dir() else [where]
        stats = [(str(p.resolve()), st.st_size, st.st_mtime_ns) for p in files for st in [p.stat()]]
        tf = version("transformers")
    except (OSError, FileNotFoundError, PackageNotFoundError):
        return None
    extra = [name, tf, _FACTS_FORMAT, module.__name__] if name.startswith("builtin:") and name != BUILTIN_QWEN3 else [name, tf, _FACTS_FORMAT]
    return hashlib.sha256(json.dumps([extra, stats]).encode()).hexdigest()[:24]


def facts_cache_dir() -> Path:
    """Where the facts are cached: ``$XDG_CACHE_HOME/tau-rollout/tokenizer-facts`` (``~/.cache`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "tau-rollout" / "tokenizer-facts"


def cached_tokenizer_facts(name: str) -> tuple[dict[str, Any], bool]:
    """:func:`tokenizer_facts` of ``policy.tokenizer`` ``name``, from the cache when its files are
    those the cached facts were computed from (see the module docstring), else by loading it
    (:func:`rollout.core.tokenizer.load_tokenizer`) and caching them (best effort: an unwritable
    cache only costs the load next time).

    Returns:
        ``(facts, from_cache)``.

    Raises:
        Exception: whatever loading the tokenizer raises (on a cache miss).
    """
    key = _facts_key(name) if FACTS_CACHE else None
    path = facts_cache_dir() / f"{key}.json" if key else None
    if path is not None:
        try:
            facts = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(facts, dict) and {"tokenizer_vocab_size", "eos_token_id", "special_tokens"} <= set(facts):
                return facts, True
        except (OSError, ValueError):
            pass
    from rollout.core.tokenizer import load_tokenizer

    facts = tokenizer_facts(load_tokenizer(name))
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            tmp.write_text(json.dumps(facts), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as e:
            logger.debug("tokenizer facts not cached at %s: %r", path, e)
    return facts, False


def check_tokenizer(model_info: dict, tokenizer) -> None:
    """The served model's tokenizer matches ``policy.tokenizer`` as far as the server reports it.

    Compared when reported: ``tokenizer_vocab_size`` (``len(tokenizer)``), the chat template's
    special tokens (``special_tokens``: every token the client's template writes must have the
    same id on the server) and ``eos_token_id``. A server reporting only ``vocab_size`` (the
    model's embedding rows, usually padded) is checked for ``len(tokenizer) <= vocab_size``.
    What the server does not report (real SGLang reports none of these) is logged at INFO.

    Args:
        model_info: what :func:`check_router` returned.
        tokenizer: a loaded ``transformers`` tokenizer, or a ``policy.tokenizer`` name whose
            facts come from :func:`cached_tokenizer_facts` (loaded with
            :func:`rollout.core.tokenizer.load_tokenizer` unless cached).

    Raises:
        PreflightError: a mismatch (the message names both values), or the tokenizer does not
            load. One line.
    """
    name = tokenizer if isinstance(tokenizer, str) else getattr(tokenizer, "name_or_path", "?")
    if isinstance(tokenizer, str):
        try:
            ours, _ = cached_tokenizer_facts(tokenizer)
        except Exception as e:  # noqa: BLE001  (any load failure is one preflight line)
            raise PreflightError(f"policy.tokenizer {name!r} does not load: {one_line(f'{type(e).__name__}: {e}')}") from None
    else:
        ours = tokenizer_facts(tokenizer)
    ours_eos = sorted(ours["eos_token_id"]) if isinstance(ours["eos_token_id"], list) else (
        [] if ours["eos_token_id"] is None else [ours["eos_token_id"]])
    model = model_info.get("model_path", "?")
    unchecked: list[str] = []

    n_srv = model_info.get("tokenizer_vocab_size")
    if isinstance(n_srv, int):
        if n_srv != ours["tokenizer_vocab_size"]:
            raise PreflightError(
                f"tokenizer mismatch: the served model {model!r} has a tokenizer of {n_srv} tokens, "
                f"policy.tokenizer {name!r} has {ours['tokenizer_vocab_size']}"
            )
    elif isinstance(model_info.get("vocab_size"), int):
        if ours["tokenizer_vocab_size"] > model_info["vocab_size"]:
            raise PreflightError(
                f"tokenizer mismatch: the served model {model!r} has a vocabulary of {model_info['vocab_size']} ids, "
                f"policy.tokenizer {name!r} has {ours['tokenizer_vocab_size']} tokens"
            )
        unchecked.append("exact tokenizer size (only the model's vocab_size is reported)")
    else:
        unchecked.append("vocabulary size")

    specials = model_info.get("special_tokens")
    if isinstance(specials, dict):
        bad = [f"{tok!r}: {specials.get(tok)} vs {tid}" for tok, tid in ours["special_tokens"].items() if specials.get(tok) != tid]
        if bad:
            raise PreflightError(
                f"tokenizer mismatch: chat-template special tokens differ between the served model {model!r} and "
                f"policy.tokenizer {name!r} (server vs ours): {one_line(', '.join(bad), 300)}"
            )
    else:
        unchecked.append("chat-template special tokens")

    eos_srv = model_info.get("eos_token_id")
    if eos_srv is not None:
        srv = sorted(eos_srv) if isinstance(eos_srv, list) else [eos_srv]
        if srv != ours_eos:
            raise PreflightError(
                f"tokenizer mismatch: the served model {model!r} has eos_token_id {eos_srv}, "
                f"policy.tokenizer {name!r} has {ours['eos_token_id']}"
            )
    else:
        unchecked.append("EOS id")

    if unchecked:
        logger.info("tokenizer check: the server (model %s, tokenizer_path %s) does not report %s; not checked "
                    "(make sure policy.tokenizer %r is the served model's tokenizer)",
                    model, model_info.get("tokenizer_path"), ", ".join(unchecked), name)
    else:
        logger.info("tokenizer check: %s matches the served model %s (%d tokens, %d template tokens)",
                    name, model, ours["tokenizer_vocab_size"], len(ours["special_tokens"]))


_FITS: dict[tuple, str] = {}  # (tokenizer, chat format, template kwargs) -> the family, checked in this process


def _fit_key(name: str, chat_format: str, kwargs: dict) -> str | None:
    """The disk-cache key of a passed :func:`check_chat_format`: the tokenizer's facts key (its
    files and the ``transformers`` version), the format, the template's arguments, and the files
    of the ``rollout.core.formats`` package (size and mtime of each: a changed format is checked
    again); ``None`` where the tokenizer has no facts key (a hub id)."""
    facts = _facts_key(name)
    if facts is None:
        return None
    folder = Path(__file__).resolve().parents[2] / "core" / "formats"
    code = sorted((p.name, st.st_size, st.st_mtime_ns) for p in folder.glob("*.py") for st in [p.stat()])
    return hashlib.sha256(json.dumps([facts, chat_format, sorted(kwargs.items()), code]).encode()).hexdigest()[:24]


def check_chat_format(tokenizer: str, chat_format: str, enable_thinking: bool | None = None) -> str:
    """``policy.chat_format`` fits ``policy.tokenizer``: the format is registered, ``auto`` detects
    a family, the format builds for the tokenizer and its start-up probe passes (exact delta
    tokenization), as every actor checks at its start (:class:`rollout.core.worker.RolloutWorker`),
    here in the driver before anything starts (seconds: the tokenizer is loaded). A pair that
    passed is remembered in this process and on disk beside the tokenizer's facts
    (:func:`facts_cache_dir`), keyed as :func:`cached_tokenizer_facts` is plus the format's own
    files, so a job started again loads no tokenizer in the driver.

    Args:
        tokenizer: ``policy.tokenizer`` (loadable: :func:`check_tokenizer_loads` ran first).
        chat_format: ``policy.chat_format`` (a registered name or ``auto``).
        enable_thinking: ``policy.enable_thinking`` (passed to the template when set).

    Returns:
        The family that will render prompts (``auto`` resolved).

    Raises:
        rollout.core.config.ConfigError: one line naming ``policy.chat_format`` and the packages
            it needs that are not installed here (``FormatInfo.unavailable``); or naming
            ``policy.chat_format`` and ``policy.tokenizer`` and why they do not fit (the format's own
            :class:`~rollout.core.formats.TemplateError`, or the probe's first problem).
    """
    from rollout.core.config import ConfigError
    from rollout.core.formats import AUTO, format_info

    try:  # a named format whose packages are not here: said before anything is loaded or read from the cache
        missing = None if chat_format == AUTO else format_info(chat_format).unavailable("this chat format")
    except (KeyError, ImportError, AttributeError):
        missing = None  # not registered (or its path does not import): choose_chat_format says so below
    if missing:
        raise ConfigError(f"policy.chat_format={chat_format}: {missing}")
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    memo = (tokenizer, chat_format, tuple(sorted(kwargs.items())))
    if memo in _FITS:
        return _FITS[memo]
    key = _fit_key(tokenizer, chat_format, kwargs) if FACTS_CACHE else None
    path = facts_cache_dir() / "chat-formats" / f"{key}.json" if key else None
    if path is not None:
        try:
            _FITS[memo] = str(json.loads(path.read_text(encoding="utf-8"))["chat_format"])
            return _FITS[memo]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not checked yet (or unreadable): checked below
    from rollout.core.formats import TemplateError, choose_chat_format, get_chat_format
    from rollout.core.formats.protocol import MissingPackageError
    from rollout.core.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    family = chat_format
    try:
        family = choose_chat_format(chat_format, tok, tokenizer)
        report = get_chat_format(family)(tok, tools=None, template_kwargs=kwargs).probe()
        why = None if report.ok else f"exact delta tokenization is impossible with chat format {family}: {report.problems[0]}"
    except MissingPackageError as e:  # not a misfit: the format's package is missing here
        detected = f" (chat format {family} for policy.tokenizer={tokenizer})" if family != chat_format else ""
        raise ConfigError(f"policy.chat_format={chat_format}{detected}: {e}") from None
    except TemplateError as e:
        why = str(e)
    if why is not None:
        raise ConfigError(f"policy.chat_format={chat_format} does not fit policy.tokenizer={tokenizer}: {one_line(why, 400)} "
                          "(python -m rollout formats lists each format's tokenizer)") from None
    _FITS[memo] = family
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            tmp.write_text(json.dumps({"chat_format": family}), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as e:
            logger.debug("chat format check not cached at %s: %r", path, e)
    return family


def check_tokenizer_loads(name: str) -> None:
    """``policy.tokenizer`` names something loadable (:func:`rollout.core.tokenizer.check_tokenizer_source`:
    no network wait for a hub id that is neither cached nor reachable), and it loads, before
    anything is started: loaded once per process and its facts cached on disk
    (:func:`cached_tokenizer_facts`; the preflight's comparison with the served tokenizer,
    :func:`check_tokenizer`, reuses them). Where the facts of these very files are cached, it
    loaded before and is not loaded again.

    Raises:
        PreflightError: one line naming ``policy.tokenizer``, what was tried and what to pass instead.
    """
    from rollout.core.tokenizer import TokenizerSourceError, check_tokenizer_source

    try:
        check_tokenizer_source(name)
    except TokenizerSourceError as e:
        raise PreflightError(str(e)) from None
    try:
        cached_tokenizer_facts(name)
    except Exception as e:  # noqa: BLE001  (any load failure is one line)
        raise PreflightError(f"policy.tokenizer={name} does not load: {one_line(f'{type(e).__name__}: {e}', 300)}; "
                             "pass builtin:qwen3 or a local folder with a chat model's tokenizer files") from None


# How long check_ray_address waits for a named Ray cluster to accept a connection (seconds): a
