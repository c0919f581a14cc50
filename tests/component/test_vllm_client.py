"""The vLLM client (rollout.core.policy.vllm) against real vLLM servers behind the real vllm-router
(the session's ``vllm_stack``: two CPU workers, consistent_hash; skipped when vLLM is not installed,
failed under TAU_ROLLOUT_REQUIRE_VLLM=1): tokens in and out with the sampling
distribution's log-probs, episodes paused mid-turn and continued (or restarted) across a weight
update, aborts of a cancelled call on every worker, routing affinity on the group key, the KV gate
reading vLLM's own metrics, the weight-update cycle (every worker reloaded, versioned, its prefix
cache reset; a bad folder refused before any worker is asked) and typed failures."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from support.ray_head import free_port
from support.retries import Attempts
from support.vllm_stack import RUN_TO_LENGTH, max_log_prob_error, wait_idle

from rollout.core.config import AdaptiveConcurrencyConfig, load_config
from rollout.core.environment import RESPOND, StepResult
from rollout.core.episode import request_id, run_episode
from rollout.core.formats import ChatTemplate
from rollout.core.policy import VLLM_WIRE, GenerationGate, PolicyServerError, VLLMAdmin, VLLMClient, WeightSyncError
from rollout.core.policy.kvgate import KVGate
from rollout.core.policy.kvreadings import WorkerReader
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.settings import EpisodeSettings
from rollout.core.telemetry import promtext

pytestmark = pytest.mark.timeout(600, func_only=True)  # the test alone: the session's vLLM stack starts in set-up, untimed

# Qwen3 chat: system + user, then the assistant's generation prompt
PROMPT = [151644, 872, 198, 9707, 11, 1128, 374, 279, 9104, 30, 151645, 198, 151644, 77091, 198]


@pytest.fixture(autouse=True)
def _stack_put_back(vllm_stack):
    """Every test leaves the session's stack as it found it: the first weights, version
    ``default``, prefix caches empty, not paused."""
    yield
    vllm_stack.reset_weights()


def _policy(stack, *overrides: str):
    return load_config(None, ["local.enabled=true", "local.backend=vllm", f"policy.router_url={stack.router_url}", "policy.engine=vllm",
                              "policy.max_request_retries=1", *overrides]).policy


async def _metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with session.get(url + "/metrics") as r:
        samples = promtext.parse(await r.text(), "vllm:", strict=False)
    return sum(s.value for s in promtext.select(samples, name) if all(s.labels.get(k) == v for k, v in labels.items()))


# -- tokens in, tokens out -------------------------------------------------------------------------
def test_generate_returns_the_sampled_ids_with_the_sampling_distribution_s_log_probs(vllm_stack):
    """At temperature 0.7 and top-k 20 the rollout log-probs are those of the distribution sampled
    from (--logprobs-mode processed_logprobs), checked against a transformers forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    async def main():
        async with aiohttp.ClientSession() as s:
            client = VLLMClient(_policy(vllm_stack, "policy.sampling.temperature=0.7", "policy.sampling.top_k=20"), s)
            a = await client.generate(PROMPT, 24, rid="gen@0#0", routing_key="gen", seed=11)
            b = await client.generate(PROMPT, 24, rid="gen@0#1", routing_key="gen", seed=11)
            return a, b

    a, b = asyncio.run(main())
    assert len(a.ids) == len(a.log_probs) == 24 and a.finish_type == "length" and a.ids == b.ids  # seeded: the same ids
    assert a.meta["request_id"] == "generate-tokens-gen@0#0" and a.weight_spans is None
    model = AutoModelForCausalLM.from_pretrained(vllm_stack.checkpoints["v1"], dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + a.ids])).logits[0, len(PROMPT) - 1:-1].double() / 0.7
    top = logits.topk(20, dim=-1)
    masked = torch.full_like(logits, float("-inf")).scatter(-1, top.indices, top.values)
    want = torch.log_softmax(masked, -1).gather(-1, torch.tensor(a.ids)[:, None])[:, 0]
    diff = (want - torch.tensor(a.log_probs, dtype=torch.float64)).abs().max().item()
    print(f"max |dlogp| vs transformers (T=0.7, top_k=20, 24 tokens): {diff:.2e}")
    assert diff < 1e-3


