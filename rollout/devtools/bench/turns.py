"""``python -m rollout.bench turns``: per-turn tokenization CPU, ours against the seed's full re-render.

Both ways run side by side in one process on the same realistic tau2 conversation:

* **ours** is what :func:`rollout.core.episode.run_episode` does per agent turn with
  :class:`rollout.core.formats.ChatTemplate` (template facts probed once per actor): decode the generated
  ids (to parse them), close the turn if the server did not, and tokenize only the next message's
  delta (a tool result or a user reply). History is never rendered again.
* **seed** is the seed's way: render the whole conversation with its tool schemas and tokenize it,
  ``tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=True, tokenize=True)``
  every turn.

The conversation is built with the domain's real tool schemas and system prompt, and its tool
results are the outputs of tau2's own tools run on a fresh environment
(``Tau2Domain(domain).new_environment().get_response(ToolCall(...))``): an agent identifies a
customer, reads their record, goes through their orders (retail) or reservations (airline),
looks up products or flights, computes a total, answers the user, and the user replies. The
generated ids of each assistant turn are the canonical tokenization of what the template renders
for that turn (what a server returns when the policy samples it); tool-call turns end on the stop
string ``</tool_call>`` (no EOS, so the turn is closed client-side, as in the episode loop), text
replies end with EOS.

Before anything is timed, the benchmark checks that both ways give identical ids at every turn
(ours: first prompt + generated ids + turn closes + deltas; seed: the full render) and exits 1
naming the first differing turn and token otherwise. A template that re-renders history
differently from what the policy saw (Qwen3 with ``enable_thinking=false`` puts an empty
``<think></think>`` in the generation prompt that history drops) fails this check: that is the
seed's train/inference mismatch, not a benchmark error.

Timing: CPU time of this process (``time.process_time``), each turn's work ``--repeat`` times in
a row for ours, then for the seed, median per turn. (The episode loop makes our calls in a thread;
the hand-off is not tokenization and is not counted.) Targets (issue 8): seed / ours at the last
turn at least :data:`TARGET_RATIO`; ours at the last turn at most :data:`TARGET_GROWTH` times ours at
turn 2. A turn costs us what its new message costs (a 1k-token tool result more than a short user
reply) and nothing for the history, so the growth target is measured on the same step (the last
turn's generated ids and next message) appended as turn 2 and as the last turn, and both ways are
printed; the ratio of the conversation's own turns 2 and last is printed next to it.
**The event loop while tokenizing** (printed after the table). The episode loop tokenizes in
worker threads so that its event loop stays free, which holds only while the thread lets go of
the GIL. With the whole last-turn conversation (its text and ids), one thread encodes and decodes
in a loop for ``--lag-seconds`` while a :class:`rollout.core.loop_health.LoopLagProbe` on the event loop
measures how late it is woken, twice: through ``transformers`` (``tokenizer.encode`` /
``tokenizer.decode``) and through :class:`rollout.core.formats.ChatTemplate` (the Rust backend's batch
calls, which release the GIL). Before them it measures the floor: the same probe while the thread
only sleeps, which is what the host alone does to the loop (on a shared machine with CPU steal it
can reach tens of milliseconds at p99; compare the two ways only with a low floor). The same
section times the JSON encoding of that prompt's ``/generate`` body, ``json.dumps`` against
:func:`rollout.core.fastjson.dumps` (orjson), which the event loop does for every call. Both are printed side by side with their ratios. Last, the time of
one full garbage collection (``gc.collect()``, process CPU time) with ``--gc-trajectories`` running
trajectories of that length alive (512: an actor's share of 1024 concurrent episodes on two),
held as lists and held compact (:meth:`rollout.core.records.Trajectory.compact`, the episode loop's
form): the collector visits every item of a list, and none of an array's.

Usage::

    python -m rollout.bench turns [--config configs/local.yaml] [--domain retail|airline]
        [--turns 30] [--repeat 30] [--lag-seconds 3] [--gc-trajectories 512] [--json FILE] [key=value ...]
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterator

logger = logging.getLogger(__name__)

TARGET_RATIO = 20.0  # seed / ours at the last turn, at least
TARGET_GROWTH = 1.5  # ours at the last turn / ours at turn 2, at most


class IdsMismatch(RuntimeError):
    """Our per-turn ids differ from the seed's full render (the message names the turn and token)."""


