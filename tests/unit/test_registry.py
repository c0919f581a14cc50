"""The one registry type every seam uses (rollout.core.registry)."""

from __future__ import annotations

import threading
import time

import pytest

from rollout.core.registry import SEAM_MODULES, Registry, UnknownNameError, registered_paths, registries, restore_paths


def test_register_get_list_and_refuse_duplicates():
    reg: Registry[object] = Registry("toy_thing", "toy.key")
    reg.register("b", 2)
    reg.register("a", 1)
    assert reg.names() == ["b", "a"] and "a" in reg and "zz" not in reg  # in registration order
    assert reg.get("a") == 1
    with pytest.raises(ValueError, match="toy thing 'a' is already registered"):
        reg.register("a", 3)
    reg.register("a", 3, replace=True)
    assert reg.get("a") == 3
    reg.unregister("a")
    assert reg.names() == ["b"]
    with pytest.raises(UnknownNameError) as e:
        reg.get("a")
    assert str(e.value) == "toy.key: no toy thing 'a' is registered (registered: b)"
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="'bad:name' is not a valid toy thing name: it must be a non-empty name without ':'"):
        reg.register("bad:name", 1)
    with pytest.raises(UnknownNameError, match="^toy.key: no toy thing 'a' is registered"):
        reg.unregister("a")
    # what the config checks a key with: its own error type, the same line; values the key accepts besides
    reg.require("b")
    reg.require("auto", allowed=("auto",))
    with pytest.raises(LookupError, match=r"^toy.key: no toy thing 'auto' is registered \(registered: b\)$"):
        reg.require("auto", LookupError)


def test_an_item_that_is_none_or_falsy_is_still_registered():
    reg: Registry[object] = Registry("toy_none_thing")
    reg.register("nothing", None)
    reg.register("zero", 0)
    assert reg.get("nothing") is None and reg.get("zero") == 0
    reg.unregister("nothing")  # before: a None item read as "not registered"
    assert reg.names() == ["zero"]
    empty: Registry[object] = Registry("toy_empty_thing", also="or auto")
    assert str(empty.unknown("x")) == "no toy empty thing 'x' is registered (none is registered; or auto)"


def test_the_entry_point_group_is_the_seams_plural():
    assert Registry("toy_benchmark").entry_point_group == "tau_rollout.toy_benchmarks"
    assert Registry("toy_strategy").entry_point_group == "tau_rollout.toy_strategies"


def test_a_path_is_imported_at_first_get_only():
    reg: Registry[object] = Registry("toy_path_thing")
    reg.register("dumps", "json:dumps")
    reg.register("text", "just a string, not a path")  # an object that happens to be a str
    assert reg.paths() == {"dumps": "json:dumps"}
    import json

    assert reg.get("dumps") is json.dumps and reg.get("text") == "just a string, not a path"
    reg.register("missing", "no_such_module_xyz:thing")
    with pytest.raises(ImportError):
        reg.get("missing")


def test_a_name_that_is_a_path_is_accepted_as_itself_where_the_seam_allows_it():
    reg: Registry[object] = Registry("toy_open_thing", "toy.open", paths_as_names=True, also="or package.module:factory")
    reg.register("x", 1)
    assert "json:loads" in reg and "json loads" not in reg and "nope" not in reg
    import json

    assert reg.get("json:loads") is json.loads
    assert reg.names() == ["x"] and reg.paths() == {}  # neither listed nor shipped: the config that names it travels
    assert str(reg.unknown("nope")) == "toy.open: no toy open thing 'nope' is registered (registered: x; or package.module:factory)"


def test_paths_travel_to_another_process_by_restore(monkeypatch):
    reg: Registry[object] = Registry("toy_travel_thing")
    reg.register("loads", "json:loads")
    reg.register("obj", object())  # an object stays where it was registered
    assert "toy_travel_thing" not in registered_paths()  # only the seams another process can make travel
    monkeypatch.setitem(SEAM_MODULES, "toy_travel_thing", __name__)
    snapshot = registered_paths()["toy_travel_thing"]
    assert snapshot == {"loads": "json:loads"}
    reg.unregister("loads")
    restore_paths({"toy_travel_thing": snapshot})
    import json

    assert reg.get("loads") is json.loads


