"""The episode loop: one multi-turn tau-bench conversation, token in / token out.

Plain asyncio, no Ray (docs/design.md invariant 6). :func:`run_episode` is the seed's ``asolve``
redone: the trajectory is append-only (each request's ``input_ids`` is the trajectory so far, each
answer's ids are appended as sampled), only non-assistant messages are tokenized (as template
deltas), every step has a timeout, and every way an episode can end is a typed
:class:`~rollout.core.records.EpisodeStatus`. It never raises for anything a model, a tool, a user
simulator or a server does.

The event loop never calls the tokenizer: rendering, encoding and decoding run in threads
(:func:`~rollout.core.prompts.off_loop`), each bounded by ``policy.tokenize_timeout_s``, because the chat template
serialises calls into the Rust tokenizer with a lock that threads hold while they encode large
prompts. A call past its bound raises :class:`TokenizeTimeout`, which ends the episode
``policy_error`` (termination reason ``tokenize_timeout``) in one place.

What an episode counted goes into the record's ``metadata`` through
:class:`~rollout.core.metrics.EpisodeMetrics`.

How each turn's prompt is built is :class:`~rollout.core.prompts.Prompts`' job: ``policy.history=append`` extends the
live sequence with the new messages' delta; ``rerender`` renders the conversation so far whole and
extends the live sequence when the rendering does, else starts a new segment
(:meth:`Trajectory.start_segment`). When the next prompt would leave less than
``policy.context_headroom_tokens`` for the turn, ``policy.context_strategy``
(:mod:`rollout.core.context`) may compact the conversation; the compacted one starts a new segment.
The sampled ids are always the server's, never re-tokenized.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rollout.core.config import OnLength, OnParseError, PartialRollout
from rollout.core.environment import (
    RESPOND,
    Action,
    Environment,
    EnvironmentStepError,
    RewardError,
    StepResult,
    ToolTimeoutError,
    UserSimulatorError,
)
from rollout.core.formats import ChatFormat, ParsedTurn, ParseError, TemplateError, ToolCall
from rollout.core.metrics import EpisodeMetrics
from rollout.core.policy import PolicyClient, PolicyServerError
from rollout.core.prompts import ContextStrategyError, Prompts, TokenizeTimeout, off_loop, prompt_trajectory
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult
from rollout.core.settings import EpisodeSettings
from rollout.core.trajectory import Trajectory

logger = logging.getLogger(__name__)

# The in-band feedback on a turn that does not parse (policy.on_parse_error=feedback); ``hint`` is
# the chat format's ChatFormat.call_hint.
PARSE_FEEDBACK = "[format error] Your last message could not be used: {error}. {hint}"


def request_id(spec: EpisodeSpec, request: int) -> str:
    """The ``rid`` of an episode's ``request``-th ``/generate`` call: ``{episode_id}@{attempt}#{request}``.
    A re-run attempt of the episode (its actor died) gets fresh ids; the client appends
    ``.r{n}`` to a call it retries."""
    return f"{spec.episode_id}@{spec.attempt}#{request}"


def parse_request_id(rid: str) -> tuple[str, int, int]:
    """``(episode_id, attempt, request)`` of a ``rid`` made by :func:`request_id` (a ``.r{n}``
    retry suffix is ignored).

    Raises:
        ValueError: ``rid`` is not of that form.
    """
    try:
        head, request = rid.rsplit("#", 1)
        eid, attempt = head.rsplit("@", 1)
        return eid, int(attempt), int(request.split(".", 1)[0])
    except ValueError:
        raise ValueError(f"not an episode request id: {rid!r}") from None


def _request_seed(spec: EpisodeSpec, request: int) -> int:
    """``sampling_seed`` of an episode's ``request``-th ``/generate`` call (a continued turn's
    second call gets a fresh seed, so it does not replay the random stream of the first)."""
    return (spec.seed * 1_000_003 + request) % (2**31 - 1)


@dataclass
class _Turn:
    """One assistant turn, possibly sampled by several ``/generate`` calls."""

    ids: list[int]
    finish_type: str
    interruptions: int = 0  # its /generate calls interrupted by a weight update
    status: EpisodeStatus | None = None  # set when the turn ends the episode
    error: str | None = None
    reason: str | None = None


async def _sample_turn(spec: EpisodeSpec, traj: Trajectory, policy: PolicyClient, chat: ChatFormat, settings: EpisodeSettings,
                       metrics: EpisodeMetrics) -> _Turn:
    """Sample one assistant turn into ``traj``, counting its calls and interruptions in ``metrics``.

    A call that ends ``abort`` because the pool paused generation for a weight update
    (``Generation.interrupted``) is handled by ``settings.partial_rollout``: ``continue`` keeps
    its tokens (sampled by the old weights, mask 1, with their log-probs and version) and asks for
    the rest of the turn, up to the turn's ``max_new_tokens`` in all; ``restart_turn`` discards
    the turn's tokens and samples it again; ``drop`` ends the episode ``aborted``. The next call
    waits at the actor's gate until the update is over. Any other abort ends the episode
    ``aborted``; a server failure ends it ``policy_error``.

    Raises:
        TokenizeTimeout: checking a continued turn for a straddled stop string ran past its bound.
    """
    start = traj.response_length
    turn = _Turn(ids=[], finish_type="stop")
    while True:
        budget = min(settings.max_new_tokens - len(turn.ids), settings.max_context_tokens - traj.context_length - len(chat.eot_ids))
        if budget <= 0:  # the interrupted call had already used the turn's (or the context's) budget
            turn.finish_type = "length"
            return turn
        n = metrics.requests
        try:
            gen = await policy.generate(traj.context_array(), max_new_tokens=budget, rid=request_id(spec, n), routing_key=spec.episode_id, seed=_request_seed(spec, n))
        except PolicyServerError as e:
            turn.status, turn.reason, turn.error = EpisodeStatus.POLICY_ERROR, "policy_error", str(e)
            return turn
        metrics.requests += 1
        for ids, log_probs, version in gen.pieces():  # one piece per weight version that sampled the call's ids
            traj.append_generated(ids, log_probs, version)
        turn.ids += gen.ids
        turn.finish_type = gen.finish_type
        if gen.finish_type != "abort":
            break
        if not gen.interrupted:
            turn.status, turn.reason, turn.error = EpisodeStatus.ABORTED, "abort", "the policy server aborted generation"
            return turn
        turn.interruptions += 1
        metrics.interruptions += 1
        metrics.interrupted_turns += int(turn.interruptions == 1)  # a turn with any interruption, whatever it becomes
        if settings.partial_rollout == PartialRollout.DROP:
            turn.status, turn.reason = EpisodeStatus.ABORTED, "weight_update"
            turn.error = "a weight update interrupted the turn (rollout.partial_rollout=drop)"
            return turn
        if settings.partial_rollout == PartialRollout.RESTART_TURN:
            metrics.discarded_tokens += traj.discard_from(start)
            turn.ids = []
    if turn.interruptions and settings.partial_rollout == PartialRollout.CONTINUE:
        cut = await off_loop(settings, _straddled_stop, chat, turn.ids, settings.stop)
        if cut is not None:  # the server would have stopped there, had the turn not been split
            metrics.discarded_tokens += traj.discard_from(start + cut)
            turn.ids = turn.ids[:cut]
            turn.finish_type = "stop"
    return turn


def _straddled_stop(chat: ChatFormat, ids: list[int], stops: tuple[str, ...]) -> int | None:
    """For a turn sampled by several calls: the length of its shortest prefix whose text holds a
    stop string, when that is shorter than the turn (else None). Blocking (it decodes): run it
    in a thread.

    Each call's server looks for stop strings in its own output only, so one split across an
    interruption goes unnoticed and the turn runs on past it. Where it completes is where a single
    call would have stopped; the tokens after it are dropped.

    A prefix that holds a stop string stays holding it as tokens are added, so the shortest one is
    found by bisection (about log2(len(ids)) decodes).
    """
    def holds(k: int) -> bool:
        text = chat.decode(ids[:k])
        return any(st in text for st in stops)

    if not stops or not holds(len(ids)):
        return None
    lo, hi = 0, len(ids)  # holds(lo) is False (the empty prefix), holds(hi) is True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi if hi < len(ids) else None


async def run_episode(
    spec: EpisodeSpec,
    env: Environment,
    policy: PolicyClient,
    chat: ChatFormat,
    settings: EpisodeSettings,
) -> InteractionResult:
    """Run one episode to its end.

    Args:
        spec: what to run.
        env: a fresh environment for this episode (owns the user simulator).
        policy: the ``/generate`` client.
        chat: the actor's chat format (:class:`~rollout.core.formats.ChatFormat`, tools already bound).
        settings: loop limits and prompt.

    Returns:
        An :class:`InteractionResult` whose trajectory satisfies invariant 1: ``tokens`` starts with
        every request's ``input_ids`` followed by that request's generated ids; ``loss_mask`` is 1
        exactly on generated ids; ``rollout_log_probs`` is aligned (0.0 where the mask is 0).
    """
    return await _Episode(spec, env, policy, chat, settings).run()


class _Episode:
    """One episode's state while :func:`run_episode` runs it, and its steps: :meth:`reset`, one
    :meth:`turn` at a time (sample, decode, parse, then the turn's environment steps in
    :meth:`act`), and :meth:`finish`, which makes the result. A step that ends the episode returns
    its :class:`InteractionResult`; ``None`` means the episode goes on.

    Attributes:
        messages: the conversation as recorded (system, user, assistant, tool messages, with the
            loop's marks: ``finish_reason``, ``parse_error``, ``format_feedback``).
        view: the conversation the policy is given (compacted, it differs from :attr:`messages`).
        traj: the token trajectory (None until the first prompt is tokenized).
        reward: the environment's reward once an episode ends ``completed`` (0.0 before).
    """

    def __init__(self, spec: EpisodeSpec, env: Environment, policy: PolicyClient, chat: ChatFormat, settings: EpisodeSettings):
        self.t_start = time.monotonic()
        self.spec, self.env, self.policy, self.chat, self.settings = spec, env, policy, chat, settings
        self.metrics = EpisodeMetrics()
        self.timings = {"generate_s": 0.0}
        self.messages: list[dict[str, Any]] = []
        self.view: list[dict[str, Any]] = []
        self.traj: Trajectory | None = None
        self.prompts: Prompts | None = None
        self.reward = 0.0

    def finish(self, st: EpisodeStatus, reason: str, error: str | None = None) -> InteractionResult:
        """The episode's result with status ``st``: its metrics (termination ``reason``, ``error``,
        timings: the environment's and ``total_s``, token counts) in ``metadata``; an ``error``
        is logged (a WARNING for an infrastructure failure, else INFO)."""
        metrics, timings, traj = self.metrics, self.timings, self.traj
        metrics.termination_reason = reason
        if error:
            metrics.error = error
            log = logger.warning if st.is_infrastructure_failure else logger.info
            log("episode %s (task %s): %s: %s", self.spec.episode_id, self.spec.task_id, st.value, error)
        timings.update({k: round(v, 4) for k, v in getattr(self.env, "timings", {}).items()})
        timings["total_s"] = round(time.monotonic() - self.t_start, 4)
        metrics.timings = timings
        if traj is not None:
            traj.expand()  # the record leaves the loop with lists
            traj.check()
            metrics.prompt_tokens = len(traj.prompt_ids)
            metrics.response_tokens = traj.response_length
            metrics.generated_tokens = sum(traj.loss_mask)
        return InteractionResult(spec=self.spec, status=st, reward=self.reward, trajectory=traj, messages=self.messages,
                                 metadata=metrics.to_metadata())

    async def run(self) -> InteractionResult:
        """Reset, tokenize the first prompt, run turns until one ends the episode or
        ``settings.max_steps`` have run (``max_steps``)."""
        ended = await self.reset()
        if ended is not None:
            return ended
        settings, chat = self.settings, self.chat
        # Every tokenizer call in a thread (the first prompt, decoding a turn, a delta, a continued
        # turn's stop-string check) may raise TokenizeTimeout: this one handler ends the episode.
        try:
            # the first prompt is ~6k tokens (policy + tool schemas): render and tokenize off the loop;
            # compact while it runs: the garbage collector does not walk its ids (see Trajectory)
            self.traj = await off_loop(settings, prompt_trajectory, chat, self.messages)
            self.prompts = Prompts(self.spec, self.traj, self.view, chat, self.policy, settings, self.metrics)
            for step in range(settings.max_steps):
                ended = await self.turn(last=step == settings.max_steps - 1)
                if ended is not None:
                    return ended
            return self.finish(EpisodeStatus.MAX_STEPS, "max_steps")
        except TokenizeTimeout as e:
            return self.finish(EpisodeStatus.POLICY_ERROR, "tokenize_timeout", str(e))
        except TemplateError as e:  # the chat format cannot render the conversation (a delta, a re-rendering)
            return self.finish(EpisodeStatus.POLICY_ERROR, "render_error", str(e))
        except ContextStrategyError as e:
            return self.finish(EpisodeStatus.ENV_ERROR, "context_strategy", str(e))

    async def reset(self) -> InteractionResult | None:
        """Open the task: the conversation starts with the system prompt and the user's opening
        message; a failing reset ends the episode ``user_error`` or ``env_error``."""
        try:
            opening, info = await self.env.reset(self.spec.task_id)
        except UserSimulatorError as e:
            return self.finish(EpisodeStatus.USER_ERROR, "user_error", str(e))
        except Exception as e:  # EnvironmentStepError or anything from environment code
            return self.finish(EpisodeStatus.ENV_ERROR, "env_error", f"reset: {e!r}")
        # an episode's own system prompt, when the environment gives one (a task-specific policy)
        system = (info or {}).get("system_prompt") if isinstance(info, dict) else None
        self.messages = [{"role": "system", "content": system or self.settings.system_prompt}, {"role": "user", "content": opening}]
        self.view[:] = self.messages
        return None

    def _room(self) -> int:
        """Tokens left for the next turn, keeping room for the end-of-turn repair (so that the
        trajectory stays within ``max_context_tokens``)."""
        return self.settings.max_context_tokens - self.traj.context_length - len(self.chat.eot_ids)

    async def turn(self, last: bool) -> InteractionResult | None:
        """One assistant turn: sample it, close and decode it, then parse it and act on it
        (``last``: the episode's last step, for the prompt's growth check)."""
        settings, metrics, chat = self.settings, self.metrics, self.chat
        if self._room() <= 0:
            return self.finish(EpisodeStatus.TRUNCATED, "context")
        turn = await self.sample()
        if turn.status is not None:
            return self.finish(turn.status, turn.reason or turn.status.value, turn.error)
        metrics.turns += 1
        body_ids, text = await self.close_and_decode(turn.ids)
        cut = {"finish_reason": "length"} if turn.finish_type == "length" else {}  # marks a cut turn in the conversation
        if cut:
            metrics.length_finishes += 1
            context_full = self._room() <= 0  # no room for another turn
            if context_full or settings.on_length == OnLength.TRUNCATE:
                # the cut text never reaches the user or a tool as if it were the whole turn
                self.messages.append({"role": "assistant", "content": text, **cut})
                return self.finish(EpisodeStatus.TRUNCATED, "context" if context_full else "turn_length")
        try:
            parsed = chat.parse_turn(_strip_trailing_specials(text, chat), settings.tool_names, body_ids)
        except ParseError as e:
            return await self.on_parse_error(e, text, cut, last)
        return await self.act(parsed, cut, last)

    async def sample(self) -> _Turn:
        """Sample one assistant turn (:func:`_sample_turn`), timed into ``generate_s``; a turn
        that went on after its interruptions counts as continued or restarted."""
        settings, metrics = self.settings, self.metrics
        t0 = time.monotonic()
        try:
            turn = await _sample_turn(self.spec, self.traj, self.policy, self.chat, settings, metrics)
        finally:
            self.timings["generate_s"] += time.monotonic() - t0
        if turn.interruptions and turn.status is None:
            metrics.continued_turns += int(settings.partial_rollout == PartialRollout.CONTINUE)
            metrics.restarted_turns += int(settings.partial_rollout == PartialRollout.RESTART_TURN)
        return turn

    async def close_and_decode(self, gen_ids: list[int]) -> tuple[list[int], str]:
        """``(body ids, text)`` of a sampled turn: its ids without the end-of-turn ids, decoded.
        A turn that stopped on a stop string, on ``max_new_tokens`` or on another stop id is closed
        with the template's end-of-turn tokens, which the policy did not sample (mask 0)."""
        chat = self.chat
        closed = chat.ends_turn(gen_ids)
        body_ids = gen_ids[: len(gen_ids) - len(chat.eot_ids)] if closed else gen_ids
        text = chat.try_decode_now(body_ids)  # a short turn: cheaper here than a thread hand-off
        if text is None:
            text = await off_loop(self.settings, chat.decode, body_ids)
        if not closed:
            self.traj.append_context(chat.eot_ids)
            self.metrics.turn_boundary_repairs += 1
        return body_ids, text

    async def on_parse_error(self, e: ParseError, text: str, cut: dict[str, str], last: bool) -> InteractionResult | None:
        """A turn that does not parse: recorded with its ``parse_error``; by
        ``policy.on_parse_error``, the episode ends ``parse_error`` or the policy gets the format
        feedback (:data:`PARSE_FEEDBACK`) as the user's next turn."""
        self.metrics.parse_errors += 1
        self.messages.append({"role": "assistant", "content": text, "parse_error": str(e), **cut})
        self.view.append(self.messages[-1])
        if self.settings.on_parse_error == OnParseError.ABORT:
            return self.finish(EpisodeStatus.PARSE_ERROR, "parse_error", str(e))
        feedback = {"role": "user", "content": PARSE_FEEDBACK.format(error=e, hint=self.chat.call_hint)}
        self.messages.append({**feedback, "format_feedback": True})
        self.view.append(feedback)
        if not await self.prompts.advance([feedback], last):
            return self.finish(EpisodeStatus.TRUNCATED, "context")
        return None

    async def act(self, parsed: ParsedTurn, cut: dict[str, str], last: bool) -> InteractionResult | None:
        """Record the parsed turn and run its actions: one environment step per tool call, in the
        order written (as tau2's orchestrator executes a turn's calls); a reply is one step. The
        answers are appended as one delta; a step that ends the episode ends it ``completed``
        with the environment's reward."""
        call_id = f"call_{self.metrics.turns}"
        self.messages.append({**parsed.to_message(call_id), **cut})
        self.view.append(self.messages[-1])
        if parsed.tool_calls:
            actions = [Action(name=c.name, arguments=c.arguments, content=parsed.content if i == 0 else "")
                       for i, c in enumerate(parsed.tool_calls)]
            call_ids = parsed.call_ids(call_id)  # a call keeps the id the model wrote (Mistral v3-v11)
        else:
            actions, call_ids = [Action(name=RESPOND, content=parsed.content)], [call_id]
        answers: list[dict[str, Any]] = []
        for action, cid in zip(actions, call_ids):
            res = await self.step(action)
            if isinstance(res, InteractionResult):
                return res
            self.metrics.tool_errors += int(res.tool_error)
            answer = _observation_message(res, action, cid)
            if res.done:
                self.reward = float(res.reward)
                self.metrics.reward_info = res.reward_info
                self.messages.extend(answers + [answer])
                return self.finish(EpisodeStatus.COMPLETED, res.termination or "done")
            answers.append(answer)
        self.messages.extend(answers)
        self.view.extend(answers)
        # append's delta: what the template renders of tool results (with their call) or the user's turn
        if not await self.prompts.advance([_rendered(a, parsed.tool_calls) for a in answers], last):
            return self.finish(EpisodeStatus.TRUNCATED, "context")
        return None

    async def step(self, action: Action) -> StepResult | InteractionResult:
        """One environment step; each of the seam's errors ends the episode with its status
        (anything else from environment code, or an answer that is not a :class:`StepResult`:
        ``env_error``)."""
        try:
            res = await self.env.step(action)
            if not isinstance(res, StepResult):
                raise TypeError(f"Environment.step must return a StepResult, got {type(res).__name__}")
            return res
        except ToolTimeoutError as e:
            return self.finish(EpisodeStatus.TOOL_TIMEOUT, "tool_timeout", str(e))
        except UserSimulatorError as e:
            return self.finish(EpisodeStatus.USER_ERROR, "user_error", str(e))
        except RewardError as e:
            return self.finish(EpisodeStatus.EVAL_ERROR, "eval_error", str(e))
        except EnvironmentStepError as e:
            return self.finish(EpisodeStatus.ENV_ERROR, "env_error", str(e))
        except Exception as e:  # a bug in environment code must not crash the actor
            return self.finish(EpisodeStatus.ENV_ERROR, "env_error", f"step: {e!r}")


def _observation_message(res: StepResult, action: Action, call_id: str) -> dict[str, Any]:
    """The conversation's record of what answered one step: a tool result as OpenAI's
    ``{"role": "tool", "tool_call_id", "name", "content"}`` (with ``"error": true`` when the tool
    failed, as tau2's ``ToolMessage.error``), else the user's turn ``{"role": "user", "content"}``."""
    if res.role == "tool" and action.name != RESPOND:
        msg = {"role": "tool", "tool_call_id": call_id, "name": action.name, "content": res.observation}
        if res.tool_error:
            msg["error"] = True
        return msg
    return {"role": res.role, "content": res.observation}


def _rendered(answer: dict[str, Any], calls: Iterable[ToolCall] = ()) -> dict[str, Any]:
    """What a chat format renders of an answer: ``{"role": "tool" | "user", "content"}``, and a tool
    result's ``tool_call_id`` only when the model wrote that id with one of the turn's ``calls``
    (Mistral v3-v11, whose result echoes it). The loop's own ids (``call_N``) and the tool's name
    are left out: the delta must not depend on them, and the hermes format's probed affixes take
    role and content only."""
    msg = {"role": "tool" if answer["role"] == "tool" else "user", "content": answer["content"]}
    if msg["role"] == "tool" and any(c.id is not None and c.id == answer.get("tool_call_id") for c in calls):
        msg["tool_call_id"] = answer["tool_call_id"]
    return msg


def _strip_trailing_specials(text: str, chat: ChatFormat) -> str:
    """Drop end-of-sequence texts (e.g. ``<|endoftext|>``) a model may end a turn with."""
    tok = chat.tokenizer
    ends = {t for t in (getattr(tok, "eos_token", None), getattr(tok, "pad_token", None)) if t}
    changed = True
    while changed:
        changed = False
        for e in ends:
            if text.endswith(e):
                text = text[: -len(e)]
                changed = True
    return text
