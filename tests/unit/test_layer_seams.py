"""The seams that keep the app's layers pointing down (issue 29 item 4): the engine registry the
wiring reaches the local stack through (``rollout.core.engines``), the benchmark's own hooks the
preflight calls (``rollout.core.environment.benchmark_hook``), and open_pool's start-up timeline,
given back through its ``timeline`` argument rather than a module global. Pure: no server, no Ray.
A toy engine started by ``open_pool`` is in ``tests/e2e/test_engine_seam.py``."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rollout.app import wiring
from rollout.app.preflight import PreflightError, check_config, check_modules
from rollout.core.config import ConfigError, load_config
from rollout.core.engines import ENGINES, LOCAL_STACK, VLLM_STACK, EngineJob, engine_for, get_engine, register_engine
from rollout.core.environment import benchmark_hook, benchmarks, register_benchmark, unregister_benchmark
from rollout.core.registry import UnknownNameError

ROUTER = "policy.router_url=http://127.0.0.1:9"  # a job without an engine names its router (nothing is called here)


def _cfg(*overrides: str):
    """The default config with ``overrides``; without ``local.enabled=true`` it names :data:`ROUTER`."""
    return load_config(None, [*overrides] if "local.enabled=true" in overrides else [ROUTER, *overrides])


def test_the_app_imports_neither_devtools_nor_a_benchmark_adapter():
    """No module of the app layer imports the tooling layer or a benchmark adapter, at any level
    (a function's own imports included, as the wiring's were): both are reached by registered
    paths. ``check_structure.py`` checks the same layer rule for the whole package."""
    import ast
    from pathlib import Path

    import rollout.app

    bad = []
    for path in sorted(Path(rollout.app.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.name}: {n}" for n in names if n.startswith(("rollout.devtools", "rollout.benchmarks"))]
    assert bad == []
    # and importing what open_pool runs loads neither
    code = ("import sys, rollout.app.wiring, rollout.app.preflight; "
            "print(sorted(m for m in sys.modules if m.startswith(('rollout.devtools', 'rollout.benchmarks'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.strip() == "[]", out


def test_the_local_stack_and_vllm_are_the_engines_registered_by_path():
    assert ENGINES.paths() == {LOCAL_STACK: "rollout.devtools.local.stack:LocalStackEngine",
                               VLLM_STACK: "rollout.devtools.local.vllm.engine:VllmEngine"}
    kind = get_engine(LOCAL_STACK)
    assert kind.__name__ == "LocalStackEngine" and kind.section == "local"
    assert engine_for(_cfg("local.enabled=true")) == LOCAL_STACK
    assert engine_for(_cfg("local.enabled=true", "local.backend=vllm", "policy.engine=vllm")) == VLLM_STACK
    assert get_engine(VLLM_STACK).section == "local"
    assert engine_for(_cfg()) is None  # policy.router_url: a router already running
    assert engine_for(_cfg("local.backend=vllm")) is None  # local.enabled=false: a fleet already running
    with pytest.raises(UnknownNameError, match=r"no engine 'sglang' is registered \(registered: local, vllm"):
        get_engine("sglang")
    with pytest.raises(ValueError, match="already registered"):
        register_engine(LOCAL_STACK, "somewhere:Else")


def test_the_engine_job_carries_the_policy_and_env_facts(tmp_path):
    cfg = _cfg("env.benchmark=tau_bench", "policy.api_key_env=MY_KEY", "policy.chat_format=hermes")
    job = EngineJob.of(cfg, tmp_path)
    assert (job.domain, job.tokenizer, job.chat_format, job.api_key_env, job.log_dir) == (
        "tau_bench:retail", cfg.policy.tokenizer, "hermes", "MY_KEY", tmp_path)


def test_the_local_stack_engine_chooses_its_router_port_when_made(tmp_path):
    """The router's URL is known before the engine starts (the actors start at the same time)."""
    kind = get_engine(LOCAL_STACK)
    cfg = _cfg("local.enabled=true")
    engine = kind(cfg.local, EngineJob.of(cfg, tmp_path))
    host, port = engine.router_url.removeprefix("http://").split(":")
    assert host == cfg.local.host and int(port) > 0
    fixed = _cfg("local.enabled=true", "local.router_port=45678")
    assert kind(fixed.local, EngineJob.of(fixed, tmp_path)).router_url == f"http://{fixed.local.host}:45678"
    engine.stop()  # never started: nothing to stop, no error


class _ToyEngine:
    """An engine kind whose checks refuse what the test sets."""

    section = "local"
    refuse_config: str | None = None
    refuse_modules: str | None = None
    checked: list[str] = []

    @classmethod
    def check_config(cls, cfg):
        cls.checked.append("config")
        if cls.refuse_config:
            raise ConfigError(cls.refuse_config)

    @classmethod
    def check_modules(cls, cfg):
        cls.checked.append("modules")
        if cls.refuse_modules:
            raise PreflightError(cls.refuse_modules)


@pytest.fixture
def toy_engine():
    """``_ToyEngine`` registered as the local stack for the test; the real one put back afterwards."""
    saved = ENGINES.paths()[LOCAL_STACK]
    _ToyEngine.refuse_config = _ToyEngine.refuse_modules = None
    _ToyEngine.checked = []
    register_engine(LOCAL_STACK, _ToyEngine, replace=True)
    yield _ToyEngine
    register_engine(LOCAL_STACK, saved, replace=True)


