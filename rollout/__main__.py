"""``python -m rollout``: see :mod:`rollout.app.cli`."""

from rollout.app.cli import exit_process, main

exit_process(main())
