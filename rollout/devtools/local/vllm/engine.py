"""``local.backend=vllm`` as the wiring's engine (registered as ``vllm`` in
:data:`rollout.core.engines.ENGINES`): a checkpoint, ``local.num_servers`` vLLM servers and
vllm-router, started before the pool and stopped after it (:class:`VllmEngine`)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from rollout.core.config import Config, ConfigError, LocalConfig
from rollout.core.engines import EngineJob
from rollout.core.startup import PreflightError, importable
from rollout.devtools.local.vllm.checkpoint import checkpoint_problem, write_checkpoint
from rollout.devtools.local.vllm.processes import free_port, vllm_missing
from rollout.devtools.local.vllm.stack import VllmStack

__all__ = ["VllmEngine", "USER_MODEL_ALIAS"]

logger = logging.getLogger(__name__)

USER_MODEL_ALIAS = "local"  # the llm user's model name when none is given (rollout.app.wiring.resolve_endpoints)


def checkpoint_path(local: LocalConfig, tokenizer: str) -> Path:
    """Where ``local.vllm``'s written checkpoint goes: ``<checkpoint_dir>/<vocabulary>-seed<seed>``
    (``local.vllm.model`` when set)."""
    if local.vllm.model:
        return Path(local.vllm.model).expanduser()
    vocab = tokenizer.removeprefix("builtin:").replace("/", "_")
    return Path(local.vllm.checkpoint_dir).expanduser() / f"{vocab}-seed{local.vllm.seed}"


class VllmEngine:
    """The real vLLM on the CPU behind vllm-router, for ``local.backend=vllm``
    (:class:`rollout.core.engines.EngineKind`; the config section is ``local``: ``num_servers``,
    ``host``, ``router_port``, ``weight_version`` and ``local.vllm.*``).

    :meth:`start` writes the checkpoint (unless ``local.vllm.model`` names one), starts the servers
    together, gives each ``local.weight_version`` (vLLM starts at ``default``), then the router.
    The servers answer to ``local.vllm.served_model_name`` and to ``local`` (the llm user's default
    model name). :attr:`stack` is the running :class:`VllmStack` (kill and restart servers there).

    Args:
        local: the ``local`` section.
        job: the job's facts; ``job.tokenizer`` is the vocabulary of the written checkpoint.
    """

    section = "local"

    def __init__(self, local: LocalConfig, job: EngineJob):
        if not local.router_port:
            local = dataclasses.replace(local, router_port=free_port(local.host))
        self.local = local
        self.job = job
        self.router_url = f"http://{local.host}:{local.router_port}"
        self.stack: VllmStack | None = None

    @staticmethod
    def check_config(cfg: Config) -> None:
        """Without ``local.vllm.model`` the checkpoint is written for ``policy.tokenizer``, which
        must then be a built-in vocabulary (``builtin:<name>``).

        Raises:
            rollout.core.config.ConfigError: one line naming the key.
        """
        if not cfg.local.vllm.model and not cfg.policy.tokenizer.startswith("builtin:"):
            raise ConfigError(f"policy.tokenizer: local.backend=vllm writes a random-weight checkpoint for a built-in vocabulary "
                              f"(builtin:qwen3, builtin:qwen3.6, ...), got {cfg.policy.tokenizer!r}; or set local.vllm.model "
                              f"to a checkpoint folder")

    @staticmethod
    def check_modules(cfg: Config) -> None:
        """vLLM and vllm-router in their venv (looked up on disk), and torch here to write the checkpoint.

        Raises:
            rollout.core.startup.PreflightError: one line with the install command.
        """
        why = vllm_missing(cfg.local.vllm.python)
        if why:
            raise PreflightError(f"local.backend=vllm: {why}")
        if not cfg.local.vllm.model and not importable("torch"):
            raise PreflightError("local.backend=vllm writes its checkpoint with torch, which is not installed here: "
                                 "pip install 'tau-rollout[tiny]' (torch==2.13.0 is the CPU build), or set local.vllm.model")

    def checkpoint(self) -> Path:
        """The checkpoint the servers start from: ``local.vllm.model``, or the one written now (kept
        when it already holds the same spec).

        Raises:
            RuntimeError: ``local.vllm.model`` is not a checkpoint folder.
        """
        path = checkpoint_path(self.local, self.job.tokenizer)
        if self.local.vllm.model:
            why = checkpoint_problem(path)
            if why:
                raise RuntimeError(f"local.vllm.model: {why}")
            return path
        return write_checkpoint(path, seed=self.local.vllm.seed, tokenizer=self.job.tokenizer)

    def start(self) -> VllmStack:
        """Write the checkpoint, start the servers and the router; return once every server is
        listed healthy by the router (blocking; minutes on a loaded 2-core machine).

        Raises:
            RuntimeError: as :meth:`VllmStack.start` (everything started is stopped first).
        """
        v = self.local.vllm
        self.stack = VllmStack(
            self.checkpoint(), python=v.python, num_servers=self.local.num_servers, log_dir=self.job.log_dir,
            host=self.local.host, router_port=self.local.router_port, router_policy=str(v.router_policy),
            startup_timeout_s=v.startup_timeout_s, weight_version=str(self.local.weight_version),
            served_model_name=v.served_model_name, aliases=[USER_MODEL_ALIAS], max_model_len=v.max_model_len,
            kv_cache_gib=v.kv_cache_gib, num_gpu_blocks=v.num_gpu_blocks, extra_args=list(v.extra_args))
        return self.stack.start()

    def stop(self) -> None:
        """Stop what :meth:`start` started (idempotent)."""
        if self.stack is not None:
            self.stack.stop()
