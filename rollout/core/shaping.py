"""Reward shaping: opt-in changes to the reward trainers consume, the benchmark's own reward always
kept beside it (``rollout.reward_shaping``).

A sample's ``reward`` is what trainers consume; its ``raw_reward`` is the benchmark's own (tau2's
``evaluate_simulation`` reward), never shaped (:class:`rollout.core.records.TrainingSample`).
Without shapers (the default, ``rollout.reward_shaping.shapers: []``) the two are equal.
``rollout.reward_shaping.shapers`` names shapers, applied in order to every episode the benchmark
graded (status ``completed``): each gets the reward so far (the raw reward for the first) and
what the episode earned (:class:`EpisodeReward`) and answers the next reward. Other statuses keep
their reward (0.0): an infrastructure failure never gets a shaped reward.

Built in (each a factory of the ``rollout.reward_shaping`` section, in :data:`REWARD_SHAPERS`):

* ``partial_credit``: the mean of the reward basis's components (tau2's ``reward_breakdown``:
  ``DB``, ``COMMUNICATE``, ``ENV_ASSERTION``, ...) instead of their product (tau2's reward is 1.0
  only when every component is). It replaces the benchmark's reward, so it must come first.
  A task without a breakdown keeps its reward.
* ``action_aware``: counts the task's expected actions, which tau2 lists and checks
  (``ActionCheck.action_match``) but leaves out of the reward unless ``ACTION`` is in the reward
  basis (tau2-bench issue #224: 43 of 50 airline tasks list actions, none counts them, which
  invites reward hacking): ``reward * ((1 - w) + w * matched / expected)`` with
  ``w = rollout.reward_shaping.action_weight``. tau2's maintainers note that an expected read
  action is one reference trajectory's, not always necessary (tau2-bench PR #314): a weight below
  1 keeps part of the reward for an episode that reached the goal another way. A task without
  expected actions keeps its reward.
* ``turn_discount``: ``reward * gamma ** (turns - 1)`` with ``gamma =
  rollout.reward_shaping.turn_discount`` and ``turns`` the episode's assistant turns: the
  discounted return, seen from the first turn, of a reward that arrives at the last one
  (Sutton and Barto, "Reinforcement Learning", 2nd ed., eq. 3.8), so the same outcome in fewer
  turns earns more.

What each shaper answered is kept in the episode's ``metadata["reward_shaping"]`` (a list of
``{"shaper": name, "reward": value}`` in order; left out without shapers).

Adding one: a factory ``factory(section) -> RewardShaper`` (``section``: the
``rollout.reward_shaping`` config) registered with :func:`register_reward_shaper` (by path, so
that the Ray actors, where episodes end, find it), or a ``tau_rollout.reward_shapers`` entry
point; then name it in ``rollout.reward_shaping.shapers``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from rollout.core.records import EpisodeStatus, InteractionResult
from rollout.core.registry import Registry

__all__ = ["REWARD_SHAPERS", "ActionAware", "EpisodeReward", "PartialCredit", "RewardShaper", "RewardShaping", "TurnDiscount",
           "register_reward_shaper", "reward_shapers", "unregister_reward_shaper"]

SHAPING_KEY = "reward_shaping"  # the metadata key of what each shaper answered
FIRST_ONLY = ("partial_credit",)  # shapers that replace the benchmark's reward: first in the list, or not at all


@dataclass(frozen=True)
class EpisodeReward:
    """What a shaper sees of one graded episode.

    Attributes:
        raw_reward: the benchmark's reward (tau2's, in [0, 1]).
        reward_info: the benchmark's breakdown of it (``metadata["reward_info"]``; for tau2:
            ``reward_breakdown`` {reward type: value in [0, 1]}, ``db_match``, ``action_match``
            (one bool per expected action, or None), ``communicate_met``), or None.
        turns: the episode's assistant turns.
    """

    raw_reward: float
    reward_info: Mapping[str, Any] | None
    turns: int

    @property
    def breakdown(self) -> dict[str, float]:
        """The reward basis's components (``reward_info["reward_breakdown"]``; empty without one)."""
        info = self.reward_info or {}
        return {str(k): float(v) for k, v in (info.get("reward_breakdown") or {}).items()}

    @property
    def action_matches(self) -> list[bool]:
        """One bool per expected action of the task: whether the episode made it (tau2's
        ``ActionCheck.action_match``); empty when the task lists none."""
        return [bool(m) for m in (self.reward_info or {}).get("action_match") or []]


class RewardShaper(Protocol):
    """One named step of reward shaping."""

    def shape(self, reward: float, episode: EpisodeReward) -> float:
        """The reward after this step.

        Args:
            reward: the reward so far (the raw reward for the first shaper).
            episode: what the episode earned.

        Returns:
            The next reward (a finite float).
        """
        ...


@dataclass(frozen=True)
class PartialCredit:
    """``partial_credit``: the mean of the reward basis's components, in place of their product
    (module docstring). Ignores the incoming reward: first in the list."""

    def shape(self, reward: float, episode: EpisodeReward) -> float:
        parts = episode.breakdown
        return sum(parts.values()) / len(parts) if parts else reward


@dataclass(frozen=True)
class ActionAware:
    """``action_aware``: ``reward * ((1 - weight) + weight * matched / expected)`` (module docstring).

    Args:
        weight: in [0, 1]; 1: the reward scales with the share of expected actions made, 0: no change.
    """

    weight: float = 1.0

    def shape(self, reward: float, episode: EpisodeReward) -> float:
        matches = episode.action_matches
        if not matches:
            return reward
        return reward * ((1.0 - self.weight) + self.weight * sum(matches) / len(matches))


