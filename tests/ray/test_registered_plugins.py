"""A sample mode and a context strategy of the test suite's own (tests/support/toy_plugins.py),
registered with ``rollout.register_sample_mode`` / ``rollout.register_context_strategy`` and
selected by name in YAML, run on the Ray pool through the trainer API (``open_pool`` +
``collect_groups``) against the local stack, and both used: the strategy compacts in the actors,
the mode shapes the samples in the driver.

The registration is made by path in the driver and reaches the actors through the pool
(``rollout.core.registry.registered_paths`` -> each actor's ``restore_paths``). The module the path
names must be importable in the actors' processes as well: the driver runs in a process of its
own with ``tests/`` on its ``PYTHONPATH``, and its job on the session's shared Ray head has that
``PYTHONPATH`` as its runtime environment (``support.shared_ray.job_env``, Ray's way of handing a
submitted job's environment to its driver), so that its actors find the module as a user's plugin
module on ``PYTHONPATH`` (or an installed package) is found. (The head's own workers do not have
``tests/`` on their path: tests/ray/test_shared_head.py.) The local stack is the session's airline one.

Airline tasks 2, 14, 17 and 22 with gold replay grow past a 6000-token context (the first prompt
alone is about 4.9k tokens), as in tests/e2e/test_context_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli_env, stack_overrides
from support.shared_ray import job_env

from rollout.core.config import load_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
BUDGET = 6000
CONFIG = f"""\
pool:
  num_actors: 1
  max_concurrent_episodes: 4
  num_cpus_per_actor: 0.5
policy:
  max_context_tokens: {BUDGET}
  context_headroom_tokens: 256
  context_strategy: toy_compact
env:
  domain: airline
  task_split: base
  task_ids: [2, 14, 17, 22]
rollout:
  n_samples_per_task: 1
  sample_mode: toy_last_segment
local:
  enabled: true
  backend: gold_replay
"""

DRIVER = """
import json, sys
from rollout import load_config, open_pool, register_context_strategy, register_sample_mode
from rollout.core.context import DROPPED_TOOL_RESULT
from rollout.core.tokenizer import load_tokenizer
from support.toy_plugins import TOY_MARKER

register_sample_mode("toy_last_segment", "support.toy_plugins:ToyLastSegment")
register_context_strategy("toy_compact", "support.toy_plugins:ToyCompaction")
cfg = load_config(sys.argv[1], ["rollout.output_dir=" + sys.argv[2]] + sys.argv[3:])
with open_pool(cfg) as (cfg, pool, task_ids):
    groups = pool.collect_groups(len(task_ids), iter(task_ids), abort_surplus=False)
tok = load_tokenizer(cfg.policy.tokenizer)
rows = []
for s in (s for g in groups for s in g):
    text = tok.decode(s.tokens)
    rows.append({"episode_id": s.episode_id, "status": str(s.status), "compactions": s.metadata["compactions"],
                 "toy_segments": s.metadata.get("toy_segments"), "tokens": len(s.tokens),
                 "toy_marker": TOY_MARKER in text, "builtin_marker": DROPPED_TOOL_RESULT in text})
print("ROWS " + json.dumps(rows))
"""


def test_a_registered_sample_mode_and_context_strategy_selected_in_yaml_run_on_the_ray_pool(tmp_path, airline_stack, shared_ray):
    config = tmp_path / "toy.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "run"
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = job_env(cli_env(PYTHONPATH=path), {"env_vars": {"PYTHONPATH": path}})
    # the YAML names no user simulator or judge: their endpoints resolve as the default config's (this
    # process cannot load the YAML itself: the toy names are registered in the driver only)
    shared = stack_overrides(load_config(None, ["local.enabled=true"]), airline_stack.router_url) + [shared_ray.override()]
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(config), str(out), *shared], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("ROWS "))[5:])
    # the sample mode shaped the samples (in the driver): one per episode, its last segment, tagged
    assert len(rows) == 4 and len({r["episode_id"] for r in rows}) == 4, rows
    assert all(r["toy_segments"] is not None and r["tokens"] <= BUDGET for r in rows), rows
    # the context strategy compacted (in the actor): a compacted episode's last segment opens with
    # the conversation the toy strategy wrote, whose tool results are its marker, not a built-in's
    compacted = [r for r in rows if r["compactions"] > 0]
    assert len(compacted) >= 2, rows
    assert all(r["toy_marker"] and not r["builtin_marker"] and r["toy_segments"] >= 2 for r in compacted), rows
    # where trajectory would give one sample per segment, the toy mode gave one per episode
    assert sum(r["toy_segments"] for r in rows) > len(rows), rows
