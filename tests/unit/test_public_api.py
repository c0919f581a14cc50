"""The public API: ``rollout.__all__`` names what a trainer imports, each resolves, and importing
the package imports neither Ray nor tau2 (they load with the names that need them)."""

from __future__ import annotations

import subprocess
import sys


def test_every_public_name_resolves_to_what_the_layers_define():
    import rollout
    from rollout.app.wiring import open_pool
    from rollout.core.config import load_config
    from rollout.core.groups import Excluded
    from rollout.core.pool import RolloutPool, RunAborted

    assert {"load_config", "Config", "RolloutPool", "EpisodeSpec", "TrainingSample", "Batch", "Excluded", "EpisodeStatus", "RunAborted",
            "RunInterrupted", "NoHealthyActorError", "RayHeadLostError", "open_pool"} <= set(rollout.__all__)
    for name in rollout.__all__:
        assert getattr(rollout, name) is not None, name
    assert (rollout.open_pool, rollout.load_config, rollout.Excluded, rollout.RolloutPool) == (open_pool, load_config, Excluded, RolloutPool)
    assert issubclass(rollout.NoHealthyActorError, RunAborted) and issubclass(rollout.RunInterrupted, RunAborted)


def test_the_four_register_functions_are_public_and_are_the_seams_own():
    import rollout
    from rollout.core.context import register_context_strategy
    from rollout.core.environment import register_benchmark
    from rollout.core.export import register_sample_mode
    from rollout.core.formats.registry import register_chat_format

    assert {"register_benchmark", "register_chat_format", "register_sample_mode", "register_context_strategy"} <= set(rollout.__all__)
    assert (rollout.register_benchmark, rollout.register_chat_format, rollout.register_sample_mode, rollout.register_context_strategy) == (
        register_benchmark, register_chat_format, register_sample_mode, register_context_strategy)


def test_importing_the_package_loads_neither_ray_nor_tau2():
    code = ("import sys, rollout; rollout.load_config; rollout.TrainingSample; rollout.register_benchmark; rollout.register_chat_format; "
            "rollout.register_sample_mode; rollout.register_context_strategy; print(sorted(m for m in ('ray', 'tau2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
