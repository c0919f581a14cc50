"""``python -m rollout``: see :mod:`rollout.cli`."""

import sys

from rollout.cli import main

sys.exit(main())