# -- episodes across a pause and a weight update -----------------------------------------------------
class _Env:
    """Every assistant turn (random text: a parse error, or a reply) gets a user turn back."""

    timings: dict[str, float] = {}

    async def reset(self, task_id: str):
        return "Where is my order?", {}

    async def step(self, action):
        return StepResult("Go on.", role="user", done=False) if action.name == RESPOND else StepResult("{}", role="tool")


TURN = 2000  # tokens of each first turn (run to length): the pause comes while both run, seconds after they start


async def _running(s: aiohttp.ClientSession, stack) -> int:
    """Requests the engines run now (``vllm:num_requests_running`` over the workers)."""
    return int(sum([await _metric(s, u, "vllm:num_requests_running") for u in stack.worker_urls]))


async def _until_running(s: aiohttp.ClientSession, stack, n: int, out) -> int:
    """Poll the engines until they run ``n`` requests or ``out()`` stops holding (the calls are no
    longer all out on the client); returns the last reading."""
    seen = 0
    while out() and (seen := await _running(s, stack)) < n:
        await asyncio.sleep(0.05)
    return seen


async def _episodes_across_an_update(stack, tokenizer, partial_rollout: str):
    """Two episodes on the real servers whose first turns run to length (``TURN`` tokens); once
    the engines run both first calls, the pool's cycle: gates closed, every worker paused (abort),
    reloaded with the second checkpoint as version 1, resumed, gates opened. Returns the results,
    whether both first calls were running on the engines and unanswered when the gate closed, the
    paused workers and their versions after the reload."""
    cfg = _policy(stack, "policy.sampling.temperature=0.8")
    settings = EpisodeSettings(max_steps=2, max_new_tokens=TURN, max_context_tokens=12000, on_parse_error="feedback",
                               system_prompt="You are an agent.", tool_names=("lookup",), partial_rollout=partial_rollout, stop=())
    chat = ChatTemplate(tokenizer, None)
    specs = [EpisodeSpec(f"ep{i}", "toy", "0", f"g{i}", 0, seed=i) for i in range(2)]
    first = {sp.episode_id: request_id(sp, 0) for sp in specs}  # the first calls, out on the client
    async with aiohttp.ClientSession() as s:
        gate = GenerationGate()
        client = VLLMClient(cfg, s, gate=gate, wire=RUN_TO_LENGTH)
        admin = VLLM_WIRE.admin(stack.router_url, s)
        await asyncio.to_thread(wait_idle, stack.worker_urls)  # an earlier run's calls would count as running
        await admin.set_weight_version("0")
        tasks = [asyncio.ensure_future(run_episode(sp, _Env(), client, chat, settings)) for sp in specs]
        try:
            while client.inflight != first and not any(t.done() for t in tasks):
                await asyncio.sleep(0.05)
            seen = await _until_running(s, stack, 2, lambda: client.inflight == first)
            caught = seen >= 2 and client.inflight == first  # read with nothing awaited before the gate closes
            gate.close()
            urls = await admin.pause("abort")
            await admin.update_weights_from_disk(stack.checkpoints["v2"], "1", urls)
            versions = await admin.weight_versions()
            await admin.resume(urls)
            gate.open()
            results = await asyncio.gather(*tasks)
        finally:
            await admin.resume()
    return results, caught, urls, versions


def _check_across_an_update(res, partial_rollout: str, weights: dict) -> int:
    """The invariants of one episode of :func:`_episodes_across_an_update`, whatever the pause met:
    a typed status, a consistent trajectory, every sampled token's log-prob that of the weights
    its version names, and an interrupted turn continued or restarted as ``partial_rollout`` says.
    Returns the tokens the old weights sampled before the pause (kept or discarded)."""
    traj, m = res.trajectory, res.metadata
    assert res.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED, EpisodeStatus.MAX_STEPS), m.get("error")
    traj.check()
    versions, spans, p = traj.weight_versions, traj.generation_spans, len(traj.prompt_ids)
    sampled = [(i, v) for (a, b), v in zip(spans, versions) for i in range(a, b)]
    diff = max_log_prob_error(weights, traj.tokens, [p + i for i, _ in sampled], [v for _, v in sampled],
                              [traj.rollout_log_probs[i] for i, _ in sampled], 0.8)
    assert diff < 1e-3, f"{res.spec.episode_id}: max |dlogp| {diff:.2e} against the weights of the versions its tokens carry"
    if m["interruptions"] == 0:  # every call answered whole, each on one weight version
        assert m["interrupted_turns"] == 0 and all(v in ("0", "1") for v in versions), versions
        return 0
    assert m["interruptions"] == 1 and m["interrupted_turns"] == 1, m
    k = versions.index("1")  # the first call on the new weights; the one before it was interrupted
    assert versions[k:] == ["1"] * (len(versions) - k)
    # before: the old weights' calls; the interrupted one reports no version if it was cut before its first token
    assert all(v == "0" or (v is None and a == b) for v, (a, b) in zip(versions[:k], spans[:k]))
    (a, b), (c, _) = spans[k - 1], spans[k]
    if partial_rollout == "continue":
        assert m["continued_turns"] == 1 and b == c  # the old weights' tokens kept (mask 1); the turn goes on where it was cut
        assert all(traj.loss_mask[a:b])
        return b - a
    assert m["restarted_turns"] == 1 and m["discarded_tokens"] > 0
    assert a == b == c  # the interrupted call's tokens discarded; the turn sampled again from its start
    return m["discarded_tokens"]


