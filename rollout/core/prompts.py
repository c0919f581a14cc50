"""How each turn's prompt is built, and the loop's tokenizer calls off the event loop.

The episode loop (:func:`rollout.core.episode.run_episode`) never calls the tokenizer on its event
loop: rendering, encoding and decoding run in threads (:func:`off_loop`), each bounded by
``policy.tokenize_timeout_s``, because the chat template serialises calls into the Rust tokenizer
with a lock that threads hold while they encode large prompts. A call past its bound raises
:class:`TokenizeTimeout`.

:class:`Prompts` makes the next turn's prompt the live segment of the episode's
:class:`~rollout.core.trajectory.Trajectory` after the messages that answer a turn:
``policy.history=append`` extends the live sequence with the new messages' delta; ``rerender``
renders the conversation so far whole and extends the live sequence when the rendering does, else
starts a new segment (:meth:`Trajectory.start_segment`). When the next prompt would leave less than
``policy.context_headroom_tokens`` for the turn, ``policy.context_strategy``
(:mod:`rollout.core.context`) may compact the conversation; the compacted one starts a new segment
(docs/design.md "History and context"). The sampled ids are always the server's, never
re-tokenized.
"""

from __future__ import annotations

import array
import asyncio
import logging

import numpy as np

from rollout.core.choices import History
from rollout.core.context import CompactionRequest, NoCompaction
from rollout.core.formats import ChatFormat, TemplateError
from rollout.core.metrics import EpisodeMetrics
from rollout.core.policy import PolicyClient
from rollout.core.records import EpisodeSpec
from rollout.core.settings import EpisodeSettings
from rollout.core.trajectory import Trajectory

logger = logging.getLogger(__name__)


class ContextStrategyError(RuntimeError):
    """``policy.context_strategy`` raised while compacting: the episode ends ``env_error``
    (termination reason ``context_strategy``)."""


class TokenizeTimeout(RuntimeError):
    """A tokenizer call ran past ``policy.tokenize_timeout_s`` (the actor's threads are stuck or
    overloaded): the episode ends ``policy_error`` with termination reason ``tokenize_timeout``."""


async def off_loop(settings: EpisodeSettings, fn, *args):
    """``fn(*args)`` in a thread, bounded by ``settings.tokenize_timeout_s``.

    Every tokenizer call of the loop goes through here, except short ones that the chat template
    can make at once (:meth:`ChatFormat.try_decode_now`, :meth:`ChatFormat.try_delta_ids_now`):
    the template serialises calls into the Rust tokenizer with a lock that threads hold while they
    encode large prompts, and the event loop never waits on that lock.

    Raises:
        TokenizeTimeout: the call did not finish in time (its thread finishes on its own).
    """
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), settings.tokenize_timeout_s)
    except asyncio.TimeoutError:
        name = getattr(fn, "__name__", "tokenizer call").lstrip("_")
        raise TokenizeTimeout(f"{name} took over {settings.tokenize_timeout_s:g} s (policy.tokenize_timeout_s)") from None


def prompt_trajectory(chat: ChatFormat, messages: list[dict]) -> Trajectory:
    """The episode's :class:`Trajectory` on its first prompt, compact (blocking: run in a thread).

    The ~5k ids go into the compact record in the thread: no list of them waits on the loop (in
    a future's result, then a frame) where the garbage collector walks every item. At 512
    episodes per actor, lists of first-prompt and delta ids held about half the references a
    gen-1 collection walked (a census in an actor under ``python -m rollout.bench pool``).
    """
    return Trajectory(prompt_ids=chat.prompt_ids(messages)).compact()


def _delta_array(chat: ChatFormat, messages: list[dict]) -> array.array:
    """:meth:`ChatFormat.delta_ids` as an int64 ``array.array`` (blocking: run in a thread)."""
    return array.array("q", chat.delta_ids(messages))


async def delta_ids(settings: EpisodeSettings, chat: ChatFormat, messages: dict | list[dict]) -> array.array:
    """:meth:`ChatFormat.delta_ids` of one message (or several: the results of a turn's tool
    calls) as an int64 ``array.array`` (the garbage collector does not walk its items while the
    episode holds it): on the loop when it is short (see :meth:`ChatFormat.try_delta_ids_now`),
    else in a thread (:func:`off_loop`).

    Raises:
        TokenizeTimeout: the thread did not finish in time.
    """
    batch = [messages] if isinstance(messages, dict) else list(messages)
    ids = chat.try_delta_ids_now(batch)
    return array.array("q", ids) if ids is not None else await off_loop(settings, _delta_array, chat, batch)


