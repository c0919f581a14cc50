"""The places that record, each a small class holding its bound instruments (bound once; one
``record`` per event):

* :class:`PolicyMetrics`: the ``/generate`` client's calls, retries and circuit breaker
  (:class:`~rollout.core.policy.HTTPPolicyClient`, in each actor);
* :class:`MeteredEnvironment`: an episode's user-simulator turns and tool calls, timed around each
  ``reset`` / ``step`` of the environment seam (the worker wraps the benchmark's environment in it;
  the benchmarks do not change);
* :class:`DeliveryMetrics`: the per-episode figures of a delivered episode, from its
  :class:`~rollout.core.metrics.EpisodeMetrics` and timings (the pool's ledger, in the driver:
  exactly once per episode).
"""

from __future__ import annotations

from typing import Any

from rollout.core.environment import Action, Environment, StepResult, ToolTimeoutError, UserSimulatorError
from rollout.core.metrics import UNSET, EpisodeMetrics
from rollout.core.records import EpisodeStatus, InteractionResult
from rollout.core.telemetry import registry as R
from rollout.core.telemetry.recorder import Instrument, Recorder

__all__ = ["FINISH_TYPES", "DeliveryMetrics", "EnvironmentMetrics", "MeteredEnvironment", "PolicyMetrics"]

FINISH_TYPES = frozenset({"stop", "length", "abort"})  # SGLang's finish_reason.type values


class PolicyMetrics:
    """The ``/generate`` client's instruments (tags: the recorder's ``domain`` and ``actor``).

    Args:
        recorder: where they go.

    Attributes:
        failures, retries, outages, breaker_open: bound instruments the client records directly
            (:data:`~rollout.core.telemetry.registry.GENERATE_FAILURES`, ``GENERATE_RETRIES``,
            ``BACKEND_OUTAGES``, ``BREAKER_OPEN``).
    """

    def __init__(self, recorder: Recorder):
        self._recorder = recorder
        self._by_finish: dict[str, Instrument] = {}
        self.latency = recorder.bind(R.GENERATE_LATENCY)
        self.tokens_in = recorder.bind(R.GENERATE_INPUT_TOKENS)
        self.tokens_out = recorder.bind(R.GENERATE_OUTPUT_TOKENS)
        self.version = recorder.bind(R.POLICY_WEIGHT_VERSION)
        self.failures = recorder.bind(R.GENERATE_FAILURES)
        self.retries = recorder.bind(R.GENERATE_RETRIES)
        self.outages = recorder.bind(R.BACKEND_OUTAGES)
        self.breaker_open = recorder.bind(R.BREAKER_OPEN)
        self._last_version: str | None = None

    def answered(self, finish: str, latency_s: float, input_tokens: int, output_tokens: int, weight_version: str | None) -> None:
        """One ``/generate`` call answered.

        Args:
            finish: its ``finish_reason.type`` (``stop`` | ``length`` | ``abort``; any other value is
                tagged ``other``).
            latency_s: the answering attempt's round trip, seconds.
            input_tokens: the ids it sent.
            output_tokens: the ids it generated.
            weight_version: ``meta_info.weight_version`` (the gauge is set when it is an integer).
        """
        inst = self._by_finish.get(finish)
        if inst is None:
            tag = finish if finish in FINISH_TYPES else "other"  # a tag's values stay bounded, whatever a server answers
            inst = self._by_finish[finish] = self._recorder.bind(R.GENERATE_REQUESTS, finish=tag)
        inst.record(1)
        self.latency.record(latency_s)
        self.tokens_in.record(input_tokens)
        self.tokens_out.record(output_tokens)
        if weight_version != self._last_version:
            self._last_version = weight_version
            try:
                self.version.record(int(weight_version))  # type: ignore[arg-type]
            except (TypeError, ValueError):  # "default", or None: not a number
                pass


