"""``python -m rollout.bench turns``: a small run writes its JSON, and our per-turn ids are the
seed's full render at every turn of the benchmark's realistic conversations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.core.formats import ChatTemplate
from rollout.devtools.bench import main as bench_main
from rollout.devtools.bench import turns as bench_turns

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "local.yaml")


def test_small_run_writes_the_json(tmp_path, capsys):
    out = tmp_path / "turns.json"
    rc = bench_main(["turns", "--config", CONFIG, "--turns", "4", "--repeat", "2", "--json", str(out), "logging.level=WARNING"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "ids identical (ours == seed's full render) at all 4 turns" in printed
    assert "turn 4: seed / ours" in printed and "ours at turn 4 / ours at turn 2" in printed
    data = json.loads(out.read_text())
    for key in ("domain", "tokenizer", "enable_thinking", "turns", "repeat", "clock", "identical_ids", "rows", "same_step",
                "ratio_last", "ratio_median", "ratio_min", "growth", "growth_seed", "growth_raw", "ratio_met", "growth_met", "targets"):
        assert key in data, key
    assert data["domain"] == "retail" and data["turns"] == 4 and data["identical_ids"] is True
    rows = data["rows"]
    assert [r["turn"] for r in rows] == [1, 2, 3, 4]
    assert all(r["ours_ms"] > 0 and r["seed_ms"] > 0 and r["new_tokens"] > 0 for r in rows)
    assert all(a["tokens"] < b["tokens"] for a, b in zip(rows, rows[1:]))
    assert data["targets"] == {"ratio_last": 20.0, "growth": 1.5}
    loop = data["loop"]  # the event-loop section, with the garbage-collection timing
    for way in ("floor", "transformers", "ours"):  # each way's lag, the floor (a sleeping thread) first
        assert loop[way]["samples"] > 0 and loop[way]["p99_ms"] >= loop[way]["p50_ms"] >= 0, (way, loop[way])
    assert "floor (the thread only sleeps)" in printed
    assert loop["ours"]["calls"] > 0 and loop["transformers"]["calls"] > 0 and loop["floor"]["calls"] > 0
    assert loop["gc_trajectories"] == 512 and loop["gc_tokens"] == loop["tokens"]
    assert loop["gc_lists_ms"] > loop["gc_compact_ms"] >= 0 and "one full garbage collection with 512" in printed


@pytest.mark.parametrize("domain_fixture", ["retail", "airline"])
def test_ours_equals_the_seeds_full_render_at_every_turn(domain_fixture, tokenizer, request):
    domain = request.getfixturevalue(domain_fixture)
    chat = ChatTemplate(tokenizer, tools=domain.tool_schemas)
    opening, steps = bench_turns.build_conversation(domain, 30)
    assert len(steps) == 30
    kinds = {("tool" if s.is_tool_call else "reply") for s in steps}
    assert kinds == {"tool", "reply"}  # tool calls and text replies, tool results and user turns
    n = 0
    for turn, (ours, seed) in enumerate(bench_turns.per_turn_ids(chat, opening, steps), 1):
        assert ours == seed, turn
        n = len(ours)
    assert 10_000 <= n <= 20_000  # a realistic long conversation (about 15k tokens)
    # the conversation's tool results are real tau2 outputs (JSON records from the database)
    assert any(s.follow["role"] == "tool" and s.follow["content"].startswith("{") for s in steps)


def test_a_difference_from_the_seed_fails_loudly(tokenizer, retail):
    class LosesTheNewline(ChatTemplate):
        """The lost-newline bug (verl #3720): the delta misses the template's text after <|im_end|>."""

        def delta_ids(self, messages):
            return super().delta_ids(messages)[1:]

    chat = LosesTheNewline(tokenizer, tools=retail.tool_schemas)
    opening, steps = bench_turns.build_conversation(retail, 3)
    with pytest.raises(bench_turns.IdsMismatch, match="turn 1: our ids differ from the seed's full render"):
        bench_turns.check_identical(chat, opening, steps)


def test_a_template_that_rewrites_history_cannot_be_benchmarked(capsys):
    """Qwen3 with enable_thinking=false prompts with an empty think block that history drops: the
    seed's re-render is not what the policy saw, and the benchmark says so instead of timing."""
    rc = bench_main(["turns", "--config", CONFIG, "--turns", "3", "--repeat", "1", "policy.enable_thinking=false",
                     "logging.level=WARNING"])
    assert rc == 1
    assert "do not give identical ids" in capsys.readouterr().err
