"""What the commands share: argument types (argparse ``type=`` callables) and their one-line
error reporting (the CLI prints: ``python -m rollout``)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Callable

from rollout.core.config import ConfigError

__all__ = ["int_arg", "one_line_errors", "plain_text"]

# A Sphinx cross-reference role in a docstring: :mod:`x`, :func:`~a.b.c`, ...
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def plain_text(doc: str) -> str:
    """A docstring's reStructuredText as ``--help`` shows it: ````x```` as ``x``, a cross-reference
    such as ``:mod:`a.b``` as ``a.b`` (``:func:`~a.b.c``` as ``c``, as Sphinx shows it)."""
    def ref(m: re.Match) -> str:
        return m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)

    return _ROLE.sub(ref, doc).replace("``", "")


def int_arg(text: str, what: str, low: int, high: int | None = None) -> int:
    """``text`` as an integer in ``[low, high]`` (``high`` None: no upper bound), for an argparse
    ``type=`` callable: anything else raises :class:`argparse.ArgumentTypeError` naming ``what``
    (a usage error, exit 2).

    Args:
        text: the argument as given.
        what: what it is, in the message (e.g. ``"a port number"``).
        low / high: the inclusive bounds.

    Raises:
        argparse.ArgumentTypeError: not an integer, or out of the bounds.
    """
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if n < low or (high is not None and n > high):
        raise argparse.ArgumentTypeError(f"must be {low} to {high}, got {n}" if high is not None else f"must be >= {low}, got {n}")
    return n


def one_line_errors(work: Callable[[], dict[str, Any]], errors: tuple[type[Exception], ...]) -> dict[str, Any] | None:
    """``work()``'s result, or ``None`` after printing its failure on stderr in one line: ``config
    error: ...`` for a :class:`~rollout.core.config.ConfigError` or a missing file, ``error: ...`` for one of ``errors``
    (the caller then exits 2). Anything else propagates (a bug: a traceback, exit 1)."""
    try:
        return work()
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
    return None
