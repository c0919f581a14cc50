"""JSON for the hot HTTP paths, with ``orjson`` and the standard library as its fallback.

A ``/generate`` request carries the whole prompt as ``input_ids`` (5k-16k integers on tau-bench)
and its answer the generated ids and their log-probs. The standard library's ``json`` encodes such
a body on the event loop in milliseconds; ``orjson`` does it in a tenth of that (see
``python -m rollout.bench turns``, which prints both side by side). Values ``orjson`` refuses
(integers beyond 64 bits, non-string keys) and texts it rejects (``NaN`` / ``Infinity``, which
Python's ``json`` writes for non-finite floats) fall back to the standard library, so whatever
``json`` accepts is accepted here with the same meaning. One difference remains on encoding:
``orjson`` writes a non-finite float as ``null`` where ``json`` writes the non-standard ``NaN``.
"""

from __future__ import annotations

import json
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
