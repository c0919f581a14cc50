"""The LLM user simulator when its model server dies: the server is a process of its own (``python -m
rollout.devtools.chaos user-sim PORT``, an OpenAI-compatible endpoint), SIGKILLed between two of the
user's turns. Started again on the same port within the retries' back-off, the user's next turn
goes through (connection refused is transient: retried); left dead, the turn fails with the typed
``UserSimulatorError`` after its retries (the episode then ends ``user_error``)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.waits import until

from rollout.benchmarks.tau2.user import LLMUser, UserSimulatorError
from rollout.core.config import UserConfig

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int):
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout.devtools.chaos", "user-sim", str(self.port)], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=1).read()
                return
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "the user simulator's server did not start"
                time.sleep(0.1)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def server():
    s = Server(_free_port())
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def task():
    from rollout.benchmarks.tau2.environment import _domain_module

    return _domain_module("retail").get_tasks(None)[0]


def _cfg(port: int, **kw) -> UserConfig:
    return UserConfig(**{"kind": "llm", "base_url": f"http://127.0.0.1:{port}/v1", "model": "sim", "timeout_s": 5.0, "max_retries": 5,
                         "retry_backoff_s": 0.5, "max_retry_wait_s": 5.0, **kw})


async def test_a_server_that_dies_and_comes_back_is_waited_for_through_the_retries(server, task):
    user = LLMUser(task, _cfg(server.port))
    await user.start()
    server.kill()
    turn = asyncio.ensure_future(user.respond("Could you give me your order id, please?"))
    await until(lambda: user.retries >= 1 or turn.done(), "the turn to meet the dead server")
    assert not turn.done() and user.retries >= 1  # refused, and waiting to try again
    await asyncio.get_running_loop().run_in_executor(None, server.start)
    reply = await asyncio.wait_for(turn, 120)
    assert reply.text  # it waited for the server, through connection-refused retries


async def test_a_server_that_stays_dead_ends_the_turn_with_a_typed_error(server, task):
    user = LLMUser(task, _cfg(server.port, max_retries=2, retry_backoff_s=0.1))
    await user.start()
    server.kill()
    with pytest.raises(UserSimulatorError, match="after 3 attempts") as e:
        await user.respond("Could you give me your order id, please?")
    assert "onnect" in str(e.value)  # a connection error, said so
