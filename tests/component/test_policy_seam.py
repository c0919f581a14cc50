"""The policy-client seam: ``run_episode`` driven by a client written here, as a trainer would write
one over its own engine (no HTTP, no server), on a real tau2 retail task with the registered
``hermes`` chat format. The trajectory must be exact: the prompt, then each call's ids as the
client returned them (mask 1, its log-probs), the end-of-turn repair where a turn stopped on
``</tool_call>``, and the format's delta of each tool result (mask 0), and nothing else."""

from __future__ import annotations

import json

from rollout.benchmarks.tau2.environment import Tau2Environment
from rollout.benchmarks.tau2.user import make_user
from rollout.core.config import load_config
from rollout.core.episode import run_episode
from rollout.core.formats import DEFAULT_CHAT_FORMAT, ChatFormat, get_chat_format
from rollout.core.policy import Generation, PolicyClient
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.settings import EpisodeSettings

TASK_ID = "16"  # a retail task whose gold actions and communicate_info earn reward 1.0
INTERRUPTED_TURN = 1  # this turn's first call is cut by a weight update (finish "abort", interrupted)


class ScriptedClient:
    """A :class:`PolicyClient` over a tokenizer: call ``k`` answers the ``k``-th scripted
    :class:`Generation` (ids from the tokenizer, log-probs distinct per token), and records every
    call's ``input_ids`` and arguments. Weight version ``"1"``, then ``"2"`` from the call after
    the interruption on."""

    def __init__(self, answers: list[Generation]):
        self.answers = answers
        self.calls: list[tuple[list[int], Generation]] = []
        self.args: list[tuple[int, str, str, int | None]] = []

    async def generate(self, input_ids, max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        gen = self.answers[len(self.calls)]
        assert len(gen.ids) <= max_new_tokens
        self.calls.append(([int(t) for t in input_ids], gen))
        self.args.append((max_new_tokens, rid, routing_key, seed))
        return gen


def _gold_turns(tokenizer, task) -> list[tuple[list[int], str]]:
    """The task's gold tool calls (each stops on ``</tool_call>``: no end-of-turn id), then the
    closing reply (ends with the EOS id, as a model ending its turn): ``[(ids, finish_type)]``."""
    turns = []
    for a in task.evaluation_criteria.actions:
        text = f'<tool_call>\n{{"name": "{a.name}", "arguments": {json.dumps(a.arguments, ensure_ascii=False)}}}\n</tool_call>'
        turns.append((tokenizer.encode(text, add_special_tokens=False), "stop"))
    reply = "\n".join(task.evaluation_criteria.communicate_info or ["Done."])
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    turns.append((tokenizer.encode(reply, add_special_tokens=False) + [eos], "stop"))
    return turns


def _answers(turns: list[tuple[list[int], str]]) -> tuple[list[Generation], list[list[int]]]:
    """One :class:`Generation` per call (two for :data:`INTERRUPTED_TURN`), and each turn's ids."""
    answers, n = [], 0
    version = "1"

    def gen(ids: list[int], finish: str, interrupted: bool = False) -> Generation:
        nonlocal n
        lps = [-0.001 * (n + k + 1) for k in range(len(ids))]
        n += len(ids)
        return Generation(ids=list(ids), log_probs=lps, finish_type=finish, weight_version=version, interrupted=interrupted)

    for i, (ids, finish) in enumerate(turns):
        if i == INTERRUPTED_TURN:
            cut = len(ids) // 2
            answers.append(gen(ids[:cut], "abort", interrupted=True))
            version = "2"  # the update happened: the rest of the turn comes from the new weights
            answers.append(gen(ids[cut:], finish))
        else:
            answers.append(gen(ids, finish))
    return answers, [ids for ids, _ in turns]


async def test_a_trainers_own_client_drives_the_episode_loop_exactly(tokenizer, retail):
    cfg = load_config(None, ["local.enabled=true"])
    task = retail.tasks[TASK_ID]
    fmt = get_chat_format(DEFAULT_CHAT_FORMAT)(tokenizer, tools=retail.tool_schemas, template_kwargs={})
    assert isinstance(fmt, ChatFormat) and fmt.probe().ok
    answers, turn_ids = _answers(_gold_turns(tokenizer, task))
    client = ScriptedClient(answers)
    assert isinstance(client, PolicyClient)
    env = Tau2Environment(retail, make_user(task, cfg.env.user, seed=0), cfg.env)
    settings = EpisodeSettings.from_policy(cfg.policy, max_steps=len(turn_ids) + 2, system_prompt=retail.system_prompt,
                                           tool_names=retail.tool_names, partial_rollout="continue")
    spec = EpisodeSpec("seam/0", "retail", TASK_ID, "seam", 0)

    res = await run_episode(spec, env, client, fmt, settings)

    assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0, res.metadata
    traj = res.trajectory
    assert len(client.calls) == len(answers) == res.metadata["requests"]
    assert res.metadata["turns"] == len(turn_ids) and res.metadata["interruptions"] == 1
    assert res.metadata["continued_turns"] == 1 and res.metadata["discarded_tokens"] == 0
    assert res.metadata["turn_boundary_repairs"] == len(turn_ids) - 1  # every tool call stopped on </tool_call>

    # The whole token sequence, rebuilt from the format alone: prompt, then per turn its ids as
    # the client returned them (mask 1), the end-of-turn repair and the tool result's delta (mask 0).
    expected = list(fmt.prompt_ids(res.messages[:2]))
    mask: list[int] = []
    lps: list[float] = []
    call = 0
    answers_to = [m for m in res.messages[2:] if m["role"] != "assistant"]
    for t, ids in enumerate(turn_ids):
        n_calls = 2 if t == INTERRUPTED_TURN else 1
        sampled = [tok for _, g in client.calls[call:call + n_calls] for tok in g.ids]
        sampled_lps = [lp for _, g in client.calls[call:call + n_calls] for lp in g.log_probs]
        call += n_calls
        assert sampled == ids
        context = ([] if fmt.ends_turn(ids) else list(fmt.eot_ids))
        if t < len(turn_ids) - 1:  # the last turn's answer ends the episode: no delta
            answer = answers_to[t]
            context += fmt.delta_ids([{"role": answer["role"], "content": answer["content"]}])
        expected += ids + context
        mask += [1] * len(ids) + [0] * len(context)
        lps += sampled_lps + [0.0] * len(context)
    assert traj.tokens == expected
    assert traj.loss_mask == mask and traj.rollout_log_probs == lps
    assert sum(traj.loss_mask) == sum(len(g.ids) for g in answers)

    # Each call's input is the trajectory so far: the previous call's input + output, then context.
    prev: list[int] | None = None
    for inp, gen in client.calls:
        if prev is not None:
            assert inp[: len(prev)] == prev
        prev = inp + gen.ids
        assert traj.tokens[: len(prev)] == prev
    assert client.calls[0][0] == traj.prompt_ids
    # the continued call comes right after the interrupted one: no token in between
    k = INTERRUPTED_TURN
    assert client.calls[k + 1][0] == client.calls[k][0] + client.calls[k][1].ids

    # One weight version and one span per call; the spans cover exactly the sampled tokens.
    assert traj.weight_versions == [g.weight_version for g in answers]
    assert [b - a for a, b in traj.generation_spans] == [len(g.ids) for g in answers]
    per_token = res.to_sample().token_weight_versions()
    assert [v for v, m in zip(per_token, mask) if m] == [g.weight_version for g in answers for _ in g.ids]
    assert all(v is None for v, m in zip(per_token, mask) if not m)

    # The loop's arguments: fresh rid per call, the episode id as routing key, the turn's budget
    # shrunk by what the interrupted call sampled.
    assert len({rid for _, rid, _, _ in client.args}) == len(client.args)
    assert {key for _, _, key, _ in client.args} == {spec.episode_id}
    budget = cfg.policy.sampling.max_new_tokens
    assert client.args[k][0] == budget and client.args[k + 1][0] == budget - len(client.calls[k][1].ids)


async def test_the_loop_reads_each_turn_through_the_formats_parser(tokenizer, retail):
    """``run_episode`` parses a turn with the chat format's ``parse_turn`` (no parser of its own):
    a format whose parser reads every turn as a plain reply ends the episode at the first one."""
    from rollout.core.formats import ChatTemplate, ParsedTurn

    seen: list[str] = []

    def as_reply(text, tool_names=None):
        seen.append(text)
        return ParsedTurn(content="Your request has been completed.")

    cfg = load_config(None, ["local.enabled=true"])
    task = retail.tasks[TASK_ID]
    fmt = ChatTemplate(tokenizer, tools=retail.tool_schemas, parser=as_reply)
    answers, _ = _answers(_gold_turns(tokenizer, task)[:1])
    env = Tau2Environment(retail, make_user(task, cfg.env.user, seed=0), cfg.env)
    settings = EpisodeSettings.from_policy(cfg.policy, max_steps=3, system_prompt=retail.system_prompt, tool_names=retail.tool_names)
    res = await run_episode(EpisodeSpec("seam/1", "retail", TASK_ID, "seam", 1), env, ScriptedClient(answers), fmt, settings)
    assert seen == [tokenizer.decode(answers[0].ids)]  # the tool call's text, read as a reply
    assert res.status is EpisodeStatus.COMPLETED and res.metadata["turns"] == 1
    assert res.messages[2] == {"role": "assistant", "content": "Your request has been completed."}


def _parse_several_calls(text, tool_names=None):
    """A Hermes parser that reads every ``<tool_call>`` block of a turn (the built-in one accepts
    one per turn, as the agent's instruction asks): the loop's handling of a multi-call format."""
    from rollout.core.formats import ParsedTurn, ParseError, ToolCall

    blocks = text.split("<tool_call>")[1:]
    if not blocks:
        return ParsedTurn(content=text.strip())
    calls = []
    for block in blocks:
        body = block.split("</tool_call>")[0]
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            raise ParseError("bad call") from None
        calls.append(ToolCall(obj["name"], obj["arguments"]))
    return ParsedTurn(content="", tool_calls=tuple(calls))


async def test_several_tool_calls_in_one_turn_are_executed_in_order_and_answered_by_one_delta(tokenizer, retail):
    """A format that emits several calls per turn: each call is one environment step, in the order
    written (as tau2's orchestrator runs them); the conversation records one assistant message with
    every call and one tool message per call (ids ``call_<turn>``, ``call_<turn>-1``, ...); the
    trajectory appends the format's delta of all the results at once (mask 0); the gold actions
    two per turn still earn reward 1.0."""
    from rollout.core.formats import ChatTemplate

    cfg = load_config(None, ["local.enabled=true"])
    task = retail.tasks[TASK_ID]
    actions = task.evaluation_criteria.actions
    assert len(actions) >= 3
    fmt = ChatTemplate(tokenizer, tools=retail.tool_schemas, parser=_parse_several_calls)
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    turns, n = [], 0
    for i in range(0, len(actions), 2):  # two calls per turn (the last may have one)
        text = "\n".join(f'<tool_call>\n{json.dumps({"name": a.name, "arguments": a.arguments}, ensure_ascii=False)}\n</tool_call>'
                         for a in actions[i:i + 2])
        turns.append(tokenizer.encode(text, add_special_tokens=False) + [eos])
    turns.append(tokenizer.encode("\n".join(task.evaluation_criteria.communicate_info or ["Done."]), add_special_tokens=False) + [eos])
    answers = []
    for ids in turns:
        answers.append(Generation(ids=ids, log_probs=[-0.01 * (n + k + 1) for k in range(len(ids))], finish_type="stop", weight_version="1"))
        n += len(ids)
    env = Tau2Environment(retail, make_user(task, cfg.env.user, seed=0), cfg.env)
    settings = EpisodeSettings.from_policy(cfg.policy, max_steps=len(turns) + 2, system_prompt=retail.system_prompt, tool_names=retail.tool_names)

    res = await run_episode(EpisodeSpec("seam/2", "retail", TASK_ID, "seam", 2), env, ScriptedClient(answers), fmt, settings)

    assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0, res.metadata
    assert res.metadata["turns"] == len(turns)
    first = res.messages[2]
    assert [c["function"]["name"] for c in first["tool_calls"]] == [a.name for a in actions[:2]]
    assert [c["id"] for c in first["tool_calls"]] == ["call_1", "call_1-1"]
    results = res.messages[3:5]
    assert [(m["role"], m["tool_call_id"], m["name"]) for m in results] == [("tool", "call_1", actions[0].name), ("tool", "call_1-1", actions[1].name)]
    # the trajectory: prompt, then per turn its ids (mask 1) and the delta of all its results (mask 0)
    expected, mask = list(fmt.prompt_ids(res.messages[:2])), []
    at = 2
    for t, ids in enumerate(turns):
        at += 1  # the assistant message
        context: list[int] = []
        if t < len(turns) - 1:
            k = len(res.messages[at - 1]["tool_calls"])
            context = fmt.delta_ids([{"role": m["role"], "content": m["content"]} for m in res.messages[at:at + k]])
            at += k
        expected += ids + context
        mask += [1] * len(ids) + [0] * len(context)
    assert res.trajectory.tokens == expected and res.trajectory.loss_mask == mask
