"""``python -m rollout.devtools.chaos HELPER ...``: the bench's helper processes (the bench itself:
``python -m rollout.bench chaos``). ``cluster``: a Ray cluster of the bench's own
(:func:`rollout.devtools.chaos.cluster.cluster_main`); ``tmpfs``: a tmpfs held in a mount namespace
(:func:`rollout.devtools.chaos.faults_storage.tmpfs_main`); ``trainer``: a trainer of the bench's own
(:mod:`rollout.devtools.chaos.trainer`); ``user-sim``: a user simulator's model server
(:func:`rollout.devtools.chaos.servers.user_sim_main`)."""

import sys

from rollout.devtools.chaos.cluster import cluster_main
from rollout.devtools.chaos.faults_storage import tmpfs_main
from rollout.devtools.chaos.servers import user_sim_main
from rollout.devtools.chaos.trainer import trainer_main

USAGE = "usage: python -m rollout.devtools.chaos {cluster,tmpfs,trainer,user-sim} ...  (the bench: python -m rollout.bench chaos)"

if __name__ == "__main__":
    if sys.argv[1:2] == ["cluster"]:
        sys.exit(cluster_main(sys.argv[2:]))
    if sys.argv[1:2] == ["tmpfs"]:
        sys.exit(tmpfs_main(sys.argv[2:]))
    if sys.argv[1:2] == ["trainer"]:
        sys.exit(trainer_main(sys.argv[2:]))
    if sys.argv[1:2] == ["user-sim"]:
        sys.exit(user_sim_main(sys.argv[2:]))
    sys.exit(USAGE)
