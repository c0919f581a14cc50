"""``python -m rollout formats``: the chat formats (model families) this install can speak.

One row per registered family (:func:`rollout.core.formats.format_infos`): its name (the value of
``policy.chat_format``), the ``builtin:`` vocabulary the project loads offline for it, whether that
vocabulary's package (and what its renderer needs) is installed here, whether the test suite checks the family against that
real vocabulary, what renders it, and how ``policy.chat_format=auto`` detects it.
"""

from __future__ import annotations

import json
from typing import Any

from rollout.core.formats import format_infos

__all__ = ["format_rows", "format_table", "formats_json"]


def _available(vocabulary: str | None) -> bool | None:
    """Whether the ``builtin:`` vocabulary's package is installed (None: the family has none)."""
    if vocabulary is None:
        return None
    from rollout.core.tokenizer import TokenizerSourceError, check_tokenizer_source

    try:
        check_tokenizer_source(f"builtin:{vocabulary}")
    except TokenizerSourceError:
        return False
    return True


def format_rows() -> list[dict[str, Any]]:
    """One object per family: ``name``, ``tokenizer`` (``builtin:<vocabulary>`` or None),
    ``installed`` (its vocabulary's package and the packages it needs, ``FormatInfo.requires``,
    are here; None without either), ``tested``, ``renderer``, ``detection``, ``note``."""
    rows = []
    for info in format_infos():
        row = info.as_row()
        vocabulary = _available(info.vocabulary)
        row["installed"] = None if vocabulary is None and not info.requires else vocabulary is not False and not info.missing()
        rows.append(row)
    return rows


def formats_json() -> str:
    """:func:`format_rows` as a JSON list (``python -m rollout formats --json``)."""
    return json.dumps(format_rows(), indent=1)


def format_table() -> str:
    """:func:`format_rows` as an aligned text table, then one line per family on detection and notes."""
    rows = format_rows()
    head = ("format", "tokenizer (offline)", "installed", "tested", "renderer")

    def yn(v: bool | None) -> str:
        return "-" if v is None else ("yes" if v else "no")

    cells = [(r["name"], r["tokenizer"] or "- (bring your own)", yn(r["installed"]), yn(r["tested"]), r["renderer"]) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
    lines.append("")
    lines.append("policy.chat_format=auto detects (tried in this order, hermes last):")
    for r in sorted(rows, key=lambda r: r["name"] == "hermes"):
        lines.append(f"  {r['name']}: {r['detection'] or 'never (name it in policy.chat_format)'}" + (f"; {r['note']}" if r["note"] else ""))
    return "\n".join(lines)
