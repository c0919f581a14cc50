"""Context strategies (``policy.context_strategy``): what an episode does when its next prompt
would not fit ``policy.max_context_tokens``.

When the prompt of the next turn would leave fewer than ``policy.context_headroom_tokens`` tokens
for the turn, the episode loop (:func:`rollout.core.episode.run_episode`) asks the strategy for a
shorter conversation. The strategy gets a :class:`CompactionRequest`: the conversation the policy
is given (system message first), the token budget its rendering must fit, a counter that renders
a candidate and returns its length, and the episode's policy client and chat format. It answers
the compacted conversation, or ``None`` when it cannot make it fit. On an answer the loop renders
it whole, **starts a new sample segment** with it (the tokens already in a sample are never
changed: docs/design.md invariant 1), counts one compaction (``metadata.compactions``, the
summary's ``compactions``) and goes on. On ``None`` the episode goes on as with ``none``: the turn
gets the room that is left, and an episode whose context is full ends ``truncated`` (termination
reason ``context``).

Built in (the compaction slime's and SkyRL's multi-turn examples apply when the context
overflows, done here on the message list so every chat format renders the result):

* ``none``: never compacts (the default; an episode that overflows ends ``truncated``).
* ``drop_tool_results``: replaces the content of the oldest tool results with a short marker
  (:data:`DROPPED_TOOL_RESULT`), as few as needed; the results that answer the latest turn are
  kept. The calls stay, so the conversation keeps its shape.
* ``drop_oldest_turns``: drops the oldest whole turns (an assistant message and the messages that
  answer it), as few as needed; the system message, the user's opening message and the latest
  turn are kept.

Adding one (a summarising strategy that calls the policy itself, for example): a class with a
``name`` and ``async compact(request)``, registered with :func:`register_context_strategy` (in
:data:`CONTEXT_STRATEGIES`, a :class:`rollout.core.registry.Registry`: by path, so that the Ray
actors, which build it, find it too; or by an entry point in group
``tau_rollout.context_strategies`` of a package of your own), or named by its import path
``package.module:factory`` in ``policy.context_strategy`` (docs/design.md "Seams";
``launch/summarise_context.py`` is one, tested in tests/component/test_history_context.py). The tokens
such a strategy generates are not part of any sample: only the episode's own turns are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from rollout.core.registry import Registry, is_import_path

logger = logging.getLogger(__name__)

# What a dropped tool result's content becomes (drop_tool_results).
DROPPED_TOOL_RESULT = "[tool result omitted to fit the context window]"


@dataclass
class CompactionRequest:
    """What a :class:`ContextStrategy` is given to compact one episode's context.

    Attributes:
        episode_id: the episode (for logs).
        messages: the conversation the policy is given, in order: the system message, the user's
            opening, then assistant turns (OpenAI messages: ``content``, ``tool_calls``) and what
            answered them (``tool`` results with ``tool_call_id`` / ``name``, ``user`` turns).
            Do not change it in place: return a new list.
        budget_tokens: the compacted conversation, rendered with the generation prompt, must be
            at most this many tokens (``policy.max_context_tokens`` less
            ``policy.context_headroom_tokens``).
        count_tokens: ``await count_tokens(messages)`` is the length in tokens of ``messages``
            rendered by the episode's chat format with the tools and the generation prompt (it
            renders in a thread, bounded by ``policy.tokenize_timeout_s``).
        chat: the episode's :class:`~rollout.core.formats.ChatFormat` (to render a prompt of
            one's own).
        policy: the episode's :class:`~rollout.core.policy.PolicyClient` (to have the policy
            write a summary; its tokens are not trained on).
    """

    episode_id: str
    messages: list[dict[str, Any]]
    budget_tokens: int
    count_tokens: Callable[[list[dict[str, Any]]], Awaitable[int]]
    chat: Any = None
    policy: Any = None


class ContextStrategy(Protocol):
    """Compacts an episode's conversation when it would not fit the context window."""

    name: str

    async def compact(self, request: CompactionRequest) -> list[dict[str, Any]] | None:
        """A shorter conversation whose rendering fits ``request.budget_tokens`` (system message
        first), or ``None`` when this strategy cannot make it fit. It must not raise for a
        conversation it cannot compact; an exception ends the episode ``env_error``."""
        ...


class NoCompaction:
    """``none``: never compacts."""

    name = "none"

    async def compact(self, request: CompactionRequest) -> list[dict[str, Any]] | None:
        """Always ``None``."""
        return None


async def _fewest(n: int, build: Callable[[int], list[dict[str, Any]]], request: CompactionRequest) -> list[dict[str, Any]] | None:
    """``build(k)`` for the smallest ``k`` in ``1..n`` whose rendering fits the budget (the length
    falls as ``k`` grows: a bisection, about ``log2(n) + 1`` renderings), or ``None`` when even
    ``build(n)`` does not fit."""
    if n < 1:
        return None
    best = build(n)
    if await request.count_tokens(best) > request.budget_tokens:
        return None
    lo, hi = 0, n  # build(hi) fits; k <= lo is not known to
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cand = build(mid)
        if await request.count_tokens(cand) <= request.budget_tokens:
            hi, best = mid, cand
        else:
            lo = mid
    return best


