"""API keys on the local stack, fate sharing of its subprocesses, and its chaos helpers.

The stack runs the real ``sglang-router`` in front of the local servers; the key comes from an
environment variable and must never reach argv, a log file or a log record.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollout.devtools.local.server import auth_status
from rollout.devtools.local.stack import _http, _redact

KEY_VAR = "ROLLOUT_TEST_LOCAL_API_KEY"
GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}


# --------------------------------------------------------------------------- pure helpers
def test_auth_status_follows_sglang():
    key, admin = "k1", "k2"
    ok = None
    assert auth_status("POST", "/generate", "Bearer k1", None, key, None) is ok
    assert auth_status("POST", "/generate", "bearer k1", None, key, None) is ok  # scheme is case-insensitive
    assert auth_status("POST", "/generate", None, "k1", key, None) is ok  # x-api-key
    assert auth_status("POST", "/generate", None, None, key, None) == 401
    assert auth_status("POST", "/generate", "Bearer nope", None, key, None) == 401
    assert auth_status("GET", "/health", None, None, key, admin) is ok
    assert auth_status("GET", "/health_generate", None, None, key, admin) is ok
    assert auth_status("OPTIONS", "/generate", None, None, key, admin) is ok
    # admin endpoints: the admin key when set (the API key is not enough), else the API key
    assert auth_status("POST", "/pause_generation", "Bearer k1", None, key, admin) == 401
    assert auth_status("POST", "/pause_generation", "Bearer k2", None, key, admin) is ok
    assert auth_status("POST", "/update_weights_from_disk", "Bearer k1", None, key, None) is ok
    # only an admin key: normal endpoints are open
    assert auth_status("POST", "/generate", None, None, None, admin) is ok
    assert auth_status("POST", "/abort_request", None, None, None, admin) == 401
    assert auth_status("POST", "/generate", None, None, None, None) is ok


def test_redact_hides_keys_in_command_lines():
    cmd = ["router", "--api-key", "s3cret", "--admin-api-key=s3cret2", "--x", "pre-s3cret-post"]
    shown = _redact(cmd, ["s3cret"])
    assert "s3cret" not in shown
    assert shown == "router --api-key *** --admin-api-key=*** --x pre-***-post"


# --------------------------------------------------------------------------- a stack requiring a key
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def key():
    return "sk-test-" + secrets.token_hex(16)


@pytest.fixture(scope="module")
def records():
    handler = _Records()
    root = logging.getLogger()
    rollout_logger = logging.getLogger("rollout")
    old_level = rollout_logger.level
    rollout_logger.setLevel(logging.DEBUG)  # the stack logs its command lines at DEBUG
    root.addHandler(handler)
    yield handler.records
    root.removeHandler(handler)
    rollout_logger.setLevel(old_level)


@pytest.fixture(scope="module")
def auth_stack(key, records, tmp_path_factory):
    from rollout.core.config import LocalConfig
    from rollout.devtools.local.stack import LocalStack

    old = os.environ.get(KEY_VAR)
    os.environ[KEY_VAR] = key
    stack = LocalStack(LocalConfig(num_servers=1, startup_timeout_s=90), "retail", "builtin:qwen3",
                       log_dir=tmp_path_factory.mktemp("auth-stack"), api_key_env=KEY_VAR)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        if old is None:
            os.environ.pop(KEY_VAR, None)
        else:
            os.environ[KEY_VAR] = old


@pytest.mark.slow
def test_generate_through_router_needs_the_key(auth_stack, key):
    assert auth_stack.requires_api_key
    status, body = _http("POST", auth_stack.router_url + "/generate", GEN, timeout=30, api_key=key)
    assert status == 200, body
    assert len(json.loads(body)["output_ids"]) >= 1
    for bad in (None, "wrong-key"):
        status, _ = _http("POST", auth_stack.router_url + "/generate", GEN, timeout=30, api_key=bad)
        assert status == 401
        status, _ = _http("GET", auth_stack.router_url + "/workers", timeout=10, api_key=bad)
        assert status == 401


@pytest.mark.slow
def test_servers_refuse_requests_without_the_key(auth_stack, key):
    [worker] = auth_stack.worker_urls
    status, body = _http("POST", worker + "/generate", GEN, timeout=30)
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    status, _ = _http("POST", worker + "/pause_generation", {"mode": "abort"}, timeout=10)
    assert status == 401
    status, _ = _http("GET", worker + "/model_info", timeout=10)
    assert status == 401
    assert _http("GET", worker + "/health", timeout=10)[0] == 200  # health checks stay open
    status, body = _http("GET", worker + "/model_info", timeout=10, api_key=key)
    assert status == 200 and json.loads(body)["model_path"]
    # the router proxies /get_model_info with the client's header
    assert _http("GET", auth_stack.router_url + "/get_model_info", timeout=10)[0] == 401
    assert _http("GET", auth_stack.router_url + "/get_model_info", timeout=10, api_key=key)[0] == 200


@pytest.mark.slow
def test_preflight_router_check_sends_the_key(auth_stack, key):
    from rollout.app.preflight import PreflightError, check_router, check_tokenizer

    info = check_router(auth_stack.router_url, key)
    check_tokenizer(info, "builtin:qwen3")
    with pytest.raises(PreflightError, match="HTTP 401") as e:
        check_router(auth_stack.router_url, None)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_key_is_in_no_argv(auth_stack, key):
    pids = auth_stack.pids()
    assert len(pids) >= 3  # server, router wrapper, router
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if Path(f"/proc/{pid}/cmdline").exists() else b""
        assert key.encode() not in cmdline


@pytest.mark.slow
def test_restart_router_keeps_port_and_workers(auth_stack, key):
    url = auth_stack.router_url
    t0 = time.monotonic()
    auth_stack.restart_router(down_s=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert auth_stack.router_url == url
    status, body = _http("POST", url + "/generate", GEN, timeout=30, api_key=key)
    assert status == 200, body
    assert _http("POST", url + "/generate", GEN, timeout=30)[0] == 401


@pytest.mark.slow
def test_key_appears_in_no_log_file_or_record(auth_stack, key, records):
    files = [p for p in Path(auth_stack.log_dir).rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"server-0.log", "router.log"}
    for p in files:
        assert key.encode() not in p.read_bytes(), p
    assert any("--api-key-env" in r.getMessage() for r in records)  # the command lines were logged
    for r in records:
        assert key not in r.getMessage()
        assert key not in repr(r.args)


@pytest.mark.slow
def test_kill_server_sigkills_it(auth_stack):
    pid = auth_stack.kill_server(0)
    assert not _alive(pid)
    assert pid in auth_stack.pids()


# --------------------------------------------------------------------------- fate sharing
def _alive(pid: int) -> bool:
    """Running (a zombie, which no one may reap here, counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


_STARTER = r"""
import json, sys, threading, time
from rollout.core.config import LocalConfig
from rollout.devtools.local.stack import LocalStack

stack = LocalStack(LocalConfig(num_servers=1, startup_timeout_s=90), "retail", "builtin:qwen3", log_dir=sys.argv[1])
if sys.argv[2] == "thread":  # started from a thread that ends at once: no PDEATHSIG, the watchdogs
    t = threading.Thread(target=stack.start)
    t.start()
    t.join()
    time.sleep(1.5)  # the children outlive that thread
else:
    stack.start()
print(json.dumps(stack.pids()), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("starter", ["main", "thread"])
def test_stack_dies_with_the_process_that_started_it(tmp_path, starter):
    proc = subprocess.Popen([sys.executable, "-c", _STARTER, str(tmp_path), starter],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line, f"the starter printed nothing (exit code {proc.poll()})"
        pids = json.loads(line)
        assert len(pids) >= 3 and all(_alive(p) for p in pids)  # server, router wrapper, router
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 30.0  # about a second; a hang guard
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], f"still alive 30 s after the SIGKILL: {pids}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# --------------------------------------------------------------------------- requests from other sites
def _raw(url: str, path: str, headers: dict, body: bytes = b"") -> tuple[int, bytes]:
    """A POST with exactly ``headers`` (what a browser's cross-site form or fetch() sends)."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.slow
def test_a_server_without_a_key_refuses_admin_posts_from_other_sites(retail_stack):
    """A ``text/plain`` POST needs no CORS pre-flight: any page the user visits could send one to
    the admin routes of a server with no key. With a foreign ``Origin`` it is refused (403) and
    nothing changes; without one (the router, the pool, curl) or from the server's own origin it
    is served."""
    [worker] = retail_stack.worker_urls
    host = worker.removeprefix("http://")

    def state() -> tuple[str, object]:
        version = json.loads(_http("GET", worker + "/get_weight_version", timeout=10)[1])["weight_version"]
        return version, json.loads(_http("GET", worker + "/get_server_info", timeout=10)[1])["pause_mode"]

    before = state()
    assert before[1] is None
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    for path, body in (("/update_weights_from_disk", {"model_path": "/tmp/evil", "weight_version": "evil"}),
                       ("/pause_generation", {"mode": "abort"}), ("/flush_cache", {})):
        status, answer = _raw(worker, path, evil, json.dumps(body).encode())
        assert status == 403 and b"another site" in answer, (path, status, answer)
    status, _ = _raw(worker, "/pause_generation", {"Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
                     b'{"mode": "abort"}')
    assert status == 403
    assert state() == before

    status, answer = _raw(worker, "/pause_generation", {"Content-Type": "text/plain"}, b'{"mode": "abort"}')
    assert status == 200, answer
    assert state()[1] == "abort"
    status, answer = _raw(worker, "/continue_generation", {"Content-Type": "application/json", "Origin": f"http://{host}"}, b"{}")
    assert status == 200, answer
    assert state() == before


def test_the_chaos_stand_ins_refuse_requests_from_other_sites():
    """The chaos tools' user-simulator stand-in and the engine check's recording proxy run the
    same guard as the local server."""
    import asyncio

    from rollout.devtools.chaos.servers import FakeUserLLM
    from rollout.devtools.check_engine import RecordingProxy

    chat = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "ping"}]}).encode()
    sim = FakeUserLLM()
    sim.start()
    try:
        status, _ = _raw(sim.url, "/v1/chat/completions", {"Origin": "http://evil.example", "Content-Type": "text/plain"}, chat)
        assert status == 403
        status, answer = _raw(sim.url, "/v1/chat/completions", {"Content-Type": "application/json"}, chat)
        assert status == 200 and json.loads(answer)["choices"], answer
    finally:
        sim.stop()

    async def proxied() -> int:
        async with RecordingProxy("http://127.0.0.1:9") as proxy:  # the upstream is never reached
            return (await asyncio.to_thread(_raw, proxy.url, "/pause_generation", {"Origin": "http://evil.example"}, b"{}"))[0]

    assert asyncio.run(proxied()) == 403
