"""``python -m rollout.bench ...``: the benchmarks (:mod:`rollout.devtools.bench`)."""

import sys

from rollout.core.pipes import pipe_safe
from rollout.devtools.bench import main

if __name__ == "__main__":
    sys.exit(pipe_safe(main))
