"""SGLang's wire protocol (rollout.core.policy.sglang) against SGLang's own answer shapes
(tests/support/data/sglang/, each shape's source in SGLang 0.5.23 is written there): the request
body, every finish (EOS, a stop string, a stop id, length, an abort of a running request and of a
queued one), log-prob triples with and without text, a call kept through a weight update (one span
per version) and one aborted after it, an older server without spans; malformed answers as typed
errors; the episode loop's end-of-turn repair and per-version spans on those answers; the control
endpoints (pause, continue, update, model info, abort, the router's /workers) read by RouterAdmin;
the KV gate's metrics."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest

from rollout.core.config import SamplingConfig
from rollout.core.environment import RESPOND, StepResult
from rollout.core.episode import run_episode
from rollout.core.formats import ChatTemplate
from rollout.core.policy import SGLANG_WIRE, PolicyServerError, RouterAdmin, WeightSyncError
from rollout.core.policy.kvreadings import SGLANG_KV_METRICS
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.settings import EpisodeSettings
from rollout.core.telemetry import promtext

DATA = Path(__file__).resolve().parents[1] / "support" / "data" / "sglang"
GENERATE = json.loads((DATA / "generate_answers.json").read_text())
CASES = GENERATE["cases"]
CONTROL = json.loads((DATA / "control_answers.json").read_text())["answers"]
EOS, TOOL_CALL_END = 151645, 151658  # Qwen3's <|im_end|> and </tool_call>
STOP_ID = CASES["stop_token_id"]["request"]["sampling_params"]["stop_token_ids"][0]


def _body(case: str) -> dict:
    return copy.deepcopy(CASES[case]["body"])


def _triples(case: str) -> list[list]:
    return CASES[case]["body"]["meta_info"]["output_token_logprobs"]


# -- the request ----------------------------------------------------------------------------------
def test_the_request_body_is_the_one_the_answers_were_shaped_for():
    s = SamplingConfig(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=64, stop=["</tool_call>"])
    body = SGLANG_WIRE.generate_body(GENERATE["prompt"], 64, "rec-stop_eos", None, s)
    assert body == CASES["stop_eos"]["request"]
    assert SGLANG_WIRE.read_request(body) == ("rec-stop_eos", GENERATE["prompt"])
    seeded = SGLANG_WIRE.generate_body([1], 4, "r", 7, s)["sampling_params"]
    assert seeded["sampling_seed"] == 7 and seeded["no_stop_trim"] is True and seeded["skip_special_tokens"] is False


# -- the answers, read ----------------------------------------------------------------------------
@pytest.mark.parametrize("case, finish, matched, last_id, version", [
    ("stop_eos", "stop", EOS, EOS, "default"),  # FINISH_MATCHED_TOKEN: EOS stays in the ids
    ("stop_str", "stop", "</tool_call>", TOOL_CALL_END, "default"),  # FINISH_MATCHED_STR: no_stop_trim keeps its token
    ("stop_token_id", "stop", STOP_ID, STOP_ID, "default"),  # FINISH_MATCHED_TOKEN of a stop_token_ids id
    ("length", "length", None, None, "default"),  # FINISH_LENGTH has no "matched"
    ("abort_running", "abort", None, None, "default"),  # the partial ids, each with its log-prob
    ("abort_waiting", "abort", None, None, "default"),  # aborted before it ran: nothing generated
    ("text_in_logprobs", "stop", "</tool_call>", TOOL_CALL_END, "default"),
    ("spans_update", "length", None, None, "1"),
    ("spans_abort_after_update", "abort", None, None, "0"),  # the ids' own version, not the server's new one
    ("legacy_0_5_9", "stop", "</tool_call>", TOOL_CALL_END, "default"),
])
def test_each_answer_reads_into_a_generation(case, finish, matched, last_id, version):
    body = _body(case)
    gen = SGLANG_WIRE.parse_generate(body)
    triples = _triples(case)
    assert gen.ids == body["output_ids"] == [t[1] for t in triples]
    assert gen.log_probs == [t[0] for t in triples] and all(lp <= 0.0 for lp in gen.log_probs)
    assert (gen.finish_type, gen.matched) == (finish, matched)
    if last_id is not None:
        assert gen.ids[-1] == last_id
    assert gen.weight_version == version
    assert gen.meta["id"] == f"rec-{case}" == CASES[case]["request"]["rid"]
    assert "output_token_logprobs" not in gen.meta and "input_token_logprobs" not in gen.meta
    assert gen.interrupted is False
    if case != "spans_update":
        assert gen.weight_spans is None and gen.pieces() == [(gen.ids, gen.log_probs, version)]


def test_every_case_asked_what_the_wire_sends():
    for name, c in CASES.items():
        assert c["request"]["return_logprob"] is True and c["request"]["sampling_params"]["no_stop_trim"] is True, name
    assert CASES["stop_token_id"]["request"]["sampling_params"]["stop_token_ids"] == [CASES["stop_token_id"]["body"]["output_ids"][-1]]
    assert CASES["abort_waiting"]["body"]["output_ids"] == [] and "prompt_tokens" not in CASES["abort_waiting"]["body"]["meta_info"]
    assert all(isinstance(t[2], str) for t in _triples("text_in_logprobs")) and all(t[2] is None for t in _triples("stop_str"))


def test_a_call_kept_through_a_weight_update_keeps_each_span_s_version():
    gen = SGLANG_WIRE.parse_generate(_body("spans_update"))
    assert CASES["spans_update"]["body"]["meta_info"]["weight_versions"] == [{"version": "0", "start": 0, "end": 3},
                                                                             {"version": "1", "start": 3, "end": 8}]
    assert gen.weight_spans == [(0, 3, "0"), (3, 8, "1")] and gen.weight_version == "1"
    pieces = gen.pieces()
    assert [(len(i), v) for i, _, v in pieces] == [(3, "0"), (5, "1")]
    assert sum((i for i, _, _ in pieces), []) == gen.ids and sum((lp for _, lp, _ in pieces), []) == gen.log_probs


def _mutate(case: str, fn) -> dict:
    body = _body(case)
    fn(body)
    return body


@pytest.mark.parametrize("mutate, match", [
    (lambda b: b["meta_info"]["output_token_logprobs"][1].__setitem__(0, None), "null log-prob for generated token 1"),
    (lambda b: b["meta_info"].pop("output_token_logprobs"), "need meta_info.output_token_logprobs"),  # return_logprob not sent
    (lambda b: b.update(output_ids=b["output_ids"][:-1]), "output_ids disagree with output_token_logprobs"),
    (lambda b: b["meta_info"].update(weight_versions=[{"version": "0", "start": 0, "end": 3}]), "end at 3, not at the 8 ids"),
    (lambda b: b["meta_info"].update(weight_versions=[{"version": "0", "start": 1, "end": 8}]), "do not cover the 8 ids in order"),
    (lambda b: b["meta_info"].update(weight_versions=[{"version": "0"}]), "lacks start, end or version"),
    (lambda b: b["meta_info"].update(weight_versions="0"), "must be a list of spans"),
])
def test_a_malformed_answer_is_a_policy_server_error_naming_what_is_wrong(mutate, match):
    with pytest.raises(PolicyServerError, match=match):
        SGLANG_WIRE.parse_generate(_mutate("spans_update", mutate))


# -- through the episode loop ---------------------------------------------------------------------
class _Recorded:
    """A policy answering each call with the next case, read by the SGLang wire."""

    def __init__(self, cases: list[str]):
        self.cases, self.calls = list(cases), 0

    async def generate(self, input_ids, max_new_tokens: int, rid: str, routing_key: str | None = None, seed: int | None = None):
        case = self.cases[min(self.calls, len(self.cases) - 1)]
        self.calls += 1
        return SGLANG_WIRE.parse_generate(_body(case))


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
                               system_prompt="You are an agent.", tool_names=("get_order_details",), stop=("</tool_call>",))
    res = asyncio.run(run_episode(EpisodeSpec("e1", "toy", "0", "g", 0), _Env(), _Recorded(cases), chat, settings))
    return res, chat


def test_the_end_of_turn_repair_holds_on_sglang_s_untrimmed_ids(tokenizer):
    res, chat = _episode(tokenizer, ["stop_str", "stop_eos"])
    traj = res.trajectory
    assert chat.eot_ids == [EOS]
    (a0, b0), (a1, b1) = traj.generation_spans
    r = traj.response_ids
    # the tool call's stop string is the last sampled id; the loop closes the turn with <|im_end|>, mask 0
    assert r[a0:b0] == CASES["stop_str"]["body"]["output_ids"] and r[b0 - 1] == TOOL_CALL_END
    assert r[b0] == EOS and traj.loss_mask[b0] == 0
    # EOS sampled: the model closed the turn; nothing added
    assert r[a1:b1] == CASES["stop_eos"]["body"]["output_ids"] and traj.loss_mask[b1 - 1] == 1
    assert res.metadata["turn_boundary_repairs"] == 1 and res.metadata["requests"] == 2
    assert traj.rollout_log_probs[a0:b0] == [t[0] for t in _triples("stop_str")]


def test_a_call_kept_through_an_update_is_recorded_as_two_spans_with_their_versions(tokenizer):
    res, _ = _episode(tokenizer, ["spans_update"])
    traj = res.trajectory
    assert res.status is EpisodeStatus.TRUNCATED and res.metadata["requests"] == 1  # a length finish (on_length=truncate)
    (a, b), (c, d) = traj.generation_spans
    assert (b - a, d - c, b == c) == (3, 5, True) and traj.weight_versions == ["0", "1"]
    versions = res.to_sample().token_weight_versions()
    assert versions[a:b] == ["0"] * 3 and versions[c:d] == ["1"] * 5


# -- the control endpoints ------------------------------------------------------------------------
class _Answer:
    def __init__(self, status: int, body) -> None:
        self.status, self._body = status, body

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    async def json(self, content_type=None):
        return self._body

    async def text(self, errors="strict") -> str:
        return self._body if isinstance(self._body, str) else json.dumps(self._body)


class _Workers:
    """An aiohttp session stand-in answering the router's /workers and each worker's control calls
    with SGLang's answers; records what was sent."""

    def __init__(self, overrides: dict[str, str] | None = None, workers: dict | None = None) -> None:
        self.sent: list[tuple[str, str, object]] = []
        self.overrides = overrides or {}
        self.workers = workers or CONTROL["workers"]["body"]

    def get(self, url: str, **kw):
        assert url.endswith("/workers"), url
        return _Answer(200, self.workers)

    def request(self, method: str, url: str, json=None, **kw):
        path = "/" + url.split("/", 3)[3]
        self.sent.append((method, url, json))
        name = self.overrides.get(path) or next(k for k, a in CONTROL.items() if a["path"] == path and k != "workers")
        a = CONTROL[name]
        return _Answer(a["status"], a["body"])


