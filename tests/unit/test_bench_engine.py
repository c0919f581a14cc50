"""The engine bench's pure parts (rollout.devtools.bench.engine): the calls it reads from a
trajectory, the ratio and the report. The bench itself starts a real vLLM (minutes on this
machine), so its end-to-end run is the command in docs/engines.md, not a test."""

import pytest

from rollout.core.trajectory import Trajectory
from rollout.devtools.bench.engine import compare, episode_calls, format_report


def _two_turns() -> Trajectory:
    t = Trajectory(prompt_ids=[1, 2, 3])
    t.append_generated([10, 11], [-0.1, -0.2], "v1")  # call 0: prompt [1, 2, 3], 2 ids
    t.append_context([20, 21, 22])  # a tool result
    t.append_generated([12, 13, 14], [-0.1, -0.2, -0.3], "v1")  # call 1
    return t


def test_episode_calls_prompt_is_everything_before_the_span():
    calls = episode_calls(_two_turns(), "g-1")
    assert calls == [([1, 2, 3], 2, "g-1"), ([1, 2, 3, 10, 11, 20, 21, 22], 3, "g-1")]


def test_episode_calls_start_at_the_live_segment_and_skip_empty_calls():
    t = _two_turns()
    t.generation_spans.append((len(t.response_ids), len(t.response_ids)))  # a call aborted before its first token
    t.weight_versions.append("v1")
    t.start_segment([7, 8])  # a re-rendered prompt: the next call is given only this segment
    t.append_generated([15], [-0.5], "v2")
    calls = episode_calls(t, "k")
    assert len(calls) == 3
    assert calls[2] == ([7, 8], 1, "k")


def _phase(episodes, calls, tokens, wall):
    return {"episodes": episodes, "calls": calls, "tokens": tokens, "wall_s": wall}


def test_compare_ratio_and_same_work():
    row = compare(_phase(8, 24, 1000, 4.0), _phase(8, 24, 1000, 2.0))
    assert row["pool_eps_per_s"] == pytest.approx(2.0)
    assert row["plain_eps_per_s"] == pytest.approx(4.0)
    assert row["ratio"] == pytest.approx(0.5)
    assert row["same_work"] is True
    assert compare(_phase(8, 24, 1000, 4.0), _phase(8, 24, 999, 2.0))["same_work"] is False


def test_compare_refuses_an_empty_phase():
    with pytest.raises(ValueError, match="plain phase"):
        compare(_phase(8, 24, 1000, 4.0), _phase(8, 24, 1000, 0.0))


def test_report_prints_both_rates_the_ratio_and_a_mismatch():
    rows = [compare(_phase(8, 24, 1000, 4.0), _phase(8, 24, 1000, 2.0)),
            compare(_phase(8, 24, 1000, 3.0), _phase(8, 24, 1001, 2.0))]
    text = format_report(rows, "vllm", 8)
    assert "pool 2.333 eps/s, plain loop 4.000 eps/s: ratio 0.583 (range 0.500-0.667 over 2 reps)" in text
    assert "overhead 41.7%" in text
    assert text.count("MISMATCH") == 1
