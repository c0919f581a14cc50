"""``policy.history`` and ``policy.context_strategy`` token by token, on real episodes.

A scripted SGLang-protocol server (tests/support/scripted_policy.py) plays a thinking model:
every turn opens with a ``<think>`` block, then a tool call or a reply. The real Qwen3 tokenizer
and chat template, tau2 retail and the scripted user; no Ray.

* ``rerender``: each turn's prompt is exactly the chat template's rendering of the conversation
  before it, so earlier thinking is gone after a user turn (Qwen3's template keeps reasoning only
  after the last user message), and the response is exactly the server's ids; ``append`` keeps it.
  ``merge_prefix`` merges exactly the turns whose prompt extends the sample.
* ``drop_tool_results`` / ``drop_oldest_turns`` under a small ``policy.max_context_tokens``: the
  episode goes on past where ``none`` ends ``truncated``, each compaction starts a new segment
  (a new sample in every mode), no sample is over the budget, and the compactions are counted.
* A strategy of one's own, named by import path (``launch/summarise_context.py``): it calls the
  policy for a summary, and the episode goes on with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import load_config
from rollout.core.context import DROPPED_TOOL_RESULT
from rollout.core.export import get_exporter
from rollout.core.output import RunStats
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker

ROOT = Path(__file__).resolve().parents[2]


def _think(n: int) -> str:
    return f"<think>\nPlan {n}: find what the user needs.\n</think>\n\n"


CALL = '<tool_call>\n{"name": "list_all_product_types", "arguments": {}}\n</tool_call>'


def _thinking_script(eid, step, input_ids):
    """call, reply (the user answers), call, reply: the second reply follows a user turn."""
    if step < 0:  # a summary asked for by a context strategy
        return "Earlier the agent listed the product types.", "eos"
    body = CALL if step % 2 == 0 else ("Which product can I help you with?" if step == 1 else "Goodbye.")
    return _think(step) + body, "eos"


def _calling_script(eid, step, input_ids):
    """A tool call every turn: each adds the product list to the context."""
    if step < 0:
        return "Earlier the agent listed the product types.", "eos"
    return _think(step) + CALL, "eos"


async def _run(tokenizer, script, *overrides: str, max_steps: int = 4):
    async with ScriptedPolicyServer(tokenizer, script) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", f"env.max_steps={max_steps}", *overrides])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=1)
        try:
            res = await worker.run(EpisodeSpec("hist/0", "retail", "0", "hist/0", 0))
        finally:
            await worker.close()
    return cfg, worker, res


def _assistant_at(messages: list[dict]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


async def test_rerender_gives_each_turn_the_templates_rendering_and_the_servers_ids(tokenizer):
    cfg, worker, res = await _run(tokenizer, _thinking_script, "policy.history=rerender", "rollout.sample_mode=per_turn")
    assert res.metadata["turns"] == 4 and res.status in (EpisodeStatus.COMPLETED, EpisodeStatus.MAX_STEPS), res.metadata
    episode = res.to_sample()
    turns = get_exporter("per_turn").split(episode)
    assert [s.turn_indices for s in turns] == [[0], [1], [2], [3]]
    at = _assistant_at(res.messages)
    for k, s in enumerate(turns):
        # the prompt: the chat template's own rendering of the conversation before the turn
        text = worker.chat.render(res.messages[: at[k]], add_generation_prompt=True)
        assert s.tokens[: s.prompt_length] == tokenizer.encode(text, add_special_tokens=False), k
        # the response: the server's ids (the script's text + end of turn), all trained, its log-probs
        expected = tokenizer.encode(_thinking_script("", k, [])[0], add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(tokenizer.eos_token)]
        assert s.tokens[s.prompt_length:] == expected and s.loss_mask == [1] * len(expected)
        assert s.rollout_log_probs == pytest.approx([-0.01 * (j + 1) for j in range(len(expected))])
    last_prompt = tokenizer.decode(turns[3].tokens[: turns[3].prompt_length])
    assert "Plan 2" in last_prompt and "Plan 0" not in last_prompt and "Plan 1" not in last_prompt  # dropped after the user's turn

    # append keeps every turn's thinking in the one sequence
    _, _, appended = await _run(tokenizer, _thinking_script, "rollout.sample_mode=per_turn")
    last = get_exporter("per_turn").split(appended.to_sample())[-1]
    assert "Plan 0" in tokenizer.decode(last.tokens[: last.prompt_length])
    assert not appended.trajectory.segment_starts
    # the same turns sampled: the same tokens trained
    assert sum(sum(s.loss_mask) for s in turns) == appended.trajectory.loss_mask.count(1)


async def test_merge_prefix_over_rerender_splits_where_the_rendering_changed_earlier_text(tokenizer):
    _, _, res = await _run(tokenizer, _thinking_script, "policy.history=rerender", "rollout.sample_mode=merge_prefix")
    episode = res.to_sample()
    assert episode.segment_starts, "the user's turn made the template drop earlier thinking: a new segment"
    merged = get_exporter("merge_prefix").split(episode)
    # turn 1 follows a tool result (thinking kept: the prompt extends), turn 2 a user turn (dropped)
    assert [s.turn_indices for s in merged] == [[0, 1], [2, 3]]
    assert all(s.metadata["sample_splits"] == 1 for s in merged)
    per_turn = get_exporter("per_turn").split(episode)
    for s in merged:  # every turn's prompt is a prefix of its merged sample; its ids follow it
        for t in (p for p in per_turn if p.turn_indices[0] in s.turn_indices):
            assert s.tokens[: len(t.tokens)] == t.tokens
    assert sum(sum(s.loss_mask) for s in merged) == sum(sum(s.loss_mask) for s in per_turn)
    stats = RunStats()
    stats.add_episode(merged)
    assert stats.summary()["sample_splits"] == 1 and stats.summary()["samples"] == 2


def test_trajectory_with_rerender_is_refused_naming_both_keys():
    from rollout.core.config import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(None, ["policy.router_url=http://127.0.0.1:1", "policy.history=rerender"])
    assert "\n" not in str(e.value) and "rollout.sample_mode" in str(e.value) and "policy.history=rerender" in str(e.value)


SMALL = ["policy.max_context_tokens=7000", "policy.context_headroom_tokens=400", "policy.sampling.max_new_tokens=300"]
STEPS = 8


@pytest.mark.parametrize("strategy", ["drop_tool_results", "drop_oldest_turns"])
async def test_a_strategy_compacts_where_none_ends_truncated(tokenizer, strategy):
    _, _, plain = await _run(tokenizer, _calling_script, *SMALL, max_steps=STEPS)
    assert plain.status is EpisodeStatus.TRUNCATED and plain.metadata["termination_reason"] == "context", plain.metadata
    assert "compactions" not in plain.metadata  # none counts nothing: the record is as before

    _, _, res = await _run(tokenizer, _calling_script, *SMALL, f"policy.context_strategy={strategy}", max_steps=STEPS)
    assert res.status is EpisodeStatus.MAX_STEPS and res.metadata["turns"] == STEPS, res.metadata
    n = res.metadata["compactions"]
    assert n >= 1 and len(res.trajectory.segment_starts) == n
    episode = res.to_sample()
    for mode in ("trajectory", "per_turn", "merge_prefix"):
        samples = get_exporter(mode).split(episode)
        assert all(len(s.tokens) <= 7000 for s in samples), mode
        assert sum(sum(s.loss_mask) for s in samples) == episode.loss_mask.count(1), mode  # every sampled token, once
        assert [t for s in samples for t in s.turn_indices] == list(range(STEPS)), mode
    segments = get_exporter("trajectory").split(episode)
    assert len(segments) == n + 1  # a new sample at each compaction, never a change inside one
    later = tokenizer.decode(segments[1].tokens[: segments[1].prompt_length])
    if strategy == "drop_tool_results":
        # every earlier call is still there; the oldest results are not
        in_system = tokenizer.decode(episode.tokens[: res.metadata["prompt_tokens"]]).count("<tool_call>")  # the format's instructions
        assert DROPPED_TOOL_RESULT in later and later.count("<tool_call>") == in_system + segments[1].turn_indices[0]
    else:
        assert "Plan 0" not in later and DROPPED_TOOL_RESULT not in later
    stats = RunStats()
    stats.add_episode(get_exporter("trajectory").split(episode))
    assert stats.summary()["compactions"] == n and stats.summary()["max_sample_tokens"] <= 7000


async def test_a_strategy_named_by_import_path_summarises_with_the_policy(tokenizer, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "launch"))
    _, _, res = await _run(tokenizer, _calling_script, *SMALL, "policy.context_strategy=summarise_context:SummariseOldTurns", max_steps=STEPS)
    assert res.status is EpisodeStatus.MAX_STEPS and res.metadata["compactions"] >= 1, res.metadata
    episode = res.to_sample()
    later = get_exporter("trajectory").split(episode)[1]
    assert "Earlier the agent listed the product types." in tokenizer.decode(later.tokens[: later.prompt_length])
    assert "summarise_context" in sys.modules
