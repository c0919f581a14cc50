"""The guard of the HTTP servers the project runs on the user's machine: the viewer
(:mod:`rollout.app.viewer`), the local SGLang-protocol server and the stand-ins of the local stack and
the chaos tools (``rollout.devtools``). One aiohttp middleware, :func:`local_guard`, listed first by
each of them.

Any web page open in the user's browser can send requests to ``127.0.0.1``: a ``fetch()`` or a form
POST with ``Content-Type: text/plain`` needs no CORS pre-flight, so it reaches the handler (the page
only cannot read the answer). A server with no API key would then pause generation or load weights
for whatever site the user visits. Refused, in this order:

* **a foreign Host** (DNS rebinding; only with ``hosts``): a name the attacker controls resolved to
  ``127.0.0.1`` makes the browser send ``Host: evil.example:PORT`` and a *matching* Origin, so the
  Origin check alone cannot tell. With ``hosts`` given, the Host's name must be one the server is
  known by (:func:`host_allowed`): 421 otherwise. Only the name is compared, not the port: a
  rebinding attack cannot change the name, and an SSH tunnel (``ssh -L 9000:127.0.0.1:8765``)
  arrives with ``Host: localhost:9000``.
* **a foreign Origin**: a request whose ``Origin`` header is not the server's own
  ``http://HOST:PORT`` (the request's Host, scheme and port compared; ``Origin: null`` of a sandboxed
  page or a ``file://`` page is foreign too): 403.
* **a cross-site request without Origin** (``Sec-Fetch-Site: cross-site`` or ``same-site``, which
  browsers send with ``<img>`` / ``<script>`` loads that carry no Origin), except a top-level
  navigation (``Sec-Fetch-Mode: navigate``: a link to the viewer's page from elsewhere): 403.

A request with neither header (``curl``, Python's HTTP clients, the router, Ray actors) and the
page's own requests (same origin) pass.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import web

logger = logging.getLogger(__name__)

__all__ = ["foreign_origin", "host_allowed", "listen_names", "local_guard"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _split_host(value: str, default_port: int | None) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host``-style ``name[:port]`` (``[v6]:port`` too), the name in lower
    case without brackets; None when it does not parse."""
    try:
        parts = urlsplit(f"//{value.strip()}")
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name:
        return None
    return name.lower(), (port if port is not None else default_port)


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def listen_names(host: str) -> frozenset[str]:
    """The names a server told to listen on ``host`` (an address or a name, as given to ``--host``)
    answers to, in lower case: ``host`` itself; for a loopback address or ``localhost``, also
    ``localhost``, ``127.0.0.1`` and ``::1``; for a wildcard address (``0.0.0.0``, ``::``), also
    ``localhost`` and this machine's host name (:func:`socket.gethostname`). Any IP address the
    connection arrived at is accepted besides (see :func:`host_allowed`)."""
    name = host.strip().strip("[]").lower()
    names = {name}
    ip = _ip(name)
    if name == "localhost" or (ip is not None and ip.is_loopback):
        names |= {"localhost", "127.0.0.1", "::1"}
    elif ip is not None and ip.is_unspecified:
        names |= {"localhost", socket.gethostname().lower()}
    return frozenset(names)


def host_allowed(host_header: str | None, names: Iterable[str], local_ip: str | None) -> bool:
    """Whether a request's ``Host`` header names this server (see the module docstring).

    Args:
        host_header: the ``Host`` header (None: missing; HTTP/1.0 clients may leave it out).
        names: the server's names (:func:`listen_names`).
        local_ip: the address the connection arrived at (the socket's own address), or None.

    Returns:
        True for a missing Host, a name in ``names``, or an IP address that is ``local_ip`` (or a
        loopback address when ``local_ip`` is one): an address cannot be rebound, only a name can.
    """
    if host_header is None:
        return True
    parsed = _split_host(host_header, None)
    if parsed is None:
        return False
    name = parsed[0]
    if name in {n.lower() for n in names}:
        return True
    ip, local = _ip(name), _ip(local_ip) if local_ip else None
    if ip is None or local is None:
        return False
    if isinstance(local, ipaddress.IPv6Address) and local.ipv4_mapped is not None:
        local = local.ipv4_mapped
    return ip == local or (ip.is_loopback and local.is_loopback)


def foreign_origin(origin: str | None, host_header: str | None) -> bool:
    """Whether ``origin`` (a request's ``Origin`` header) is another origin than
    ``http://<host_header>``: True for ``null``, a scheme other than ``http``, or another name or
    port; False without an Origin."""
    if origin is None:
        return False
    parts = urlsplit(origin.strip())
    if parts.scheme.lower() != "http" or not parts.netloc:
        return True
    mine = _split_host(host_header or "", 80)
    theirs = _split_host(parts.netloc, 80)
    return mine is None or theirs is None or mine != theirs


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def local_guard(hosts: Iterable[str] | None = None) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The aiohttp middleware that refuses cross-site requests (see the module docstring); list it
    first in ``web.Application(middlewares=...)``.

    Args:
        hosts: the names the server answers to (:func:`listen_names` of the address it listens
            on) to refuse a foreign ``Host`` with 421; None: any Host (the Origin and
            ``Sec-Fetch-Site`` checks still apply).

    Returns:
        The middleware. A refusal is a JSON ``{"error": ...}`` answer, logged at WARNING.
    """
    names = None if hosts is None else frozenset(h.lower() for h in hosts)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        why = None
        status = 403
        if names is not None:
            sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
            local_ip = sockname[0] if isinstance(sockname, tuple) and sockname else None
            if not host_allowed(host, names, local_ip):
                why, status = f"Host {host!r} is not this server's address (a page of another site, DNS rebinding)", 421
        if why is None and foreign_origin(request.headers.get("Origin"), host):
            why = f"Origin {request.headers.get('Origin')!r} is another site: cross-origin requests are refused"
        if why is None and request.headers.get("Sec-Fetch-Site", "").lower() in ("cross-site", "same-site") \
                and request.headers.get("Sec-Fetch-Mode", "").lower() != "navigate":
            why = "a request sent by a page of another site (Sec-Fetch-Site) is refused"
        if why is not None:
            logger.warning("refused %s %s from %s: %s", request.method, request.path, request.remote, why)
            return web.json_response({"error": why}, status=status)
        return await handler(request)

    return guard
