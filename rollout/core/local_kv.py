"""The ``local.kv`` section of the config schema (:mod:`rollout.core.config` holds the rest and
re-exports it) and its checks: the local servers' KV model, :mod:`rollout.devtools.local.kvmodel`
(docs/local-stack.md "The KV model")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class LocalKVConfig:
    """Per local server: a model of a prefix cache, KV budget and costs; every key 0 = off /
    unbounded (today's behaviour and speed)."""

    cache_tokens: int = 0  # prefix-cache capacity in tokens (LRU eviction of leaves); 0: no cache
    kv_budget_tokens: int = 0  # tokens running requests may hold before retraction; 0: unbounded
    prefill_s_per_token: float = 0.0  # seconds per uncached prompt token (one prefill at a time)
    decode_s_per_token: float = 0.0  # seconds per generated token
    s_per_running_request: float = 0.0  # seconds added to each generated token per running request
    think_tokens: int = 0  # gold replay: a <think> block of this many tokens before each answer (hermes)


def local_kv_problems(kv: LocalKVConfig) -> list[tuple[str, str]]:
    """``(key, message)`` for each bad value of ``local.kv`` (every key must be >= 0)."""
    return [(f"local.kv.{k}", f"must be >= 0 (0: off), got {v}") for k, v in dataclasses.asdict(kv).items() if v < 0]
