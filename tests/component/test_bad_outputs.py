"""Every kind of bad model output is a defined outcome: the corpus in data/bad_outputs.jsonl is run
through real episodes (real tau2 retail environment, scripted user) in both parse-error modes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import load_config
from rollout.core.formats import ParseError, parse_turn
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker

CORPUS = [json.loads(line) for line in (Path(__file__).resolve().parents[1] / "support" / "data" / "bad_outputs.jsonl").open(encoding="utf-8")]
GOODBYE = "Thank you, goodbye."


def test_corpus_is_large_and_covers_every_kind():
    assert len(CORPUS) >= 40
    names = {c["name"] for c in CORPUS}
    for kind in ["invalid_json_trailing_comma", "unknown_tool", "wrong_argument_type_int", "missing_required_argument",
                 "two_calls", "unclosed_call", "text_before_call", "huge_argument_value", "non_ascii_text",
                 "empty_output", "whitespace_only", "unclosed_think"]:
        assert kind in names


@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
def test_parser_outcome(case, retail):
    try:
        turn = parse_turn(case["text"], retail.tool_names)
        got = "tool" if turn.tool_call is not None else "text"
    except ParseError as e:
        got = "parse_error"
        assert case["error"] in str(e)
    assert got == case["expect"]


def _script(cases):
    by_eid = {f"corpus/{c['name']}": c for c in cases}

    def script(eid, step, input_ids):
        case = by_eid[eid]
        if step == 0:
            return case["text"], case.get("finish", "stop" if case.get("no_eos") else "eos")
        return GOODBYE, "eos"

    return script


async def _run_corpus(tokenizer, cases, mode):
    async with ScriptedPolicyServer(tokenizer, _script(cases)) as server:
        # on_length=keep: two cases are turns cut at the length budget (unclosed <tool_call> /
        # <think>), kept so that their parse outcome is what is checked (truncate: tests/component/test_on_length.py)
        cfg = load_config(None, [f"policy.router_url={server.url}", f"policy.on_parse_error={mode}", "env.max_steps=4",
                                 "policy.sampling.max_new_tokens=30000", "policy.on_length=keep"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=8)
        specs = [EpisodeSpec(f"corpus/{c['name']}", "retail", "0", f"corpus/{c['name']}", 0) for c in cases]
        try:
            return await asyncio.wait_for(asyncio.gather(*[worker.run(s) for s in specs]), timeout=120)
        finally:
            await worker.close()


async def test_corpus_through_episodes_abort_mode(tokenizer):
    results = await _run_corpus(tokenizer, CORPUS, "abort")  # (its own hang guard: 120 s)
    for case, res in zip(CORPUS, results):
        traj = res.trajectory
        traj.check()
        if case["expect"] == "parse_error":
            assert res.status is EpisodeStatus.PARSE_ERROR, (case["name"], res.metadata)
            assert case["error"] in res.metadata["error"]
            assert res.metadata["requests"] == 1
        else:
            assert res.status is EpisodeStatus.COMPLETED, (case["name"], res.metadata)
            if case["expect"] == "tool":
                assert res.metadata["tool_errors"] == int(case["tool_error"]), case["name"]
                assert res.metadata["requests"] == 2
            else:  # a question gets an answer from the scripted user, then the goodbye turn
                assert res.metadata["requests"] == (2 if "?" in case["text"] else 1), case["name"]
        # mask 1 exactly on what the server returned: the text's ids, plus EOS when generated
        eos = 0 if case.get("no_eos") else 1
        expected = len(tokenizer.encode(case["text"], add_special_tokens=False)) + eos
        if res.metadata["requests"] == 2:
            expected += len(tokenizer.encode(GOODBYE, add_special_tokens=False)) + 1
        assert sum(traj.loss_mask) == expected == res.metadata["generated_tokens"]
        assert res.metadata["turn_boundary_repairs"] == 1 - eos


async def test_corpus_parse_errors_feedback_mode(tokenizer):
    cases = [c for c in CORPUS if c["expect"] == "parse_error"]
    results = await _run_corpus(tokenizer, cases, "feedback")
    for case, res in zip(cases, results):
        assert res.status is EpisodeStatus.COMPLETED, (case["name"], res.metadata)
        assert res.metadata["parse_errors"] == 1 and res.metadata["requests"] == 2
        feedback = res.messages[3]
        assert feedback["role"] == "user" and "[format error]" in feedback["content"]
        # the feedback reached the model as context (mask 0) between the two generations
        text = tokenizer.decode(res.trajectory.tokens)
        assert "[format error]" in text and text.rstrip().endswith(GOODBYE + "<|im_end|>")


async def test_context_window_truncates_without_overflow(tokenizer):
    """A policy that keeps calling tools fills the window: the episode ends `truncated` (context)
    and the trajectory never exceeds policy.max_context_tokens."""
    call = "<tool_call>\n" + json.dumps({"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}) + "\n</tool_call>"
    async with ScriptedPolicyServer(tokenizer, lambda eid, step, ids: (call, "stop")) as server:
        limit = 9000
        cfg = load_config(None, [f"policy.router_url={server.url}", f"policy.max_context_tokens={limit}", "env.max_steps=50"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging)
        try:
            res = await worker.run(EpisodeSpec("ctx", "retail", "0", "g", 0))
        finally:
            await worker.close()
    assert res.status is EpisodeStatus.TRUNCATED and res.metadata["termination_reason"] == "context"
    assert res.metadata["turns"] >= 2
    assert len(res.trajectory) <= limit
