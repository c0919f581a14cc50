"""``python -m rollout.check exactness ...``: the exactness check (:mod:`rollout.devtools.check`)."""

import sys

from rollout.core.pipes import pipe_safe
from rollout.devtools.check import main

if __name__ == "__main__":
    sys.exit(pipe_safe(main))
