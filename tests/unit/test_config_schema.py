"""The schema read as data (rollout.core.config.schema_keys): every key has its type, default and doc
beside it, docs/configuration.md names exactly the schema's keys with the schema's defaults (so the
two cannot drift), ``python -m rollout config --keys`` prints them, and each section's rules sit on
the section (``problems()``) with the rules between sections in rollout.core.config.rules."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from rollout.app.cli import main as cli_main
from rollout.core.config import (
    Config,
    EnvConfig,
    LocalConfig,
    PolicyConfig,
    PoolConfig,
    RolloutConfig,
    SamplingConfig,
    cross_section_problems,
    schema_keys,
    setting,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs/configuration.md"
# docs rows whose default column says in words what the schema holds as a value
DEFAULT_IN_WORDS = {"rollout.train_statuses": "policy outcomes"}


def _leaf_names(cls: type = Config, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        value = getattr(cls(), f.name)
        out += _leaf_names(type(value), f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [f"{prefix}{f.name}"]
    return out


def _documented_rows() -> dict[str, str]:
    """``{key: its default cell}`` from docs/configuration.md's table, whose key cells are one key
    (`pool.num_actors`), keys of one parent (`policy.sampling.{temperature,top_p}`), or several
    joined by " / " (`env.user.base_url` / `model`: a bare name is the first key's sibling), their
    defaults joined the same way (or one default for all)."""
    rows: dict[str, str] = {}
    for line in DOCS.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        key_cell, default_cell = (c.strip() for c in line.strip("|").split(" | ")[:2])
        braced = re.fullmatch(r"`([\w.]+)\.\{([\w,]+)\}`", key_cell)
        if braced:
            keys, defaults = [f"{braced[1]}.{k}" for k in braced[2].split(",")], default_cell.split(", ")
        else:
            parts = [p.strip("`") for p in key_cell.split(" / ")]
            parent = parts[0].rsplit(".", 1)[0]
            keys = [p if "." in p else f"{parent}.{p}" for p in parts]
            defaults = default_cell.split(" / ") if len(keys) > 1 else [default_cell]
        defaults = defaults * len(keys) if len(defaults) == 1 else defaults  # one default for all the row's keys
        assert len(defaults) == len(keys), f"docs/configuration.md: {key_cell} has {len(defaults)} defaults for {len(keys)} keys"
        for key, default in zip(keys, defaults):
            assert key not in rows, f"docs/configuration.md documents {key} twice"
            rows[key] = default.strip()
    return rows


def _as_value(cell: str):
    text = cell.strip("`")
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word: uvloop, INFO, outputs/run


def test_every_key_has_its_type_default_and_doc_beside_it():
    keys = schema_keys()
    assert [k.name for k in keys] == _leaf_names() and len(keys) == 126
    assert len([k for k in keys if k.name.startswith("local.")]) == 34  # the local stack's (11 of them local.vllm)
    for k in keys:
        assert len(k.doc.split()) >= 2 and k.doc.endswith("."), (k.name, k.doc)  # a sentence, not a placeholder
    by_name = {k.name: k for k in keys}
    assert (by_name["pool.num_actors"].type_text(), by_name["pool.num_actors"].default) == ("int", 2)
    assert by_name["policy.on_length"].type_text() == "truncate | keep" and by_name["policy.on_length"].default == "truncate"
    assert by_name["rollout.filter_groups"].type_text() == "zero_variance | null" and by_name["rollout.filter_groups"].nullable
    assert by_name["env.task_ids"].type_text() == "list[str] | null"
    assert by_name["policy.sampling.stop"].default == ["</tool_call>"]
    assert (by_name["policy.engine"].type_text(), by_name["policy.engine"].default) == ("str", "sglang")  # a registered name


def test_docs_configuration_md_names_exactly_the_schemas_keys_with_its_defaults():
    rows = _documented_rows()
    schema = {k.name: k.default for k in schema_keys()}
    assert sorted(set(schema) - set(rows)) == [], "keys of the schema missing from docs/configuration.md"
    assert sorted(set(rows) - set(schema)) == [], "keys in docs/configuration.md that the schema lacks"
    for key, default in schema.items():
        if key in DEFAULT_IN_WORDS:
            assert rows[key] == DEFAULT_IN_WORDS[key]
            continue
        documented = _as_value(rows[key])
        assert documented == default or (isinstance(default, str) and str(documented) == default), (key, rows[key], default)


def test_the_cli_prints_every_key_with_its_type_default_and_doc(capsys):
    assert cli_main(["config", "--keys"]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if not line.startswith("    ")]
    assert [h.split("  (")[0] for h in heads] == [f"{k.name}: {k.type_text()} = {json.dumps(k.default)}" for k in schema_keys()]
    assert "pool.num_actors: int = 2  (>= 1)\n    Ray rollout actors.\n" in out
    assert "policy.sampling.top_p: float = 1.0  (in (0, 1])\n" in out and "pool.ray_address: str | null = null\n" in out
    with pytest.raises(SystemExit) as e:
        cli_main(["config", "--keys", "pool.num_actors=3"])
    assert e.value.code == 2


def test_a_key_needs_a_doc_and_a_list_default_is_not_shared():
    with pytest.raises(ValueError, match="doc"):
        setting(1, doc=" ")

    @dataclasses.dataclass
    class Section:
        names: list[str] = setting(["a"], doc="""
            Names,
            one per line.""")
        bare: int = 0

    one, two = Section(), Section()
    one.names.append("b")
    assert two.names == ["a"] and dataclasses.fields(Section)[0].metadata["doc"] == "Names, one per line."
    with pytest.raises(ValueError, match="^bare: a config key without a doc"):
        schema_keys(Section)


@pytest.mark.parametrize("section, change, key", [
    (EnvConfig, {"max_steps": 0}, "env.max_steps"),
    (PoolConfig, {"gil_switch_interval_ms": 0.0}, "pool.gil_switch_interval_ms"),
    (PolicyConfig, {"context_headroom_tokens": 0}, "policy.context_headroom_tokens"),
    (SamplingConfig, {"top_k": 0}, "policy.sampling.top_k"),
    (RolloutConfig, {"train_statuses": ["completed", "bogus"]}, "rollout.train_statuses"),
    (LocalConfig, {"num_servers": 0}, "local.num_servers"),
])
def test_each_section_checks_its_own_rules(section, change, key):
    assert list(section().problems()) == []
    assert [k for k, _ in dataclasses.replace(section(), **change).problems()] == [key]


def test_the_rules_between_sections_name_the_key_to_set():
    cfg = Config()  # no router and the local stack off
    assert [k for k, _ in cross_section_problems(cfg.env, cfg.policy, cfg.rollout, cfg.local)] == ["policy.router_url"]
    cfg.local.enabled = True
    assert list(cross_section_problems(cfg.env, cfg.policy, cfg.rollout, cfg.local)) == []
    cfg.policy.history = "rerender"
    assert [k for k, _ in cross_section_problems(cfg.env, cfg.policy, cfg.rollout, cfg.local)] == ["rollout.sample_mode"]
    cfg.policy.history, cfg.local.enabled, cfg.policy.router_url = "append", False, "http://r:1"
    cfg.env.user.kind, cfg.env.user.model = "llm", "m"
    assert [k for k, _ in cross_section_problems(cfg.env, cfg.policy, cfg.rollout, cfg.local)] == ["env.user.base_url"]