def test_the_preflight_checks_the_job_s_engine_through_its_hooks(toy_engine):
    on = _cfg("local.enabled=true")
    check_config(on)
    check_modules(on)
    assert toy_engine.checked == ["config", "modules"]
    toy_engine.refuse_config = "local.backend: not here"
    with pytest.raises(ConfigError, match="^local.backend: not here$"):
        check_config(on)
    toy_engine.refuse_modules = "local.backend needs a package"
    with pytest.raises(PreflightError, match="^local.backend needs a package$"):
        check_modules(on)
    toy_engine.checked.clear()
    off = _cfg()  # no engine started: none checked
    check_config(off)
    check_modules(off)
    assert toy_engine.checked == []


def test_the_local_stack_s_own_checks_name_their_keys(monkeypatch):
    """What the preflight checked itself before the engine seam, now the local stack's hooks."""
    from rollout.core import eventloop

    cfg = _cfg("local.enabled=true", "local.event_loop=uvloop", "local.backend=tiny")
    monkeypatch.setattr(eventloop, "uvloop_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^local\.event_loop: uvloop is not installed here"):
        check_config(cfg)
    monkeypatch.setitem(sys.modules, "torch", None)  # masked: as if not installed
    with pytest.raises(PreflightError, match=r"^local\.backend=tiny needs torch.*tau-rollout\[tiny\]"):
        check_modules(cfg)


@pytest.fixture
def toy_benchmark():
    """A benchmark ``toy_hooks`` registered for the test with hooks it records; unregistered afterwards."""
    calls: list[tuple[str, object]] = []

    def check_env(env_cfg):
        calls.append(("check_config", env_cfg.domain))
        if env_cfg.domain == "nope":
            raise ConfigError("env.domain: toy has no domain 'nope'")

    register_benchmark("toy_hooks", lambda env_cfg, log_level="ERROR": None, check_config=check_env,
                       check_user=lambda user_cfg: calls.append(("check_user", user_cfg.kind)))
    yield calls
    if "toy_hooks" in benchmarks():
        unregister_benchmark("toy_hooks")


def test_a_benchmark_s_config_check_is_its_own_hook(toy_benchmark):
    check_config(_cfg("env.benchmark=toy_hooks", "env.domain=fine"))
    with pytest.raises(ConfigError, match="^env.domain: toy has no domain 'nope'$"):
        check_config(_cfg("env.benchmark=toy_hooks", "env.domain=nope"))
    assert toy_benchmark == [("check_config", "fine"), ("check_config", "nope")]
    benchmark_hook("toy_hooks", "check_user")(_cfg().env.user)
    assert toy_benchmark[-1] == ("check_user", "scripted")


def test_the_tau_benchmarks_hooks_are_registered_by_path():
    from rollout.benchmarks.user_api import check_user_simulator

    assert benchmark_hook("tau2", "check_user") is check_user_simulator
    assert benchmark_hook("tau_bench", "check_user") is check_user_simulator  # tau-bench's llm user: the same kind of endpoint
    assert benchmark_hook("tau_bench", "check_config") is None
    with pytest.raises(ConfigError, match=r"^env\.domain: 'atlantis' is not a tau2 domain; tau2's registry offers: .*retail"):
        benchmark_hook("tau2", "check_config")(_cfg("env.domain=atlantis").env)
    with pytest.raises(ValueError, match="no benchmark hook 'check_everything'"):
        benchmark_hook("tau2", "check_everything")


def test_the_startup_timeline_records_phases_from_open_pool_s_call():
    tl = wiring.StartupTimeline()
    tl.begin("serial")
    with tl.phase("checks"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError):
        with tl.phase("local_stack"):  # a phase that fails is recorded too
            raise RuntimeError("no")
    assert tl.actors_ready_s is None and tl.as_dict()["process_start_to_ready_s"] is None
    tl.ready()
    data = tl.as_dict()
    # the keys python -m rollout.bench startup reads, in the order it wrote them before
    assert list(data) == ["mode", "process_age_at_open_pool_s", "phases", "actors_ready_s", "process_start_to_ready_s"]
    assert data["mode"] == "serial" and list(data["phases"]) == ["checks", "local_stack"]
    start, end = data["phases"]["checks"]
    assert start >= 0 and end - start >= 0.015
    assert data["actors_ready_s"] >= end
    assert data["process_start_to_ready_s"] == pytest.approx(data["process_age_at_open_pool_s"] + data["actors_ready_s"], abs=1e-3)
    tl.begin("overlapped")  # a second start-up drops the first one's record
    assert (tl.mode, tl.phases, tl.actors_ready_s) == ("overlapped", {}, None)


def test_open_pool_refuses_an_unknown_order_before_anything_starts(tmp_path):
    cfg = _cfg(f"rollout.output_dir={tmp_path}")
    with pytest.raises(ValueError, match="startup='sideways': one of overlapped, serial"):
        with wiring.open_pool(cfg, startup="sideways"):
            pytest.fail("open_pool yielded")
    assert not hasattr(wiring, "LAST_STARTUP") and not hasattr(wiring, "STARTUP")