@pytest.mark.parametrize("partial_rollout", ["continue", "restart_turn"])
def test_a_turn_paused_by_a_weight_update_is_continued_or_restarted_on_the_new_weights(vllm_stack, tokenizer, partial_rollout):
    # Both first turns run to length (TURN tokens) and the gate closes once the engines run both
    # calls: the pause must then interrupt both. A run where a call was answered (or never counted
    # running on an engine) before the gate closed did not meet that and runs again, from the v1
    # weights and version "0"; every run's episodes are checked first.
    weights = {"0": vllm_stack.checkpoints["v1"], "1": vllm_stack.checkpoints["v2"]}
    tries = Attempts(3, "both first calls running on the engines when the pause comes")
    for _ in tries:
        vllm_stack.reset_weights()
        try:
            results, caught, urls, versions = asyncio.run(_episodes_across_an_update(vllm_stack, tokenizer, partial_rollout))
        finally:
            vllm_stack.reset_weights()
        assert len(urls) == len(vllm_stack.worker_urls) == 2  # every worker paused
        assert versions == {u: "1" for u in urls}  # every worker, not the one the router would forward to
        kept = sum(_check_across_an_update(res, partial_rollout, weights) for res in results)
        if not caught:
            tries.not_met(f"the first calls were not both running on the engines and unanswered at the pause: "
                          f"{[(r.metadata.get('interruptions'), r.metadata.get('generated_tokens')) for r in results]}")
            continue
        break
    # both calls were running when the pause came: each was interrupted, and its turn continued or restarted
    assert [r.metadata["interruptions"] for r in results] == [1, 1], [r.metadata for r in results]
    print(f"{partial_rollout}: {kept} tokens sampled by the old weights before the pause ({'kept' if partial_rollout == 'continue' else 'discarded'})")
    assert kept > 0


# -- aborts ----------------------------------------------------------------------------------------
LONG_CALL = 12000  # run to length: minutes of work for an engine on this CPU, near the stack's 16384-token context


def test_a_cancelled_call_is_aborted_on_the_servers_and_an_abort_by_id_returns_the_partial_ids(vllm_stack):
    async def sampled(s: aiohttp.ClientSession) -> float:
        return sum([await _metric(s, u, "vllm:generation_tokens_total") for u in vllm_stack.worker_urls])

    async def started(s: aiohttp.ClientSession, client: VLLMClient, key: str) -> tuple[asyncio.Future, bool, float]:
        """A call of ``LONG_CALL`` tokens on idle engines; whether an engine ran it, unanswered,
        when this returns; the engines' sampled tokens before it."""
        await asyncio.to_thread(wait_idle, vllm_stack.worker_urls)  # the gauge and the token counter are recorded together
        before = await sampled(s)
        call = asyncio.ensure_future(client.generate(PROMPT, LONG_CALL, rid=f"{key}@0#0", routing_key=key))
        seen = await _until_running(s, vllm_stack, 1, lambda: not call.done())
        return call, seen >= 1 and not call.done(), before

    async def abort_by_id(s: aiohttp.ClientSession, client: VLLMClient):
        """An abort by request id, sent to every worker as a cancelled episode's is (RolloutWorker.cancel)."""
        call, running, _ = await started(s, client, "ab")
        accepted = await client.admin.abort(client.inflight.get("ab", "ab@0#0"))
        return running, accepted, await asyncio.wait_for(call, 600)

    async def cancel(s: aiohttp.ClientSession, client: VLLMClient):
        """A cancelled call: its connection drops and vLLM stops the request (the engines then run
        nothing, having sampled fewer than its tokens)."""
        call, running, before = await started(s, client, "cx")
        call.cancel()
        while await _running(s, vllm_stack):
            await asyncio.sleep(0.2)
        return running, await sampled(s) - before

    async def main():
        async with aiohttp.ClientSession() as s:
            client = VLLMClient(_policy(vllm_stack), s, wire=RUN_TO_LENGTH)
            return await abort_by_id(s, client), await cancel(s, client)

    # each call runs to length (LONG_CALL tokens) and is aborted or cancelled once an engine runs it
    # unanswered; a run where it was answered first did not meet that and runs again
    tries = Attempts(3, "the call running on an engine when it is aborted and when it is cancelled")
    for _ in tries:
        (ran, accepted, gen), (ran_cx, dropped) = asyncio.run(main())
        assert accepted == 2  # every worker took the abort (the router would have forwarded it to one)
        assert len(gen.log_probs) == len(gen.ids) <= LONG_CALL and 0 < dropped <= LONG_CALL
        if not (ran and ran_cx):
            tries.not_met(f"answered before the abort ({ran}, {gen.finish_type}) or the cancel ({ran_cx})")
            continue
        break
    assert gen.finish_type == "abort" and not gen.interrupted and 0 < len(gen.ids) < LONG_CALL
    print(f"aborted call: {len(gen.ids)} tokens; cancelled call: {dropped} tokens sampled before the engine dropped it")
    assert dropped < LONG_CALL


