"""Which event loop the rollout actors and the local server run: uvloop or asyncio's own.

uvloop (MagicStack, libuv under asyncio's API) runs the loop's machinery and its sockets in C;
where the CPU is the bound it gives more episodes/s and less loop lag than asyncio's selector
loop, measured side by side with ``python -m rollout.bench pool ... --baseline
pool.event_loop=asyncio --baseline local.event_loop=asyncio`` (docs/performance.md).

Ray creates an async actor's loop itself, with uvloop whenever it can import it and the
environment variable ``RAY_USE_UVLOOP`` is not false (``ray._private.async_compat``): the pool
sets that variable in each actor's ``runtime_env`` from ``pool.event_loop``
(:func:`ray_env_vars`) and checks, once the actors are up, which loop they got.
"""

from __future__ import annotations

import asyncio
import importlib.util

from rollout.core.choices import EventLoop

EVENT_LOOPS = tuple(k.value for k in EventLoop)  # ("uvloop", "asyncio")


def uvloop_available() -> bool:
    """Whether ``uvloop`` can be imported in this process (it does not import it)."""
    return importlib.util.find_spec("uvloop") is not None


def check_event_loop(kind: str, key: str) -> str | None:
    """Why ``kind`` cannot be used here, naming the config ``key``; None when it can.

    Args:
        kind: ``"uvloop"`` or ``"asyncio"``.
        key: the config key that chose it (for the message), e.g. ``pool.event_loop``.
    """
    if kind not in EVENT_LOOPS:
        return f"{key}: must be one of {', '.join(EVENT_LOOPS)}, got {kind!r}"
    if kind == "uvloop" and not uvloop_available():
        return f"{key}: uvloop is not installed here (pip install uvloop, a dependency of this project on Linux and macOS), or set {key}=asyncio"
    return None


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop of the given kind (not set as the current loop).

    Raises:
        ValueError: ``kind`` is not one of :data:`EVENT_LOOPS`.
        ImportError: ``kind == "uvloop"`` and uvloop is not installed.
    """
    if kind == "asyncio":
        return asyncio.new_event_loop()
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, got {kind!r}")


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` for a uvloop loop, ``"asyncio"`` for any other."""
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"


def ray_env_vars(kind: str) -> dict[str, str]:
    """The ``runtime_env`` environment variables that make Ray build an async actor's loop of
    ``kind`` (``RAY_USE_UVLOOP``; Ray falls back to asyncio's loop when uvloop is missing on
    the actor's node, which the pool then reports).

    Raises:
        ValueError: ``kind`` is not one of :data:`EVENT_LOOPS`.
    """
    if kind not in EVENT_LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, got {kind!r}")
    return {"RAY_USE_UVLOOP": "1" if kind == "uvloop" else "0"}
