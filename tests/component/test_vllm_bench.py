"""The engine bench's plain loop (rollout.devtools.bench.engine) against the session's real vLLM
stack: it replays calls with exactly the generated-token counts asked, through vllm-router, and
resets every worker's prefix cache. (The whole bench, pool and Ray included, is
``python -m rollout.bench engine``: minutes here, so not a test; its report logic is
tests/unit/test_bench_engine.py.)"""

from __future__ import annotations

import asyncio

import pytest

from rollout.devtools.bench.engine import replay_plain, reset_prefix_caches

pytestmark = pytest.mark.timeout(300, func_only=True)  # the test alone: the session's vLLM stack starts in set-up, untimed


def test_plain_loop_replays_exact_token_counts(vllm_stack):
    prompt = list(range(1000, 1040))
    episodes = [
        [(prompt, 5, "ep-0"), (prompt + [7] * 10, 3, "ep-0")],  # two calls, one after the other
        [(prompt[:20], 8, "ep-1")],
        [(prompt[5:], 1, "ep-2")],
    ]
    out = asyncio.run(replay_plain(vllm_stack.router_url, episodes, 2, {"temperature": 0.7, "top_p": 1.0, "top_k": -1}))
    assert (out["episodes"], out["calls"], out["tokens"]) == (3, 4, 5 + 3 + 8 + 1)
    assert out["finish_reasons"] == {"length": 4}  # ignore_eos: every call ran to its max_tokens
    assert out["wall_s"] > 0


def test_plain_loop_raises_on_a_refused_call(vllm_stack):
    too_long = [[(list(range(100, 100 + 40_000)), 1, "ep-x")]]  # past --max-model-len: vLLM answers 400
    with pytest.raises(RuntimeError, match="answered 400"):
        asyncio.run(replay_plain(vllm_stack.router_url, too_long, 1, {"temperature": 1.0, "top_p": 1.0, "top_k": -1}))


def test_prefix_caches_reset_on_every_worker(vllm_stack):
    assert sorted(asyncio.run(reset_prefix_caches(vllm_stack.router_url))) == sorted(vllm_stack.worker_urls)
