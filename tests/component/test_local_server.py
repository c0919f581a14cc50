"""The local SGLang-protocol server, its gold-replay backend and the local stack (real router).

Servers run in-process on loopback (aiohttp's TestServer); the last test starts the whole
:class:`~rollout.devtools.local.stack.LocalStack` with the real ``sglang-router``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import threading
import time

import pytest
from support.inprocess import serve, wait_until

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rollout.core.tokenizer import load_tokenizer
from rollout.devtools.local.backend_api import SamplingParams
from rollout.devtools.local.dialects.hermes import _MESSAGE_RE, HermesDialect

TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:qwen3")


@pytest.fixture(scope="module")
def gold(tok):
    from rollout.devtools.local.gold import GoldReplayBackend

    return GoldReplayBackend("retail", tok)


@pytest.fixture(scope="module")
def gold_skip(tok):
    from rollout.devtools.local.gold import GoldReplayBackend

    return GoldReplayBackend("retail", tok, skip_write=True)


@pytest.fixture(scope="module")
def retail_data():
    """(tasks by id, {tool name: is_write}) from tau2 itself."""
    from tau2.domains.retail.environment import get_environment, get_tasks
    from tau2.environment.toolkit import ToolType

    tools = get_environment().tools
    return {t.id: t for t in get_tasks("base")}, {
        n: tools.tool_type(n) == ToolType.WRITE for n in tools.tools
    }


def _prompt_ids(tok, task) -> list[int]:
    """System prompt, agent greeting, then the user's opening (which contains reason_for_call)."""
    reason = task.user_scenario.instructions.reason_for_call
    messages = [
        {"role": "system", "content": "You are a customer service agent for a retail store."},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": f"Hello.\n{reason}\nThanks!"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    return tok.encode(text, add_special_tokens=False)


def _delta_ids(tok, role: str, content: str) -> list[int]:
    """Tokens after a generated <|im_end|>: newline, the next message, the assistant header."""
    return tok.encode(f"\n<|im_start|>{role}\n{content}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)


def _parse_call(text: str) -> dict:
    assert text.startswith(TOOL_CALL_OPEN) and text.endswith(TOOL_CALL_CLOSE), text
    return json.loads(text[len(TOOL_CALL_OPEN):-len(TOOL_CALL_CLOSE)])


async def _generate(session, url, body, status=200) -> dict:
    async with session.post(url + "/generate", json=body) as resp:
        data = await resp.json()
        assert resp.status == status, data
        return data


class SlowBackend:
    """Yields token 100 every ``delay`` seconds, for ever; records when it was closed and how
    many tokens it yielded (by the prompt's first id)."""

    name = "slow"

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay
        self.closed = threading.Event()
        self.steps: collections.Counter = collections.Counter()

    def generate(self, input_ids, params: SamplingParams):
        try:
            while True:
                time.sleep(self.delay)
                self.steps[input_ids[0]] += 1
                yield 100, -0.5
        finally:
            self.closed.set()

    def chat(self, messages, params):
        return "slow"


# --------------------------------------------------------------------------- gold replay
async def test_first_turn_is_first_gold_action(tok, gold, retail_data):
    tasks, _ = retail_data
    task = tasks["0"]
    ids = _prompt_ids(tok, task)
    async with serve(gold, tok) as (url, s):
        out = await _generate(s, url, {"input_ids": ids, "return_logprob": True, "rid": "t0",
                                       "sampling_params": {"max_new_tokens": 512, "temperature": 1.0}})
    meta = out["meta_info"]
    gold0 = task.evaluation_criteria.actions[0]
    call = _parse_call(out["text"])
    assert call == {"name": gold0.name, "arguments": gold0.arguments}
    assert out["output_ids"][-1] == tok.eos_token_id  # EOS finish: the EOS id is part of the output
    assert meta["finish_reason"] == {"type": "stop", "matched": tok.eos_token_id}
    assert meta["id"] == "t0"
    assert meta["prompt_tokens"] == len(ids)
    assert meta["completion_tokens"] == len(out["output_ids"])
    assert meta["cached_tokens"] == 0
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(e[0] == 0.0 and e[2] is None for e in meta["output_token_logprobs"])
    # The generated ids are exactly the tokenization of the tool-call text (nothing re-rendered).
    assert tok.decode(out["output_ids"], skip_special_tokens=False) == out["text"] + "<|im_end|>"


async def test_stop_string_keeps_token_and_trims_text(tok, gold, retail_data):
    tasks, _ = retail_data
    ids = _prompt_ids(tok, tasks["0"])
    close_id = tok.convert_tokens_to_ids("</tool_call>")
    async with serve(gold, tok) as (url, s):
        out = await _generate(s, url, {"input_ids": ids, "sampling_params": {"stop": ["</tool_call>"]}})
        kept = await _generate(s, url, {"input_ids": ids, "sampling_params": {"stop": "</tool_call>", "no_stop_trim": True}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "</tool_call>"}
    assert out["output_ids"][-1] == close_id
    assert tok.eos_token_id not in out["output_ids"]
    assert "output_token_logprobs" not in out["meta_info"]
    assert out["text"].startswith("<tool_call>\n") and "</tool_call>" not in out["text"]
    assert kept["output_ids"] == out["output_ids"]
    assert kept["text"].endswith("</tool_call>")


async def test_length_stop_token_ids_and_ignore_eos(tok, gold, retail_data):
    tasks, _ = retail_data
    ids = _prompt_ids(tok, tasks["0"])
    async with serve(gold, tok) as (url, s):
        full = await _generate(s, url, {"input_ids": ids})
        out = await _generate(s, url, {"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": 5}})
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
        assert len(out["output_ids"]) == 5 == out["meta_info"]["completion_tokens"]
        assert len(out["meta_info"]["output_token_logprobs"]) == 5
        assert out["output_ids"] == full["output_ids"][:5]
        # stop_token_ids: stops on the first occurrence, which is part of the output.
        target = full["output_ids"][3]
        out = await _generate(s, url, {"input_ids": ids, "sampling_params": {"stop_token_ids": [target]}})
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
        assert out["output_ids"] == full["output_ids"][: full["output_ids"].index(target) + 1]
        # ignore_eos: the backend ends by itself after EOS.
        out = await _generate(s, url, {"input_ids": ids, "sampling_params": {"ignore_eos": True}})
        assert out["output_ids"] == full["output_ids"]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": None}
        out = await _generate(s, url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}})
        assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"


