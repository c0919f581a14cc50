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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

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
