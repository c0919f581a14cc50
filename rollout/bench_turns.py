"""``python -m rollout.bench turns``: per-turn tokenization against the seed's full re-render. (Being written.)"""

from __future__ import annotations


def add_parser(sub) -> None:
    """Add the ``turns`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = sub.add_parser("turns", help="per-turn tokenization against the seed's full re-render")
    p.set_defaults(run=None)
