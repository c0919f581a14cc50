"""The engine seam: the policy engine a job starts on this machine (inference servers behind a
router), which :func:`rollout.app.wiring.open_pool` starts before the pool and stops after it.

An engine kind is registered by name in :data:`ENGINES` (:func:`register_engine`), by its
``"package.module:attribute"`` path, so that the wiring reaches it without importing it: the
embedded local stack (SGLang-protocol test servers behind the real ``sglang-router``,
:class:`rollout.devtools.local.stack.LocalStackEngine`) is :data:`LOCAL_STACK`; the real vLLM on
the CPU behind ``vllm-router`` (:class:`rollout.devtools.local.vllm.engine.VllmEngine`) is
:data:`VLLM_STACK`. The wiring asks :func:`engine_for` which one a config starts: with
``local.enabled``, ``local.backend`` chooses (``vllm``: vLLM, else the local stack); none otherwise
(``policy.router_url`` points at a router already running).

What the wiring needs of an engine kind (:class:`EngineKind`), in the order it asks:

1. ``check_config(cfg)`` and ``check_modules(cfg)`` before anything starts (one line each: a
   value of its section this machine cannot serve, a package it needs that is missing);
2. ``kind(section, job)``: an :class:`Engine` for its own config section (``section``, the
   attribute of :class:`~rollout.core.config.Config` it names) and the job's facts
   (:class:`EngineJob`), with its router's port chosen there, so that the router's URL is known
   before it starts (the actors start at the same time, :func:`rollout.app.wiring.open_pool`);
3. ``engine.start()`` (blocking; the wiring runs it in a thread, overlapped with Ray),
   ``engine.router_url``, ``engine.stop()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rollout.core.config.local import LocalBackend
from rollout.core.environment import domain_key
from rollout.core.registry import Registry

if TYPE_CHECKING:
    from rollout.core.config import Config

__all__ = ["ENGINES", "LOCAL_STACK", "VLLM_STACK", "Engine", "EngineJob", "EngineKind", "engine_for", "get_engine", "register_engine"]

LOCAL_STACK = "local"  # the embedded default: the local stack (config section ``local``)
VLLM_STACK = "vllm"  # the real vLLM on the CPU behind vllm-router (``local.backend=vllm``; section ``local``)


@dataclass(frozen=True)
class EngineJob:
    """What an engine needs of the job beside its own config section.

    Attributes:
        domain: the benchmark's domain as one string (:func:`rollout.core.environment.domain_key`:
            ``retail``, ``tau_bench:retail``), for servers that index its tasks (gold replay).
        tokenizer: ``policy.tokenizer`` (``builtin:<vocabulary>``, a folder, or a hub id).
        chat_format: ``policy.chat_format`` (``auto``: detected from the tokenizer).
        api_key_env: ``policy.api_key_env``: the variable holding the key the engine's servers
            and router require (None: no key).
        log_dir: the folder for the engine's logs.
    """

    domain: str
    tokenizer: str
    chat_format: str
    api_key_env: str | None
    log_dir: Path

    @classmethod
    def of(cls, cfg: Config, log_dir: Path) -> EngineJob:
        """The job's facts from the whole config (``env.benchmark``, ``env.domain``, ``policy.*``)."""
        return cls(domain_key(cfg.env.benchmark, cfg.env.domain), cfg.policy.tokenizer, cfg.policy.chat_format,
                   cfg.policy.api_key_env, Path(log_dir))


class Engine(Protocol):
    """One engine made for a job (not started yet when made).

    Attributes:
        router_url: ``http://host:port`` of the router the pool calls; known once the engine is
            made (its port is chosen then), answering once :meth:`start` returned.
    """

    @property
    def router_url(self) -> str: ...

    def start(self) -> Any:
        """Start the servers and the router; return once a call through the router works.
        Blocking (the wiring runs it in a thread).

        Raises:
            RuntimeError: a process exited or the start-up timed out (everything started is stopped first).
        """
        ...

    def stop(self) -> None:
        """Stop what :meth:`start` started (idempotent; also after a failed or unfinished start)."""
        ...


class EngineKind(Protocol):
    """What :func:`register_engine` registers: an engine's checks and its constructor (a class
    with two static or class methods fits).

    Attributes:
        section: the :class:`~rollout.core.config.Config` attribute holding the engine's own
            config section (``"local"`` for the local stack).
    """

    section: str

    def check_config(self, cfg: Config) -> None:
        """Values of the engine's section this machine cannot serve (read here, no engine
        started). Raises ``rollout.core.config.ConfigError``, one line naming the key."""
        ...

    def check_modules(self, cfg: Config) -> None:
        """The packages the engine's section asks for are installed here (looked up, not
        imported). Raises ``rollout.core.startup.PreflightError``, one line with the install command."""
        ...

    def __call__(self, section: Any, job: EngineJob) -> Engine:
        """An :class:`Engine` for ``section`` (the engine's config section) and ``job``, not started."""
        ...


ENGINES: Registry[EngineKind] = Registry("engine")


def register_engine(name: str, kind: EngineKind | str, *, replace: bool = False) -> None:
    """Register an engine kind under ``name`` (an :class:`EngineKind`, or its
    ``"package.module:attribute"`` path, imported the first time it is asked for).

    Raises:
        ValueError: ``name`` is taken (and ``replace`` is false), or is not a valid name.
    """
    ENGINES.register(name, kind, replace=replace)


def get_engine(name: str) -> EngineKind:
    """The engine kind registered as ``name`` (its module is imported now, once).

    Raises:
        rollout.core.registry.UnknownNameError: no such engine (one line listing the registered ones).
    """
    return ENGINES.get(name)


def engine_for(cfg: Config) -> str | None:
    """The name of the engine a job with ``cfg`` starts: with ``local.enabled``, :data:`VLLM_STACK`
    when ``local.backend=vllm``, else :data:`LOCAL_STACK`; None without ``local.enabled`` (the pool
    calls ``policy.router_url``, a router already running: an SGLang or vLLM fleet)."""
    if not cfg.local.enabled:
        return None
    return VLLM_STACK if cfg.local.backend == LocalBackend.VLLM else LOCAL_STACK


register_engine(LOCAL_STACK, "rollout.devtools.local.stack:LocalStackEngine")
register_engine(VLLM_STACK, "rollout.devtools.local.vllm.engine:VllmEngine")
