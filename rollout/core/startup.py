"""The checks the pool itself makes before it starts anything (so that a trainer calling
``RolloutPool(cfg).start()`` without the app's preflight gets the same one-line errors), and their
error type, which the app's preflight (:mod:`rollout.app.preflight`) shares.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error

_BODY_SNIPPET = 160


class PreflightError(RuntimeError):
    """A check before anything starts (or a preflight check) failed; the message is one line
    naming what and where (the config key, the address, the file)."""


def one_line(text: str, limit: int = _BODY_SNIPPET) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters with ``...``."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reason(e: BaseException) -> str:
    """Why a connection failed, in a few words (refused, timed out, or the error's own line)."""
    if isinstance(e, urllib.error.URLError) and e.reason is not None:
        e = e.reason if isinstance(e.reason, BaseException) else OSError(str(e.reason))
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "no answer (timed out)"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    return one_line(f"{type(e).__name__}: {e}")


def importable(module: str) -> bool:
    """Whether ``module`` can be imported here (found on the path and not masked in ``sys.modules``:
    looked up, not imported, milliseconds)."""
    import importlib.util
    import sys

    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# How long check_ray_address waits for a named Ray cluster to accept a connection (seconds): a
# head started just before the job (`ray start --head` in the same script) takes a few seconds to
# listen; ray.init itself waits for minutes on an address where nothing ever will.
RAY_ADDRESS_WAIT_S = 20.0


def check_ray_address(address: str | None, timeout_s: float = RAY_ADDRESS_WAIT_S) -> None:
    """``pool.ray_address`` (or ``RAY_ADDRESS`` when it is null) answers, when it names a cluster
    by ``host:port`` or ``ray://host:port``: a TCP connection to it opens within ``timeout_s``
    (tried every half second, for a head that is still starting). ``None``, ``auto`` and
    ``local`` are left to Ray (``auto`` fails at once when no cluster runs).

    Raises:
        PreflightError: one line naming the key, the address and what to do.
    """
    key = "pool.ray_address"
    if address is None:
        address, key = os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS (pool.ray_address is null)"
    if address is None or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, _, port = hostport.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise PreflightError(f"{key}={address}: not an address of the form host:port or ray://host:port "
                             "(or null, auto, local)")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as e:
            if time.monotonic() + 0.5 >= deadline:
                raise PreflightError(f"{key}={address}: nothing answered there within {timeout_s:g} s ({reason(e)}); start the "
                                     "cluster (ray start --head) or set pool.ray_address=local for a new local one") from None
        time.sleep(0.5)
