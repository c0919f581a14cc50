"""The preflight with policy.engine=vllm: against the session's real vLLM stack it passes and reports
the served model; a config naming the wrong engine fails there; a worker whose log-probs are the raw
model's (vLLM's default --logprobs-mode) or that lacks the RL routes (no VLLM_SERVER_DEV_MODE) is
refused in one line naming the worker and the flag (a stand-in answering the recorded
/server_info with the mode changed: the session's servers run processed_logprobs)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rollout.app.preflight import PreflightError, check_engine_servers, run_preflight
from rollout.core.config import load_config

pytestmark = pytest.mark.timeout(300, func_only=True)  # the test alone: the session's vLLM stack starts in set-up, untimed

SERVER_INFO = json.loads((Path(__file__).resolve().parents[1] / "support" / "data" / "vllm" / "server_info.json").read_text())["body"]


def _cfg(router_url: str, tmp_path, *overrides: str):
    return load_config(None, [f"policy.router_url={router_url}", "policy.engine=vllm", f"rollout.output_dir={tmp_path}/out",
                              *overrides])


def test_the_preflight_passes_against_real_vllm_and_reports_the_served_model(vllm_stack, tmp_path):
    out = run_preflight(_cfg(vllm_stack.router_url, tmp_path, "policy.sampling.temperature=0.7", "policy.sampling.top_p=0.9"))
    info = out["model_info"]
    assert info["logprobs_mode"] == "processed_logprobs" and info["workers"] == len(vllm_stack.worker_urls) == 2
    assert info["model_path"] == str(vllm_stack.checkpoints["v1"]) and info["served_model_name"] == vllm_stack.served_model_name
    assert info["weight_version"] == "default"  # what vLLM starts with
    with pytest.raises(PreflightError, match="serves no model info"):  # SGLang's wire against vllm-router
        run_preflight(_cfg(vllm_stack.router_url, tmp_path, "policy.engine=sglang"))


async def _stand_in(mode: str | None):
    """A router and its one worker on one port: /workers, /server_info (the recorded answer with
    ``logprobs_mode`` = ``mode``; ``None``: 404, as without VLLM_SERVER_DEV_MODE), /weight_info."""
    server: TestServer

    async def workers(_):
        return web.json_response({"workers": [{"url": str(server.make_url("")).rstrip("/"), "is_healthy": True}]})

    async def server_info(_):
        if mode is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        body = copy.deepcopy(SERVER_INFO)
        body["vllm_config"]["model_config"]["logprobs_mode"] = mode
        return web.json_response(body)

    async def weight_info(_):
        return web.json_response({"weight_version": "default"})

    app = web.Application()
    app.router.add_get("/workers", workers)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/weight_info", weight_info)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.mark.parametrize("mode, sampling, refused", [
    ("raw_logprobs", ["policy.sampling.temperature=0.7"], "runs --logprobs-mode raw_logprobs: its log-probs are not those"),
    ("raw_logprobs", ["policy.sampling.top_k=20"], "runs --logprobs-mode raw_logprobs"),
    ("raw_logprobs", ["policy.sampling.temperature=1.0"], None),  # plain sampling: raw = processed
    ("processed_logprobs", ["policy.sampling.temperature=0.7"], None),
    (None, [], "start vLLM with VLLM_SERVER_DEV_MODE=1"),
])
def test_a_worker_that_cannot_report_the_sampled_distribution_is_refused_in_one_line(tmp_path, mode, sampling, refused):
    async def main():
        server = await _stand_in(mode)
        url = str(server.make_url("")).rstrip("/")
        try:
            return url, await check_engine_servers(_cfg(url, tmp_path, *sampling), None, 10.0)
        except PreflightError as e:
            return url, e
        finally:
            await server.close()

    url, got = asyncio.run(main())
    if refused is None:
        assert got["logprobs_mode"] == mode and got["model_path"] == SERVER_INFO["vllm_config"]["model_config"]["model"]
    else:
        assert isinstance(got, PreflightError) and refused in str(got) and "\n" not in str(got)
        assert str(got).startswith("policy.engine=vllm: ") and url in str(got)
        if mode is not None:
            assert str(got).endswith("start it with --logprobs-mode processed_logprobs")
