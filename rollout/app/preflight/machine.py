"""The checks of what the config names on this machine: the values :func:`rollout.core.config.validate`
cannot check without I/O (through the benchmark's and the engine's own hooks: a tau2 domain,
uvloop), the key variables, the packages a choice needs, the Ray address and the output folder.
Each is cheap (milliseconds, or a bounded wait for a Ray head) and fails with one line naming the key."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.app.preflight.errors import PreflightError
from rollout.core.config import ConfigError, UserKind
from rollout.core.engines import engine_for, get_engine
from rollout.core.environment import benchmark_hook
from rollout.core.startup import RAY_ADDRESS_WAIT_S, check_ray_address, importable  # noqa: F401  (re-exported: the preflight runs it too)

if TYPE_CHECKING:
    from rollout.core.config import Config
    from rollout.core.tasks import TaskSelection


def check_config(cfg: Config) -> None:
    """The config values whose check reads files or looks up modules (kept out of
    :func:`rollout.core.config.validate`, which does no I/O), in milliseconds, through the hooks
    of what the config selects:

    * the benchmark's ``check_config`` hook (:func:`rollout.core.environment.benchmark_hook`;
      tau2's: ``env.domain`` is a domain of tau2's registry, read from tau2's source without
      importing tau2, and `env.retrieval_config` suits it: :func:`rollout.benchmarks.tau2.retrieval.check_env_config`);
    * the engine's ``check_config`` when the job starts one (:func:`rollout.core.engines.engine_for`;
      the local stack's: ``local.event_loop=uvloop`` is installed here, where its servers run;
      ``pool.event_loop`` is checked on the actors' nodes, by the pool once they are up).

    Raises:
        ConfigError: one line naming the key (the CLI prints it as a config error, exit 2).
    """
    check = benchmark_hook(cfg.env.benchmark, "check_config")
    if check is not None:
        check(cfg.env)
    engine = engine_for(cfg)
    if engine is not None:
        get_engine(engine).check_config(cfg)


def check_task_selection(cfg: Config) -> TaskSelection:
    """The tasks ``env.task_split`` / ``env.task_ids`` and ``env.open_issues`` select, checked
    against the domain before anything starts: the domain is loaded through the benchmark registry
    (:func:`rollout.core.environment.load_benchmark`, ``env.benchmark``'s loader; tau2: 1-2 s for
    its domain module and data) and asked (:meth:`rollout.core.environment.Benchmark.task_ids`,
    and its ``task_issues`` for the open issues: :func:`rollout.core.tasks.select_tasks`).

    Returns:
        The :class:`~rollout.core.tasks.TaskSelection`: the task ids that run, in the benchmark's
        order (``env.task_ids`` as the benchmark writes them), and those left out for an open issue.

    Raises:
        rollout.core.config.TaskSelectionError: one line naming ``env.task_split`` (the splits the
            domain has) or ``env.task_ids`` (the ids it lacks and the valid ones), or saying that
            every selected task has an open issue; a ``ConfigError``.
    """
    from rollout.core.environment import load_benchmark
    from rollout.core.tasks import select_tasks

    bench = load_benchmark(cfg.env, log_level=cfg.logging.tau2_level)
    try:
        return select_tasks(bench, cfg.env.task_split, cfg.env.task_ids, cfg.env.open_issues)
    finally:
        bench.close()


def check_output_dir(path: str | os.PathLike) -> None:
    """``path`` can be created (with its parents) and written: a probe file is written and removed.

    Raises:
        PreflightError: the folder cannot be created or written. One line.
    """
    p = Path(path)  # as the run writes it: load_config expanded a leading ~ already
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
    what the job's engine needs (its ``check_modules``; the local stack's: ``torch`` for
    ``local.backend=tiny``, the ``tiny`` extra); ``litellm`` for ``env.user.kind=llm``.
    (``pool.event_loop=uvloop`` is checked on the actors' nodes, by the pool once they are up.)

    Raises:
        PreflightError: one line naming the key and the install command.
    """
    engine = engine_for(cfg)
    if engine is not None:
        get_engine(engine).check_modules(cfg)
    if cfg.env.user.kind == UserKind.LLM and not importable("litellm"):
        raise PreflightError("env.user.kind=llm needs litellm, which is not installed here: pip install litellm")
