"""Request parsing and answer encoding for the local SGLang-protocol server.

What every endpoint of :mod:`rollout.devtools.local.server` shares: SGLang's ``sampling_params``
validated into a :class:`SamplingParams`, the JSON request body, and the JSON answers (a 200
encoded with orjson, an error ``{"error": message}``). A malformed request raises
:class:`BadRequest`, which the endpoint answers with HTTP 400.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rollout.core import fastjson
from rollout.devtools.local.backend_api import SamplingParams

# sampling_params keys the server honours, and SGLang keys it accepts but ignores.
_SAMPLING_USED = {
    "temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "no_stop_trim", "sampling_seed",
}
_SAMPLING_IGNORED = {
    "min_new_tokens", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "spaces_between_special_tokens",
    "custom_params", "stream_interval", "logit_bias", "stop_regex",
}
_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


class BadRequest(ValueError):
    """A request body the server refuses (answered with HTTP 400 and ``{"error": message}``)."""


def is_int(x: Any) -> bool:
    """Whether ``x`` is a JSON integer (an ``int``, not a ``bool``)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    """Whether ``x`` is a JSON number (an ``int`` or ``float``, not a ``bool``)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def token_ids_ok(ids: list, vocab_size: int) -> bool:
    """Whether every item of the non-empty list ``ids`` is an ``int`` (not a ``bool``) in ``[0, vocab_size)``.

    Checked with C-level passes (``map(type, ...)``, ``min``, ``max``) rather than a Python loop
    per id: a prompt is thousands of ids and the check runs on the event loop for every request.
    """
    if not set(map(type, ids)) <= {int}:  # parsed JSON integers are exactly int
        return all(is_int(t) for t in ids) and 0 <= min(ids) and max(ids) < vocab_size
    return 0 <= min(ids) and max(ids) < vocab_size


def parse_sampling_params(sp: Any) -> SamplingParams:
    """Validate SGLang ``sampling_params`` (a dict; null values mean "default").

    Raises:
        BadRequest: not a dict, an unknown key, or a value of the wrong type / out of range.
    """
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object")
    unknown = set(sp) - _SAMPLING_USED - _SAMPLING_IGNORED
    if unknown:
        raise BadRequest(f"unknown sampling_params: {sorted(unknown)}")
    v = {k: x for k, x in sp.items() if x is not None}
    kw: dict[str, Any] = {}
    if "temperature" in v:
        if not is_num(v["temperature"]) or v["temperature"] < 0:
            raise BadRequest("sampling_params.temperature must be a number >= 0")
        kw["temperature"] = float(v["temperature"])
    if "top_p" in v:
        if not is_num(v["top_p"]) or not 0 < v["top_p"] <= 1:
            raise BadRequest("sampling_params.top_p must be in (0, 1]")
        kw["top_p"] = float(v["top_p"])
    if "top_k" in v:
        if not is_int(v["top_k"]) or v["top_k"] < -1:
            raise BadRequest("sampling_params.top_k must be an integer, -1 (or 0) for no truncation")
        kw["top_k"] = -1 if v["top_k"] == 0 else v["top_k"]
    kw["max_new_tokens"] = _DEFAULT_MAX_NEW_TOKENS
    if "max_new_tokens" in v:
        if not is_int(v["max_new_tokens"]) or v["max_new_tokens"] < 0:
            raise BadRequest("sampling_params.max_new_tokens must be an integer >= 0")
        kw["max_new_tokens"] = v["max_new_tokens"]
    if "stop" in v:
        stop = v["stop"]
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("sampling_params.stop must be a string or a list of strings")
        kw["stop"] = tuple(s for s in stop if s)
    if "stop_token_ids" in v:
        ids = v["stop_token_ids"]
        if not isinstance(ids, list) or not all(is_int(i) for i in ids):
            raise BadRequest("sampling_params.stop_token_ids must be a list of integers")
        kw["stop_token_ids"] = tuple(ids)
    for key in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
        if key in v:
            if not isinstance(v[key], bool):
                raise BadRequest(f"sampling_params.{key} must be a boolean")
            kw[key] = v[key]
    if "sampling_seed" in v:
        if not is_int(v["sampling_seed"]):
            raise BadRequest("sampling_params.sampling_seed must be an integer")
        kw["seed"] = v["sampling_seed"]
    if "n" in v and v["n"] != 1:
        raise BadRequest("sampling_params.n > 1 is not supported; send n requests")
    kw["extra"] = {k: x for k, x in v.items() if k in _SAMPLING_IGNORED}
    return SamplingParams(**kw)


async def json_body(request: web.Request, streaming_allowed: bool = True, empty_ok: bool = False) -> dict:
    """The request's JSON object body (``{}`` for an empty body when ``empty_ok``).

    Raises:
        BadRequest: not JSON, not an object, or ``"stream": true`` where streaming is not served.
    """
    if empty_ok and not (await request.read()).strip():
        return {}
    try:
        body = fastjson.loads(await request.read())
    except ValueError:  # JSONDecodeError (both libraries') and UnicodeDecodeError
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if not streaming_allowed and body.get("stream"):
        raise BadRequest("streaming is not supported by the local server; send stream=false")
    return body


def json_answer(data: dict) -> web.Response:
    """A 200 JSON answer encoded with orjson (a ``/generate`` answer lists every output id and
    its log-prob; SGLang's HTTP server answers with orjson too)."""
    return web.Response(body=fastjson.dumps(data), content_type="application/json")


def error_answer(status: int, message: str) -> web.Response:
    """An error answer: HTTP ``status`` with ``{"error": message}``."""
    return web.json_response({"error": message}, status=status)
