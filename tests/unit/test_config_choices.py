"""Typed config choices (rollout.core.choices), validation without I/O, and the preflight that
checks what validation cannot (rollout.app.preflight.check_config)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from rollout.app.cli import main as cli_main
from rollout.app.preflight import check_before_start, check_config
from rollout.core.choices import Choice, EventLoop, LogLevel, OnLength, PartialRollout
from rollout.core.config import Config, ConfigError, config_from_dict, load_config, validate
from rollout.core.eventloop import EVENT_LOOPS

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ["local.enabled=true"]  # a valid config without a router: the local stack's


def _choice_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, type[Choice], bool]]:
    """``(key, Choice enum, nullable)`` of every choice in the schema."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _choice_keys(tp, f"{prefix}{f.name}.")
            continue
        args = typing.get_args(tp)
        inner = next((a for a in args if a is not type(None)), tp) if args else tp
        if isinstance(inner, type) and issubclass(inner, Choice):
            out.append((f"{prefix}{f.name}", inner, type(None) in args))
    return out


CHOICES = _choice_keys()


def _get(cfg: Config, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def test_the_schema_declares_the_closed_choices_as_enums():
    keys = {k for k, _, _ in CHOICES}
    assert keys == {
        "env.user.kind", "env.judge.kind", "env.evaluator", "env.open_issues", "policy.on_parse_error", "policy.on_length", "local.backend",
        "logging.level", "logging.tau2_level", "rollout.partial_rollout", "rollout.on_stale", "rollout.filter_groups",
        "rollout.on_group_failure", "pool.event_loop", "local.event_loop", "policy.history",
        "policy.routing", "local.router_policy", "local.vllm.router_policy", "pool.adaptive_concurrency.signal", "pool.adaptive_concurrency.placement",
    }
    assert [k for k, _, nullable in CHOICES if nullable] == ["rollout.filter_groups"]
    assert EventLoop.values() == EVENT_LOOPS  # one list of loops (rollout.core.eventloop's)


@pytest.mark.parametrize("key, choice, nullable", CHOICES, ids=[k for k, _, _ in CHOICES])
def test_every_value_is_accepted_and_anything_else_is_refused_naming_the_key_and_the_values(key, choice, nullable):
    # (the llm user needs a model; policy.history=rerender a sample mode other than trajectory)
    rule = ["env.user.model=m", "rollout.sample_mode=per_turn"]  # (rollout.sample_mode is a registry: tests/unit/test_registry_keys.py)
    for value in choice.values():
        # (the local stack's engine and the client speak one protocol: local.backend=vllm with policy.engine=vllm)
        engine = ["policy.engine=vllm"] if (key, value) == ("local.backend", "vllm") else []
        got = _get(load_config(None, [*LOCAL, *rule, *engine, f"{key}={value}"]), key)
        assert got == value and isinstance(got, choice) and got is choice(value)
    with pytest.raises(ConfigError) as e:
        load_config(None, [*LOCAL, f"{key}=bogus"])
    assert str(e.value) == f"{key}: must be {'null or ' if nullable else ''}one of {', '.join(choice.values())}, got 'bogus'"
    if nullable:
        assert _get(load_config(None, [*LOCAL, f"{key}=null"]), key) is None
    else:
        with pytest.raises(ConfigError, match=f"^{key}: must be one of "):
            load_config(None, [*LOCAL, f"{key}=null"])


def test_the_message_lists_values_not_member_names_also_from_yaml(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/local.yaml", ["policy.on_length=drop"])
    assert str(e.value) == "policy.on_length: must be one of truncate, keep, got 'drop'"
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  partial_rollout: resume\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, LOCAL)
    assert str(e.value) == "rollout.partial_rollout: must be one of continue, restart_turn, drop, got 'resume'"
    with pytest.raises(ConfigError) as e:
        config_from_dict({**load_config(None, LOCAL).to_dict(), "logging": {"level": "loud"}})
    assert str(e.value) == "logging.level: must be one of DEBUG, INFO, WARNING, ERROR, got 'loud'"


def test_log_levels_take_any_case_as_before():
    cfg = load_config(None, [*LOCAL, "logging.level=debug", "logging.tau2_level=Warning"])
    assert (cfg.logging.level, cfg.logging.tau2_level) == (LogLevel.DEBUG, LogLevel.WARNING)


def test_a_member_is_its_value_string():
    m = PartialRollout.RESTART_TURN
    assert m == "restart_turn" and isinstance(m, str) and m in {"restart_turn"} and {"restart_turn": 1}[m] == 1
    assert str(m) == f"{m}" == "%s" % m == "restart_turn" and f"{OnLength.KEEP:>6}" == "  keep"
    assert json.dumps({"x": m}) == '{"x": "restart_turn"}'


def test_to_yaml_and_to_dict_write_the_plain_values():
    cfg = load_config(None, [*LOCAL, "rollout.partial_rollout=restart_turn", "rollout.filter_groups=zero_variance",
                             "policy.on_length=keep", "logging.level=debug", "pool.event_loop=asyncio"])
    d = cfg.to_dict()
    for key, _, _ in CHOICES:
        value = d
        for part in key.split("."):
            value = value[part]
        assert value is None or type(value) is str, (key, value)
    assert d["rollout"]["partial_rollout"] == "restart_turn" and d["logging"]["level"] == "DEBUG"
    text = cfg.to_yaml()
    assert "partial_rollout: restart_turn\n" in text and "filter_groups: zero_variance\n" in text
    assert "PartialRollout" not in text and "RESTART_TURN" not in text and "KEEP" not in text
    assert yaml.safe_load(text) == d == json.loads(json.dumps(d))
    assert config_from_dict(d) == cfg
    assert load_config(None, [f"{k}={v}" for k, v in _flat(yaml.safe_load(text)).items()]) == cfg


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = "null" if v is None else json.dumps(v) if isinstance(v, (list, bool)) else v
    return out


def test_validate_turns_plain_strings_of_a_config_built_in_code_into_members_and_refuses_others():
    cfg = Config()
    cfg.local.enabled = True
    cfg.rollout.partial_rollout = "drop"
    assert validate(cfg).rollout.partial_rollout is PartialRollout.DROP
    cfg.rollout.on_stale = "ignore"
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value) == "rollout.on_stale: must be one of drop, keep, got 'ignore'"


