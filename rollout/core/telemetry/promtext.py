"""Read Prometheus' text exposition format (what Ray's metrics export port and SGLang's servers
answer on ``/metrics``), enough for the KV gate, the benches, tests and the dashboard preview: no
dependency.

The format (Prometheus' "Exposition formats" documentation): one sample per line,
``name{label="value",...} value [timestamp]``; ``#`` lines are comments (``HELP``, ``TYPE``);
label values escape ``\\``, ``"`` and newlines with a backslash; values may be ``NaN``,
``+Inf``, ``-Inf``.
"""

from __future__ import annotations

import math
import re
import urllib.request
from dataclasses import dataclass

__all__ = ["Sample", "parse", "scrape", "select", "total"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    """One line of the exposition: a series' name, its labels and its value."""

    name: str
    labels: dict[str, str]
    value: float


def _value(text: str) -> float:
    t = text.strip()
    if t in ("+Inf", "Inf"):
        return math.inf
    if t == "-Inf":
        return -math.inf
    return float(t)  # "NaN" too


def parse(text: str, prefix: str = "", strict: bool = True) -> list[Sample]:
    """The samples of an exposition whose name starts with ``prefix``. ``strict=False`` skips a
    line that is not a sample instead of raising (a reader that must not fail on one odd line
    from a server it does not control: :mod:`rollout.core.policy.kvgate`).

    Raises:
        ValueError: with ``strict``, a line that is not a comment, blank, or a sample (names the line).
    """
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or not line.startswith(prefix):
            continue
        if not strict:
            try:
                out.extend(parse(line, prefix))
            except ValueError:
                pass
            continue
        m = _NAME.match(line)
        if m is None:
            raise ValueError(f"not a sample line: {raw!r}")
        name, rest = m.group(0), line[m.end():]
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            end = _label_end(rest)
            body, rest = rest[1:end], rest[end + 1:]
            pos = 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                if lm is None:
                    raise ValueError(f"bad labels in {raw!r}")
                labels[lm.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], lm.group(2))
                pos = lm.end()
        fields = rest.split()
        if not fields:
            raise ValueError(f"no value in {raw!r}")
        out.append(Sample(name, labels, _value(fields[0])))
    return out


def _label_end(rest: str) -> int:
    """Index of the ``}`` closing the label set that ``rest`` opens (quotes and escapes skipped)."""
    quoted = escaped = False
    for i, ch in enumerate(rest):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return i
    raise ValueError(f"unclosed labels: {rest[:80]!r}")


def select(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    """The samples named ``name`` whose labels include ``labels``."""
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of :func:`select` 's values (0.0 when none)."""
    return float(sum(s.value for s in select(samples, name, **labels)))


def scrape(url: str, timeout_s: float = 5.0, prefix: str = "") -> list[Sample]:
    """GET ``url`` (e.g. ``http://127.0.0.1:PORT/metrics``) and :func:`parse` it.

    Raises:
        OSError: the endpoint does not answer (urllib's ``URLError`` is one).
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return parse(r.read().decode("utf-8", errors="replace"), prefix)
