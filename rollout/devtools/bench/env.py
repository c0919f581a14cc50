"""``python -m rollout.bench env``: environment reset and reward, ours (``env.evaluator: fast``)
against tau2's own path, over every task of a domain and a set of trajectories per task.

For each task, trajectories are built from its gold actions (:func:`trajectories`): the gold
run, perturbed runs (a skipped write, a wrong argument, an extra write, a write then its undo) and
failing runs (no action, only failing calls, a transfer). The user's own gold actions (dual
control: banking_knowledge) are kept in their places in every run. Each is played on both paths
with the same tool calls:

* **ours**: the fast path's environment (a copy-on-write view of the actor's database,
  :mod:`rollout.benchmarks.tau2.cow`; for banking_knowledge the domain's constructor on a copy of the
  actor's database), the tool calls on it, and :meth:`rollout.benchmarks.tau2.fast.FastPath.evaluate`;
* **tau2**: ``get_environment()`` (a fresh database; with the domain's keyword arguments, e.g.
  ``env.retrieval_config``), the same tool calls, and tau2's ``evaluate_simulation``
  (:func:`rollout.benchmarks.tau2.environment.evaluate_run`), in this process.

Tasks whose reward basis holds NL assertions (tau2-bench >= 1.0) are judged on both paths by the
same judge: ``env.judge``'s endpoint when it names one, else the local stack's deterministic
stand-in judge (:class:`rollout.devtools.local.judge.StandInJudgeServer`, every assertion met).

Every tool answer and every reward with its breakdown must be identical (a retrieval tool's
``[Timing: ...]`` line, wall-clock milliseconds, is left out of the answers compared); the shared
database must be unchanged at the end. Timings are CPU-bound wall seconds in this process, side by side:
reset (building the episode's environment) plus reward, the figure tau2's path spends most on,
and the tool calls apart. Memory: the Python heap held per concurrent episode (``tracemalloc``,
environments kept alive after their tool calls) on each path, against a fresh environment::

    python -m rollout.bench env --domain airline [--json FILE] [--tasks 0,1,2] [--repeat 1]
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import logging
import re
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STOP = "###STOP###"
KINDS = ("gold", "skip_write", "wrong_arg", "extra_write", "write_undo", "no_action", "failing_calls", "transfer")


_TIMING = re.compile(r"\s*\[Timing: [^\]]*\]\s*$")


def strip_timing(content: str) -> str:
    """A tool answer without the ``[Timing: retrieval=17ms, ...]`` line tau2's retrieval tools end
    with (wall-clock milliseconds: they differ between two runs of the same call)."""
    return _TIMING.sub("", content) if isinstance(content, str) else content


@dataclass
class Trajectory:
    """One scripted run of a task: tool calls ``(name, arguments)`` in order, then an ending.

    Attributes:
        kind: one of :data:`KINDS`.
        calls: the tool calls, the agent's ``(name, arguments)`` and the user's
            ``("user", name, arguments)`` (dual control), in order.
        ending: ``user_stop`` (the agent says ``final_text`` and the user stops), ``agent_stop``
            (the agent says ``###STOP###``) or ``transfer`` (a ``transfer_to_human_agents`` call).
        final_text: the agent's last message for ``user_stop``.
    """

    kind: str
    calls: list[tuple[str, dict]] = field(default_factory=list)
    ending: str = "user_stop"
    final_text: str = ""


def _final_text(task: Any) -> str:
    infos = (task.evaluation_criteria.communicate_info or []) if task.evaluation_criteria else []
    return "\n".join(["Here is what you asked for:", *[f"- {s}" for s in infos], "Your request has been completed."])


def _perturb_argument(args: dict) -> dict | None:
    """A changed copy of a write's arguments: a list argument loses its last item, else a number
    grows by one, else the last character of a string changes; None if nothing can change."""
    out = copy.deepcopy(args)
    for key, value in out.items():
        if isinstance(value, list) and len(value) >= 2:
            out[key] = value[:-1]
            return out
    for key, value in out.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value + 1
            return out
    for key, value in out.items():
        if isinstance(value, str) and value:
            last = value[-1]
            out[key] = value[:-1] + (str((int(last) + 1) % 10) if last.isdigit() else ("b" if last != "b" else "c"))
            return out
    return None


def _undo_pair(domain_name: str, db: Any, task: Any) -> list[tuple[str, dict]] | None:
    """A write and the write that undoes it, on a record the task's gold actions name: retail, a
    user's address changed and changed back; airline, a reservation's passengers renamed and
    named back. None when the gold actions name no such record."""
    args = [a.arguments for a in task.evaluation_criteria.actions or []]
    if domain_name == "retail":
        for a in args:
            user = db.users.get(a.get("user_id")) if a.get("user_id") else None
            if user is not None:
                orig = user.address.model_dump()
                moved = {**orig, "address1": orig["address1"] + " Apt 9"}
                return [("modify_user_address", {"user_id": user.user_id, **moved}), ("modify_user_address", {"user_id": user.user_id, **orig})]
    if domain_name == "airline":
        for a in args:
            res = db.reservations.get(a.get("reservation_id")) if a.get("reservation_id") else None
            if res is not None and res.passengers:
                orig = [p.model_dump() for p in res.passengers]
                renamed = copy.deepcopy(orig)
                renamed[0]["first_name"] = renamed[0]["first_name"] + "a"
                rid = res.reservation_id
                return [("update_reservation_passengers", {"reservation_id": rid, "passengers": renamed}),
                        ("update_reservation_passengers", {"reservation_id": rid, "passengers": orig})]
    return None


def trajectories(domain: Any, task: Any) -> list[Trajectory]:
    """The trajectories played for ``task`` (see the module docstring); a perturbation that the
    task's gold actions do not allow (no write to skip or change) is left out. The user's gold
    actions keep their places (a perturbation changes the agent's calls only).

    Args:
        domain: a :class:`rollout.benchmarks.tau2.environment.Tau2Domain`.
        task: one of its tau2 Tasks.
    """
    seq: list[tuple] = [(a.name, dict(a.arguments)) if a.requestor == "assistant" else ("user", a.name, dict(a.arguments))
                        for a in (task.evaluation_criteria.actions or [])]
    agent = [i for i, c in enumerate(seq) if len(c) == 2]
    gold = [seq[i] for i in agent]
    writes = [i for i in agent if domain.is_write.get(seq[i][0], domain.tool_types.get(seq[i][0]) == "write")]
    text = _final_text(task)
    out = [Trajectory("gold", seq, final_text=text)]
    if writes:
        i = writes[0]
        out.append(Trajectory("skip_write", seq[:i] + seq[i + 1:], final_text=text))
        j = writes[-1]
        changed = _perturb_argument(seq[j][1])
        if changed is not None:
            out.append(Trajectory("wrong_arg", seq[:j] + [(seq[j][0], changed)] + seq[j + 1:], final_text=text))
        out.append(Trajectory("extra_write", seq[:j + 1] + [copy.deepcopy(seq[j])] + seq[j + 1:], final_text=text))
    undo = _undo_pair(domain.name, domain.fast.shared.db, task) if domain.fast.mode == "cow" else None
    if undo is not None:
        out.append(Trajectory("write_undo", seq + undo, final_text=text))
    out.append(Trajectory("no_action", [], ending="agent_stop"))
    reads = [(n, a) for n, a in gold if domain.tool_types.get(n) == "read"][:1]
    bad = [(n, {k: (v + "_nope" if isinstance(v, str) else v) for k, v in a.items()}) for n, a in gold if domain.tool_types.get(n) == "write"][:2]
    out.append(Trajectory("failing_calls", reads + bad, ending="agent_stop"))
    out.append(Trajectory("transfer", seq[: len(seq) // 2], ending="transfer"))
    return out


def play(domain: Any, task: Any, traj: Trajectory, path: str, reward: bool = True, judge: Any = None) -> dict[str, Any]:
    """Play ``traj`` on ``path`` (``fast`` | ``tau2``) in this process (without ``reward``:
    the tool calls only; ``reward`` and ``info`` are then None).

    Args:
        judge: ``env.judge`` (for a task whose basis holds NL assertions).

    Returns:
        ``{"reward", "info", "answers": [tool message content, timing lines left out], "reset_s",
        "tools_s", "reward_s", "env", "messages"}`` (``env`` the episode's environment, for memory
        measurements; ``messages`` the conversation as tau2 messages).
    """
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage

    from rollout.benchmarks.tau2.environment import TRANSFER_TOOL, evaluate_run

    t0 = time.perf_counter()
    if path == "fast":
        env = domain.fast.new_environment(task)
    else:
        env = domain.new_environment(task)
        st = task.initial_state
        if st is not None and (st.initialization_data or st.initialization_actions or st.message_history):
            env.set_state(initialization_data=st.initialization_data, initialization_actions=st.initialization_actions,
                          message_history=st.message_history or [])
    reset_s = time.perf_counter() - t0
    messages: list[Any] = [UserMessage(role="user", content="Hi! I need help.")]
    answers = []
    t0 = time.perf_counter()
    calls = list(traj.calls) + ([(TRANSFER_TOOL, {"summary": "The user wants a human agent."})] if traj.ending == "transfer" else [])
    for i, c in enumerate(calls):
        if len(c) == 3:  # the user's own tool call (dual control)
            call = ToolCall(id=f"user_call_{i}", name=c[1], arguments=copy.deepcopy(c[2]), requestor="user")
            messages.append(UserMessage(role="user", content=None, tool_calls=[call]))
        else:
            call = ToolCall(id=f"call_{i}", name=c[0], arguments=copy.deepcopy(c[1]))
            messages.append(AssistantMessage(role="assistant", content=None, tool_calls=[call]))
        msg = env.get_response(call)
        messages.append(msg)
        answers.append(strip_timing(msg.content))
    tools_s = time.perf_counter() - t0
    if traj.ending == "user_stop":
        messages += [AssistantMessage(role="assistant", content=traj.final_text), UserMessage(role="user", content=STOP)]
        termination = "user_stop"
    elif traj.ending == "agent_stop":
        messages.append(AssistantMessage(role="assistant", content=STOP))
        termination = "agent_stop"
    else:
        termination = "transfer"
    t0 = time.perf_counter()
    if not reward:
        score, info = None, None
    elif path == "fast":
        score, info = domain.fast.evaluate(task, env, messages, judge)
    else:
        score, info = evaluate_run(task, messages, termination, domain.name, 0.0, 1.0, judge=judge, env_kwargs=domain.env_kwargs(task))
    reward_s = time.perf_counter() - t0
    return {"reward": score, "info": info, "answers": answers, "reset_s": reset_s, "tools_s": tools_s, "reward_s": reward_s, "env": env,
            "messages": messages}


def compare_domain(domain: Any, task_ids: list[str] | None = None, kinds: tuple[str, ...] = KINDS, progress: bool = False,
                   judge: Any = None) -> dict[str, Any]:
    """Play every trajectory of every task (or ``task_ids``) on both paths and compare
    (``judge``: ``env.judge``, for the tasks whose basis holds NL assertions).

    Returns:
        ``{"domain", "tasks", "episodes", "identical_rewards", "identical_answers",
        "mismatches": [...], "kinds": {kind: count}, "rewards": {"1.0": n, ...},
        "fast": {"reset_s", "tools_s", "reward_s"}, "tau2": {...}}`` (seconds, summed over
        episodes) and ``"shared_db_unchanged"``: the shared database still hashes as a fresh one.
    """
    ids = task_ids if task_ids is not None else list(domain.tasks)
    fresh_hash = domain.new_environment().tools.db.get_hash()
    if not domain.fast.enabled:
        raise ValueError(f"tau2 domain {domain.name}: no fast path to compare (its episodes take tau2's path)")
    sums = {p: {"reset_s": 0.0, "tools_s": 0.0, "reward_s": 0.0} for p in ("fast", "tau2")}
    episodes = same_reward = same_answers = 0
    mismatches: list[dict] = []
    kind_counts: dict[str, int] = {}
    rewards: dict[str, int] = {}
    for n, tid in enumerate(ids):
        task = domain.tasks[tid]
        for traj in trajectories(domain, task):
            if traj.kind not in kinds:
                continue
            ours = play(domain, task, traj, "fast", judge=judge)
            ref = play(domain, task, traj, "tau2", judge=judge)
            episodes += 1
            kind_counts[traj.kind] = kind_counts.get(traj.kind, 0) + 1
            for p, r in (("fast", ours), ("tau2", ref)):
                for k in sums[p]:
                    sums[p][k] += r[k]
            ok_reward = (ours["reward"], ours["info"]) == (ref["reward"], ref["info"])
            ok_answers = ours["answers"] == ref["answers"]
            same_reward += ok_reward
            same_answers += ok_answers
            rewards[str(ref["reward"])] = rewards.get(str(ref["reward"]), 0) + 1
            if not (ok_reward and ok_answers):
                mismatches.append({"task": tid, "kind": traj.kind, "fast": [ours["reward"], ours["info"]], "tau2": [ref["reward"], ref["info"]],
                                   "answers_equal": ok_answers})
        if progress:
            print(f"\r{domain.name}: {n + 1}/{len(ids)} tasks, {episodes} episodes", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    unchanged = domain.fast.base_hash() == fresh_hash
    return {"domain": domain.name, "tasks": len(ids), "episodes": episodes, "identical_rewards": same_reward, "identical_answers": same_answers,
            "mismatches": mismatches, "kinds": kind_counts, "rewards": rewards, "fast": sums["fast"], "tau2": sums["tau2"],
            "shared_db_unchanged": unchanged}


def memory_per_episode(domain: Any, task_ids: list[str], n: int = 32) -> dict[str, float]:
    """Python heap (``tracemalloc``) held per concurrent episode after its gold tool calls, on
    each path, and that of one fresh tau2 environment; bytes.

    ``n`` episodes are kept alive at once, cycling over ``task_ids``.
    """
    out: dict[str, float] = {}
    tasks = [domain.tasks[t] for t in task_ids]
    for path in ("fast", "tau2", "fresh"):
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        if path == "fresh":
            keep = [domain.new_environment()]
        else:
            keep = [play(domain, tasks[i % len(tasks)], trajectories(domain, tasks[i % len(tasks)])[0], path, reward=False)["env"]
                    for i in range(n)]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        out[path] = held / len(keep)
        del keep
    return out


def main_env(args) -> int:
    """``env``: print the comparison table and write JSON; 1 unless every reward and answer is
    identical and the shared database unchanged."""
    from rollout.benchmarks.tau2.environment import Tau2Domain
    from rollout.core.logs import setup_logging
    from rollout.devtools.bench.cli import load_checked_config

    cfg = load_checked_config(args.config, ["logging.level=WARNING", f"env.domain={args.domain}", *args.overrides])
    if cfg is None:
        return 2
    setup_logging(cfg.logging)
    domain = Tau2Domain(cfg.env.domain, tau2_log_level=cfg.logging.tau2_level, retrieval_config=cfg.env.retrieval_config)
    ids = [t.strip() for t in args.tasks.split(",")] if args.tasks else list(domain.tasks)
    missing = [t for t in ids if t not in domain.tasks]
    if missing:
        print(f"--tasks: not tasks of {domain.name}: {missing[:10]}", file=sys.stderr)
        return 2
    with _judge_for(cfg.env.judge) as judge:
        runs = [compare_domain(domain, ids, progress=not args.quiet, judge=judge) for _ in range(args.repeat)]
    r = runs[-1]
    per = {p: {k: statistics.median(run[p][k] for run in runs) / r["episodes"] for k in ("reset_s", "tools_s", "reward_s")} for p in ("fast", "tau2")}
    ours = per["fast"]["reset_s"] + per["fast"]["reward_s"]
    theirs = per["tau2"]["reset_s"] + per["tau2"]["reward_s"]
    mem = memory_per_episode(domain, ids[: min(len(ids), 32)], n=args.concurrency)
    report = {
        "domain": domain.name, "tasks": r["tasks"], "episodes": r["episodes"], "kinds": r["kinds"], "rewards": r["rewards"],
        "ours_s_per_episode": ours, "tau2_s_per_episode": theirs, "ratio": theirs / ours if ours else float("inf"),
        "ours": per["fast"], "tau2": per["tau2"],
        "identical_rewards": r["identical_rewards"], "identical_answers": r["identical_answers"], "mismatches": r["mismatches"],
        "shared_db_unchanged": r["shared_db_unchanged"],
        "memory_bytes_per_episode": {"ours": mem["fast"], "tau2": mem["tau2"], "fresh_environment": mem["fresh"]},
        "memory_concurrency": args.concurrency, "repeat": args.repeat,
    }
    ms = 1e3
    print(f"{domain.name}: {r['tasks']} tasks, {r['episodes']} episodes ({', '.join(f'{k} {v}' for k, v in r['kinds'].items())}); "
          f"{domain.info.label()}; fast path: {domain.fast.mode}")
    print(f"{'per episode':<28}{'ours':>12}{'tau2':>12}{'ratio':>9}")
    for label, k in (("reset (environment)", "reset_s"), ("reward", "reward_s")):
        a, b = per["fast"][k] * ms, per["tau2"][k] * ms
        print(f"{label:<28}{a:>10.2f}ms{b:>10.2f}ms{b / a if a else float('inf'):>8.1f}x")
    print(f"{'reset + reward':<28}{ours * ms:>10.2f}ms{theirs * ms:>10.2f}ms{report['ratio']:>8.1f}x")
    a, b = per["fast"]["tools_s"] * ms, per["tau2"]["tools_s"] * ms
    print(f"{'tool calls (not in ratio)':<28}{a:>10.2f}ms{b:>10.2f}ms{b / a if a else float('inf'):>8.1f}x")
    m = report["memory_bytes_per_episode"]
    print(f"memory per concurrent episode ({args.concurrency} alive): ours {m['ours'] / 1e6:.3f} MB, tau2 {m['tau2'] / 1e6:.2f} MB, "
          f"a fresh environment {m['fresh_environment'] / 1e6:.2f} MB: ours is {m['ours'] / m['fresh_environment']:.3f} of it")
    print(f"identical rewards: {r['identical_rewards']}/{r['episodes']}; identical tool answers: {r['identical_answers']}/{r['episodes']}; "
          f"shared database unchanged: {'yes' if r['shared_db_unchanged'] else 'NO'}")
    for mm in r["mismatches"][:10]:
        print(f"  MISMATCH task {mm['task']} {mm['kind']}: fast {mm['fast']} tau2 {mm['tau2']} answers equal {mm['answers_equal']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"json: {args.json}")
    ok = r["identical_rewards"] == r["episodes"] == r["identical_answers"] and r["shared_db_unchanged"]
    return 0 if ok else 1


@contextlib.contextmanager
def _judge_for(cfg: Any):
    """``env.judge`` as the comparison uses it: as configured when it names an endpoint (or is
    ``none``), else pointed at a :class:`~rollout.devtools.local.judge.StandInJudgeServer` started
    for the run (both paths then get the same verdicts)."""
    import dataclasses

    from rollout.devtools.local.judge import StandInJudgeServer

    if cfg.kind != "llm" or cfg.base_url:
        yield cfg
        return
    with StandInJudgeServer() as server:
        yield dataclasses.replace(cfg, base_url=server.base_url, model=server.model)


def add_parser(sub) -> None:
    """Add the ``env`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("env", help="environment reset and reward: ours against tau2's path, every task, identical rewards")
    p.add_argument("--config", "-c", default="configs/local.yaml")
    p.add_argument("--domain", default="retail", help="tau2 domain (airline | retail | banking_knowledge with env.retrieval_config=bm25 | ...)")
    p.add_argument("--tasks", default=None, help="comma-separated task ids (default: every task)")
    p.add_argument("--repeat", type=int, default=1, help="timing runs (median)")
    p.add_argument("--concurrency", type=int, default=32, help="episodes alive at once for the memory figure")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(run=main_env)
