"""Mistral vocabularies through ``mistral-common`` (an optional dependency, imported lazily).

``builtin:mistral`` is the newest tekken vocabulary the PyPI package ``mistral-common`` ships,
``mistral_common/data/tekken_240911.json`` (mistral-common 1.13: the Pixtral-12B-2409 tokenizer,
``MistralTokenizer.v3(is_tekken=True, is_mm=True)``). Its file declares tokenizer version **v3**:
131,072 ids, the first 1,000 special (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``[INST]`` 3, ``[/INST]``
4, ``[AVAILABLE_TOOLS]`` 5, ``[/AVAILABLE_TOOLS]`` 6, ``[TOOL_RESULTS]`` 7, ``[/TOOL_RESULTS]`` 8,
``[TOOL_CALLS]`` 9, ``<pad>`` 11, ... ``<SPECIAL_999>``; ``Tekkenizer.DEPRECATED_SPECIAL_TOKENS``).
The package's other files: ``tekken_240718.json`` (Mistral-NeMo, also v3), SentencePiece
``mistral_instruct_tokenizer_240323.model.v3`` (v3) and ``..._241114.model.v7`` / ``.v7m1``
(v7, Mistral-Large-2411), ``..._240216.model.v2`` and ``tokenizer.model.v1`` (no usable tool
calls). Newer versions (v11, v13, v15) ship only with their models (``tekken.json``).

:class:`MistralVocabulary` is the ``transformers``-like tokenizer object the project passes around
(``encode``, ``decode``, ``eos_token``, ``convert_tokens_to_ids``...). ``transformers``'
``MistralCommonBackend`` wraps the same ``MistralTokenizer`` but importing it imports torch
(measured here: +1.1 s and the whole of torch), which :mod:`rollout.core.tokenizer` avoids; it
is still accepted as a policy tokenizer (:func:`mistral_tokenizer_of`). :func:`parse_turn_ids` is
the ``mistral`` format's reader of one assistant turn (:mod:`rollout.core.formats.mistral`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
import weakref
from pathlib import Path
from typing import Any

from rollout.core.formats.hermes import MAX_CALL_CHARS
from rollout.core.formats.protocol import FAMILIES_INSTALL, ParsedTurn, ParseError, ToolCall
from rollout.core.tokenizer import package_file

logger = logging.getLogger(__name__)

__all__ = ["VOCABULARY_FILES", "MistralVocabulary", "is_mistral_tokenizer", "load_vocabulary", "lock_for", "mistral_tokenizer_of",
           "parse_turn_ids", "vocabulary_files"]

# builtin:<name> -> the file of mistral-common's data folder (see the module docstring)
VOCABULARY_FILES = {"mistral": "tekken_240911.json"}
_LOCKS: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def lock_for(raw: Any) -> threading.Lock:
    """The one lock serialising calls into a mistral-common tokenizer object (shared by the
    vocabulary wrapper and every format built on it)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(raw)
        if lock is None:
            lock = _LOCKS[raw] = threading.Lock()
        return lock


def vocabulary_files(name: str) -> Path:
    """The file of built-in vocabulary ``name`` (``builtin:<name>``), found without importing anything.

    Raises:
        FileNotFoundError: an unknown name, or ``mistral-common`` is not installed (with a pip hint).
    """
    if name not in VOCABULARY_FILES:
        raise FileNotFoundError(f"unknown Mistral vocabulary {name!r} (known: {sorted(VOCABULARY_FILES)})")
    return package_file("mistral_common", f"data/{VOCABULARY_FILES[name]}", distribution="mistral-common", tokenizer=f"builtin:{name}",
                        pip_hint=FAMILIES_INSTALL, upgrade_hint="a version before 1.4?; pip install --upgrade mistral-common")


@functools.lru_cache(maxsize=2)
def load_vocabulary(name: str) -> "MistralVocabulary":
    """The tokenizer of built-in vocabulary ``name``, loaded once per process (offline; ~0.8 s).

    Raises:
        FileNotFoundError: see :func:`vocabulary_files`.
    """
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    path = vocabulary_files(name)
    return MistralVocabulary(MistralTokenizer.from_file(str(path), mode=ValidationMode.test), name_or_path=str(path))


