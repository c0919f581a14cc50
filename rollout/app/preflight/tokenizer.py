"""The tokenizer checks: ``policy.tokenizer`` loads, and matches the served model's tokenizer as far
as the server reports it (see :mod:`rollout.app.preflight` for what servers report); and the facts
a server reports about its tokenizer (:func:`tokenizer_facts`, served by the local test server)."""

from __future__ import annotations

import logging
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


def check_tokenizer(model_info: dict, tokenizer) -> None:
    """The served model's tokenizer matches ``policy.tokenizer`` as far as the server reports it.

    Compared when reported: ``tokenizer_vocab_size`` (``len(tokenizer)``), the chat template's
    special tokens (``special_tokens``: every token the client's template writes must have the
    same id on the server) and ``eos_token_id``. A server reporting only ``vocab_size`` (the
    model's embedding rows, usually padded) is checked for ``len(tokenizer) <= vocab_size``.
    What the server does not report (real SGLang reports none of these) is logged at INFO.

    Args:
        model_info: what :func:`check_router` returned.
        tokenizer: a loaded ``transformers`` tokenizer, or a ``policy.tokenizer`` name loaded with
            :func:`rollout.core.tokenizer.load_tokenizer`.

    Raises:
        PreflightError: a mismatch (the message names both values), or the tokenizer does not
            load. One line.
    """
    name = tokenizer if isinstance(tokenizer, str) else getattr(tokenizer, "name_or_path", "?")
    if isinstance(tokenizer, str):
        from rollout.core.tokenizer import load_tokenizer

        try:
            tokenizer = load_tokenizer(tokenizer)
        except Exception as e:  # noqa: BLE001  (any load failure is one preflight line)
            raise PreflightError(f"policy.tokenizer {name!r} does not load: {one_line(f'{type(e).__name__}: {e}')}") from None
    ours = tokenizer_facts(tokenizer)
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
        if srv != _eos_ids(tokenizer):
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


def check_tokenizer_loads(name: str) -> None:
    """``policy.tokenizer`` names something loadable (:func:`rollout.core.tokenizer.check_tokenizer_source`:
    no network wait for a hub id that is neither cached nor reachable), and it loads, before
    anything is started (loaded once per process and cached: the preflight's comparison with the
    served tokenizer, :func:`check_tokenizer`, reuses it).

    Raises:
        PreflightError: one line naming ``policy.tokenizer``, what was tried and what to pass instead.
    """
    from rollout.core.tokenizer import TokenizerSourceError, check_tokenizer_source, load_tokenizer

    try:
        check_tokenizer_source(name)
    except TokenizerSourceError as e:
        raise PreflightError(str(e)) from None
    try:
        load_tokenizer(name)
    except Exception as e:  # noqa: BLE001  (any load failure is one line)
        raise PreflightError(f"policy.tokenizer={name} does not load: {one_line(f'{type(e).__name__}: {e}', 300)}; "
                             "pass builtin:qwen3 or a local folder with a chat model's tokenizer files") from None


# How long check_ray_address waits for a named Ray cluster to accept a connection (seconds): a
