"""JSON for the hot HTTP paths, with ``orjson`` and the standard library as its fallback.

A ``/generate`` request carries the whole prompt as ``input_ids`` (5k-16k integers on tau-bench)
and its answer the generated ids and their log-probs. The standard library's ``json`` encodes such
a body on the event loop in milliseconds; ``orjson`` does it in a tenth of that (see
``python -m rollout.bench turns``, which prints both side by side). Values ``orjson`` refuses
(integers beyond 64 bits, non-string keys) and texts it rejects (``NaN`` / ``Infinity``, which
Python's ``json`` writes for non-finite floats) fall back to the standard library, so whatever
``json`` accepts is accepted here with the same meaning. One difference remains on encoding:
``orjson`` writes a non-finite float as ``null`` where ``json`` writes the non-standard ``NaN``.
:func:`dumps_line` closes that gap for the files a run writes (the journal, ``samples.jsonl``):
there a value must read back as it was, so a record holding a non-finite float takes the standard
library's path.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """``obj`` as UTF-8 JSON bytes (compact, no trailing newline). numpy arrays and scalars are
    written as lists and numbers (a trajectory's ids go out as an ``int64`` array: see
    :meth:`rollout.core.records.Trajectory.token_array`).

    Raises:
        TypeError: ``obj`` holds a value neither ``orjson`` nor ``json`` can encode.
    """
    try:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_plain).encode()


def dumps_line(obj: Any) -> bytes:
    """``obj`` as one JSONL line (UTF-8 bytes ending in ``\\n``) that ``json.loads`` reads back as
    the standard library's ``json.dumps(obj)`` would have: ``orjson`` (compact, non-ASCII text as
    UTF-8 rather than ``\\u`` escapes: the same value), falling back to ``json.dumps`` for what
    ``orjson`` refuses and for a record holding a non-finite float, which ``orjson`` would write as
    ``null`` (:func:`_has_nonfinite` is looked at only when the line holds a ``null`` at all).

    Raises:
        TypeError: ``obj`` holds a value neither ``orjson`` nor ``json`` can encode.
    """
    try:
        out = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return json.dumps(obj, default=_plain).encode() + b"\n"
    if b"null" in out and _has_nonfinite(obj):
        return json.dumps(obj, default=_plain).encode() + b"\n"
    return out


def _has_nonfinite(obj: Any) -> bool:
    """Whether ``obj`` (dicts, lists and tuples of JSON values) holds a NaN or an infinity. A list
    of numbers is summed at C speed (a non-finite element makes the sum non-finite; a sum that
    overflows from finite values is a false alarm, which only costs the slower path)."""
    t = type(obj)
    if t is float:
        return not math.isfinite(obj)
    if t is dict:
        return any(_has_nonfinite(v) for v in obj.values())
    if t is list or t is tuple:
        try:
            total = sum(obj)
        except TypeError:  # not all numbers: look at each
            return any(_has_nonfinite(v) for v in obj)
        return type(total) is float and not math.isfinite(total)
    kind = getattr(getattr(obj, "dtype", None), "kind", None)  # a numpy array or scalar
    if kind in ("f", "c"):
        import numpy

        return not bool(numpy.isfinite(obj).all())
    return False


def _plain(value: Any) -> Any:
    """``json``'s fallback for a numpy array or scalar (its ``tolist()``); anything else is refused."""
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON ``raw``.

    Raises:
        ValueError: ``raw`` is not JSON (``json.JSONDecodeError`` and ``orjson.JSONDecodeError``
            are both ``ValueError`` subclasses).
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)
