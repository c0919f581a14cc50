"""What a run logs of the chat format's start-up probe: one INFO line that says what was found and
where it is explained, not the five-line block of yes / NO cases at every start (which stays at
DEBUG: :func:`rollout.app.wiring.log_template_probe`, :meth:`TemplateReport.headline`)."""

from __future__ import annotations

import logging

import pytest

from rollout.app.wiring import log_template_probe
from rollout.core.formats import get_chat_format
from rollout.core.formats.protocol import TemplateReport
from rollout.core.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def qwen3_report() -> TemplateReport:
    return get_chat_format("hermes")(load_tokenizer("builtin:qwen3"), tools=None).probe()


def test_the_headline_of_qwen3s_probe_is_one_line_counting_each_check(qwen3_report):
    line = qwen3_report.headline()
    assert "\n" not in line and "NO" not in line, line
    assert line.startswith("exact deltas: each message's delta is the same whatever came before it in 6/6 cases"), line
    stable = qwen3_report.prefix_stable
    assert f"re-rendering the history is a prefix of the next render in {sum(stable.values())}/{len(stable)}" in line, line
    assert "policy.history=append" in line  # why its NO cases are expected


def test_a_report_with_a_problem_says_not_usable_and_the_first_problem():
    report = TemplateReport(end_of_turn="</s>", turn_tail="", delta_independent={"user_after_plain": False},
                            problems=["the delta of user after an assistant turn differs", "second"])
    assert report.headline() == ("NOT usable: each message's delta is the same whatever came before it in 0/1 cases; "
                                 "2 problem(s), the first: the delta of user after an assistant turn differs")


def test_a_run_logs_one_info_line_and_each_case_at_debug(qwen3_report, caplog):
    info = {"template_probe": qwen3_report.summary(), "template_probe_line": qwen3_report.headline()}
    with caplog.at_level(logging.INFO, logger="rollout.app.wiring"):
        log_template_probe("builtin:qwen3", info)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("chat template probe (builtin:qwen3): exact deltas:") and "docs/exactness.md#the-start-up-probe" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="rollout.app.wiring"):
        log_template_probe("builtin:qwen3", info)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 1 and "prefix-stable re-rendering: user_after_plain=NO" in debug[0], debug
