"""Mistral call ids through the real episode loop, on a real tau2 airline task (no server).

A Mistral model of tokenizer v3-v11 writes an id with each call (``[TOOL_CALLS][{"name": ...,
"arguments": ..., "id": "eb9863dc1"}]`` in v3) and mistral-common echoes it in the call's result.
``run_episode`` is driven by a client that answers with the task's gold calls, two per turn, each
written with an id of its own as mistral-common encodes the assistant message, in both
``policy.history`` modes. The kept ``messages`` must carry the ids the model wrote (each call's
``id`` and its result's ``tool_call_id``), and every request's ``input_ids`` must be
mistral-common's own encoding (its message types, the ids the model wrote) of the conversation so
far: the trajectory is append-only with ``rerender`` too, one segment, the same ids as ``append``.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mistral_common")

from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, ToolMessage, UserMessage  # noqa: E402
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import FunctionCall, Tool  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import ToolCall as MCall  # noqa: E402

from rollout.benchmarks.tau2.environment import Tau2Environment  # noqa: E402
from rollout.benchmarks.tau2.user import make_user  # noqa: E402
from rollout.core.config import load_config  # noqa: E402
from rollout.core.episode import run_episode  # noqa: E402
from rollout.core.formats import get_chat_format  # noqa: E402
from rollout.core.policy import Generation  # noqa: E402
from rollout.core.records import EpisodeSpec, EpisodeStatus  # noqa: E402
from rollout.core.settings import EpisodeSettings  # noqa: E402
from rollout.core.tokenizer import load_tokenizer  # noqa: E402

TASK_ID = "7"  # airline: five gold actions (reads, then writes) and one communicate_info; reward 1.0 when replayed
# ids as a v3 model writes them (9 letters or digits), one per gold call
WRITTEN = ["eb9863dc1", "9851183d3", "Qm4T0aZx7", "c0FfEe123", "Zq0V7mKa2"]


class _Client:
    """Answers call ``k`` with the ``k``-th scripted ids and records every call's ``input_ids``."""

    def __init__(self, turns: list[list[int]]):
        self.turns, self.inputs = turns, []

    async def generate(self, input_ids, max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        ids = self.turns[len(self.inputs)]
        self.inputs.append([int(t) for t in input_ids])
        return Generation(ids=list(ids), log_probs=[-0.01] * len(ids), finish_type="stop", weight_version="1")


def _mc_calls(actions, ids) -> list[MCall]:
    return [MCall(id=i, function=FunctionCall(name=a.name, arguments=json.dumps(a.arguments, ensure_ascii=False))) for a, i in zip(actions, ids)]


@pytest.mark.parametrize("history", ["append", "rerender"])
async def test_the_ids_a_mistral_model_writes_reach_the_messages_and_every_prompt(airline, history):
    vocab = load_tokenizer("builtin:mistral")
    mt = vocab.mistral
    cfg = load_config(None, ["local.enabled=true", "policy.tokenizer=builtin:mistral", "policy.chat_format=mistral",
                             f"policy.history={history}", "rollout.sample_mode=merge_prefix"])
    task = airline.tasks[TASK_ID]
    actions = task.evaluation_criteria.actions
    assert len(actions) == len(WRITTEN)
    fmt = get_chat_format("mistral")(vocab, tools=airline.tool_schemas, template_kwargs={})
    assert fmt.probe().ok
    # two calls per turn, each with its id, as mistral-common encodes the assistant message (</s> included); then the reply
    per_turn = [(actions[i:i + 2], WRITTEN[i:i + 2]) for i in range(0, len(actions), 2)]
    turns = [mt.instruct_tokenizer.encode_assistant_message(AssistantMessage(tool_calls=_mc_calls(a, ids)), False) for a, ids in per_turn]
    reply = "\n".join(task.evaluation_criteria.communicate_info or ["Done."])
    turns.append(mt.instruct_tokenizer.encode_assistant_message(AssistantMessage(content=reply), False))
    client = _Client(turns)
    env = Tau2Environment(airline, make_user(task, cfg.env.user, seed=0), cfg.env)
    settings = EpisodeSettings.from_policy(cfg.policy, max_steps=len(turns) + 2, system_prompt=airline.system_prompt, tool_names=airline.tool_names)

    res = await run_episode(EpisodeSpec(f"ids/{history}", "airline", TASK_ID, "ids", 0), env, client, fmt, settings)

    assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0, res.metadata
    # the kept conversation: each call keeps the id the model wrote, and its result carries that id
    msgs = res.messages
    calls = [c for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["id"] for c in calls] == WRITTEN
    assert [(m["tool_call_id"], m["name"]) for m in msgs if m["role"] == "tool"] == [(i, a.name) for i, a in zip(WRITTEN, actions)]
    # every prompt is mistral-common's encoding of the conversation so far, with the ids the model wrote
    tools = [Tool.from_openai(t) for t in airline.tool_schemas]
    mc = [SystemMessage(content=airline.system_prompt), UserMessage(content=msgs[1]["content"])]
    results = iter(m for m in msgs if m["role"] == "tool")
    assert len(client.inputs) == len(turns)
    for k, input_ids in enumerate(client.inputs):
        want = list(mt.encode_chat_completion(ChatCompletionRequest(messages=mc, tools=tools)).tokens)
        assert input_ids == want, f"request {k}"
        if k < len(per_turn):
            acts, ids = per_turn[k]
            mc.append(AssistantMessage(tool_calls=_mc_calls(acts, ids)))
            mc += [ToolMessage(content=next(results)["content"], tool_call_id=i) for i in ids]
    # append-only in both modes: one segment, each request extends the previous one and its answer
    traj = res.trajectory
    assert res.to_sample().segment_starts == []
    for (prev, ids), nxt in zip(zip(client.inputs, turns), client.inputs[1:]):
        assert nxt[:len(prev) + len(ids)] == prev + ids
    assert traj.tokens == client.inputs[-1] + turns[-1]
    text = vocab.decode(traj.tokens)
    assert all(text.count(f'"id": "{i}"') == 1 and text.count(f'"call_id": "{i}"') == 1 for i in WRITTEN)