@dataclass(frozen=True)
class Step:
    """One agent turn of a built conversation.

    Attributes:
        assistant: the assistant message as the episode loop records it (``ParsedTurn.to_message``
            shape: ``content`` and, for a tool call, ``tool_calls``).
        follow: the non-assistant message that follows it (``{"role": "tool" | "user", ...}``).
    """

    assistant: dict[str, Any]
    follow: dict[str, Any]

    @property
    def is_tool_call(self) -> bool:
        """Whether the turn is a tool call (generation then ends on ``</tool_call>``, not EOS)."""
        return bool(self.assistant.get("tool_calls"))


# -- conversations ------------------------------------------------------------------------------
def _tool_step(env, name: str, args: dict[str, Any], n: int) -> Step:
    """Run tool ``name`` in tau2's environment ``env``; the step with its real output."""
    from tau2.data_model.message import ToolCall

    out = env.get_response(ToolCall(id=f"call_{n}", name=name, arguments=args, requestor="assistant"))
    call = {"type": "function", "function": {"name": name, "arguments": args}}
    return Step({"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": out.content})


def _say_step(text: str, reply: str) -> Step:
    return Step({"role": "assistant", "content": text}, {"role": "user", "content": reply})


def _review(user_id: str, found: tuple[str, str], records: list[str], visit: Callable[[int, str], Generator[tuple, None, tuple[str, str]]],
            every: int, replies: tuple[str, str], closing: tuple[str, str]) -> Iterator[tuple]:
    """The course both scripts share, as actions (``("tool", name, args)`` or ``("say", text, reply)``):
    the user's details; ``found`` (the agent lists the user's records, the user picks the first);
    then each record in turn: ``visit(k, record)`` yields its look-ups and returns ``(amount,
    summary)``, the agent says the summary and the user asks for the running total on every
    ``every``-th record (``replies[0]``, and a ``calculate`` of the amounts so far follows) or for
    the next record (``replies[1]``); then, for ever, ``closing`` and the user's details again."""
    yield ("tool", "get_user_details", {"user_id": user_id})
    yield ("say", *found)
    amounts: list[str] = []
    for k, record in enumerate(records):
        amount, summary = yield from visit(k, record)
        amounts.append(amount)
        yield ("say", summary, replies[0] if k % every == 0 else replies[1])
        if k % every == 0:
            yield ("tool", "calculate", {"expression": " + ".join(amounts)})
    while True:  # more than the script: keep asking
        yield ("say", *closing)
        yield ("tool", "get_user_details", {"user_id": user_id})


def _retail_script(env) -> tuple[str, Iterator[tuple]]:
    """A retail conversation with the customer who has the most orders (ties by id)."""
    db = env.tools.db
    user = sorted(db.users.values(), key=lambda u: (-len(u.orders), u.user_id))[0]
    first, last, zip_code = user.name.first_name, user.name.last_name, user.address.zip
    opening = (f"Hi, I'm {first} {last} and I need help with several of my orders: I want to know where they are, "
               f"and I may want to return or cancel some. My zip code is {zip_code}.")

    def visit(k: int, oid: str):
        order = db.orders[oid]
        yield ("tool", "get_order_details", {"order_id": oid})
        item = order.items[0]
        if k % 2 == 0:
            yield ("tool", "get_product_details", {"product_id": item.product_id})
        return (f"{sum(i.price for i in order.items):.2f}",
                f"Order {oid} is {order.status}. It has {len(order.items)} item(s), the first one a {item.name} "
                f"({', '.join(f'{k2}: {v}' for k2, v in item.options.items())}) at ${item.price:.2f}. "
                "Would you like to do anything with this order?")

    def actions():
        yield ("tool", "find_user_id_by_name_zip", {"first_name": first, "last_name": last, "zip": zip_code})
        yield from _review(
            user.user_id,
            (f"Thank you, {first}. I found your account ({user.user_id}) with {len(user.orders)} orders: "
             f"{', '.join(user.orders)}. Which one would you like to start with?",
             f"Let's go through them in order, starting with {user.orders[0]}."),
            user.orders, visit, 3,
            ("What would a return of everything in it give me back? Then let's look at the next order.",
             "Not for now, thanks. Can you check the next one?"),
            ("Is there anything else I can help you with today?", "Yes, please read me my account details again."))

    return opening, actions()