def test_the_local_stack_is_off_unless_asked_for():
    assert Config().local.enabled is False
    with pytest.raises(ConfigError, match="^policy.router_url: is required when local.enabled=false"):
        load_config(None, [])
    assert load_config(ROOT / "configs/local.yaml").local.enabled  # the CLI's default config starts it


def test_validate_does_no_io():
    """In a fresh process, an audit hook sees every file opened and module imported while
    validate runs (on the shipped local config, tau2 domain, uvloop for the local stack): none."""
    code = (
        "import sys\n"
        "from rollout.core.config import load_config, validate\n"
        "cfg = load_config('configs/local.yaml', ['env.domain=telecom'])\n"
        "seen = []\n"
        "active = [True]\n"
        "sys.addaudithook(lambda ev, args: active[0] and ev in ('open', 'import', 'os.listdir', 'os.scandir') and seen.append((ev, str(args[0]))))\n"
        "validate(cfg)\n"
        "active[0] = False\n"
        "print(seen)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_with_uvloop_masked_the_config_loads_and_preflight_refuses_naming_the_key(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # not importable here
    cfg = load_config(ROOT / "configs/local.yaml", [f"rollout.output_dir={tmp_path / 'out'}"])
    assert cfg.local.enabled and cfg.local.event_loop == EventLoop.UVLOOP
    for check in (check_config, check_before_start):
        with pytest.raises(ConfigError) as e:
            check(cfg)
        assert str(e.value).startswith("local.event_loop: uvloop is not installed here") and "local.event_loop=asyncio" in str(e.value)
    assert not (tmp_path / "out").exists()  # refused before anything was made
    check_config(load_config(ROOT / "configs/local.yaml", ["local.event_loop=asyncio"]))  # asyncio needs nothing
    check_config(load_config(None, ["policy.router_url=http://127.0.0.1:9"]))  # no local servers here: nothing to check
    # the CLI: one line naming the key, exit 2
    assert cli_main(["config", "--config", str(ROOT / "configs/local.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: local.event_loop: uvloop is not installed here") and "\n" not in err


def test_with_tau2_s_registry_unreadable_the_config_loads(monkeypatch):
    from rollout.benchmarks.tau2 import registry

    def unreadable():
        raise AssertionError("validate read tau2's registry")

    monkeypatch.setattr(registry, "registered_domains", unreadable)
    assert load_config(ROOT / "configs/local.yaml", ["env.domain=nope"]).env.domain == "nope"
    with pytest.raises(AssertionError, match="read tau2's registry"):
        check_config(load_config(ROOT / "configs/local.yaml", ["env.domain=nope"]))  # the preflight reads it


def test_an_unregistered_benchmark_is_refused_at_load_naming_the_registered_ones():
    with pytest.raises(ConfigError) as e:
        load_config(None, [*LOCAL, "env.benchmark=tau3"])
    assert str(e.value).startswith("env.benchmark: no benchmark 'tau3' is registered") and "tau2" in str(e.value)


def test_choice_values_are_rewritten_to_member_names_which_omegaconf_2_3_requires():
    """omegaconf 2.3 (pinned by hydra-core 1.3, so in every environment with verl) takes an enum
    field's member name only; load_config rewrites YAML and override values to names first."""
    from omegaconf import OmegaConf

    from rollout.core.choices import values_to_names
    from rollout.core.config import Config

    node = OmegaConf.from_dotlist(["policy.on_length=keep", "rollout.on_stale=keep", "env.user.kind=llm", "logging.level=debug",
                                   "policy.history=bogus", "env.domain=retail", "rollout.train_statuses=[completed]"])
    assert values_to_names(node, Config) is node
    assert OmegaConf.to_container(node) == {
        "policy": {"on_length": "KEEP", "history": "bogus"}, "rollout": {"on_stale": "KEEP", "train_statuses": ["completed"]},
        "env": {"user": {"kind": "LLM"}, "domain": "retail"}, "logging": {"level": "DEBUG"}}
    merged = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.from_dotlist(["policy.on_length=KEEP"])))
    assert merged.policy.on_length == "keep"  # the name merges under either omegaconf
