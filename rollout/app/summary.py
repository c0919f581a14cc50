"""The end-of-run table that ``python -m rollout run`` (and ``--replay``) prints from a run's
summary (:func:`format_summary`)."""

from __future__ import annotations

from typing import Any


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table: statuses (for a stopped run also the episodes journaled in groups not
    complete yet and those not delivered, which add up to the episodes planned), what was trained
    and kept out, the samples of a sample mode and the compactions of a context strategy, mean
    reward over trainable episodes, repeated errors grouped one line per kind, true wall time (over
    every session of a resumed run, and this session's), the files."""
    rows = [("episodes", str(summary["episodes"]))]
    for st, n in sorted(summary["status_counts"].items()):
        rows.append((f"  {st}", str(n)))
    if summary.get("undelivered") or summary.get("episodes_in_open_groups"):  # a stopped run: where the rest of the episodes are
        rows += [("journaled, group incomplete", str(summary.get("episodes_in_open_groups", 0))),
                 ("not delivered", str(summary.get("undelivered", 0))),
                 ("episodes planned (these three)", str(summary.get("episodes_planned", "?")))]
    rows.append(("trained samples", str(summary.get("trained_samples", summary["episodes"]))))
    if summary.get("sample_mode", "trajectory") != "trajectory" or summary.get("samples", summary["episodes"]) != summary["episodes"]:
        rows.append((f"samples ({summary.get('sample_mode', 'trajectory')}), splits", f"{summary.get('samples', 0)}, {summary.get('sample_splits', 0)}"))
    if summary.get("context_strategy", "none") != "none":
        rows.append((f"compactions ({summary['context_strategy']})", str(summary.get("compactions", 0))))
        rows.append((f"  longest sample (of {summary.get('max_context_tokens')})", str(summary.get("max_sample_tokens", 0))))
    for reason, n in sorted(summary.get("excluded_counts", {}).items()):
        rows.append((f"  excluded: {reason}", str(n)))
    for d, r in sorted(summary["mean_reward_per_domain"].items()):
        rows.append((f"mean reward ({d}, trainable)", f"{r:.4f}"))
    raw = summary.get("mean_raw_reward_per_domain") or {}
    if summary.get("reward_shaping") or any(raw.get(d, r) != r for d, r in summary["mean_reward_per_domain"].items()):
        rows += [(f"  raw (tau2's, unshaped; {d})", f"{r:.4f}") for d, r in sorted(raw.items())]
    rows += [(label, str(n)) for label, n in (("tasks skipped: open issues", (summary.get("skipped_tasks") or {}).get("open_issues", 0)),
                                             ("episodes of tasks with open issues", summary.get("episodes_with_task_issues", 0))) if n]
    rows += [
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("mean tokens / episode", f"{summary['mean_tokens']:.1f}"),
        ("generated tokens", str(summary["generated_tokens"])),
        ("turn-boundary repairs", str(summary["turn_boundary_repairs"])),
        ("parse errors", str(summary["parse_errors"])),
        ("turns cut at max_new_tokens", str(summary.get("length_cut_turns", 0))),
        ("  episodes ended by it", str(summary.get("episodes_ended_by_turn_length", 0))),
        *([(f"wall time, {summary['resumed_sessions'] + 1} sessions (s)", f"{summary['wall_s']:.2f}"),
           ("  this session (s)", f"{summary['session_wall_s']:.2f}")]
          if summary.get("resumed_sessions") and summary.get("session_wall_s") is not None else [("wall time (s)", f"{summary['wall_s']:.2f}")]),
        *([("  start-up, episodes (s)", f"{summary['startup_s']:.2f}, {summary['episodes_phase_s']:.2f}")]
          if summary.get("startup_s") is not None and summary.get("episodes_phase_s") is not None else []),
        ("episodes / s", f"{summary['episodes_per_s']:.3f}"),
    ]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 14)
    out = [line] + [f"{k:<{w}}  {v:>10}" for k, v in rows] + [line]
    errors = summary.get("errors") or []
    if errors:
        out.append("errors (one line per kind):")
        out += [f"  {e['count']:>5} x {e['kind']}" for e in errors[:20]]
        if len(errors) > 20:
            out.append(f"  ... and {len(errors) - 20} more kinds (summary.json)")
    for d in summary.get("journal_repairs") or []:
        out.append(f"journal line set aside: {d['file']}:{d['line']} {d['kind']} ({d['size']} bytes: {d['reason']}); its episode ran again")
    if summary.get("status") not in (None, "finished"):
        out.append(f"run {summary['status']}: {summary.get('reason')}")
        if summary.get("undelivered") or summary.get("episodes_in_open_groups"):
            out.append("--resume completes the incomplete groups and runs the episodes not delivered")
    return "\n".join(out)
