"""The benchmark registry (``rollout.core.environment``): names in, loaders out; an unknown name lists
the registered ones, a second registration of a name is refused, the built-ins are registered by
module path (so importing the core imports neither tau2 nor tau-bench), and the local stack's
domain key round-trips. A toy benchmark that runs episodes is in
``tests/component/test_benchmark_registry.py``."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from rollout.core.environment import (
    DEFAULT_BENCHMARK,
    UnknownBenchmarkError,
    benchmark_gold_index,
    benchmarks,
    domain_key,
    load_benchmark,
    parse_domain_key,
    register_benchmark,
    require_benchmark,
    unregister_benchmark,
)


@pytest.fixture
def registered():
    """Names registered by a test, unregistered afterwards (the registry is process-wide)."""
    names: list[str] = []

    def register(name, loader, **hooks):
        register_benchmark(name, loader, **hooks)
        names.append(name)

    yield register
    for name in names:
        if name in benchmarks():
            unregister_benchmark(name)


def test_the_built_ins_are_registered_and_an_unknown_name_lists_them():
    assert {"tau2", "tau_bench"} <= set(benchmarks()) and DEFAULT_BENCHMARK == "tau2"
    with pytest.raises(UnknownBenchmarkError) as e:
        load_benchmark(SimpleNamespace(benchmark="tau3", domain="retail"))
    msg = str(e.value)
    assert msg == f"env.benchmark: no benchmark 'tau3' is registered (registered: {', '.join(benchmarks())})"
    assert "\n" not in msg and "tau2" in msg and "tau_bench" in msg
    # a KeyError (the CLI's config line) and a ValueError (what make_domain raised before the registry)
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    for call in (lambda: require_benchmark("tau3"), lambda: benchmark_gold_index("tau3", "retail"), lambda: unregister_benchmark("tau3")):
        with pytest.raises(UnknownBenchmarkError, match="no benchmark 'tau3'"):
            call()


def test_a_second_registration_of_a_name_is_refused(registered):
    loaded = []

    def first(env_cfg, log_level="ERROR"):
        loaded.append(("first", env_cfg.domain, log_level))
        return "first benchmark"

    registered("toy_twice", first)
    with pytest.raises(ValueError, match="'toy_twice' is already registered"):
        register_benchmark("toy_twice", lambda env_cfg, log_level="ERROR": "second benchmark")
    with pytest.raises(ValueError, match="'tau2' is already registered"):
        register_benchmark("tau2", first)
    # the first registration stands
    assert load_benchmark(SimpleNamespace(benchmark="toy_twice", domain="d"), log_level="DEBUG") == "first benchmark"
    assert loaded == [("first", "d", "DEBUG")]
    # unregistered, the name is free again
    unregister_benchmark("toy_twice")
    assert "toy_twice" not in benchmarks()
    registered("toy_twice", lambda env_cfg, log_level="ERROR": "second benchmark")
    assert load_benchmark(SimpleNamespace(benchmark="toy_twice", domain="d")) == "second benchmark"


@pytest.mark.parametrize("name", ["", "two words", "tau:bench", "1st", None])
def test_a_name_must_be_an_identifier(name):
    with pytest.raises(ValueError, match="must be an identifier"):
        register_benchmark(name, lambda env_cfg, log_level="ERROR": None)
    assert name not in benchmarks()


_CALLS: list[tuple] = []


def _loader_by_path(env_cfg, log_level="ERROR"):
    _CALLS.append(("load", env_cfg.domain, log_level))
    return f"loaded {env_cfg.domain}"


def _gold_by_path(domain):
    _CALLS.append(("gold", domain))
    return [], {"lookup": False}


def _check_by_path():
    _CALLS.append(("check",))


def test_loaders_and_hooks_given_by_module_path_are_imported_on_first_use(registered):
    _CALLS.clear()
    registered("toy_paths", f"{__name__}:_loader_by_path", gold_index=f"{__name__}:_gold_by_path", check=f"{__name__}:_check_by_path")
    assert _CALLS == []  # registering resolves nothing
    assert load_benchmark(SimpleNamespace(benchmark="toy_paths", domain="d"), log_level="INFO") == "loaded d"
    assert benchmark_gold_index("toy_paths", "e") == ([], {"lookup": False})
    require_benchmark("toy_paths")
    assert _CALLS == [("load", "d", "INFO"), ("gold", "e"), ("check",)]
    registered("toy_bad_path", "rollout_no_such_module:load")
    with pytest.raises(ModuleNotFoundError, match="rollout_no_such_module"):  # a wrong path fails at the first load
        load_benchmark(SimpleNamespace(benchmark="toy_bad_path", domain="d"))


def test_hooks_are_optional(registered):
    registered("toy_bare", lambda env_cfg, log_level="ERROR": "bare")
    require_benchmark("toy_bare")  # no check: nothing to verify
    with pytest.raises(LookupError, match="'toy_bare' has no gold index"):
        benchmark_gold_index("toy_bare", "d")


def test_a_check_hook_reports_what_is_missing(registered):
    def missing():
        raise ImportError("env.benchmark=toy_missing needs the toy package: pip install toy")

    registered("toy_missing", lambda env_cfg, log_level="ERROR": "x", check=missing)
    with pytest.raises(ImportError, match="pip install toy"):
        require_benchmark("toy_missing")


def test_the_domain_key_names_a_benchmarks_domain_in_one_string():
    assert domain_key("tau2", "retail") == "retail"  # the default benchmark: the local stack's --domain as before
    assert domain_key("tau_bench", "retail") == "tau_bench:retail"
    for benchmark, domain in (("tau2", "retail"), ("tau2", "telecom"), ("tau_bench", "airline"), ("toy", "shop")):
        assert parse_domain_key(domain_key(benchmark, domain)) == (benchmark, domain)


def test_importing_the_core_seam_imports_no_benchmark():
    code = ("import sys; import rollout.core.environment as e; e.benchmarks(); import rollout.core.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tau2', 'tau_bench') or m.startswith('rollout.benchmarks')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_benchmark_from_an_installed_packages_entry_point_is_found_in_a_fresh_process(tmp_path):
    """An out-of-tree benchmark declares an entry point (group ``tau_rollout.benchmarks``) in its
    package's metadata; a fresh process (as each Ray actor is) finds it by name, with nothing
    registered by hand; an unknown name is still refused at load, naming the key."""
    import subprocess
    import sys

    dist = tmp_path / "toyplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tau_rollout.benchmarks]\ntoyshop = toyplugin_bench:load\n")
    (tmp_path / "toyplugin_bench.py").write_text(
        "class Shop:\n    name = 'toyshop'\n    def __init__(self, domain):\n        self.domain = domain\n"
        "def load(env_cfg, log_level='ERROR'):\n    return Shop(env_cfg.domain)\n")
    code = ("from rollout.core.config import ConfigError, load_config\n"
            "from rollout.core.environment import load_benchmark\n"
            "cfg = load_config(None, ['local.enabled=true', 'env.benchmark=toyshop', 'env.domain=fruit'])\n"
            "b = load_benchmark(cfg.env)\n"
            "print(b.name, b.domain)\n"
            "try:\n    load_config(None, ['local.enabled=true', 'env.benchmark=toyshoq'])\n"
            "except ConfigError as e:\n    print(str(e).split(':')[0])\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["toyshop fruit", "env.benchmark"]
