"""``python -m rollout`` as the end-to-end tests run it: a subprocess in the repository's root, on the
session's shared Ray head and a shared local stack instead of a cluster and a stack of its own.

``run_cli(["run", "--config", "configs/local.yaml", "env.task_ids=[0]", ...], stack=local_stacks,
ray=shared_ray)`` adds ``pool.ray_address=<the shared head>`` and, for the stack, what a run that
starts its own would have set itself (``rollout.app.wiring.resolve_endpoints``): ``local.enabled=false``,
``policy.router_url`` and, for an LLM user simulator or judge, their ``base_url``/``model``/
``api_key_env``. The run's ``local`` section still picks the stack (``support.stacks``), so a test
asks for the tiny model or another vocabulary as a user would (``local.backend=tiny``,
``policy.tokenizer=...``). A test about the stack's or the cluster's own start leaves them out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rollout.app.wiring import resolve_endpoints
from rollout.core.config import Config, load_config
from rollout.core.environment import domain_key
from rollout.devtools.local.stack import LocalStack
from support.shared_ray import SharedRay
from support.stacks import LocalStacks

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_VALUED = ("--config", "-c", "--replay")  # options of run/eval that take a value
_JOBS = ("run", "eval")  # the commands that start a pool


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: this one, the venv's ``bin`` first on ``PATH``, litellm
    offline, no ``RAY_ADDRESS`` from the caller's shell; ``extra`` on top."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    return dict(env, **extra)


def job_args(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(config file, overrides)`` of a ``run``/``eval`` with ``args`` (``python -m rollout``'s
    arguments): ``--config``'s value, or ``configs/local.yaml`` as the CLI takes it when none is named.

    Raises:
        ValueError: ``args`` is not a ``run``/``eval`` command.
    """
    if not args or args[0] not in _JOBS:
        raise ValueError(f"not a job: python -m rollout {' '.join(args)}")
    config, overrides, skip = None, [], False
    for i, a in enumerate(args[1:], 1):
        if skip:
            skip = False
        elif a in _VALUED:
            skip = True
            if a != "--replay":
                config = args[i + 1]
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
        elif not a.startswith("-") and "=" in a:
            overrides.append(a)
    if config is None and (ROOT / "configs" / "local.yaml").is_file():
        config = "configs/local.yaml"
    return config, overrides


def _load(config: str | Path | None, overrides: Sequence[str]) -> Config:
    path = ROOT / config if config is not None and not Path(config).is_absolute() else config
    return load_config(path, list(overrides))


def job_config(args: Sequence[str]) -> Config:
    """The config a ``run``/``eval`` with ``args`` loads, as the CLI loads it (:func:`job_args`)."""
    return _load(*job_args(args))


def stack_overrides(cfg: Config, router_url: str) -> list[str]:
    """The overrides that point a run of ``cfg`` at a router already up (``router_url``) exactly
    where it would have pointed itself at the local stack it starts (``resolve_endpoints``)."""
    resolved = resolve_endpoints(cfg, router_url)
    out = ["local.enabled=false", f"policy.router_url={router_url}"]
    for section in ("user", "judge"):
        before, after = getattr(cfg.env, section), getattr(resolved.env, section)
        for key in ("base_url", "model", "api_key_env"):
            value = getattr(after, key)
            if getattr(before, key) != value:
                out.append(f"env.{section}.{key}={'null' if value is None else value}")
    return out


def shared_overrides(config: str | Path | None, overrides: Sequence[str] = (), *, stack: LocalStacks | LocalStack | None = None,
                     ray: SharedRay | None = None) -> list[str]:
    """The overrides that put a job of ``config`` with ``overrides`` (a CLI run, a trainer's
    driver, an in-process ``open_pool``) on the shared head (``ray``) and a shared local stack
    (``stack``: the pool of them, which picks the job's kind, or one stack), to go after its own.

    Raises:
        ValueError: a stack for a job that starts none (``local.enabled=false``), or a given stack
            of another kind than the job's.
    """
    extra: list[str] = []
    if stack is not None:
        cfg = _load(config, overrides)
        if not cfg.local.enabled:
            raise ValueError("the run starts no local stack (local.enabled=false): pass no stack")
        if isinstance(stack, LocalStacks):
            stack = stack.for_config(cfg)
        elif LocalStacks.kind(stack.local, stack.domain, stack.tokenizer, stack.chat_format) != LocalStacks.kind(
                cfg.local, domain_key(cfg.env.benchmark, cfg.env.domain), cfg.policy.tokenizer, cfg.policy.chat_format):
            raise ValueError("the given stack is not of the run's kind (its local section, domain, tokenizer or chat format)")
        extra += stack_overrides(cfg, stack.router_url)
    if ray is not None:
        extra.append(ray.override())
    return extra


def command(args: Sequence[str], *, stack: LocalStacks | LocalStack | None = None, ray: SharedRay | None = None) -> list[str]:
    """``python -m rollout ARGS`` as an argv, on the shared head and a shared stack
    (:func:`shared_overrides`; ``ARGS`` a ``run``/``eval`` when either is given).

    Raises:
        ValueError: as :func:`shared_overrides`, or a stack or a head for a command that starts no pool.
    """
    extra = shared_overrides(*job_args(args), stack=stack, ray=ray) if stack is not None or ray is not None else []
    return [sys.executable, "-m", "rollout", *args, *extra]


def run_cli(args: Sequence[str], *, stack: LocalStacks | LocalStack | None = None, ray: SharedRay | None = None,
            env: dict[str, str] | None = None, timeout: float = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run ``python -m rollout ARGS`` (:func:`command`) to its end; its output captured as text.

    Args:
        env: the subprocess's environment (default :func:`cli_env`).
        timeout: seconds (``subprocess.TimeoutExpired`` after).
    """
    return subprocess.run(command(args, stack=stack, ray=ray), cwd=cwd, env=cli_env() if env is None else env,
                          capture_output=True, text=True, timeout=timeout)
