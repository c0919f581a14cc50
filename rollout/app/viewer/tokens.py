"""The token view of an episode: its ids decoded one by one with the run's tokenizer, with the loss
mask, the rollout log-probs, the ``/generate`` calls' spans and weight versions, and the segments.

Decoding happens here, on the server, with the tokenizer the run used (``policy.tokenizer`` of its
``config.yaml``, loaded by :func:`rollout.core.tokenizer.load_tokenizer`): the page gets one string
per token. A token that is only part of a multi-byte character decodes to U+FFFD on its own; it is
shown as its vocabulary piece instead (flag :data:`PARTIAL`). When the tokenizer cannot be loaded
(a cluster path on a laptop), the view still shows every token, as its id.

The viewer never reaches a model hub (:func:`local_tokenizer_source`): a hub id is decoded with the
copy in the local hub cache, and without one the view shows ids and says why.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from rollout.core.trajectory import TrajectoryError, check_segments, check_spans

logger = logging.getLogger(__name__)

SPECIAL = 1  # a special or added token of the vocabulary (<|im_start|>, <tool_call>, ...)
PARTIAL = 2  # part of a multi-byte character: shown as its vocabulary piece


class TokenDecoder:
    """Per-token decoding with a cache per id (a run's tokens repeat: the system prompt of every
    episode is the same). Thread-safe.

    Args:
        tokenizer: a ``transformers`` tokenizer (``decode``; ``batch_decode``,
            ``convert_ids_to_tokens``, ``all_special_ids`` and ``added_tokens_decoder`` are used
            when it has them).
        name: the name it was loaded by (shown on the page).
    """

    def __init__(self, tokenizer: Any, name: str):
        self.tokenizer = tokenizer
        self.name = name
        self._cache: dict[int, tuple[str, int]] = {}
        self._lock = threading.Lock()
        special = set(getattr(tokenizer, "all_special_ids", None) or [])
        try:
            special |= {int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})}
        except (TypeError, ValueError):
            pass
        self._special = special

    def _decode_new(self, ids: list[int]) -> list[str]:
        try:
            return list(self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        except (AttributeError, TypeError):  # a tokenizer without batch_decode or these keywords
            return [self.tokenizer.decode([i]) for i in ids]

    def _piece(self, i: int) -> str:
        try:
            piece = self.tokenizer.convert_ids_to_tokens(i)
        except (AttributeError, TypeError, ValueError, IndexError):
            piece = None
        return piece if isinstance(piece, str) and piece else f"<{i}>"

    def decode(self, ids: list[int]) -> tuple[list[str], list[int]]:
        """Decode every id on its own.

        Args:
            ids: token ids (any length).

        Returns:
            ``(texts, flags)``, both of ``len(ids)``: each token's text and its flags
            (:data:`SPECIAL`, :data:`PARTIAL`, or 0). An id the tokenizer cannot decode reads
            ``<id>``.
        """
        with self._lock:
            new = sorted({int(i) for i in ids} - self._cache.keys())
            if new:
                try:
                    texts = self._decode_new(new)
                except Exception as e:  # noqa: BLE001 (a vocabulary that cannot decode an id must not lose the view)
                    logger.warning("tokenizer %s could not decode %d ids at once (%s): decoding them one by one", self.name, len(new), e)
                    texts = []
                    for i in new:
                        try:
                            texts.append(self.tokenizer.decode([i]))
                        except Exception:  # noqa: BLE001 (an out-of-vocabulary id)
                            texts.append(f"<{i}>")
                for i, text in zip(new, texts):
                    flags = SPECIAL if i in self._special else 0
                    if "\ufffd" in text:
                        text, flags = self._piece(i), flags | PARTIAL
                    self._cache[i] = (text, flags)
            pairs = [self._cache[int(i)] for i in ids]
        return [p[0] for p in pairs], [p[1] for p in pairs]


def _problem(sample: dict[str, Any]) -> str | None:
    """Why a sample's token fields do not line up, or None."""
    n, r = len(sample.get("tokens") or []), int(sample.get("response_length") or 0)
    mask, logp = sample.get("loss_mask") or [], sample.get("rollout_log_probs") or []
    if not 0 <= r <= n or len(mask) != r or len(logp) != r:
        return f"misaligned: {n} tokens, response_length {r}, {len(mask)} mask values, {len(logp)} log-probs"
    try:
        check_spans(sample.get("generation_spans") or [], sample.get("weight_versions") or [], mask)
        check_segments(sample.get("segment_starts") or [], mask)
    except TrajectoryError as e:
        return str(e)
    return None


