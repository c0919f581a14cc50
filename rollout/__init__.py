"""tau-rollout: a Ray-distributed rollout actor pool producing exact tau-bench training data.

Importing this package has no side effects; Ray is imported only by :mod:`rollout.pool` and
``launch/`` (DESIGN.md invariant 6).
"""

__version__ = "0.1.0"
