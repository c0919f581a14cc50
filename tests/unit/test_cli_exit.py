"""How ``python -m rollout`` ends (:func:`rollout.app.cli.exit_process`): at once, without Ray's
shutdown, only when the Ray head it is connected to is gone. The run that loses its head end to
end: tests/e2e/test_interrupt_resume.py; ``head_lost`` against a live head: tests/ray/test_pool.py."""

from __future__ import annotations

import sys

import pytest

from rollout.app import cli


class _Exited(Exception):
    pass


def _fake_os_exit(code: int):
    raise _Exited(code)


def test_a_process_whose_ray_head_is_gone_ends_at_once_with_its_code(monkeypatch):
    import rollout.core.pool.actors as actors

    monkeypatch.setitem(sys.modules, "ray", sys.modules.get("ray") or __import__("ray"))
    monkeypatch.setattr(actors, "head_lost", lambda: True)
    monkeypatch.setattr(cli.os, "_exit", _fake_os_exit)
    with pytest.raises(_Exited) as e:
        cli.exit_process(4)
    assert e.value.args == (4,)


def test_otherwise_it_exits_the_normal_way(monkeypatch):
    import rollout.core.pool.actors as actors

    monkeypatch.setattr(actors, "head_lost", lambda: False)
    monkeypatch.setattr(cli.os, "_exit", _fake_os_exit)
    with pytest.raises(SystemExit) as e:
        cli.exit_process(3)
    assert e.value.code == 3

