"""The local server's KV model (prefix cache, KV budget with retraction, cost model) and its
``/metrics``, read back from real servers under load: in-process (aiohttp's TestServer) and one
real ``python -m rollout.devtools.local.server`` process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import aiohttp
import pytest
from support.inprocess import serve
from support.waits import until

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rollout.core.telemetry import promtext
from rollout.core.tokenizer import load_tokenizer
from rollout.devtools.local.kvmodel import KVParams
from rollout.devtools.local.stack import free_port


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:qwen3")


class FixedBackend:
    """Yields ``n`` tokens (ids 500, 501, ...), then ends."""

    name = "fixed"
    tokens_per_step = 64

    def __init__(self, n: int) -> None:
        self.n = n

    def generate(self, input_ids, params):
        for i in range(self.n):
            yield 500 + i, -0.1

    def chat(self, messages, params):
        return "fixed"


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


async def _gen(s, url, ids, max_new_tokens=64) -> dict:
    async with s.post(url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens}}) as r:
        assert r.status == 200
        return await r.json()


async def _metrics(s, url) -> dict[str, float]:
    async with s.get(url + "/metrics") as r:
        assert r.status == 200 and r.content_type == "text/plain"
        return {x.name: x.value for x in promtext.parse(await r.text())}


async def _metrics_show(s, url, name: str, value: float) -> bool:
    return (await _metrics(s, url))[name] == value


async def test_cached_tokens_and_metrics_hand_computed(tok):
    shared = seq(1000, 100)
    a, b = shared + seq(2000, 50), shared + seq(3000, 30)
    async with serve(FixedBackend(10), tok, kv=KVParams(cache_tokens=10_000)) as (url, s):
        out_a = await _gen(s, url, a)
        assert out_a["meta_info"]["cached_tokens"] == 0
        out_b = await _gen(s, url, b)
        assert out_b["meta_info"]["cached_tokens"] == 100  # the shared prefix
        turn2 = a + out_a["output_ids"] + seq(4000, 20)  # the next turn re-sends prompt + output
        assert (await _gen(s, url, turn2))["meta_info"]["cached_tokens"] == 160
        m = await _metrics(s, url)
    assert m["sglang:prompt_tokens_total"] == 150 + 130 + 180
    assert m["sglang:cached_tokens_total"] == m["rollout_local_cached_tokens_total"] == 260
    assert m["sglang:cache_hit_rate"] == pytest.approx(260 / 460)
    assert m["sglang:num_requests_total"] == m["rollout_local_requests_total"] == 3
    assert m["sglang:generation_tokens_total"] == 30
    assert m["rollout_local_prefill_tokens_total"] == 460 - 260
    assert m["rollout_local_retractions_total"] == 0 and m["sglang:num_running_reqs"] == 0
    # cache: a + its output (150 + 10), b's tail + its output (30 + 10), turn2's new 20 + its output 10
    assert m["rollout_local_cache_tokens"] == 230


async def test_off_by_default_reports_zero_cached(tok):
    async with serve(FixedBackend(5), tok) as (url, s):
        await _gen(s, url, seq(0, 50))
        assert (await _gen(s, url, seq(0, 50)))["meta_info"]["cached_tokens"] == 0
        m = await _metrics(s, url)
    assert m["sglang:prompt_tokens_total"] == 100 and m["sglang:cached_tokens_total"] == 0
    assert m["sglang:token_usage"] == 0.0 and m["sglang:num_queue_reqs"] == 0


async def test_kv_budget_queues_and_retracts_under_load(tok):
    """Budget 300 tokens, prompts of 120, 40 output tokens each: two run (240), the third
    queues; as the two grow past 300 one is retracted, queued again and prefilled again; every
    request still answers its 40 tokens."""
    params = KVParams(kv_budget_tokens=300, decode_s_per_token=0.004, prefill_s_per_token=0.0001)
    async with serve(FixedBackend(40), tok, kv=params) as (url, s):
        seen: list[dict] = []
        done = asyncio.Event()

        async def poll():
            while not done.is_set():
                seen.append(await _metrics(s, url))
                await asyncio.sleep(0.01)

        poller = asyncio.create_task(poll())
        outs = await asyncio.gather(*[_gen(s, url, seq(10_000 * (i + 1), 120)) for i in range(3)])
        done.set()
        await poller
        m = await _metrics(s, url)
    assert all(o["output_ids"] == seq(500, 40) and o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs)
    assert max(x["sglang:num_queue_reqs"] for x in seen) >= 1
    assert max(x["sglang:num_running_reqs"] for x in seen) == 2
    assert 0.5 < max(x["sglang:token_usage"] for x in seen) <= 1.0
    assert m["sglang:num_retracted_requests_total"] == m["rollout_local_retractions_total"] >= 1
    lost = m["rollout_local_retracted_prefill_tokens_total"]
    assert lost >= 120  # at least a whole prompt was thrown away
    # everything prefilled = every prompt once + what retractions threw away (nothing cached)
    assert m["rollout_local_prefill_tokens_total"] == 360 + lost
    assert m["sglang:num_running_reqs"] == 0 and m["sglang:num_used_tokens"] == 0


async def test_abort_while_queued_and_prefill_cost(tok):
    # the first request holds the budget for its prefill and decode (0.18 s + 2.5 s): long enough
    # that the second is queued behind it however late the test's loop sends it
    params = KVParams(kv_budget_tokens=100, prefill_s_per_token=0.002, decode_s_per_token=0.05)
    async with serve(FixedBackend(50), tok, kv=params) as (url, s):
        t0 = time.monotonic()
        first = asyncio.create_task(_gen(s, url, seq(0, 90)))
        await until(lambda: _metrics_show(s, url, "sglang:num_running_reqs", 1), "the first request admitted")
        body = {"input_ids": seq(5000, 90), "rid": "queued", "sampling_params": {"max_new_tokens": 64}}
        second = asyncio.create_task(s.post(url + "/generate", json=body))
        await until(lambda: _metrics_show(s, url, "sglang:num_queue_reqs", 1), "the second request queued")
        assert not first.done()
        async with s.post(url + "/abort_request", json={"rid": "queued"}) as r:
            assert (await r.json())["aborted"] == 1
        resp = await second
        out = await resp.json()
        assert out["meta_info"]["finish_reason"]["type"] == "abort" and out["output_ids"] == []
        assert (await first)["meta_info"]["completion_tokens"] == 50
        assert time.monotonic() - t0 >= 0.18 + 2.5  # the modelled prefill and decode were waited
        m = await _metrics(s, url)
    assert m["sglang:num_queue_reqs"] == 0 and m["rollout_local_prefill_tokens_total"] == 90


def test_real_server_process_metrics_under_load(tok, tmp_path):
    """``python -m rollout.devtools.local.server --kv-cache-tokens ...`` (gold replay): a group of
    8 requests sharing a prompt, sent at once after the first, find it in the cache; the /metrics
    counters add up."""
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rollout.devtools.local.server", "--port", str(port),
                             "--backend", "gold_replay", "--log-level", "WARNING",
                             "--kv-cache-tokens", "100000", "--kv-prefill-s-per-token", "0.00001"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    prompt = tok.encode(tok.apply_chat_template([{"role": "system", "content": "You are a retail agent."},
                                                 {"role": "user", "content": "Hello, I need help with an order."}],
                                                tokenize=False, add_generation_prompt=True), add_special_tokens=False)

    async def run() -> tuple[list[dict], dict]:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 120
            while True:
                try:
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                await asyncio.sleep(0.2)
            outs = [await _gen(s, url, prompt)]
            outs += await asyncio.gather(*[_gen(s, url, prompt) for _ in range(7)])
            return outs, await _metrics(s, url)

    try:
        outs, m = asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    n = len(prompt)
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [0] + [n] * 7
    assert m["sglang:prompt_tokens_total"] == 8 * n and m["sglang:cached_tokens_total"] == 7 * n
    assert m["sglang:cache_hit_rate"] == pytest.approx(7 / 8)
    assert m["sglang:num_requests_total"] == 8
    assert m["sglang:generation_tokens_total"] == sum(len(o["output_ids"]) for o in outs)


def test_gold_replay_thinks_before_it_answers(tok):
    from rollout.core.formats.hermes import parse_turn
    from rollout.devtools.local.backend_api import SamplingParams
    from rollout.devtools.local.gold import GoldReplayBackend

    plain = GoldReplayBackend("retail", tok)
    thinking = GoldReplayBackend("retail", tok, think_tokens=100)
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    a = [t for t, _ in plain.generate(prompt, SamplingParams())]
    b = [t for t, _ in thinking.generate(prompt, SamplingParams())]
    text = tok.decode(b, skip_special_tokens=False)
    assert text.startswith("<think>\n") and "</think>\n\n" in text
    assert b[-len(a):] == a  # the same answer after the reasoning block
    turn = parse_turn(tok.decode(b[:-1], skip_special_tokens=False))  # the client reads it as reasoning + the answer
    assert turn.content == parse_turn(tok.decode(a[:-1], skip_special_tokens=False)).content
    head = len(tok.encode("<think>\n", add_special_tokens=False)) + len(tok.encode("\n</think>\n\n", add_special_tokens=False))
    assert len(b) - len(a) == 100 + head
    with pytest.raises(ValueError):
        GoldReplayBackend("retail", tok, think_tokens=-1)
