"""``python -m rollout.bench ...``: the benchmarks (:mod:`rollout.devtools.bench`)."""

import sys

from rollout.devtools.bench import main

if __name__ == "__main__":
    sys.exit(main())
