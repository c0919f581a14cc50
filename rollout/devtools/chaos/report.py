"""A fault's row: counting a run folder (:func:`tally`), the verdicts and exit codes, the table."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

# Row verdicts and the bench's exit codes (see the module docstring).
VERDICTS = ("ok", "broken", "not_injected")
EXIT_OK = 0
EXIT_BROKEN = 1  # a guarantee broke (lost, duplicated, left behind, a check on the outcome failed)
EXIT_NOT_INJECTED = 5  # every guarantee held, but some fault could not be (fully) injected



def exit_code(rows: list[dict[str, Any]]) -> int:
    """The chaos bench's exit code for its rows (see the module docstring):
    :data:`EXIT_BROKEN` if a row's verdict is ``broken`` (or a row has none), else
    :data:`EXIT_NOT_INJECTED` if one is ``not_injected``, else :data:`EXIT_OK` (also for no rows)."""
    verdicts = [r.get("verdict") for r in rows]
    if any(v not in ("ok", "not_injected") for v in verdicts):
        return EXIT_BROKEN
    return EXIT_NOT_INJECTED if "not_injected" in verdicts else EXIT_OK


def verdict(guarantees_held: bool, injected: dict[str, Any] | None) -> str:
    """A row's verdict: ``broken`` unless ``guarantees_held``; else ``not_injected`` unless
    ``injected`` (a row's ``injected`` record) shows every planned fault done; else ``ok``."""
    if not guarantees_held:
        return "broken"
    return "ok" if injected is not None and injected.get("complete") else "not_injected"


# -- counting ---------------------------------------------------------------------------------
def _jsonl(path: Path, notes: list[str]) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            notes.append(f"{path.name}:{n + 1} is not valid JSON (torn line)")
    return out


def _episode_id(d: dict) -> str:
    return str(d.get("episode_id") or (d.get("metadata") or {}).get("episode_id") or "")


def tally(out_dir: Path) -> dict[str, Any]:
    """Count a run's episodes (see the module docstring for the definitions).

    Returns:
        ``{"submitted", "delivered", "lost", "duplicated", "statuses", "reruns", "lost_ids",
        "duplicated_ids", "unexpected_ids", "notes"}``.
    """
    notes: list[str] = []
    specs = [_episode_id(d) for d in _jsonl(out_dir / "specs.jsonl", notes)]
    rows = [d for f in ("samples.jsonl", "failed.jsonl", "filtered.jsonl") for d in _jsonl(out_dir / f, notes)]
    written = [_episode_id(d) for d in rows]
    journal = [_episode_id(d) for d in _jsonl(out_dir / "episodes.jsonl", notes)]
    spec_set = set(specs)
    reruns = {i for i in set(written) | set(journal) if "~r" in i and i.split("~r", 1)[0] in spec_set}
    submitted = spec_set | reruns
    delivered = set(written)
    dup = {i for i, n in collections.Counter(written).items() if n > 1} | {i for i, n in collections.Counter(journal).items() if n > 1}
    if len(specs) != len(spec_set):
        notes.append(f"specs.jsonl names {len(specs) - len(spec_set)} episode(s) twice")
    statuses: collections.Counter[str] = collections.Counter()
    first: set[str] = set()
    for d, i in zip(rows, written):
        if i not in first:
            first.add(i)
            statuses[str(d.get("status"))] += 1
    return {
        "submitted": len(submitted), "delivered": len(delivered), "lost": len(submitted - delivered), "duplicated": len(dup),
        "statuses": dict(sorted(statuses.items())), "reruns": len(reruns), "lost_ids": sorted(submitted - delivered)[:20],
        "duplicated_ids": sorted(dup)[:20], "unexpected_ids": sorted(delivered - submitted)[:20], "notes": notes,
    }


def injected_text(injected: dict[str, Any] | None) -> str:
    """A row's ``injected`` record as the table shows it: ``3/3 kills`` (``-`` for none)."""
    if not injected:
        return "-"
    unit = injected.get("unit", "")
    return f"{injected.get(unit, 0)}/{injected.get('planned', '?')} {unit}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The bench's table: one row per fault (``ok``: ``yes``, ``NO`` for a broken guarantee,
    ``n/i`` for a fault not (fully) injected whose guarantees held; ``injected``: done / planned),
    then each fault's notes."""
    head = ("fault", "ok", "injected", "submitted", "delivered", "lost", "dup", "left", "wall s", "statuses")
    shown = {"ok": "yes", "broken": "NO", "not_injected": "n/i"}
    body = []
    for r in rows:
        st = " ".join(f"{k}={v}" for k, v in r.get("statuses", {}).items()) or "-"
        v = r.get("verdict") or ("ok" if r.get("ok") else "broken")
        body.append((r["fault"], "skip" if r.get("skipped") else shown.get(v, v), injected_text(r.get("injected")),
                     *(str(r.get(k, "-")) for k in ("submitted", "delivered", "lost", "duplicated", "left_behind")),
                     f"{r['wall_s']:.0f}" if isinstance(r.get("wall_s"), (int, float)) else "-", st))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i in (0, 2, 9) else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), "  ".join("-" * w for w in widths), *(fmt.format(*b) for b in body), "", "notes:"]
    for r in rows:
        lines.append(f"  {r['fault']}: " + "; ".join(r.get("notes", [])))
    return "\n".join(lines)
