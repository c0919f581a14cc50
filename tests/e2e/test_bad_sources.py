"""Every config key that names a file, a folder, a URL or a module: a bad value is one line naming
the key and what to do, exit 2, before anything is started (no local stack, no Ray), through the
CLI (``rollout.app.cli.main``, in this process) and, where the trainer API starts things itself,
through ``open_pool`` and ``RolloutPool.start``. So is a task the domain lacks and a chat format
that does not fit the tokenizer (``run``, ``eval`` and ``open_pool``).

The hub-id case needs no network: this machine has none, and the check probes the hub's host
with a short timeout instead of letting transformers retry for ~100 s.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
from support.retries import RAY_DID_NOT_START, Attempts

from rollout.app import cli
from rollout.app.preflight import PreflightError
from rollout.core.config import ConfigError, TaskSelectionError, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "local.yaml")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nothing listens there


def _run(tmp_path: Path, capsys, *overrides: str, command: str = "run") -> tuple[int, str, Path]:
    out = tmp_path / "out"
    t0 = time.monotonic()
    rc = cli.main([command, "--config", CONFIG, "--no-progress", "env.task_ids=[0]", f"rollout.output_dir={out}", *overrides])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and " INFO " not in line and " WARNING " not in line]
    assert lines, err
    assert took < 60, f"took {took:.0f}s"
    return rc, lines[-1], out


@pytest.fixture(autouse=True)
def started(monkeypatch) -> list[str]:
    """What the run started: the local stack and the Ray pool record themselves here (their
    ``start`` runs as usual). Also: no ``RAY_ADDRESS`` from the caller's shell."""
    from rollout.core.pool import RolloutPool
    from rollout.devtools.local.stack import LocalStack

    seen: list[str] = []
    for cls, name in ((LocalStack, "local stack"), (RolloutPool, "Ray pool")):
        def record(self, *a, _orig=cls.start, _name=name, **k):
            seen.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(cls, "start", record)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return seen


def _nothing_started(out: Path, started: list[str]) -> None:
    assert started == [], f"started before the check failed: {started}"
    assert not (out / "local_stack_logs").exists(), "the local stack was started"


@pytest.mark.parametrize("value, expect", [
    ("/nonexistent", "the folder /nonexistent does not exist"),
    ("Qwen/Qwen3-8B", "not in the local hub cache and the hub cannot be reached"),
])
def test_policy_tokenizer_that_cannot_be_had(tmp_path, capsys, started, monkeypatch, value, expect):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")  # no hub, also where there is network
    rc, line, out = _run(tmp_path, capsys, f"policy.tokenizer={value}")
    assert rc == 2 and line.startswith(f"error: policy.tokenizer={value}: ") and expect in line, line
    assert "builtin:qwen3" in line and "local folder" in line, line  # what to pass instead
    _nothing_started(out, started)


def test_policy_tokenizer_folder_without_tokenizer_files(tmp_path, capsys, started):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, line, out = _run(tmp_path, capsys, f"policy.tokenizer={empty}")
    assert rc == 2 and "policy.tokenizer" in line and "holds no tokenizer files" in line, line
    _nothing_started(out, started)


def test_policy_tokenizer_through_the_trainer_api():
    """``RolloutPool.start`` (a trainer that builds the pool itself) refuses before Ray starts."""
    import ray

    from rollout.core.pool import RolloutPool

    cfg = load_config(CONFIG, ["policy.tokenizer=/nonexistent", "local.enabled=false", "policy.router_url=http://127.0.0.1:9"])
    was = ray.is_initialized()
    pool = RolloutPool(cfg)
    with pytest.raises(PreflightError, match=r"^policy.tokenizer=/nonexistent: the folder /nonexistent does not exist"):
        pool.start()
    assert ray.is_initialized() == was and pool.actors == []  # neither Ray nor an actor was started


def test_pool_ray_address_where_nothing_listens(tmp_path, capsys, started):
    port = _closed_port()
    rc, line, out = _run(tmp_path, capsys, f"pool.ray_address=127.0.0.1:{port}")  # waits RAY_ADDRESS_WAIT_S for a starting head
    assert rc == 2 and line.startswith(f"error: pool.ray_address=127.0.0.1:{port}: nothing answered there within"), line
    _nothing_started(out, started)
    rc, line, _ = _run(tmp_path, capsys, "pool.ray_address=not-an-address")
    assert rc == 2 and "pool.ray_address=not-an-address: not an address" in line, line


