from pathlib import Path

import pytest

from rollout.app.preflight import check_before_start
from rollout.core.config import Config, ConfigError, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_configs_load_with_required_keys():
    local = load_config(ROOT / "configs/local.yaml")
    assert local.local.enabled and local.local.backend == "gold_replay"
    assert local.env.user.kind == "scripted" and local.policy.router_url is None
    cluster = load_config(ROOT / "configs/retail_grpo.yaml")
    assert not cluster.local.enabled and cluster.policy.router_url.startswith("http")
    assert cluster.env.user.kind == "llm" and cluster.env.user.api_key_env == "USER_SIM_API_KEY"
    # Keys that users and scripts rely on, by these exact names.
    for key in [
        "pool.num_actors", "pool.max_concurrent_episodes", "policy.router_url", "policy.tokenizer",
        "policy.sampling.temperature", "policy.sampling.top_p", "policy.sampling.top_k",
        "policy.sampling.max_new_tokens", "policy.sampling.stop", "policy.max_context_tokens",
        "env.domain", "env.task_split", "env.task_ids", "env.max_steps", "env.user.kind",
        "env.user.base_url", "env.user.model", "env.user.api_key_env", "rollout.n_samples_per_task",
        "rollout.output_dir", "local.enabled", "local.backend", "pool.no_actor_timeout_s", "policy.backend_outage_timeout_s",
        "policy.api_key_env", "env.user.max_retries", "env.user.retry_backoff_s", "env.user.max_retry_wait_s",
    ]:
        obj = local
        for part in key.split("."):
            assert hasattr(obj, part), key
            obj = getattr(obj, part)


def test_overrides_merge_and_coerce():
    cfg = load_config(ROOT / "configs/local.yaml", ["pool.num_actors=5", "env.task_ids=[3,7]", "policy.sampling.stop=[]", "pool.metrics=false"])
    assert cfg.pool.num_actors == 5 and cfg.pool.metrics is False
    assert cfg.env.task_ids == ["3", "7"]
    assert cfg.policy.sampling.stop == []


@pytest.mark.parametrize(
    "override, key",
    [
        ("pool.num_actorz=2", "pool.num_actorz"),
        ("pool.num_actors=two", "pool.num_actors"),
        ("pool.num_actors=0", "pool.num_actors"),
        ("pool.metrics=sometimes", "pool.metrics"),
        ("env.task_split=''", "env.task_split"),  # split names are the domain's, checked when it loads (tests/component/test_telecom.py)
        ("env.user.kind=human", "env.user.kind"),
        ("policy.sampling.top_p=1.5", "policy.sampling.top_p"),
        ("policy.on_parse_error=ignore", "policy.on_parse_error"),
        ("local.backend=gpt", "local.backend"),
        ("rollout.train_statuses=[completed,bogus]", "rollout.train_statuses"),
        ("rollout.partial_rollout=resume", "rollout.partial_rollout"),
        ("rollout.max_staleness=-1", "rollout.max_staleness"),
        ("rollout.on_stale=ignore", "rollout.on_stale"),
        ("rollout.filter_groups=all_zero", "rollout.filter_groups"),
        ("rollout.on_group_failure=retry", "rollout.on_group_failure"),
        ("rollout.max_member_reruns=-2", "rollout.max_member_reruns"),
        ("pool.no_actor_timeout_s=0", "pool.no_actor_timeout_s"),
        ("pool.episode_timeout_s=-1", "pool.episode_timeout_s"),
        ("policy.backend_outage_timeout_s=-1", "policy.backend_outage_timeout_s"),
        ("policy.max_request_retries=-1", "policy.max_request_retries"),
        ("policy.api_key_env=sk-abc123", "policy.api_key_env"),  # a key, not a variable name
        ("env.user.api_key_env='my key'", "env.user.api_key_env"),
        ("env.user.max_retries=-1", "env.user.max_retries"),
        ("env.user.retry_backoff_s=-0.5", "env.user.retry_backoff_s"),
        ("env.user.max_retry_wait_s=0.1", "env.user.max_retry_wait_s"),
        ("policy.router_url=localhost:30000", "policy.router_url"),  # a URL needs its scheme
        ("env.user.base_url=host:8000/v1", "env.user.base_url"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/local.yaml", [override])
    assert str(e.value).startswith(key), str(e.value)


def test_a_domain_tau2_lacks_is_refused_before_anything_starts_naming_the_key(tmp_path):
    """Moved from test_bad_values_name_the_key (``env.domain=telecomm``): load_config does no I/O,
    and tau2's registry is read by the preflight (check_before_start), which the CLI and open_pool
    run before anything starts; any domain of tau2's registry is valid (tests/component/test_domains.py)."""
    cfg = load_config(ROOT / "configs/local.yaml", ["env.domain=telecomm", f"rollout.output_dir={tmp_path}"])
    with pytest.raises(ConfigError) as e:
        check_before_start(cfg)
    assert str(e.value).startswith("env.domain"), str(e.value)


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="^policy.router_url"):
        load_config(None, ["local.enabled=false"])
    with pytest.raises(ConfigError, match="^env.user.model"):
        load_config(None, ["env.user.kind=llm"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["pool.num_actors"])


def test_round_trip_through_dict():
    cfg = load_config(ROOT / "configs/retail_grpo.yaml")
    assert config_from_dict(cfg.to_dict()) == cfg
    assert isinstance(cfg, Config)


def test_a_leading_tilde_in_the_output_dir_is_the_home_folder_for_every_writer(tmp_path, monkeypatch):
    """``~`` is expanded once, when the config is loaded, so that the pre-start check, the journal,
    the files and the summary name one folder (the check used to create $HOME/x while the run wrote
    ./~/x); from an override, a YAML file and a dict (a Ray job's actors) alike."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config(None, ["local.enabled=true", "rollout.output_dir=~/x"]).rollout.output_dir == str(tmp_path / "x")
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("local:\n  enabled: true\nrollout:\n  output_dir: ~/runs/a\n")
    cfg = load_config(yaml_file)
    assert cfg.rollout.output_dir == str(tmp_path / "runs" / "a")
    assert config_from_dict({**cfg.to_dict(), "rollout": {**cfg.to_dict()["rollout"], "output_dir": "~/y"}}).rollout.output_dir == str(tmp_path / "y")
    assert load_config(None, ["local.enabled=true", "rollout.output_dir=outputs/rel"]).rollout.output_dir == "outputs/rel"  # as given


@pytest.mark.parametrize("value, expect", [
    ('""', "is empty, which would write the run into the working directory"),
    ('"  "', "is empty, which would write the run into the working directory"),
    ("~nosuchuser-i36/x", "'~nosuchuser-i36' is no user's home folder here"),
])
def test_an_output_dir_that_would_land_in_the_working_directory_is_refused(value, expect):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["local.enabled=true", f"rollout.output_dir={value}"])
    assert str(e.value).startswith("rollout.output_dir: ") and expect in str(e.value) and "\n" not in str(e.value), str(e.value)