def _airline_script(env) -> tuple[str, Iterator[tuple]]:
    """An airline conversation with the customer who has the most reservations (ties by id)."""
    db = env.tools.db
    user = sorted(db.users.values(), key=lambda u: (-len(u.reservations), u.user_id))[0]
    first, last = user.name.first_name, user.name.last_name
    opening = (f"Hello, this is {first} {last}, user id {user.user_id}. I want to review my upcoming trips and maybe "
               "change the flights of one of them.")

    def visit(k: int, rid: str):
        res = db.reservations[rid]
        yield ("tool", "get_reservation_details", {"reservation_id": rid})
        f = res.flights[0]
        route = {"origin": f.origin, "destination": f.destination, "date": f.date}
        if k % 4 == 0:
            yield ("tool", "search_direct_flight", route)
        elif k % 4 == 1:
            yield ("tool", "get_flight_status", {"flight_number": f.flight_number, "date": f.date})
        elif k % 4 == 2:
            yield ("tool", "search_onestop_flight", route)
        return (str(sum(x.price for x in res.flights)),
                f"Reservation {rid} is a {res.flight_type.replace('_', ' ')} {res.cabin} trip from {res.origin} to "
                f"{res.destination} with {len(res.passengers)} passenger(s); its first flight is {f.flight_number} "
                f"on {f.date}. Would you like to change anything on it?")

    actions = _review(
        user.user_id,
        (f"Thank you, {first}. I see {len(user.reservations)} reservations on your profile: "
         f"{', '.join(user.reservations)}. Which one would you like to review first?",
         f"Please start with {user.reservations[0]} and go through them one by one."),
        user.reservations, visit, 2,
        ("How much did I pay for the flights of the trips so far? Then the next one, please.",
         "No, that one is fine. What about the next one?"),
        ("Is there anything else I can help you with?", "Yes, please read my profile again."))
    return opening, actions


SCRIPTS = {"retail": _retail_script, "airline": _airline_script}


def build_conversation(domain, n_turns: int) -> tuple[list[dict[str, Any]], list[Step]]:
    """A realistic conversation of ``n_turns`` agent turns on ``domain``.

    Args:
        domain: a :class:`rollout.benchmarks.tau2.environment.Tau2Domain` (its system prompt opens the conversation;
            a fresh environment of it runs the tools).
        n_turns: agent turns (>= 1); each is followed by a tool result or a user reply.

    Returns:
        ``(opening, steps)``: the first prompt's messages ``[system, user]`` and ``n_turns`` steps.

    Raises:
        ValueError: ``n_turns < 1`` or no script for the domain.
    """
    if n_turns < 1:
        raise ValueError("n_turns must be >= 1")
    if domain.name not in SCRIPTS:
        raise ValueError(f"no conversation script for domain {domain.name!r} (have {sorted(SCRIPTS)})")
    env = domain.new_environment()
    opening_text, actions = SCRIPTS[domain.name](env)
    steps: list[Step] = []
    for action in actions:
        if len(steps) == n_turns:
            break
        if action[0] == "tool":
            steps.append(_tool_step(env, action[1], action[2], len(steps)))
        else:
            steps.append(_say_step(action[1], action[2]))
    opening = [{"role": "system", "content": domain.system_prompt}, {"role": "user", "content": opening_text}]
    return opening, steps


# -- the two ways ------------------------------------------------------------------------------
def generated_ids(chat, step: Step) -> list[int]:
    """The ids a server returns for ``step``'s assistant turn: the canonical tokenization of the
    text the template renders for it, ending with EOS for a text reply and on ``</tool_call>``
    (the stop string, no EOS) for a tool call.

    Raises:
        IdsMismatch: the template renders the generation prompt differently from the start of an
            assistant turn in history (e.g. Qwen3 with ``enable_thinking=false``), so no generated
            text can make the full re-render equal the trajectory.
    """
    sys_msg, user = {"role": "system", "content": "S"}, {"role": "user", "content": "U"}
    prompt = chat.render([sys_msg, user], add_generation_prompt=True, tools=False)
    full = chat.render([sys_msg, user, step.assistant, {"role": "user", "content": "V"}], add_generation_prompt=False, tools=False)
    if not full.startswith(prompt):
        raise IdsMismatch(
            "the chat template renders an assistant turn in history differently from its generation prompt "
            f"(generation prompt ends {prompt[-40:]!r}, history has {full[len(prompt) - 40:len(prompt)]!r}): "
            "what the policy saw cannot equal the seed's re-render (e.g. policy.enable_thinking=false with Qwen3)")
    end = full.find(chat.end_of_turn, len(prompt))
    if end < 0:
        raise IdsMismatch("the chat template does not close the assistant turn with its EOS text")
    text = full[len(prompt):end]
    ids = chat.encode(text)
    return ids if step.is_tool_call else ids + chat.eot_ids