# -- routing ---------------------------------------------------------------------------------------
def test_a_group_key_stays_on_one_worker_through_vllm_router(vllm_stack):
    """policy.routing=group sends X-Session-ID: the group id; vllm-router's consistent_hash keeps
    every call of a group on one worker (read from each worker's finished-request counter)."""

    async def main():
        async with aiohttp.ClientSession() as s:
            client = VLLMClient(_policy(vllm_stack, "policy.routing=group"), s)
            placed: dict[str, set[str]] = {}
            for rep in range(3):
                for g in range(16):
                    eid = f"task{g}/{rep}"
                    client.groups[eid] = f"task{g}"  # the worker registers each episode's group
                    before = {u: await _metric(s, u, "vllm:request_success_total") for u in vllm_stack.worker_urls}
                    await client.generate(PROMPT + [g, rep], 2, rid=f"{eid}@0#0", routing_key=eid)
                    after = {u: await _metric(s, u, "vllm:request_success_total") for u in vllm_stack.worker_urls}
                    placed.setdefault(f"task{g}", set()).update(u for u in vllm_stack.worker_urls if after[u] > before[u])
            return placed

    placed = asyncio.run(main())
    assert all(len(ws) == 1 for ws in placed.values()), placed  # each group on one worker, all 3 times
    used = {next(iter(ws)) for ws in placed.values()}
    print(f"16 groups x 3 calls: {sorted((g, next(iter(w))[-5:]) for g, w in placed.items())}")
    assert used == set(vllm_stack.worker_urls)  # and the groups spread over both


# -- the KV gate -----------------------------------------------------------------------------------
def test_the_kv_gate_reads_vllm_s_metrics_and_holds_calls_while_they_run(vllm_stack):
    """The gate's marks set below what three running calls use: it closes while they run and
    opens once they are gone, reading vllm:kv_cache_usage_perc and the KV size label."""

    async def main():
        async with aiohttp.ClientSession() as s:
            admin = VLLM_WIRE.admin(vllm_stack.router_url, s)
            cfg = AdaptiveConcurrencyConfig(enabled=True, poll_interval_s=0.1, placement="router", high_water=1e-6, low_water=5e-7)
            gate = KVGate(cfg, s, list_workers=admin.worker_health, metrics=VLLM_WIRE.kv_metrics)
            client = VLLMClient(_policy(vllm_stack), s, wire=RUN_TO_LENGTH)
            try:
                await asyncio.to_thread(wait_idle, vllm_stack.worker_urls)
                idle = await gate.poll_once()
                reader = WorkerReader(s, 2.0, metrics=VLLM_WIRE.kv_metrics)
                sizes = {u: (await reader.read(u)).kv_tokens for u in vllm_stack.worker_urls}
                calls = [asyncio.ensure_future(client.generate(PROMPT, LONG_CALL, rid=f"kv{i}@0#0", routing_key=f"kv{i}")) for i in range(3)]
                seen = await _until_running(s, vllm_stack, 3, lambda: not any(c.done() for c in calls))
                running = seen >= 3 and not any(c.done() for c in calls)
                busy = await gate.poll_once()  # the engines' readings while the three calls run
                closed = gate.closed
                await admin.abort()  # every call on every worker: nothing to wait for
                await asyncio.gather(*calls)
                t0 = time.monotonic()
                while gate.closed and time.monotonic() - t0 < 120:  # the KV freed, as the engines report it
                    await gate.poll_once()
                    await asyncio.sleep(0.1)
                return running, idle, sizes, busy, closed, gate.closed, gate.stats()
            finally:
                gate.close()

    tries = Attempts(3, "three calls running on the engines when the gate reads them")
    for _ in tries:
        running, idle, sizes, busy, closed, still_closed, stats = asyncio.run(main())
        assert idle == 0.0 and all(v is not None and v >= 128 for v in sizes.values())  # kv_cache_size_tokens, a multiple of the block size
        assert not still_closed, stats  # open again once the calls are gone
        if not running:
            tries.not_met("a call was answered before the engines counted three running")
            continue
        break
    print(f"KV usage idle {idle} -> busy {busy}; KV sizes {sizes}; {stats['holds']} hold(s)")
    assert busy is not None and busy > 0
    assert stats["token_cap"] is not None and closed and stats["holds"] >= 1


