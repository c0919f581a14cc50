"""The preflight's tokenizer facts cache (rollout.app.preflight.tokenizer.cached_tokenizer_facts):
keyed by the tokenizer's files, so a changed file is loaded again; a hub id is never cached."""

from __future__ import annotations

import os
import shutil

import pytest

from rollout.app.preflight import tokenizer as tok
from rollout.core.tokenizer import builtin_qwen3_path, load_tokenizer


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_facts_are_computed_once_per_set_of_files_and_equal_the_loaded_tokenizers(tmp_path, cache_home, monkeypatch):
    folder = tmp_path / "tok"
    shutil.copytree(builtin_qwen3_path(), folder)
    facts, hit = tok.cached_tokenizer_facts(str(folder))
    assert not hit and facts == tok.tokenizer_facts(load_tokenizer(str(folder)))
    assert facts["tokenizer_vocab_size"] == 151669 and facts["special_tokens"]["<|im_start|>"] == 151644
    loads = []
    monkeypatch.setattr("rollout.core.tokenizer.load_tokenizer", lambda name: loads.append(name))  # a hit loads nothing
    again, hit = tok.cached_tokenizer_facts(str(folder))
    assert hit and again == facts and loads == []
    st = os.stat(folder / "tokenizer_config.json")
    os.utime(folder / "tokenizer_config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a changed file: a new key
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    _, hit = tok.cached_tokenizer_facts(str(folder))
    assert not hit
    monkeypatch.setattr(tok, "FACTS_CACHE", False)  # turned off: always loaded
    assert tok.cached_tokenizer_facts(str(folder))[1] is False


def test_a_hub_id_or_a_missing_folder_has_no_key(cache_home):
    assert tok._facts_key("Qwen/Qwen3-8B") is None
    assert tok._facts_key("/nonexistent/folder") is None
    assert tok._facts_key("builtin:qwen3") is not None
