"""The chat format a dialect writes its assistant turns with, when the family's own code writes
them (``renderers``, mistral-common): the registered format on the family's built-in vocabulary.

Built once per process, on the first written turn (the vocabulary and the renderer load then,
not when a dialect module is imported).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["builtin_format"]

_FORMATS: dict[str, Any] = {}
_LOCK = threading.Lock()


def builtin_format(name: str) -> Any:
    """Chat format ``name`` (:func:`rollout.core.formats.registry.format_info`) built on its
    built-in vocabulary (``builtin:<FormatInfo.vocabulary>``, :func:`rollout.core.tokenizer.load_tokenizer`),
    once per process: the first call blocks while it builds (about 10 s for Qwen3.6's
    vocabulary), later ones return the same object. Thread-safe: the server's generation
    threads may ask at once, and one builds.

    Raises:
        ValueError: the format names no built-in vocabulary.
        FileNotFoundError: the vocabulary's package is not installed.
        rollout.core.formats.TemplateError: the format cannot be built on it (e.g. ``renderers``
            is missing).
    """
    with _LOCK:
        fmt = _FORMATS.get(name)
        if fmt is None:
            from rollout.core.formats.registry import format_info
            from rollout.core.tokenizer import load_tokenizer

            info = format_info(name)
            if info.vocabulary is None:
                raise ValueError(f"chat format {name!r} has no built-in vocabulary to write its turns with")
            fmt = _FORMATS[name] = info.factory(load_tokenizer(f"builtin:{info.vocabulary}"))
        return fmt