async def test_full_gold_episode_then_stop(tok, gold, retail_data):
    """Append-only token replay: every gold action, the closing message, then ###STOP###."""
    tasks, _ = retail_data
    task = next(t for t in tasks.values() if t.evaluation_criteria.communicate_info and t.id not in ("67", "68"))
    ids = _prompt_ids(tok, task)
    calls, texts = [], []
    async with serve(gold, tok) as (url, s):
        for _ in range(len(task.evaluation_criteria.actions) + 3):
            out = await _generate(s, url, {"input_ids": ids, "sampling_params": {"stop": ["</tool_call>"]}})
            ids = ids + out["output_ids"]
            if out["meta_info"]["finish_reason"]["matched"] == "</tool_call>":
                ids = ids + [tok.eos_token_id]  # the client closes the turn itself
                calls.append(_parse_call(out["text"] + "</tool_call>"))
                ids = ids + _delta_ids(tok, "user", '<tool_response>\n{"ok": true}\n</tool_response>')
            else:
                texts.append(out["text"])
                if out["text"] == "###STOP###":
                    break
                ids = ids + _delta_ids(tok, "user", "Great, thanks.")
    assert calls == [{"name": a.name, "arguments": a.arguments} for a in task.evaluation_criteria.actions]
    assert texts[-1] == "###STOP###" and len(texts) == 2
    for info in task.evaluation_criteria.communicate_info:
        assert info in texts[0]


async def test_skip_write_skips_first_write_action(tok, gold_skip, retail_data):
    tasks, is_write = retail_data
    task = tasks["0"]
    gold_calls = [(a.name, a.arguments) for a in task.evaluation_criteria.actions]
    first_write = next(i for i, (n, _) in enumerate(gold_calls) if is_write[n])
    expected = gold_calls[:first_write] + gold_calls[first_write + 1:]
    ids = _prompt_ids(tok, task)
    seen = []
    async with serve(gold_skip, tok) as (url, s):
        for _ in range(len(gold_calls) + 2):
            out = await _generate(s, url, {"input_ids": ids})
            ids = ids + out["output_ids"]
            if not out["text"].startswith("<tool_call>"):
                break
            call = _parse_call(out["text"])
            seen.append((call["name"], call["arguments"]))
            ids = ids + _delta_ids(tok, "user", '<tool_response>\n{"ok": true}\n</tool_response>')
    assert seen == expected
    assert gold_calls[first_write] not in seen