def ours_turn(chat, gen_ids: list[int], follow: dict[str, Any]) -> list[int]:
    """Our per-turn tokenizer work after a turn sampled as ``gen_ids``, as the episode loop does it.

    Returns:
        The ids appended to the trajectory after ``gen_ids``: the end-of-turn ids when the server
        did not generate them, then the delta of ``follow``.
    """
    closed = chat.ends_turn(gen_ids)
    chat.decode(gen_ids[: len(gen_ids) - len(chat.eot_ids)] if closed else gen_ids)  # the loop parses this text
    return ([] if closed else list(chat.eot_ids)) + chat.delta_ids([follow])


def seed_turn(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None, template_kwargs: dict[str, Any]) -> list[int]:
    """The seed's per-turn work: render the whole conversation with its tools and tokenize it.

    Returns:
        The ids of the next prompt (length = the conversation's tokens so far).
    """
    out = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, **template_kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def per_turn_ids(chat, opening: list[dict[str, Any]], steps: list[Step]) -> Iterator[tuple[list[int], list[int]]]:
    """For each turn, ``(ours, seed)``: the whole trajectory ours builds by appending (first
    prompt, generated ids, turn closes, deltas) and the seed's full render of the same messages.

    Raises:
        IdsMismatch: see :func:`generated_ids`.
    """
    traj = chat.prompt_ids(opening)
    messages = list(opening)
    for step in steps:
        gen = generated_ids(chat, step)
        traj = traj + gen + ours_turn(chat, gen, step.follow)
        messages += [step.assistant, step.follow]
        yield traj, seed_turn(chat.tokenizer, messages, chat.tools, chat.template_kwargs)


def check_identical(chat, opening: list[dict[str, Any]], steps: list[Step]) -> list[int]:
    """Check that ours equals the seed's full render at every turn.

    Returns:
        The tokens so far after each turn (the next prompt's length).

    Raises:
        IdsMismatch: naming the first turn and token where they differ, with the text around it.
    """
    lengths = []
    for turn, (ours, seed) in enumerate(per_turn_ids(chat, opening, steps), 1):
        if ours != seed:
            at = next((i for i, (a, b) in enumerate(zip(ours, seed)) if a != b), min(len(ours), len(seed)))
            raise IdsMismatch(
                f"turn {turn}: our ids differ from the seed's full render at token {at} "
                f"(ours {len(ours)} tokens, seed {len(seed)}): ours {chat.decode(ours[max(0, at - 8):at + 8])!r}, "
                f"seed {chat.decode(seed[max(0, at - 8):at + 8])!r}")
        lengths.append(len(ours))
    return lengths


def _median_cpu_s(fn, repeat: int) -> float:
    """Median CPU seconds of this process (``time.process_time``) of ``repeat`` calls of ``fn``."""
    clock = time.process_time
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def measure(chat, opening: list[dict[str, Any]], steps: list[Step], repeat: int) -> list[dict[str, Any]]:
    """Time ours and the seed's per-turn work, ``repeat`` times each per turn (ours, then seed).

    Returns:
        One row per turn: ``{"turn", "tokens", "new_tokens", "ours_ms", "seed_ms", "ratio"}``:
        tokens so far (the next prompt's length), tokens ours appended after the generated ids,
        median CPU milliseconds of this process over the repetitions, ratio = seed / ours.
    """
    rows = []
    messages = list(opening)
    tokens = len(chat.prompt_ids(opening))
    for turn, step in enumerate(steps, 1):
        gen = generated_ids(chat, step)
        messages += [step.assistant, step.follow]
        appended = ours_turn(chat, gen, step.follow)
        ours_ms = _median_cpu_s(lambda: ours_turn(chat, gen, step.follow), repeat) * 1e3
        convo = list(messages)
        seed_ms = _median_cpu_s(lambda: seed_turn(chat.tokenizer, convo, chat.tools, chat.template_kwargs), repeat) * 1e3
        tokens += len(gen) + len(appended)
        rows.append({"turn": turn, "tokens": tokens, "new_tokens": len(appended), "ours_ms": round(ours_ms, 4),
                     "seed_ms": round(seed_ms, 4), "ratio": round(seed_ms / ours_ms, 1) if ours_ms > 0 else None})
    return rows