def _latest_turn(messages: list[dict[str, Any]]) -> int:
    """Index of the last assistant message (``len(messages)`` when there is none)."""
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), len(messages))


class DropToolResults:
    """``drop_tool_results``: the oldest tool results' contents become :data:`DROPPED_TOOL_RESULT`,
    as few as fit; those answering the latest assistant turn are kept."""

    name = "drop_tool_results"

    async def compact(self, request: CompactionRequest) -> list[dict[str, Any]] | None:
        msgs = request.messages
        latest = _latest_turn(msgs)
        old = [i for i, m in enumerate(msgs[:latest]) if m.get("role") == "tool" and m.get("content") != DROPPED_TOOL_RESULT]

        def build(k: int) -> list[dict[str, Any]]:
            drop = set(old[:k])
            return [{**m, "content": DROPPED_TOOL_RESULT} if i in drop else m for i, m in enumerate(msgs)]

        return await _fewest(len(old), build, request)


class DropOldestTurns:
    """``drop_oldest_turns``: the oldest whole turns (an assistant message and the messages after
    it up to the next assistant message) are dropped, as few as fit; the system message, the
    user's opening and the latest turn are kept."""

    name = "drop_oldest_turns"

    async def compact(self, request: CompactionRequest) -> list[dict[str, Any]] | None:
        msgs = request.messages
        starts = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
        if not starts:
            return None
        head = msgs[: starts[0]]  # the system message and the user's opening
        blocks = [msgs[a:b] for a, b in zip(starts, starts[1:] + [len(msgs)])]

        def build(k: int) -> list[dict[str, Any]]:
            return head + [m for block in blocks[k:] for m in block]

        return await _fewest(len(blocks) - 1, build, request)


# name -> factory() (or its "module:attribute" path); a name that is itself such a path is
# imported as one (policy.context_strategy=package.module:factory)
CONTEXT_STRATEGIES: Registry[Callable[[], ContextStrategy]] = Registry(
    "context_strategy", "policy.context_strategy", paths_as_names=True, also="or package.module:factory")
CONTEXT_STRATEGIES.register("none", NoCompaction)
CONTEXT_STRATEGIES.register("drop_tool_results", DropToolResults)
CONTEXT_STRATEGIES.register("drop_oldest_turns", DropOldestTurns)


def register_context_strategy(name: str, factory: Callable[[], ContextStrategy] | str, *, replace: bool = False) -> None:
    """Add a strategy for ``policy.context_strategy=name``: ``factory()`` builds it (once per
    actor), or the ``"package.module:factory"`` path of the factory. The actors build it: a path
    registered in the driver reaches them (:func:`rollout.core.registry.registered_paths`; its
    module must be importable there), an object registered in the driver does not.

    Raises:
        ValueError: ``name`` is empty, taken (and ``replace`` is false), or holds a ``:`` (an
            import path is named in the config directly).
    """
    CONTEXT_STRATEGIES.register(name, factory, replace=replace)


def unregister_context_strategy(name: str) -> None:
    """Remove strategy ``name``.

    Raises:
        rollout.core.registry.UnknownNameError: no such strategy (a ``KeyError``).
    """
    CONTEXT_STRATEGIES.unregister(name)


def context_strategies() -> tuple[str, ...]:
    """The registered strategy names (and those installed packages declare), sorted."""
    return tuple(sorted(CONTEXT_STRATEGIES.names()))


def get_context_strategy(name: str) -> ContextStrategy:
    """The strategy ``policy.context_strategy`` names, built now: a registered one, or
    ``package.module:factory`` imported and called with no argument.

    Raises:
        rollout.core.registry.UnknownNameError: no such name (a ``KeyError``; the message lists them).
        ImportError: a path whose module or attribute cannot be imported.
        TypeError: what the factory built has no ``compact``.
    """
    try:
        factory = CONTEXT_STRATEGIES.get(name)
    except AttributeError as e:
        raise ImportError(f"policy.context_strategy={name}: {e}") from None
    strategy = factory()
    if not callable(getattr(strategy, "compact", None)):
        raise TypeError(f"policy.context_strategy={name}: {type(strategy).__name__} has no compact(request)")
    return strategy


__all__ = [
    "CONTEXT_STRATEGIES", "DROPPED_TOOL_RESULT", "CompactionRequest", "ContextStrategy", "DropOldestTurns", "DropToolResults", "NoCompaction",
    "context_strategies", "get_context_strategy", "is_import_path", "register_context_strategy", "unregister_context_strategy",
]