async def test_unknown_task_answers_text(tok, gold):
    ids = tok.encode("<|im_start|>user\nWhat is the weather like?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    async with serve(gold, tok) as (url, s):
        out = await _generate(s, url, {"input_ids": ids})
        by_text = await _generate(s, url, {"text": "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"})
    assert "No retail task matches" in out["text"]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok.eos_token_id}
    assert by_text["meta_info"]["prompt_tokens"] > 0 and by_text["output_ids"][-1] == tok.eos_token_id


async def test_bad_requests_are_400(tok, gold):
    async with serve(gold, tok) as (url, s):
        for body in (
            {"input_ids": [1, 2], "stream": True},
            {"sampling_params": {"max_new_tokens": 3}},
            {"input_ids": []},
            {"input_ids": [[1, 2]]},
            {"input_ids": [1, "x"]},
            {"input_ids": [1, True]},  # JSON true is not a token id
            {"input_ids": [1, 2.0]},
            {"input_ids": [1, -1]},
            {"input_ids": [1, 10**9]},  # beyond the vocabulary
            {"input_ids": [1, 2], "sampling_params": {"max_tokens": 3}},
            {"input_ids": [1, 2], "sampling_params": {"temperature": -1}},
            {"input_ids": [1, 2], "sampling_params": {"stop": 3}},
            {"input_ids": [1, 2], "rid": 5},
        ):
            data = await _generate(s, url, body, status=400)
            assert isinstance(data["error"], str) and data["error"]
        for raw in (b"{not json", b"\xff\xfe{}", b"[1, 2]"):
            async with s.post(url + "/generate", data=raw, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400 and "error" in await r.json()


# --------------------------------------------------------------------------- abort, concurrency
async def test_abort_in_flight_request(tok):
    backend = SlowBackend(delay=0.02)
    async with serve(backend, tok) as (url, s):
        body = {"input_ids": [1, 2, 3], "rid": "slow-1", "return_logprob": True, "sampling_params": {"max_new_tokens": 100000}}
        task = asyncio.create_task(_generate(s, url, body))
        await wait_until(lambda: backend.steps[1] >= 2)
        async with s.post(url + "/abort_request", json={"rid": "slow-1"}) as r:
            assert r.status == 200 and (await r.json())["aborted"] == 1
        out = await asyncio.wait_for(task, timeout=120)  # not aborted, it would run 100000 x 0.02 s
        fr = out["meta_info"]["finish_reason"]
        assert fr["type"] == "abort" and isinstance(fr["message"], str)
        assert 0 < len(out["output_ids"]) < 100000
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"])
        assert [e[1] for e in out["meta_info"]["output_token_logprobs"]] == out["output_ids"]
        assert await asyncio.to_thread(backend.closed.wait, 30)  # the worker thread stopped too

        # abort_all, with two requests served concurrently
        backend.closed.clear()
        tasks = [asyncio.create_task(_generate(s, url, {"input_ids": [i], "sampling_params": {"max_new_tokens": 100000}}))
                 for i in (2, 3)]
        await wait_until(lambda: backend.steps[2] >= 2 and backend.steps[3] >= 2)
        async with s.post(url + "/abort_request", json={"abort_all": True}) as r:
            assert (await r.json())["aborted"] == 2
        outs = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        assert all(o["meta_info"]["finish_reason"]["type"] == "abort" and o["output_ids"] for o in outs)
        # a short request still completes normally afterwards
        out = await _generate(s, url, {"input_ids": [1], "sampling_params": {"max_new_tokens": 3}})
        assert out["output_ids"] == [100, 100, 100]


# --------------------------------------------------------------------------- other endpoints
async def test_chat_completions_and_info_endpoints(tok, gold):
    async with serve(gold, tok) as (url, s):
        req = {"model": "user-sim", "temperature": 0.0, "max_tokens": 64,
               "messages": [{"role": "system", "content": "You are a user."},
                            {"role": "user", "content": "Shall I exchange the keyboard?"}]}
        async with s.post(url + "/v1/chat/completions", json=req) as r:
            assert r.status == 200
            data = await r.json()
        assert data["object"] == "chat.completion" and data["id"]
        assert data["choices"][0]["message"] == {"role": "assistant", "content": "Yes, please go ahead."}
        assert data["choices"][0]["finish_reason"] == "stop"
        assert data["usage"]["completion_tokens"] > 0
        req["messages"][-1]["content"] = "Your exchange is done."
        async with s.post(url + "/v1/chat/completions", json=req) as r:
            assert (await r.json())["choices"][0]["message"]["content"] == "###STOP###"
        for path in ("/health", "/health_generate"):
            async with s.get(url + path) as r:
                assert r.status == 200
        async with s.get(url + "/get_model_info") as r:
            info = await r.json()
        assert info["is_generation"] is True and os.path.isdir(info["tokenizer_path"])
        async with s.get(url + "/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "local/gold_replay"


# --------------------------------------------------------------------------- the real router
@pytest.mark.slow
def test_local_stack_through_real_router(tok, retail_data):
    import urllib.request

    from rollout.core.config import LocalConfig
    from rollout.devtools.local.stack import LocalStack

    def call(url, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    tasks, _ = retail_data
    task = tasks["0"]
    stack = LocalStack(LocalConfig(num_servers=1, startup_timeout_s=60), "retail", "builtin:qwen3")
    with stack:
        assert stack.router_url.startswith("http://127.0.0.1:")
        workers = call(stack.router_url + "/workers")["workers"]
        assert [w["url"] for w in workers] == stack.worker_urls
        assert all(w["is_healthy"] for w in workers)
        out = call(stack.router_url + "/generate", {"input_ids": _prompt_ids(tok, task), "return_logprob": True,
                                                    "sampling_params": {"stop": ["</tool_call>"]}})
        assert out["output_ids"] and out["output_ids"][-1] == tok.convert_tokens_to_ids("</tool_call>")
        assert [e[1] for e in out["meta_info"]["output_token_logprobs"]] == out["output_ids"]
        gold0 = task.evaluation_criteria.actions[0]
        assert _parse_call(out["text"] + "</tool_call>") == {"name": gold0.name, "arguments": gold0.arguments}
        chat = call(stack.router_url + "/v1/chat/completions",
                    {"model": "user-sim", "messages": [{"role": "user", "content": "Done?"}]})
        assert chat["choices"][0]["message"]["content"] == "Yes, please go ahead."
        procs = [p for _, p, _, _ in stack._procs]
    stack.stop()  # idempotent
    assert all(p.poll() is not None for p in procs)


def test_gold_prompt_decode_by_message_equals_the_whole_decode(tok, gold, retail_data):
    """The gold oracle decodes prompts message by message with a cache; the text must be the
    tokenizer's decode of the whole prompt, on real tau2 prompts with tools and non-ASCII text."""
    from rollout.benchmarks.tau2.environment import Tau2Domain

    domain = Tau2Domain("retail")
    messages = [{"role": "system", "content": domain.system_prompt}, {"role": "user", "content": "Héllo — I'd like to return an item 🙂"}]
    text = tok.apply_chat_template(messages, tools=domain.tool_schemas, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    longer = ids + _delta_ids(tok, "user", 'naïve café 😀 <tool_response>{"a": 1}</tool_response>')
    for prompt in (ids, longer, _prompt_ids(tok, retail_data[0]["0"])):
        assert gold._decode_prompt(prompt) == tok.decode(prompt, skip_special_tokens=False)
        assert gold._decode_prompt(prompt) == tok.decode(prompt, skip_special_tokens=False)  # from the cache
        # the messages read piece by piece are those the dialect reads in the whole text
        whole = HermesDialect().messages(tok.decode(prompt, skip_special_tokens=False))
        assert gold._messages(prompt) == whole and len(whole) >= 2
        # ... which are those the ChatML pattern finds, a user turn of tool responses split per response
        chatml = [(m.group(1).strip(), m.group(2), bool(m.group(3))) for m in _MESSAGE_RE.finditer(tok.decode(prompt, skip_special_tokens=False))]
        assert [m[:3] for m in whole if m.role != "tool"] == [c for c in chatml if "<tool_response>" not in c[1]]
        unclosed = prompt + tok.encode("<|im_start|>assistant\npartial answer", add_special_tokens=False)
        assert gold._messages(unclosed)[-1] == ("assistant", "partial answer", False, 0)
    assert len(gold._pieces) >= 3
