"""Test stand-in for sierra-research/tau-bench (see ``tests/support/tau_bench_standin/README.md``).

Same module layout and interface as tau-bench's repository; none of its code or data.
"""

from tau_bench.envs.base import Env as Env
