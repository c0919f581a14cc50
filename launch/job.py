"""Entry point of the rollout job on a Ray cluster (what ``ray job submit`` runs).

Under ``ray job submit`` the variable ``RAY_ADDRESS`` points at the cluster, so the pool connects
to it instead of starting a local Ray. Arguments are those of ``python -m rollout run``::

    python launch/job.py --config configs/retail_grpo.yaml pool.num_actors=32

The job's working directory is Ray's copy of the project on the head (under Ray's session
folder), so a relative ``rollout.output_dir`` lands there, not where the job was submitted from:
the job warns about one, and prints the absolute paths of the files it wrote. Name an absolute
folder (shared storage on a cluster).
"""

from __future__ import annotations

import os
import sys

# Ray uploads the working directory and runs the job from it; make the package importable even
# when the cluster's environment has only the dependencies installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollout.app.cli import main  # noqa: E402
from rollout.core import uptime  # noqa: E402
from rollout.core.pipes import pipe_safe  # noqa: E402

if __name__ == "__main__":
    sys.exit(pipe_safe(lambda: main(["run", "--no-progress", *sys.argv[1:]], started_at=uptime.STARTED_AT, job=True)))
