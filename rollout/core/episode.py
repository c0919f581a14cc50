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
from dataclasses import dataclass
from typing import Any

from rollout.core.config import OnLength, OnParseError, PartialRollout
from rollout.core.environment import RESPOND, Action, Environment, EnvironmentStepError, RewardError, ToolTimeoutError, UserSimulatorError
from rollout.core.formats import ChatFormat, ParseError, TemplateError
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
        traj.append_generated(gen.ids, gen.log_probs, gen.weight_version)
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
    t_start = time.monotonic()
    eid = spec.episode_id
    metrics = EpisodeMetrics()
    timings = {"generate_s": 0.0}
    messages: list[dict[str, Any]] = []
    traj: Trajectory | None = None
    reward = 0.0

    def finish(st: EpisodeStatus, reason: str, error: str | None = None) -> InteractionResult:
        metrics.termination_reason = reason
        if error:
            metrics.error = error
            log = logger.warning if st.is_infrastructure_failure else logger.info
            log("episode %s (task %s): %s: %s", eid, spec.task_id, st.value, error)
        timings.update({k: round(v, 4) for k, v in getattr(env, "timings", {}).items()})
        timings["total_s"] = round(time.monotonic() - t_start, 4)
        metrics.timings = timings
        if traj is not None:
            traj.expand()  # the record leaves the loop with lists
            traj.check()
            metrics.prompt_tokens = len(traj.prompt_ids)
            metrics.response_tokens = traj.response_length
            metrics.generated_tokens = sum(traj.loss_mask)
        return InteractionResult(spec=spec, status=st, reward=reward, trajectory=traj, messages=messages, metadata=metrics.to_metadata())

    # -- reset ---------------------------------------------------------------------------------
    try:
        opening, _ = await env.reset(spec.task_id)
    except UserSimulatorError as e:
        return finish(EpisodeStatus.USER_ERROR, "user_error", str(e))
    except Exception as e:  # EnvironmentStepError or anything from environment code
        return finish(EpisodeStatus.ENV_ERROR, "env_error", f"reset: {e!r}")
    messages = [{"role": "system", "content": settings.system_prompt}, {"role": "user", "content": opening}]
    view = list(messages)  # the conversation the policy is given (compacted, it differs from messages)
    # Every tokenizer call in a thread (the first prompt, decoding a turn, a delta, a continued
    # turn's stop-string check) may raise TokenizeTimeout: this one handler ends the episode.
    try:
        # the first prompt is ~6k tokens (policy + tool schemas): render and tokenize off the loop;
        # compact while it runs: the garbage collector does not walk its ids (see Trajectory)
        traj = await off_loop(settings, prompt_trajectory, chat, messages)
        prompts = Prompts(spec, traj, view, chat, policy, settings, metrics)

        # -- turns -----------------------------------------------------------------------------
        for step in range(settings.max_steps):
            last = step == settings.max_steps - 1
            # room for the end-of-turn repair keeps the trajectory within max_context_tokens
            if settings.max_context_tokens - traj.context_length - len(chat.eot_ids) <= 0:
                return finish(EpisodeStatus.TRUNCATED, "context")
            t0 = time.monotonic()
            try:
                turn = await _sample_turn(spec, traj, policy, chat, settings, metrics)
            finally:
                timings["generate_s"] += time.monotonic() - t0
            if turn.interruptions and turn.status is None:  # the turn went on after its interruptions
                metrics.continued_turns += int(settings.partial_rollout == PartialRollout.CONTINUE)
                metrics.restarted_turns += int(settings.partial_rollout == PartialRollout.RESTART_TURN)
            if turn.status is not None:
                return finish(turn.status, turn.reason or turn.status.value, turn.error)
            gen_ids = turn.ids
            metrics.turns += 1
            closed = chat.ends_turn(gen_ids)
            body_ids = gen_ids[: len(gen_ids) - len(chat.eot_ids)] if closed else gen_ids
            text = chat.try_decode_now(body_ids)  # a short turn: cheaper here than a thread hand-off
            if text is None:
                text = await off_loop(settings, chat.decode, body_ids)
            if not closed:
                # Stopped on a stop string, on max_new_tokens or on another stop id: close the turn
                # with the template's end-of-turn tokens, which the policy did not sample (mask 0).
                traj.append_context(chat.eot_ids)
                metrics.turn_boundary_repairs += 1
            cut = {"finish_reason": "length"} if turn.finish_type == "length" else {}  # marks a cut turn in the conversation
            if cut:
                metrics.length_finishes += 1
                context_full = settings.max_context_tokens - traj.context_length - len(chat.eot_ids) <= 0  # no room for another turn
                if context_full or settings.on_length == OnLength.TRUNCATE:
                    # the cut text never reaches the user or a tool as if it were the whole turn
                    messages.append({"role": "assistant", "content": text, **cut})
                    return finish(EpisodeStatus.TRUNCATED, "context" if context_full else "turn_length")

            try:
                parsed = chat.parse_turn(_strip_trailing_specials(text, chat), settings.tool_names, body_ids)
            except ParseError as e:
                metrics.parse_errors += 1
                messages.append({"role": "assistant", "content": text, "parse_error": str(e), **cut})
                view.append(messages[-1])
                if settings.on_parse_error == OnParseError.ABORT:
                    return finish(EpisodeStatus.PARSE_ERROR, "parse_error", str(e))
                feedback = {"role": "user", "content": PARSE_FEEDBACK.format(error=e, hint=chat.call_hint)}
                messages.append({**feedback, "format_feedback": True})
                view.append(feedback)
                if not await prompts.advance([feedback], last):
                    return finish(EpisodeStatus.TRUNCATED, "context")
                continue

            call_id = f"call_{metrics.turns}"
            messages.append({**parsed.to_message(call_id), **cut})
            view.append(messages[-1])
            # One step per tool call, in the order written (as tau2's orchestrator executes a turn's
            # calls); a reply is one step. The answers are appended as one delta.
            if parsed.tool_calls:
                actions = [Action(name=c.name, arguments=c.arguments, content=parsed.content if i == 0 else "")
                           for i, c in enumerate(parsed.tool_calls)]
                call_ids = parsed.call_ids(call_id)
            else:
                actions, call_ids = [Action(name=RESPOND, content=parsed.content)], [call_id]
            answers: list[dict[str, Any]] = []
            for action, cid in zip(actions, call_ids):
                try:
                    observation, r, done, info = await env.step(action)
                except ToolTimeoutError as e:
                    return finish(EpisodeStatus.TOOL_TIMEOUT, "tool_timeout", str(e))
                except UserSimulatorError as e:
                    return finish(EpisodeStatus.USER_ERROR, "user_error", str(e))
                except RewardError as e:
                    return finish(EpisodeStatus.EVAL_ERROR, "eval_error", str(e))
                except EnvironmentStepError as e:
                    return finish(EpisodeStatus.ENV_ERROR, "env_error", str(e))
                except Exception as e:  # a bug in environment code must not crash the actor
                    return finish(EpisodeStatus.ENV_ERROR, "env_error", f"step: {e!r}")
                metrics.tool_errors += int(bool(info.get("tool_error")))
                answer = _observation_message(observation, info, action, cid)
                if done:
                    reward = float(r)
                    metrics.reward_info = info.get("reward_info")
                    messages.extend(answers + [answer])
                    return finish(EpisodeStatus.COMPLETED, info.get("termination") or "done")
                answers.append(answer)
            messages.extend(answers)
            view.extend(answers)
            # append's delta: what the template renders of tool results (with their call) or the user's turn
            if not await prompts.advance([_rendered(a) for a in answers], last):
                return finish(EpisodeStatus.TRUNCATED, "context")
        return finish(EpisodeStatus.MAX_STEPS, "max_steps")
    except TokenizeTimeout as e:
        return finish(EpisodeStatus.POLICY_ERROR, "tokenize_timeout", str(e))
    except TemplateError as e:  # the chat format cannot render the conversation (a delta, a re-rendering)
        return finish(EpisodeStatus.POLICY_ERROR, "render_error", str(e))
    except ContextStrategyError as e:
        return finish(EpisodeStatus.ENV_ERROR, "context_strategy", str(e))


def _observation_message(observation: str, info: dict[str, Any], action: Action, call_id: str) -> dict[str, Any]:
    """The conversation's record of what answered one step: a tool result as OpenAI's
    ``{"role": "tool", "tool_call_id", "name", "content"}`` (with ``"error": true`` when the tool
    failed, as tau2's ``ToolMessage.error``), else the user's turn ``{"role": "user", "content"}``."""
    if info.get("role") == "tool" and action.name != RESPOND:
        msg = {"role": "tool", "tool_call_id": call_id, "name": action.name, "content": observation}
        if info.get("tool_error"):
            msg["error"] = True
        return msg
    return {"role": info.get("role", "user"), "content": observation}


def _rendered(answer: dict[str, Any]) -> dict[str, Any]:
    """What a chat format renders of an answer: ``{"role": "tool" | "user", "content"}`` (a tool
    result's call id and name are left out: the delta must not depend on them, and the hermes
    format's probed affixes take role and content only)."""
    return {"role": "tool" if answer["role"] == "tool" else "user", "content": answer["content"]}


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
