"""Pipe-safe entry points (rollout.core.pipes.pipe_safe), in this process: a closed reader of
standard output ends the command quietly with 141; any other BrokenPipeError is a bug and
propagates. The commands themselves under ``| head``: tests/e2e/test_cli_pipes.py."""

from __future__ import annotations

import os
import sys

import pytest

from rollout.core.pipes import EXIT_PIPE_CLOSED, pipe_safe

# (sys.stdout is replaced inside each test's body: pytest's capture sets it again between a
# fixture's setup and the test's call)


@pytest.mark.parametrize("size", [10, 1_000_000], ids=["buffered (fails at the flush)", "past the pipe's buffer (fails at the write)"])
def test_a_reader_that_left_ends_the_command_quietly_with_141(monkeypatch, size):
    r, w = os.pipe()
    os.close(r)  # the reader left
    out = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stdout", out)

    def main() -> int:
        print("x" * size)
        return 0

    assert pipe_safe(main) == EXIT_PIPE_CLOSED == 141
    print("after")  # standard output now goes to os.devnull: the interpreter's flush at exit cannot fail
    sys.stdout.flush()
    out.close()


def test_an_open_reader_gets_the_output_and_the_commands_own_status(monkeypatch):
    r, w = os.pipe()
    out = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stdout", out)
    assert pipe_safe(lambda: print("hello") or 3) == 3
    out.close()
    with os.fdopen(r) as f:
        assert f.read() == "hello\n"


def test_a_broken_pipe_that_is_not_standard_outputs_propagates(monkeypatch):
    r, w = os.pipe()
    out = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stdout", out)

    def main() -> int:
        raise BrokenPipeError(32, "a child's pipe")

    with pytest.raises(BrokenPipeError, match="a child's pipe"):
        pipe_safe(main)
    out.close()
    os.close(r)