class MistralVocabulary:
    """A ``transformers``-like tokenizer over a mistral-common ``MistralTokenizer``.

    Special tokens: mistral-common never turns text into special ids; this wrapper does, as
    ``transformers`` tokenizers do for their special tokens (``encode("[TOOL_CALLS]x")`` starts with
    id 9 in ``builtin:mistral``), so that a text written in the format (the gold-replay oracle's)
    encodes to what the model would sample. Text between special tokens is encoded by
    mistral-common piece by piece, as mistral-common encodes each message part.

    Thread-safe: every call takes :func:`lock_for` of the underlying tokenizer.

    Attributes:
        mistral: the ``MistralTokenizer``.
        name_or_path: the tokenizer file.
        version: the tokenizer version (``"v3"``, ``"v7"``, ``"v11"``, ...).
    """

    chat_template = None  # rendered by mistral-common, never by a Jinja template

    def __init__(self, mistral: Any, name_or_path: str = "") -> None:
        self.mistral = mistral
        raw = self._raw = mistral.instruct_tokenizer.tokenizer
        self.name_or_path = name_or_path
        self.version = raw.version.value
        self._lock = lock_for(raw)
        self._pieces: dict[int, str] = {i: raw.id_to_piece(i) for i in sorted(raw.special_ids)}
        self._ids: dict[str, int] = {p: i for i, p in self._pieces.items()}
        self._special_re = re.compile("|".join(re.escape(p) for p in sorted(self._ids, key=len, reverse=True)))
        self.all_special_tokens: list[str] = list(self._ids)
        self.bos_token, self.eos_token, self.unk_token = "<s>", "</s>", "<unk>"
        self.pad_token = "<pad>" if "<pad>" in self._ids else None
        self.bos_token_id, self.eos_token_id, self.unk_token_id = raw.bos_id, raw.eos_id, raw.unk_id
        self.pad_token_id = self._ids.get("<pad>")
        # tekken: regular id i is tiktoken's i - num_special_tokens (Tekkenizer.encode / _decode_all)
        model = getattr(raw, "_model", None)
        tekken = type(raw).__name__ == "Tekkenizer" and set(self._pieces) == set(range(raw.num_special_tokens))
        self._tiktoken = model if tekken and callable(getattr(model, "decode", None)) else None
        self._n_special = raw.num_special_tokens

    @property
    def vocab_size(self) -> int:
        """Number of ids (special ones included)."""
        return self._raw.n_words

    def __len__(self) -> int:
        return self.vocab_size

    def special_text(self, token_id: int) -> str | None:
        """The text of special id ``token_id`` (``"[INST]"``), or None for a regular id."""
        return self._pieces.get(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text`` (special-token texts become their ids); ``<s>`` first if ``add_special_tokens``."""
        with self._lock:
            return self.encode_unlocked(text, add_special_tokens)

    def encode_unlocked(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """:meth:`encode` without the lock (for a caller that holds it)."""
        ids = [self.bos_token_id] if add_special_tokens else []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                ids += self._raw.encode(text[pos:m.start()], bos=False, eos=False)
            ids.append(self._ids[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self._raw.encode(text[pos:], bos=False, eos=False)
        return ids

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``: special tokens as their texts (dropped if ``skip_special_tokens``)."""
        with self._lock:
            return self.decode_unlocked(ids, skip_special_tokens)

    def try_decode(self, ids: list[int]) -> str | None:
        """:meth:`decode` (special tokens kept) when the lock is free at once, else None."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self.decode_unlocked(ids)
        finally:
            self._lock.release()

    def decode_unlocked(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """:meth:`decode` without the lock: what ``MistralTokenizer.decode(ids, SpecialTokenPolicy.KEEP)``
        gives for tekken, and readable text for SentencePiece (whose KEEP shows raw pieces). Runs of
        regular ids go to tekken's tiktoken model exactly as ``Tekkenizer.decode`` sends them (ids
        shifted by the special count; 512 ids in ~60 us here, about half the time of its per-id
        grouping), or to mistral-common's ``decode`` for SentencePiece; both are read-only."""
        ids = [ids] if isinstance(ids, int) else [int(i) for i in ids]
        pieces, out, prev = self._pieces, [], 0
        for k in [k for k, i in enumerate(ids) if i in pieces] + [len(ids)]:
            if k > prev:
                out.append(self._decode_run(ids[prev:k]))
            if k < len(ids) and not skip_special_tokens:
                out.append(pieces[ids[k]])
            prev = k + 1
        return "".join(out)

    def _decode_run(self, run: list[int]) -> str:
        if self._tiktoken is not None:
            n = self._n_special
            return self._tiktoken.decode([i - n for i in run])
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        return self._raw.decode(run, special_token_policy=SpecialTokenPolicy.IGNORE)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int] | None:
        """Id of a special token's text (``"[INST]"`` -> 3), or of a one-token regular text; None
        (for a list: ``unk_token_id``) when it is neither."""
        if isinstance(tokens, list):
            return [self._one_id(t) if self._one_id(t) is not None else self.unk_token_id for t in tokens]  # type: ignore[misc]
        return self._one_id(tokens)

    def _one_id(self, token: str) -> int | None:
        if token in self._ids:
            return self._ids[token]
        with self._lock:
            ids = self._raw.encode(token, bos=False, eos=False) if token else []
        return ids[0] if len(ids) == 1 else None

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | list[str]:
        """The text of each id (a special token's text, or the regular token's decoded text)."""
        if isinstance(ids, int):
            return self._pieces.get(ids) or self.decode([ids])
        return [self.convert_ids_to_tokens(int(i)) for i in ids]  # type: ignore[misc]

    def save_pretrained(self, folder: str | os.PathLike) -> tuple[str, ...]:
        """Write a folder a router or ``transformers`` can load (``--tokenizer-path``): the tekken
        file as ``tekken.json``, its ``transformers`` conversion as ``tokenizer.json``
        (``transformers.integrations.mistral.tokenizer.MistralConverter``; no torch imported), and
        a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` and the BOS / EOS / pad tokens.

        Returns:
            The paths written.

        Raises:
            ValueError: the vocabulary is not a tekken file (a SentencePiece model has no such
                conversion here).
            OSError: the folder cannot be written.
        """
        import shutil

        source = Path(self.name_or_path)
        if self._tiktoken is None or source.suffix != ".json" or not source.is_file():
            raise ValueError(f"only a tekken vocabulary can be written as a tokenizer folder, not {self.name_or_path!r}")
        from transformers.integrations.mistral.tokenizer import MistralConverter

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out / "tekken.json")
        MistralConverter(str(source)).converted().save(str(out / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": self.bos_token, "eos_token": self.eos_token,
                  "unk_token": self.unk_token, "pad_token": self.pad_token, "clean_up_tokenization_spaces": False,
                  "model_max_length": 1_048_576}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        return tuple(str(out / f) for f in ("tekken.json", "tokenizer.json", "tokenizer_config.json"))

    def __repr__(self) -> str:
        return f"MistralVocabulary({self.name_or_path!r}, version={self.version})"


def _class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def is_mistral_tokenizer(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a Mistral one: this module's wrapper, mistral-common's
    ``MistralTokenizer``, ``transformers``' ``MistralCommonBackend``, or a ``transformers``
    tokenizer whose special tokens include ``[INST]`` and ``[TOOL_CALLS]`` (a converted Mistral
    model's). Never raises, never imports mistral-common or transformers."""
    try:
        if tokenizer is None:
            return False
        if _class_names(tokenizer) & {"MistralVocabulary", "MistralTokenizer", "MistralCommonBackend", "MistralCommonTokenizer"}:
            return True
        specials = set(getattr(tokenizer, "all_special_tokens", None) or [])
        added = getattr(tokenizer, "get_added_vocab", None)
        if callable(added):
            specials |= set(added())
        return {"[INST]", "[TOOL_CALLS]"} <= specials
    except Exception as e:  # a detector must not raise
        logger.debug("mistral detection failed: %r", e)
        return False


def mistral_tokenizer_of(tokenizer: Any) -> Any:
    """The mistral-common ``MistralTokenizer`` behind ``tokenizer``, validating in ``test`` mode
    (requests that end with a user or tool message, as a server's):

    * this module's :class:`MistralVocabulary`, ``MistralCommonBackend`` (its ``.tokenizer``) or a
      ``MistralTokenizer`` itself;
    * a ``transformers`` tokenizer loaded from a model folder (``name_or_path``) that also holds
      the model's mistral-common file (``tekken.json`` or ``tokenizer.model.v*``).

    Raises:
        ValueError: no mistral-common tokenizer can be had for it (the message says what to pass).
        ImportError: mistral-common is not installed.
    """
    from mistral_common.protocol.instruct.normalize import get_normalizer
    from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    found = tokenizer if isinstance(tokenizer, MistralTokenizer) else None
    for attr in ("mistral", "tokenizer"):
        cand = getattr(tokenizer, attr, None)
        if found is None and isinstance(cand, MistralTokenizer):
            found = cand
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if found is None and folder.is_dir():
        from mistral_common.tokens.tokenizers.utils import get_one_valid_tokenizer_file

        try:
            found = MistralTokenizer.from_file(get_one_valid_tokenizer_file([str(p) for p in folder.iterdir()]), mode=ValidationMode.test)
        except ValueError:
            found = None
    if found is None:
        raise ValueError(f"chat format mistral renders with mistral-common and needs its tokenizer file (tekken.json or "
                         f"tokenizer.model.v*): pass policy.tokenizer=builtin:mistral or a folder holding it, not "
                         f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r}")
    if found.mode != ValidationMode.test:
        raw = found.instruct_tokenizer.tokenizer
        found = MistralTokenizer(found.instruct_tokenizer, validator=get_validator(raw.version, mode=ValidationMode.test),
                                 request_normalizer=get_normalizer(raw.version, raw.model_settings_builder))
    return found


_CALL_TOKENS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")  # the control tokens a tool call holds


def parse_turn_ids(vocab: MistralVocabulary, ids: list[int], tool_names: set[str] | None, thinks: tuple[int, int] | None,
                   call_shape: str) -> ParsedTurn:
    """One assistant turn's ids read with mistral-common's own helpers
    (``mistral_common.experimental.tools``: split at each ``[TOOL_CALLS]``, then one JSON list of
    ``{"name", "arguments"}`` (and ``"id"`` where the model wrote one) per block up to v7,
    ``name[CALL_ID]id[ARGS]{...}`` or ``name[ARGS]{...}`` from v11; ``experimental.think`` for
    ``[THINK]`` blocks). A call id the model wrote is kept (:attr:`ToolCall.id`), so that its tool
    result and any re-encoding of the call carry that id, as mistral-common echoes it.

    Args:
        vocab: the tokenizer (decodes without its lock: mistral-common's decoders are read-only).
        ids: the turn's ids, ``</s>`` removed (trailing ``</s>`` / ``<pad>`` are dropped here too).
        tool_names: the tools offered (None: any name).
        thinks: the ids of ``[THINK]`` and ``[/THINK]`` where the version writes reasoning, else None.
        call_shape: the call syntax named in parse errors.

    Raises:
        ParseError: empty output, control tokens out of place, a malformed or unclosed ``[THINK]`` or
            ``[TOOL_CALLS]`` block, arguments that are not a JSON object, an unknown tool, a call over
            ``MAX_CALL_CHARS`` characters, a call id that is not 9 letters or digits (mistral-common
            refuses a conversation holding one), two calls of the turn with the same id.
            mistral-common's own errors are turned into ParseError; the caller maps anything else
            left (see ``MistralFormat.parse_turn``).
    """
    from mistral_common.experimental.think import _split_content_and_think_chunks
    from mistral_common.experimental.tools import (
        InvalidArgsToolCallError,
        InvalidToolCallError,
        _decode_tool_calls,
        _split_content_and_tool_calls,
    )

    raw, text, specials = vocab._raw, vocab.decode_unlocked, vocab._pieces
    while ids and ids[-1] in (vocab.eos_token_id, vocab.pad_token_id):
        ids = ids[:-1]
    reasoning = None
    if thinks and any(i in thinks for i in ids):
        try:
            chunks = _split_content_and_think_chunks(ids, *thinks)
        except ValueError as e:
            raise ParseError(f"malformed [THINK] block ({e})") from None
        at = [k for k, (_, is_think) in enumerate(chunks) if is_think]
        if len(at) > 1:
            raise ParseError("more than one [THINK] block")
        think = chunks[at[0]][0]
        if think[-1] != thinks[1]:
            raise ParseError("unclosed [THINK] block")
        if any(text(c).strip() for c, _ in chunks[:at[0]]):
            raise ParseError("text before [THINK]")
        reasoning = text(think[1:-1]).strip()
        ids = [i for c, _ in chunks[at[0] + 1:] for i in c]
    content_ids, segments = _split_content_and_tool_calls(ids, raw.get_special_token("[TOOL_CALLS]"))
    stray = [i for i in content_ids if i in specials]
    if stray:
        raise ParseError(f"unexpected control token {specials[stray[0]]} in the reply")
    content = text(content_ids).strip()
    if not segments:
        if not content:
            raise ParseError("empty response: reply to the user or call a tool")
        return ParsedTurn(content=content, reasoning=reasoning)
    allowed = {raw.get_special_token(t) for t in _CALL_TOKENS if raw.is_special(t)}
    calls: list[ToolCall] = []
    for seg in segments:
        bad = [i for i in seg if i in specials and i not in allowed]
        if bad:
            raise ParseError(f"unexpected control token {specials[bad[0]]} in a tool call")
        if len(seg) > MAX_CALL_CHARS or len(text(seg)) > MAX_CALL_CHARS:
            raise ParseError(f"tool call longer than {MAX_CALL_CHARS} characters")
        try:
            found = _decode_tool_calls([seg], raw)
        except InvalidArgsToolCallError:
            raise ParseError("tool call arguments must be a JSON object") from None
        except (InvalidToolCallError, ValueError, TypeError, KeyError, AssertionError, RecursionError) as e:
            raise ParseError(f"malformed tool call, expected {call_shape} ({str(e)[:80]})") from None
        calls += [_checked_call(c.function.name, c.function.arguments, tool_names, c.id) for c in found]
    if not calls:
        raise ParseError("[TOOL_CALLS] without a call")
    written = [c.id for c in calls if c.id is not None]
    if len(set(written)) != len(written):
        dup = next(i for i in written if written.count(i) > 1)
        raise ParseError(f"two tool calls with the same id {dup!r}: each call of a turn needs its own id")
    return ParsedTurn(content=content, tool_calls=tuple(calls), reasoning=reasoning)


_CALL_ID_RE = re.compile(r"[A-Za-z0-9]{9}")  # mistral-common's validator (v3+): a-z, A-Z, 0-9, length 9
_NO_CALL_ID = "null"  # mistral-common's ToolCall.id when the call has none


def _checked_call(name: Any, arguments: Any, tool_names: set[str] | None, call_id: Any = _NO_CALL_ID) -> ToolCall:
    """A decoded call as a :class:`ToolCall`: a non-empty name among ``tool_names``, arguments
    that are a JSON object (or a JSON string holding one), and the id the model wrote (v3-v11),
    kept as :attr:`ToolCall.id` when it is one mistral-common accepts (9 letters or digits) and
    ``None`` when the model wrote none (mistral-common's ``"null"``)."""
    if not isinstance(name, str) or not name.strip():
        raise ParseError("tool call has no name")
    name = name.strip()
    if call_id in (None, "", _NO_CALL_ID):
        call_id = None
    elif not isinstance(call_id, str) or not _CALL_ID_RE.fullmatch(call_id):
        raise ParseError(f"tool call id {str(call_id)[:40]!r} of {name!r} must be 9 letters or digits")
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        if isinstance(args, str):  # arguments written as a JSON string holding an object
            args = json.loads(args) if args.strip() else {}
    except (ValueError, RecursionError):
        raise ParseError(f"arguments of {name!r} are not a JSON object") from None
    if not isinstance(args, dict):
        raise ParseError(f"arguments of {name!r} must be a JSON object")
    if tool_names is not None and name not in tool_names:
        raise ParseError(f"unknown tool {name!r}")
    return ToolCall(name=name, arguments=args, id=call_id)