def measure_same_step(chat, opening: list[dict[str, Any]], steps: list[Step], repeat: int) -> dict[str, Any]:
    """The cost of the last turn's step (its generated ids and next message) appended as turn 2
    (after turn 1) and as the last turn (after all the others): what the history alone costs.

    Ours never reads the history, so both of its figures time the same call (their ratio is
    measurement noise); the seed renders the whole history every turn.

    Returns:
        ``{"new_tokens", "ours_at_2_ms", "ours_at_last_ms", "seed_at_2_ms", "seed_at_last_ms",
        "growth", "growth_seed"}`` (median CPU milliseconds; growth = at last / at 2).
    """
    last = steps[-1]
    gen = generated_ids(chat, last)
    early = list(opening) + [steps[0].assistant, steps[0].follow, last.assistant, last.follow]
    late = list(opening) + [m for st in steps for m in (st.assistant, st.follow)]
    out: dict[str, Any] = {"new_tokens": len(ours_turn(chat, gen, last.follow))}
    out["ours_at_2_ms"] = _median_cpu_s(lambda: ours_turn(chat, gen, last.follow), repeat) * 1e3
    out["ours_at_last_ms"] = _median_cpu_s(lambda: ours_turn(chat, gen, last.follow), repeat) * 1e3
    out["seed_at_2_ms"] = _median_cpu_s(lambda: seed_turn(chat.tokenizer, early, chat.tools, chat.template_kwargs), repeat) * 1e3
    out["seed_at_last_ms"] = _median_cpu_s(lambda: seed_turn(chat.tokenizer, late, chat.tools, chat.template_kwargs), repeat) * 1e3
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
    out["growth"] = round(out["ours_at_last_ms"] / out["ours_at_2_ms"], 2) if out["ours_at_2_ms"] > 0 else None
    out["growth_seed"] = round(out["seed_at_last_ms"] / out["seed_at_2_ms"], 2) if out["seed_at_2_ms"] > 0 else None
    return out


def summarize(rows: list[dict[str, Any]], same_step: dict[str, Any]) -> dict[str, Any]:
    """Targets over the rows of :func:`measure` and :func:`measure_same_step`.

    Returns:
        ``{"ratio_last", "ratio_median", "ratio_min", "growth", "growth_seed", "growth_raw",
        "growth_raw_seed", "ratio_met", "growth_met"}``: seed / ours at the last turn, the median
        and the smallest per-turn ratio; ours (and the seed's) cost growth from turn 2 to the last
        turn for the same step (the target) and for the conversation's own turns 2 and last
        (which carry different messages: each turn's cost follows its new message); whether
        each target is met.
    """
    last = rows[-1]
    ratio = last["seed_ms"] / last["ours_ms"] if last["ours_ms"] > 0 else float("inf")
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    growth = same_step["growth"]
    return {"ratio_last": round(ratio, 1), "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "growth": growth, "growth_seed": same_step["growth_seed"],
            "growth_raw": round(last["ours_ms"] / rows[1]["ours_ms"], 2) if rows[1]["ours_ms"] > 0 else None,
            "growth_raw_seed": round(last["seed_ms"] / rows[1]["seed_ms"], 2) if rows[1]["seed_ms"] > 0 else None,
            "ratio_met": ratio >= TARGET_RATIO, "growth_met": growth is not None and growth <= TARGET_GROWTH}


