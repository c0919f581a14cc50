"""The four registry-backed config keys (``env.benchmark``, ``policy.chat_format``,
``rollout.sample_mode``, ``policy.context_strategy``): a name registered with the public
``register_*`` functions (or declared by an installed package's entry point) is selectable from
YAML, and an unknown one is one line naming the key and listing the registered names. The same
toy plugins running on the Ray pool: tests/ray/test_registered_plugins.py."""

from __future__ import annotations

import asyncio
import sys

import pytest

import rollout
from rollout.core.config import ConfigError, load_config
from rollout.core.context import get_context_strategy
from rollout.core.export import get_exporter
from rollout.core.registry import registered_paths

TOY_PATHS = {
    "benchmark": ("toy_bench", "rollout.benchmarks.tau2.environment:load_benchmark", rollout.register_benchmark),
    "chat_format": ("toy_hermes", "rollout.core.formats.registry:hermes_format", rollout.register_chat_format),
    "sample_mode": ("toy_last_segment", "support.toy_plugins:ToyLastSegment", rollout.register_sample_mode),
    "context_strategy": ("toy_compact", "support.toy_plugins:ToyCompaction", rollout.register_context_strategy),
}


@pytest.fixture
def toys():
    """The toy names registered by path through ``rollout.register_*``, unregistered afterwards."""
    from rollout.core.registry import registries

    for name, path, register in TOY_PATHS.values():
        register(name, path)
    yield
    for seam, (name, _, _) in TOY_PATHS.items():
        registries()[seam].unregister(name)


def _yaml(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text("local:\n  enabled: true\n" + text)
    return path


def test_registered_names_are_selected_in_yaml_and_reach_the_actors_by_path(tmp_path, toys):
    from support.toy_plugins import ToyCompaction, ToyLastSegment

    cfg = load_config(_yaml(tmp_path, "env:\n  benchmark: toy_bench\npolicy:\n  chat_format: toy_hermes\n  context_strategy: toy_compact\n"
                                      "rollout:\n  sample_mode: toy_last_segment\n"))
    assert (cfg.env.benchmark, cfg.policy.chat_format, cfg.policy.context_strategy, cfg.rollout.sample_mode) == (
        "toy_bench", "toy_hermes", "toy_compact", "toy_last_segment")
    assert isinstance(get_exporter(cfg.rollout.sample_mode), ToyLastSegment)
    assert isinstance(get_context_strategy(cfg.policy.context_strategy), ToyCompaction)
    # registered by path: what the pool gives each actor (rollout.core.pool.actors)
    shipped = registered_paths()
    for seam, (name, path, _) in TOY_PATHS.items():
        assert shipped[seam][name] == path


@pytest.mark.parametrize("key, seam, builtins, also", [
    ("env.benchmark", "benchmark", ["tau2", "tau_bench"], ""),
    ("policy.chat_format", "chat_format", ["hermes", "qwen3.6", "qwen3.5", "deepseek-v4", "mistral"],
     "; or auto (detected from the tokenizer; python -m rollout formats)"),
    ("rollout.sample_mode", "sample_mode", ["trajectory", "per_turn", "merge_prefix"], ""),
    ("policy.context_strategy", "context_strategy", ["none", "drop_tool_results", "drop_oldest_turns"], "; or package.module:factory"),
])
def test_an_unknown_name_in_yaml_is_one_line_listing_the_registered_names(tmp_path, toys, key, seam, builtins, also):
    section, leaf = key.split(".")
    with pytest.raises(ConfigError) as e:
        load_config(_yaml(tmp_path, f"{section}:\n  {leaf}: toy_typo\n"))
    listed = ", ".join([*builtins, TOY_PATHS[seam][0]])  # the built-ins first, then the toy registered by the test
    assert str(e.value) == f"{key}: no {seam.replace('_', ' ')} 'toy_typo' is registered (registered: {listed}{also})"


def test_a_name_from_an_installed_packages_entry_point_is_selected_in_yaml(tmp_path, monkeypatch):
    """A package of one's own declares a sample mode and a context strategy as entry points (its
    ``*.dist-info`` on ``sys.path``, as ``pip install`` leaves it): YAML selects them with nothing
    registered by hand, the miss message lists them, and their module is imported only when used."""
    dist = tmp_path / "toyplugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tau_rollout.sample_modes]\nep_last_segment = toyplugins_ep:LastSegment\n\n"
                                           "[tau_rollout.context_strategies]\nep_compact = toyplugins_ep:Compaction\n")
    (tmp_path / "toyplugins_ep.py").write_text("from support.toy_plugins import ToyCompaction as Compaction, ToyLastSegment as LastSegment\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from rollout.core.context import CONTEXT_STRATEGIES
    from rollout.core.export import SAMPLE_MODES

    try:
        cfg = load_config(_yaml(tmp_path, "policy:\n  context_strategy: ep_compact\nrollout:\n  sample_mode: ep_last_segment\n"))
        assert "toyplugins_ep" not in sys.modules  # validated from metadata
        with pytest.raises(ConfigError, match=r"^rollout.sample_mode: no sample mode 'ep_typo' is registered \(registered: trajectory, "
                                              r"per_turn, merge_prefix, ep_last_segment\)$"):
            load_config(_yaml(tmp_path, "rollout:\n  sample_mode: ep_typo\n"))
        strategy = get_context_strategy(cfg.policy.context_strategy)
        assert type(strategy).__name__ == "ToyCompaction" and type(get_exporter(cfg.rollout.sample_mode)).__name__ == "ToyLastSegment"
    finally:
        for reg, name in ((CONTEXT_STRATEGIES, "ep_compact"), (SAMPLE_MODES, "ep_last_segment")):
            if name in reg.paths():
                reg.unregister(name)
        sys.modules.pop("toyplugins_ep", None)


def test_the_toy_strategy_compacts_and_the_toy_mode_keeps_the_last_segment():
    """What the Ray test asserts on, checked here on hand-made input."""
    from support.toy_plugins import TOY_MARKER, ToyCompaction

    from rollout.core.context import CompactionRequest

    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "x" * 400}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "y" * 50}]

    async def count(m):
        return sum(len(x.get("content") or "") for x in m)

    out = asyncio.run(ToyCompaction().compact(CompactionRequest("e", msgs, 200, count)))
    assert [m["content"] for m in out][3] == TOY_MARKER and out[5]["content"] == "y" * 50 and msgs[3]["content"] == "x" * 400
    assert asyncio.run(ToyCompaction().compact(CompactionRequest("e", msgs, 10, count))) is None  # still too long
