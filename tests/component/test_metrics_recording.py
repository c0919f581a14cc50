"""What a worker records, without Ray: a :class:`RolloutWorker` with a
:class:`~rollout.core.telemetry.MemoryRecorder` runs real retail episodes (gold replay behind the
real sglang-router), and every figure it recorded is checked against the episodes' own records
(their requests, token spans, conversation and timings). The same worker with Ray's recorder and
Prometheus in between: tests/ray/test_metrics.py.
"""

from __future__ import annotations

import asyncio

import pytest
from support.metrics_figures import input_tokens, tool_calls, user_turns

from rollout.core.config import load_config
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.telemetry import MemoryRecorder
from rollout.core.telemetry import registry as R
from rollout.core.worker import RolloutWorker


async def test_a_worker_records_its_episodes_calls_user_turns_and_tools(retail_stack):
    cfg = load_config(None, [f"policy.router_url={retail_stack.router_url}"])
    rec = MemoryRecorder({"domain": "retail", "actor": "7"})
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=2, recorder=rec)
    try:
        # The episodes' /generate calls wait at the worker's gate until the lag probe (one sample
        # per 50 ms, started by the first run) has sampled twice while they run: gold replay can
        # end all three in under 100 ms, too soon for a second sample.
        await worker.pause_generation()
        runs = asyncio.gather(*[worker.run(EpisodeSpec(f"m/{t}", "retail", t, f"m/{t}", 0)) for t in ("0", "1", "2")])
        deadline = asyncio.get_running_loop().time() + 30
        while len(rec.observations(R.LOOP_LAG)) < 2:
            assert asyncio.get_running_loop().time() < deadline and not runs.done(), "the lag probe did not sample while the episodes ran"
            await asyncio.sleep(0.01)
        assert rec.value(R.EPISODES_RUNNING) == 2 and not runs.done()  # sampled while two ran (held), the third waiting for a slot
        await worker.resume_generation()
        results = await runs
    finally:
        await worker.resume_generation()  # a failure while they were held: let them go
        await worker.close()
    assert [r.status for r in results] == [EpisodeStatus.COMPLETED] * 3
    samples = [r.to_sample() for r in results]

    assert rec.value(R.EPISODES_STARTED) == 3
    assert rec.value(R.EPISODES_RUNNING) == 0  # the gauge's last value: all done
    # every series carries the worker's tags
    assert all(tags["domain"] == "retail" and tags["actor"] == "7" for series in rec.series().values() for tags, _ in series)

    requests = sum(r.metadata["requests"] for r in results)
    assert requests > 3
    assert rec.value(R.GENERATE_REQUESTS) == rec.value(R.GENERATE_REQUESTS, finish="stop") + rec.value(R.GENERATE_REQUESTS, finish="length") \
        + rec.value(R.GENERATE_REQUESTS, finish="abort") == requests
    assert len(rec.observations(R.GENERATE_LATENCY)) == requests
    assert all(0 < x < 30 for x in rec.observations(R.GENERATE_LATENCY))
    assert rec.value(R.GENERATE_INPUT_TOKENS) == sum(input_tokens(s) for s in samples)
    assert rec.value(R.GENERATE_OUTPUT_TOKENS) == sum(r.metadata["generated_tokens"] for r in results)
    assert rec.value(R.GENERATE_FAILURES) == rec.value(R.GENERATE_RETRIES) == rec.value(R.BACKEND_OUTAGES) == 0
    versions = {v for r in results for v in r.trajectory.weight_versions}
    assert versions == {str(retail_stack.local.weight_version)}  # what the stack was started with, a number
    assert rec.series()[R.POLICY_WEIGHT_VERSION.name] == [({"domain": "retail", "actor": "7"}, int(retail_stack.local.weight_version))]

    users = rec.observations(R.USER_LATENCY)
    assert len(users) == sum(user_turns(r.messages, r.metadata["termination_reason"]) for r in results)
    # the environment's own timings hold the same seconds (rounded to 0.1 ms per episode)
    assert sum(users) == pytest.approx(sum(r.metadata["timings"]["user_s"] for r in results), abs=1e-3)
    tools = rec.observations(R.TOOL_LATENCY)
    assert len(tools) == sum(tool_calls(r.messages) for r in results) > 0
    assert sum(tools) == pytest.approx(sum(r.metadata["timings"]["tool_s"] for r in results), abs=1e-3)
    assert rec.value(R.TOOL_ERRORS) == sum(r.metadata["tool_errors"] for r in results)
    assert rec.value(R.TOOL_TIMEOUTS) == rec.value(R.USER_ERRORS) == 0
    # the lag probe woke every 50 ms while the episodes ran
    assert len(rec.observations(R.LOOP_LAG)) >= 2 and all(x >= 0 for x in rec.observations(R.LOOP_LAG))


async def test_a_user_simulator_that_cannot_start_is_counted(retail_stack):
    """An LLM user simulator with a missing API key fails at set-up: the episode ends user_error
    and the worker counts one user error."""
    cfg = load_config(None, [f"policy.router_url={retail_stack.router_url}", "env.user.kind=llm",
                             "env.user.base_url=http://127.0.0.1:9/v1", "env.user.api_key_env=TAU_ROLLOUT_TEST_MISSING_KEY",
                             "env.user.max_retries=0", "env.user.model=openai/nobody"])
    rec = MemoryRecorder({"domain": "retail", "actor": "0"})
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=1, recorder=rec)
    try:
        res = await worker.run(EpisodeSpec("m/u", "retail", "0", "m/u", 0))
    finally:
        await worker.close()
    assert res.status is EpisodeStatus.USER_ERROR, res.metadata
    assert rec.value(R.USER_ERRORS) == 1 and rec.value(R.EPISODES_STARTED) == 1