def segment_table(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The segments of one sample (one entry without ``segment_starts``): ``start`` / ``end``
    (response indices, ``start`` of the first is ``-prompt_length``), ``tokens``, ``sampled``
    (mask-1 tokens) and ``calls`` (``/generate`` calls whose span starts in it)."""
    mask = sample.get("loss_mask") or []
    r = len(mask)
    p = len(sample.get("tokens") or []) - r
    starts = [int(s) for s in sample.get("segment_starts") or []]
    bounds = list(zip([-p, *starts], [*starts, r]))
    spans = [list(x) for x in sample.get("generation_spans") or []]
    out = []
    for a, b in bounds:
        calls = 0
        while spans and spans[0][0] <= b:  # as rollout.core.sample_modes.segments assigns them
            spans.pop(0)
            calls += 1
        out.append({"start": a, "end": b, "tokens": b - a, "sampled": int(sum(mask[max(a, 0):b])), "calls": calls})
    return out


def token_part(label: str, sample: dict[str, Any], decoder: TokenDecoder | None) -> dict[str, Any]:
    """One token record for the page.

    Args:
        label: where it comes from (shown above it).
        sample: a sample line's dict (:meth:`TrainingSample.to_dict`).
        decoder: None to send ids only.

    Returns:
        ``label``, ``ids`` (every token, prompt first), ``text`` / ``flags`` (``len(ids)`` each, or
        None without a decoder), ``prompt_length``, ``response_length``, ``loss_mask`` and
        ``logp`` (``response_length`` each), ``spans`` and ``versions`` (one per ``/generate``
        call), ``segment_starts``, ``segments`` (:func:`segment_table`) and ``problem`` (why the
        fields do not line up, else None: the page then shows the ids without colouring).
    """
    ids = [int(i) for i in sample.get("tokens") or []]
    r = int(sample.get("response_length") or 0)
    texts, flags = decoder.decode(ids) if decoder is not None else (None, None)
    problem = _problem(sample)
    return {
        "label": label, "ids": ids, "text": texts, "flags": flags, "prompt_length": len(ids) - r, "response_length": r,
        "loss_mask": list(sample.get("loss_mask") or []), "logp": list(sample.get("rollout_log_probs") or []),
        "spans": [list(s) for s in sample.get("generation_spans") or []],
        "versions": [None if v is None else str(v) for v in sample.get("weight_versions") or []],
        "segment_starts": list(sample.get("segment_starts") or []),
        "segments": segment_table(sample) if problem is None else [], "problem": problem,
    }


class TokenizerNotLocalError(LookupError):
    """A tokenizer that is not on this machine (the viewer fetches nothing); the message says why."""


def local_tokenizer_source(name: str) -> str:
    """What to load for the tokenizer ``name`` without reaching a model hub: ``name`` itself for a
    ``builtin:`` vocabulary (package files) or an existing local folder; for a hub id, the folder
    of its copy in the local hub cache (``huggingface_hub.try_to_load_from_cache``: no network).

    Raises:
        TokenizerNotLocalError: neither a folder here nor in the local hub cache (one line, naming
            ``name``).
    """
    if name.startswith("builtin:") or Path(os.path.expanduser(name)).exists():
        return name
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        try_to_load_from_cache = None
    for filename in ("tokenizer_config.json", "tokenizer.json"):
        try:
            found = try_to_load_from_cache(name, filename) if try_to_load_from_cache is not None else None
        except ValueError:  # not a hub id either (HFValidationError)
            break
        if isinstance(found, str):
            return str(Path(found).parent)
    raise TokenizerNotLocalError(f"tokenizer {name!r} is not on this machine (no such folder, not in the local hub cache) "
                                 "and the viewer fetches nothing from the network; pass --tokenizer with a local folder "
                                 "holding its tokenizer files; showing ids")


class DecoderCache:
    """The token decoders of the runs a viewer serves, loaded once per tokenizer name, in the
    thread that first asks (loading takes a second or more), from this machine only
    (:func:`local_tokenizer_source`). Thread-safe."""

    def __init__(self) -> None:
        self._decoders: dict[str, TokenDecoder | str] = {}
        self._lock = threading.Lock()

    def get(self, name: str | None) -> tuple[TokenDecoder | None, str | None]:
        """``(decoder, None)``, or ``(None, why)`` when ``name`` is None, is not on this machine or
        cannot be loaded (the reason is logged once as a warning and remembered)."""
        if not name:
            return None, "the run's config.yaml names no policy.tokenizer"
        with self._lock:
            got = self._decoders.get(name)
            if got is None:
                from rollout.core.tokenizer import load_tokenizer

                try:
                    got = TokenDecoder(load_tokenizer(local_tokenizer_source(name)), name)
                except TokenizerNotLocalError as e:
                    got = str(e)
                    logger.warning("%s", got)
                except Exception as e:  # noqa: BLE001 (any loader failure: the view falls back to ids)
                    got = f"tokenizer {name!r} could not be loaded ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); showing ids"
                    logger.warning("%s", got)
                self._decoders[name] = got
        return (got, None) if isinstance(got, TokenDecoder) else (None, got)
