"""One registry type for every seam: benchmarks, chat formats, sample modes, context strategies,
reward shapers, engines (and the local stack's dialects).

A :class:`Registry` maps a name (what a config key selects: ``env.benchmark``,
``policy.chat_format``, ``rollout.sample_mode``, ``policy.context_strategy``, ...) to an item: an
object, or the ``"package.module:attribute"`` path of one, imported the first time it is asked
for, so that registering imports nothing. Every registry has the same verbs:

* :meth:`Registry.register` adds a name; a name already taken is refused (``replace=True`` to
  swap it on purpose);
* :meth:`Registry.unregister` removes one;
* :meth:`Registry.get` returns the item (importing a path once); an unknown name is one line that
  names the config key and lists the registered names;
* :meth:`Registry.names` lists them (built-ins first, then in registration order);
  ``name in registry`` asks without importing anything.

Each seam's module makes one registry and keeps its own verbs as thin functions over it
(``register_benchmark``, ``register_chat_format``, ``register_sample_mode``,
``register_context_strategy``, ...; docs/design.md "Seams"). The idea and the verbs are tau2's
``registry.py`` (one class, duplicates refused, names listed on a miss).

Items shipped in other packages are found by name through the standard plugin mechanism of Python
packaging: a distribution that declares ``[project.entry-points."tau_rollout.<seam>s"] NAME =
"pkg.module:attribute"`` in its ``pyproject.toml`` (the group is :attr:`Registry.entry_point_group`:
``tau_rollout.benchmarks``, ``tau_rollout.chat_formats``, ``tau_rollout.sample_modes``,
``tau_rollout.context_strategies``, ``tau_rollout.reward_shapers``, ``tau_rollout.dialects``) is registered by path when a name
it declares is looked up or the names are listed, in every process (the driver, each Ray actor,
the local stack); only its metadata is read until the item is used.

A name registered by path in the driver reaches the Ray actors too: :func:`registered_paths`
gives every registry's path entries, the pool passes them to each actor, and
:func:`restore_paths` registers them there before the actor builds its worker. The module a path
names must be importable in the actors' processes as well (an installed package, ``PYTHONPATH``
of the process that starts the local Ray cluster, or a Ray ``runtime_env``); an object registered
in the driver stays in the driver: register its path, or declare an entry point, for a seam that
runs in the actors (benchmarks, chat formats, context strategies).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["SEAM_MODULES", "Registry", "UnknownNameError", "import_path", "is_import_path", "registered_paths", "registries",
           "restore_paths"]

T = TypeVar("T")

ENTRY_POINT_PREFIX = "tau_rollout."
_ABSENT = object()


class UnknownNameError(KeyError, ValueError):
    """A name no registry entry holds. One line (naming the config key and the registered names);
    a ``KeyError`` as a lookup that failed, and a ``ValueError`` as a bad config value."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ""


def is_import_path(text: object) -> bool:
    """Whether ``text`` reads as ``"package.module:attribute"`` (dotted identifiers on both sides
    of one ``:``), checked without importing anything."""
    if not isinstance(text, str):
        return False
    module, sep, attr = text.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and all(p.isidentifier() for p in attr.split("."))


def import_path(path: str) -> Any:
    """The attribute ``"package.module:attribute"`` names (the module is imported now).

    Raises:
        ImportError: the module cannot be imported; AttributeError: it has no such attribute;
        ValueError: ``path`` is not of that form.
    """
    if not is_import_path(path):
        raise ValueError(f"not a 'package.module:attribute' path: {path!r}")
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _plural(seam: str) -> str:
    return seam[:-1] + "ies" if seam.endswith("y") else seam + "s"


