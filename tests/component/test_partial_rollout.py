"""What a turn interrupted by a weight update becomes (``rollout.partial_rollout``), token by token.

An in-process SGLang-protocol server answers from a script. For an ``interrupt`` entry it does
what the pool and a paused server do together: it closes the worker's generation gate, answers
``finish_reason.type == "abort"`` with the tokens sampled so far, and opens the gate again a
moment later (the update is over). No Ray; the real tokenizer, tau2 retail task 0 and the
scripted user.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import load_config
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker


class InterruptingServer(ScriptedPolicyServer):
    """The scripted server's loopback app with another ``/generate``: it answers ``script[n]``
    for the episode's n-th request: ``(text, finish, version)`` with finish ``eos`` (text + EOS id), ``stop`` (no EOS), ``abort`` (an abort the
    pool did not cause) or ``interrupt`` (see the module docstring). Log-probs are distinct per
    request and position. Every request body is kept in ``requests``."""

    def __init__(self, tokenizer, script):
        super().__init__(tokenizer, script)
        self.requests: list[dict] = []
        self.gate = None  # the worker's GenerationGate, set by the test

    def ids(self, n: int) -> list[int]:
        text, finish, _ = self.script[n]
        return self.tokenizer.encode(text, add_special_tokens=False) + ([self.eos_id] if finish == "eos" else [])

    @staticmethod
    def log_probs(n: int, count: int) -> list[float]:
        return [-(n + 1) - 0.001 * k for k in range(count)]

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        n = len(self.requests)
        self.requests.append(body)
        _, finish, version = self.script[n]
        ids = self.ids(n)
        if finish == "interrupt":
            self.gate.close()
            asyncio.get_running_loop().call_later(0.05, self.gate.open)
        fr = {"type": "abort", "message": "paused"} if finish in ("abort", "interrupt") else {"type": "stop", "matched": self.eos_id if finish == "eos" else None}
        return web.json_response({"text": "", "output_ids": ids, "meta_info": {
            "id": body["rid"], "finish_reason": fr, "weight_version": version,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(self.log_probs(n, len(ids)), ids)]}})


async def _episode(tokenizer, script, mode: str, *overrides: str):
    async with InterruptingServer(tokenizer, script) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", "policy.sampling.max_new_tokens=64", *overrides])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, partial_rollout=mode)
        server.gate = worker.gate
        try:
            res = await worker.run(EpisodeSpec("ep", "retail", "0", "g", 0))
        finally:
            await worker.close()
    return res, server


PARTIAL = ("Thanks for reaching out, I can", "interrupt", "0")
REST = (" help you with that today.", "eos", "1")


async def test_continue_keeps_the_old_tokens_and_generates_the_rest(tokenizer):
    res, server = await _episode(tokenizer, [PARTIAL, REST], "continue")
    assert res.status is EpisodeStatus.COMPLETED, res.metadata
    traj = res.trajectory
    a, b = server.ids(0), server.ids(1)
    first, second = server.requests
    assert second["input_ids"] == first["input_ids"] + a  # the rest of the turn, from the partial tokens
    assert second["sampling_params"]["max_new_tokens"] == 64 - len(a)  # one turn's budget in all
    assert second["rid"] != first["rid"] and second["sampling_params"]["sampling_seed"] != first["sampling_params"]["sampling_seed"]
    assert traj.response_ids[: len(a) + len(b)] == a + b
    assert traj.loss_mask[: len(a) + len(b)] == [1] * (len(a) + len(b))
    assert traj.rollout_log_probs[: len(a) + len(b)] == server.log_probs(0, len(a)) + server.log_probs(1, len(b))
    assert traj.weight_versions == ["0", "1"]
    assert traj.generation_spans == [(0, len(a)), (len(a), len(a) + len(b))]
    s = res.to_sample()
    assert s.token_weight_versions()[: len(a) + len(b)] == ["0"] * len(a) + ["1"] * len(b)
    m = res.metadata
    assert (m["interruptions"], m["interrupted_turns"], m["continued_turns"], m["turns"], m["requests"]) == (1, 1, 1, 1, 2)
    assert res.messages[2] == {"role": "assistant", "content": "Thanks for reaching out, I can help you with that today."}


async def test_restart_turn_discards_the_partial_turn(tokenizer):
    res, server = await _episode(tokenizer, [PARTIAL, REST], "restart_turn")
    assert res.status is EpisodeStatus.COMPLETED, res.metadata
    first, second = server.requests
    assert second["input_ids"] == first["input_ids"]  # the turn again, from its start
    assert second["sampling_params"]["max_new_tokens"] == 64
    b = server.ids(1)
    traj = res.trajectory
    assert traj.response_ids == b and traj.loss_mask == [1] * len(b)
    assert traj.rollout_log_probs == server.log_probs(1, len(b))
    assert traj.weight_versions == ["0", "1"] and traj.generation_spans == [(0, 0), (0, len(b))]
    assert res.metadata["restarted_turns"] == 1 and res.metadata["discarded_tokens"] == len(server.ids(0))


async def test_drop_ends_the_episode_aborted(tokenizer):
    res, server = await _episode(tokenizer, [PARTIAL, REST], "drop")
    assert res.status is EpisodeStatus.ABORTED and res.status.is_infrastructure_failure
    assert res.metadata["termination_reason"] == "weight_update" and len(server.requests) == 1
    assert res.trajectory.weight_versions == ["0"]


@pytest.mark.parametrize("mode", ["continue", "restart_turn"])
async def test_an_abort_the_pool_did_not_cause_ends_the_episode(tokenizer, mode):
    res, server = await _episode(tokenizer, [("Partial", "abort", "0"), REST], mode)
    assert res.status is EpisodeStatus.ABORTED and res.metadata["termination_reason"] == "abort"
    assert len(server.requests) == 1 and res.metadata["interruptions"] == 0


async def test_a_stop_string_split_by_the_interruption_ends_the_turn(tokenizer):
    # The first call sampled "... ST", the second "OP! and more": neither server saw "STOP!",
    # so the client ends the turn where one call would have stopped.
    script = [("I will close the ticket now. ST", "interrupt", "0"), ("OP! and then some more words", "eos", "1")]
    res, server = await _episode(tokenizer, script, "continue", 'policy.sampling.stop=["STOP!"]')
    assert res.status is EpisodeStatus.COMPLETED, res.metadata
    a, b = server.ids(0), server.ids(1)
    kept = len(tokenizer.encode("OP!", add_special_tokens=False))
    assert b[:kept] == tokenizer.encode("OP!", add_special_tokens=False)
    traj = res.trajectory
    assert traj.response_ids[: len(a) + kept] == a + b[:kept]
    assert traj.response_ids[len(a) + kept] == tokenizer.eos_token_id and traj.loss_mask[len(a) + kept] == 0  # turn closed by the client
    assert traj.generation_spans == [(0, len(a)), (len(a), len(a) + kept)]
    assert res.metadata["discarded_tokens"] == len(b) - kept
    assert res.messages[2]["content"] == "I will close the ticket now. STOP!"


async def test_per_turn_samples_of_a_real_episode_with_a_continued_turn(tokenizer):
    """per_turn on a real episode (tau2 retail, the scripted user): the continued turn is one
    sample whose prompt is its first request's input_ids and whose response is both calls'
    tokens, with each call's log-probs and weight version; merge_prefix equals the trajectory."""
    from rollout.core.export import get_exporter

    res, server = await _episode(tokenizer, [PARTIAL, REST], "continue")
    assert res.status is EpisodeStatus.COMPLETED
    (turn,) = get_exporter("per_turn").export(res)
    first, second = server.requests
    a, b = server.ids(0), server.ids(1)
    assert turn.tokens[: turn.prompt_length] == first["input_ids"] and second["input_ids"] == first["input_ids"] + a
    assert turn.tokens[turn.prompt_length:] == a + b and turn.loss_mask == [1] * len(a + b)
    assert turn.rollout_log_probs == server.log_probs(0, len(a)) + server.log_probs(1, len(b))
    assert turn.weight_versions == ["0", "1"] and turn.generation_spans == [[0, len(a)], [len(a), len(a) + len(b)]]
    assert turn.turn_indices == [0] and turn.episode_id == "ep"
    (merged,) = get_exporter("merge_prefix").export(res)
    assert merged.tokens == res.to_sample().tokens and merged.loss_mask == res.to_sample().loss_mask
