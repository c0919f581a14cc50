"""Gold-replay backend: an oracle policy that replays a tau2 task's gold actions.

The backend is stateless per request. From the prompt token ids alone it works out

* which task the conversation is about: the task whose (whitespace-normalised)
  ``user_scenario.instructions.reason_for_call`` occurs in the first user turn after the system
  prompt;
* how far the episode has got: the number of tool results after the system prompt.

The prompt is read, and the answer written, in the chat format's dialect
(:mod:`rollout.devtools.local.dialects`: ``policy.chat_format``, or the family detected from the
tokenizer): Qwen3's (``<|im_start|>user\\n...<|im_end|>``, ``<tool_response>`` blocks) by default.
It answers with the next gold action as a tool call of that format (Hermes:
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` + ``<|im_end|>``), or, once every
gold action has been replayed, one closing message that states every ``communicate_info`` string
verbatim, or ``###STOP###`` when that closing message has already been said. Replaying a task this
way earns reward 1.0 from tau2's own evaluator, so the whole pipeline can be checked end to end.

Dual control (tau2 telecom): a task's gold actions include the user's own (``requestor ==
"user"``), which the scripted user replays (:class:`rollout.benchmarks.tau2.user.ScriptedUser`). Before each
run of them (:func:`rollout.benchmarks.tau2.user.gold_segments`) the oracle hands over to the user with one
text message, so the conversation interleaves both sides' actions in the gold order; how far the
episode has got is then the number of tool responses (the agent's actions) and of the oracle's
earlier text messages (its hand-overs). Telecom's tasks share three openings between 114 (base)
or 2285 (full) tasks, so the task is found by the case number the scripted user states
(:func:`rollout.benchmarks.tau2.user.case_reference`) before the reason for the call is tried.

Weight updates (``/update_weights_from_disk``) only relabel the server's weight version:
:meth:`GoldReplayBackend.load_weights` reads nothing.

``gold_replay_skip_write`` drops the first gold action whose tool is a write tool (per tau2's own
``ToolType.WRITE`` metadata): a wrong trajectory that must earn reward 0 on tasks that write.

Task matching rules, checked when the index is built (every task is also matched by its case
number, so these rules only decide which tasks can be found from their opening alone):

* If the reasons of two tasks both occur in the text and one contains the other, the longer
  (more specific) one wins (retail task 5's reason contains task 6's).
* Tasks with the same reason must be interchangeable for the oracle: identical gold actions and
  communicate_info (airline 15 and 16), or, failing that, one of them must replay every other's
  gold actions with only non-write extras (retail 67 replays 68's actions plus one more lookup);
  that one is replayed and its closing message states the union of their communicate_info, so
  the replay earns 1.0 whichever of the tasks the episode is (only for tasks without user
  actions). Other tasks that share a reason cannot be told apart by it: they are matched by case
  number only (logged).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from rollout.benchmarks.tau2.user import CASE_REFERENCE_RE, case_reference, gold_segments
from rollout.core.formats import AUTO, get_chat_format, resolve_chat_format
from rollout.devtools.local.backend_api import SamplingParams
from rollout.devtools.local.dialects import Message, get_dialect
from rollout.devtools.local.judge import is_judge_prompt, stand_in_verdict

logger = logging.getLogger(__name__)

STOP_TOKEN = "###STOP###"
DONE_TEXT = "Your request has been completed."
# Tokens the local server takes from gold replay per step: a tool call or a reply is 20-100
# tokens, so a turn costs the server a few steps instead of one per token.
GOLD_TOKENS_PER_STEP = 16



def _norm(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def _reason_for_call(task) -> str:
    instr = task.user_scenario.instructions
    reason = getattr(instr, "reason_for_call", None)
    if reason is None:  # unstructured instructions (a plain string)
        reason = str(instr)
    return _norm(reason)


def _load_domain(domain: str):
    """Return ``(tasks, {tool_name: is_write})`` for the local stack's ``--domain``, through the
    benchmark registry's gold index (:func:`rollout.core.environment.benchmark_gold_index`): a tau2
    domain (``retail``: every task of the domain, ``get_tasks(None)``: airline's and retail's are
    their ``base`` split, telecom's its 2285 ``full`` tasks), or ``"<benchmark>:<domain>"``
    (:func:`rollout.core.environment.domain_key`; ``tau_bench:retail``: the original tau-bench's
    tasks of every split in tau2's task shape).

    Raises:
        ValueError: the benchmark has no such domain, or no such benchmark (or gold index) is registered.
        ImportError: the benchmark's package is not installed (tau-bench).
    """
    from rollout.core.environment import benchmark_gold_index, parse_domain_key

    benchmark, name = parse_domain_key(domain)
    try:
        return benchmark_gold_index(benchmark, name)
    except LookupError as e:  # KeyError: an unknown domain or benchmark
        raise ValueError(str(e)) from None


@dataclass(frozen=True)
class _Plan:
    """What the oracle replays for one (group of interchangeable) task(s)."""

    task_ids: tuple[str, ...]
    actions: tuple[tuple[str, dict], ...]  # (tool name, arguments), in order
    final_text: str
    # dual control: hand-overs to the user due before each action (cumulative, one per action),
    # and the texts of all hand-overs in order (one per run of the user's gold actions)
    handovers_before: tuple[int, ...] = ()
    handovers: tuple[str, ...] = ()


def _action_key(name: str, args: dict) -> str:
    return json.dumps([name, args], sort_keys=True, ensure_ascii=False)


def _handover_text(names: list[str]) -> str:
    return "Please do the following on your side, in this order, and tell me what you get: " + ", ".join(names) + "."


def _final_text(infos: list[str]) -> str:
    if not infos:
        return DONE_TEXT
    lines = ["Here is the information you asked for:"]
    lines += [f"- {s}" for s in infos]
    lines.append(DONE_TEXT)
    return "\n".join(lines)


THINK_FILLER = " Let me check the order details and the policy once more."  # gold replay's reasoning filler


class GoldReplayBackend:
    """Oracle :class:`~rollout.devtools.local.backend_api.GenerationBackend` for tau2 tasks.

    Args:
        domain: a domain of tau2's registry (``retail``, ``airline``, ``telecom``, ...); every
            task of it is indexed once, here (telecom: its 2285 tasks, about 2 s).
        tokenizer: the policy's tokenizer (``transformers``-like: ``encode``, ``decode``,
            ``convert_tokens_to_ids``).
        skip_write: skip the first gold action whose tool is a write tool.
        chat_format: the chat format whose dialect the prompt is read and the answer written in
            (``auto``: the family detected from the tokenizer).

    Raises:
        ValueError: unknown domain, or a task with an empty reason for the call.
        KeyError: an unknown chat format, one the local stack does not speak, or ``auto`` that
            recognises no family.
    """

    def __init__(self, domain: str, tokenizer, skip_write: bool = False, chat_format: str = AUTO, think_tokens: int = 0) -> None:
        self.domain = domain
        self.tokenizer = tokenizer
        self.skip_write = skip_write
        self.name = "gold_replay_skip_write" if skip_write else "gold_replay"
        # tokens the server takes per step (see GenerationBackend): the text is known in advance
        self.tokens_per_step = GOLD_TOKENS_PER_STEP
        self.chat_format = resolve_chat_format(chat_format, tokenizer)
        self.dialect = get_dialect(self.chat_format)
        if think_tokens < 0 or (think_tokens and self.chat_format != "hermes"):
            raise ValueError(f"think_tokens must be >= 0 and needs the hermes (Qwen3) format, got {think_tokens} with {self.chat_format}")
        # A reasoning block of about think_tokens tokens before every answer (Qwen3's <think>):
        # what makes a real agent's running requests grow (the KV model, kvmodel.py).
        self._think_ids: list[int] = []
        if think_tokens:
            unit = list(tokenizer.encode(THINK_FILLER, add_special_tokens=False))
            body = (unit * (think_tokens // len(unit) + 1))[:think_tokens]
            self._think_ids = (list(tokenizer.encode("<think>\n", add_special_tokens=False)) + body
                               + list(tokenizer.encode("\n</think>\n\n", add_special_tokens=False)))
        # the format's end-of-turn ids close every answer (Qwen3: <|im_end|>)
        self.eot_ids: list[int] = list(get_chat_format(self.chat_format)(tokenizer).eot_ids)
        split = self.dialect.split_token
        split_id = tokenizer.convert_tokens_to_ids(split) if split else None
        self._split_id: int | None = split_id if isinstance(split_id, int) and split_id != getattr(tokenizer, "unk_token_id", None) else None
        # message token ids -> (decoded text, its messages)
        self._pieces: dict[tuple[int, ...], tuple[str, tuple[Message, ...]]] = {}
        tasks, self._is_write = _load_domain(domain)
        self._plans: dict[str, _Plan] = self._build_index(tasks)
        # Longest first, so that the most specific reason is tried first.
        self._reasons: list[str] = sorted(self._plans, key=len, reverse=True)
        logger.info(
            "gold replay index for %s: %d tasks, %d distinct openings (skip_write=%s)",
            domain, len(tasks), len(self._plans), skip_write,
        )

    def _split(self, input_ids: list[int]) -> list[tuple[int, ...]]:
        """``input_ids`` cut before each of the dialect's split token (``<|im_start|>`` for Qwen3;
        one piece per message; the whole prompt as one piece when there is none). Found with
        ``list.index`` (C speed)."""
        start = self._split_id
        if start is None:
            return [tuple(input_ids)]
        cuts, i = [], -1
        try:
            while True:
                i = input_ids.index(start, i + 1)
                cuts.append(i)
        except ValueError:
            pass
        bounds = [0, *(c for c in cuts if c > 0), len(input_ids)]
        return [tuple(input_ids[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]

    def _decode_prompt(self, input_ids: list[int]) -> str:
        """``tokenizer.decode(input_ids, skip_special_tokens=False)``, message by message with a
        cache: split before each split token (a special token, which no other piece spans),
        the pieces decode to the same text as the whole; the system prompt and earlier turns,
        most of every prompt, are then decoded once (a 10k-token decode costs about 5 ms)."""
        return "".join(self._piece(p)[0] for p in self._split(list(input_ids)))

    def _messages(self, input_ids: list[int]) -> list[Message]:
        """The prompt's messages (:class:`~rollout.devtools.local.dialects.Message`), read by the
        dialect piece by piece (a message starts at a split token, so none spans two pieces) and
        cached with the piece."""
        return [m for p in self._split(list(input_ids)) for m in self._piece(p)[1]]

    def _piece(self, piece: tuple[int, ...]) -> tuple[str, tuple[Message, ...]]:
        """A piece's decoded text and its messages (see :meth:`_messages`), cached."""
        hit = self._pieces.get(piece)
        if hit is None:
            text = self.tokenizer.decode(list(piece), skip_special_tokens=False)
            msgs = tuple(self.dialect.messages(text))
            hit = (text, msgs)
            if len(self._pieces) >= 4096:  # bounded: forget everything and start again
                self._pieces.clear()
            self._pieces[piece] = hit
        return hit

    # ------------------------------------------------------------------ index
    def _build_index(self, tasks) -> dict[str, _Plan]:
        """Plans by reason for call (the tasks an opening alone identifies); every task's own plan
        by case number goes to ``self._by_case``."""
        groups: dict[str, list] = {}
        self._by_case: dict[str, _Plan] = {}
        for task in tasks:
            groups.setdefault(_reason_for_call(task), []).append(task)
            self._by_case[case_reference(task.id)] = self._plan_for_group([task])
        plans: dict[str, _Plan] = {}
        ambiguous = 0
        for reason, members in groups.items():
            if not reason:
                raise ValueError(f"tau2 task(s) {[t.id for t in members]} have an empty reason_for_call")
            try:
                plans[reason] = self._plan_for_group(members)
            except ValueError as e:
                ambiguous += len(members)
                logger.debug("%s; they are matched by case number only", e)
        if ambiguous:
            logger.info("%d %s tasks share an opening with tasks that need another replay: they are matched by the "
                        "case number the scripted user states", ambiguous, self.domain)
        return plans

    def _gold(self, task) -> tuple[list[tuple[str, dict]], list[str], tuple[int, ...], tuple[str, ...]]:
        """``(agent actions, communicate_info, hand-overs due before each action, hand-over texts)``."""
        crit = task.evaluation_criteria
        actions: list[tuple[str, dict]] = []
        before: list[int] = []
        handovers: list[str] = []
        for who, acts in gold_segments(task):
            if who == "user":  # the scripted user replays these; the oracle hands over first
                handovers.append(_handover_text([name for name, _ in acts]))
                continue
            for name, args in acts:
                actions.append((name, args))
                before.append(len(handovers))
        infos = list((crit.communicate_info or []) if crit is not None else [])
        return actions, infos, tuple(before), tuple(handovers)

    def _plan_for_group(self, members: list) -> _Plan:
        ids = tuple(t.id for t in members)
        golds = [self._gold(t) for t in members]
        keys = [([_action_key(n, a) for n, a in acts], infos, before, hand) for acts, infos, before, hand in golds]
        if all(k == keys[0] for k in keys):
            chosen = 0
        else:
            chosen = -1
            needed = set().union(*(set(k[0]) for k in keys))
            for i, (acts_i, _, _, hand_i) in enumerate(keys):
                if hand_i or any(k[3] for k in keys):
                    break  # with user actions the interleaving matters: only identical plans merge
                have = set(acts_i)
                if not needed <= have:
                    continue
                extras = [golds[i][0][j] for j, k in enumerate(acts_i) if any(k not in set(o[0]) for o in keys)]
                if any(self._is_write.get(name, True) for name, _ in extras):
                    continue
                chosen = i
                break
            if chosen < 0:
                raise ValueError(
                    f"tau2 {self.domain} tasks {list(ids)} share their reason_for_call but have "
                    "gold actions that no single replay satisfies; the gold-replay oracle cannot "
                    "tell them apart"
                )
            logger.info("tasks %s share an opening; replaying task %s's gold actions for all", list(ids), ids[chosen])
        actions = list(golds[chosen][0])
        before = list(golds[chosen][2])
        infos: list[str] = []
        for _, inf, _, _ in golds:
            for s in inf:
                if s not in infos:
                    infos.append(s)
        if self.skip_write:
            for j, (name, _) in enumerate(actions):
                if self._is_write.get(name, False):
                    del actions[j]
                    del before[j]
                    break
        return _Plan(ids, tuple(actions), _final_text(infos), tuple(before), golds[chosen][3])

    # ------------------------------------------------------------- matching
    def _match(self, first_user_text: str) -> _Plan | None:
        case = CASE_REFERENCE_RE.search(first_user_text)
        if case is not None and case.group(1) in self._by_case:
            return self._by_case[case.group(1)]
        text = _norm(first_user_text)
        hits = [r for r in self._reasons if r in text]
        # Drop reasons that are only contained in a longer matching reason.
        hits = [r for r in hits if not any(r != o and r in o for o in hits)]
        if len(hits) != 1:
            return None
        return self._plans[hits[0]]

    # ----------------------------------------------------------- generation
    def next_text(self, input_ids: list[int]) -> str:
        """The oracle's next assistant message (without its end-of-turn) for a prompt, written by
        the dialect (a reply as the family writes one, e.g. after closing Qwen3.6's reasoning)."""
        content, calls = self._next_turn(input_ids)
        return self.dialect.assistant_text(content, calls, turn_key=len(input_ids))

    def _next_turn(self, input_ids: list[int]) -> tuple[str, list[tuple[str, dict]]]:
        """The oracle's next turn: ``(text, [])`` for a reply, ``("", [(tool, arguments)])`` for a call."""
        messages = self._messages(input_ids)
        start = 1 if messages and messages[0].role == "system" else 0
        convo = messages[start:]
        first_user = next((i for i, m in enumerate(convo) if m.role == "user"), None)
        if first_user is None:
            return "I could not find a user request in this conversation, so there is no task to replay.", []
        plan = self._match(convo[first_user].content)
        if plan is None:
            return f"No {self.domain} task matches this conversation (or more than one does); nothing to replay.", []
        progress = sum(1 for m in convo if m.role == "tool")
        if plan.handovers:  # dual control: hand over to the user before each run of its actions
            said = sum(1 for m in convo[first_user + 1:] if m.role == "assistant" and m.closed and not m.calls)
            due = plan.handovers_before[progress] if progress < len(plan.actions) else len(plan.handovers)
            if said < due:
                return plan.handovers[said], []
            if progress >= len(plan.actions):
                return (plan.final_text if said == len(plan.handovers) else STOP_TOKEN), []
        if progress < len(plan.actions):
            return "", [plan.actions[progress]]
        last_tool = max((i for i, m in enumerate(convo) if m.role == "tool"), default=-1)
        after = max(last_tool, first_user)
        already_said = any(m.role == "assistant" and m.closed and not m.calls for m in convo[after + 1:])
        return (STOP_TOKEN if already_said else plan.final_text), []

    def generate(self, input_ids: list[int], params: SamplingParams) -> Iterator[tuple[int, float]]:
        """Yield the oracle's next message token by token, then the format's end-of-turn ids
        (``<|im_end|>`` for Qwen3); log-probs are 0.0."""
        try:
            text = self.next_text(input_ids)
        except Exception:  # never raise into the server: say so instead
            logger.exception("gold replay failed on a prompt of %d tokens", len(input_ids))
            text = "The gold-replay oracle failed on this prompt."
        ids = self._think_ids + list(self.tokenizer.encode(text, add_special_tokens=False)) + self.eot_ids
        for tok in ids:
            yield int(tok), 0.0

    def load_weights(self, model_path: str) -> None:
        """No weights to load: the oracle does not change. ``/update_weights_from_disk`` then
        only relabels the server's weight version (``model_path`` is not read)."""
        logger.info("gold replay: weight update to %s (nothing to load; only the version changes)", model_path)

    def chat(self, messages: list[dict], params: SamplingParams) -> str:
        """Deterministic stand-ins behind ``/v1/chat/completions``: tau2's NL-assertion judge
        prompt gets every expected outcome met (:func:`rollout.devtools.local.judge.stand_in_verdict`:
        the verdict gold replay deserves); anything else is a user simulator that agrees to
        questions and otherwise ends the chat."""
        if is_judge_prompt(messages):
            return stand_in_verdict(messages)
        last = messages[-1].get("content") if messages else None
        if isinstance(last, list):  # OpenAI content parts
            last = " ".join(str(p.get("text", "")) for p in last if isinstance(p, dict))
        return "Yes, please go ahead." if isinstance(last, str) and "?" in last else STOP_TOKEN
