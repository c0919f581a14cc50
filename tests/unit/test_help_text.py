"""Every command's ``--help`` reads as plain text: the descriptions come from docstrings, whose
reStructuredText (````x````, ``:mod:`x```) ``rollout --help`` showed as it is
(:func:`rollout.app.args.plain_text`). Each command and each of its sub-commands, in-process."""

from __future__ import annotations

import argparse
import importlib.util
import re

import pytest

from rollout.app.args import plain_text

MARKUP = re.compile(r"``|:[a-z]+:`")


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{command: its --help}`` for ``parser`` and every sub-command under it."""
    out = {parser.prog: parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.update(_helps(sub))
    return out


def _parser_of(main, argv_prefix: list[str], monkeypatch) -> argparse.ArgumentParser:
    """The parser ``main`` builds, caught when it parses (``main`` builds its parser inside)."""
    caught: list[argparse.ArgumentParser] = []

    def parse(self, args=None, namespace=None):
        caught.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse)
    with pytest.raises(SystemExit):
        main(argv_prefix)
    return caught[0]


def test_plain_text_drops_literals_and_roles():
    assert plain_text("``python -m rollout`` runs :func:`rollout.app.cli.main` and :mod:`~rollout.core.pool`") == \
        "python -m rollout runs rollout.app.cli.main and pool"


def test_no_command_help_shows_restructuredtext(monkeypatch):
    from rollout.app.cli import build_parser
    from rollout.devtools.check import _parser as check_parser
    from rollout.integrations.verl_data import main as verl_data_main

    helps = _helps(build_parser()[0])
    assert {"python -m rollout run", "python -m rollout eval", "python -m rollout view", "python -m rollout regrade"} <= set(helps)
    helps.update(_helps(check_parser()))
    if importlib.util.find_spec("psutil") is not None:
        from rollout.devtools.bench import main as bench_main

        helps.update(_helps(_parser_of(bench_main, ["--help"], monkeypatch)))
    helps.update(_helps(_parser_of(verl_data_main, ["--help"], monkeypatch)))
    shown = {prog: MARKUP.findall(text) for prog, text in helps.items()}
    assert {prog: found for prog, found in shown.items() if found} == {}
    assert "Command line: python -m rollout {run,eval,config}" in helps["python -m rollout"]
