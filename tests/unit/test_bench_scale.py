"""The ``scale`` bench's pure parts (:mod:`rollout.devtools.bench.scale`): medians per actor count and
the episode phase's speed-up against the first count."""

from __future__ import annotations

import pytest

from rollout.devtools.bench.scale import format_rows, summarize


def _run(actors: int, phase: float | None, start: float = 6.0) -> dict:
    return {"actors": actors, "servers": 4, "exit_code": 0, "wall_s": 1.0, "episodes": 228,
            "status_counts": {"completed": 228}, "startup_s": start, "episodes_phase_s": phase, "episodes_per_s": 1.0}


def test_the_summary_takes_medians_per_actor_count_and_the_speedup_against_the_first():
    runs = [_run(2, 21.0), _run(8, 6.0), _run(8, 7.0, 5.0), _run(2, 20.0, 7.0), _run(2, 22.0), _run(8, 8.0)]
    rows = summarize(runs)
    assert [r["actors"] for r in rows] == [2, 8]  # in the order first run
    assert rows[0]["episodes_phase_s"] == 21.0 and rows[1]["episodes_phase_s"] == 7.0
    assert (rows[1]["phase_min_s"], rows[1]["phase_max_s"]) == (6.0, 8.0) and rows[1]["startup_s"] == 6.0
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] == pytest.approx(3.0)
    text = format_rows(rows)
    assert "8 actors against 2 (local.num_servers=4): x3.00" in text and "21.00 s -> 7.00 s" in text


def test_a_run_without_an_episode_phase_has_no_speedup():
    rows = summarize([_run(2, 10.0), _run(4, None)])
    assert rows[1]["episodes_phase_s"] is None and rows[1]["speedup"] is None
    assert "actors against" not in format_rows(rows)
