"""``python -m rollout.bench env``: environment reset and reward: ours against tau2's path. (Being written.)"""

from __future__ import annotations


def add_parser(sub) -> None:
    """Add the ``env`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("env", help="environment reset and reward: ours against tau2's path")
    p.set_defaults(run=None)
