"""Shared fixtures: tokenizer, tau2 domains, local stacks behind the real sglang-router, Ray.

The tests sit in folders by tier: ``unit/`` (pure: no server, no Ray, no subprocess of the
project), ``component/`` (against real local servers: aiohttp, the real sglang-router, real tau2
data, child processes), ``ray/`` (a Ray cluster shared by the tier's tests, or one of their own),
``e2e/`` (the CLI, the examples and the benches as a user runs them). Helpers they share are in
``support/`` (imported as ``support.<module>``: this folder is on ``sys.path``). Servers bind to
127.0.0.1 and are stopped by the fixtures that start them.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray starts its workers (the rollout actors among them) at niceness 15 by default; the suite's
# other processes (the vLLM CPU servers above all) run at 0, and the kernel weighs 15 against 0 as
# 36 to 1024: under CI's load (40-66 on 2 cores) a CI run's straggler test waited 601 s for
# episodes that take 3 s alone. Measured here with 6 busy processes at 0: the straggler test's
# actor at 15 was not even ready after 280 s; at 0 the test passed in 13 s. Every Ray the tests
# start (in-process or through the CLI) inherits this: the actors run at everything else's priority.
os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_configure(config):
    """One retry log per session, shared by the xdist workers (they inherit the environment of the
    process that starts them): ``support.retries``."""
    from support.retries import ENV

    if not hasattr(config, "workerinput") and not os.environ.get(ENV):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="tau-rollout-retries-", suffix=".jsonl")
        os.close(fd)
        os.environ[ENV] = path
        config._retry_log = path


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """``retries: N`` and one line per retry, as the session's last lines (the controller only)."""
    from support.retries import ENV, read

    if hasattr(config, "workerinput"):
        return
    retries = read(os.environ.get(ENV, ""))
    terminalreporter.write_line(f"retries: {len(retries)}")
    for r in retries:
        terminalreporter.write_line(f"  retry: {r['test']}: {r['what']}: {r['reason']}")


@pytest.fixture(scope="session")
def tokenizer():
    from rollout.core.tokenizer import load_tokenizer

    return load_tokenizer("builtin:qwen3")


@pytest.fixture(scope="session")
def retail():
    from rollout.benchmarks.tau2.environment import Tau2Domain

    return Tau2Domain("retail")


@pytest.fixture(scope="session")
def airline():
    from rollout.benchmarks.tau2.environment import Tau2Domain

    return Tau2Domain("airline")


def _stack(backend: str, domain: str, tmp_path_factory, **kw):
    from rollout.core.config import LocalConfig
    from rollout.devtools.local.stack import LocalStack

    cfg = LocalConfig(enabled=True, backend=backend, **kw)
    stack = LocalStack(cfg, domain, "builtin:qwen3", log_dir=tmp_path_factory.mktemp(f"stack-{backend}-{domain}"))
    stack.start()
    return stack


@pytest.fixture(scope="session")
def retail_stack(tmp_path_factory):
    """Gold-replay server for retail behind the real sglang-router."""
    stack = _stack("gold_replay", "retail", tmp_path_factory)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    """Two gold-replay servers for retail behind the real sglang-router, for one test module (its
    tests arm proxies in front of them and put their weight versions back: the half-done update
    and straggler tests)."""
    stack = _stack("gold_replay", "retail", tmp_path_factory, num_servers=2)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def airline_stack(tmp_path_factory):
    stack = _stack("gold_replay", "airline", tmp_path_factory)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def vllm_stack(tmp_path_factory):
    """The session's real vLLM: 2 CPU servers behind vllm-router serving a random-weight Qwen3
    checkpoint (``support.vllm_stack``: what it holds, how tests put it back). Skips when vLLM is
    not installed (fails under ``TAU_ROLLOUT_REQUIRE_VLLM=1``). Tests using it live in files whose
    path contains ``vllm`` (one xdist worker runs them all); their timeouts are ``func_only``, so the
    start (bounded by its own ``startup_timeout_s``) counts against no test."""
    from support.vllm_stack import start_session_stack

    handle = start_session_stack(tmp_path_factory)
    yield handle
    handle.stack.stop()


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except that every test file whose path contains ``vllm`` goes to the
    same worker (one vLLM stack per run: ``support.vllm_stack.vllm_scope``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from support.vllm_stack import vllm_scope
    from xdist.scheduler import LoadScopeScheduling

    class _Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return vllm_scope(nodeid) or nodeid.split("::", 1)[0]

    return _Scheduling(config, log)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster shared by the Ray tests."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()
