"""What a tau2 domain's environment constructor is given besides a database: the retrieval config
of a knowledge domain, the task, and the read-log allowlist (tau2-bench >= 1.0's
``banking_knowledge``), and the preflight check of ``env.retrieval_config``.

tau2's runner builds an episode's environment, and its evaluator the replay and gold
environments, with the same keyword arguments (``tau2.runner.build._build_env_kwargs``):
``retrieval_variant`` (its ``--retrieval-config``) and ``task`` when a retrieval config is set,
and for banking_knowledge a ``read_log_allowlist``: the discoverable tools named by the task's
gold ``call_discoverable_agent_tool`` actions, whose read-only calls are logged in the database
(tau2-bench 1.0.1, #329: before it, one extra verification read changed the database hash and
zeroed the reward). :func:`env_kwargs` gives them to any domain whose constructor takes them (read
from its signature), here in every place an environment is built (the episode's, the gold state's,
the tool sandbox's, tau2's evaluator's), so that the live environment and the graded ones agree.

``env.retrieval_config`` names one of tau2's retrieval configs. Only offline ones can run here
(:func:`check_retrieval_config`): those whose KB search is BM25 or grep or absent; a config with
dense embeddings or an LLM reranker needs an API key, one with a shell a sandbox (``srt``, ``rg``,
``bwrap``, ``socat``), and tau2's default (``alltools``) needs both.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)

__all__ = ["check_env_config", "check_retrieval_config", "constructor_params", "env_kwargs", "offline_retrieval_configs", "read_log_allowlist",
           "retrieval_needs", "takes_retrieval"]

DISCOVERABLE_CALL = "call_discoverable_agent_tool"  # banking_knowledge's wrapper for its discoverable agent tools


def constructor_params(get_environment: Callable[..., Any]) -> frozenset[str]:
    """The keyword parameters of a domain's environment constructor (empty when unreadable)."""
    try:
        return frozenset(inspect.signature(get_environment).parameters)
    except (TypeError, ValueError):
        return frozenset()


def read_log_allowlist(task: Any) -> set[str]:
    """The discoverable agent tools the task's gold actions call (``agent_tool_name`` of each gold
    ``call_discoverable_agent_tool``): the read-only ones whose calls banking_knowledge logs for
    the database check (tau2-bench 1.0.1's ``_derive_read_log_allowlist``, same rule)."""
    crit = getattr(task, "evaluation_criteria", None)
    out: set[str] = set()
    for action in (crit.actions or []) if crit is not None else []:
        if action.name == DISCOVERABLE_CALL:
            name = (action.arguments or {}).get("agent_tool_name")
            if name:
                out.add(name)
    return out


def env_kwargs(params: frozenset[str], retrieval_config: str | None, task: Any | None) -> dict[str, Any]:
    """The keyword arguments for a domain's environment constructor whose parameters are ``params``
    (:func:`constructor_params`), as tau2's runner and evaluator give them:
    ``retrieval_variant`` (``env.retrieval_config``, when set) and ``task`` (when a retrieval config is
    set; ``golden_retrieval`` inlines the task's documents in the prompt), ``read_log_allowlist``
    (:func:`read_log_allowlist`, when a task is given). A domain whose constructor takes none of
    them gets ``{}`` (airline, retail, telecom: unchanged)."""
    kw: dict[str, Any] = {}
    if "retrieval_variant" in params and retrieval_config is not None:
        kw["retrieval_variant"] = retrieval_config
        if "task" in params and task is not None:
            kw["task"] = task
    if "read_log_allowlist" in params and task is not None:
        kw["read_log_allowlist"] = read_log_allowlist(task)
    return kw


# -- the preflight check (no tau2 import for a domain without retrieval) ----------------------------
def _function_params(module: str, attr: str) -> frozenset[str] | None:
    """The parameters of ``module.attr``, read from the module's source without importing it
    (None when the source or the function cannot be found)."""
    from rollout.benchmarks.tau2.registry import light_tau2

    light_tau2()
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
            a = node.args
            return frozenset(x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs])
    return None


def takes_retrieval(domain: str) -> bool | None:
    """Whether tau2 domain ``domain``'s environment constructor takes a retrieval config
    (``retrieval_variant``), read from the sources (milliseconds, no import); None when that
    cannot be told (the registry's source or the constructor's is not readable)."""
    from rollout.benchmarks.tau2.registry import registered_environment

    ref = registered_environment(domain)
    if ref is None:
        return None
    params = _function_params(*ref)
    return None if params is None else "retrieval_variant" in params