class Registry(Generic[T]):
    """Names to items of one seam.

    Args:
        seam: what the items are, for messages (``"chat_format"`` reads "chat format") and the
            entry-point group (``"benchmark"`` -> ``tau_rollout.benchmarks``,
            ``"context_strategy"`` -> ``tau_rollout.context_strategies``).
        config_key: the config key that selects a name (``"env.benchmark"``), named in errors;
            ``None``: no key selects it.
        name_ok: ``name_ok(name) -> bool``, the names this seam accepts (default: non-empty
            strings without ``":"``); ``name_rule`` says which, for the refusal.
        loaded: called once, under the registry's lock, before the first read, to register
            built-ins that are cheap to list but whose module should not be imported before then
            (``None``: none). It may import the seam's own modules; it must not wait on another
            thread.
        paths_as_names: a name that reads as ``"package.module:attribute"`` is accepted as
            itself: ``in`` is true without importing, :meth:`get` imports it (e.g.
            ``policy.context_strategy=pkg.mod:factory``); such names are neither listed nor
            shipped (the config that holds them travels).
        also: what else the config key accepts, added to the miss message (``"or auto"``).

    Thread-safe: the pool's actors look names up from several threads.
    """

    def __init__(self, seam: str, config_key: str | None = None, *, name_ok: Callable[[str], bool] | None = None,
                 name_rule: str = "a non-empty name without ':'", loaded: Callable[["Registry[T]"], None] | None = None,
                 paths_as_names: bool = False, also: str = ""):
        self.seam = seam
        self.config_key = config_key
        self.entry_point_group = f"{ENTRY_POINT_PREFIX}{_plural(seam)}"
        self._name_ok = name_ok or (lambda n: bool(n) and ":" not in n)
        self._name_rule = name_rule
        self._paths_as_names = paths_as_names
        self._also = also
        self._items: dict[str, Any] = {}  # name -> item or "module:attr" path, in registration order
        self._resolved: dict[str, T] = {}
        self._lock = threading.RLock()
        self._loaded = loaded
        _ALL[seam] = self

    @property
    def words(self) -> str:
        """The seam in words (``"chat format"``)."""
        return self.seam.replace("_", " ")

    # -- the verbs ---------------------------------------------------------------------------
    def register(self, name: str, item: T | str, *, replace: bool = False) -> None:
        """Add ``name`` -> ``item`` (an object, or its ``"package.module:attribute"`` path,
        imported at the first :meth:`get`).

        Raises:
            ValueError: the name is not one this seam accepts, or it is registered already (and
                ``replace`` is false).
        """
        if not isinstance(name, str) or not self._name_ok(name):
            raise ValueError(f"{name!r} is not a valid {self.words} name: it must be {self._name_rule}")
        self._load()
        with self._lock:
            if name in self._items and not replace:
                raise ValueError(f"{self.words} {name!r} is already registered (unregister it first, or pass replace=True)")
            self._items[name] = item
            self._resolved.pop(name, None)

    def unregister(self, name: str) -> None:
        """Remove ``name``.

        Raises:
            UnknownNameError: ``name`` is not registered.
        """
        self._load()
        with self._lock:
            if self._items.pop(name, _ABSENT) is _ABSENT:
                raise self.unknown(name)
            self._resolved.pop(name, None)

    def get(self, name: str) -> T:
        """The item registered as ``name`` (a path is imported once, here).

        Raises:
            UnknownNameError: no such name, registered or declared by an installed package.
            ImportError, AttributeError: a registered path cannot be imported.
        """
        self._load()
        with self._lock:
            if name in self._resolved:
                return self._resolved[name]
        if self._find(name):
            with self._lock:
                item = self._items[name]
        elif self._paths_as_names and is_import_path(name):
            item = name
        else:
            raise self.unknown(name)
        value = import_path(item) if is_import_path(item) else item
        with self._lock:
            self._resolved[name] = value
        return value

    def names(self) -> list[str]:
        """The registered names: built-ins first, then in registration order, with those that
        installed packages declare as entry points (registered by path here; their metadata is
        read, not their code)."""
        self._load()
        self._declared()
        with self._lock:
            return list(self._items)

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered, declared by an installed package's entry point (read
        from package metadata, not code; registered by path then) or, with ``paths_as_names``,
        reads as an import path. Nothing is imported."""
        if not isinstance(name, str):
            return False
        return self._find(name) or (self._paths_as_names and is_import_path(name))

    def require(self, name: str, error: type[Exception] = UnknownNameError, *, allowed: tuple[str, ...] = ()) -> None:
        """Check that ``name`` is in the registry (``in``: nothing imported) or one of ``allowed``
        (what else the config key accepts, e.g. ``auto``).

        Raises:
            error: (default :class:`UnknownNameError`) with :meth:`unknown`'s one line, e.g. the
                config's ``ConfigError``.
        """
        if name not in allowed and name not in self:
            raise error(str(self.unknown(name)))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def paths(self) -> dict[str, str]:
        """``{name: "package.module:attribute"}`` of the entries registered by path."""
        self._load()
        with self._lock:
            return {n: i for n, i in self._items.items() if is_import_path(i)}

    def unknown(self, name: str) -> UnknownNameError:
        """The one-line error for a name this registry lacks (names the config key, lists the
        names, and says what else the key accepts)."""
        key = f"{self.config_key}: " if self.config_key else ""
        return UnknownNameError(key + self.missing(name))

    def problem(self, name: str, *, allowed: tuple[str, ...] = ()) -> str | None:
        """``None`` when ``name`` is registered (or one of ``allowed``), else :meth:`unknown`'s
        message without the config key: what a config section's ``problems()`` yields beside its key."""
        return None if name in allowed or name in self else self.missing(name)

    def missing(self, name: str) -> str:
        """``no <seam> 'name' is registered (registered: ...; <what else the key accepts>)``."""
        names = self.names()
        listed = f"registered: {', '.join(names)}" if names else "none is registered"
        return f"no {self.words} {name!r} is registered ({listed}{'; ' + self._also if self._also else ''})"

    # -- internals ---------------------------------------------------------------------------
    def _load(self) -> None:
        if self._loaded is None:
            return
        with self._lock:  # other threads wait until the built-ins are in
            loaded, self._loaded = self._loaded, None
            if loaded is not None:
                loaded(self)

    def _declared(self) -> list[Any]:
        """The installed packages' entry points of this seam's group, each registered by path
        when its name is free."""
        from importlib.metadata import entry_points

        found = list(entry_points(group=self.entry_point_group))
        with self._lock:
            for ep in found:
                if self._name_ok(ep.name):
                    self._items.setdefault(ep.name, ep.value)
        return found

    def _find(self, name: str) -> bool:
        """Whether ``name`` is registered, registering it from an installed package's entry point
        when one declares it."""
        self._load()
        with self._lock:
            if name in self._items:
                return True
        if not self._name_ok(name):
            return False
        self._declared()
        with self._lock:
            return name in self._items


