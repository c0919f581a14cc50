"""Our samples as slime's ``Sample`` (rollout.integrations.slime): field names and status names from
``slime/utils/types.py`` (THUDM/slime). slime is not installed here: the object path is tested with
a small stand-in class that has slime's field names and ``Status`` values."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from enum import Enum

import pytest

from rollout.core.config import EnvConfig, PolicyConfig
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.integrations import slime
from rollout.integrations.seed import TrainableAgent, make_env
from rollout.integrations.slime import SLIME_STATUS, fill_sample, generate, slime_sample_class, slime_status, to_slime

SLIME_STATUSES = {"pending", "completed", "truncated", "aborted", "failed"}
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 512, "stop": ["</tool_call>"]}


@dataclass
class StandInSample:
    """A few of slime's ``Sample`` fields, with its ``Status`` values (written here)."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    reward: float | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    session_id: str | None = None


async def _asolve(router_url: str, domain, task_id: str, tokenizer, **policy):
    env = make_env(domain, task_id, env_cfg=EnvConfig(domain=domain.name))
    agent = TrainableAgent(tokenizer=tokenizer, policy=PolicyConfig(**policy))
    return await agent.asolve(env, {"router_url": router_url}, dict(SAMPLING))


@pytest.mark.slow
async def test_a_real_sample_converts_to_slimes_fields_as_a_dict_and_as_an_object(retail_stack, retail, tokenizer):
    res = await _asolve(retail_stack.router_url, retail, retail.task_ids("base")[2], tokenizer)
    assert res.episode_status is EpisodeStatus.COMPLETED and res.reward == 1.0

    d = to_slime(res)
    assert d["tokens"] == res.tokens and d["response_length"] == res.response_length
    assert d["loss_mask"] == res.loss_mask and d["rollout_log_probs"] == res.rollout_log_probs
    assert len(d["loss_mask"]) == len(d["rollout_log_probs"]) == d["response_length"] < len(d["tokens"])
    assert d["reward"] == 1.0 and d["status"] == "completed" and d["remove_sample"] is False
    assert d["weight_versions"] == ["0"] * res.info["requests"]
    assert d["prompt"] == res.prompt and d["response"] == res.response and d["session_id"] == res.info["episode_id"]
    assert d["metadata"]["status"] == "completed" and d["metadata"]["task_id"] == res.info["task_id"]
    assert d["metadata"]["generation_spans"] == [list(sp) for sp in res.generation_spans]
    json.dumps(d)  # plain data

    # the same sample as our TrainingSample and as a samples.jsonl line: same training fields
    line = json.loads(json.dumps(res.to_sample().to_dict()))
    for other in (to_slime(res.to_sample()), to_slime(line)):
        assert {k: other[k] for k in other if k not in ("prompt", "response")} == {k: d[k] for k in d if k not in ("prompt", "response")}

    obj = to_slime(res, StandInSample, index=7, group_index=3)
    assert isinstance(obj, StandInSample) and obj.status is StandInSample.Status.COMPLETED
    assert (obj.tokens, obj.response_length, obj.loss_mask, obj.rollout_log_probs) == (d["tokens"], d["response_length"], d["loss_mask"], d["rollout_log_probs"])
    assert (obj.reward, obj.remove_sample, obj.index, obj.group_index) == (1.0, False, 7, 3)


async def test_a_failed_real_episode_is_failed_and_removed_from_training(retail, tokenizer):
    # the router is down: an infrastructure failure, never to be trained as reward 0
    res = await _asolve("http://127.0.0.1:9", retail, retail.task_ids("base")[0], tokenizer, max_request_retries=0, backend_outage_timeout_s=0.5)
    assert res.episode_status is EpisodeStatus.POLICY_ERROR
    d = to_slime(res)
    assert d["status"] == "failed" and d["remove_sample"] is True and d["metadata"]["status"] == "policy_error"
    assert d["response_length"] == 0 and d["loss_mask"] == [] and d["tokens"] == res.tokens and d["reward"] == 0.0
    obj = to_slime(res.to_sample(), StandInSample)
    assert obj.status is StandInSample.Status.FAILED and obj.remove_sample is True
    # what is trained follows rollout.train_statuses, not slime's status name
    assert to_slime(res, train_statuses=["completed", "policy_error"])["remove_sample"] is False


def test_every_status_maps_to_a_slime_status_and_only_policy_outcomes_are_trained():
    assert set(SLIME_STATUS) == set(EpisodeStatus) and set(SLIME_STATUS.values()) <= SLIME_STATUSES
    assert slime_status("max_steps") == "truncated" and slime_status(EpisodeStatus.TRUNCATED) == "truncated"
    assert slime_status("parse_error") == "failed" and slime_status("cancelled") == "aborted"
    with pytest.raises(ValueError):
        slime_status("pending")
    for st in EpisodeStatus:
        spec = EpisodeSpec(episode_id=f"e-{st.value}", domain="retail", task_id="0", group_id="g", sample_index=0)
        d = to_slime(InteractionResult(spec, st, 0.0, None, metadata={"error": "x"}))  # failed before its first prompt
        assert d["status"] == SLIME_STATUS[st] and d["tokens"] == [] and d["response_length"] == 0
        trained = st.value in ("completed", "max_steps", "truncated", "parse_error", "tool_timeout")
        assert d["remove_sample"] is (not trained), st
        assert StandInSample.Status(d["status"])  # a value slime's enum has


