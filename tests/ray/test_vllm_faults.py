"""Faults on the real vLLM (the session's stack: 2 CPU servers behind vllm-router), through the
pool's trainer API: a server SIGKILLed mid-run and brought back, and calls aborted by a pause
(a weight update) and continued. Every episode ends with a typed status and is delivered exactly
once (re-runs of group members under new ids); continued turns stay exact per weight version."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from rollout.core.config import load_config
from rollout.core.groups import Excluded
from rollout.core.records import EpisodeStatus
from rollout.core.telemetry import promtext
from rollout.devtools.local.vllm.processes import http_json

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(2400)]

TASKS = ["0", "1", "2", "3"]


def _cfg(stack, *overrides: str):
    return load_config(None, [
        f"policy.router_url={stack.router_url}", "policy.engine=vllm", "policy.tokenizer=builtin:qwen3", "policy.chat_format=hermes",
        "policy.sampling.temperature=0.7", "policy.sampling.max_new_tokens=160", "policy.on_length=keep", "policy.max_request_retries=6",
        "env.max_steps=3", "rollout.n_samples_per_task=2", "rollout.partial_rollout=continue",
        "pool.num_actors=1", "pool.max_concurrent_episodes=8", "pool.num_cpus_per_actor=0.5", *overrides])


def _metric(url: str, name: str) -> int:
    """The sum of a vLLM server's ``name`` series (a gauge or a counter) on ``/metrics``."""
    _, text = http_json("GET", url + "/metrics", timeout=10)
    return int(promtext.total(promtext.parse(str(text), "vllm:", strict=False), name))


def _running(url: str) -> int:
    return _metric(url, "vllm:num_requests_running")


def _sampled(stack) -> int:
    return sum(_metric(u, "vllm:generation_tokens_total") for u in stack.worker_urls)


def _settled(stack, timeout_s: float = 120.0) -> int:
    """The servers' sampled-token total once they run nothing and it holds still for 1 s: vLLM's
    gauge and counter can lag (an earlier test's calls counted seconds later), and a reading taken
    before they settle would let a wait for this test's tokens end on those."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        now = _sampled(stack)
        if now == last and sum(_running(u) for u in stack.worker_urls) == 0:
            return now
        assert time.monotonic() < deadline, "the vLLM servers did not settle"
        last = now
        time.sleep(1.0)


def _versions(stack, version: str) -> None:
    for url in stack.worker_urls:
        status, body = http_json("POST", url + "/update_weight_version", {"new_version": version}, timeout=60)
        assert status == 200, body


def _wait(cond, what: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _drain(pool, timeout_s: float = 1500.0) -> tuple[list, list[Excluded]]:
    """Every group and every excluded sample until nothing is outstanding."""
    groups, excluded = [], []
    for item in pool.stream(timeout_s=timeout_s, excluded=True):
        (excluded if isinstance(item, Excluded) else groups).append(item)
    return groups, excluded


def _delivered_once(pool, groups, excluded) -> collections.Counter:
    ids = [s.episode_id for g in groups for s in g] + [e.sample.episode_id for e in excluded]
    counts = collections.Counter(ids)
    assert set(counts) == set(pool.submitted_ids) and set(counts.values()) == {1}, (counts, sorted(pool.submitted_ids))
    return counts


def test_a_vllm_server_killed_mid_run_and_brought_back_loses_nothing(ray_cluster, vllm_stack):
    from rollout.core.pool import RolloutPool

    stack = vllm_stack.stack
    _versions(stack, "0")
    pool = RolloutPool(_cfg(stack)).start()
    restarted: list[BaseException | None] = []
    try:
        start = _settled(stack)
        pool.submit_tasks(TASKS)
        _wait(lambda: sum(_running(u) for u in stack.worker_urls) > 0 and _sampled(stack) > start, "generation on the servers")
        victim = max(range(len(stack.worker_urls)), key=lambda i: _running(stack.worker_urls[i]))
        stack.kill_server(victim)  # SIGKILL: its calls fail, the router opens its circuit, the client retries elsewhere

        def bring_back() -> None:
            try:
                stack.restart_server(victim, weight_version="0")
                restarted.append(None)
            except BaseException as e:  # noqa: BLE001  (reported by the test below)
                restarted.append(e)

        t = threading.Thread(target=bring_back, daemon=True)
        t.start()
        groups, excluded = _drain(pool)
        t.join(timeout=1200)
    finally:
        pool.shutdown()
    assert restarted == [None], restarted
    counts = _delivered_once(pool, groups, excluded)
    statuses = collections.Counter(s.status for g in groups for s in g) + collections.Counter(e.reason for e in excluded)
    allowed = {EpisodeStatus.COMPLETED.value, EpisodeStatus.MAX_STEPS.value, EpisodeStatus.POLICY_ERROR.value}
    assert set(statuses) <= allowed | {"filtered"}, statuses
    assert len(groups) == len(TASKS)  # every group trainable in the end: failed members re-run
    assert all(len(g) == 2 for g in groups) and len(counts) >= 2 * len(TASKS)
    # the server is back: the router lists it healthy and it answers a call again
    assert stack.router.healthy_workers() == set(stack.worker_urls)
    status, body = http_json("POST", stack.worker_urls[victim] + "/inference/v1/generate", timeout=300, body={
        "token_ids": [151644, 872, 198], "sampling_params": {"max_tokens": 2, "logprobs": 0}})
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 2
    vllm_stack.reset_weights()


def _update_during_generation(stack, vllm_stack):
    """One run of 4 episodes (2 tasks x 2 samples, 2 turns of up to 2400 tokens) with a weight
    update (v1 -> v2) once the servers have sampled for them: the pause's report, the groups, the
    excluded samples, the pool's stats and the pool."""
    from rollout.core.pool import RolloutPool

    _versions(stack, "0")
    pool = RolloutPool(_cfg(stack, "policy.sampling.max_new_tokens=2400", "env.max_steps=2")).start()
    try:
        start = _settled(stack)
        pool.submit_tasks(TASKS[:2])
        # this test's calls on the engines: a call sent but not yet there when the servers pause waits
        # for the resume and runs whole on the new weights (nothing to continue)
        _wait(lambda: sum(_running(u) for u in stack.worker_urls) >= 2 and _sampled(stack) >= start + 100, "tokens sampled on the servers")
        pool.update_weights_from_disk(str(vllm_stack.checkpoints["v2"]), weight_version=1)
        met = pool.last_pause
        groups, excluded = _drain(pool)
        stats = pool.stats()
    finally:
        pool.shutdown()
        vllm_stack.reset_weights()
    return met, groups, excluded, stats, pool


