"""Shared fixtures: tokenizer, tau2 domains, local stacks behind the real sglang-router, Ray; and
the session's own infrastructure: one Ray head, skips governed, files scheduled longest first.

The tests sit in folders by tier: ``unit/`` (pure: no server, no Ray, no subprocess of the
project), ``component/`` (against real local servers: aiohttp, the real sglang-router, real tau2
data, child processes), ``ray/`` (the session's shared Ray head, or one of their own), ``e2e/``
(the CLI, the examples and the benches as a user runs them). Helpers they share are in
``support/`` (imported as ``support.<module>``: this folder is on ``sys.path``). Servers bind to
127.0.0.1 and are stopped by the fixtures that start them.

What one session shares, across its xdist workers (docs/testing.md, "Shared fixtures"):

* ``shared_ray``: one Ray head for the whole session (``support.shared_ray``), started on first use
  under a file lock in the session's folder (``support.session``, made here in the controller's
  ``pytest_configure`` before the workers start), stopped by the controller at the end
  (``pytest_unconfigure``). ``ray_cluster`` connects the test process to it; CLI jobs and drivers
  join it with ``pool.ray_address`` (``support.cli.run_cli(..., ray=shared_ray)``).
* ``local_stacks``: local stacks by kind, one per worker (``support.stacks``); ``retail_stack`` and
  ``airline_stack`` are two of them, and ``run_cli(..., stack=local_stacks)`` points a CLI run at
  the one of its kind (``local.enabled=false policy.router_url=...``).
* The session's last lines (controller): ``peak load (1 min)`` when ``.ci/run`` samples it
  (``TAU_ROLLOUT_LOAD_LOG``), ``retries: N`` (``support.retries``) and ``unexpected skips: N``
  (``support.skips``), each named; under ``TAU_ROLLOUT_CI=1`` an unexpected skip fails the session.
* ``--dist loadfile`` starts the longest files first (``tests/durations.json``, ``support.durations``).
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
    """The session's folder (``support.session``: the shared Ray head's lock and address) and its
    retry log (``support.retries``), made once by the controller before xdist starts the workers,
    which inherit both through their environment."""
    from support import session
    from support.retries import ENV

    if hasattr(config, "workerinput"):
        return
    session.begin()
    if not os.environ.get(ENV):
        os.environ[ENV] = str(session.folder() / "retries.jsonl")


def pytest_unconfigure(config):
    """The controller stops the shared Ray head if the session started one (its workers may end
    before the other is done with it), then removes the session's folder."""
    from support import session, shared_ray

    if hasattr(config, "workerinput") or not session.owns():
        return
    shared_ray.stop()
    session.end()


def _peak_load() -> str | None:
    """``.ci/run``'s samples of the 1-minute load average (``TAU_ROLLOUT_LOAD_LOG``, one a line): the peak."""
    path = os.environ.get("TAU_ROLLOUT_LOAD_LOG")
    if not path or not os.path.isfile(path):
        return None
    samples = [float(x) for x in open(path).read().split() if x.replace(".", "", 1).isdigit()]
    return f"peak load (1 min): {max(samples):.2f} ({len(samples)} samples)" if samples else None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """The controller's last lines, after pytest's own summary: the peak load ``.ci/run`` saw,
    ``retries: N`` and ``unexpected skips: N``, each retry and skip on a line of its own; under
    ``TAU_ROLLOUT_CI=1`` an unexpected skip fails the session."""
    result = yield
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if hasattr(config, "workerinput") or reporter is None:
        return result
    from support import skips
    from support.retries import ENV, read

    load = _peak_load()
    if load:
        reporter.write_line(load)
    retries = read(os.environ.get(ENV, ""))
    reporter.write_line(f"retries: {len(retries)}")
    for r in retries:
        reporter.write_line(f"  retry: {r['test']}: {r['what']}: {r['reason']}")
    unexpected = skips.unexpected(reporter.stats.get("skipped", []))
    reporter.write_line(f"unexpected skips: {len(unexpected)}")
    for nodeid, reason in unexpected:
        reporter.write_line(f"  skip: {nodeid}: {reason}")
    if unexpected and skips.under_ci() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


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
    """A local stack of a test's own (started; the caller stops it), for tests that change its state."""
    from rollout.core.config import LocalConfig
    from rollout.devtools.local.stack import LocalStack

    cfg = LocalConfig(enabled=True, backend=backend, **kw)
    stack = LocalStack(cfg, domain, "builtin:qwen3", log_dir=tmp_path_factory.mktemp(f"stack-{backend}-{domain}"))
    stack.start()
    return stack


@pytest.fixture(scope="session")
def local_stacks(tmp_path_factory):
    """This test process's shared local stacks, one per kind, each started on first use
    (``support.stacks.LocalStacks``: ``.get(backend, domain, ...)``, ``.for_config(cfg)``;
    ``support.cli.run_cli(..., stack=local_stacks)``). Tests that change a stack's state start
    their own."""
    from support.stacks import LocalStacks

    stacks = LocalStacks(tmp_path_factory.mktemp("stacks"))
    yield stacks
    stacks.close()


@pytest.fixture(scope="session")
def retail_stack(local_stacks):
    """Gold-replay server for retail behind the real sglang-router (the shared one)."""
    return local_stacks.get("gold_replay", "retail", pin=True)


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    """Two gold-replay servers for retail behind the real sglang-router, for one test module (its
    tests arm proxies in front of them and put their weight versions back: the half-done update
    and straggler tests)."""
    stack = _stack("gold_replay", "retail", tmp_path_factory, num_servers=2)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def airline_stack(local_stacks):
    """Gold-replay server for airline behind the real sglang-router (the shared one)."""
    return local_stacks.get("gold_replay", "airline", pin=True)


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
    same worker (one vLLM stack per run: ``support.vllm_stack.vllm_scope``), and that the work
    units start longest first (``support.durations``: ``tests/durations.json``), so that no long
    file starts last and runs alone at the end. (xdist's own order is by number of tests, which
    sends the long files of one to three end-to-end tests last.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from support import durations
    from support.vllm_stack import vllm_scope
    from xdist.scheduler import LoadScopeScheduling

    class _Scheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return vllm_scope(nodeid) or nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node):
            # the work queue is complete when the first unit is handed out (LoadScopeScheduling.schedule)
            if not self._ordered:
                self._ordered = True
                for scope in durations.longest_first(self.workqueue, durations.load()):
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return _Scheduling(config, log)


@pytest.fixture(scope="session")
def shared_ray():
    """The session's one Ray head (``support.shared_ray.SharedRay``: ``.address``,
    ``.override()`` = ``pool.ray_address=ADDRESS``), started on first use by whichever process of
    the session asks first, stopped by the controller at the end."""
    from support import shared_ray as head

    return head.address()


@pytest.fixture(scope="session")
def ray_cluster(shared_ray):
    """This test process connected to the session's shared Ray head (its in-process pools start
    their actors there). A Ray that an earlier test left connected in this process (an in-process
    ``open_pool`` without an address starts a local cluster of its own) is shut down first."""
    import ray

    if ray.is_initialized() and ray.get_runtime_context().gcs_address.rsplit(":", 1)[1] != shared_ray.address.rsplit(":", 1)[1]:
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(address=shared_ray.address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()  # disconnects this driver; the head runs on for the session
