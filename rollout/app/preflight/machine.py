"""The checks of what the config names on this machine: the values :func:`rollout.core.config.validate`
cannot check without I/O (a tau2 domain, uvloop), the key variables, the packages a choice needs,
the Ray address and the output folder. Each is cheap (milliseconds, or a bounded wait for a Ray
head) and fails with one line naming the key."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.app.preflight.errors import PreflightError
from rollout.core.config import ConfigError, EventLoop, LocalBackend, UserKind
from rollout.core.startup import RAY_ADDRESS_WAIT_S, check_ray_address  # noqa: F401  (re-exported: the preflight runs it too)

if TYPE_CHECKING:
    from rollout.core.config import Config


def check_config(cfg: Config) -> None:
    """The config values whose check reads files or looks up modules (kept out of
    :func:`rollout.core.config.validate`, which does no I/O), in milliseconds, without importing tau2:

    * ``env.domain`` is a domain of tau2's registry (``env.benchmark=tau2``), read from tau2's
      source (:func:`rollout.benchmarks.tau2.registry.check_domain`);
    * ``local.event_loop=uvloop`` with ``local.enabled``: uvloop is installed here, where the local
      servers run (``pool.event_loop`` is checked on the actors' nodes, by the pool once they are up).

    Raises:
        ConfigError: one line naming the key (the CLI prints it as a config error, exit 2).
    """
    if cfg.env.benchmark == "tau2":
        from rollout.benchmarks.tau2.registry import UnknownDomainError, check_domain

        try:
            check_domain(cfg.env.domain)
        except UnknownDomainError as e:
            raise ConfigError(str(e)) from None
    if cfg.local.enabled and cfg.local.event_loop == EventLoop.UVLOOP:
        from rollout.core.eventloop import check_event_loop

        why = check_event_loop(cfg.local.event_loop, "local.event_loop")
        if why:
            raise ConfigError(why)


def check_output_dir(path: str | os.PathLike) -> None:
    """``path`` can be created (with its parents) and written: a probe file is written and removed.

    Raises:
        PreflightError: the folder cannot be created or written. One line.
    """
    p = Path(path).expanduser()
    probe = p / f".preflight-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        p.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"ok")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as e:
        raise PreflightError(f"rollout.output_dir {str(p)!r} is not writable: {type(e).__name__}: {e.strerror or e}") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


def check_key_variables(cfg: Config) -> None:
    """The variables named by ``policy.api_key_env`` and (for the llm user) ``env.user.api_key_env``
    are set and not empty; cheap, so the CLI runs it before starting anything.

    Raises:
        PreflightError: naming the key and the variable (never a value).
    """
    user_var = cfg.env.user.api_key_env if cfg.env.user.kind == UserKind.LLM else None
    for var, key in ((cfg.policy.api_key_env, "policy.api_key_env"), (user_var, "env.user.api_key_env")):
        if var and not os.environ.get(var):
            raise PreflightError(f"{key} names the environment variable {var}, which is not set (or empty)")


def check_benchmark(cfg: Config) -> None:
    """What ``env.benchmark`` needs is installed here: the registered benchmark's own check
    (:func:`rollout.core.environment.require_benchmark`; for ``tau_bench``, that the original
    tau-bench's package can be imported: looked up, not imported, milliseconds). The CLI runs it
    before starting anything.

    Raises:
        PreflightError: one line with the install command (``rollout.benchmarks.tau_bench.package.INSTALL_COMMAND``).
        rollout.core.config.ConfigError: no benchmark of that name is registered.
    """
    from rollout.core.environment import UnknownBenchmarkError, require_benchmark

    try:
        require_benchmark(cfg.env.benchmark)
    except UnknownBenchmarkError as e:
        raise ConfigError(str(e)) from None
    except ImportError as e:
        raise PreflightError(str(e)) from None


def check_modules(cfg: Config) -> None:
    """The optional packages the config asks for can be imported here (looked up, not imported):
    ``torch`` for ``local.backend=tiny`` (the ``tiny`` extra) with ``local.enabled``; ``litellm``
    for ``env.user.kind=llm``. (``pool.event_loop=uvloop`` is checked on the actors' nodes, by the
    pool once they are up.)

    Raises:
        PreflightError: one line naming the key and the install command.
    """
    if cfg.local.enabled and cfg.local.backend == LocalBackend.TINY and not _importable("torch"):
        raise PreflightError("local.backend=tiny needs torch, which is not installed here: pip install 'tau-rollout[tiny]' "
                             "(torch==2.13.0 is the CPU build), or choose local.backend=gold_replay")
    if cfg.env.user.kind == UserKind.LLM and not _importable("litellm"):
        raise PreflightError("env.user.kind=llm needs litellm, which is not installed here: pip install litellm")


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path and not masked in ``sys.modules``)."""
    import importlib.util
    import sys

    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False

