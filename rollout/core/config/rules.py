"""The rules between sections of the config: each reads keys of two sections (a section's own rules
are its ``problems()`` method, beside its keys). :func:`rollout.core.config.validate` checks them
after every section's own rules."""

from __future__ import annotations

from rollout.core.config.base import Problems
from rollout.core.config.env import EnvConfig, UserKind
from rollout.core.config.local import LocalBackend, LocalConfig
from rollout.core.config.policy import History, PolicyConfig
from rollout.core.config.rollout import RolloutConfig, SampleMode


def cross_section_problems(env: EnvConfig, policy: PolicyConfig, rollout: RolloutConfig, local: LocalConfig) -> Problems:
    """The rules between sections, as ``(key, message)``, the key named being the one to set; no I/O.

    - without the local stack (``local.enabled=false``) the policy and an ``llm`` user need an endpoint;
    - ``policy.history=rerender`` has no one append-only sequence, so ``rollout.sample_mode`` cannot be
      ``trajectory``;
    - the local stack's engine and ``policy.engine`` speak the same protocol: ``local.backend=vllm``
      (real vLLM servers) with ``policy.engine=vllm``, the other backends (SGLang-protocol test
      servers) with ``sglang``.
    """
    if not (env.user.kind != UserKind.LLM or env.user.base_url is not None or local.enabled):
        yield "env.user.base_url", "is required when env.user.kind=llm and local.enabled=false"
    if not (policy.router_url is not None or local.enabled):
        yield "policy.router_url", "is required when local.enabled=false"
    if local.enabled and (local.backend == LocalBackend.VLLM) != (policy.engine == "vllm"):
        want = "vllm" if local.backend == LocalBackend.VLLM else "sglang"
        yield "policy.engine", (f"must be {want} with local.backend={local.backend} (the local stack's servers speak "
                                f"{'vLLM' if want == 'vllm' else 'SGLang'}'s protocol), got {policy.engine}")
    if rollout.sample_mode == SampleMode.TRAJECTORY and policy.history == History.RERENDER:
        yield "rollout.sample_mode", ("trajectory with policy.history=rerender: a re-rendered history is not one append-only sequence; "
                                      "use rollout.sample_mode=per_turn or merge_prefix, or policy.history=append")
