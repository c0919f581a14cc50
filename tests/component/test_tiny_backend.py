"""The ``tiny`` local backend: a random Qwen3-architecture model with the real Qwen3 tokenizer."""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from rollout.core.tokenizer import load_tokenizer
from rollout.devtools.local.backend_api import SamplingParams
from rollout.devtools.local.tiny import TinyLMBackend, build_tiny_model, recompute_log_probs

MESSAGES = [
    {"role": "system", "content": "You are a customer service agent for an airline."},
    {
        "role": "user",
        "content": "Hi, I would like to change my flight to next Tuesday.",
    },
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Single-token decode steps are too small for OpenMP; on a shared 2-core machine extra
    threads only contend. Restored afterwards so other test modules are unaffected."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:qwen3")


@pytest.fixture(scope="module")
def backend(tokenizer):
    return TinyLMBackend(tokenizer, {"seed": 0})


@pytest.fixture(scope="module")
def prompt(tokenizer):
    text = tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert 20 < len(ids) < 100
    return ids


def take(backend, ids, params, n):
    """The first ``n`` (token, log_prob) pairs, closing the generator like the server does."""
    gen = backend.generate(ids, params)
    try:
        return list(itertools.islice(gen, n))
    finally:
        gen.close()


def full_logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


# -- weights -----------------------------------------------------------------------------------


def test_weights_reproducible_and_no_global_rng_side_effect(tokenizer):
    cfg = {"seed": 7, "num_hidden_layers": 1}
    state = torch.get_rng_state()
    a = build_tiny_model(len(tokenizer), cfg).state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(999)  # the global RNG state does not matter
        b = build_tiny_model(len(tokenizer), cfg).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = build_tiny_model(
        len(tokenizer), {"seed": 8, "num_hidden_layers": 1}
    ).state_dict()
    assert not torch.equal(
        a["model.embed_tokens.weight"], c["model.embed_tokens.weight"]
    )


def test_model_shape(backend, tokenizer):
    model = backend.model
    cfg = model.config
    assert cfg.vocab_size == len(tokenizer) == 151669
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim) == (2, 64, 16)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert next(model.parameters()).dtype == torch.float32
    assert not model.training
    assert 9_000_000 < backend.num_parameters() < 11_000_000


