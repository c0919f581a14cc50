"""Issue 8's event-loop and memory items, on real parts.

* The tokenizer loads without importing torch, and is the tokenizer ``AutoTokenizer`` gives: same
  class, ids, chat-template renders and special tokens (checked in fresh processes).
* The episode loop never waits on the chat template's tokenizer lock: a thread holds it while a
  real episode (real tau2 retail environment, scripted policy server, real tokenizer) decodes its
  turn, and a probe coroutine keeps running on the loop meanwhile.
* Tokenizer calls have a timeout (``policy.tokenize_timeout_s``); a call past it ends the episode
  ``policy_error`` with termination reason ``tokenize_timeout``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.scripted_policy import ScriptedPolicyServer
from support.waits import until

from rollout.core.config import ConfigError, load_config
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.tokenizer import builtin_qwen3_path, declared_class_name
from rollout.core.worker import RolloutWorker

ROOT = Path(__file__).resolve().parents[2]
GOODBYE = "Thank you for contacting us, goodbye."

# Runs in a fresh interpreter: loads our way, notes whether torch got imported, then loads
# AutoTokenizer's way and prints what both give.
_COMPARE = r'''
import json, sys
from rollout.core.tokenizer import load_tokenizer, resolve_tokenizer_path
name = sys.argv[1]
ours = load_tokenizer(name)
torch_after_ours = "torch" in sys.modules
TOOLS = [{"type": "function", "function": {"name": "get_order_details", "description": "Order by id.",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]
CONVO = [
    {"role": "system", "content": "You are a retail agent."},
    {"role": "user", "content": "Où est ma commande #W123 ? 我的订单在哪里？"},
    {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\n", "tool_calls": [
        {"type": "function", "function": {"name": "get_order_details", "arguments": {"order_id": "#W123"}}}]},
    {"role": "tool", "content": '{"order_id": "#W123", "status": "pending", "price": 49.67}'},
    {"role": "assistant", "content": "It is pending. Anything else?"},
    {"role": "user", "content": "No thanks ###STOP###"},
]
TEXTS = ["hello world", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<tool_call>\n{\"a\": 1}\n</tool_call>",
         "  leading and trailing  \n\n", "emoji 🎉 and ünïcödé and 中文", "<|endoftext|><think>x</think>", "\t\r\n" * 3]

def fingerprint(tok):
    out = {"class": type(tok).__module__ + "." + type(tok).__name__, "len": len(tok), "chat_template": tok.chat_template,
           "all_special_tokens": list(tok.all_special_tokens), "all_special_ids": list(tok.all_special_ids),
           "named": {k: [getattr(tok, k, None), getattr(tok, k + "_id", None)] for k in ("eos_token", "pad_token", "bos_token", "unk_token")},
           "added": {str(i): [t.content, t.special] for i, t in sorted(tok.added_tokens_decoder.items())},
           "ids": [tok.encode(t, add_special_tokens=False) for t in TEXTS],
           "ids_default": [tok(t)["input_ids"] for t in TEXTS],
           "decode": tok.decode(list(range(0, len(tok), 997)) + list(tok.all_special_ids), skip_special_tokens=False)}
    renders = []
    for kw in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        for tools in (None, TOOLS):
            for n, gen in ((2, True), (4, True), (6, True), (5, False)):
                renders.append(tok.apply_chat_template(CONVO[:n], tools=tools, tokenize=False, add_generation_prompt=gen, **kw))
    out["renders"] = renders
    r = tok.apply_chat_template(CONVO, tools=TOOLS, tokenize=True, add_generation_prompt=True)
    out["render_ids"] = list(r["input_ids"] if hasattr(r, "keys") else r)
    return out

fp_ours = fingerprint(ours)
from transformers import AutoTokenizer
ref = AutoTokenizer.from_pretrained(resolve_tokenizer_path(name))
print("RESULT " + json.dumps({"torch_after_ours": torch_after_ours, "torch_after_auto": "torch" in sys.modules,
                              "ours": fp_ours, "auto": fingerprint(ref)}))
'''


def _compare_in_fresh_process(name: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _COMPARE, name], capture_output=True, text=True, cwd=ROOT, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def _assert_same_tokenizer(res: dict) -> None:
    ours, auto = res["ours"], res["auto"]
    assert ours.keys() == auto.keys()
    for key in ours:  # one key at a time, so that a failure names what differs
        assert ours[key] == auto[key], key
    assert res["torch_after_ours"] is False  # loading ours did not import torch...
    assert res["torch_after_auto"] is True  # ...which AutoTokenizer does here (torch is installed)


def test_builtin_tokenizer_loads_without_torch_and_equals_autotokenizer():
    assert declared_class_name(str(builtin_qwen3_path())) == "Qwen2Tokenizer"  # the torch-free way applies
    res = _compare_in_fresh_process("builtin:qwen3")
    _assert_same_tokenizer(res)
    assert res["ours"]["named"]["eos_token"] == ["<|im_end|>", 151645]
    assert len(res["ours"]["renders"]) == 24 and len(res["ours"]["render_ids"]) > 100


@pytest.mark.slow
def test_model_folder_with_config_json_takes_autotokenizers_class_without_torch(tmp_path):
    """A model folder (config.json with a model_type) lets AutoTokenizer pick another class than
    tokenizer_config.json names: a child process asks it, this process still imports no torch."""
    folder = tmp_path / "model"
    shutil.copytree(builtin_qwen3_path(), folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                                    "vocab_size": 151936}))
    assert declared_class_name(str(folder)) is None  # not the declared way: resolved in a child
    res = _compare_in_fresh_process(str(folder))
    _assert_same_tokenizer(res)


def test_tokenize_timeout_is_a_validated_policy_key():
    assert load_config(None, ["local.enabled=true", "policy.tokenize_timeout_s=2.5"]).policy.tokenize_timeout_s == 2.5
    with pytest.raises(ConfigError, match="policy.tokenize_timeout_s"):
        load_config(None, ["local.enabled=true", "policy.tokenize_timeout_s=0"])


# -- the episode loop and the tokenizer lock ------------------------------------------------------------
class _LockHolder:
    """Holds a chat template's tokenizer lock in a thread for ``seconds`` or until ``release`` is
    set (as a thread encoding a huge prompt would), recording when it held it and whether it let
    go because ``seconds`` ran out (``timed_out``)."""

    def __init__(self, chat, seconds: float):
        self.chat, self.seconds = chat, seconds
        self.held, self.release = threading.Event(), threading.Event()
        self.acquired_at = self.released_at = None
        self.timed_out = False

    def _run(self) -> None:
        with self.chat._lock:
            self.acquired_at = time.monotonic()
            self.held.set()
            self.timed_out = not self.release.wait(self.seconds)
            self.released_at = time.monotonic()

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()
        assert self.held.wait(10)


class _CountingLock:
    """A ``threading.Lock`` that counts the blocking acquires that had to wait (``blocked``) and
    those waiting now (``waiting``): what the chat template's tokenizer lock is swapped for."""

    def __init__(self) -> None:
        self._lock, self._meta = threading.Lock(), threading.Lock()
        self.blocked = self.waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        with self._meta:
            self.blocked += 1
            self.waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._meta:
                self.waiting -= 1

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "_CountingLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


