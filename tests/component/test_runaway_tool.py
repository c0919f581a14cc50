"""A tool call that would run for minutes is stopped for real within the step timeout, and the
actor keeps serving its other episodes (tau2's calculator evaluates its argument with eval)."""

from __future__ import annotations

import asyncio
import json
import os
import threading

from support.scripted_policy import ScriptedPolicyServer
from support.waits import wait_until

from rollout.core.config import load_config
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker

STEP_TIMEOUT_S = 3.0


def _call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>", "stop"


def script(eid, step, input_ids):
    if eid == "runaway":
        # only digits and operators, so tau2's character filter lets it through; 9**9**9**9 has
        # about 10**(3.7e8) digits: eval would run for ever.
        return [_call("calculate", expression="9**9**9**9"), ("Done.", "eos")][min(step, 1)]
    turns = [_call("get_order_details", order_id="#W2378156"), _call("calculate", expression="2+3"), ("Goodbye.", "eos")]
    return turns[min(step, 2)]


async def test_runaway_calculator_is_killed_and_other_episodes_go_on(tokenizer):
    async with ScriptedPolicyServer(tokenizer, script) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", f"env.step_timeout_s={STEP_TIMEOUT_S}", "env.max_steps=5"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=8)
        worker.sandbox._ensure()  # start the sandbox first, so its start-up is not in the timings
        specs = [EpisodeSpec("runaway", "retail", "0", "g", 0)] + [EpisodeSpec(f"normal-{k}", "retail", str(k), "g", 0) for k in range(3)]
        runaway_pid = worker.sandbox.pid
        try:  # (9**9**9**9 runs for ever: the hang guard fails a step timeout that does not fire)
            results = await asyncio.wait_for(asyncio.gather(*[worker.run(s) for s in specs]), timeout=120)
        finally:
            await worker.close()
    runaway, normal = results[0], results[1:]
    assert runaway.status is EpisodeStatus.TOOL_TIMEOUT, runaway.metadata
    assert not runaway.status.is_infrastructure_failure
    assert "killed" in runaway.metadata["error"]
    # the call that was cut counts in the episode's tool time: at least the step timeout it ran into
    assert runaway.metadata["timings"]["tool_s"] >= STEP_TIMEOUT_S * 0.95
    assert worker.sandbox.kills == 1
    try:  # the process that ran the expression is gone: the work really stopped
        os.kill(runaway_pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
    for res in normal:
        assert res.status is EpisodeStatus.COMPLETED, res.metadata
        tool_outputs = [m["content"] for m in res.messages if m["role"] == "tool"]
        assert tool_outputs[1] == "5.0"  # the restarted sandbox answers the next calculate call


def test_sandbox_children_do_not_rerun_the_parents_main_script(tmp_path):
    """A Ray actor's main module is Ray's worker script; a spawned sandbox must not import it
    again (it pulled Ray into every sandbox: 55 MiB)."""
    import json
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "spawn_marker.py").write_text("MARK = 1\n")
    (tmp_path / "spawn_probe.py").write_text(textwrap.dedent("""
        import sys

        def child(conn):
            conn.send("ready")
            conn.recv()
            conn.send(("ok", sorted(sys.modules)))
    """))
    script = tmp_path / "main_script.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(root)!r}]
        import spawn_marker  # the parent's script imports it; a child that re-ran the script would too
        import spawn_probe
        from rollout.benchmarks.tau2.environment import KillableChild

        class Probe(KillableChild):
            label = "probe"

            def _child(self):
                return spawn_probe.child, (), "probe"

        if __name__ == "__main__":
            p = Probe(startup_timeout_s=60)
            mods = p._request(("modules",), 30)
            p.kill()
            print(json.dumps({{"marker": "spawn_marker" in mods, "restored": sys.modules["__main__"].__spec__ is None}}))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"marker": False, "restored": True}


def test_a_sandbox_outlives_the_thread_that_started_it():
    """The sandbox asks for SIGKILL when its parent *thread* exits (PR_SET_PDEATHSIG follows the
    thread). A caller that drives a worker with ``asyncio.run`` per batch starts it from the
    default executor's thread, which ``asyncio.run`` ends on return: the sandbox must still be the
    same live process on the next call, not die under it (it did: "tool sandbox died:
    ConnectionResetError")."""
    from rollout.benchmarks.tau2.environment import ToolSandbox

    sb = ToolSandbox("retail", evaluator=False)

    starter: list[int] = []

    def call(expression):
        starter.append(threading.get_native_id())
        return sb.call("calculate", {"expression": expression}, 60.0)

    async def calc(expression):
        return await asyncio.get_running_loop().run_in_executor(None, call, expression)

    try:
        assert asyncio.run(calc("2+3")) == ("5.0", False)  # started from an executor thread, which has now ended
        pid = sb.pid
        # the kernel sends PDEATHSIG as that thread exits: once it is gone, a signal would have been sent
        wait_until(lambda: not os.path.exists(f"/proc/self/task/{starter[0]}"), "the starting thread to exit")
        assert sb._proc.is_alive(), sb._proc.exitcode
        assert asyncio.run(calc("4*5")) == ("20.0", False)
        assert sb.pid == pid and sb.kills == 0
    finally:
        sb.close()


def test_start_from_lasting_thread_runs_on_one_thread_and_reraises():
    import threading

    import pytest

    from rollout.core.fate import start_from_lasting_thread

    names = {start_from_lasting_thread(lambda: threading.current_thread().name) for _ in range(3)}
    assert len(names) == 1 and names != {threading.current_thread().name}
    with pytest.raises(ValueError, match="no start"):
        start_from_lasting_thread(lambda: (_ for _ in ()).throw(ValueError("no start")))
