"""``python -m rollout.bench pool``: the main job against the local server with injected latency. (Being written.)"""

from __future__ import annotations


def add_parser(sub) -> None:
    """Add the ``pool`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("pool", help="the main job against the local server with injected latency")
    p.set_defaults(run=None)
