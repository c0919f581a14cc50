"""``local.kv.*``: off by default (no server flags, the model inactive), passed to the servers as
flags, and a bad value names its key."""

import pytest

from rollout.core.config import ConfigError, load_config
from rollout.devtools.local.kvmodel import KVModel, KVParams
from rollout.devtools.local.stack import _kv_args


def test_off_by_default():
    cfg = load_config("configs/local.yaml", [])
    assert _kv_args(cfg.local) == []
    assert not KVModel(KVParams()).active and KVModel(KVParams()).cache is None


def test_flags_for_the_servers():
    cfg = load_config("configs/local.yaml", ["local.kv.cache_tokens=1000", "local.kv.kv_budget_tokens=500",
                                             "local.kv.prefill_s_per_token=0.001", "local.kv.think_tokens=7"])
    args = _kv_args(cfg.local)
    assert args == ["--kv-cache-tokens", "1000", "--kv-budget-tokens", "500", "--kv-prefill-s-per-token", "0.001",
                    "--gold-think-tokens", "7"]
    from rollout.devtools.local.server import _parse_args

    ns = _parse_args(["--port", "1", *args])
    assert (ns.kv_cache_tokens, ns.kv_budget_tokens, ns.kv_prefill_s_per_token, ns.gold_think_tokens) == (1000, 500, 0.001, 7)
    assert KVParams.from_args(ns) == KVParams(cache_tokens=1000, kv_budget_tokens=500, prefill_s_per_token=0.001)


def test_every_parameter_has_a_server_flag_that_reads_back_what_cli_args_writes():
    import argparse

    parser = argparse.ArgumentParser()
    KVParams.add_arguments(parser)
    assert KVParams.from_args(parser.parse_args([])) == KVParams()
    params = KVParams(cache_tokens=7, kv_budget_tokens=9, prefill_s_per_token=0.5, decode_s_per_token=0.25, s_per_running_request=0.125)
    assert KVParams.from_args(parser.parse_args(params.cli_args())) == params
    assert "--kv-s-per-running-request" in parser.format_help() and "prefix-cache capacity in tokens" in parser.format_help()


@pytest.mark.parametrize("key", ["cache_tokens", "kv_budget_tokens", "prefill_s_per_token", "decode_s_per_token",
                                 "s_per_running_request", "think_tokens"])
def test_negative_values_name_their_key(key):
    with pytest.raises(ConfigError, match=f"local.kv.{key}"):
        load_config("configs/local.yaml", [f"local.kv.{key}=-1"])
    if key != "think_tokens":  # a backend option, not one of the model's parameters
        with pytest.raises(ValueError, match=key):
            KVParams(**{key: -1})
