"""The ``local`` section: the local stack, the embedded default engine (SGLang-protocol test servers
behind the real sglang-router; :mod:`rollout.devtools.local`, docs/local-stack.md). Its 23 keys
configure that engine only: nothing else reads them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from rollout.core.config.base import Choice, Problems, bound_problems, setting
from rollout.core.config.pool import EventLoop


class LocalBackend(Choice):
    """``local.backend``: the policy of the local test servers (:mod:`rollout.devtools.local`)."""

    GOLD_REPLAY = "gold_replay"  # replays each task's gold actions
    GOLD_REPLAY_SKIP_WRITE = "gold_replay_skip_write"  # the same, skipping the first write (reward 0)
    TINY = "tiny"  # a tiny random Qwen3-architecture model (the [tiny] extra: torch)
    VLLM = "vllm"  # the real vLLM on the CPU (its own venv) behind vllm-router (local.vllm; docs/engines.md)


class RouterPolicy(Choice):
    """``local.router_policy``: the ``--policy`` the local stack gives ``sglang-router`` (0.3.2's
    policies; :mod:`rollout.devtools.local.stack`)."""

    AUTO = "auto"  # the policy that honours X-SMG-Routing-Key: manual (with --assignment-mode min_group)
    MANUAL = "manual"  # sticky: a routing key stays on the worker it was first assigned
    CACHE_AWARE = "cache_aware"  # approximate radix tree of the prompts each worker saw, load balancing past thresholds
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    POWER_OF_TWO = "power_of_two"  # the less loaded of two random workers


@dataclass
class TinyModelConfig:
    """``local.tiny``: the tiny random Qwen3-architecture model of the local ``tiny`` backend."""

    seed: int = setting(0, doc="Seed of the model's random weights.")
    num_hidden_layers: int = setting(2, doc="Transformer (decoder) layers.")
    hidden_size: int = setting(64, doc="Hidden size (the width of each token's vector).")
    intermediate_size: int = setting(128, doc="MLP intermediate size.")
    num_attention_heads: int = setting(4, doc="Attention (query) heads.")
    num_key_value_heads: int = setting(2, doc="Key/value heads (grouped-query attention).")
    max_position_embeddings: int = setting(65536, doc="Longest sequence the model takes, in tokens.")


class VllmRouterPolicy(Choice):
    """``local.vllm.router_policy``: vllm-router 0.1.17's ``--policy`` (docs/engines.md)."""

    CONSISTENT_HASH = "consistent_hash"  # the X-Session-ID header (policy.routing's key) picks the worker: a key stays on one
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    POWER_OF_TWO = "power_of_two"
    CACHE_AWARE = "cache_aware"  # a radix tree of prompt TEXT: token-id prompts all share the empty prefix (one worker)
    KV_AWARE = "kv_aware"
    STICKY_LEAST_LOADED = "sticky_least_loaded"


@dataclass
class LocalVllmConfig:
    """``local.vllm``: the real vLLM on the CPU when ``local.backend=vllm``
    (:mod:`rollout.devtools.local.vllm`, docs/engines.md): a random-weight checkpoint written for
    ``policy.tokenizer``'s vocabulary (or ``model``), ``local.num_servers`` vLLM servers from a venv of
    their own, behind vllm-router."""

    python: Optional[str] = setting(None, doc="""
        The vLLM venv's python (launch/install_vllm.sh); null: .venv-vllm/bin/python at the repository root. The variable
        TAU_ROLLOUT_VLLM_PYTHON overrides it.""")
    model: Optional[str] = setting(None, doc="""
        A checkpoint folder to serve (config.json + *.safetensors + tokenizer files); null: a random-weight Qwen3 checkpoint
        of policy.tokenizer's built-in vocabulary, written into checkpoint_dir.""")
    checkpoint_dir: str = setting("outputs/vllm_checkpoints", doc="""
        Where the random-weight checkpoint is written (<vocabulary>-seed<seed>; kept and reused when its spec matches).""")
    seed: int = setting(0, doc="Seed of the written checkpoint's weights.")
    served_model_name: Optional[str] = setting(None, doc="""
        The model name the servers answer to (also under the name "local", the llm user's default); null: the checkpoint
        folder's name.""")
    max_model_len: int = setting(16384, ge=16, doc="Longest sequence (prompt + generated) a server takes, tokens (--max-model-len).")
    kv_cache_gib: int = setting(1, ge=1, doc="Each server's KV cache, GiB (VLLM_CPU_KVCACHE_SPACE; 1 GiB = 1,048,576 tokens here).")
    num_gpu_blocks: Optional[int] = setting(None, doc="""
        --num-gpu-blocks-override: each server's KV cache in blocks of 128 tokens (a small cache for KV-pressure runs);
        null: from kv_cache_gib.""")
    router_policy: VllmRouterPolicy = setting(VllmRouterPolicy.CONSISTENT_HASH, doc="""
        vllm-router's --policy: consistent_hash (honours policy.routing's key, sent as X-Session-ID) | round_robin | random |
        power_of_two | cache_aware | kv_aware | sticky_least_loaded.""")
    startup_timeout_s: float = setting(900.0, gt=0, doc="""
        Bound (seconds) on the vLLM servers' start (36-300 s each on a loaded 2-core machine; they start together).""")
    extra_args: list[str] = setting([], doc="More flags for every vLLM server (python -m vllm.entrypoints.openai.api_server).")


