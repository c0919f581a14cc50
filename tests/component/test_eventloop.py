"""The event loop choice (rollout.core.eventloop): config keys, the local server, the bench's record.

The actors' side (``pool.event_loop`` through Ray's ``RAY_USE_UVLOOP``) is tested on the shared
Ray cluster in ``test_pool.py`` and in ``test_bench_pool.py``'s end-to-end run.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from rollout.core.config import ConfigError, load_config
from rollout.core.eventloop import EVENT_LOOPS, check_event_loop, loop_kind, new_event_loop, ray_env_vars


@pytest.mark.parametrize("kind", EVENT_LOOPS)
def test_new_event_loop_gives_the_kind_asked_for_and_runs_coroutines(kind):
    loop = new_event_loop(kind)
    try:
        assert loop_kind(loop) == kind
        assert type(loop).__module__.split(".")[0] == kind

        async def answer():
            await asyncio.sleep(0.001)
            return loop_kind(asyncio.get_running_loop())

        assert loop.run_until_complete(answer()) == kind
    finally:
        loop.close()


def test_unknown_kinds_are_refused():
    with pytest.raises(ValueError, match="uvloop, asyncio"):
        new_event_loop("trio")
    with pytest.raises(ValueError, match="uvloop, asyncio"):
        ray_env_vars("trio")
    assert "pool.event_loop" in check_event_loop("trio", "pool.event_loop")


def test_ray_env_vars_switch_ray_s_own_choice():
    # Ray reads RAY_USE_UVLOOP as true only for "1" or "true" (ray._common.utils.env_bool)
    assert ray_env_vars("uvloop") == {"RAY_USE_UVLOOP": "1"}
    assert ray_env_vars("asyncio") == {"RAY_USE_UVLOOP": "0"}


def test_config_keys_are_checked_and_named():
    cfg = load_config(None, ["local.enabled=true"])
    assert (cfg.pool.event_loop, cfg.local.event_loop) == ("uvloop", "uvloop")
    assert load_config(None, ["local.enabled=true", "pool.event_loop=asyncio", "local.event_loop=asyncio"]).pool.event_loop == "asyncio"
    for key in ("pool.event_loop", "local.event_loop"):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, ["local.enabled=true", f"{key}=tornado"])


def test_uvloop_missing_here_fails_the_local_stack_s_config_naming_the_key(monkeypatch, tmp_path):
    """load_config does no I/O: whether uvloop is installed here is the preflight's to check
    (check_before_start, which the CLI and open_pool run before anything starts)."""
    import rollout.core.eventloop as ev
    from rollout.app.preflight import check_before_start

    monkeypatch.setattr(ev, "uvloop_available", lambda: False)
    with pytest.raises(ConfigError, match=r"local\.event_loop: uvloop is not installed.*local\.event_loop=asyncio"):
        check_before_start(load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}"]))
    # the servers are not started here: nothing to check; asyncio needs nothing
    cfg = load_config(None, ["local.enabled=false", "policy.router_url=http://127.0.0.1:1", f"rollout.output_dir={tmp_path}"])
    check_before_start(cfg)
    assert cfg.local.event_loop == "uvloop"
    cfg = load_config(None, ["local.enabled=true", "local.event_loop=asyncio", f"rollout.output_dir={tmp_path}"])
    check_before_start(cfg)
    assert cfg.local.event_loop == "asyncio"


@pytest.mark.slow
def test_the_local_servers_run_the_configured_loop_and_serve(retail_stack, tmp_path_factory):
    from conftest import _stack

    from rollout.devtools.bench.pool import stack_event_loops

    # the session stack: the default, uvloop
    assert [info["event_loop"] for info in retail_stack.server_infos()] == ["uvloop"]
    assert stack_event_loops(retail_stack) == "uvloop"
    stack = _stack("gold_replay", "retail", tmp_path_factory, event_loop="asyncio")
    try:
        assert stack_event_loops(stack) == "asyncio"
        log = (stack.log_dir / "server-0.log").read_text()
        assert "loop=asyncio listening on" in log
        # and it serves as the uvloop one does (its scripted user simulator's answer)
        body = json.dumps({"model": "user-sim", "messages": [{"role": "user", "content": "Done?"}]}).encode()
        req = urllib.request.Request(stack.router_url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.loads(resp.read())
        assert out["choices"][0]["message"]["content"] == "Yes, please go ahead."
    finally:
        stack.stop()