async def _lag_probe(stop: asyncio.Event, samples: list[tuple[float, float]], period: float = 0.01) -> None:
    """Record ``(when, lag)``: how late each ``period``-second sleep of the loop woke up."""
    while not stop.is_set():
        t0 = time.monotonic()
        await asyncio.sleep(period)
        samples.append((t0, time.monotonic() - t0 - period))


def _worker(url: str, *overrides: str) -> RolloutWorker:
    cfg = load_config(None, [f"policy.router_url={url}", "env.max_steps=3", *overrides])
    return RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=2)


def _spec(retail, name: str) -> EpisodeSpec:
    return EpisodeSpec(f"loop/{name}", "retail", retail.task_ids("base")[0], f"loop/{name}", 0)


async def test_the_loop_keeps_running_while_a_thread_holds_the_tokenizer_lock_at_decode_time(tokenizer, retail):
    """The turn's answer arrives while another thread holds the tokenizer lock: the decode waits
    for it in a thread of its own, and the loop goes on. The holder lets the lock go only once the
    loop has run (three probe samples) while the decode waited: a decode that waited on the loop's
    thread would leave the holder to its 60 s limit, and the test fails on that, at any speed."""
    holder: dict[str, _LockHolder] = {}

    def script(eid, step, input_ids):
        if step == 0:  # the answer arrives while another thread encodes (holds the lock)
            holder["h"] = _LockHolder(worker.chat, 60)
            holder["h"].start()
        return GOODBYE, "eos"

    async with ScriptedPolicyServer(tokenizer, script) as server:
        worker = _worker(server.url)
        lock = worker.chat._lock = _CountingLock()
        stop, samples = asyncio.Event(), []
        probe = asyncio.ensure_future(_lag_probe(stop, samples))

        async def let_go_once_the_loop_ran_meanwhile() -> None:
            await until(lambda: "h" in holder and lock.waiting >= 1, "the decode waiting for the held lock", timeout_s=90)
            seen = len(samples)
            await until(lambda: len(samples) >= seen + 3, "the loop running while the decode waits", timeout_s=90)
            holder["h"].release.set()

        releaser = asyncio.ensure_future(let_go_once_the_loop_ran_meanwhile())
        try:
            res = await asyncio.wait_for(worker.run(_spec(retail, "decode")), 120)
            done_at = time.monotonic()
        finally:
            releaser.cancel()  # (done already, unless the holder ran to its limit)
            await asyncio.gather(releaser, return_exceptions=True)
            if "h" in holder:
                holder["h"].release.set()
            stop.set()
            await probe
            await worker.close()
    h = holder["h"]
    assert not h.timed_out, "the holder ran to its 60 s limit: the loop did not run while the decode waited for the lock"
    assert res.status is EpisodeStatus.COMPLETED, res.metadata
    # The turn's decode had to wait for the lock: the episode could not end before its release.
    assert res.metadata["turns"] == 1 and res.messages[2]["content"] == GOODBYE
    assert lock.blocked >= 1 and done_at >= h.released_at