def test_rollout_output_dir_that_cannot_be_written(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = cli.main(["run", "--config", CONFIG, "--no-progress", f"rollout.output_dir={blocker / 'out'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"error: rollout.output_dir '{blocker / 'out'}' is not writable"), err


def test_router_url_where_nothing_listens(tmp_path, capsys, started):
    url = f"http://127.0.0.1:{_closed_port()}"
    rc, line, out = _run(tmp_path, capsys, "local.enabled=false", f"policy.router_url={url}")
    assert rc == 2 and line.startswith(f"error: router {url}: ") and "policy.router_url" in line, line
    _nothing_started(out, started)


def test_a_local_ray_that_does_not_start_is_one_line_and_the_stack_is_stopped(tmp_path, capsys, monkeypatch):
    """Ray gives a new local node's raylet a fixed 30 s and then raises a bare ``Exception``
    (ray/_private/node.py; CI's load once made it happen): here ``ray.init`` raises exactly that,
    everything else is real. The run is one line saying what to do, exit 2, and the local stack
    that started beside Ray (startup overlapped) is stopped again."""
    import ray

    from rollout.devtools.local.stack import LocalStack

    def init(*args, **kwargs):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet failed to "
                        "startup or the GCS has become overloaded.")

    stacks: list[LocalStack] = []
    real_start = LocalStack.start

    def start(self, *a, **k):
        stacks.append(self)
        return real_start(self, *a, **k)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # a process with no Ray yet (another test here may have one)
    monkeypatch.setattr(LocalStack, "start", start)
    rc, line, _ = _run(tmp_path, capsys)
    assert rc == 2 and line.startswith("error: Ray's new local cluster did not start") and "pool.ray_address=auto" in line, line
    assert stacks and all(proc.poll() is not None for s in stacks for _, proc, _, _ in s._procs), "the local stack is still running"


def test_user_base_url_where_nothing_listens(tmp_path, capsys):
    """The user simulator's endpoint is checked by the preflight once the local stack is up (it
    may be the stack's own router); a dead one is one line, and the stack is stopped again."""
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    tries = Attempts(3, "a new local Ray cluster starts within Ray's fixed 30 s (it starts beside the local stack)")
    for n in tries:
        rc, line, _ = _run(tmp_path / str(n), capsys, "env.user.kind=llm", "env.user.model=m", f"env.user.base_url={url}")
        if RAY_DID_NOT_START in line:
            tries.not_met(line)
            continue
        break
    assert rc == 2 and line.startswith("error: user simulator") and url.removesuffix("/v1") in line and "does not answer" in line, line


def test_a_module_the_config_needs_is_missing(tmp_path, capsys, started, monkeypatch):
    """``local.backend=tiny`` needs torch (the tiny extra); masked here as if not installed."""
    monkeypatch.setitem(sys.modules, "torch", None)
    rc, line, out = _run(tmp_path, capsys, "local.backend=tiny")
    assert rc == 2 and line.startswith("error: local.backend=tiny needs torch") and "tau-rollout[tiny]" in line, line
    _nothing_started(out, started)


@pytest.mark.parametrize("command", ["run", "eval"])
@pytest.mark.parametrize("override, expect", [
    ("env.task_ids=[0,99999]", "config error: env.task_ids: 99999 is not a task of tau2 domain retail, whose 114 task ids are 0 to 113"),
    ("env.task_split=nope", "config error: env.task_split: domain retail has no split 'nope' (has ['base', 'test', 'train'])"),
], ids=["task_ids", "task_split"])
def test_tasks_the_domain_lacks(tmp_path, capsys, started, command, override, expect):
    """Refused at the checks before anything starts (it was once the local stack and Ray had
    started, 18.8 s in: issue 28), naming the key and the valid ids."""
    rc, line, out = _run(tmp_path, capsys, override, command=command)
    assert rc == 2 and line == expect, line
    _nothing_started(out, started)


@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_chat_format_that_does_not_fit_the_tokenizer(tmp_path, capsys, started, command):
    """``policy.chat_format=mistral`` with the default tokenizer (builtin:qwen3): one config line
    naming both keys, before anything starts (it was a local server's traceback, exit 1: issue 28)."""
    rc, line, out = _run(tmp_path, capsys, "policy.chat_format=mistral", command=command)
    assert rc == 2 and line.startswith("config error: policy.chat_format=mistral does not fit policy.tokenizer=builtin:qwen3: "), line
    assert "builtin:mistral" in line, line  # what to pass instead
    _nothing_started(out, started)


@pytest.mark.parametrize("override, error, match", [
    ("env.task_ids=[0,99999]", TaskSelectionError, r"^env.task_ids: 99999 is not a task of tau2 domain retail, whose 114 task ids are 0 to 113$"),
    ("policy.chat_format=mistral", ConfigError, r"^policy.chat_format=mistral does not fit policy.tokenizer=builtin:qwen3: "),
], ids=["task_ids", "chat_format"])
def test_tasks_and_chat_format_through_the_trainer_api(tmp_path, started, override, error, match):
    """``open_pool`` (the trainer's way to a running pool) raises the same one-line error before
    anything starts. A pool a trainer started itself refuses unknown task ids at ``submit``:
    tests/ray/test_pool.py."""
    from rollout import open_pool

    cfg = load_config(CONFIG, [override, f"rollout.output_dir={tmp_path / 'out'}"])
    with pytest.raises(error, match=match):
        with open_pool(cfg):
            pytest.fail("open_pool yielded a pool")
    _nothing_started(tmp_path / "out", started)


def test_config_file_that_does_not_exist(tmp_path, capsys):
    rc = cli.main(["run", "--config", str(tmp_path / "nope.yaml")])
    assert rc == 2 and capsys.readouterr().err.strip() == f"config error: config file not found: {tmp_path / 'nope.yaml'}"


def test_a_failed_start_leaves_no_run_behind(tmp_path, capsys):
    """A run refused before it submitted anything leaves nothing to resume: the same command,
    corrected, starts without --overwrite."""
    from rollout.core.journal import holds_run

    rc, _, out = _run(tmp_path, capsys, "policy.tokenizer=/nonexistent")
    assert rc == 2 and (out / "run.json").is_file()  # the journal opened before the check failed
    assert not holds_run(out)
