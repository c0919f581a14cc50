"""The seed's ``rollout_args`` and ``sampling_params`` read into our ``policy`` section
(:func:`policy_config`), and the client that sends the caller's extra sampling keys
(:class:`PassthroughClient`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rollout.core.config import PolicyConfig, SamplingConfig
from rollout.core.policy import SGLangClient

logger = logging.getLogger(__name__)


def rollout_arg(args: Any, name: str, default: Any = None) -> Any:
    """``args.name`` for a Namespace, ``args[name]`` for a mapping; ``default`` when absent or None."""
    if args is None:
        return default
    value = args.get(name) if isinstance(args, Mapping) else getattr(args, name, None)
    return default if value is None else value


def router_url(rollout_args: Any, default: str | None = None) -> str:
    """The router's base URL (``http://host:port``) from the seed's ``rollout_args``.

    Args:
        rollout_args: Namespace or mapping with ``router_url``, or slime's ``sglang_router_ip``
            and ``sglang_router_port`` (what the seed reads).
        default: used when ``rollout_args`` names no router.

    Raises:
        ValueError: no router is named.
    """
    url = rollout_arg(rollout_args, "router_url")
    if url:
        return str(url).rstrip("/")
    ip, port = rollout_arg(rollout_args, "sglang_router_ip"), rollout_arg(rollout_args, "sglang_router_port")
    if ip is not None and port is not None:
        host = str(ip)
        return f"{host}:{port}" if "://" in host else f"http://{host}:{port}"
    if default:
        return default.rstrip("/")
    raise ValueError("rollout_args names no router: set router_url, or sglang_router_ip and sglang_router_port")


# sampling_params keys the client controls: exactness needs these values (docs/design.md invariant 1)
_FORCED_SAMPLING = {"skip_special_tokens": False, "no_stop_trim": True}
# sampling_params keys that become our SamplingConfig; the rest is sent as given
_OURS = ("temperature", "top_p", "top_k", "max_new_tokens", "stop")


def policy_config(base: PolicyConfig, rollout_args: Any, sampling_params: Mapping[str, Any] | None) -> tuple[PolicyConfig, dict[str, Any], int | None]:
    """Our ``policy`` section for one ``asolve`` call.

    Args:
        base: the defaults (the agent's ``policy``): timeouts, retries, API key variable,
            ``on_parse_error``, ``max_context_tokens``, sampling defaults.
        rollout_args: see :func:`router_url`; ``rollout_max_context_len`` (slime's) replaces
            ``max_context_tokens`` when set.
        sampling_params: SGLang's ``sampling_params``. ``temperature``, ``top_p``, ``top_k``,
            ``max_new_tokens`` (tokens per assistant turn) and ``stop`` become our
            :class:`~rollout.core.config.SamplingConfig` (missing or ``None``: ``base``'s; our default
            ``stop`` is ``["</tool_call>"]``, one tool call per turn); ``sampling_seed`` seeds the
            episode (its calls get distinct seeds derived from it; without it each episode draws
            a fresh random seed, so that a GRPO group's members differ); ``skip_special_tokens=False``
            and ``no_stop_trim=True`` are forced (token-exact trajectories need them; another value
            is logged and replaced); any other key (``stop_token_ids``, ``repetition_penalty``,
            ``min_new_tokens``, ...) is sent with every call unchanged.

    Returns:
        ``(policy, passthrough, seed)``: the section, the extra ``sampling_params`` keys, and the
        ``sampling_seed`` (``None`` when not given).

    Raises:
        ValueError: no router is named, or a sampling value has the wrong type or range.
    """
    sp = dict(sampling_params or {})
    sampling = base.sampling
    updates: dict[str, Any] = {}
    try:
        for key, cast in (("temperature", float), ("top_p", float), ("top_k", int), ("max_new_tokens", int)):
            if sp.get(key) is not None:
                updates[key] = cast(sp[key])
        if sp.get("stop") is not None:
            stop = sp["stop"]
            updates["stop"] = [stop] if isinstance(stop, str) else [str(s) for s in stop]
        seed = None if sp.get("sampling_seed") is None else int(sp["sampling_seed"]) % (2**31 - 1)
    except (TypeError, ValueError) as e:
        raise ValueError(f"sampling_params: {e}") from None
    if updates.get("max_new_tokens", sampling.max_new_tokens) < 1:
        raise ValueError(f"sampling_params: max_new_tokens must be >= 1, got {updates['max_new_tokens']}")
    sampling = SamplingConfig(**{**{k: getattr(sampling, k) for k in _OURS}, **updates})
    for key, want in _FORCED_SAMPLING.items():
        if key in sp and sp[key] is not None and sp[key] != want:
            logger.warning("sampling_params[%r]=%r replaced by %r: token-exact trajectories need it", key, sp[key], want)
    passthrough = {k: v for k, v in sp.items() if k not in _OURS and k not in _FORCED_SAMPLING and k != "sampling_seed" and v is not None}
    context = rollout_arg(rollout_args, "rollout_max_context_len")
    policy = replace(
        base,
        router_url=router_url(rollout_args, default=base.router_url),
        sampling=sampling,
        max_context_tokens=int(context) if context else base.max_context_tokens,
    )
    return policy, passthrough, seed


class PassthroughClient(SGLangClient):
    """:class:`~rollout.core.policy.SGLangClient` that also sends the caller's extra ``sampling_params``
    keys (ours win where both set one)."""

    def __init__(self, *args, passthrough: dict[str, Any] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.passthrough = dict(passthrough or {})

    def payload(self, input_ids: list[int], max_new_tokens: int, rid: str, seed: int | None) -> dict:
        body = super().payload(input_ids, max_new_tokens, rid, seed)
        if self.passthrough:
            body["sampling_params"] = {**self.passthrough, **body["sampling_params"]}
        return body