@dataclass
class LocalKVConfig:
    """``local.kv``: per local server, a model of a prefix cache, KV budget and costs
    (:mod:`rollout.devtools.local.kvmodel`, docs/local-stack.md "The KV model"); every key 0 = off
    / unbounded (today's behaviour and speed)."""

    cache_tokens: int = setting(0, doc="""
        Prefix-cache capacity in tokens (LRU eviction of leaves; meta_info.cached_tokens as SGLang reports it); 0: no cache.""")
    kv_budget_tokens: int = setting(0, doc="""
        Tokens running requests may hold (prompt + generated so far) before they are retracted, queued and prefilled again;
        0: unbounded.""")
    prefill_s_per_token: float = setting(0.0, doc="Seconds per uncached prompt token (one prefill at a time per server).")
    decode_s_per_token: float = setting(0.0, doc="Seconds per generated token.")
    s_per_running_request: float = setting(0.0, doc="""
        Seconds added to each generated token per running request (a decode step slows as the batch grows).""")
    think_tokens: int = setting(0, doc="""
        Gold replay (hermes): a <think> block of this many filler tokens before each answer, as a reasoning model writes.""")

    def problems(self) -> Problems:
        """Each negative value, as ``(key, message)`` (every key must be >= 0); no I/O."""
        for k, v in dataclasses.asdict(self).items():
            if v < 0:
                yield f"local.kv.{k}", f"must be >= 0 (0: off), got {v}"


@dataclass
class LocalConfig:
    """``local``: the local stack: SGLang-protocol test servers behind the real sglang-router, or, with
    ``backend=vllm``, real vLLM servers behind vllm-router (a developer tool: off unless asked for;
    configs/local.yaml, the CLI's default, turns it on; configs/vllm_cpu.yaml the vLLM one)."""

    enabled: bool = setting(False, doc="""
        Start the local stack and point policy.router_url at its router (configs/local.yaml, the CLI's default config, sets
        it true).""")
    backend: LocalBackend = setting(LocalBackend.GOLD_REPLAY, doc="""
        The servers' policy: gold_replay | gold_replay_skip_write (a wrong policy, for checking the reward) | tiny (a tiny
        random model; the [tiny] extra) | vllm (the real vLLM on the CPU behind vllm-router, local.vllm; docs/engines.md).""")
    num_servers: int = setting(1, ge=1, doc="Local test servers behind the router.")
    host: str = setting("127.0.0.1", doc="Where the local stack listens.")
    router_port: Optional[int] = setting(None, doc="The router's port; null: a free port.")
    startup_timeout_s: float = setting(120.0, doc="Bound (seconds) on the local stack's start (servers and router answering).")
    weight_version: str = setting("0", doc="""
        The servers' --weight-version at start (SGLang's default is "default"; numeric here so that staleness can be
        computed); /update_weights_from_disk changes it.""")
    generate_latency_s: float = setting(0.0, doc="""
        Seconds each server waits before answering a /generate call, as a GPU server would take to generate (python -m
        rollout.bench pool). The wait is an asyncio sleep on the server's event loop: it holds neither the
        one-step-at-a-time lock nor a generation thread, so any number of requests wait at once. 0.0: no added latency.""")
    event_loop: EventLoop = setting(EventLoop.UVLOOP, doc="""
        The servers' event loop (as pool.event_loop; rollout.core.eventloop): uvloop | asyncio.""")
    router_policy: RouterPolicy = setting(RouterPolicy.AUTO, doc="""
        The router's --policy: auto = the one that honours policy.routing's X-SMG-Routing-Key (sglang-router 0.3.2: manual,
        keys assigned to the worker with the fewest keys), or one of the router's own: manual | cache_aware | round_robin |
        random | power_of_two (docs/local-stack.md "Routing").""")
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    kv: LocalKVConfig = field(default_factory=LocalKVConfig)
    vllm: LocalVllmConfig = field(default_factory=LocalVllmConfig)

    def problems(self) -> Problems:
        """This section's bad values (``local.kv``'s included), as ``(key, message)``: its keys' ranges,
        then its rules; no I/O."""
        yield from bound_problems(self, "local")
        if not self.generate_latency_s >= 0:
            yield "local.generate_latency_s", f"must be >= 0 (seconds), got {self.generate_latency_s}"
        yield from self.kv.problems()
        yield from bound_problems(self.vllm, "local.vllm")
        if self.vllm.num_gpu_blocks is not None and self.vllm.num_gpu_blocks < 1:
            yield "local.vllm.num_gpu_blocks", f"must be >= 1 (blocks of 128 tokens) or null, got {self.vllm.num_gpu_blocks}"