@pytest.mark.slow
def test_weights_identical_in_another_process():
    code = (
        "import hashlib, torch\n"
        "from rollout.devtools.local.tiny import build_tiny_model\n"
        "m = build_tiny_model(1000, {'seed': 5})\n"
        "h = hashlib.sha256()\n"
        "for k, v in sorted(m.state_dict().items()): h.update(k.encode()); h.update(v.numpy().tobytes())\n"
        "print(h.hexdigest())\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    import hashlib

    h = hashlib.sha256()
    for k, v in sorted(build_tiny_model(1000, {"seed": 5}).state_dict().items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    assert out.stdout.strip() == h.hexdigest()


# -- sampling ----------------------------------------------------------------------------------


def test_seed_determines_tokens(backend, prompt):
    p = SamplingParams(temperature=1.0, seed=123)
    a = take(backend, prompt, p, 16)
    b = take(backend, prompt, p, 16)
    assert a == b
    c = take(backend, prompt, SamplingParams(temperature=1.0, seed=124), 16)
    assert [t for t, _ in a] != [t for t, _ in c]
    assert all(0 <= t < backend.vocab_size for t, _ in a + c)
    # No seed: still works (nondeterministic).
    assert len(take(backend, prompt, SamplingParams(temperature=1.0), 4)) == 4


def test_greedy_is_argmax_and_top_k_1_equals_greedy(backend, prompt):
    greedy = take(backend, prompt, SamplingParams(temperature=0.0), 16)
    ids = [t for t, _ in greedy]
    logits = full_logits(backend.model, prompt + ids)
    n = len(prompt)
    for j, (tok, lp) in enumerate(greedy):
        row = logits[n - 1 + j]
        assert tok == int(torch.argmax(row))
        # Greedy reports log-probs at T = 1.
        assert abs(lp - float(torch.log_softmax(row, -1)[tok])) < 1e-5
    top1 = take(backend, prompt, SamplingParams(temperature=0.8, top_k=1, seed=9), 16)
    assert [t for t, _ in top1] == ids
    # Different seeds with top_k=1 are still greedy.
    other = take(backend, prompt, SamplingParams(temperature=1.3, top_k=1, seed=10), 16)
    assert [t for t, _ in other] == ids


def test_top_k_and_top_p_restrict_support(backend, prompt):
    k = 5
    out = take(backend, prompt, SamplingParams(temperature=1.0, top_k=k, seed=3), 16)
    logits = full_logits(backend.model, prompt + [t for t, _ in out])
    for j, (tok, lp) in enumerate(out):
        row = logits[len(prompt) - 1 + j]
        assert tok in set(torch.topk(row, k).indices.tolist())
        # Reported log-prob is over the full vocabulary, before truncation.
        assert abs(lp - float(torch.log_softmax(row, -1)[tok])) < 1e-5

    top_p = 0.05
    out = take(backend, prompt, SamplingParams(temperature=0.5, top_p=top_p, seed=4), 8)
    logits = full_logits(backend.model, prompt + [t for t, _ in out])
    for j, (tok, _) in enumerate(out):
        probs = torch.softmax(logits[len(prompt) - 1 + j] / 0.5, -1)
        sorted_p, order = torch.sort(probs, descending=True)
        keep = (
            int(torch.searchsorted(torch.cumsum(sorted_p, -1), torch.tensor([top_p])))
            + 1
        )
        # +2: float rounding at the nucleus boundary.
        assert tok in set(order[: keep + 2].tolist())
        assert keep < probs.numel() // 2


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_incremental_log_probs_match_recompute(backend, prompt, temperature):
    out = take(backend, prompt, SamplingParams(temperature=temperature, seed=11), 64)
    tokens = prompt + [t for t, _ in out]
    rec = recompute_log_probs(backend.model, tokens, temperature)
    assert len(rec) == len(tokens) - 1
    rec_out = rec[len(prompt) - 1 :]
    assert len(rec_out) == 64
    max_diff = max(abs(lp - r) for (_, lp), r in zip(out, rec_out))
    print(f"T={temperature}: max |incremental - recompute| = {max_diff:.3e}")
    assert max_diff < 1e-5
    assert all(lp <= 0.0 for _, lp in out)
    # The backend convenience method agrees.
    assert backend.recompute_log_probs(tokens, temperature) == rec


def test_recompute_edge_cases(backend):
    assert recompute_log_probs(backend.model, [1]) == []
    assert len(recompute_log_probs(backend.model, [1, 2, 3], temperature=0.0)) == 2


def test_concurrent_generation_matches_sequential(backend, prompt):
    seeds = [21, 22, 23, 24]
    params = {
        s: SamplingParams(temperature=0.9, top_p=0.95 if s % 2 else 1.0, seed=s)
        for s in seeds
    }
    sequential = {s: take(backend, prompt, params[s], 10) for s in seeds}
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(seeds))

    def worker(seed):
        try:
            barrier.wait()
            results[seed] = take(backend, prompt, params[seed], 10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert results == sequential


def test_bad_prompts_raise(backend):
    with pytest.raises(ValueError):
        next(backend.generate([], SamplingParams()))
    with pytest.raises(ValueError):
        next(backend.generate([backend.vocab_size], SamplingParams()))


def test_chat_returns_text(backend):
    text = backend.chat(
        MESSAGES, SamplingParams(temperature=1.0, max_new_tokens=12, seed=1)
    )
    assert isinstance(text, str)
    assert backend.chat(MESSAGES, SamplingParams(max_new_tokens=12, seed=1)) == text
    assert backend.chat(MESSAGES, SamplingParams(max_new_tokens=0)) == ""


def test_import_without_torch_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "rollout.devtools.local.tiny")
    with pytest.raises(ImportError, match=r"tau-rollout\[tiny\]"):
        importlib.import_module("rollout.devtools.local.tiny")