def loop_lag_while(work, seconds: float) -> dict[str, Any]:
    """Event-loop lag of a fresh asyncio loop while one thread calls ``work()`` over and over.

    Args:
        work: the blocking call the thread repeats.
        seconds: how long to measure (> 0).

    Returns:
        :meth:`rollout.core.loop_health.LoopLagProbe.stats` (10 ms probe) plus ``"calls"``: how many times
        the thread completed ``work`` meanwhile.
    """
    from rollout.core.loop_health import LoopLagProbe

    async def run() -> dict[str, Any]:
        probe = LoopLagProbe(0.01)
        probe.start()
        stop, calls = threading.Event(), [0]

        def loop_work() -> None:
            while not stop.is_set():
                work()
                calls[0] += 1

        thread = threading.Thread(target=loop_work, name="bench-tokenize", daemon=True)
        thread.start()
        try:
            await asyncio.sleep(seconds)
        finally:
            stop.set()
            stats = probe.stats()
            probe.stop()
            await asyncio.to_thread(thread.join)
        return {**stats, "calls": calls[0]}

    return asyncio.run(run())


def measure_loop(chat, opening: list[dict[str, Any]], steps: list[Step], seconds: float, repeat: int,
                 gc_trajectories: int = 0) -> dict[str, Any]:
    """The event loop's lag while a thread tokenizes the whole last-turn conversation, through
    ``transformers`` and through ``chat`` (see the module docstring), and the CPU time of the
    JSON encoding of its ``/generate`` body with ``json`` and with :mod:`rollout.core.fastjson`.

    Returns:
        ``{"tokens", "floor": {...}, "transformers": {...}, "ours": {...}, "p99_ratio",
        "json_stdlib_ms", "json_ours_ms", "json_ratio", "json_bytes"}``: the three lag dicts of
        :func:`loop_lag_while` (``floor``: the thread only sleeps), p99 transformers / ours,
        median CPU ms of one body encoding and stdlib / ours; with ``gc_trajectories`` > 0 also
        :func:`measure_gc`'s keys for trajectories of these ids.
    """
    from rollout.core import fastjson

    messages = list(opening) + [m for st in steps for m in (st.assistant, st.follow)]
    text = chat.render(messages, add_generation_prompt=True)
    ids = chat.encode(text)
    tok = chat.tokenizer
    out: dict[str, Any] = {"tokens": len(ids)}
    out["floor"] = loop_lag_while(lambda: time.sleep(0.01), seconds)  # the host's own noise
    out["transformers"] = loop_lag_while(
        lambda: (tok.encode(text, add_special_tokens=False), tok.decode(ids, skip_special_tokens=False)), seconds)
    out["ours"] = loop_lag_while(lambda: (chat.encode(text), chat.decode(ids)), seconds)
    a, b = out["transformers"]["p99_ms"], out["ours"]["p99_ms"]
    out["p99_ratio"] = round(a / b, 1) if a is not None and b else None
    body = {"input_ids": ids, "sampling_params": {"temperature": 1.0, "max_new_tokens": 1024, "stop": ["</tool_call>"]},
            "return_logprob": True, "rid": "bench-0@0#0"}
    std = _median_cpu_s(lambda: json.dumps(body), repeat) * 1e3
    ours = _median_cpu_s(lambda: fastjson.dumps(body), repeat) * 1e3
    out.update({"json_stdlib_ms": round(std, 4), "json_ours_ms": round(ours, 4),
                "json_ratio": round(std / ours, 1) if ours > 0 else None, "json_bytes": len(fastjson.dumps(body))})
    if gc_trajectories > 0:
        out.update(measure_gc(ids, gc_trajectories, repeat))
    return out


