"""How a failed call to an OpenAI-compatible endpoint (the user simulator's, the NL-assertion
judge's) is sorted (transient or not) and how long to wait before the next try: the retry policy
of :class:`rollout.benchmarks.tau2.user.LLMUser`, of tau2's judge
(:mod:`rollout.benchmarks.tau2.judge`) and the endpoint check
(:func:`rollout.benchmarks.user_api.check_user_simulator`); shared by the tau adapters (it knows
litellm, not a benchmark).

litellm is called with ``num_retries=0``: transient failures (HTTP 429, honouring ``Retry-After``;
5xx answers; connection errors; timeouts) are retried by the caller with jittered exponential
back-off; the others (400, 401, 403, 404, a malformed answer) fail at once. Messages are one line
and never hold the API key.
"""

from __future__ import annotations

import email.utils
import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol


class RetryPolicy(Protocol):
    """The back-off keys of a section that retries (``env.user``, ``env.judge``)."""

    retry_backoff_s: float
    max_retry_wait_s: float


def one_line(text: str, key: str = "", limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters, with ``key`` (if any) masked."""
    if key:
        text = text.replace(key, "***")
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# litellm's messages repeat the class names: "litellm.RateLimitError: RateLimitError: OpenAIException - slow down"
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*|\w+Error:\s*|OpenAIException\s*-\s*)+")


def short_error(e: BaseException, key: str = "") -> str:
    """``ClassName: message`` of a litellm exception, on one line, without litellm's repeated prefixes."""
    text = _LITELLM_PREFIX.sub("", one_line(str(e), key, 400)) or "(no message)"
    return one_line(f"{type(e).__name__}: {text}", "", 200)


@dataclass(frozen=True)
class CallFailure:
    """What a failed endpoint call means for the retry policy."""

    transient: bool
    status: int | None  # HTTP status of a real answer (None: no answer, or a malformed one)
    retry_after: float | None  # seconds asked for by a Retry-After header, if any
    summary: str  # one line, without the key


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and len(out) < 20:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _response_headers(e: BaseException) -> Any:
    """The HTTP headers of the answer behind a litellm exception, or None.

    litellm 1.106 keeps the real headers in ``e.litellm_response_headers`` (an ``httpx.Headers``);
    ``e.response`` is a stand-in ``httpx.Response`` with no headers (seen against a local server).
    """
    for obj in _chain(e):
        h = getattr(obj, "litellm_response_headers", None)
        if h:
            return h
        resp = getattr(obj, "response", None)
        h = getattr(resp, "headers", None)
        if h:
            return h
    return None


def parse_retry_after(headers: Any, now: float | None = None) -> float | None:
    """Seconds asked for by ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP-date), or None."""
    if headers is None:
        return None

    def get(name: str) -> str | None:
        try:
            v = headers.get(name)
            if v is None and isinstance(headers, dict):  # plain dicts are case-sensitive
                v = {str(k).lower(): x for k, x in headers.items()}.get(name)
            return None if v is None else str(v).strip()
        except Exception:
            return None

    ms = get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    v = get("retry-after")
    if not v:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_failure(e: BaseException, key: str, litellm: Any) -> CallFailure:
    """Sort a failed ``litellm.acompletion`` call into transient (retry) or not.

    Transient: no answer at all (connection refused or dropped, a timeout), HTTP 408 / 429, and
    real 5xx answers. Not transient: other 4xx (400, 401, 403, 404, ...) and malformed answers
    (litellm reports a 200 whose body is not JSON as a "500" InternalServerError; the cause chain
    tells it apart from a real 500).

    Args:
        e: what the call raised.
        key: the API key, masked in the summary.
        litellm: the imported ``litellm`` module (its exception types).
    """
    import httpx
    import openai

    chain = _chain(e)
    short = short_error(e, key)
    if any(isinstance(x, json.JSONDecodeError) for x in chain):
        return CallFailure(False, None, None, f"malformed answer ({short})")
    conn_types: tuple[type, ...] = (openai.APIConnectionError, httpx.TransportError, ConnectionError, TimeoutError,
                                    litellm.Timeout, litellm.APIConnectionError)
    try:
        import aiohttp

        conn_types += (aiohttp.ClientConnectionError,)
    except ImportError:  # pragma: no cover
        pass
    status = getattr(e, "status_code", None)
    status = status if isinstance(status, int) else None
    headers = _response_headers(e)
    if any(isinstance(x, conn_types) for x in chain) and not (status is not None and status >= 500 and headers):
        what = "timed out" if any(isinstance(x, (TimeoutError, httpx.TimeoutException, litellm.Timeout)) for x in chain) else "no answer"
        return CallFailure(True, None, None, f"{what} ({short})")
    real_answer = headers is not None or any(isinstance(x, (openai.APIStatusError, httpx.HTTPStatusError)) for x in chain[1:])
    if status is not None and real_answer:
        transient = status in (408, 429) or 500 <= status < 600
        return CallFailure(transient, status, parse_retry_after(headers) if transient else None, f"HTTP {status} ({short})")
    return CallFailure(False, status if real_answer else None, None, short)


def backoff_s(retry: int, cfg: RetryPolicy, failure: CallFailure, rng: random.Random) -> float:
    """Seconds to wait before retry number ``retry`` (1-based): the Retry-After the server asked for,
    else ``retry_backoff_s * 2**(retry-1)`` with jitter (x0.5-1.0); both capped at ``max_retry_wait_s``."""
    cap = max(0.0, cfg.max_retry_wait_s)
    if failure.retry_after is not None:
        return min(failure.retry_after, cap)
    base = min(cap, cfg.retry_backoff_s * (2 ** (retry - 1)))
    return base * rng.uniform(0.5, 1.0)
