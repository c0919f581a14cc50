"""Tokenizer calls that release the GIL: a fast tokenizer's Rust backend, used by
:class:`~rollout.core.formats.template.ChatTemplate` when it gives exactly ``transformers``' ids and
text (:func:`gil_free_codec` checks that before use)."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["RustCodec", "codec_check_texts", "gil_free_codec"]


class RustCodec:
    """Encode and decode through a fast tokenizer's Rust backend (a ``tokenizers.Tokenizer``):
    its *batch* calls, which release the GIL while they run (for worker threads), and its plain
    calls, which hold it (for the event loop's short texts).

    Why: the episode loop tokenizes in worker threads so that the event loop stays free, but a
    thread only leaves the loop free if it lets go of the GIL. ``transformers``' ``encode`` builds
    a ``BatchEncoding`` (offsets included) under the GIL and ``Tokenizer.decode`` holds it
    throughout, while ``encode_batch_fast`` / ``decode_batch`` release it for the Rust work, and
    ``encode_batch_fast`` skips the offsets. ``python -m rollout.bench turns`` measures both ways
    side by side (the main thread's lag while a thread tokenizes). The ids and text are the same
    as ``transformers``' (checked by :func:`gil_free_codec` before use).
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._encode_batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, the GIL released meanwhile (for worker threads)."""
        return self._encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, the GIL released meanwhile (for worker threads)."""
        return self._backend.decode_batch([list(ids)], skip_special_tokens=False)[0]

    def encode_holding_gil(self, text: str) -> list[int]:
        """Ids of ``text`` without releasing the GIL: for the event loop's short texts. A thread
        that lets the GIL go must take it back, which, while other threads run Python, waits up
        to the interpreter's switch interval (5 ms): far more than encoding a short text costs.
        (Measured with ``py-spy``: the loop spent 40% of its busy time in those waits when its
        short texts went through the releasing calls.)"""
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode_holding_gil(self, ids: list[int]) -> str:
        """Text of ``ids`` without releasing the GIL (see :meth:`encode_holding_gil`)."""
        return self._backend.decode(list(ids), skip_special_tokens=False)


def codec_check_texts(tokenizer: Any) -> list[str]:
    """Texts on which the Rust calls must give ``transformers``' ids and text: special tokens in
    running text, JSON, whitespace runs, non-ASCII, and (where the tokenizer has one) a rendered
    chat with a tool schema."""
    specials = [t for t in (getattr(tokenizer, "all_special_tokens", None) or []) if isinstance(t, str)][:8]
    texts = [
        "",
        "Hello, world.  Two  spaces\n\n\tand a tab.",
        '{"order_id": "#W2378156", "items": [{"price": 54.04, "options": {"color": "blue"}}]}',
        "Straße, naïve café, 東京, emoji \U0001F600\U0001F469\u200d\U0001F4BB, \u00a0nbsp",
        "<tool_call>\n{\"name\": \"get_user_details\", \"arguments\": {\"user_id\": \"mia_li_3668\"}}\n</tool_call>",
        " ".join(f"x{t}y {t}\n{t}" for t in specials),
    ]
    if getattr(tokenizer, "chat_template", None):
        try:
            tool = {"type": "function", "function": {"name": "lookup", "description": "Look up an order.",
                                                     "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
            texts.append(tokenizer.apply_chat_template(
                [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "Where is #W1?"}],
                tools=[tool], tokenize=False, add_generation_prompt=True))
        except Exception as e:  # a template that needs other messages: the plain texts suffice
            logger.debug("chat template: no rendered text for the codec check: %r", e)
    return texts


def gil_free_codec(tokenizer: Any) -> RustCodec | None:
    """A :class:`RustCodec` over ``tokenizer``'s Rust backend when it gives exactly the ids and
    text of ``tokenizer.encode(text, add_special_tokens=False)`` and ``tokenizer.decode(ids,
    skip_special_tokens=False)``; None otherwise (a slow tokenizer, one that cleans up spaces or
    splits special tokens, or a check that fails), and the ``transformers`` calls are used.

    The check encodes and decodes :func:`codec_check_texts` both ways, plus ids that cut a
    multi-byte character in half. Never raises.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or not type(backend).__module__.startswith("tokenizers"):
        return None
    if not all(hasattr(backend, a) for a in ("encode_batch", "decode_batch")):
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", False) or getattr(tokenizer, "split_special_tokens", False):
        return None
    if getattr(backend, "encode_special_tokens", False):
        return None
    codec = RustCodec(backend)
    try:
        for text in codec_check_texts(tokenizer):
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            if codec.encode(text) != ids or codec.encode_holding_gil(text) != ids:
                logger.info("chat template: the Rust tokenizer's ids differ from transformers' on %r; not used", text[:60])
                return None
            for probe in (ids, ids[: max(1, len(ids) // 2)], ids[1:]):
                want = tokenizer.decode(probe, skip_special_tokens=False)
                if codec.decode(probe) != want or codec.decode_holding_gil(probe) != want:
                    logger.info("chat template: the Rust tokenizer's text differs from transformers'; not used")
                    return None
    except Exception as e:  # any surprise: keep the transformers calls
        logger.info("chat template: the Rust tokenizer's batch calls are not usable (%r)", e)
        return None
    return codec
