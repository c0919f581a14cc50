"""The child process of :class:`rollout.benchmarks.tau_bench.guards.TauBenchToolSandbox`.

Kept apart from :mod:`rollout.benchmarks.tau_bench.guards` so that the child (started with ``spawn``)
imports only the standard library, :mod:`rollout.core.fate` and the tau-bench tool classes it runs.
"""

from __future__ import annotations

import importlib
import os
import signal
from typing import Any


def child_main(conn, parent_pid: int, preload: list[str]) -> None:
    """Serve tool calls on ``conn`` until it closes.

    Protocol: the child sends ``"ready"`` once the classes in ``preload`` (``"module:QualName"``)
    are imported (tau-bench imports litellm: seconds, not counted against any call); then each
    request ``(class path, kwargs)`` is answered ``("ok", cls.invoke(data={}, **kwargs))`` or
    ``("exc", str(exception))``. The tools served here read no data, so they get an empty one.
    The process dies with its parent (``rollout.core.fate``: ``PR_SET_PDEATHSIG`` and a parent watch).
    """
    from rollout.core.fate import set_parent_death_signal, share_fate

    set_parent_death_signal(signal.SIGKILL)
    share_fate(parent_pid, on_parent_death=lambda: os._exit(1))
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    classes: dict[str, Any] = {}

    def load(path: str) -> Any:
        if path not in classes:
            module, _, qualname = path.partition(":")
            obj: Any = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            classes[path] = obj
        return classes[path]

    for path in preload:
        load(path)
    conn.send("ready")
    while True:
        try:
            path, kwargs = conn.recv()
        except EOFError:
            return
        try:
            reply = ("ok", load(path).invoke(data={}, **kwargs))
        except Exception as e:
            reply = ("exc", str(e)[:2000])
        conn.send(reply)
