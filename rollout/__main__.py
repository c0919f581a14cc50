"""``python -m rollout``: see :mod:`rollout.app.cli`."""

from rollout.app.cli import cli

cli()
