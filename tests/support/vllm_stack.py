"""The vLLM stack the test session shares (``vllm_stack`` fixture, tests/conftest.py).

One stack per pytest run: 2 vLLM servers (CPU, the lean install in ``.venv-vllm`` or
``$TAU_ROLLOUT_VLLM_PYTHON``) serving a random-weight Qwen3 checkpoint with the real Qwen3
vocabulary (seed 0, weight version ``default``), behind ``vllm-router`` with ``consistent_hash``.
A second checkpoint of the same shape (seed 1) is there for weight updates. Under ``pytest -n N
--dist loadfile`` every test file whose path contains ``vllm`` runs on one worker
(:func:`vllm_scope`, tests/conftest.py's scheduler), so the stack starts once.

When vLLM is not installed the tests that ask for it skip, saying how to install it; with
``TAU_ROLLOUT_REQUIRE_VLLM=1`` (``.ci/run`` sets it) they fail instead.

Tests that change the stack's state put it back: weights reloaded to ``v2`` are reloaded to ``v1``
with the version ``default`` (:meth:`VllmTestStack.reset_weights`), a killed server is restarted
(``stack.restart_server(i)``), a paused one resumed.

The stack starts in the set-up of the first test that asks for it, which the vLLM tests leave out
of their timeout (``pytest.mark.timeout(..., func_only=True)``: the start has its own bound,
``startup_timeout_s``), so each test's timeout counts that test alone.

Scenarios that need a call running on an engine when something reaches it (a pause, an abort)
hold it there: the call cannot end early (:data:`RUN_TO_LENGTH`: ``ignore_eos``, no stop strings
), the test waits until the engines' ``vllm:num_requests_running`` counts it, and it
looks at whether the call was answered right before it acts. Whether the run met that is the
precondition a test may run again on (``support.retries.Attempts``); what the product did with a
call that was running is never a reason to run again.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rollout.core.policy.vllm import VLLMWire

REQUIRE_ENV = "TAU_ROLLOUT_REQUIRE_VLLM"
SERVERS_ENV = "TAU_ROLLOUT_VLLM_TEST_SERVERS"  # servers behind the router (default 2)
NUM_GPU_BLOCKS = 512  # KV cache of each test server: 512 blocks x 128 = 65,536 tokens (about 64 MB)
MODEL_NAME = "tiny-qwen3"


def vllm_scope(nodeid: str) -> str | None:
    """The xdist work unit of a vLLM test (``"vllm"``: all of them on one worker), or None for
    another test (its file, as ``--dist loadfile``)."""
    path = nodeid.split("::", 1)[0]
    return "vllm" if "vllm" in path.lower() else None


def require_vllm() -> Path:
    """The vLLM venv's python; skips the test (fails it under ``TAU_ROLLOUT_REQUIRE_VLLM=1``)
    when vLLM is not installed, with the line saying how to install it."""
    from rollout.devtools.local.vllm import find_vllm_python, vllm_missing

    why = vllm_missing()
    if why:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 and {why}", pytrace=False)
        pytest.skip(why)
    return find_vllm_python()


@dataclass
class VllmTestStack:
    """The session's vLLM stack and its checkpoints.

    Attributes:
        stack: the running :class:`rollout.devtools.local.vllm.VllmStack` (``router_url``,
            ``worker_urls``, ``servers``, ``router``, ``kill_server(i)``, ``restart_server(i)``).
        checkpoints: ``{"v1": seed-0 folder (served at start), "v2": seed-1 folder}``.
        tokenizer: the pool's ``policy.tokenizer`` for this vocabulary.
        served_model_name: what ``/v1/chat/completions`` takes as ``model``.
    """

    stack: object
    checkpoints: dict[str, Path] = field(default_factory=dict)
    tokenizer: str = "builtin:qwen3"
    served_model_name: str = MODEL_NAME

    @property
    def router_url(self) -> str:
        return self.stack.router_url

    @property
    def worker_urls(self) -> list[str]:
        return self.stack.worker_urls

    def reset_weights(self) -> None:
        """Every server back to the ``v1`` weights and the version ``default``, with its prefix
        cache emptied and not paused (direct calls to each worker, as after the session's start).

        Raises:
            AssertionError: a call did not answer 200.
        """
        from rollout.devtools.local.vllm.processes import http_json

        for url in self.worker_urls:
            for method, path, body in (
                ("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(self.checkpoints["v1"])}}),
                ("POST", "/update_weight_version", {"new_version": "default"}),
                ("POST", "/reset_prefix_cache", None),
                ("POST", "/resume", None),
            ):
                status, data = http_json(method, url + path, body, timeout=120.0)
                assert status == 200, f"{url}{path}: HTTP {status} {data}"


class _RunToLength(VLLMWire):
    """vLLM's wire with ``ignore_eos`` and no stop strings: every call runs to its ``max_tokens``,
    so a long call cannot end before the test acts on it. Neither changes the distribution sampled
    from (vLLM's ``min_tokens`` would: it masks the stop ids), so the log-probs stay exact."""

    def generate_body(self, *args, **kwargs) -> dict:
        return run_to_length(super().generate_body(*args, **kwargs))


RUN_TO_LENGTH = _RunToLength()


def run_to_length(body: dict) -> dict:
    """``body`` (a vLLM generate body) edited in place to run to its ``max_tokens``: ``ignore_eos``, no stop strings."""
    body["sampling_params"]["ignore_eos"] = True
    body["sampling_params"]["stop"] = []
    return body


def running(worker_urls: list[str]) -> int:
    """Requests the engines run now: the sum of ``vllm:num_requests_running`` over the workers."""
    from rollout.core.telemetry import promtext
    from rollout.devtools.local.vllm.processes import http_json

    total = 0.0
    for url in worker_urls:
        status, text = http_json("GET", url + "/metrics", timeout=60)
        assert status == 200, f"{url}/metrics: HTTP {status}"
        total += promtext.total(promtext.parse(str(text), "vllm:", strict=False), "vllm:num_requests_running")
    return int(total)


def wait_idle(worker_urls: list[str], timeout_s: float = 300.0) -> None:
    """Until no engine runs a request (an earlier test's or attempt's calls are gone).

    Raises:
        AssertionError: still running after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while running(worker_urls):
        assert time.monotonic() < deadline, f"the vLLM servers still run requests after {timeout_s:g} s"
        time.sleep(0.2)


@functools.lru_cache(maxsize=4)
def _model(path: str):
    from rollout.devtools.check_engine import transformers_model

    return transformers_model(path)


def max_log_prob_error(weights: dict[str, Path], tokens: list[int], positions: list[int], versions: list[str | None],
                       log_probs: list[float], temperature: float, chunk: int = 512) -> float:
    """Max ``|log_probs[i] - recomputed|`` over the sampled tokens ``tokens[positions[i]]``, each
    recomputed by a transformers forward pass (float32, the projection in float64) of the weights
    of the version that sampled it (``weights[versions[i]]``): ``log_softmax(logits / T)``. The
    vocabulary projection runs ``chunk`` positions at a time (152k columns: all at once would be
    gigabytes). A version with no weights counts as an infinite error.
    """
    import torch

    by_version: dict[str | None, list[int]] = {}
    for i, v in enumerate(versions):
        by_version.setdefault(v, []).append(i)
    worst = 0.0
    for v, idx in by_version.items():
        if v not in weights:
            return math.inf
        model = _model(str(weights[v]))
        with torch.inference_mode():
            hidden = model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]
            for k in range(0, len(idx), chunk):
                part = idx[k:k + chunk]
                rows = torch.tensor([positions[i] - 1 for i in part])
                logits = model.lm_head(hidden[rows]).double() / (temperature or 1.0)
                want = torch.log_softmax(logits, -1).gather(1, torch.tensor([tokens[positions[i]] for i in part])[:, None])[:, 0]
                got = torch.tensor([log_probs[i] for i in part], dtype=torch.float64)
                worst = max(worst, (want - got).abs().max().item())
    return worst


def start_session_stack(tmp_path_factory) -> VllmTestStack:
    """Write the two checkpoints and start the stack (skips/fails as :func:`require_vllm`).

    Raises:
        RuntimeError: the stack did not start (the message has the logs' tails).
    """
    python = require_vllm()
    from rollout.devtools.local.vllm import VllmStack, write_checkpoint

    root = tmp_path_factory.mktemp("vllm")
    ckpts = {"v1": write_checkpoint(root / "tiny-qwen3", seed=0), "v2": write_checkpoint(root / "tiny-qwen3-v2", seed=1)}
    stack = VllmStack(ckpts["v1"], python=python, num_servers=int(os.environ.get(SERVERS_ENV, "2")), log_dir=root / "logs",
                      served_model_name=MODEL_NAME, num_gpu_blocks=NUM_GPU_BLOCKS, startup_timeout_s=900.0)
    stack.start()
    return VllmTestStack(stack, ckpts)
