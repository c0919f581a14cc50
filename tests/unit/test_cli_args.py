"""The commands' shared argument type and one-line error reporting (rollout/app/args.py): what
``view --port`` and ``regrade --workers`` accept, and the ``config error:`` / ``error:`` lines of
``run --replay`` and ``regrade`` (exit 2), a bug still raising."""

from __future__ import annotations

import argparse

import pytest

from rollout.app.args import int_arg, one_line_errors
from rollout.core.config import ConfigError


def test_int_arg_takes_integers_in_bounds_and_names_what_it_wanted():
    assert int_arg("0", "a port number", 0, 65535) == 0 and int_arg("65535", "a port number", 0, 65535) == 65535
    assert int_arg("40", "an integer", 1) == 40
    with pytest.raises(argparse.ArgumentTypeError, match="must be 0 to 65535, got 70000"):
        int_arg("70000", "a port number", 0, 65535)
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1, got 0"):
        int_arg("0", "an integer", 1)
    with pytest.raises(argparse.ArgumentTypeError, match="not an integer: '2.5'"):
        int_arg("2.5", "an integer", 1)


class Refused(Exception):
    pass


def _raise(e: Exception):
    def work():
        raise e
    return work


def test_one_line_errors_prints_one_line_per_failure_and_lets_a_bug_through(capsys):
    assert one_line_errors(lambda: {"ok": 1}, (Refused,)) == {"ok": 1}
    assert one_line_errors(_raise(ConfigError("env.domain: unknown")), (Refused,)) is None
    assert one_line_errors(_raise(FileNotFoundError("no config.yaml")), (Refused,)) is None
    assert one_line_errors(_raise(Refused("not a run")), (Refused,)) is None
    assert capsys.readouterr().err.splitlines() == ["config error: env.domain: unknown", "config error: no config.yaml", "error: not a run"]
    with pytest.raises(KeyError):
        one_line_errors(_raise(KeyError("a bug")), (Refused,))
