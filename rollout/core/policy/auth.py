"""The policy backend's API key: read from the environment, sent as a bearer token, and kept out
of every log record, exception message and ``repr`` (the client and the router admin build their
messages with :func:`redact` and :func:`describe_error`)."""

from __future__ import annotations

import os

__all__ = ["REDACTED", "api_key_from_env", "auth_headers", "describe_error", "redact"]

REDACTED = "<redacted>"


def api_key_from_env(var_name: str | None) -> str | None:
    """The API key held by the environment variable ``var_name`` (surrounding whitespace removed).

    Args:
        var_name: name of the environment variable (e.g. ``policy.api_key_env``); ``None`` or
            ``""``: no key.

    Returns:
        The key, or ``None`` when ``var_name`` is ``None`` / empty.

    Raises:
        ValueError: the variable is not set or is empty. The message names the variable, never a
            value.
    """
    if not var_name:
        return None
    key = os.environ.get(var_name, "").strip()
    if not key:
        raise ValueError(f"environment variable {var_name} is not set or is empty (it must hold the API key)")
    return key


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <key>"}``, or ``{}`` without a key. Never log the result."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def redact(text: str, api_key: str | None) -> str:
    """``text`` with every occurrence of ``api_key`` replaced (for messages built from answers)."""
    return text.replace(api_key, REDACTED) if api_key and api_key in text else text


def describe_error(e: BaseException, api_key: str | None) -> str:
    """``ClassName: message`` of an exception, ``api_key`` redacted. Never ``repr``: aiohttp's
    ``ClientResponseError`` repr carries the request's headers (the ``Authorization`` header
    included)."""
    msg = str(e)
    return redact(f"{type(e).__name__}: {msg}" if msg else type(e).__name__, api_key)
