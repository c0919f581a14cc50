"""The closed choices of the config schema (:mod:`rollout.core.config`), one :class:`Choice` enum each.

A choice's values are the strings YAML and ``key=value`` overrides hold. omegaconf's structured
config checks them as it merges (an enum field accepts a member's value or name and refuses
anything else); :mod:`rollout.core.config` words the refusal as ``{key}: must be one of a, b, got 'x'``.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any


class Choice(str, enum.Enum):
    """A closed config choice: a ``str`` whose value is what YAML and ``key=value`` write.

    A member equals, hashes and formats as its value (``PartialRollout.DROP == "drop"``,
    ``f"{m}"`` and ``json.dumps`` give ``drop``), so code comparing with strings keeps working.
    omegaconf accepts the value (or the member's name) and rejects anything else.
    """

    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The valid values, in declaration order."""
        return tuple(m.value for m in cls)


class UserKind(Choice):
    """``env.user.kind``: the simulated user."""

    SCRIPTED = "scripted"  # deterministic, no LLM
    LLM = "llm"  # an OpenAI-compatible endpoint (env.user.base_url / model)


class Evaluator(Choice):
    """``env.evaluator``: how tau2 rewards are computed."""

    FAST = "fast"  # copy-on-write databases, rewards from the episode's own database (rollout.benchmarks.tau2.fast)
    TAU2 = "tau2"  # tau2's own evaluate_simulation in the tool sandbox (the reference; 10x+ slower)


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


class PartialRollout(Choice):
    """``rollout.partial_rollout``: what a turn interrupted by a weight update becomes."""

    CONTINUE = "continue"  # keep the tokens sampled so far (old weights, mask 1) and generate the rest
    RESTART_TURN = "restart_turn"  # drop them and regenerate the turn
    DROP = "drop"  # end the episode aborted


class SampleMode(Choice):
    """``rollout.sample_mode``: what training samples an episode becomes (:mod:`rollout.core.sample_modes`)."""

    TRAJECTORY = "trajectory"  # one sample per episode: the whole append-only token sequence
    PER_TURN = "per_turn"  # one sample per assistant turn: the turn's prompt and the tokens it sampled
    MERGE_PREFIX = "merge_prefix"  # consecutive turns in one sample while each prompt extends it; a new sample where not


class OnStale(Choice):
    """``rollout.on_stale``: an episode older than ``rollout.max_staleness`` at delivery."""

    DROP = "drop"  # held back from training (counted)
    KEEP = "keep"  # trained anyway (counted)


class GroupFilter(Choice):
    """``rollout.filter_groups`` (null: none): which complete groups ``groups()`` drops."""

    ZERO_VARIANCE = "zero_variance"  # groups whose rewards are all equal (DAPO dynamic sampling)


class OnGroupFailure(Choice):
    """``rollout.on_group_failure``: a group member excluded from training (failure, stale)."""

    RERUN = "rerun"  # run the member again, up to rollout.max_member_reruns times
    DROP = "drop"  # drop the whole group


class EventLoop(Choice):
    """``pool.event_loop`` / ``local.event_loop`` (:mod:`rollout.core.eventloop`)."""

    UVLOOP = "uvloop"  # libuv in C (docs/performance.md)
    ASYNCIO = "asyncio"  # the standard library's loop


class LocalBackend(Choice):
    """``local.backend``: the policy of the local test servers (:mod:`rollout.devtools.local`)."""

    GOLD_REPLAY = "gold_replay"  # replays each task's gold actions
    GOLD_REPLAY_SKIP_WRITE = "gold_replay_skip_write"  # the same, skipping the first write (reward 0)
    TINY = "tiny"  # a tiny random Qwen3-architecture model (the [tiny] extra: torch)


class Routing(Choice):
    """``policy.routing``: what each ``/generate`` call sends as ``X-SMG-Routing-Key`` (the key the
    router keeps on one worker, so that the worker's prefix cache holds what the next call resends).

    The default is ``group``: a GRPO group's members share their prompt (system prompt, tools, the
    task's first user turn), so on one worker it is prefilled once rather than once per member,
    and each member's later turns extend its own prefix there; with ``n_samples_per_task=1`` it is
    ``episode``. ``episode`` suits few, very large groups (a group is the unit of placement).
    """

    NONE = "none"  # no key: the router's policy alone picks the worker
    EPISODE = "episode"  # the episode id: every turn of an episode on one worker
    GROUP = "group"  # the group id: the n samples of a task (and all their turns) on one worker


class RouterPolicy(Choice):
    """``local.router_policy``: the ``--policy`` the local stack gives ``sglang-router`` (0.3.2's
    policies; :mod:`rollout.devtools.local.stack`)."""

    AUTO = "auto"  # the policy that honours X-SMG-Routing-Key: manual (with --assignment-mode min_group)
    MANUAL = "manual"  # sticky: a routing key stays on the worker it was first assigned
    CACHE_AWARE = "cache_aware"  # approximate radix tree of the prompts each worker saw, load balancing past thresholds
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    POWER_OF_TWO = "power_of_two"  # the less loaded of two random workers


class KVSignal(Choice):
    """``pool.adaptive_concurrency.signal``: how the workers' KV usage readings become one figure."""

    MAX = "max"  # the fullest worker (holds back as soon as any worker is full)
    MEAN = "mean"  # the mean over the workers read


class Placement(Choice):
    """``pool.adaptive_concurrency.placement``: who picks the worker of each ``/generate`` call
    while the KV gate is on (:mod:`rollout.core.policy.kvgate`)."""

    ROUTER = "router"  # the router (by policy.routing's key); the gate sees the workers as one KV pool
    # the gate: each routing key is placed on a worker of the actor's own part that has KV room
    # for it (the fewest keys first), sticky, and its calls go to that worker directly; the gate
    # holds calls per worker, so one full worker holds only its own keys
    GATE = "gate"


class LogLevel(Choice):
    """``logging.level`` / ``logging.tau2_level``: a level name, in any case (``info`` is ``INFO``)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"

    @classmethod
    def _missing_(cls, value: object) -> LogLevel | None:
        upper = value.upper() if isinstance(value, str) else None
        return next((m for m in cls if m.value == upper), None)


def plain_values(value: Any) -> Any:
    """``value`` with every :class:`Choice` replaced by its value string (dicts and lists walked)."""
    if isinstance(value, Choice):
        return value.value
    if isinstance(value, dict):
        return {k: plain_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_values(v) for v in value]
    return value


def choice_of(tp: Any) -> tuple[type[Choice] | None, bool]:
    """``(the Choice enum, nullable)`` of a field type (``X`` or ``Optional[X]``); ``(None, False)``
    for any other type."""
    args = typing.get_args(tp)
    nullable = type(None) in args
    if nullable:
        tp = next((a for a in args if a is not type(None)), None)
    if isinstance(tp, type) and issubclass(tp, Choice):
        return tp, nullable
    return None, False


def values_to_names(node: Any, schema: type) -> Any:
    """Rewrite, in place, every choice value in ``node`` to its member's name, and return ``node``.

    omegaconf 2.4 accepts a member's value (``keep``) or name (``KEEP``) for an enum field;
    omegaconf 2.3 (which hydra-core 1.3 pins, so every environment with verl has it) accepts
    the name only and refuses ``policy.on_length: keep``. Names are accepted by both, so YAML and
    ``key=value`` overrides are rewritten before they are merged into the schema. Anything that is
    not a choice's value is left for omegaconf (and :mod:`rollout.core.config`) to refuse.

    Args:
        node: an omegaconf ``DictConfig`` (a loaded YAML file or a dot-list), or anything else
            (returned as it is).
        schema: the dataclass whose fields ``node``'s keys are (:class:`rollout.core.config.Config`).
    """
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig) or not dataclasses.is_dataclass(schema):
        return node
    hints = typing.get_type_hints(schema)
    for key in list(node.keys()):
        tp = hints.get(str(key))
        if tp is None:
            continue
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
        if dataclasses.is_dataclass(tp):
            values_to_names(node[key], tp)
        elif isinstance(tp, type) and issubclass(tp, Choice):
            value = node._get_node(key)._value()
            member = None
            if isinstance(value, str):  # a value, else a value or name in another case (omegaconf 2.4 takes any case)
                member = next((m for m in tp if value == m.value), None) or next(
                    (m for m in tp if value.lower() in (m.value.lower(), m.name.lower())), None)
            if member is not None:
                node[key] = member.name
    return node
