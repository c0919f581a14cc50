"""The preflight's chat-format check (rollout.app.preflight.check_chat_format): a format that does
not fit the tokenizer is a one-line config error naming both keys; a pair that fits is
remembered on disk, so a job started again loads no tokenizer in the driver. The CLI's and
open_pool's refusal before anything starts: tests/e2e/test_bad_sources.py."""

from __future__ import annotations

import pytest
from support.packages import FAMILIES, hide_packages

from rollout.app.preflight import tokenizer as tok
from rollout.core.config import ConfigError


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty disk cache and no pair remembered in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tok, "_FITS", {})
    return tmp_path / "cache"


def test_mistral_with_the_qwen3_tokenizer_is_one_config_line_naming_both_keys(fresh):
    pytest.importorskip("mistral_common", reason="the mistral format needs the families extra (pip install -e '.[families]'); "
                                                 "without it: test_a_format_whose_packages_are_missing_is_one_line_naming_them")
    with pytest.raises(ConfigError) as e:
        tok.check_chat_format("builtin:qwen3", "mistral")
    msg = str(e.value)
    assert msg.startswith("policy.chat_format=mistral does not fit policy.tokenizer=builtin:qwen3: "), msg
    assert "builtin:mistral" in msg and "\n" not in msg, msg  # what to pass instead, on one line
    assert not list(fresh.rglob("chat-formats/*.json"))  # a misfit is never remembered


def test_a_format_whose_packages_are_missing_is_one_line_naming_them(fresh, monkeypatch):
    """Without the families extra (here hidden), a named format that needs it is refused before its
    tokenizer loads, naming the key, the missing packages and the extra."""
    hide_packages(monkeypatch, FAMILIES)
    monkeypatch.setattr("rollout.core.tokenizer.load_tokenizer", lambda name: pytest.fail("the tokenizer was loaded"))
    with pytest.raises(ConfigError) as e:
        tok.check_chat_format("builtin:qwen3", "mistral")
    msg = str(e.value)
    assert msg.startswith("policy.chat_format=mistral: this chat format needs the package 'mistral-common', which is not installed here"), msg
    assert "pip install 'tau-rollout[families]'" in msg and "\n" not in msg, msg
    assert not list(fresh.rglob("chat-formats/*.json"))


def test_auto_detection_that_finds_no_family_names_both_keys(fresh, monkeypatch):
    monkeypatch.setattr("rollout.core.formats.registry.detect_chat_format", lambda tokenizer: None)
    with pytest.raises(ConfigError, match=r"^policy.chat_format=auto does not fit policy.tokenizer=builtin:qwen3: .*no registered chat format"):
        tok.check_chat_format("builtin:qwen3", "auto")


def test_a_pair_that_fits_is_checked_once_and_then_read_from_the_disk_cache(fresh, monkeypatch):
    assert tok.check_chat_format("builtin:qwen3", "auto") == "hermes"
    assert tok.check_chat_format("builtin:qwen3", "hermes", enable_thinking=False) == "hermes"
    assert len(list((fresh / "tau-rollout" / "tokenizer-facts" / "chat-formats").glob("*.json"))) == 2
    monkeypatch.setattr(tok, "_FITS", {})  # a new process: only the disk remembers
    monkeypatch.setattr("rollout.core.tokenizer.load_tokenizer", lambda name: pytest.fail("a cached pair loaded the tokenizer"))
    assert tok.check_chat_format("builtin:qwen3", "auto") == "hermes"
    monkeypatch.setattr(tok, "FACTS_CACHE", False)  # the cache off: checked (and so loaded) again
    with pytest.raises(pytest.fail.Exception, match="loaded the tokenizer"):
        tok.check_chat_format("builtin:qwen3", "hermes")