def test_restore_makes_a_name_resolve_as_in_the_process_it_came_from():
    """A name the other process registered by a path different from this one's (a built-in it
    replaced on purpose) resolves to that path here too; the same path is left as it is."""
    reg: Registry[object] = Registry("toy_replaced_thing", loaded=lambda r: r.register("codec", "json:dumps"))
    import json

    assert reg.get("codec") is json.dumps
    restore_paths({"toy_replaced_thing": {"codec": "json:dumps"}})
    assert reg.get("codec") is json.dumps  # unchanged (and not re-imported)
    restore_paths({"toy_replaced_thing": {"codec": "json:loads"}})
    assert reg.get("codec") is json.loads
    with pytest.raises(KeyError):
        restore_paths({"toy_no_such_seam": {"x": "json:loads"}})


def test_builtins_are_registered_on_first_read():
    calls = []

    def builtins(r):
        calls.append(1)
        r.register("x", 1)

    reg: Registry[int] = Registry("toy_lazy_thing", loaded=builtins)
    assert calls == []
    assert reg.names() == ["x"] and calls == [1]
    reg.names()
    assert calls == [1]
    reg.register("y", 2)
    assert reg.names() == ["x", "y"]  # the built-ins first


def test_a_reader_on_another_thread_waits_for_the_builtins():
    """While the built-ins are being registered (a slow module import), a second thread's read
    waits for them instead of seeing an empty registry (before: it saw none)."""
    started = threading.Event()

    def builtins(r):
        started.set()
        time.sleep(0.3)
        r.register("x", 1)

    reg: Registry[int] = Registry("toy_slow_thing", loaded=builtins)
    first = threading.Thread(target=reg.names)
    first.start()
    assert started.wait(5)
    assert "x" in reg and reg.get("x") == 1
    first.join(5)


def test_entry_points_of_an_installed_package_are_found_and_listed(tmp_path, monkeypatch):
    """A distribution's entry point in the seam's group (its metadata only: a ``*.dist-info`` folder
    on ``sys.path``, as ``pip install`` leaves it) is listed and resolved by name, with nothing
    registered by hand; its module is imported only when the item is used."""
    import sys

    dist = tmp_path / "toyreg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyreg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tau_rollout.toy_plugged_things]\nshiny = toyreg_mod:SHINY\nbad:name = toyreg_mod:SHINY\n")
    (tmp_path / "toyreg_mod.py").write_text("SHINY = 'a shiny thing'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[str] = Registry("toy_plugged_thing", "toy.plugged", loaded=lambda r: r.register("builtin", "b"))
    assert "toyreg_mod" not in sys.modules
    assert reg.names() == ["builtin", "shiny"]  # listed (a name the seam refuses is not)
    assert "toyreg_mod" not in sys.modules and reg.paths() == {"shiny": "toyreg_mod:SHINY"}
    assert reg.get("shiny") == "a shiny thing"
    assert "registered: builtin, shiny)" in str(reg.unknown("dull"))
    monkeypatch.delitem(sys.modules, "toyreg_mod")


def test_every_seam_is_named_in_seam_modules_and_its_module_makes_its_registry():
    import importlib

    assert set(SEAM_MODULES) >= {"benchmark", "chat_format", "sample_mode", "context_strategy", "reward_shaper", "dialect"}
    for seam, module in SEAM_MODULES.items():
        importlib.import_module(module)
        reg = registries()[seam]
        assert reg.seam == seam and reg.names(), seam
    groups = {seam: registries()[seam].entry_point_group for seam in SEAM_MODULES}
    assert groups["benchmark"] == "tau_rollout.benchmarks"  # the group plugins declared before issue 29
    assert groups["context_strategy"] == "tau_rollout.context_strategies" and groups["sample_mode"] == "tau_rollout.sample_modes"
    assert groups["reward_shaper"] == "tau_rollout.reward_shapers"