def _admin(session) -> RouterAdmin:
    return RouterAdmin("http://127.0.0.1:30000", session)


URLS = ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]


def test_the_router_s_workers_list_names_each_worker_and_its_health():
    assert asyncio.run(_admin(_Workers()).worker_health()) == dict.fromkeys(URLS, True)
    sick = copy.deepcopy(CONTROL["workers"]["body"])
    sick["workers"][1]["is_healthy"] = False
    assert asyncio.run(_admin(_Workers(workers=sick)).worker_health()) == {URLS[0]: True, URLS[1]: False}


def test_pause_update_continue_model_info_and_abort_read_sglang_s_answers():
    s = _Workers()
    admin = _admin(s)

    async def cycle():
        paused = await admin.pause("abort")
        updated = await admin.update_weights_from_disk("/ckpt/step_1", "1")
        resumed = await admin.resume()
        return paused, updated, resumed, await admin.weight_versions(), await admin.abort("e1@0#2")

    paused, updated, resumed, versions, aborted = asyncio.run(cycle())
    assert paused == resumed == URLS and aborted == 2
    assert updated == dict.fromkeys(URLS, CONTROL["update_weights_from_disk"]["body"])
    assert versions == dict.fromkeys(URLS, "1")  # GET /model_info's weight_version
    sent = {(m, u.rsplit("/", 1)[1]): b for m, u, b in s.sent}
    assert sent[("POST", "pause_generation")] == CONTROL["pause_generation"]["request"]
    assert sent[("POST", "update_weights_from_disk")] == CONTROL["update_weights_from_disk"]["request"]
    assert sent[("POST", "continue_generation")] == CONTROL["continue_generation"]["request"]
    assert sent[("POST", "abort_request")] == CONTROL["abort_request"]["request"]


@pytest.mark.parametrize("answer, match", [
    ("update_weights_from_disk_bad_path", "HTTP 400: .*Failed to get weights iterator"),
    ("update_weights_from_disk_flush_refused", "HTTP 400: .*the cache was not flushed"),
])
def test_a_failed_update_names_each_worker_and_sglang_s_message(answer, match):
    with pytest.raises(WeightSyncError, match=match) as e:
        asyncio.run(_admin(_Workers({"/update_weights_from_disk": answer})).update_weights_from_disk("/ckpt/x", "2"))
    assert sorted(e.value.failures) == URLS and e.value.action.startswith("update_weights_from_disk")


def test_the_kv_gate_reads_sglang_s_own_metrics():
    text = (DATA / "metrics.txt").read_text()
    reading = SGLANG_KV_METRICS.reading(promtext.parse(text, SGLANG_KV_METRICS.prefix, strict=False))
    assert reading is not None
    assert (reading.usage, reading.retractions, reading.kv_tokens) == (0.25, 3.0, 65536.0)