# -- the weight-update cycle -----------------------------------------------------------------------
def test_update_weights_reloads_versions_and_resets_the_prefix_cache_on_every_worker(vllm_stack, tmp_path):
    long_prompt = PROMPT + list(range(1000, 1600))  # 615 tokens: 4 full KV blocks of 128 to cache

    async def main():
        async with aiohttp.ClientSession() as s:
            client = VLLMClient(_policy(vllm_stack, "policy.sampling.temperature=0"), s)
            admin: VLLMAdmin = VLLM_WIRE.admin(vllm_stack.router_url, s)
            with pytest.raises(WeightSyncError, match="holds no config.json"):
                await admin.update_weights_from_disk(str(tmp_path), "9")  # refused here: a failed reload kills vLLM
            await admin.set_weight_version("0")
            first = await client.generate(long_prompt, 8, rid="wu@0#0", routing_key="wu")
            hits = sum([await _metric(s, u, "vllm:prefix_cache_hits_total") for u in vllm_stack.worker_urls])
            try:
                answers = await admin.update_weights_from_disk(vllm_stack.checkpoints["v2"], "7")
                versions = await admin.weight_versions()
                second = await client.generate(long_prompt, 8, rid="wu@0#1", routing_key="wu")
                hits_after = sum([await _metric(s, u, "vllm:prefix_cache_hits_total") for u in vllm_stack.worker_urls])
            finally:
                await admin.update_weights_from_disk(vllm_stack.checkpoints["v1"], "0")
            third = await client.generate(long_prompt, 8, rid="wu@0#2", routing_key="wu")
            return first, second, third, answers, versions, hits, hits_after

    first, second, third, answers, versions, hits, hits_after = asyncio.run(main())
    assert set(answers) == set(versions) == set(vllm_stack.worker_urls) and set(versions.values()) == {"7"}
    assert (first.weight_version, second.weight_version, third.weight_version) == ("0", "7", "0")
    assert second.ids != first.ids and third.ids == first.ids  # greedy: the new weights, then the first ones again
    assert hits_after == hits  # the prompt cached under the old weights was not reused


# -- typed failures --------------------------------------------------------------------------------
def test_failures_are_typed(vllm_stack):
    async def main():
        async with aiohttp.ClientSession() as s:
            client = VLLMClient(_policy(vllm_stack), s)
            limit = (await VLLM_WIRE.admin(vllm_stack.router_url, s).server_info())[vllm_stack.worker_urls[0]]["max_model_len"]
            with pytest.raises(PolicyServerError, match=r"/inference/v1/generate answered 400: .*longer than the maximum model length"):
                await client.generate(list(range(1000, 1001 + limit)), 4, rid="long@0#0", routing_key="long")  # a 4xx is not retried
            retries = client.retries
            down = VLLMClient(_policy(vllm_stack, f"policy.router_url=http://127.0.0.1:{free_port()}", "policy.backend_outage_timeout_s=1"), s)
            down.breaker.arm()
            t0 = time.monotonic()
            with pytest.raises(PolicyServerError, match="unreachable"):
                await down.generate(PROMPT, 4, rid="down@0#0", routing_key="down")
            return retries, time.monotonic() - t0

    retries, waited = asyncio.run(main())
    assert retries == 0 and waited < 15


