"""Free TCP ports for the servers and routers the local stacks start, chosen outside the kernel's
ephemeral range.

A port taken with ``bind(port 0)`` comes from the ephemeral range (``net.ipv4.ip_local_port_range``,
32768-60999 by default), the same range every other ``bind(0)`` and every outgoing connection
draws from. The local stack's router port is chosen when the engine is made, and Ray starts
beside it (``open_pool``'s overlapped start-up): a CI run saw one of Ray's gRPC servers bind that
port first, so the stack's health check read HTTP/2 frames (``BadStatusLine``). A port below the
ephemeral range and above Ray's worker ports (``min_worker_port``..``max_worker_port``,
10002-19999 by default) is never handed out that way; it is picked at random there and checked
free, falling back to the OS's choice when that range is empty or every try is taken.
"""

from __future__ import annotations

import random
import socket

__all__ = ["PORT_RANGE_FLOOR", "free_port", "unassigned_range"]

#: Lowest port :func:`free_port` picks: above Ray's default worker ports (10002-19999).
PORT_RANGE_FLOOR = 20000
_TRIES = 64
_EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"


def unassigned_range(path: str = _EPHEMERAL) -> tuple[int, int] | None:
    """``(low, high)`` (high excluded): the ports from :data:`PORT_RANGE_FLOOR` up to the
    kernel's ephemeral range; ``None`` when that file cannot be read or the range is empty."""
    try:
        with open(path) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (PORT_RANGE_FLOOR, low) if low > PORT_RANGE_FLOOR else None


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, outside the ephemeral range when it can be (see the
    module docstring); another process that picks the same port on purpose can still take it
    first. Raises ``OSError`` when ``host`` cannot be bound at all."""
    span = unassigned_range()
    if span is not None:
        rng = random.SystemRandom()
        for _ in range(_TRIES):
            port = rng.randrange(*span)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