def measure_gc(ids: list[int], n_trajectories: int, repeat: int) -> dict[str, Any]:
    """CPU time of one full garbage collection with ``n_trajectories`` trajectories alive, each a
    copy of ``ids`` (its first ``min(6000, len // 2)`` ids as the prompt, the rest as generated
    response with its mask and log-probs), held as lists and then compact (:meth:`Trajectory.compact`).
    Objects alive before the call are frozen meanwhile (``gc.freeze``), as an actor freezes what
    it loaded.

    Returns:
        ``{"gc_trajectories", "gc_tokens", "gc_lists_ms", "gc_compact_ms", "gc_ratio"}``: median
        ``time.process_time`` ms of ``gc.collect()`` over ``min(repeat, 5)`` collections.
    """
    import gc

    from rollout.core.trajectory import Trajectory

    cut = min(6000, len(ids) // 2)

    def alive(compact: bool) -> list[Trajectory]:
        out = []
        for _ in range(n_trajectories):
            t = Trajectory(prompt_ids=list(ids[:cut]))
            t.append_generated(list(ids[cut:]), [-0.5] * (len(ids) - cut))
            out.append(t.compact() if compact else t)
        return out

    res: dict[str, Any] = {"gc_trajectories": n_trajectories, "gc_tokens": len(ids)}
    # as in an actor (rollout.core.loop_health.tune_actor_process): what is loaded now (tokenizer, domain) is
    # frozen out of the collector's reach, so the timing is the trajectories' share alone
    gc.collect()
    gc.freeze()
    try:
        for name, compact in (("lists", False), ("compact", True)):
            held = alive(compact)
            res[f"gc_{name}_ms"] = round(_median_cpu_s(gc.collect, min(repeat, 5)) * 1e3, 3)
            del held
    finally:
        gc.unfreeze()
    gc.collect()
    res["gc_ratio"] = round(res["gc_lists_ms"] / res["gc_compact_ms"], 1) if res["gc_compact_ms"] > 0 else None
    return res


def format_loop(loop: dict[str, Any], releases_gil: bool) -> str:
    """The event-loop section of the report (see :func:`measure_loop`)."""
    def row(name: str, d: dict[str, Any]) -> str:
        return f"  {name:<34} {d['p50_ms']:>8.2f} {d['p99_ms']:>8.2f} {d['max_ms']:>8.2f} {d['calls']:>6}"

    lines = [f"event loop while a thread encodes and decodes the last turn's {loop['tokens']} tokens "
             f"(10 ms probe; ChatTemplate {'uses the Rust batch calls' if releases_gil else 'falls back to transformers'}):",
             f"  {'way':<34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'calls':>6}",
             row("floor (the thread only sleeps)", loop["floor"]),
             row("transformers encode + decode", loop["transformers"]),
             row("ChatTemplate.encode + decode (ours)", loop["ours"]),
             f"  lag p99 transformers / ours: {loop['p99_ratio']}x",
             f"/generate body of {loop['tokens']} ids ({loop['json_bytes']} bytes): json.dumps {loop['json_stdlib_ms']:.3f} ms, "
             f"ours (orjson) {loop['json_ours_ms']:.3f} ms: {loop['json_ratio']}x"]
    if "gc_trajectories" in loop:
        lines.append(f"one full garbage collection with {loop['gc_trajectories']} running trajectories of {loop['gc_tokens']} tokens: "
                     f"as lists {loop['gc_lists_ms']:.1f} ms, compact (ours) {loop['gc_compact_ms']:.1f} ms: {loop['gc_ratio']}x")
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The per-turn table, one line per turn: tokens so far (the next prompt's length), tokens
    our way tokenized that turn (the turn close and the next message's delta), both times, ratio."""
    lines = [f"{'turn':>4}  {'tokens':>7}  {'new':>5}  {'ours ms':>8}  {'seed ms':>8}  {'seed/ours':>9}"]
    for r in rows:
        lines.append(f"{r['turn']:>4}  {r['tokens']:>7}  {r['new_tokens']:>5}  {r['ours_ms']:>8.3f}  {r['seed_ms']:>8.3f}  {r['ratio']:>8.1f}x")
    return "\n".join(lines)


# -- CLI -----------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    """Add the ``turns`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("turns", help="per-turn tokenization CPU: ours (deltas) against the seed's full re-render")
    p.add_argument("--config", "-c", default="configs/local.yaml", help="YAML config (policy.tokenizer, policy.enable_thinking)")
    p.add_argument("--domain", default=None, choices=sorted(SCRIPTS), help="tau2 domain (default: the config's env.domain)")
    p.add_argument("--turns", type=int, default=30, help="agent turns in the conversation")
    p.add_argument("--repeat", type=int, default=30, help="timed repetitions per turn and way (median reported)")
    p.add_argument("--lag-seconds", type=float, default=3.0,
                   help="seconds of event-loop lag measured per tokenizer way (0 skips the section)")
    p.add_argument("--gc-trajectories", type=int, default=512,
                   help="running trajectories alive for the garbage-collection timing (0: skip it; needs --lag-seconds > 0)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. policy.tokenizer=/path")
    p.set_defaults(run=main_turns)


def main_turns(args) -> int:
    """Run the ``turns`` benchmark (see the module docstring).

    Args:
        args: the parsed sub-command (``config``, ``domain``, ``turns``, ``repeat``, ``json``,
            ``overrides``).

    Returns:
        0 when both ways gave identical ids at every turn (targets met or not: they are printed),
        1 when they did not, 2 for a bad config or arguments.
    """
    from rollout.benchmarks.tau2.environment import Tau2Domain
    from rollout.core.formats import ChatTemplate
    from rollout.core.logs import setup_logging
    from rollout.core.tokenizer import load_tokenizer
    from rollout.devtools.bench.cli import load_checked_config

    if args.turns < 2 or args.repeat < 1 or args.lag_seconds < 0 or args.gc_trajectories < 0:
        print("error: --turns must be >= 2, --repeat >= 1, --lag-seconds >= 0 and --gc-trajectories >= 0", file=sys.stderr)
        return 2
    cfg = load_checked_config(args.config, args.overrides)
    if cfg is None:
        return 2
    setup_logging(cfg.logging)
    domain_name = args.domain or cfg.env.domain
    if domain_name not in SCRIPTS:
        print(f"error: no conversation script for domain {domain_name!r} (have {sorted(SCRIPTS)})", file=sys.stderr)
        return 2
    domain = Tau2Domain(domain_name, tau2_log_level=cfg.logging.tau2_level)
    kwargs = {} if cfg.policy.enable_thinking is None else {"enable_thinking": cfg.policy.enable_thinking}
    chat = ChatTemplate(load_tokenizer(cfg.policy.tokenizer), tools=domain.tool_schemas, template_kwargs=kwargs)
    opening, steps = build_conversation(domain, args.turns)
    try:
        check_identical(chat, opening, steps)
    except IdsMismatch as e:
        print(f"FAILED: ours and the seed's way do not give identical ids: {e}", file=sys.stderr)
        return 1
    rows = measure(chat, opening, steps, args.repeat)
    same = measure_same_step(chat, opening, steps, args.repeat)
    s = summarize(rows, same)
    n = len(rows)
    print(f"turns bench: domain {domain_name}, tokenizer {cfg.policy.tokenizer}, enable_thinking {cfg.policy.enable_thinking}, "
          f"{len(domain.tool_schemas)} tool schemas; median process CPU time of {args.repeat} repetitions per turn")
    print(f"ids identical (ours == seed's full render) at all {n} turns")
    print(format_table(rows))
    print(f"seed / ours per turn: median {s['ratio_median']:.1f}x, smallest {s['ratio_min']:.1f}x")
    print(f"turn {n}: seed / ours = {s['ratio_last']:.1f}x (target >= {TARGET_RATIO:g}x): {'met' if s['ratio_met'] else 'NOT met'}")
    print(f"ours at turn {n} / ours at turn 2, the same step ({same['new_tokens']} new tokens) appended at both: "
          f"{same['ours_at_last_ms']:.3f} / {same['ours_at_2_ms']:.3f} ms = {s['growth']:.2f} (target <= {TARGET_GROWTH:g}): "
          f"{'met' if s['growth_met'] else 'NOT met'}; seed: {same['seed_at_last_ms']:.3f} / {same['seed_at_2_ms']:.3f} ms = {s['growth_seed']:.2f}")
    print(f"ours at turn {n} / ours at turn 2 as they come ({rows[-1]['new_tokens']} vs {rows[1]['new_tokens']} new tokens: "
          f"a turn costs what its new message costs): {s['growth_raw']:.2f}; seed: {s['growth_raw_seed']:.2f}")
    loop = measure_loop(chat, opening, steps, args.lag_seconds, args.repeat, args.gc_trajectories) if args.lag_seconds > 0 else None
    if loop is not None:
        print(format_loop(loop, chat.releases_gil))
    if args.json:
        out = {"domain": domain_name, "tokenizer": cfg.policy.tokenizer, "enable_thinking": cfg.policy.enable_thinking,
               "turns": n, "repeat": args.repeat, "clock": "time.process_time", "identical_ids": True,
               "rows": rows, "same_step": same, **s, "targets": {"ratio_last": TARGET_RATIO, "growth": TARGET_GROWTH},
               "releases_gil": chat.releases_gil, "loop": loop}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"json: {args.json}")
    return 0
