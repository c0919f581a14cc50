"""Domains come from tau2's registry (``tau2/registry.py``), not from lists of ours.

* What ``rollout.benchmarks.tau2.registry`` reads from the registry's source is what the imported registry
  holds: the same names and the very same functions.
* A domain the registry gains is usable by name (config, ``Tau2Domain``), with no change here.
* The preflight (``check_before_start``, before anything starts) checks ``env.domain`` in
  milliseconds without importing tau2, and its error is one line that names the key and lists
  tau2's domains (also through the CLI). Config validation does no I/O: it reads no registry.
* Without a readable registry source, the imported registry answers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollout.app.preflight import check_before_start, check_config
from rollout.benchmarks.tau2 import registry as domains
from rollout.core.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_registry_cache():
    domains._read_registry.cache_clear()
    yield
    domains._read_registry.cache_clear()


def _tau2_registry():
    from tau2.registry import registry  # about 9 s the first time (tau2's agents, litellm)

    return registry


def test_source_reading_agrees_with_the_imported_registry():
    registry = _tau2_registry()
    offered = domains.registered_domains()
    assert list(offered) == sorted(set(registry.get_domains()) & set(registry.get_task_sets()))
    assert {"airline", "retail", "telecom"} <= set(offered)
    for name in offered:
        loaders = domains.load_domain(name)
        assert loaders.source == "registry.py"
        assert loaders.get_environment is registry.get_env_constructor(name), name
        assert loaders.get_tasks is registry.get_tasks_loader(name), name
        assert loaders.get_tasks_split is registry.get_task_splits_loader(name), name


def test_config_accepts_every_registered_domain_and_rejects_others_in_one_line(tmp_path):
    for name in domains.registered_domains():
        cfg = load_config(ROOT / "configs/local.yaml", [f"env.domain={name}"])
        check_config(cfg)  # the first step of check_before_start
        assert cfg.env.domain == name
    with pytest.raises(ConfigError) as e:
        check_before_start(load_config(ROOT / "configs/local.yaml", ["env.domain=telecomm", f"rollout.output_dir={tmp_path}"]))
    msg = str(e.value)
    assert msg.startswith("env.domain") and "\n" not in msg
    assert "'telecomm'" in msg
    for name in domains.registered_domains():
        assert name in msg


def test_config_validation_imports_no_tau2(tmp_path):
    """A fresh process: the error comes without tau2 (or litellm) being imported (tau2's registry
    takes seconds to import; ``python -m rollout.bench startup`` times the start-up)."""
    code = (
        "import sys\n"
        "from rollout.app.preflight import check_before_start\n"
        "from rollout.core.config import ConfigError, load_config\n"
        "try:\n"
        f"    check_before_start(load_config(None, ['local.enabled=true', 'env.domain=nope', 'rollout.output_dir={tmp_path}']))\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
        "print(sorted(m for m in ('tau2', 'tau2.registry', 'litellm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    error, imported = out.stdout.strip().splitlines()
    assert error.startswith("env.domain: 'nope' is not a tau2 domain") and "telecom" in error
    assert imported == "[]"


def test_the_cli_reports_an_unknown_domain_as_a_config_error(capsys):
    from rollout.app.cli import main

    assert main(["config", "--config", str(ROOT / "configs/local.yaml"), "env.domain=nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: env.domain: 'nope' is not a tau2 domain") and "\n" not in err
    assert "airline" in err and "telecom" in err


def test_a_domain_the_registry_gains_is_usable_by_name(tmp_path, monkeypatch, fresh_registry_cache):
    """tau2's own registry source, plus one registration: the new name is a valid ``env.domain``
    and loads as a domain (here tau2's mock domain's functions under a new name)."""
    source = Path(domains._registry_path()).read_text()
    source += (
        "\nfrom tau2.domains.mock.environment import get_environment as newdomain_get_environment\n"
        "from tau2.domains.mock.environment import get_tasks as newdomain_get_tasks\n"
        "registry.register_domain(newdomain_get_environment, 'newdomain')\n"
        "registry.register_tasks(newdomain_get_tasks, name='newdomain')\n"
    )
    path = tmp_path / "registry.py"
    path.write_text(source)
    monkeypatch.setattr(domains, "_registry_path", lambda: str(path))

    assert "newdomain" in domains.registered_domains()
    cfg = load_config(None, ["local.enabled=true", "env.domain=newdomain"])
    check_config(cfg)  # the first step of check_before_start
    assert cfg.env.domain == "newdomain"
    loaders = domains.load_domain("newdomain")
    from tau2.domains.mock import environment as mock_env

    assert loaders.get_environment is mock_env.get_environment and loaders.get_tasks_split is None

    from rollout.benchmarks.tau2.environment import Tau2Domain

    dom = Tau2Domain("newdomain")
    assert dom.name == "newdomain" and dom.tasks and dom.tool_names
    assert dom.splits == {"base": list(dom.tasks)}  # no splits registered: one split of every task
    assert dom.task_ids("base") == list(dom.tasks)


def test_an_unknown_domain_fails_where_tau2_is_loaded_too():
    from rollout.benchmarks.tau2.environment import Tau2Domain

    with pytest.raises(KeyError) as e:
        Tau2Domain("nope")
    assert isinstance(e.value, domains.UnknownDomainError)
    assert str(e.value).startswith("env.domain: 'nope'") and "retail" in str(e.value) and "\n" not in str(e.value)


def test_without_a_readable_source_the_imported_registry_answers(monkeypatch, fresh_registry_cache):
    registry = _tau2_registry()
    monkeypatch.setattr(domains, "_registry_path", lambda: None)
    assert domains.registered_domains() == ()
    domains.check_domain("anything")  # nothing to check against at config time: the load checks
    loaders = domains.load_domain("telecom")
    assert loaders.source == "registry" and loaders.get_environment is registry.get_env_constructor("telecom")
    with pytest.raises(domains.UnknownDomainError, match=r"^env.domain: 'nope' .*airline, mock, retail, telecom"):
        domains.load_domain("nope")


def test_registrations_the_source_does_not_resolve_are_asked_of_the_registry(tmp_path, monkeypatch, fresh_registry_cache):
    registry = _tau2_registry()
    source = Path(domains._registry_path()).read_text().replace(
        'registry.register_domain(retail_domain_get_environment, "retail")',
        'registry.register_domain(lambda **kw: retail_domain_get_environment(**kw), "retail")',
    )
    assert "lambda" in source
    path = tmp_path / "registry.py"
    path.write_text(source)
    monkeypatch.setattr(domains, "_registry_path", lambda: str(path))
    assert "retail" in domains.registered_domains()
    loaders = domains.load_domain("retail")
    assert loaders.source == "registry" and loaders.get_environment is registry.get_env_constructor("retail")