@functools.lru_cache(maxsize=8)
def _retrieval_module(domain: str) -> Any:
    """The module that defines the domain's retrieval configs (where ``resolve_variant`` comes
    from), importing the domain's environment module (1-2 s, no litellm)."""
    from rollout.benchmarks.tau2.registry import load_domain

    get_env = load_domain(domain).get_environment
    resolve = getattr(importlib.import_module(get_env.__module__), "resolve_variant", None)
    if resolve is None:
        raise LookupError(f"tau2 domain {domain}: its environment takes a retrieval config, but its module has no resolve_variant")
    return importlib.import_module(resolve.__module__)


def retrieval_needs(variant: Any) -> list[str]:
    """What a tau2 ``RetrievalVariant`` needs beyond this machine: ``"an API key"`` (dense embeddings
    or an LLM reranker in a KB search pipeline) and ``"a shell sandbox"`` (a shell tool); ``[]``
    for an offline config."""
    needs: list[str] = []
    pipelines = [getattr(variant, a, None) for a in ("kb_search", "kb_search_bm25", "kb_search_dense")]
    if any(p is not None and (getattr(p, "type", None) == "embedding" or getattr(p, "reranker", False)) for p in pipelines):
        needs.append("an API key (embeddings or an LLM reranker)")
    if getattr(variant, "shell", None) is not None:
        needs.append("a shell sandbox (srt, rg, bwrap, socat)")
    return needs


def offline_retrieval_configs(domain: str) -> list[str]:
    """The domain's retrieval configs that need nothing beyond this machine, in tau2's order."""
    mod = _retrieval_module(domain)
    return [name for name, v in getattr(mod, "RETRIEVAL_VARIANTS", {}).items() if not retrieval_needs(v)]


def check_retrieval_config(domain: str, retrieval_config: str | None) -> None:
    """``env.retrieval_config`` against tau2 domain ``domain`` (the tau2 benchmark's
    ``check_config`` hook runs it before anything starts): null for a domain without retrieval
    (milliseconds); for a knowledge domain, one of tau2's configs that runs offline (imports the
    domain's environment module: 1-2 s), with the packages it needs (``bm25``: rank-bm25).

    Raises:
        rollout.core.config.ConfigError: one line naming ``env.retrieval_config``.
    """
    from rollout.core.config import ConfigError

    takes = takes_retrieval(domain)
    if takes is None:
        return  # the constructor is not readable: the domain's loader will tell
    if not takes:
        if retrieval_config is not None:
            raise ConfigError(f"env.retrieval_config: tau2 domain {domain} takes no retrieval config (set it to null); "
                              "it is for knowledge domains such as banking_knowledge")
        return
    try:
        mod = _retrieval_module(domain)
    except (ImportError, LookupError) as e:
        raise ConfigError(f"env.retrieval_config: cannot read tau2 domain {domain}'s retrieval configs: {e}") from None
    name = retrieval_config if retrieval_config is not None else getattr(mod, "DEFAULT_RETRIEVAL_VARIANT", "alltools")
    offline = offline_retrieval_configs(domain)
    try:
        variant = mod.resolve_variant(name)
    except ValueError:
        raise ConfigError(f"env.retrieval_config: {name!r} is not a retrieval config of tau2 domain {domain}; "
                          f"the offline ones: {', '.join(offline)}") from None
    needs = retrieval_needs(variant)
    if needs:
        which = f"{name!r}" + (" (tau2's default, as env.retrieval_config is null)" if retrieval_config is None else "")
        raise ConfigError(f"env.retrieval_config: {domain}'s retrieval config {which} needs {' and '.join(needs)}, which this "
                          f"project does not provide; use an offline one: {', '.join(offline)}")
    pipelines = [getattr(variant, a, None) for a in ("kb_search", "kb_search_bm25")]
    if any(p is not None and getattr(p, "type", None) == "bm25" for p in pipelines) and importlib.util.find_spec("rank_bm25") is None:
        raise ConfigError(f"env.retrieval_config: {name!r} needs the rank-bm25 package (tau2's [knowledge] extra): pip install rank-bm25")


def check_env_config(env_cfg: Any) -> None:
    """tau2's ``check_config`` hook (:func:`rollout.core.environment.register_benchmark`), run by
    the preflight before anything starts: ``env.domain`` is a domain of tau2's registry
    (:func:`rollout.benchmarks.tau2.registry.check_domain`, without importing tau2), and
    ``env.retrieval_config`` suits it (:func:`check_retrieval_config`: null for a domain without
    retrieval; an offline config for a knowledge domain, whose module it imports).

    Raises:
        rollout.core.config.ConfigError: one line naming ``env.domain`` (listing tau2's domains)
            or ``env.retrieval_config``.
    """
    from rollout.benchmarks.tau2.registry import UnknownDomainError, check_domain
    from rollout.core.config import ConfigError

    try:
        check_domain(env_cfg.domain)
    except UnknownDomainError as e:
        raise ConfigError(str(e)) from None
    check_retrieval_config(env_cfg.domain, getattr(env_cfg, "retrieval_config", None))
