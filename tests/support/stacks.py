"""Local stacks shared by a test process's tests: one per kind, started on first use, stopped at the
end of the session (the ``local_stacks`` fixture, ``tests/conftest.py``).

A stack's kind is everything that changes what its servers answer: the ``local`` section (backend,
servers, weight version, latency, KV model, tiny model...; not ``enabled``, ``router_port`` or
``startup_timeout_s``) and the job's facts the engine is given (``rollout.core.engines.EngineJob``:
the benchmark's domain, ``policy.tokenizer``, ``policy.chat_format``). Two tests asking for the same
kind get the same stack; its servers keep no state between calls that a test could see (gold replay
is a function of the request; the tiny model's weights change only through a weight update). A test
that changes a stack's state (a weight update, a server killed, a router restarted, an API key)
starts one of its own (module scope at most), as ``two_servers`` does.

Each xdist worker has its own (a stack's servers share the fate of the process that started them,
and a worker ends as soon as it has no more files to run). At most :data:`KEEP` of them stay up
besides the pinned ones (a session fixture's, e.g. ``retail_stack``): the least recently used is
stopped when one more starts, so that a file that runs a job per vocabulary does not leave a dozen
idle servers behind for the rest of the session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import urllib.request
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from rollout.core.choices import LocalBackend
from rollout.core.config import Config, LocalConfig
from rollout.core.environment import domain_key
from rollout.devtools.local.stack import LocalStack

# `local` keys that do not change what the servers answer
_NOT_KIND = ("enabled", "router_port", "startup_timeout_s")
KEEP = 4  # unpinned stacks kept up at once


class LocalStacks:
    """The process's shared local stacks, by kind.

    Args:
        log_root: the folder under which each stack's logs go (``stack-<n>/``).
    """

    def __init__(self, log_root: Path) -> None:
        self.log_root = Path(log_root)
        self._stacks: OrderedDict[str, LocalStack] = OrderedDict()  # least recently used first
        self._pinned: set[str] = set()
        self._made = 0

    @staticmethod
    def kind(local: LocalConfig, domain: str, tokenizer: str, chat_format: str) -> str:
        """The key two runs share a stack by (JSON of the fields that matter)."""
        fields = {k: v for k, v in dataclasses.asdict(local).items() if k not in _NOT_KIND}
        return json.dumps({"local": fields, "domain": domain, "tokenizer": tokenizer, "chat_format": str(chat_format)},
                          sort_keys=True, default=str)

    def get(self, backend: str = "gold_replay", domain: str = "retail", *, tokenizer: str = "builtin:qwen3",
            chat_format: str = "auto", pin: bool = False, **local: object) -> LocalStack:
        """The shared stack of this kind, started now if it is the first ask.

        Args:
            backend: ``local.backend`` (not ``vllm``: that is the ``vllm_stack`` fixture).
            domain: the gold-replay servers' domain (``rollout.core.environment.domain_key``).
            pin: keep it up to the end of the session (for a session fixture that hands it out).
            local: other ``local`` keys (``num_servers=2``, ``tiny=TinyModelConfig(...)``...).
        """
        return self._get(LocalConfig(enabled=True, backend=LocalBackend(backend), **local), domain, tokenizer, chat_format, pin)

    def for_config(self, cfg: Config) -> LocalStack:
        """The shared stack a run of ``cfg`` would start for itself with ``local.enabled=true``.

        Raises:
            ValueError: the run asks for what no shared stack gives: the vLLM backend (the
                ``vllm_stack`` fixture) or an API key (``policy.api_key_env``: a test's own stack).
        """
        if cfg.local.backend == LocalBackend.VLLM:
            raise ValueError("local.backend=vllm: use the vllm_stack fixture, not a shared local stack")
        if cfg.policy.api_key_env:
            raise ValueError("policy.api_key_env: a stack that requires a key is a test's own (local.enabled=true)")
        return self._get(cfg.local, domain_key(cfg.env.benchmark, cfg.env.domain), cfg.policy.tokenizer, cfg.policy.chat_format)

    def _get(self, local: LocalConfig, domain: str, tokenizer: str, chat_format: str, pin: bool = False) -> LocalStack:
        key = self.kind(local, domain, tokenizer, chat_format)
        stack = self._stacks.get(key)
        if stack is None:
            log_dir = self.log_root / f"stack-{self._made}"
            self._made += 1
            stack = LocalStack(local, domain, tokenizer, log_dir=log_dir, chat_format=str(chat_format))
            stack.start()
            (log_dir / "kind.json").write_text(key)  # which stack this is, beside its logs
            self._stacks[key] = stack
        self._stacks.move_to_end(key)
        if pin:
            self._pinned.add(key)
        unpinned = [k for k in self._stacks if k not in self._pinned and k != key]
        for old in unpinned[:max(0, len(unpinned) + (key not in self._pinned) - KEEP)]:
            self._stacks.pop(old).stop()
        return stack

    def started(self) -> int:
        """How many stacks this process started (stopped ones included)."""
        return self._made

    def close(self) -> None:
        """Stop every stack."""
        for stack in self._stacks.values():
            stack.stop()
        self._stacks.clear()


@contextlib.contextmanager
def versions_kept(stack: LocalStack) -> Iterator[None]:
    """Put every worker of a shared gold-replay ``stack`` back on the weight version it serves now,
    when the block ends (a test that updates a shared stack's weights: a gold-replay server loads
    nothing on an update, only its version changes)."""
    before = {}
    for u in stack.worker_urls:
        with urllib.request.urlopen(u + "/get_server_info", timeout=30) as r:
            before[u] = str(json.loads(r.read())["weight_version"])
    try:
        yield
    finally:
        for u, version in before.items():
            req = urllib.request.Request(u + "/update_weights_from_disk", json.dumps({"model_path": "reset", "weight_version": version}).encode(),
                                         {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()