async def test_a_tokenizer_call_past_its_timeout_is_a_typed_infrastructure_failure(tokenizer, retail):
    holder: dict[str, _LockHolder] = {}

    # The holders keep the lock up to 60 s, released once their episode has ended: however slow
    # the machine, the episode finds the lock taken; a timeout that did not work would wait on
    # the lock and run into the 30 s limits.
    def script(eid, step, input_ids):
        if eid.endswith("decode"):  # the lock is taken while the turn is generated
            holder["h"] = _LockHolder(worker.chat, 60)
            holder["h"].start()
        return GOODBYE, "eos"

    async with ScriptedPolicyServer(tokenizer, script) as server:
        worker = _worker(server.url, "policy.tokenize_timeout_s=0.5")
        worker.settings = dataclasses.replace(worker.settings, tokenize_timeout_s=worker.policy_cfg.tokenize_timeout_s)
        first = _LockHolder(worker.chat, 60)  # the first prompt cannot be encoded in time
        try:
            first.start()
            at_prompt = await asyncio.wait_for(worker.run(_spec(retail, "prompt")), 30)
            first.release.set()
            while first.released_at is None:
                await asyncio.sleep(0.05)
            at_decode = await asyncio.wait_for(worker.run(_spec(retail, "decode")), 30)
        finally:
            first.release.set()
            if "h" in holder:
                holder["h"].release.set()
            await worker.close()
    for res in (at_prompt, at_decode):
        assert res.status is EpisodeStatus.POLICY_ERROR and res.status.is_infrastructure_failure, res.metadata
        assert res.metadata["termination_reason"] == "tokenize_timeout"
        assert "policy.tokenize_timeout_s" in res.metadata["error"]
    assert at_prompt.trajectory is None
    # the turn was generated (mask 1) before its decode timed out
    assert at_decode.metadata["requests"] == 1 and sum(at_decode.trajectory.loss_mask) > 0


def test_tune_actor_process_freezes_what_is_loaded_and_a_plain_worker_leaves_the_process_alone():
    """tune_actor_process changes process-wide state, so it runs in a child here (as in an actor)."""
    code = (
        "import gc, json, sys\n"
        "from rollout.core.loop_health import tune_actor_process\n"
        "kept = [[i] for i in range(100_000)]  # lists are always tracked by the collector\n"
        "r = tune_actor_process(0.002)\n"
        "print(json.dumps({**r, 'count': gc.get_freeze_count(), 'tracked': len(gc.get_objects()),\n"
        "                  'interval': sys.getswitchinterval()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["frozen"] == r["count"] >= 100_000  # the loaded objects are frozen ...
    assert r["tracked"] < 10_000  # ... so a full collection no longer walks them
    assert r["interval"] == r["switch_interval_s"] == 0.002
    import inspect

    from rollout.core.worker import RolloutWorker

    # only the pool's actors (own_process=True) settle; a worker built in a caller's process does not
    assert inspect.signature(RolloutWorker).parameters["own_process"].default is False
