"""Every model family's bad outputs end an episode with a typed status, through real episodes.

For each chat format with an offline vocabulary, a corpus written in that family's own syntax (its
calls written by the local stack's dialect, then broken the ways models break them) runs through
a real :class:`~rollout.core.worker.RolloutWorker` (real tau2 retail environment, scripted user)
against a scripted ``/generate`` server, in both ``policy.on_parse_error`` modes: a malformed call
is fed back in band or ends the episode ``parse_error``, a length stop is ``truncated`` (never a
parse error), a good call or several run as tool steps, and nothing crashes the worker. Mask 1
covers exactly the ids the server returned.
"""

from __future__ import annotations

import asyncio

import pytest
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import load_config
from rollout.core.formats import get_chat_format
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.tokenizer import load_tokenizer
from rollout.core.worker import RolloutWorker
from rollout.devtools.local.dialects import get_dialect

# hermes reads one call per turn (the agent's instruction asks for one; two are fed back as an
# error), the others every call of the turn
SEVERAL_CALLS = {"hermes": False, "qwen3.6": True, "deepseek-v4": True, "mistral": True}
FAMILIES = [  # (chat format, its offline vocabulary, the package that ships it or renders it)
    ("hermes", "builtin:qwen3", None),
    ("qwen3.6", "builtin:qwen3.6", "renderers"),
    ("deepseek-v4", "builtin:deepseek-v4", "renderers"),
    ("mistral", "builtin:mistral", "mistral_common"),
]
CALL = ("get_order_details", {"order_id": "#W2378156"})
CALL_2 = ("get_user_details", {"user_id": "yusuf_rossi_9620"})
GOODBYE = "Thank you, goodbye."


def _corpus(dialect, several_calls: bool) -> list[dict]:
    """The cases: text, how the turn ends, and the outcome expected in each mode."""
    one = dialect.assistant_text("", [CALL])
    two = dialect.assistant_text("", [CALL, CALL_2])
    return [
        {"name": "one_call", "text": one, "finish": "eos", "expect": "tool", "steps": 1},
        {"name": "call_stopped_on_a_stop_string", "text": one, "finish": "stop", "expect": "tool", "steps": 1},
        {"name": "two_calls", "text": two, "finish": "eos", "expect": "tool" if several_calls else "parse_error", "steps": 2},
        {"name": "plain_text", "text": dialect.assistant_text("Your order has shipped.", []), "finish": "eos", "expect": "text"},
        {"name": "unknown_tool", "text": dialect.assistant_text("", [("no_such_tool", {"x": 1})]), "finish": "eos", "expect": "parse_error"},
        {"name": "call_cut_in_half", "text": one[: len(one) * 2 // 3], "finish": "eos", "expect": "parse_error"},
        {"name": "empty", "text": "", "finish": "eos", "expect": "parse_error"},
        {"name": "length_stop_mid_call", "text": one[: len(one) // 2], "finish": "length", "expect": "truncated"},
    ]


def _family(name: str, vocabulary: str, package: str | None):
    if package is not None:
        pytest.importorskip(package)
    tok = load_tokenizer(vocabulary)
    return tok, get_dialect(name), get_chat_format(name)(tok).eot_ids


async def _run(tok, eot_ids, name, vocabulary, cases, mode):
    by_eid = {f"corpus/{c['name']}": c for c in cases}
    goodbye = get_dialect(name).assistant_text(GOODBYE, [])

    def script(eid, step, input_ids):
        case = by_eid[eid]
        return (case["text"], case["finish"]) if step == 0 else (goodbye, "eos")

    async with ScriptedPolicyServer(tok, script, eot_ids=eot_ids) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", f"policy.tokenizer={vocabulary}", f"policy.chat_format={name}",
                                 f"policy.on_parse_error={mode}", "env.max_steps=4", "policy.on_length=truncate"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=8)
        specs = [EpisodeSpec(eid, "retail", "0", eid, 0) for eid in by_eid]
        try:
            return await asyncio.wait_for(asyncio.gather(*[worker.run(s) for s in specs]), timeout=240)
        finally:
            await worker.close()


@pytest.mark.parametrize("name, vocabulary, package", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize("mode", ["abort", "feedback"])
async def test_every_bad_output_is_a_typed_outcome(name, vocabulary, package, mode):
    tok, dialect, eot_ids = _family(name, vocabulary, package)
    cases = _corpus(dialect, SEVERAL_CALLS[name])
    results = await _run(tok, eot_ids, name, vocabulary, cases, mode)
    for case, res in zip(cases, results):
        res.trajectory.check()
        m = res.metadata
        assert sum(res.trajectory.loss_mask) == m["generated_tokens"], case["name"]
        if case["expect"] == "truncated":
            assert res.status is EpisodeStatus.TRUNCATED and m["termination_reason"] == "turn_length", (case["name"], m)
            assert m["parse_errors"] == 0 and m["length_finishes"] == 1
        elif case["expect"] == "parse_error" and mode == "abort":
            assert res.status is EpisodeStatus.PARSE_ERROR and m["parse_errors"] == 1, (case["name"], m)
        elif case["expect"] == "parse_error":  # fed back in band, then the goodbye ends the episode
            assert res.status is EpisodeStatus.COMPLETED and m["parse_errors"] == 1 and m["requests"] == 2, (case["name"], m)
            feedback = res.messages[3]
            assert feedback["role"] == "user" and feedback["content"].startswith("[format error]") and feedback.get("format_feedback")
        else:
            assert res.status is EpisodeStatus.COMPLETED and m["parse_errors"] == 0, (case["name"], m)
            # a turn the server ended before the end-of-turn ids is closed with them (mask 0)
            assert m["turn_boundary_repairs"] == (1 if case["finish"] == "stop" else 0), (case["name"], m)
            if case["expect"] == "tool":  # each call one tool step, then the goodbye
                assert m["requests"] == 2 and len(res.messages[2]["tool_calls"]) == case["steps"], (case["name"], m)
                assert [x["role"] for x in res.messages[3:3 + case["steps"]]] == ["tool"] * case["steps"]