_ALL: dict[str, Registry[Any]] = {}


def registries() -> Mapping[str, Registry[Any]]:
    """Every registry made so far, by seam."""
    return dict(_ALL)


def registered_paths() -> dict[str, dict[str, str]]:
    """``{seam: {name: path}}``: the path entries of the seams' registries (those named in
    :data:`SEAM_MODULES`, which another process knows how to make): what :func:`restore_paths`
    registers in another process, e.g. a Ray actor. Plain strings: it pickles and JSON-encodes."""
    out = {}
    for seam in SEAM_MODULES:
        paths = _ALL[seam].paths() if seam in _ALL else {}
        if paths:
            out[seam] = paths
    return out


def restore_paths(paths: Mapping[str, Mapping[str, str]]) -> None:
    """Register, in this process, path entries another process had (:func:`registered_paths`),
    so that this one resolves each name as that one does: a name registered here already with the
    same path is left as it is, one registered here otherwise (a built-in the other process
    replaced) is replaced. A seam whose registry module was not imported yet is imported first
    (:data:`SEAM_MODULES`).

    Raises:
        KeyError: a seam this version does not know.
    """
    for seam, entries in paths.items():
        if seam not in _ALL and seam in SEAM_MODULES:
            importlib.import_module(SEAM_MODULES[seam])
        reg = _ALL[seam]
        reg._load()
        for name, path in entries.items():
            with reg._lock:
                same = reg._items.get(name, _ABSENT) == path
            if not same:
                reg.register(name, path, replace=True)


# seam -> the module that makes its registry (so that restore_paths can import it in a process
# that has not yet); a new seam adds its line here
SEAM_MODULES: dict[str, str] = {
    "benchmark": "rollout.core.environment",
    "chat_format": "rollout.core.formats.registry",
    "sample_mode": "rollout.core.export",
    "context_strategy": "rollout.core.context",
    "reward_shaper": "rollout.core.shaping",
    "engine": "rollout.core.engines",
    "policy_engine": "rollout.core.policy_engines",
    "dialect": "rollout.devtools.local.dialects",  # the local stack's; named, not imported, by the core
}
