"""vLLM's wire protocol (rollout.core.policy.vllm) against answers recorded from a real vLLM 0.32.0
server (tests/support/data/vllm/, how each was made is written there): the request body, the
answer read into a Generation for every finish (length, a stop string, a stop id, EOS, an abort by
id, an abort by a pause) and a call that spans two weight versions, malformed answers as typed
errors, the metrics the KV gate reads, the preflight's log-probs rule; the episode loop's
end-of-turn repair and per-version spans on those answers; and the ``policy.engine`` seam."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from rollout.core import fastjson
from rollout.core.config import ConfigError, SamplingConfig, load_config
from rollout.core.environment import RESPOND, StepResult
from rollout.core.episode import run_episode
from rollout.core.formats import ChatTemplate
from rollout.core.policy import (
    SGLANG_WIRE,
    VLLM_WIRE,
    HTTPPolicyClient,
    PolicyServerError,
    RetryableAnswer,
    SGLangClient,
    VLLMAdmin,
    VLLMClient,
    WeightSyncError,
    WireProtocol,
    parse_vllm_response,
)
from rollout.core.policy.kvreadings import SGLANG_KV_METRICS
from rollout.core.policy.vllm import PAUSE_QUERIES, check_weights_folder, raw_log_probs_exact
from rollout.core.policy_engines import POLICY_ENGINES, get_policy_engine, register_policy_engine, unregister_policy_engine
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.settings import EpisodeSettings
from rollout.core.telemetry import promtext

DATA = Path(__file__).resolve().parents[1] / "support" / "data" / "vllm"
RECORDED = json.loads((DATA / "generate_answers.json").read_text())
CASES = RECORDED["cases"]
EOS, TOOL_CALL_END = 151645, 151658  # Qwen3's <|im_end|> and </tool_call>
RIDS = {"length": "rec-length", "stop_string": "rec-stopstr", "stop_id": "rec-stopid", "eos": "rec-eos", "stop_tool_call": "rec-toolcall",
        "abort": "rec-abort", "pause_abort": "rec-pause-abort"}  # the request_id each recorded call sent


def _body(case: str) -> dict:
    return copy.deepcopy(CASES[case]["body"])


def _choice(case: str) -> dict:
    return CASES[case]["body"]["choices"][0]


# -- the request ----------------------------------------------------------------------------------
def test_the_request_body_uses_vllm_s_names_only():
    s = SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=4096, stop=["</tool_call>"])
    body = VLLM_WIRE.generate_body([1, 2, 3], 17, "e@0#2", 5, s)
    assert body == {"request_id": "e@0#2", "token_ids": [1, 2, 3],
                    "sampling_params": {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 17, "stop": ["</tool_call>"],
                                        "logprobs": 0, "skip_special_tokens": False, "seed": 5}}
    # what the recorded calls sent is the same shape (the keys vLLM honours; an unknown one it ignores silently)
    assert set(body["sampling_params"]) - {"seed"} <= set(CASES["length"]["sampling_params"]) | {"max_tokens"}
    assert "seed" not in VLLM_WIRE.generate_body([1], 4, "r", None, s)["sampling_params"]
    VLLM_WIRE.set_request_id(body, "e@0#2.r1")
    assert body["request_id"] == "e@0#2.r1" and VLLM_WIRE.read_request(body) == ("e@0#2.r1", [1, 2, 3])
    sg = SGLANG_WIRE.generate_body([1, 2, 3], 17, "e@0#2", 5, s)
    assert sg["sampling_params"]["max_new_tokens"] == 17 and sg["sampling_params"]["no_stop_trim"] is True
    assert SGLANG_WIRE.read_request(sg) == ("e@0#2", [1, 2, 3])


def test_the_client_builds_the_body_from_policy_sampling_and_sends_numpy_ids_as_a_list():
    async def main():
        cfg = load_config(None, ["local.enabled=true", "local.backend=vllm", "policy.router_url=http://127.0.0.1:9", "policy.engine=vllm",
                                 "policy.sampling.temperature=0.6"]).policy
        async with aiohttp.ClientSession() as s:
            client = HTTPPolicyClient(cfg, s)
            return client, client.payload(np.array([5, 6, 7], dtype=np.int64), 9, "x@0#0", None)

    client, body = asyncio.run(main())
    assert client.wire is VLLM_WIRE and client.url == "http://127.0.0.1:9/inference/v1/generate"
    assert body["sampling_params"]["temperature"] == 0.6 and body["sampling_params"]["max_tokens"] == 9
    assert fastjson.loads(fastjson.dumps(body))["token_ids"] == [5, 6, 7]


# -- the answers, read ----------------------------------------------------------------------------
@pytest.mark.parametrize("case, finish, matched, last_id", [
    ("length", "length", None, None),
    ("stop_string", "stop", "shops", 26770),  # the stop string's token stays in (SGLang's no_stop_trim)
    ("stop_id", "stop", 26770, 26770),  # the stop id stays in; stop_reason is an int
    ("eos", "stop", None, EOS),  # EOS stays in; stop_reason null
    ("stop_tool_call", "stop", "</tool_call>", TOOL_CALL_END),
    ("abort", "abort", None, None),  # aborted by id: the partial ids, each with its log-prob
    ("pause_abort", "abort", None, None),  # aborted by /pause?mode=abort
])
def test_each_recorded_finish_reads_into_a_generation(case, finish, matched, last_id):
    c = _choice(case)
    gen = parse_vllm_response(_body(case))
    assert gen.ids == c["token_ids"] and len(gen.ids) > 0
    assert gen.log_probs == [e["logprob"] for e in c["logprobs"]["content"]]
    assert all(lp <= 0.0 for lp in gen.log_probs)
    assert (gen.finish_type, gen.matched) == (finish, matched)
    if last_id is not None:
        assert gen.ids[-1] == last_id
    assert gen.weight_version == "default" and gen.weight_spans is None and gen.interrupted is False
    assert gen.meta["request_id"] == "generate-tokens-" + RIDS[case]  # vLLM's name of the body's request_id
    assert gen.pieces() == [(gen.ids, gen.log_probs, "default")]


def test_the_stop_string_answer_equals_the_greedy_run_cut_after_the_token_holding_it():
    # greedy, so both ran the same tokens: the stop string's and the stop id's calls end at the same 4th id
    assert _choice("stop_string")["token_ids"] == _choice("stop_id")["token_ids"]
    assert parse_vllm_response(_body("eos")).log_probs == [0.0]  # a logit_bias of +100 makes EOS certain


def test_a_call_across_a_weight_update_keeps_each_span_s_version():
    gen = parse_vllm_response(_body("spans"))
    assert _choice("spans")["weight_versions"] == [{"version": "default", "start": 0, "end": 7}, {"version": "1", "start": 7, "end": 60}]
    assert gen.weight_spans == [(0, 7, "default"), (7, 60, "1")] and gen.weight_version == "1"
    pieces = gen.pieces()
    assert [(len(i), v) for i, _, v in pieces] == [(7, "default"), (53, "1")]
    assert sum((i for i, _, _ in pieces), []) == gen.ids and sum((lp for _, lp, _ in pieces), []) == gen.log_probs
    assert CASES["spans"]["version_answer"] == [200, {"success": True, "new_version": "1"}]


def _mutate(case: str, fn) -> dict:
    body = _body(case)
    fn(body["choices"][0])
    return body


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c["logprobs"]["content"][2].update(logprob=None), "log-prob None for generated token 2"),
    (lambda c: c["logprobs"]["content"][0].update(logprob=float("nan")), "log-prob nan for generated token 0"),
    (lambda c: c.update(logprobs=None), "need choices\\[0\\].token_ids and choices\\[0\\].logprobs.content"),  # logprobs not asked
    (lambda c: c["logprobs"]["content"].pop(), "6 token_ids but 5 log-prob entries"),
    (lambda c: c["logprobs"]["content"][1].update(token_id=1), "log-prob entry 1 is for id 1"),
    (lambda c: c.update(finish_reason="repetition"), "finish_reason 'repetition' is none of"),
    (lambda c: c.update(weight_versions=[{"version": "0", "start": 0, "end": 4}]), "end at 4, not at the 6 ids"),
    (lambda c: c.update(weight_versions=[{"version": "0", "start": 1, "end": 6}]), "do not cover the 6 ids in order"),
    (lambda c: c.update(weight_versions=[{"version": "0"}]), "lacks start, end or version"),
])
def test_a_malformed_answer_is_a_policy_server_error_naming_what_is_wrong(mutate, match):
    with pytest.raises(PolicyServerError, match=match) as e:
        parse_vllm_response(_mutate("length", mutate))
    assert not isinstance(e.value, RetryableAnswer)
    with pytest.raises(PolicyServerError, match="need choices"):
        parse_vllm_response(CASES["error_prompt_too_long"]["body"])  # a 400's body is not an answer


def test_an_engine_error_finish_is_retried_and_unreported_versions_are_none():
    with pytest.raises(RetryableAnswer, match="finish_reason error"):
        parse_vllm_response(_mutate("length", lambda c: c.update(finish_reason="error")))
    gen = parse_vllm_response(_mutate("length", lambda c: c.update(weight_versions=None)))  # vLLM: "no label was reported"
    assert gen.weight_version is None and gen.weight_spans is None
    empty = parse_vllm_response(_mutate("pause_abort", lambda c: c.update(token_ids=[], logprobs={"content": []}, weight_versions=[])))
    assert (empty.ids, empty.finish_type, empty.weight_version) == ([], "abort", None)  # a call aborted while queued


# -- KV metrics, control mapping, preflight rule ----------------------------------------------------
def test_the_kv_gate_reads_vllm_s_own_metrics():
    text = (DATA / "metrics.txt").read_text()
    reading = VLLM_WIRE.kv_metrics.reading(promtext.parse(text, VLLM_WIRE.kv_metrics.prefix, strict=False))
    assert reading is not None
    assert reading.usage == pytest.approx(6 / 23)  # 6 of the 24 blocks less one: vLLM's kv_cache_usage_perc
    assert reading.retractions == 1.0  # vllm:num_preemptions_total (the pause(keep) of the spans case preempted one)
    assert reading.kv_tokens == 3072.0  # the label kv_cache_size_tokens of vllm:cache_config_info
    assert SGLANG_KV_METRICS.reading(promtext.parse(text, "sglang:", strict=False)) is None  # not SGLang's names


def test_pause_modes_map_to_vllm_s_queries_and_the_abort_names_vllm_s_request_id():
    assert PAUSE_QUERIES == {"abort": "mode=abort", "retract": "mode=keep&clear_cache=true", "in_place": "mode=keep&clear_cache=false"}
    assert CASES["abort"]["abort_answer"] == [200, {"status": "aborted", "aborted": 1}]
    assert CASES["abort"]["body"]["request_id"] == "generate-tokens-rec-abort"  # what /abort_requests must name

    async def main():
        async with aiohttp.ClientSession() as s:
            with pytest.raises(ValueError, match="pause mode must be one of"):
                await VLLMAdmin("http://127.0.0.1:9", s).pause("wait")

    asyncio.run(main())


def test_raw_log_probs_are_accepted_only_where_they_equal_the_sampled_distribution_s():
    assert raw_log_probs_exact(SamplingConfig(temperature=1.0)) and raw_log_probs_exact(SamplingConfig(temperature=0.0))
    assert not raw_log_probs_exact(SamplingConfig(temperature=0.7))
    assert not raw_log_probs_exact(SamplingConfig(temperature=1.0, top_p=0.9))
    assert not raw_log_probs_exact(SamplingConfig(temperature=1.0, top_k=20))
    info = json.loads((DATA / "server_info.json").read_text())["body"]
    assert info["vllm_config"]["model_config"]["logprobs_mode"] == "processed_logprobs"  # where check_servers reads it


def test_a_weights_folder_vllm_cannot_load_is_refused_before_any_worker_is_asked(tmp_path):
    with pytest.raises(WeightSyncError, match="is not a folder here"):
        check_weights_folder(str(tmp_path / "missing"))
    with pytest.raises(WeightSyncError, match="holds no config.json"):
        check_weights_folder(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(WeightSyncError, match=r"holds no \*.safetensors"):
        check_weights_folder(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    check_weights_folder(str(tmp_path))


# -- through the episode loop ---------------------------------------------------------------------
class _Recorded:
    """A policy answering each call with the next recorded vLLM answer, read by the wire."""

    def __init__(self, cases: list[str]):
        self.cases, self.calls = list(cases), 0

    async def generate(self, input_ids, max_new_tokens: int, rid: str, routing_key: str | None = None, seed: int | None = None):
        case = self.cases[min(self.calls, len(self.cases) - 1)]
        self.calls += 1
        return parse_vllm_response(_body(case))


class _Env:
    timings: dict[str, float] = {}

    async def reset(self, task_id: str):
        return "Where is my order?", {}

    async def step(self, action):
        if action.name == RESPOND:
            return StepResult("Anything else?", role="user")
        return StepResult('{"status": "shipped"}', role="tool")


def _episode(tokenizer, cases: list[str]):
    chat = ChatTemplate(tokenizer, None)
    settings = EpisodeSettings(max_steps=len(cases), max_new_tokens=64, max_context_tokens=8192, on_parse_error="feedback",
                               system_prompt="You are an agent.", tool_names=("lookup",), stop=("</tool_call>",))
    res = asyncio.run(run_episode(EpisodeSpec("e1", "toy", "0", "g", 0), _Env(), _Recorded(cases), chat, settings))
    return res, chat


def test_the_end_of_turn_repair_holds_on_vllm_s_untrimmed_ids(tokenizer):
    res, chat = _episode(tokenizer, ["stop_tool_call", "eos", "stop_string"])
    traj = res.trajectory
    assert chat.eot_ids == [EOS]
    (a0, b0), (a1, b1), (a2, b2) = traj.generation_spans
    r = traj.response_ids
    # the stop string's token is the last sampled id; the loop closes the turn with <|im_end|>, mask 0
    assert r[a0:b0] == [TOOL_CALL_END] and r[b0] == EOS and traj.loss_mask[b0] == 0
    # EOS sampled: the turn is closed by the model, nothing added (the next id is the delta's, not another EOS)
    assert r[a1:b1] == [EOS] and traj.loss_mask[b1 - 1] == 1 and r[b1] != EOS
    assert r[b2 - 1] == 26770 and r[b2] == EOS and traj.loss_mask[b2] == 0
    assert res.metadata["turn_boundary_repairs"] == 2 and res.metadata["requests"] == 3


def test_a_call_spanning_two_versions_is_recorded_as_two_spans_with_their_versions(tokenizer):
    res, _ = _episode(tokenizer, ["spans"])
    traj = res.trajectory
    assert res.status is EpisodeStatus.TRUNCATED and res.metadata["requests"] == 1  # a length finish (policy.on_length=truncate)
    (a, b), (c, d) = traj.generation_spans
    assert (b - a, d - c, b == c) == (7, 53, True) and traj.weight_versions == ["default", "1"]
    sample = res.to_sample()
    versions = sample.token_weight_versions()
    assert versions[a:b] == ["default"] * 7 and versions[c:d] == ["1"] * 53
    assert traj.rollout_log_probs[a:d] == parse_vllm_response(_body("spans")).log_probs


# -- the seam -------------------------------------------------------------------------------------
def test_policy_engine_selects_the_wire_and_an_unknown_name_is_one_line():
    assert POLICY_ENGINES.names()[:2] == ["sglang", "vllm"]
    assert get_policy_engine("vllm") is VLLM_WIRE and get_policy_engine("sglang") is SGLANG_WIRE
    assert isinstance(VLLM_WIRE, WireProtocol) and isinstance(SGLANG_WIRE, WireProtocol)
    assert load_config(None, ["local.enabled=true"]).policy.engine == "sglang"
    with pytest.raises(ConfigError, match=r"^policy.engine: no policy engine 'trtllm' is registered \(registered: sglang, vllm\)"):
        load_config(None, ["local.enabled=true", "policy.engine=trtllm"])


def test_the_clients_share_one_class_and_differ_by_their_wire():
    register_policy_engine("vllm_copy", "rollout.core.policy.vllm:VLLM_WIRE")
    try:
        async def main():
            out = {}
            async with aiohttp.ClientSession() as s:
                for engine in ("sglang", "vllm", "vllm_copy"):
                    cfg = load_config(None, ["policy.router_url=http://127.0.0.1:9", f"policy.engine={engine}"]).policy
                    out[engine] = (HTTPPolicyClient(cfg, s), SGLangClient(cfg, s), VLLMClient(cfg, s))
            return out

        out = asyncio.run(main())
    finally:
        unregister_policy_engine("vllm_copy")
    assert [c.wire for c in out["sglang"]] == [SGLANG_WIRE, SGLANG_WIRE, VLLM_WIRE]  # a fixed class keeps its own
    assert [c.wire for c in out["vllm"]] == [VLLM_WIRE, SGLANG_WIRE, VLLM_WIRE]
    assert out["vllm_copy"][0].wire is VLLM_WIRE
    sg, vl = out["sglang"][0], out["vllm"][0]
    assert type(sg) is type(vl) is HTTPPolicyClient and isinstance(out["vllm"][2], HTTPPolicyClient)
    assert (sg.url, vl.url) == ("http://127.0.0.1:9/generate", "http://127.0.0.1:9/inference/v1/generate")
    assert (type(sg.admin).__name__, type(vl.admin).__name__) == ("RouterAdmin", "VLLMAdmin")
    assert (sg.wire.routing_header, vl.wire.routing_header) == ("X-SMG-Routing-Key", "X-Session-ID")


def test_a_call_aborted_before_its_first_token_reports_no_version_and_does_not_count_for_staleness():
    from rollout.core.records import TrainingSample

    def sample(versions, spans):
        return TrainingSample(list(range(10)), 5, [1] * 5, [-0.1] * 5, 1.0, "completed", "g", 0, weight_versions=versions,
                              generation_spans=spans)

    # vLLM answers a call aborted while queued with no ids and no spans: its version is None
    assert parse_vllm_response(_mutate("pause_abort", lambda c: c.update(token_ids=[], logprobs={"content": []}, weight_versions=[]))) \
        .weight_version is None
    assert sample(["0", None, "1"], [[0, 3], [3, 3], [3, 5]]).numeric_weight_versions() == [0, 1]
    with pytest.raises(ValueError, match="are not all integers"):
        sample(["0", None], [[0, 3], [3, 5]]).numeric_weight_versions()  # a token with no version: the lag is unknown
