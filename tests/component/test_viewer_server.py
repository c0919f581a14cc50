"""The viewer's server without a browser: ``python -m rollout view`` as its own process over run
folders holding what a run never writes (a FIFO, a link to ``/dev/zero``, a line with an integer
beyond 64 bits), requests from other sites (a foreign ``Host``: DNS rebinding; a foreign
``Origin``), and the token view of a run whose tokenizer is a model-hub id (nothing fetched).

The viewer process runs on 127.0.0.1 (``--port 0``) under a 2 GiB address-space limit, so a viewer
that reads ``/dev/zero`` whole fails with MemoryError rather than filling the machine; each test
stops it with SIGTERM (by pid) and checks it exits 0.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rollout.core.config import load_config
from rollout.core.journal import RunJournal
from rollout.core.pool import make_specs
from rollout.core.records import EpisodeStatus, InteractionResult
from rollout.core.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_LIMIT = 2 * 1024**3


def _sample(spec):
    traj = Trajectory(prompt_ids=[11, 12, 13])
    traj.append_generated([21, 22], [-0.25, -0.5], "0")
    meta = {"turns": 1, "termination_reason": "user_stop", "timings": {"total_s": 1.0}}
    return InteractionResult(spec, EpisodeStatus.COMPLETED, 1.0, traj, [{"role": "user", "content": "hi"}], meta).to_sample()


def _journaled_run(out: Path, n: int, tokenizer: str = "builtin:qwen3") -> list[str]:
    """A run folder written by the real journal with ``n`` episodes; their ids."""
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={out}", f"policy.tokenizer={tokenizer}"])
    journal = RunJournal.open(out, cfg)
    (out / "config.yaml").write_text(cfg.to_yaml())
    specs = make_specs("retail", ["0"], n)
    journal.record_specs(specs)
    for s in specs:
        journal.record(_sample(s))
    journal.close("completed")
    return [s.episode_id for s in specs]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


@contextlib.contextmanager
def viewer(log: Path, folder: Path):
    """``python -m rollout view FOLDER --port 0``; yields ``(host, port, process)``; stops it with
    SIGTERM and checks it exited 0 (SIGKILL after 60 s, and the test fails)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rollout", "view", str(folder), "--port", "0"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=_limit_memory)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            line = proc.stdout.readline() if ready else ""
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            assert found, f"no URL from the viewer: {line!r}; log: {log.read_text()[-2000:]}"
            yield "127.0.0.1", int(found.group(1)), proc
        finally:
            stopped = True
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    stopped = False
                    proc.kill()
                    proc.wait()
    assert stopped, f"SIGTERM did not stop the viewer; log: {log.read_text()[-2000:]}"
    assert proc.returncode == 0, f"the viewer did not stop cleanly ({proc.returncode}): {log.read_text()[-2000:]}"