class EnvironmentMetrics:
    """The user-simulator and tool instruments of one actor (tags: the recorder's ``domain`` and
    ``actor``), shared by its episodes' :class:`MeteredEnvironment` s.

    Args:
        recorder: where they go.
    """

    def __init__(self, recorder: Recorder):
        self.user_latency = recorder.bind(R.USER_LATENCY)
        self.user_errors = recorder.bind(R.USER_ERRORS)
        self.tool_latency = recorder.bind(R.TOOL_LATENCY)
        self.tool_timeouts = recorder.bind(R.TOOL_TIMEOUTS)
        self.tool_errors = recorder.bind(R.TOOL_ERRORS)


class MeteredEnvironment:
    """An :class:`~rollout.core.environment.Environment` that records its user-simulator turns and
    tool calls; everything else is the wrapped environment's (attributes are read through).

    The seam's ``timings`` say where each call's time went (``user_s``: the user simulator,
    ``tool_s``: the agent's tools; the tau2 and tau-bench adapters add to them whether the call
    returns or raises): after each ``reset`` / ``step`` the time each one gained is one
    observation of :data:`~rollout.core.telemetry.registry.USER_LATENCY` /
    :data:`~rollout.core.telemetry.registry.TOOL_LATENCY` (a step makes at most one such call: a
    tool action runs one tool, a reply gets one user turn). A
    :class:`~rollout.core.environment.UserSimulatorError` counts a user error, a
    :class:`~rollout.core.environment.ToolTimeoutError` a tool timeout (both re-raised), and a
    tool result flagged ``StepResult.tool_error`` a tool error.

    Args:
        env: the episode's environment.
        metrics: the actor's :class:`EnvironmentMetrics`.
    """

    def __init__(self, env: Environment, metrics: EnvironmentMetrics):
        self._env = env
        self._m = metrics

    @property
    def timings(self) -> dict[str, float]:
        """The wrapped environment's timings."""
        return self._env.timings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def _spent(self) -> tuple[float, float]:
        t = getattr(self._env, "timings", None) or {}
        return t.get("user_s", 0.0), t.get("tool_s", 0.0)

    def _observe(self, before: tuple[float, float]) -> None:
        user, tool = self._spent()
        if user > before[0]:
            self._m.user_latency.record(user - before[0])
        if tool > before[1]:
            self._m.tool_latency.record(tool - before[1])

    async def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """The wrapped ``reset`` (the user's opening is one user-simulator turn)."""
        before = self._spent()
        try:
            return await self._env.reset(task_id)
        except UserSimulatorError:
            self._m.user_errors.record(1)
            raise
        finally:
            self._observe(before)

    async def step(self, action: Action) -> StepResult:
        """The wrapped ``step``."""
        before = self._spent()
        try:
            out = await self._env.step(action)
        except UserSimulatorError:
            self._m.user_errors.record(1)
            raise
        except ToolTimeoutError:
            self._m.tool_timeouts.record(1)
            raise
        finally:
            self._observe(before)
        if out.tool_error:
            self._m.tool_errors.record(1)
        return out


class DeliveryMetrics:
    """The per-episode figures of delivered episodes (driver side; tag: the recorder's ``domain``).

    Args:
        recorder: where they go.
    """

    def __init__(self, recorder: Recorder):
        self._recorder = recorder
        self._finished = {st: recorder.bind(R.EPISODES_FINISHED, status=st.value) for st in EpisodeStatus}
        self.submitted = recorder.bind(R.EPISODES_SUBMITTED)
        self._duration = recorder.bind(R.EPISODE_DURATION)
        self._turns = recorder.bind(R.EPISODE_TURNS)
        self._reward = recorder.bind(R.REWARD)
        self._rewards = recorder.bind(R.REWARDS)

    def delivered(self, result: InteractionResult) -> None:
        """Record one delivered episode: its status; its duration and turns when it ran on an
        actor (its metadata has timings: not an ``actor_lost`` one, nor one cancelled before it
        started); its reward when its status is a policy outcome."""
        st = result.status
        self._finished[st].record(1)
        m = EpisodeMetrics.from_metadata(result.metadata)
        if m.timings is not UNSET and m.timings:
            total = m.timings.get("total_s")
            if total is not None:
                self._duration.record(float(total))
            self._turns.record(m.turns)
        if not st.is_infrastructure_failure and st is not EpisodeStatus.CANCELLED:
            self._reward.record(float(result.reward))
            self._rewards.record(float(result.reward))
