"""The policy-engine seam: which wire protocol the policy client speaks (``policy.engine``).

:data:`POLICY_ENGINES` maps a name to a :class:`~rollout.core.policy.wire.WireProtocol` (an
object, or its ``"package.module:attribute"`` path, imported the first time it is asked for), on
the project's one :class:`~rollout.core.registry.Registry` type. Built in: ``sglang`` (SGLang's
native ``/generate``, :data:`rollout.core.policy.sglang.SGLANG_WIRE`) and ``vllm`` (vLLM's
``/inference/v1/generate``, :data:`rollout.core.policy.vllm.VLLM_WIRE`). The config checks the
name at load (``policy.engine``); :class:`~rollout.core.policy.client.HTTPPolicyClient`, the
actors' KV gate and the pool's weight-update cycle ask :func:`get_policy_engine` for the wire.

This module imports nothing of the policy package (the config imports it to check the name), so
registering or listing a name imports no engine's code. A name registered by path reaches the Ray
actors (``rollout.core.registry.SEAM_MODULES``); a package of its own declares it as a
``tau_rollout.policy_engines`` entry point.
"""

from __future__ import annotations

from typing import Any

from rollout.core.registry import Registry

WireProtocol = Any  # rollout.core.policy.wire.WireProtocol (not imported here: the config imports this module)

__all__ = ["POLICY_ENGINES", "SGLANG", "VLLM", "get_policy_engine", "policy_engine_names", "register_policy_engine",
           "unregister_policy_engine"]

SGLANG = "sglang"
VLLM = "vllm"

POLICY_ENGINES: Registry[Any] = Registry("policy_engine", "policy.engine")


def register_policy_engine(name: str, wire: WireProtocol | str, *, replace: bool = False) -> None:
    """Register a wire protocol under ``name`` (an object, or its ``"package.module:attribute"`` path).

    Raises:
        ValueError: ``name`` is taken (and ``replace`` is false), or is not a valid name.
    """
    POLICY_ENGINES.register(name, wire, replace=replace)


def unregister_policy_engine(name: str) -> None:
    """Remove ``name``.

    Raises:
        rollout.core.registry.UnknownNameError: ``name`` is not registered.
    """
    POLICY_ENGINES.unregister(name)


def get_policy_engine(name: str) -> WireProtocol:
    """The wire protocol registered as ``name`` (its module imported now, once).

    Raises:
        rollout.core.registry.UnknownNameError: no such engine (one line naming ``policy.engine``
            and the registered names).
    """
    return POLICY_ENGINES.get(name)


def policy_engine_names() -> list[str]:
    """The registered names, built-ins first."""
    return POLICY_ENGINES.names()


register_policy_engine(SGLANG, "rollout.core.policy.sglang:SGLANG_WIRE")
register_policy_engine(VLLM, "rollout.core.policy.vllm:VLLM_WIRE")
