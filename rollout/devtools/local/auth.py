"""API keys for the local SGLang-protocol server, as SGLang's ``--api-key`` / ``--admin-api-key``.

SGLang's rule (``sglang.srt.utils.auth``): with an API key every request must carry
``Authorization: Bearer <key>`` (or ``x-api-key: <key>``), except ``OPTIONS`` and paths starting
with ``/health``, ``/ready`` or ``/metrics``; the admin endpoints (:data:`ADMIN_PATHS`) need the
admin key when one is set, else the API key when one is set, else nothing. A refused request is
answered with HTTP 401 ``{"error": "Unauthorized"}``.
"""

from __future__ import annotations

import secrets

from aiohttp import web

# Endpoints SGLang marks ADMIN_OPTIONAL: the admin key when set, else the API key when set.
ADMIN_PATHS = frozenset({
    "/abort_request", "/pause_generation", "/continue_generation", "/update_weights_from_disk", "/flush_cache",
})
_AUTH_EXEMPT_PREFIXES = ("/health", "/ready", "/metrics")  # k8s probes and Prometheus, as in SGLang


def auth_status(method: str, path: str, authorization: str | None, x_api_key: str | None,
                api_key: str | None, admin_api_key: str | None) -> int | None:
    """SGLang's decision for one request: None (allowed) or the HTTP status to refuse it with (401).

    Args:
        method, path: of the request.
        authorization: its ``Authorization`` header (``Bearer <key>``, scheme case-insensitive).
        x_api_key: its ``x-api-key`` header (accepted as well, as recent SGLang does).
        api_key, admin_api_key: the server's keys (None: not set).
    """
    if method == "OPTIONS" or path.startswith(_AUTH_EXEMPT_PREFIXES):
        return None

    def carries(expected: str) -> bool:
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected.encode()):
                return True
        return bool(x_api_key) and secrets.compare_digest(x_api_key.encode(), expected.encode())

    expected = (admin_api_key or api_key) if path in ADMIN_PATHS else api_key
    if expected is None or carries(expected):
        return None
    return 401


def auth_middlewares(api_key: str | None, admin_api_key: str | None) -> list:
    """The aiohttp middlewares that enforce :func:`auth_status` for the server's keys: one
    middleware, or none when neither key is set (None or empty: not set)."""
    api_key, admin_api_key = api_key or None, admin_api_key or None
    if not (api_key or admin_api_key):
        return []

    @web.middleware
    async def require_key(request: web.Request, handler):
        status = auth_status(request.method, request.path, request.headers.get("Authorization"),
                             request.headers.get("x-api-key"), api_key, admin_api_key)
        if status is not None:
            return web.json_response({"error": "Unauthorized"}, status=status)
        return await handler(request)

    return [require_key]
