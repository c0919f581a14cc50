"""The Ray cluster the actors run on: whether they fit it (:func:`fit_problem`, checked before any
actor is created, and :func:`start_timeout_line`, the actors' start-up deadline), and the
addresses of a new local cluster (:func:`loopback_only`).

Ray queues an actor that no node can place and waits for ever, saying nothing; a driver that
asks for 100000 actors keeps making them. So the pool compares what it asks for
(``pool.num_actors`` actors of ``pool.num_cpus_per_actor`` CPUs each, the only resource an actor
asks for) with the CPUs of the cluster's nodes, node by node (an actor runs on one node), before
it creates any actor, and gives the actors ``pool.actor_start_timeout_s`` to be ready (what is
free can be taken by another job, and an autoscaling cluster grows in minutes). A cluster whose
autoscaler reports its largest size to Ray (``ray._private.state``'s cluster config; KubeRay does)
is checked against that size; one that does not is checked against the nodes it has now.

A new local cluster (``ray.init`` with no cluster to join) listens on the machine's address on
every interface by default: its GCS, raylet, object manager and workers' gRPC ports, its agents'
ports and its Prometheus export, without authentication for the export. Ray binds all of them to
the loopback address when the node's address is a loopback one, which ``ray.init`` only allows
when Ray is told the machine runs no multi-node cluster (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
read from Ray's constants): :func:`loopback_only` says so while the cluster starts, and its
processes inherit it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["LOOPBACK", "actors_that_fit", "autoscaling_node_groups", "fit_problem", "loopback_only", "node_cpus", "start_timeout_line"]

LOOPBACK = "127.0.0.1"
#: Ray's resource quantities are multiples of 1/10000: a per-actor share that divides a node's CPUs
#: exactly must not lose an actor to rounding.
_EPS = 1e-4

KEYS = "pool.num_actors x pool.num_cpus_per_actor"


def actors_that_fit(node_cpus: Sequence[float], cpus_per_actor: float) -> float:
    """How many actors of ``cpus_per_actor`` CPUs each the nodes hold at most (each node holds
    ``floor(its CPUs / cpus_per_actor)``); ``math.inf`` for actors that ask for no CPU."""
    if cpus_per_actor <= 0:
        return math.inf
    return sum(math.floor((c + _EPS) / cpus_per_actor) for c in node_cpus if c > 0)


def fit_problem(num_actors: int, cpus_per_actor: float, node_cpus: Sequence[float],
                node_groups: Sequence[tuple[float, int]] | None = None, local: bool = False) -> str | None:
    """Why ``num_actors`` actors of ``cpus_per_actor`` CPUs each can never all run on the cluster
    (one line naming the keys and the cluster's CPUs), or ``None`` when they can.

    Args:
        num_actors: ``pool.num_actors``.
        cpus_per_actor: ``pool.num_cpus_per_actor``.
        node_cpus: the CPUs of each live node now.
        node_groups: the cluster's largest size when its autoscaler reports one, as ``(CPUs of a
            node, most nodes)`` per node type (most nodes -1: no bound); ``None``: not reported
            (the nodes it has now are all it has).
        local: the cluster is the new local one the pool started (it cannot grow).
    """
    fits = actors_that_fit(node_cpus, cpus_per_actor)
    if node_groups is not None:
        if any(n < 0 and c >= cpus_per_actor for c, n in node_groups):
            return None
        fits = max(fits, actors_that_fit([c for c, n in node_groups for _ in range(n)], cpus_per_actor))
    if num_actors <= fits:
        return None
    total = sum(node_cpus)
    largest = max(node_cpus, default=0.0)
    if local:
        where = f"the new local Ray cluster has this machine's {total:g} CPUs"
    elif node_groups is None:
        where = f"the Ray cluster has {total:g} CPUs on {len(node_cpus)} node(s), {largest:g} on the largest"
    else:
        where = f"the Ray cluster grows to at most {sum(c * n for c, n in node_groups):g} CPUs (its autoscaler's largest size)"
    room = "no actor" if fits == 0 else f"at most {fits:g} actor(s)"
    grow = "" if local or node_groups is not None else " (an autoscaling cluster that does not report its largest size to Ray: add its nodes first)"
    return (f"{KEYS} = {num_actors} x {cpus_per_actor:g} CPUs: {where}, room for {room}; lower pool.num_actors or "
            f"pool.num_cpus_per_actor{grow}")


def start_timeout_line(timeout_s: float, num_actors: int, ready: int, cpus_per_actor: float, free_cpus: float | None) -> str:
    """The one line when ``num_actors - ready`` actors were not ready ``timeout_s`` seconds after
    they were created (``free_cpus``: the cluster's CPUs free then, ``None``: unknown)."""
    free = "" if free_cpus is None else f"; {free_cpus:g} CPUs of the Ray cluster are free now"
    return (f"{num_actors - ready} of {num_actors} rollout actor(s) not ready within pool.actor_start_timeout_s={timeout_s:g} s "
            f"({KEYS} = {num_actors} x {cpus_per_actor:g} CPUs{free}): the cluster's CPUs are taken by other work, or an actor's "
            "start-up is slow (a busy machine, a large tokenizer); an autoscaling cluster may need longer: raise "
            "pool.actor_start_timeout_s, or lower pool.num_actors or pool.num_cpus_per_actor")


def node_cpus() -> list[float]:
    """The CPUs of each live node of the connected Ray cluster (``ray.nodes()``)."""
    import ray

    return [float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]


def autoscaling_node_groups() -> list[tuple[float, int]] | None:
    """``(CPUs of a node, most nodes)`` per node type of the connected cluster's autoscaler, when
    it reports its configuration to Ray (KubeRay does; Ray Train reads the same); ``None`` when it
    does not, or this Ray cannot say."""
    try:
        from ray._private.state import state

        config: Any = state.get_cluster_config()
    except Exception as e:  # noqa: BLE001  (a private API: another Ray may lack it)
        logger.debug("no autoscaling configuration: %r", e)
        return None
    if config is None or not config.node_group_configs:
        return None
    return [(float(g.resources.get("CPU", 0)), int(g.max_count)) for g in config.node_group_configs]


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While the block runs (a new local cluster's ``ray.init``), Ray takes this machine for a
    single-node one: the node's address is :data:`LOOPBACK` and every Ray process started then
    binds its ports there (they inherit ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``); afterwards the
    variable and Ray's constant are as they were."""
    from ray._private import ray_constants

    var = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    before_env, before_const = os.environ.get(var), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[var] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = before_env
