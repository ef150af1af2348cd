"""The executor state store: one versioned key-value store per state partition, on the executor's local disk.

A store-backed state stream (``spark.dstreams.state.store=executor``) keeps partition ``p`` of its state in
``<local dir>/<store id>/p-NNNNN.f<FORMAT>.sqlite`` on the executor that runs the partition's tasks, so that a batch
reads and writes only the keys it touches, instead of rebuilding the whole state as a new RDD.

Why SQLite: it is in Python's standard library (no dependency beyond the project's), it is shared by every
Python worker process of an executor (a PySpark task runs in whichever worker is free, so an in-process
dict would be loaded once per worker and per partition), it keeps state larger than memory on disk with the
operating system's page cache in front of it, and a transaction makes each batch's update atomic. Its cost
next to an embedded key-value store such as LMDB is measured in ``benchmarks/README.md`` ("Why SQLite").

Contract of :class:`PartitionStore`:

* Keys are compared by a canonical encoding (:func:`key_bytes`: pickle without memo), so equal ``str``,
  ``int``, ``bytes``, tuple... keys are one key; ``1`` and ``1.0`` (equal in a dict) are two keys here.
  Values are pickled. The state is one table keyed by those bytes (``kv``, a ``WITHOUT ROWID`` B-tree: the key's
  bytes are the row's key, so a look-up or a write is one descent of one tree, with no hash or row id to compute).
* The store holds one **version** (a batch time in ms), the **run** that wrote it (a token of one driver
  run: a store written by an earlier driver is trusted only after it is brought back to a checkpoint) and its
  **lineage**, the batches dropped (``onFailure=dropInput``) at or before it in its history
  (:mod:`dstreams.state_lineage`): a version applied before its batch's input was dropped is another history.
  :meth:`commit` applies one batch's writes as version ``t`` in one transaction and logs each written key's
  old value; the log lets :meth:`items_as_of` read an older version, :meth:`changed_since` list the keys a
  delta checkpoint must write, and :meth:`rollback` return to an older version. The log is pruned below a
  floor the driver chooses (the base of the next delta checkpoint and the remember window).
* :meth:`ensure_base` brings the store to version ``c`` of a given run and lineage: kept if the same run is
  already at or past ``c`` with the same history at ``c`` (a recomputed base never moves a store back), rolled back
  if an earlier run's store is past ``c`` with the same history at ``c`` and its log reaches back to ``c``, else
  reloaded from ``records`` (a checkpoint's state or the initial state).
* Two tasks of one partition (speculation, a retry) serialise on the database's write lock
  (``BEGIN IMMEDIATE``, a 10-minute busy timeout).
* A store's file carries the one format number (:data:`dstreams.contracts.FORMAT`) in its name and as SQLite's
  ``user_version`` (so does a snapshot exported from it, :func:`file_format`). The local files are a cache of the
  checkpoints: a partition's file of another format is never opened but deleted (:func:`sweep`, :func:`sweep_stale`),
  and the store is rebuilt from the checkpoint as if it had never been there; a snapshot of another format in a
  checkpoint is refused by its reader (:mod:`dstreams.recovery.checkpoint_files`).
* A store opened with :meth:`PartitionStore.open` holds a shared ``flock`` on its database file until it is closed
  (independent of SQLite's own POSIX record locks on Linux; the folder is a local disk): :func:`sweep_stale` deletes a
  host's copy of a partition only under the exclusive one, so never the copy a task of that partition is using on
  that host.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import operator
import os
import pickle
import re
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .contracts import FORMAT
from .errors import DStreamsError
from .faults import task_reached
from .file_lock import describe_holder, flock_within
from .pickling import dumps
from .state_lineage import EMPTY, Lineage

#: Rows per ``IN (...)`` lookup (below SQLite's default limit of host parameters).
LOOKUP_CHUNK = 900
BUSY_TIMEOUT_S = 600.0
#: First record of every checkpoint part of a store-backed stream: ``(PART_HEADER, kind)``, ``kind`` one of
#: :data:`DELTA` (then ``(key bytes, value bytes or None)`` records) and :data:`PAIRS_SNAPSHOT` (then plain
#: ``(key, value)`` records: a state picked by size before it moved, written as its RDD holds it).
#: A :data:`FILE_SNAPSHOT` part is that one record only, ``(PART_HEADER, FILE_SNAPSHOT, keys, file bytes)``: the
#: partition's state as a store file (:meth:`PartitionStore.export_file`, read by :func:`file_rows`), which the
#: executor copies page by page instead of encoding every key; the file carries the format (:func:`file_format`).
PART_HEADER = "dstreams-state-part"
DELTA, PAIRS_SNAPSHOT, FILE_SNAPSHOT = "delta", "pairs", "file"
#: SQLite's page size for a new store: a batch's random updates each dirty a page, and every dirty page is written
#: at commit (WAL) and again by the WAL's checkpoint, so smaller pages write less (``benchmarks/README.md``,
#: "SQLite's page size", has the measurements behind 1 KB).
PAGE_SIZE = 1024
#: Variable naming the folder of executor state stores when the driver does not pass one.
LOCAL_DIR_ENV = "DSTREAMS_STATE_LOCAL_DIR"


class StateStoreError(DStreamsError, RuntimeError):
    """The store cannot serve what a task asked (a version it no longer has, a store deleted under it)."""


def key_bytes(key: Any) -> bytes:
    """The canonical encoding of ``key``: equal keys of the usual types give equal bytes (no pickle memo,
    which would encode a tuple of two equal strings differently by their identity)."""
    t = type(key)
    if t is int or t is str:
        return pickle.dumps(key, 2)  # the shortest encoding of the usual keys (8 bytes for most ints)
    buf = io.BytesIO()
    p = pickle.Pickler(buf, 4)
    p.fast = True  # no memo: the bytes depend on the value only
    p.dump(key)
    return buf.getvalue()


def value_bytes(value: Any) -> bytes:
    """A state value's stored bytes: pickle protocol 2 for the small scalar types (no 9-byte frame header),
    the newest protocol for anything else."""
    t = type(value)
    if t is int or t is float or t is str or value is None or t is bool:
        return pickle.dumps(value, 2)
    return dumps(value)  # cloudpickle for what pickle cannot (dstreams.pickling)


def default_local_dir() -> str:
    return os.environ.get(LOCAL_DIR_ENV) or os.path.join(tempfile.gettempdir(), "dstreams-state")


def store_path(local_dir: str | None, store_id: str, partition: int) -> str:
    root = os.path.join(local_dir or default_local_dir(), store_id)
    os.makedirs(root, exist_ok=True)
    return os.path.join(root, f"p-{partition:05d}.f{FORMAT}.sqlite")


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv(k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    # The log: one row per version, the pickled lists ``(keys, olds, news)`` of what it wrote (each key with its
    # value before and after, None: absent): one insert per batch, deleted whole when pruned.
    "CREATE TABLE IF NOT EXISTS log(ver INTEGER PRIMARY KEY, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value) WITHOUT ROWID",
    # The deadline index of a store with an indexer (``track``'s timeouts and timers): per key with a deadline,
    # the batch time (p) and the watermark (e) at which it is due; NULL: none of that kind.
    "CREATE TABLE IF NOT EXISTS due(k BLOB PRIMARY KEY, p INTEGER, e INTEGER) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS due_p ON due(p) WHERE p IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS due_e ON due(e) WHERE e IS NOT NULL",
)

#: A store's deadline function: a value's bytes -> (due at batch time p, due at watermark e); None: not due.
Indexer = Callable[[bytes], tuple[int | None, int | None]]

#: Writes a key's value whether or not it has a row.
_UPSERT = "INSERT INTO kv VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v"
_key = operator.itemgetter(0)


class PartitionStore:
    """One partition's versioned store (see the module docstring)."""

    def __init__(self, path: str, indexer: Indexer | None = None) -> None:
        self.path = path
        #: Keeps the deadline index (:meth:`due_keys`) for every value written, also by a rollback or a reload.
        self.indexer = indexer
        self.db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        # PAGE_SIZE applies to a new file only (set before WAL fixes it); an older store keeps its pages.
        for pragma in (f"page_size={PAGE_SIZE}", "main.journal_mode=WAL", "synchronous=OFF", "cache_size=-131072",
                       "mmap_size=1073741824"):
            self.db.execute(f"PRAGMA {pragma}")
        for stmt in _SCHEMA:
            self.db.execute(stmt)
        if self.db.execute("PRAGMA user_version").fetchone()[0] == 0:  # a new file: it is of this format
            self.db.execute(f"PRAGMA user_version = {FORMAT}")
        #: Store files attached for a reload (:meth:`_load_file`), detached when its transaction ends.
        self._attached: list[str] = []
        #: The descriptor holding the shared lock on the database file while open (:meth:`open`), or None.
        self._held: int | None = None

    @classmethod
    def open(cls, local_dir: str | None, store_id: str, partition: int,
             indexer: Indexer | None = None) -> PartitionStore:
        """The store of ``partition`` in ``local_dir``, held (a shared lock, see the module docstring) until
        :meth:`close`."""
        path = store_path(local_dir, store_id, partition)
        held = _hold(path)
        try:
            sweep(path)
            store = cls(path, indexer)
        except BaseException:
            os.close(held)
            raise
        store._held = held
        return store

    def close(self) -> None:
        self.db.close()  # first: closing another descriptor of the file must not drop SQLite's locks of a connection
        held, self._held = self._held, None
        if held is not None:
            os.close(held)  # releases the lock

    # ------------------------------------------------------------------ metadata
    def _meta(self, name: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, name: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))

    @property
    def version(self) -> int | None:
        return self._meta("version")

    @property
    def run(self) -> str | None:
        return self._meta("run")

    @property
    def log_floor(self) -> int | None:
        """The oldest version the log can still go back to (None: no version)."""
        return self._meta("log_floor")

    @property
    def lineage(self) -> Lineage:
        """The dropped batches the history of the store's version went through (:mod:`dstreams.state_lineage`): with
        :attr:`run`, which history of :attr:`version` the store holds."""
        stored = self._meta("lineage")
        return EMPTY if stored is None else Lineage.from_json(json.loads(stored))

    def _set_lineage(self, lineage: Lineage | None) -> None:
        stored = (lineage or EMPTY).to_json()
        if stored is None:
            self.db.execute("DELETE FROM meta WHERE name = 'lineage'")
        else:
            self._set_meta("lineage", json.dumps(stored))

    @property
    def keys(self) -> int:
        """How many keys the state holds (kept up to date by every write)."""
        return int(self._meta("keys") or 0)

    def disk_bytes(self) -> int:
        """Bytes of the store's files (database and write-ahead log)."""
        return sum(os.path.getsize(self.path + suffix) for suffix in ("", "-wal") if os.path.exists(self.path + suffix))

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM kv").fetchone()[0])

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            self._detach()
            raise
        self.db.execute("COMMIT")
        self._detach()

    def _detach(self) -> None:
        while self._attached:
            self.db.execute(f"DETACH DATABASE {self._attached.pop()}")

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """One consistent version for every read inside (a writer may commit meanwhile: WAL mode)."""
        self.db.execute("BEGIN")
        try:
            yield
        finally:
            self.db.execute("COMMIT")

    # ------------------------------------------------------------------ reading
    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        """The stored value bytes of those of ``keys`` that have one: one ``IN (...)`` query per
        :data:`LOOKUP_CHUNK` keys, in key order (neighbouring look-ups share B-tree pages)."""
        wanted = sorted(keys)
        found: dict[bytes, bytes] = {}
        for i in range(0, len(wanted), LOOKUP_CHUNK):
            chunk = wanted[i:i + LOOKUP_CHUNK]
            found.update(self.db.execute(f"SELECT k, v FROM kv WHERE k IN ({','.join('?' * len(chunk))})", chunk))
        return found

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key bytes, value bytes) of the current version, in key order."""
        yield from self.db.execute("SELECT k, v FROM kv")

    def items_as_of(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        """Every (key bytes, value bytes) of the state at ``version`` (the current one or one the log reaches)."""
        current = self.version
        if current is None:
            raise StateStoreError(f"state store {self.path} holds no version (asked for {version})")
        if version == current:
            yield from self.items()
            return
        if version > current or (self.log_floor is not None and version < self.log_floor):
            raise StateStoreError(
                f"state store {self.path} is at version {current} and its log reaches back to {self.log_floor}: "
                f"it cannot serve version {version}")
        before = self._old_values(version, current)
        for k, v in self.items():
            if k not in before:
                yield k, v
        for k, old in before.items():
            if old is not None:
                yield k, old

    def changed_since(self, base: int, version: int) -> Iterator[tuple[bytes, bytes | None]]:
        """The keys written in versions ``(base, version]`` with their value at ``version`` (None: deleted):
        a delta checkpoint's records."""
        floor = self.log_floor
        if floor is None or base < floor:
            raise StateStoreError(f"state store {self.path}: the log reaches back to {floor}, not to {base}")
        at: dict[bytes, bytes | None] = {}
        for ver in self._log_versions(base, version):  # oldest first: the last value written up to ``version``
            keys, _, news = self._log_entries(ver)
            at.update(zip(keys, news, strict=True))
        yield from at.items()

    def _log_versions(self, after: int, upto: int | None, descending: bool = False) -> list[int]:
        """The logged versions in ``(after, upto]`` (``upto`` None: no bound), oldest first."""
        order = "DESC" if descending else "ASC"
        if upto is None:
            return [v for (v,) in self.db.execute(f"SELECT ver FROM log WHERE ver > ? ORDER BY ver {order}", (after,))]
        return [v for (v,) in self.db.execute(
            f"SELECT ver FROM log WHERE ver > ? AND ver <= ? ORDER BY ver {order}", (after, upto))]

    def _log_entries(self, ver: int) -> tuple[list[bytes], list[bytes | None], list[bytes | None]]:
        """Version ``ver``'s log: the keys it wrote, their old values and their new ones (None: absent)."""
        row = self.db.execute("SELECT data FROM log WHERE ver = ?", (ver,)).fetchone()
        return ([], [], []) if row is None else pickle.loads(row[0])

    def _old_values(self, version: int, current: int) -> dict[bytes, bytes | None]:
        """Each key written after ``version`` (up to ``current``) with its value at ``version`` (None: absent):
        the oldest logged old value after ``version``."""
        before: dict[bytes, bytes | None] = {}
        for ver in self._log_versions(version, current, descending=True):
            keys, olds, _ = self._log_entries(ver)
            before.update(zip(keys, olds, strict=True))
        return before

    def changed_at(self, version: int) -> Iterator[tuple[bytes, bytes | None]]:
        """The keys version ``version`` wrote, with their value at it (None: deleted)."""
        return self.changed_since(version - 1, version)

    def due_keys(self, now: int, watermark: int | None) -> list[bytes]:
        """The keys whose deadline has come at batch time ``now`` with watermark ``watermark`` (None: no event-time
        deadline has come), from the index the store's indexer keeps: costs the keys due, not the state."""
        due = [k for (k,) in self.db.execute("SELECT k FROM due WHERE p <= ?", (now,))]
        if watermark is not None:
            seen = set(due)
            due.extend(k for (k,) in self.db.execute("SELECT k FROM due WHERE e <= ?", (watermark,)) if k not in seen)
        return due

    def _index(self, writes: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Keep the deadline index for ``writes`` (None: deleted)."""
        indexer = self.indexer
        if indexer is None:
            return
        set_rows, drop = [], []
        for k, v in writes:
            p, e = (None, None) if v is None else indexer(v)
            if p is None and e is None:
                drop.append((k,))
            else:
                set_rows.append((k, p, e))
        self.db.executemany("DELETE FROM due WHERE k = ?", drop)
        self.db.executemany("INSERT OR REPLACE INTO due VALUES (?, ?, ?)", set_rows)

    # ------------------------------------------------------------------ writing
    def write_many(self, version: int, writes: dict[bytes, bytes | None], old: dict[bytes, bytes],
                   log: bool = True) -> None:
        """Inside a transaction: write ``writes`` (None deletes) as ``version``; ``old`` holds the current value
        of every written key that has one (from :meth:`get_many`), logged for the undo and used to tell updates
        from inserts (a key missing from ``old`` that has a row is still written right: inserts are upserts)."""
        if log:
            keys, olds, news = self._log_entries(version)
            keys.extend(writes)
            olds.extend(map(old.get, writes))
            news.extend(writes.values())
            self.db.execute("INSERT OR REPLACE INTO log VALUES (?, ?)",
                            (int(version), pickle.dumps((keys, olds, news), pickle.HIGHEST_PROTOCOL)))
        if None in writes.values():
            added = sum(1 for k, v in writes.items() if v is not None and k not in old)
            removed = sum(1 for k, v in writes.items() if v is None and k in old)
        else:  # no deletes (the usual batch): counted by set operations
            added, removed = len(writes.keys() - old.keys()), 0
        self._set_meta("keys", (self._meta("keys") or 0) + added - removed)
        self._index(writes.items())
        updates: list[tuple[bytes, bytes]] = []
        inserts: list[tuple[bytes, bytes]] = []
        deletes: list[tuple[bytes]] = []
        for k in sorted(writes):  # in key order, as the look-ups
            v = writes[k]
            if v is None:
                deletes.append((k,))
            elif k in old:
                updates.append((v, k))
            else:
                inserts.append((k, v))
        self.db.executemany("UPDATE kv SET v = ? WHERE k = ?", updates)
        self.db.executemany(_UPSERT, inserts)
        self.db.executemany("DELETE FROM kv WHERE k = ?", deletes)

    def set_version(self, version: int, run: str, lineage: Lineage | None = None) -> None:
        """Inside a transaction: the store holds ``version`` of ``run`` with the history ``lineage`` (None: no drops;
        kept up to ``version``)."""
        self._set_meta("version", version)
        self._set_meta("run", run)
        self._set_lineage((lineage or EMPTY).upto(version))
        if self.log_floor is None:
            self._set_meta("log_floor", version)

    def prune_log(self, floor: int) -> None:
        """Forget the undo entries of versions at or before ``floor`` (the log then reaches back to ``floor``)."""
        current = self.log_floor
        if current is not None and floor > current and self.version is not None and floor <= self.version:
            self.db.execute("DELETE FROM log WHERE ver <= ?", (floor,))
            self._set_meta("log_floor", floor)

    def rollback(self, version: int) -> None:
        """Inside a transaction: back to ``version`` through the log (which must reach it)."""
        floor = self.log_floor
        if floor is None or version < floor:
            raise StateStoreError(f"state store {self.path}: the log reaches back to {floor}, not to {version}")
        back = self._old_values(version, self.version if self.version is not None else version)
        current = self.get_many(back)
        self.write_many(version, back, current, log=False)
        self.db.execute("DELETE FROM log WHERE ver > ?", (version,))
        self._set_lineage(self.lineage.upto(version))
        self._set_meta("version", version)

    def reload(self, version: int, run: str, records: Iterable[tuple[bytes, bytes]],
               lineage: Lineage | None = None) -> None:
        """Inside a transaction: replace everything by ``records`` as ``version`` of ``run`` with the history
        ``lineage`` (None: no drops), with an empty log.

        ``records`` may offer ``file_snapshot(path)`` (a checkpoint's partition,
        :class:`dstreams.recovery.checkpoint_files.StatePartition`): it writes a store file (:meth:`export_file`'s)
        at ``path`` and returns the changes after it (None: no such file, read the records), loaded by copying the
        file's rows in SQL (no Python step per key), then applying the changes."""
        for table in ("kv", "log", "meta", "due"):
            self.db.execute(f"DELETE FROM {table}")
        path = f"{self.path}.load-{os.getpid()}"
        try:
            changes = records.file_snapshot(path) if hasattr(records, "file_snapshot") else None
            task_reached("state-reload")  # tests: a task killed inside the transaction (a snapshot file written)
            if changes is not None:
                self._load_file(path, changes)
        finally:
            remove_store_files(path)  # an attached file stays readable until detached
        if changes is None:
            chunk: list[tuple[bytes, bytes]] = []
            for k, v in records:
                chunk.append((k, v))
                if len(chunk) >= 100_000:
                    self._bulk_load(chunk)
                    chunk = []
            if chunk:
                self._bulk_load(chunk)
            self._set_meta("keys", self.count())
        self._set_meta("version", version)
        self._set_meta("run", run)
        self._set_lineage((lineage or EMPTY).upto(version))
        self._set_meta("log_floor", version)

    def _load_file(self, path: str, changes: dict[bytes, bytes | None]) -> None:
        """Inside a transaction, the store emptied: the rows of the store file at ``path`` (:meth:`export_file`'s)
        copied in SQL, then ``changes`` (None: deleted) applied; the deadline index rebuilt when the store keeps
        one. The file stays attached until the transaction ends (detaching is not allowed inside it)."""
        _single_file(path)  # whatever mode it was copied in: nothing of it is left beside the store once removed
        name = f"snapshot{len(self._attached)}"
        self.db.execute(f"ATTACH DATABASE ? AS {name}", (path,))
        self._attached.append(name)
        self.db.execute(f"INSERT INTO kv SELECT * FROM {name}.kv")  # the same layout: the B-tree copied as it is
        self._set_meta("keys", self.count())
        if self.indexer is not None:
            rows = self.db.execute("SELECT k, v FROM kv")
            while chunk := rows.fetchmany(100_000):
                self._index(chunk)
        if changes:
            self.write_many(0, dict(changes), self.get_many(changes), log=False)

    def _bulk_load(self, rows: list[tuple[bytes, bytes]]) -> None:
        """Insert (key, value) rows into a store being reloaded, in key order, a later value of the same key
        replacing the earlier one (also for the deadline index, which is kept from the last value only)."""
        last = sorted(dict(rows).items(), key=_key)
        self._index(last)
        self.db.executemany(_UPSERT, last)

    def export_file(self, version: int, path: str) -> int:
        """Write the state at ``version`` (the current one or one the log reaches) to a new single-file store at
        ``path``, its log and deadline index empty and its free pages dropped; returns its number of keys. The
        database is copied page by page (SQLite's backup, one consistent read; a writer of this store may commit
        meanwhile: WAL), the copy rolled back through its own log and compacted into ``path`` (``VACUUM INTO``), so
        the cost is the file's size, not a Python step per key."""
        current = self.version
        if current is None or version > current or (self.log_floor is not None and version < self.log_floor):
            raise StateStoreError(
                f"state store {self.path} is at version {current} and its log reaches back to {self.log_floor}: "
                f"it cannot export version {version}")
        scratch = f"{path}.copy"
        try:
            target = sqlite3.connect(scratch, isolation_level=None)
            try:
                self.db.backup(target)
            finally:
                target.close()
            copy = PartitionStore(scratch)
            try:
                with copy.transaction():
                    if copy.version != version:
                        copy.rollback(version)
                    copy.db.execute("DELETE FROM log")
                    copy.db.execute("DELETE FROM due")
                    copy._set_meta("log_floor", version)
                    keys = copy.keys
                copy.db.execute("VACUUM INTO ?", (path,))
            finally:
                copy.close()
            _single_file(path)
        finally:
            remove_store_files(scratch)
        return keys

    def ensure_base(self, version: int, run: str, records: Callable[[], Iterable[tuple[bytes, bytes]]],
                    reuse_other_runs: bool = True, loaded: Callable[[], None] | None = None,
                    lineage: Lineage | None = None) -> str:
        """Bring the store to ``version`` of ``run`` with the history ``lineage`` (None: no drops; see the module
        docstring); returns what it did ("kept", "rolled back", "reloaded"). A store whose history at ``version``
        went through other dropped batches (:meth:`Lineage.agrees`) is neither kept nor rolled back.
        ``reuse_other_runs=False``: an earlier run's store is reloaded rather than rolled back (the state at
        ``version`` is this run's own, an initial state, not a checkpoint's). ``loaded()`` runs inside the transaction
        after a roll-back or a reload (its failure undoes them)."""
        lineage = lineage or EMPTY
        with self.transaction():
            current = self.version
            same = current is not None and current >= version and lineage.agrees(self.lineage, version)
            if same and self.run == run:
                return "kept"
            floor = self.log_floor
            if reuse_other_runs and same and floor is not None and floor <= version:
                self.rollback(version)
                self._set_meta("run", run)
                self._set_lineage(lineage.upto(version))
                done = "rolled back"
            else:
                self.reload(version, run, records(), lineage)
                done = "reloaded"
            if loaded is not None:
                loaded()
            return done


def file_rows(path: str) -> Iterator[tuple[bytes, bytes]]:
    """Every (key bytes, value bytes) of a store file written by :meth:`PartitionStore.export_file` (read-only)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        yield from db.execute("SELECT k, v FROM kv")
    finally:
        db.close()


#: What every SQLite database file begins with; the header's ``user_version`` is the 4 bytes at offset 60.
_SQLITE_MAGIC = b"SQLite format 3\x00"


def file_format(data: bytes) -> int | None:
    """The format (:data:`~dstreams.contracts.FORMAT`) of a store file from its first bytes (a snapshot part's file
    bytes; 64 are enough): its SQLite ``user_version``, 0 for a file that no dstreams store wrote into, None for
    bytes that are not an SQLite database."""
    if len(data) < 64 or not data.startswith(_SQLITE_MAGIC):
        return None
    return int.from_bytes(data[60:64], "big")


def _single_file(path: str) -> None:
    """Make the store file at ``path`` a rollback-journal database (no ``-wal``/``-shm`` files beside it)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=DELETE")
    finally:
        db.close()


def remove_store_files(path: str) -> None:
    """Remove a database file and the files SQLite keeps beside it (missing ones are fine)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def sweep(path: str) -> None:
    """Remove what a killed task left beside the store at ``path``: the temporary files of an export or a reload
    (``<store>.snapshot-<version>-<pid>``, ``<store>.load-<pid>``, with SQLite's files beside them) whose process is
    gone, and the files of the same partition's store of another format (never opened: it is rebuilt from the
    checkpoint, like a store deleted by hand)."""
    folder, name = os.path.split(path)
    partition = name.split(".", 1)[0]  # p-NNNNN
    temp = re.compile(rf"{re.escape(name)}\.(?:snapshot-\d+|load)-(\d+)(?:\.copy)?(?:-wal|-shm|-journal)?")
    other = re.compile(rf"{re.escape(partition)}\.f(\d+)\.sqlite(?:-wal|-shm|-journal)?")
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for n in names:
        if (m := temp.fullmatch(n)) is not None:
            doomed = not process_alive(int(m.group(1)))
        else:
            doomed = (m := other.fullmatch(n)) is not None and int(m.group(1)) != FORMAT
        if doomed:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.remove(os.path.join(folder, n))


#: In a stream's store folder: the cleanup horizon last swept on this host (:func:`sweep_stale_once`).
SWEPT_MARKER = "swept"
_STORE_NAME = re.compile(r"p-(\d{5})\.f(\d+)\.sqlite(-wal|-shm|-journal)?")


#: How long a task waits for the shared lock on a store file (a sweep holds it exclusively for milliseconds; a process
#: frozen while it holds it, e.g. a SIGSTOPped executor's worker, would hold the task up forever).
HOLD_TIMEOUT_S = 30.0


def _hold(path: str) -> int:
    """Take the shared lock on the store file at ``path`` (created empty if missing: SQLite takes an empty file for
    a new database), waiting only while a sweep deletes that copy (milliseconds), and return its descriptor: the file
    locked then is the one at its path (a copy deleted while we waited is replaced by a new, empty one). A lock that
    stays held for :data:`HOLD_TIMEOUT_S` raises :class:`StateStoreError` naming its holder (the task fails and Spark
    runs it again) instead of waiting on."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not flock_within(fd, HOLD_TIMEOUT_S, exclusive=False):
                raise StateStoreError(
                    f"the state store file {path} stayed locked for {HOLD_TIMEOUT_S:.0f} s by {describe_holder(fd)}: "
                    "a sweep of this host's store folder that does not release its lock looks frozen or stuck. "
                    "Resume (kill -CONT) or kill that process; the task is retried meanwhile")
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # deleted while we waited


def _same_file(fd: int, path: str) -> bool:
    """Whether the open descriptor ``fd`` is the file now at ``path``."""
    try:
        at = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (at.st_dev, at.st_ino)


def _stored_version(path: str) -> int | None:
    """The version of the store file at ``path`` (None: none, or not a store that can be read). Called under the
    copy's exclusive lock: no task has it open."""
    db = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        row = db.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise  # written by a process that does not take the lock: not ours to delete
        return None  # no meta table: an empty or foreign file
    finally:
        db.close()
    return None if row is None or row[0] is None else int(row[0])


def sweep_stale(folder: str, horizon: int, unused_since: float | None = None) -> list[int]:
    """Delete the stale copies in ``folder`` (one stream's stores on this host); returns their partitions, sorted.

    A copy of partition ``p`` is stale when its version is below ``horizon`` (or it holds no version it can tell),
    whatever run wrote it: the driver passes the stream's newest adopted checkpoint or the oldest version a kept RDD
    may still read, whichever is older, so a copy below it is never read again on any path (a task catching up
    starts from that checkpoint or later, a read-back reloads a store behind the checkpoint it restores). It is
    deleted with SQLite's files beside it, under its exclusive lock taken without waiting: a copy a task of that
    partition holds open on this host is skipped (the next sweep looks again). ``unused_since``: only
    copies whose files were not modified since that time (``time.time()``) are opened to read their version (a copy
    in use is written every batch); None: every copy. Store files of another format are deleted too (never opened:
    a cache, rebuilt from the checkpoint)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    copies: dict[int, list[str]] = {}
    for name in names:
        m = _STORE_NAME.fullmatch(name)
        if m is None:
            continue
        if int(m.group(2)) != FORMAT:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.remove(os.path.join(folder, name))
            continue
        copies.setdefault(int(m.group(1)), []).append(name)
    removed = []
    for partition in sorted(copies):
        path = os.path.join(folder, f"p-{partition:05d}.f{FORMAT}.sqlite")
        if unused_since is not None and _last_modified(path) >= unused_since:
            continue
        if _delete_if_stale(path, horizon):
            removed.append(partition)
    return removed


def _last_modified(path: str) -> float:
    """The newest modification time of the store at ``path`` and SQLite's files beside it (0: none)."""
    newest = 0.0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, os.stat(path + suffix).st_mtime)
    return newest


def _delete_if_stale(path: str, horizon: int) -> bool:
    """Under the copy's exclusive lock (not waited for): delete the store at ``path`` if its version is below
    ``horizon``; whether it did."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a task of this partition has it open on this host
        if not _same_file(fd, path):
            return False  # deleted meanwhile by another sweep
        try:
            version = _stored_version(path)
        except sqlite3.Error:
            return False
        if version is not None and version >= horizon:
            return False
        remove_store_files(path)  # a task waiting for the lock then makes a new file (:func:`_hold`)
        return True
    finally:
        os.close(fd)  # after the version's connection closed: SQLite's locks are not dropped under it


def sweep_stale_once(folder: str, horizon: int) -> list[int] | None:
    """:func:`sweep_stale` of ``folder`` by the first task on this host that brings a horizon above the one last
    swept here (the ``swept`` marker; a task that finds another sweeping skips it): one sweep per host, stream and
    horizon, not one per task. Copies modified since the previous sweep here are in use and not opened. Returns the
    partitions removed, or None: not this task's to sweep."""
    marker = os.path.join(folder, SWEPT_MARKER)
    try:
        fd = os.open(marker, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return None  # the folder is gone: nothing to sweep
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            done: int | None = int(os.pread(fd, 32, 0).decode(errors="replace").strip())
        except ValueError:
            done = None  # never swept here (or a torn marker: sweep)
        if done is not None and done >= horizon:
            return None
        previous = os.fstat(fd).st_mtime if done is not None else None
        removed = sweep_stale(folder, horizon, previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(horizon).encode(), 0)
        return removed
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this host (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
