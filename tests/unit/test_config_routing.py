"""The routing and KV-aware concurrency keys: ``policy.routing``, ``local.router_policy``,
``pool.adaptive_concurrency.*``; what the client sends per ``policy.routing``; the router's
arguments per ``local.router_policy``; reading ``sglang:token_usage``."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from rollout.core.config import ConfigError, config_from_dict, load_config
from rollout.core.policy import SGLangClient
from rollout.core.policy.kvreadings import parse_token_usage
from rollout.devtools.local.stack import router_policy_args

LOCAL = ["local.enabled=true"]


def test_defaults():
    cfg = load_config(None, LOCAL)
    assert cfg.policy.routing == "group" and cfg.local.router_policy == "auto"
    ac = cfg.pool.adaptive_concurrency
    assert (ac.enabled, ac.high_water, ac.low_water, ac.poll_interval_s, ac.signal, ac.worker_urls) == (False, 0.9, 0.75, 0.5, "max", None)


def test_the_section_round_trips_through_to_dict():
    cfg = load_config(None, [*LOCAL, "pool.adaptive_concurrency.enabled=true", "pool.adaptive_concurrency.high_water=0.8",
                             "pool.adaptive_concurrency.low_water=0.6", "pool.adaptive_concurrency.signal=mean",
                             "pool.adaptive_concurrency.placement=gate", "pool.adaptive_concurrency.worker_urls=[http://a:1,http://b:2]", "policy.routing=episode",
                             "local.router_policy=round_robin"])
    d = cfg.to_dict()
    assert d["pool"]["adaptive_concurrency"] == {"enabled": True, "high_water": 0.8, "low_water": 0.6, "poll_interval_s": 0.5,
                                                 "timeout_s": 2.0, "signal": "mean", "start_calls_per_worker": 4, "decrease_factor": 0.5,
                                                 "placement": "gate", "worker_urls": ["http://a:1", "http://b:2"]}
    assert d["policy"]["routing"] == "episode" and d["local"]["router_policy"] == "round_robin"
    assert config_from_dict(d).to_dict() == d


@pytest.mark.parametrize("override, message", [
    ("pool.adaptive_concurrency.start_calls_per_worker=0", "pool.adaptive_concurrency.start_calls_per_worker: must be an integer >= 1"),
    ("pool.adaptive_concurrency.decrease_factor=1", "pool.adaptive_concurrency.decrease_factor: must be in (0, 1)"),
    ("pool.adaptive_concurrency.high_water=0", "pool.adaptive_concurrency.high_water: must be in (0, 1]"),
    ("pool.adaptive_concurrency.high_water=1.5", "pool.adaptive_concurrency.high_water: must be in (0, 1]"),
    ("pool.adaptive_concurrency.low_water=0.9", "pool.adaptive_concurrency.low_water: must be in [0, pool.adaptive_concurrency.high_water=0.9)"),
    ("pool.adaptive_concurrency.low_water=-0.1", "pool.adaptive_concurrency.low_water: must be in [0,"),
    ("pool.adaptive_concurrency.poll_interval_s=0", "pool.adaptive_concurrency.poll_interval_s: must be > 0"),
    ("pool.adaptive_concurrency.timeout_s=-1", "pool.adaptive_concurrency.timeout_s: must be > 0"),
    ("pool.adaptive_concurrency.worker_urls=[]", "pool.adaptive_concurrency.worker_urls: must be null"),
    ("pool.adaptive_concurrency.worker_urls=[localhost:1]", "pool.adaptive_concurrency.worker_urls: each must start with http://"),
    ("pool.adaptive_concurrency.signal=median", "pool.adaptive_concurrency.signal: must be one of max, mean, got 'median'"),
    ("pool.adaptive_concurrency.enabled=maybe", "pool.adaptive_concurrency.enabled"),
    ("pool.adaptive_concurrency.bogus=1", "pool.adaptive_concurrency.bogus"),
    ("policy.routing=session", "policy.routing: must be one of none, episode, group, got 'session'"),
    ("local.router_policy=consistent_hashing",
     "local.router_policy: must be one of auto, manual, cache_aware, round_robin, random, power_of_two, got 'consistent_hashing'"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [*LOCAL, override])
    assert str(e.value).startswith(message), str(e.value)


def test_router_arguments_per_router_policy():
    assert router_policy_args("auto") == ["--policy", "manual", "--assignment-mode", "min_group"]
    for policy in ("manual", "cache_aware", "round_robin", "random", "power_of_two"):
        assert router_policy_args(policy) == ["--policy", policy]
    with pytest.raises(ValueError):
        router_policy_args("consistent_hashing")


def test_the_routing_header_per_policy_routing():
    async def main():
        async with aiohttp.ClientSession() as s:
            out = {}
            for routing in ("none", "episode", "group"):
                cfg = load_config(None, [*LOCAL, "policy.router_url=http://127.0.0.1:1", f"policy.routing={routing}"]).policy
                client = SGLangClient(cfg, s)
                client.groups["retail/3/1"] = "retail/3"
                out[routing] = (client.routing_header("retail/3/1"), client.routing_header("other/0"))
            return out

    assert asyncio.run(main()) == {
        "none": (None, None),
        "episode": ("retail/3/1", "other/0"),
        "group": ("retail/3", "other/0"),  # an episode not registered: its own id
    }


def test_parse_token_usage():
    text = (
        "# HELP sglang:token_usage The token usage.\n# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{model_name="m",dp_rank="0"} 0.25\n'
        'sglang:token_usage{model_name="m",dp_rank="1"} 0.5\n'
        "sglang:token_usage_total 9.0\n"  # another metric whose name starts the same
        "sglang:num_running_reqs 3.0\n"
    )
    assert parse_token_usage(text) == 0.5  # the fuller rank
    assert parse_token_usage("sglang:token_usage 0.125\n") == 0.125
    assert parse_token_usage("sglang:token_usage NaN\n") is None
    # a line that is not a sample (unclosed labels) is skipped, not fatal: the reading stands
    assert parse_token_usage('sglang:token_usage{model_name="m" 0.9\nsglang:token_usage 0.375\n') == 0.375
    assert parse_token_usage("sglang:num_running_reqs 3.0\n") is None
    assert parse_token_usage("") is None
