"""What the episode loop needs from the config, resolved once per actor (:class:`EpisodeSettings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.core.choices import History
from rollout.core.config import OnLength, OnParseError, PartialRollout, PolicyConfig, RewardShapingConfig
from rollout.core.context import ContextStrategy, NoCompaction, get_context_strategy
from rollout.core.shaping import RewardShaping


@dataclass(frozen=True)
class EpisodeSettings:
    """What the loop needs from the config, resolved once per actor.

    Attributes:
        max_steps: agent turns (``env.max_steps``).
        max_new_tokens: per turn (``policy.sampling.max_new_tokens``).
        max_context_tokens: prompt + response bound (``policy.max_context_tokens``).
        on_parse_error: ``feedback`` | ``abort`` (:class:`~rollout.core.config.OnParseError`; a
            plain value string works too, as for the other choices).
        system_prompt: the agent's system prompt.
        tool_names: the tools the parser accepts.
        partial_rollout: what a turn interrupted by a weight update becomes
            (``rollout.partial_rollout``): ``continue`` | ``restart_turn`` | ``drop``.
        stop: the stop strings of ``policy.sampling.stop`` (a continued turn is checked for one
            that straddles the interruption, which no single server call could see).
        tokenize_timeout_s: bound on each tokenizer call made in a thread
            (``policy.tokenize_timeout_s``).
        on_length: what a turn cut at ``max_new_tokens`` becomes (``policy.on_length``):
            ``truncate`` ends the episode ``truncated`` (termination reason ``turn_length``);
            ``keep`` uses the cut text as the turn.
        history: how each turn's prompt is built (``policy.history``: ``append`` | ``rerender``).
        context_strategy: what compacts a conversation that would not fit
            (``policy.context_strategy``, built once per actor; :mod:`rollout.core.context`).
        context_headroom_tokens: the room for a turn whose lack starts a compaction, and which a
            compaction must leave (``policy.context_headroom_tokens``).
        reward_shaping: the shapers of ``rollout.reward_shaping`` (built once per actor;
            :mod:`rollout.core.shaping`), applied by the guarded runner to each episode's result;
            none by default.
    """

    max_steps: int
    max_new_tokens: int
    max_context_tokens: int
    on_parse_error: OnParseError
    system_prompt: str
    tool_names: tuple[str, ...]
    partial_rollout: PartialRollout = PartialRollout.CONTINUE
    stop: tuple[str, ...] = ()
    tokenize_timeout_s: float = PolicyConfig.tokenize_timeout_s
    on_length: OnLength = PolicyConfig.on_length
    history: History = History.APPEND
    context_strategy: ContextStrategy = field(default_factory=NoCompaction)
    context_headroom_tokens: int = PolicyConfig.context_headroom_tokens
    reward_shaping: RewardShaping = field(default_factory=RewardShaping)

    @classmethod
    def from_policy(cls, policy: PolicyConfig, *, max_steps: int, system_prompt: str, tool_names: tuple[str, ...] | list[str],
                    partial_rollout: PartialRollout = PartialRollout.CONTINUE, reward_shaping: RewardShapingConfig | None = None) -> EpisodeSettings:
        """The settings for ``policy`` (the ``policy`` section: sampling budget and stop strings,
        context bound, parse-error and length policies, tokenizer timeout), with the environment's
        ``max_steps``, system prompt and tool names, and ``rollout.reward_shaping`` (``None``: no
        shaping); one construction for every path (the worker, the trainers' task runner, ``asolve``).

        Raises:
            KeyError, ImportError, TypeError: ``policy.context_strategy`` names no strategy
                (:func:`rollout.core.context.get_context_strategy`), or
                ``rollout.reward_shaping.shapers`` no shaper (:mod:`rollout.core.shaping`).
        """
        return cls(
            max_steps=int(max_steps),
            max_new_tokens=policy.sampling.max_new_tokens,
            max_context_tokens=policy.max_context_tokens,
            on_parse_error=policy.on_parse_error,
            system_prompt=system_prompt,
            tool_names=tuple(tool_names),
            partial_rollout=partial_rollout,
            stop=tuple(policy.sampling.stop),
            tokenize_timeout_s=policy.tokenize_timeout_s,
            on_length=policy.on_length,
            history=History(policy.history),
            context_strategy=get_context_strategy(policy.context_strategy),
            context_headroom_tokens=policy.context_headroom_tokens,
            reward_shaping=RewardShaping.from_config(reward_shaping),
        )