def test_calls_aborted_by_a_weight_update_are_continued_exactly(ray_cluster, vllm_stack):
    from rollout.devtools.check import _sample_check
    from rollout.devtools.check_engine import transformers_model

    stack = vllm_stack.stack
    # The pause must abort a call while it generates on an engine (vLLM's pause aborts what its
    # engine runs; a call still on its way waits for the resume). Seen in runs on a loaded machine:
    # the gates closed with every episode running and no call out, or with calls out and none
    # interrupted, because the wait for "generation" ended on an earlier test's late-counted tokens.
    # So: the servers settled before the submit, few episodes with long turns (2400 tokens), the
    # update once 100 of this run's tokens are sampled with 2 calls running, and the run again (at
    # most 3 times) when no episode was continued, since such a run tests nothing.
    for attempt in range(3):
        met, groups, excluded, stats, pool = _update_during_generation(stack, vllm_stack)
        if met.generate_calls_out >= 1 and stats["episodes_continued"] >= 1:
            break
        print(f"attempt {attempt + 1}: no episode continued ({met}, {stats}); again")
    assert met.generate_calls_out >= 1 and stats["episodes_continued"] >= 1, (met, stats)
    _delivered_once(pool, groups, excluded)
    samples = [s for g in groups for s in g]
    models = {"0": transformers_model(vllm_stack.checkpoints["v1"]), "1": transformers_model(vllm_stack.checkpoints["v2"])}
    versions, worst = collections.Counter(), 0.0
    for s in samples:
        diff, _, per_version = _sample_check(models, s, 0.7)
        worst, versions = max(worst, diff), versions + per_version
    assert worst <= 1e-3 and set(versions) == {"0", "1"}, (worst, versions)
    both = [s for s in samples if {"0", "1"} <= set(v for v in s.token_weight_versions() if v)]
    assert both, "no episode carries tokens of both versions"
