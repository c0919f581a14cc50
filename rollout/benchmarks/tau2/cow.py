"""Copy-on-write views of a tau2 domain database: one parse per actor, one small overlay per episode.

tau2 builds a whole environment for every episode (``get_environment()`` re-reads and validates
``db.json``: 50-250 ms and 7-27 MB), and its evaluator builds two more and hashes both databases.
Here a domain's database is parsed once per actor (:class:`SharedDatabase`) and each episode gets
a view (:meth:`SharedDatabase.view`) whose tables (:class:`CowTable`) copy a record the first time
the episode reads it by key and keep the copy; the shared records are never written.

The tables of tau2's databases are the ``dict`` fields of its ``DB`` model (airline: ``flights``,
``users``, ``reservations``; retail: ``products``, ``users``, ``orders``). tau2's tools reach a
record by key (``db.users[user_id]``), then read or change it in place, add records
(``db.reservations[new_id] = ...``), or scan a table (``for u in db.users.values()``) to find
something. A scan reads the shared records without copying them (a copy of every flight per
search would cost what a full database copy costs): this relies on tau2's scanning tools only
reading what they scan, which ``tests/component/test_fast_reward.py`` checks for every tool of the domains
this view serves (the shared database's canonical form is compared before and after every
trajectory of every task).

Comparing two views (:meth:`SharedDatabase.touched_records` and :func:`canonical_record`): tau2
compares databases by ``sha256(json.dumps(db.model_dump(), sort_keys=True, default=str))``. That
string is built record by record (with sorted keys, a table's encoding is its keys in order, each
with its record's encoding), so two databases hash equal exactly when every table has the same
keys and every record the same encoding. Records neither view touched are the shared ones in
both; only the touched ones need comparing. :meth:`SharedDatabase.full_hash` rebuilds tau2's
hash from a view to prove the equivalence (tests).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, MutableMapping
from typing import Any

from pydantic import TypeAdapter

_MISSING = object()


class CowTable(MutableMapping):
    """One table (``id -> record``) of an episode's database view, over a shared table.

    Behaves as the ``dict`` it stands for, insertion order included (tau2's scans return the
    first match, so order is observable): keys of the shared table keep their place unless deleted;
    added keys follow in insertion order.

    * ``table[key]`` (and ``get``, ``pop``, ...): the episode's own copy of the record, made with
      ``copy.deepcopy`` from the shared one on first access (100-350 us for a tau2 record).
    * ``values()`` / ``items()``: the episode's copy where it has one, else the shared record
      itself, uncopied: scanning is for reading (see the module docstring).
    * ``table[key] = value`` / ``del table[key]``: change only the view.

    Args:
        base: the shared table; never written through this view.
    """

    __slots__ = ("_base", "_own", "_moved", "_tail")

    def __init__(self, base: dict) -> None:
        self._base = base
        self._own: dict[Any, Any] = {}  # the view's records: copies and assigned values
        self._moved: set = set()  # shared keys no longer at their shared place (deleted, maybe re-added)
        self._tail: dict[Any, None] = {}  # keys added after the shared ones, in order

    # -- the dict protocol
    def __contains__(self, key: object) -> bool:
        return key in self._tail or (key in self._base and key not in self._moved)

    def __getitem__(self, key: Any) -> Any:
        own = self._own.get(key, _MISSING)
        if own is not _MISSING:
            return own
        if key in self._base and key not in self._moved:
            record = self._own[key] = copy.deepcopy(self._base[key])
            return record
        raise KeyError(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self:
            self._tail[key] = None
        self._own[key] = value

    def __delitem__(self, key: Any) -> None:
        if key not in self:
            raise KeyError(key)
        self._own.pop(key, None)
        if key in self._tail:
            del self._tail[key]
        else:
            self._moved.add(key)

    def __iter__(self) -> Iterator:
        moved = self._moved
        for key in self._base:
            if key not in moved:
                yield key
        yield from list(self._tail)

    def __len__(self) -> int:
        return len(self._base) - len(self._moved) + len(self._tail)

    def __repr__(self) -> str:
        return f"CowTable({len(self)} records, {len(self._own)} own, {len(self._moved) + len(self._tail)} moved or added)"

    # -- reads without copying
    def peek(self, key: Any, default: Any = None) -> Any:
        """The record the view holds for ``key`` (its own copy, else the shared one), without
        copying; ``default`` when absent."""
        own = self._own.get(key, _MISSING)
        if own is not _MISSING:
            return own
        if key in self._base and key not in self._moved:
            return self._base[key]
        return default

    def values(self):  # type: ignore[override]
        """The records in order, uncopied (the episode's copy where it has one)."""
        return [self.peek(k) for k in self]

    def items(self):  # type: ignore[override]
        """``(key, record)`` in order, uncopied (the episode's copy where it has one)."""
        return [(k, self.peek(k)) for k in self]

    # -- what the view changed
    def touched(self) -> set:
        """Keys whose record may differ from the shared table's: copied, assigned, added or deleted."""
        return set(self._own) | self._moved | set(self._tail)

    def own_records(self) -> int:
        """Records the view holds copies of (its memory, in records)."""
        return len(self._own)


def canonical_record(adapter: TypeAdapter, record: Any) -> str:
    """A record's encoding inside tau2's database hash: ``json.dumps`` of its ``model_dump`` with
    ``sort_keys=True, default=str``, dumped as the table's declared value type.

    Args:
        adapter: ``TypeAdapter`` of the table's value type (e.g. ``tau2...airline.data_model.User``).
        record: the record (a pydantic model of that type).
    """
    return json.dumps(adapter.dump_python(record), sort_keys=True, default=str)


class SharedDatabase:
    """One tau2 domain database, parsed once, shared read-only by the views of all episodes.

    Args:
        db: a tau2 ``DB`` model instance (e.g. ``get_environment().tools.db``), owned from now on:
            nothing may write it.

    Attributes:
        tables: field name -> the shared ``dict`` (every ``dict`` field of the model).
        others: field name -> value, for non-``dict`` fields (deep-copied into each view).

    Raises:
        TypeError: a ``dict`` field whose annotation gives no value type.
    """

    def __init__(self, db: Any) -> None:
        self.db = db
        self.model = type(db)
        self.tables: dict[str, dict] = {}
        self.others: dict[str, Any] = {}
        self._adapters: dict[str, TypeAdapter] = {}
        self._canon: dict[tuple[str, Any], str] = {}  # (table, key) -> encoding of the shared record
        for name, info in self.model.model_fields.items():
            value = getattr(db, name)
            if isinstance(value, dict):
                args = getattr(info.annotation, "__args__", None)
                if not args or len(args) != 2:
                    raise TypeError(f"{self.model.__name__}.{name}: cannot read the value type of {info.annotation!r}")
                self.tables[name] = value
                self._adapters[name] = TypeAdapter(args[1])
            else:
                self.others[name] = value
                self._adapters[name] = TypeAdapter(info.annotation)

    def view(self) -> Any:
        """A new episode view: an instance of the database's model (built without validation)
        whose ``dict`` fields are :class:`CowTable` views of the shared tables."""
        fields = {name: CowTable(table) for name, table in self.tables.items()}
        fields.update({name: copy.deepcopy(v) for name, v in self.others.items()})
        return self.model.model_construct(**fields)

    def canonical(self, table: str, record: Any) -> str:
        """:func:`canonical_record` with the adapter of ``table``."""
        return canonical_record(self._adapters[table], record)

    def _shared_canonical(self, table: str, key: Any) -> str:
        k = (table, key)
        enc = self._canon.get(k)
        if enc is None:
            enc = self._canon[k] = self.canonical(table, self.tables[table][key])
        return enc

    def touched_records(self, view: Any, keys: dict[str, set] | None = None) -> dict[str, dict[Any, str | None]]:
        """The encodings of the records ``view`` touched (or of ``keys``, per table):
        ``{table: {key: encoding, or None when the key is absent from the view}}``.

        A touched record equal to the shared one encodes the same; the shared records' encodings
        are cached (per key, on first use).
        """
        out: dict[str, dict[Any, str | None]] = {}
        for name in self.tables:
            table: CowTable = getattr(view, name)
            wanted = table.touched() if keys is None else keys.get(name, set())
            enc: dict[Any, str | None] = {}
            for key in wanted:
                if key not in table:
                    enc[key] = None
                elif key in table._own:
                    enc[key] = self.canonical(name, table._own[key])
                else:
                    enc[key] = self._shared_canonical(name, key)
            out[name] = enc
        return out

    def others_canonical(self, view: Any) -> str:
        """The encoding of the view's non-table fields (``""`` when there are none)."""
        if not self.others:
            return ""
        return json.dumps({name: self._adapters[name].dump_python(getattr(view, name)) for name in self.others}, sort_keys=True, default=str)

    def matches(self, view: Any, reference: DatabaseState) -> bool:
        """Whether ``view`` holds the same database as ``reference`` (a state taken from another
        view of this database), in the sense of tau2's hash comparison."""
        if self.others_canonical(view) != reference.others:
            return False
        mine = {name: getattr(view, name).touched() for name in self.tables}
        keys = {name: mine[name] | set(reference.records.get(name, {})) for name in self.tables}
        enc = self.touched_records(view, keys)
        for name in self.tables:
            ref = reference.records.get(name, {})
            for key, e in enc[name].items():
                want = ref[key] if key in ref else self._shared_canonical(name, key) if key in self.tables[name] else None
                if e != want:
                    return False
        return True

    def state(self, view: Any) -> DatabaseState:
        """What :meth:`matches` needs of ``view`` later: the encodings of its touched records
        (a few kB; the view itself can go)."""
        return DatabaseState(self.touched_records(view), self.others_canonical(view))

    def full_hash(self, view: Any) -> str:
        """tau2's database hash (``DB.get_hash``) of ``view``, rebuilt from record encodings
        without materialising a copy of the database (tests and checks; 30-250 ms)."""
        parts = []
        for name in sorted(self.model.model_fields):
            if name in self.tables:
                table: CowTable = getattr(view, name)
                inner = ", ".join(f"{json.dumps(k)}: {self._view_canonical(name, table, k)}" for k in sorted(table, key=str))
                parts.append(f"{json.dumps(name)}: {{{inner}}}")
            else:
                value = self._adapters[name].dump_python(getattr(view, name))
                parts.append(f"{json.dumps(name)}: {json.dumps(value, sort_keys=True, default=str)}")
        return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()

    def _view_canonical(self, name: str, table: CowTable, key: Any) -> str:
        if key in table._own:
            return self.canonical(name, table._own[key])
        return self._shared_canonical(name, key)


class DatabaseState:
    """The touched records of one database view, encoded (see :meth:`SharedDatabase.state`).

    Attributes:
        records: ``{table: {key: encoding, or None for an absent key}}``.
        others: the encoding of the non-table fields.
    """

    __slots__ = ("records", "others")

    def __init__(self, records: dict[str, dict[Any, str | None]], others: str) -> None:
        self.records = records
        self.others = others
