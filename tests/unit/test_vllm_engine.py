"""local.backend=vllm as the wiring's engine: its checks, made without starting anything."""

from __future__ import annotations

import pytest

from rollout.core.config import ConfigError, load_config
from rollout.core.engines import VLLM_STACK, EngineJob, engine_for, get_engine
from rollout.core.startup import PreflightError
from rollout.devtools.local.vllm.engine import checkpoint_path
from rollout.devtools.local.vllm.processes import VLLM_PYTHON_ENV, find_vllm_python, repo_root, vllm_missing


def _cfg(*overrides: str):
    return load_config(None, ["local.enabled=true", "local.backend=vllm", "policy.engine=vllm", *overrides])


def test_the_engine_is_chosen_by_local_backend_and_makes_its_router_url_first(tmp_path):
    cfg = _cfg("local.vllm.checkpoint_dir=" + str(tmp_path), "local.vllm.seed=7")
    assert engine_for(cfg) == VLLM_STACK
    kind = get_engine(VLLM_STACK)
    engine = kind(cfg.local, EngineJob.of(cfg, tmp_path / "logs"))
    assert engine.router_url.startswith("http://127.0.0.1:") and engine.stack is None  # nothing started
    assert checkpoint_path(cfg.local, "builtin:qwen3") == tmp_path / "qwen3-seed7"
    assert checkpoint_path(_cfg("local.vllm.model=/m/x").local, "builtin:qwen3").as_posix() == "/m/x"
    engine.stop()  # nothing to stop: no error


def test_check_config_needs_a_builtin_vocabulary_or_a_model():
    kind = get_engine(VLLM_STACK)
    kind.check_config(_cfg())
    with pytest.raises(ConfigError, match=r"^policy.tokenizer: local.backend=vllm writes .* local.vllm.model"):
        kind.check_config(_cfg("policy.tokenizer=/some/folder"))
    kind.check_config(_cfg("policy.tokenizer=/some/folder", "local.vllm.model=/some/checkpoint"))


def test_a_missing_vllm_venv_is_one_line_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    missing = str(tmp_path / "nowhere" / "bin" / "python")
    with pytest.raises(PreflightError, match=r"^local.backend=vllm: no vLLM venv: .*nowhere.* launch/install_vllm.sh"):
        get_engine(VLLM_STACK).check_modules(_cfg("local.vllm.python=" + missing))
    fake = tmp_path / "venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text("")
    assert "has no vllm package" in vllm_missing(fake / "python")
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(fake / "python"))
    assert find_vllm_python(missing) == fake / "python"  # the variable wins over the key
    monkeypatch.delenv(VLLM_PYTHON_ENV)
    assert find_vllm_python(None) == repo_root() / ".venv-vllm" / "bin" / "python"


def test_the_local_backend_and_policy_engine_must_agree():
    with pytest.raises(ConfigError, match=r"^policy.engine: must be vllm with local.backend=vllm .* got sglang"):
        load_config(None, ["local.enabled=true", "local.backend=vllm"])
    with pytest.raises(ConfigError, match=r"^policy.engine: must be sglang with local.backend=tiny"):
        load_config(None, ["local.enabled=true", "local.backend=tiny", "policy.engine=vllm"])
    load_config(None, ["policy.router_url=http://127.0.0.1:1", "local.backend=vllm", "policy.engine=sglang"])  # no local stack: no rule


def test_local_vllm_keys_are_checked_at_load():
    with pytest.raises(ConfigError, match="local.vllm.num_gpu_blocks: must be >= 1"):
        _cfg("local.vllm.num_gpu_blocks=0")
    with pytest.raises(ConfigError, match="local.vllm.kv_cache_gib"):
        _cfg("local.vllm.kv_cache_gib=0")
    with pytest.raises(ConfigError, match="local.vllm.router_policy"):
        _cfg("local.vllm.router_policy=cache_awareness")


def test_a_start_up_still_waiting_says_so_every_interval(tmp_path, monkeypatch, caplog):
    """vLLM's CPU start-up is silent for 40-90 s: the wait logs, on a clock of its own here (each
    poll's sleep moves it), that it is still starting, every PROGRESS_EVERY_S from the stack's start."""
    import logging

    from rollout.devtools.local.vllm import processes

    clock = {"now": 1000.0}
    monkeypatch.setattr(processes.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(processes.time, "sleep", lambda s: clock.__setitem__("now", clock["now"] + s))

    class Running:
        pid = 4242

        def poll(self):
            return None

    proc = processes._Supervised(tmp_path / "vllm-0.log", port=1)
    proc.name, proc.proc = "vLLM server http://127.0.0.1:1", Running()
    up_at = 1000.0 + 2.5 * processes.PROGRESS_EVERY_S + 1
    with caplog.at_level(logging.INFO, logger=processes.__name__):
        proc._wait_until(lambda: (clock["now"] >= up_at, "HTTP 503"), deadline=5000.0, timeout_s=4000.0, what="start-up (GET /health)",
                         started=1000.0)
    notes = [r.getMessage() for r in caplog.records]
    step = int(processes.PROGRESS_EVERY_S)
    assert [n.split("still starting (")[1].split(" s)")[0] for n in notes] == [str(step), str(2 * step)], notes
    assert all(n.startswith("vLLM server http://127.0.0.1:1: still starting (") and "HTTP 503" in n and "vllm-0.log" in n for n in notes)
