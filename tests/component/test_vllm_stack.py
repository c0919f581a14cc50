"""The vLLM launcher (rollout.devtools.local.vllm): the checkpoint it writes, fate sharing of what
it starts, and the session's real vLLM stack answering token ids through vllm-router with the
log-probs of a transformers forward pass of the same checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rollout.devtools.local.vllm import checkpoint_problem, write_checkpoint
from rollout.devtools.local.vllm.processes import http_json

pytestmark = pytest.mark.timeout(300, func_only=True)  # the test alone: the session's vLLM stack starts in set-up, untimed


def test_checkpoint_is_deterministic_and_kept(tmp_path):
    a = write_checkpoint(tmp_path / "a", seed=3)
    b = write_checkpoint(tmp_path / "b", seed=3)
    c = write_checkpoint(tmp_path / "c", seed=4)
    assert checkpoint_problem(a) is None
    blob = (a / "model.safetensors").read_bytes()
    assert blob == (b / "model.safetensors").read_bytes()
    assert blob != (c / "model.safetensors").read_bytes()
    cfg = json.loads((a / "config.json").read_text())
    assert (cfg["head_dim"], cfg["tie_word_embeddings"], cfg["vocab_size"], cfg["eos_token_id"]) == (64, False, 151936, 151645)
    assert "chat_template" in json.loads((a / "tokenizer_config.json").read_text())  # Qwen3's own
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    write_checkpoint(tmp_path / "a", seed=3)  # same spec: kept as it is
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime
    assert "no config.json" in checkpoint_problem(tmp_path)
    assert "not a folder" in checkpoint_problem(tmp_path / "missing")
    with pytest.raises(ValueError, match="hiden_size"):
        write_checkpoint(tmp_path / "d", seed=0, hiden_size=32)


def test_supervised_process_dies_with_its_starter(tmp_path):
    """A process started like a vLLM server (under supervise.py, own process group) is stopped when
    the process that started it is SIGKILLed."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from rollout.devtools.local.vllm.processes import _Supervised
        p = _Supervised(Path({str(tmp_path / 'child.log')!r}))
        p._spawn([sys.executable, "-c", "import time; time.sleep(600)"], dict(__import__("os").environ))
        print(p.pid, flush=True)
        time.sleep(600)
    """)
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(starter.stdout.readline())
        assert _group_alive(pgid)
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 30
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(pgid), "the supervised process outlived its starter"
    finally:
        if starter.poll() is None:
            starter.kill()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_router_serves_token_ids_with_exact_log_probs(vllm_stack):
    """Token ids in and out through vllm-router; the reported log-probs are those of the sampling
    distribution at T=0.7 (a transformers forward pass of the checkpoint, log_softmax(logits / T))."""
    import torch
    from transformers import AutoModelForCausalLM

    stack = vllm_stack.stack
    assert stack.router.healthy_workers() == set(stack.worker_urls)
    prompt = [151644, 872, 198, 9707, 11, 1128, 374, 279, 9104, 30, 151645, 198, 151644, 77091, 198]
    body = {"request_id": "launcher-t1", "token_ids": prompt,
            "sampling_params": {"temperature": 0.7, "max_tokens": 24, "seed": 5, "logprobs": 0, "ignore_eos": True}}
    status, data = http_json("POST", stack.router_url + "/inference/v1/generate", body, timeout=300,
                             headers={"X-Session-ID": "launcher"})
    assert status == 200, data
    choice = data["choices"][0]
    ids = choice["token_ids"]
    lps = [c["logprob"] for c in choice["logprobs"]["content"]]
    assert len(ids) == len(lps) == 24 and choice["finish_reason"] == "length"
    assert data["request_id"] == "generate-tokens-launcher-t1"
    model = AutoModelForCausalLM.from_pretrained(str(vllm_stack.checkpoints["v1"]), dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    ref = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert float((ref - torch.tensor(lps)).abs().max()) < 1e-3
    status, data = http_json("POST", stack.router_url + "/v1/chat/completions", timeout=300, body={
        "model": vllm_stack.served_model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert status == 200 and data["choices"][0]["message"]["role"] == "assistant", data
