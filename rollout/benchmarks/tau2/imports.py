"""Importing tau2 as an actor needs it: litellm kept offline, loguru at our level, constants read
from tau2's source rather than imported, a domain's loaders from tau2's registry.

Shared by the domain (:mod:`rollout.benchmarks.tau2.domain`), the tool sandbox's child
(:mod:`rollout.benchmarks.tau2.sandbox`) and the local stack's gold index.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from rollout.benchmarks.tau2.registry import DomainLoaders, light_tau2, load_domain

logger = logging.getLogger(__name__)


def import_tau2(log_level: str | None = None) -> None:
    """Import tau2 with litellm kept offline; with ``log_level``, set loguru's level (tau2 logs
    every tool response at DEBUG). About 1-2 s the first time."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if log_level is not None:
        # loguru's default handler reads this when loguru is first imported (tau2 logs at import)
        os.environ.setdefault("LOGURU_LEVEL", log_level.upper())
    light_tau2()  # tau2 >= 1.0's __init__ imports litellm and every agent: not here
    import tau2  # noqa: F401
    from loguru import logger as loguru_logger

    if log_level is not None and getattr(import_tau2, "_level", None) != log_level:
        loguru_logger.remove()
        loguru_logger.add(sys.stderr, level=log_level.upper())
        import_tau2._level = log_level  # type: ignore[attr-defined]


_CONSTANTS: dict[tuple[str, str], str] = {}


def literal_constants(module: str, names: tuple[str, ...]) -> dict[str, str]:
    """Module-level string constants of ``module`` (string literals, optionally ``.strip()``-ed), read from its source without
    importing it: importing ``tau2.agent.llm_agent`` for its prompt constants would pull in
    litellm (about 145 MB resident per actor). Falls back to importing the module when a
    constant is not a plain literal. Cached per process.

    Raises:
        ImportError: the module cannot be found.
    """
    if all((module, n) in _CONSTANTS for n in names):
        return {n: _CONSTANTS[(module, n)] for n in names}
    import ast

    # The file from the top package's folder: find_spec would import the parent packages, and
    # tau2.agent's __init__ imports the module itself.
    parts = module.split(".")
    top = importlib.import_module(parts[0])
    path = os.path.join(os.path.dirname(top.__file__), *parts[1:]) + ".py"
    found: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except OSError:
        tree = ast.Module(body=[], type_ignores=[])
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            expr, strip = node.value, None
            if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("strip", "lstrip", "rstrip")
                    and not expr.args and not expr.keywords):  # """...""".strip()
                expr, strip = expr.func.value, expr.func.attr
            try:
                value = ast.literal_eval(expr)
            except ValueError:
                continue
            if isinstance(value, str) and strip is not None:
                value = getattr(value, strip)()
            if isinstance(value, str):
                found[node.targets[0].id] = value  # the last assignment wins, as on import
    if set(found) != set(names):
        mod = importlib.import_module(module)
        found = {n: getattr(mod, n) for n in names}
    for n, v in found.items():
        _CONSTANTS[(module, n)] = v
    return found


def domain_loaders(domain: str) -> DomainLoaders:
    """The functions tau2's registry registers for ``domain`` (``get_environment``, ``get_tasks``,
    ``get_tasks_split``), see :func:`rollout.benchmarks.tau2.registry.load_domain`.

    Raises:
        UnknownDomainError: tau2 has no such domain (one line naming ``env.domain``).
    """
    import_tau2()
    return load_domain(domain)