def _request(port: int, path: str, headers: dict | None = None, method: str = "GET", body: bytes | None = None) -> tuple[int, dict]:
    """One request to 127.0.0.1:``port`` with exactly ``headers`` (``Host`` too, when given); a
    viewer that does not answer within 60 s fails the test."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    return resp.status, (json.loads(data) if data.startswith((b"{", b"[")) else {"text": data[:200].decode("utf-8", "replace")})


@pytest.mark.slow
def test_a_fifo_and_a_link_to_dev_zero_never_stall_the_viewer_and_sigterm_stops_it(tmp_path):
    """``run.json`` a FIFO (nobody writes it), ``summary.json`` and ``config.yaml`` links to
    ``/dev/zero``, ``eval.json`` a FIFO: every API call answers, none of them is read, and SIGTERM
    stops the viewer."""
    out = tmp_path / "run"
    [eid] = _journaled_run(out, 1)
    for name in ("run.json", "summary.json", "config.yaml"):
        (out / name).unlink(missing_ok=True)
    os.mkfifo(out / "run.json")
    os.mkfifo(out / "eval.json")
    os.symlink("/dev/zero", out / "summary.json")
    os.symlink("/dev/zero", out / "config.yaml")
    with viewer(tmp_path / "viewer.log", out) as (_, port, proc):
        status, state = _request(port, "/api/state")
        assert status == 200 and (state["status"], state["episodes"], state["has_summary"]) == ("unknown", 1, False), state
        status, summary = _request(port, "/api/summary")
        assert status == 200 and (summary["file"], summary["eval"], summary["run"]) == (None, None, None), summary
        assert summary["live"]["episodes"] == 1
        status, tokens = _request(port, f"/api/tokens?id={eid}")
        assert status == 200 and tokens["parts"][0]["ids"] == [11, 12, 13, 21, 22] and tokens["parts"][0]["text"] is None, tokens
        assert "names no policy.tokenizer" in tokens["tokenizer_error"]  # config.yaml not read
        assert _request(port, "/api/episodes")[1]["rows"][0]["episode_id"] == eid
        assert proc.poll() is None
    log = (tmp_path / "viewer.log").read_text()
    assert "run.json: not read (only regular files are)" in log and "summary.json: not read" in log, log[-2000:]


@pytest.fixture(scope="module")
def big_int_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """Three journaled episodes, the second's ``metadata.turns`` 100000000000000000000."""
    out = tmp_path_factory.mktemp("viewer-server") / "run"
    ids = _journaled_run(out, 3)
    lines = (out / "episodes.jsonl").read_text().splitlines()
    line = json.loads(lines[1])
    line["metadata"]["turns"] = 10**20
    lines[1] = json.dumps(line)
    (out / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    return out, ids


@pytest.mark.slow
def test_a_line_with_an_integer_beyond_64_bits_leaves_the_table_served(big_int_run, tmp_path):
    out, ids = big_int_run
    with viewer(tmp_path / "viewer.log", out) as (_, port, _proc):
        for _ in range(2):  # not once: every poll of the page
            status, got = _request(port, "/api/episodes?since=0")
            assert status == 200, got
            assert [r["episode_id"] for r in got["rows"]] == [ids[0], ids[2]]
        status, state = _request(port, "/api/state")
        assert status == 200 and state["skipped_lines"] == 1 and state["episodes"] == 2


@pytest.mark.slow
def test_the_viewer_answers_only_its_own_host_and_refuses_other_sites(big_int_run, tmp_path):
    """DNS rebinding (``Host: evil.example``) is answered 421; a request a page of another site
    sends (its ``Origin``, or ``Sec-Fetch-Site: cross-site``) 403; the viewer's own names, its
    page's own requests and clients without those headers are served."""
    out, _ = big_int_run
    with viewer(tmp_path / "viewer.log", out) as (_, port, _proc):
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost:9000"):  # the last: an SSH tunnel's port
            status, got = _request(port, "/api/state", {"Host": host})
            assert status == 200 and got["episodes"] == 2, (host, got)
        assert _request(port, "/", {"Host": f"localhost:{port}"})[0] == 200  # the page
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"10.1.2.3:{port}"):
            for path in ("/api/state", "/api/episodes", "/"):
                status, got = _request(port, path, {"Host": host})
                assert status == 421 and "not this server's address" in got["error"], (host, path, status, got)
        same = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        assert _request(port, "/api/state", same)[0] == 200
        for origin in ("http://evil.example", f"http://localhost:{port + 1}", "null", f"https://127.0.0.1:{port}"):
            status, got = _request(port, "/api/state", {"Host": f"127.0.0.1:{port}", "Origin": origin})
            assert status == 403 and "another site" in got["error"], (origin, got)
        status, _ = _request(port, "/api/state", {"Host": f"127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"})
        assert status == 403
        link = {"Host": f"127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        assert _request(port, "/", link)[0] == 200  # a link to the viewer from another page opens it


class _Trap:
    """A TCP listener on 127.0.0.1 that counts the connections made to it (a model hub's stand-in:
    ``HF_ENDPOINT`` points here, so any attempt to reach the hub, from this process or a child,
    lands here)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture
def hub_trap(monkeypatch, tmp_path):
    """The hub stand-in, and an empty hub cache of the test's own; offline mode off, so that only
    the viewer's own behaviour keeps it from the network."""
    import huggingface_hub.constants as hub

    trap = _Trap()
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_ENDPOINT", trap.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub, "ENDPOINT", trap.url)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    yield trap, cache
    trap.sock.close()


async def _tokens(out: Path, eid: str) -> dict:
    from aiohttp.test_utils import TestClient, TestServer

    from rollout.app.viewer import RunIndex, Viewer, make_app

    async with TestClient(TestServer(make_app(Viewer(RunIndex(out))), host="127.0.0.1")) as client:
        resp = await client.get("/api/tokens", params={"id": eid})
        assert resp.status == 200
        return await resp.json()


async def test_the_token_view_of_a_hub_tokenizer_reaches_no_hub(hub_trap, tmp_path, tokenizer):
    """``policy.tokenizer: some-org/some-model``, in no folder here and not in the hub cache: the
    token view shows the ids and says why, and no connection to the hub is attempted. A hub id in
    the local hub cache is decoded from there, again without a connection."""
    from rollout.core.tokenizer import builtin_qwen3_path

    trap, cache = hub_trap
    out = tmp_path / "run"
    [eid] = _journaled_run(out, 1, tokenizer="some-org/some-model")
    got = await _tokens(out, eid)
    [part] = got["parts"]
    assert got["tokenizer"] == "some-org/some-model" and part["ids"] == [11, 12, 13, 21, 22] and part["text"] is None
    assert "not on this machine" in got["tokenizer_error"] and "fetches nothing" in got["tokenizer_error"]
    assert trap.connections == 0

    snapshot = cache / "models--some-org--cached-model" / "snapshots" / ("0" * 40)
    shutil.copytree(builtin_qwen3_path(), snapshot)
    (cache / "models--some-org--cached-model" / "refs").mkdir()
    (cache / "models--some-org--cached-model" / "refs" / "main").write_text("0" * 40)
    cached = tmp_path / "cached"
    [eid] = _journaled_run(cached, 1, tokenizer="some-org/cached-model")
    got = await _tokens(cached, eid)
    assert got["tokenizer_error"] is None and got["parts"][0]["text"] == [tokenizer.decode([i]) for i in (11, 12, 13, 21, 22)]
    assert trap.connections == 0