def _prompt_array(chat: ChatFormat, messages: list[dict]) -> array.array:
    """:meth:`ChatFormat.prompt_ids` of a whole conversation as an int64 ``array.array`` (blocking:
    run it in a thread)."""
    return array.array("q", chat.prompt_ids(messages))


class Prompts:
    """Makes the live segment of ``traj`` the next turn's prompt, after the messages that answered
    a turn: ``policy.history`` and ``policy.context_strategy`` (module docstring).

    ``view`` is the conversation the policy is given (it starts as the system message and the
    user's opening; the loop appends every assistant turn and answer to it): what ``rerender``
    renders and what a strategy compacts. The episode's ``messages`` keep the whole conversation.
    """

    def __init__(self, spec: EpisodeSpec, traj: Trajectory, view: list[dict], chat: ChatFormat, policy: PolicyClient,
                 settings: EpisodeSettings, metrics: EpisodeMetrics):
        self.spec, self.traj, self.view, self.chat, self.policy = spec, traj, view, chat, policy
        self.settings, self.metrics = settings, metrics
        self.compacting = not isinstance(settings.context_strategy, NoCompaction)
        if self.compacting:
            metrics.compactions = 0

    def roomy(self, prompt_len: int) -> bool:
        """Whether a prompt of ``prompt_len`` tokens leaves the headroom for a turn."""
        return prompt_len + self.settings.context_headroom_tokens <= self.settings.max_context_tokens

    async def render(self, messages: list[dict]) -> array.array:
        """The ids of ``messages`` rendered whole with the generation prompt (in a thread).

        Raises:
            TokenizeTimeout: past ``policy.tokenize_timeout_s``.
        """
        return await off_loop(self.settings, _prompt_array, self.chat, messages)

    async def advance(self, delta_messages: list[dict], last: bool = False) -> bool:
        """Make the next prompt the live segment, once the messages that answer a turn are in
        ``view`` (``delta_messages``: their rendered form, for ``append``'s delta). False when
        no prompt fits (the episode ends ``truncated``). ``last``: no turn follows (``env.max_steps``
        is reached): the record ends as with ``none``, never with a compaction.

        Raises:
            TokenizeTimeout: a rendering ran past its bound.
            TemplateError: the chat format cannot render the messages.
        """
        limit = self.settings.max_context_tokens
        if self.settings.history == History.RERENDER:
            ids = await self.render(self.view)
            if not last and not self.roomy(len(ids)) and await self.compact():
                return True
            if len(ids) >= limit:
                return False
            self.enter(ids)
            return True
        delta = await delta_ids(self.settings, self.chat, delta_messages)
        size = self.traj.context_length + len(delta)
        if not last and not self.roomy(size) and await self.compact():
            return True
        if size >= limit:
            return False
        self.traj.append_context(delta)
        return True

    def enter(self, ids: array.array) -> None:
        """``rerender``: ``ids`` become the live segment's prompt: appended as context when they
        extend the live segment (the rendering kept every earlier token), else a new segment."""
        live = self.traj.context_array()
        head = np.frombuffer(ids, dtype=np.int64)[: len(live)]
        if len(ids) > len(live) and np.array_equal(head, live):
            self.traj.append_context(ids[len(live):])
        else:
            self.traj.start_segment(ids)

    async def compact(self) -> bool:
        """Ask the strategy for a conversation that fits; on one, start a new segment with its
        rendering and count a compaction. False when it cannot (or none is configured)."""
        if not self.compacting:
            return False
        settings = self.settings

        async def count(messages: list[dict]) -> int:
            return len(await self.render(messages))

        budget = settings.max_context_tokens - settings.context_headroom_tokens
        request = CompactionRequest(episode_id=self.spec.episode_id, messages=list(self.view), budget_tokens=budget,
                                    count_tokens=count, chat=self.chat, policy=self.policy)
        try:
            compacted = await settings.context_strategy.compact(request)
        except (TokenizeTimeout, TemplateError):
            raise
        except Exception as e:
            raise ContextStrategyError(f"context strategy {getattr(settings.context_strategy, 'name', '?')} failed: {e!r}") from e
        if compacted is None:
            return False
        ids = await self.render(compacted)
        if not self.roomy(len(ids)):
            logger.warning("episode %s: context strategy %s answered %d tokens for a budget of %d; not used",
                           self.spec.episode_id, getattr(settings.context_strategy, "name", "?"), len(ids), budget)
            return False
        self.view[:] = compacted
        self.traj.start_segment(ids)
        self.metrics.compactions += 1
        logger.debug("episode %s: compaction %d (%s): the next prompt is %d tokens", self.spec.episode_id,
                     self.metrics.compactions, getattr(settings.context_strategy, "name", "?"), len(ids))
        return True
