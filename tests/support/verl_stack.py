"""verl's own classes on this machine's local stack (no GPU): a trainer config composed from verl's
YAML, a model folder verl can read, and verl's ``LLMServerClient`` backed by the local stack's
real sglang-router.

verl's ``LLMServerClient.generate`` (``verl/workers/rollout/llm_server.py``, 0.9.1) asks a Ray
load-balancer actor for a server (``_acquire_server``) and calls that server actor's
``generate.remote(...)``, an ``AsyncSGLangServer`` on a GPU. :class:`RouterLLMServerClient` keeps
verl's ``generate`` (its request-id handling, its keyword plumbing, its ``global_steps`` fields)
and replaces only the two Ray hops: the load balancer by one server, the server actor by
:class:`RouterServer`, which does what ``AsyncSGLangServer.generate``
(``verl/workers/rollout/sglang_rollout/async_sglang_server.py``) does with the default
``skip_tokenizer_init=True``, over SGLang's HTTP ``/generate`` instead of its in-process engine:
``max_new_tokens`` (or ``max_tokens``) from the sampling parameters, ``logprobs`` popped into
``return_logprob``, the answer's ``output_ids`` and ``output_token_logprobs`` into ``TokenOutput``
(ids and log-probs emptied when their lengths disagree), SGLang's finish type as ``stop_reason``,
``extra_fields["global_steps"]`` the server's weight version.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput


class _Remote:
    """``handle.generate.remote(**kw)`` as a coroutine (what a Ray actor method call is awaited as)."""

    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


class RouterServer:
    """A stand-in for verl's SGLang server actor that sends ``/generate`` to an SGLang router.

    Attributes:
        requests: every body sent (for the tests to read).
    """

    def __init__(self, router_url: str, response_length: int = 4096, prompt_length: int = 8192):
        self.router_url = router_url.rstrip("/")
        self.response_length = response_length
        self.prompt_length = prompt_length
        self.requests: list[dict] = []
        self.generate = _Remote(self._generate)
        self._session: aiohttp.ClientSession | None = None

    async def _generate(self, prompt_ids, sampling_params: dict[str, Any], request_id: str, image_data=None, video_data=None,
                        **_: Any) -> TokenOutput:
        sp = dict(sampling_params)
        if "max_new_tokens" in sp:
            max_new = sp.pop("max_new_tokens")
        elif "max_tokens" in sp:
            max_new = sp.pop("max_tokens")
        else:
            max_new = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        sp["max_new_tokens"] = max(0, int(max_new))
        return_logprob = bool(sp.pop("logprobs", False))
        body = {"rid": request_id, "input_ids": [int(t) for t in prompt_ids], "sampling_params": sp, "return_logprob": return_logprob}
        self.requests.append(body)
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        async with self._session.post(f"{self.router_url}/generate", json=body, timeout=aiohttp.ClientTimeout(total=600)) as r:
            if r.status != 200:
                raise RuntimeError(f"/generate answered {r.status}: {(await r.text())[:300]}")
            out = await r.json()
        meta = out.get("meta_info", {})
        fr = meta.get("finish_reason")
        pairs = meta.get("output_token_logprobs") or []
        ids = list(out.get("output_ids") or [int(p[1]) for p in pairs])
        if return_logprob:
            lps = [float(p[0]) for p in pairs] if len(pairs) == len(ids) else []
            ids = ids if len(pairs) == len(ids) else []
        else:
            lps = None
        version = meta.get("weight_version")
        steps = int(version) if version is not None and str(version).lstrip("-").isdigit() else None
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason=fr["type"] if fr else None, extra_fields={"global_steps": steps})

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class RouterLLMServerClient(LLMServerClient):
    """verl's ``LLMServerClient`` with its one server behind the local stack's router (module docstring).

    Attributes:
        server: the :class:`RouterServer`.
        sticky_ids: the ``request_id`` of every call (verl's sticky-session key).
    """

    def __init__(self, config, router_url: str):
        super().__init__(config=config, load_balancer_handle=None)
        rc = config.actor_rollout_ref.rollout
        self.server = RouterServer(router_url, int(rc.response_length), int(rc.prompt_length))
        self.sticky_ids: list[str] = []

    async def _acquire_server(self, request_id: str, **extra):
        self.sticky_ids.append(request_id)
        return "router", self.server

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        pass


def model_folder(path: Path) -> Path:
    """A folder verl's ``HFModelConfig`` reads: the tiny model's ``config.json`` (Qwen3
    architecture, the local ``tiny`` backend's shape) and the real Qwen3 tokenizer files
    (``builtin:qwen3``). No weights: verl's agent loop needs the config and the tokenizer only."""
    from rollout.core.config import TinyModelConfig
    from rollout.core.tokenizer import builtin_qwen3_path, load_tokenizer
    from rollout.devtools.local.tiny import build_tiny_model

    path.mkdir(parents=True, exist_ok=True)
    config = build_tiny_model(len(load_tokenizer("builtin:qwen3")), TinyModelConfig()).config
    config.architectures = ["Qwen3ForCausalLM"]  # set by save_pretrained of a model, not of its config
    config.save_pretrained(path)
    for f in builtin_qwen3_path().iterdir():
        if f.is_file():
            shutil.copy(f, path / f.name)
    return path


def trainer_config(model: Path, agent_loop_yaml: Path | None = None, prompt_length: int = 8192, response_length: int = 4096,
                   overrides: list[str] = ()):
    """verl's PPO trainer config (``verl/trainer/config/ppo_trainer.yaml``, composed by hydra as
    verl's entry point does) for ``model``, SGLang rollout, log-probs on, and our agent-loop YAML."""
    import verl
    from hydra import compose, initialize_config_dir

    lines = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=sglang",
        f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
    ]
    if agent_loop_yaml is not None:
        lines.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_yaml}")
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
        return compose("ppo_trainer", overrides=lines + list(overrides))