@dataclass(frozen=True)
class TurnDiscount:
    """``turn_discount``: ``reward * gamma ** (turns - 1)`` (module docstring).

    Args:
        gamma: in (0, 1].
    """

    gamma: float = 0.99

    def shape(self, reward: float, episode: EpisodeReward) -> float:
        return reward * self.gamma ** max(episode.turns - 1, 0)


def _partial_credit(section: Any) -> RewardShaper:
    return PartialCredit()


def _action_aware(section: Any) -> RewardShaper:
    return ActionAware(float(section.action_weight))


def _turn_discount(section: Any) -> RewardShaper:
    return TurnDiscount(float(section.turn_discount))


# name -> factory(section) -> RewardShaper (section: the rollout.reward_shaping config), or its path
REWARD_SHAPERS: Registry[Callable[[Any], RewardShaper]] = Registry("reward_shaper", "rollout.reward_shaping.shapers")
REWARD_SHAPERS.register("partial_credit", _partial_credit)
REWARD_SHAPERS.register("action_aware", _action_aware)
REWARD_SHAPERS.register("turn_discount", _turn_discount)


def register_reward_shaper(name: str, factory: Callable[[Any], RewardShaper] | str, *, replace: bool = False) -> None:
    """Add a reward shaper for ``rollout.reward_shaping.shapers``.

    Args:
        name: its name in ``rollout.reward_shaping.shapers``.
        factory: ``factory(section) -> shaper`` (``section``: the ``rollout.reward_shaping``
            config; the shaper's ``shape(reward, episode)`` returns the new reward), or the
            ``"package.module:attribute"`` path of the factory, imported on first use. Shapers run
            where episodes end (the Ray actors, a trainer's own workers): register a path so that
            they find it.
        replace: replace a shaper registered under ``name``.

    Raises:
        ValueError: ``name`` is empty, taken (and ``replace`` is false), or holds a ``:`` (a name
            is a word: a factory's import path goes in ``factory``).
    """
    REWARD_SHAPERS.register(name, factory, replace=replace)


def unregister_reward_shaper(name: str) -> None:
    """Remove reward shaper ``name``.

    Raises:
        rollout.core.registry.UnknownNameError: no such shaper (a ``KeyError``).
    """
    REWARD_SHAPERS.unregister(name)


def reward_shapers() -> list[str]:
    """The registered reward shapers' names (built-ins first)."""
    return REWARD_SHAPERS.names()


@dataclass(frozen=True)
class RewardShaping:
    """The shapers ``rollout.reward_shaping`` names, built once per process, applied in order.

    Attributes:
        steps: ``(name, shaper)`` pairs in order; empty: no shaping (``reward == raw_reward``).
    """

    steps: tuple[tuple[str, RewardShaper], ...] = ()

    @classmethod
    def from_config(cls, section: Any | None) -> "RewardShaping":
        """The shaping of a ``rollout.reward_shaping`` section (``None``: none).

        Raises:
            rollout.core.registry.UnknownNameError: a name no shaper is registered under.
            ImportError, AttributeError: a registered path cannot be imported.
        """
        if section is None:
            return cls()
        return cls(tuple((name, REWARD_SHAPERS.get(name)(section)) for name in section.shapers))

    @property
    def names(self) -> list[str]:
        """The shapers' names, in order."""
        return [name for name, _ in self.steps]

    def apply(self, result: InteractionResult, turns: int | None = None) -> InteractionResult:
        """Shape ``result``'s reward in place (and return it): ``raw_reward`` keeps the
        benchmark's reward, ``reward`` becomes the last shaper's answer and
        ``metadata["reward_shaping"]`` lists each step's. Without shapers, or for an episode the
        benchmark did not grade (a status other than ``completed``), only ``raw_reward`` is set
        (to the reward).

        Args:
            result: the episode's result, its ``reward`` the benchmark's.
            turns: the episode's assistant turns (``None``: ``metadata["turns"]``).

        Raises:
            ValueError: a shaper answered a value that is not a finite number (naming it).
        """
        raw = float(result.reward if result.raw_reward is None else result.raw_reward)
        result.raw_reward = raw
        if not self.steps or result.status is not EpisodeStatus.COMPLETED:
            return result
        episode = EpisodeReward(raw, result.metadata.get("reward_info"), int(result.metadata.get("turns", 0) if turns is None else turns))
        reward, trace = raw, []
        for name, shaper in self.steps:
            value = shaper.shape(reward, episode)
            try:
                reward = float(value)
            except (TypeError, ValueError):
                reward = math.nan
            if not math.isfinite(reward):
                raise ValueError(f"reward shaper {name!r} answered {value!r} for episode {result.spec.episode_id}: not a finite number")
            trace.append({"shaper": name, "reward": reward})
        result.reward = reward
        result.metadata[SHAPING_KEY] = trace
        return result


def check_shaper_names(names: Sequence[str]) -> str | None:
    """What is wrong with the order of ``rollout.reward_shaping.shapers`` (a shaper that
    replaces the benchmark's reward, :data:`FIRST_ONLY`, anywhere but first; a name twice), or None."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            return f"names {name!r} twice"
        seen.add(name)
        if name in FIRST_ONLY and i != 0:
            return f"{name} replaces the benchmark's reward, so it must come first (got {list(names)})"
    return None