def test_malformed_samples_are_refused_and_held_back_ones_are_removed():
    good = TrainingSample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 0], rollout_log_probs=[-0.5, 0.0], reward=1.0,
                          status="completed", group_id="g", sample_index=0, weight_versions=["3"], generation_spans=[[0, 1]])
    assert to_slime(good)["weight_versions"] == ["3"] and to_slime(good)["remove_sample"] is False
    held_back = TrainingSample.from_dict({**good.to_dict(), "metadata": {"excluded_reason": "stale"}})  # a filtered.jsonl line
    assert to_slime(held_back)["remove_sample"] is True and to_slime(held_back)["status"] == "completed"
    with pytest.raises(ValueError, match="misaligned"):
        to_slime({**good.to_dict(), "loss_mask": [1]})
    with pytest.raises(ValueError, match="not a samples.jsonl record"):
        to_slime({"tokens": [1]})
    with pytest.raises(TypeError):
        to_slime([1, 2, 3])
    with pytest.raises(ValueError):
        to_slime({**good.to_dict(), "status": "done"})
    with pytest.raises(TypeError):
        to_slime(good, "Sample")


def test_slimes_own_sample_class_needs_slime():
    cls = slime_sample_class()
    if cls is None:
        with pytest.raises(ImportError, match="slime is not installed"):
            to_slime(TrainingSample([1], 0, [], [], 0.0, "completed", "g", 0), "slime")
    else:  # slime installed: its Sample is filled, status in its enum
        obj = to_slime(TrainingSample([1], 0, [], [], 0.0, "completed", "g", 0), "slime")
        assert isinstance(obj, cls) and obj.status is cls.Status.COMPLETED


def test_fill_sample_leaves_skipped_fields():
    s = StandInSample(prompt="5", index=4)
    fill_sample(s, {"prompt": "text", "index": 9, "status": "truncated", "reward": 0.5}, skip={"prompt", "index"})
    assert (s.prompt, s.index, s.status, s.reward) == ("5", 4, StandInSample.Status.TRUNCATED, 0.5)


@pytest.mark.slow
async def test_generate_is_a_drop_in_for_the_seeds_slime_generate(retail_stack, retail, monkeypatch):
    monkeypatch.delenv(slime.CONFIG_ENV, raising=False)  # our defaults: retail, scripted user
    host, port = retail_stack.router_url.rsplit(":", 1)
    args = argparse.Namespace(sglang_router_ip=host.split("://", 1)[1], sglang_router_port=int(port), hf_checkpoint="builtin:qwen3",
                              rollout_max_context_len=None, partial_rollout=False)
    task_id = retail.task_ids("base")[3]
    sample = StandInSample(prompt=task_id, index=12, group_index=1, session_id="slime-session-1")
    out = await generate(args, sample, dict(SAMPLING))
    assert out is sample and sample.status is StandInSample.Status.COMPLETED and sample.reward == 1.0
    assert (sample.prompt, sample.index, sample.group_index, sample.session_id) == (task_id, 12, 1, "slime-session-1")
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length > 0
    assert sample.remove_sample is False and sample.metadata["task_id"] == task_id
    assert sample.metadata["episode_id"] == "slime-session-1" and sample.weight_versions


@pytest.mark.slow
async def test_generate_fans_an_episode_out_into_one_slime_sample_per_turn(retail_stack, retail, monkeypatch, tmp_path):
    """rollout.sample_mode=per_turn over a re-rendered history: generate returns a list (slime's
    fan-out shape), the slime sample first, one per assistant turn, each exactly one turn's prompt
    and sampled ids with the episode's reward; the loss-masked tokens are the episode's."""
    config = tmp_path / "slime.yaml"
    config.write_text("rollout:\n  sample_mode: per_turn\npolicy:\n  history: rerender\n")
    monkeypatch.setenv(slime.CONFIG_ENV, str(config))
    host, port = retail_stack.router_url.rsplit(":", 1)
    args = argparse.Namespace(sglang_router_ip=host.split("://", 1)[1], sglang_router_port=int(port), hf_checkpoint="builtin:qwen3",
                              rollout_max_context_len=None, partial_rollout=False)
    task_id = retail.task_ids("base")[3]
    sample = StandInSample(prompt=task_id, index=12, group_index=1, session_id="slime-session-2")
    out = await generate(args, sample, dict(SAMPLING))
    assert isinstance(out, list) and out[0] is sample and len(out) == sample.metadata["turns"] > 1
    assert [x.metadata["turn_indices"] for x in out] == [[i] for i in range(len(out))]
    for x in out:
        assert x.status is StandInSample.Status.COMPLETED and x.reward == 1.0 and not x.remove_sample
        assert (x.prompt, x.index, x.group_index, x.session_id) == (task_id, 12, 1, "slime-session-2")
        assert x.loss_mask == [1] * x.response_length and len(x.rollout_log_probs) == x.response_length > 0
    assert len({id(x.metadata) for x in out}) == len(out)  # copies, not one object filled again


def test_an_episode_of_several_segments_is_refused_whole(tmp_path):
    segmented = TrainingSample(tokens=[1, 2, 3, 4, 5, 6], response_length=5, loss_mask=[1, 0, 0, 1, 0], rollout_log_probs=[-0.1, 0, 0, -0.2, 0],
                               reward=1.0, status="completed", weight_versions=["0", "0"], generation_spans=[[0, 1], [3, 4]],
                               segment_starts=[1], metadata={"episode_id": "e"}, group_id="g", sample_index=0)
    with pytest.raises(ValueError, match="2 segments"):
        to_slime(segmented)
