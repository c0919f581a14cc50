"""``python -m rollout``: see :mod:`rollout.app.cli`."""

import sys

from rollout.app.cli import main

sys.exit(main())