def test_the_pool_s_admin_loop_pauses_and_resumes_every_vllm_worker_in_each_mode(vllm_stack):
    """The pool's weight-update cycle runs its admin on a thread's loop (AdminLoop, as WeightSync
    does): with policy.engine=vllm each pause mode reaches every worker, and resume undoes it."""
    from rollout.core.pool.weights import AdminLoop
    from rollout.devtools.local.vllm.processes import http_json

    def paused() -> list[bool]:
        return [http_json("GET", u + "/is_paused", None, timeout=30)[1]["is_paused"] for u in vllm_stack.worker_urls]

    loop = AdminLoop(vllm_stack.router_url, timeout_s=60, engine="vllm")
    try:
        assert type(loop.admin).__name__ == "VLLMAdmin"
        seen = {}
        for mode in ("abort", "retract", "in_place"):
            urls = loop.run(lambda m=mode: loop.admin.pause(m))
            seen[mode] = paused()
            loop.run(lambda: loop.admin.resume(urls))
            assert paused() == [False, False]
        with pytest.raises(WeightSyncError, match="is not a folder here"):
            loop.admin.check_model_path("/nonexistent/weights")
    finally:
        loop.close()
    assert seen == {m: [True, True] for m in ("abort", "retract", "in_place")}


KEPT_CALL = 2000  # run to length: the pause comes seconds after the engine starts it


def test_a_call_kept_through_an_update_reports_both_versions_and_each_span_is_its_model_s(vllm_stack):
    """pause(retract) keeps the call out (vLLM preempts it, its KV recomputed on resume); reloaded
    to the second checkpoint as version 1, the call comes back with two spans, each of whose
    tokens' log-probs are a forward pass of that span's weights over the whole sequence."""

    async def main():
        async with aiohttp.ClientSession() as s:
            client = VLLMClient(_policy(vllm_stack, "policy.sampling.temperature=0.7"), s, wire=RUN_TO_LENGTH)
            admin = VLLM_WIRE.admin(vllm_stack.router_url, s)
            await asyncio.to_thread(wait_idle, vllm_stack.worker_urls)
            await admin.set_weight_version("0")
            call = asyncio.ensure_future(client.generate(PROMPT, KEPT_CALL, rid="kept@0#0", routing_key="kept", seed=5))
            seen = await _until_running(s, vllm_stack, 1, lambda: not call.done())
            running = seen >= 1 and not call.done()  # read with nothing awaited before the pause is sent
            urls = await admin.pause("retract")
            await admin.update_weights_from_disk(vllm_stack.checkpoints["v2"], "1", urls)
            await admin.resume(urls)
            return running, await asyncio.wait_for(call, 600)

    # The call runs to length and the pause comes once the engine runs it: it must then come back
    # with two spans. A run where it was answered before the pause did not meet that and runs again
    # from the first weights; every run's tokens are checked against the weights their spans name
    # first (a call that crossed the reload labelled with one version fails there).
    weights = {"0": vllm_stack.checkpoints["v1"], "1": vllm_stack.checkpoints["v2"]}
    tries = Attempts(3, "the call running on the engine when the pause comes")
    for _ in tries:
        vllm_stack.reset_weights()
        running, gen = asyncio.run(main())
        p, n = len(PROMPT), len(gen.ids)
        assert gen.finish_type == "length" and n == len(gen.log_probs) == KEPT_CALL
        spans = gen.weight_spans or [(0, n, gen.weight_version)]
        versions = [v for a, b, v in spans for _ in range(a, b)]
        diff = max_log_prob_error(weights, PROMPT + gen.ids, list(range(p, p + n)), versions, gen.log_probs, 0.7)
        assert diff < 1e-3, f"max |dlogp| {diff:.2e} against the weights of the spans {spans}"
        if not running:
            tries.not_met(f"the call's {n} tokens were answered on version {gen.weight_version} before the pause")
            continue
        break
    assert gen.weight_version == "1" and gen.weight_spans is not None, spans  # it met the update
    (a, k, v0), (k2, end, v1) = gen.weight_spans
    assert (a, k == k2, end, v0, v1) == (0, True, KEPT_CALL, "0", "1") and 0 < k < KEPT_CALL
    print(f"kept call: {k} tokens on version 0, {KEPT_CALL - k} on version 1; max |dlogp| {diff:.2e}")
