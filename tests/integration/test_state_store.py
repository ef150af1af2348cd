"""The executor state store (issue 23): the store itself, and store-backed state streams against the RDD state.

* :class:`PartitionStore` on its own: versions, reads as of an older version through the undo log, the
  changes since a version (a delta checkpoint), rollback, ``ensure_base``'s three ways, canonical keys, and
  snapshots of the store's files (one of another format refused).
* Store-backed ``runningReduce`` and ``updateStateByKey`` (with and without ``updateIdleKeys``, with an initial
  state, keys dropped) give the RDD state's outputs batch by batch, with checkpoints every 2 batches and a
  snapshot every 2 checkpoints (deltas, chains, adoption and deletion all run).
* A driver restart from the checkpoint (the local stores kept, rolled back, lost, or of another format) gives the
  uninterrupted run's outputs, exactly once.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import pickle
import shutil
import time
import urllib.request
from collections.abc import Iterator

import pytest

from dstreams import StreamingContext
from dstreams.contracts import FORMAT
from dstreams.recovery.checkpointer import list_checkpoints, load_manifest
from dstreams.recovery.store import open_store
from dstreams.statestore import PartitionStore, StateStoreError, key_bytes
from dstreams.testing import app_context, manual_context, run_until

from ..recovery_app import read_outputs
from ..support import store_backed


def _kv(store: PartitionStore, version: int | None = None) -> dict:
    items = store.items() if version is None else store.items_as_of(version)
    return {pickle.loads(k): pickle.loads(v) for k, v in items}


def _commit(store: PartitionStore, version: int, run: str, values: dict) -> None:
    writes = {key_bytes(k): (None if v is None else pickle.dumps(v)) for k, v in values.items()}
    with store.transaction():
        old = store.get_many(writes)
        store.write_many(version, writes, old)
        store.set_version(version, run)


# ---------------------------------------------------------------------------------------------- the store alone
def test_versions_reads_as_of_changes_and_rollback(tmp_path):
    store = PartitionStore(str(tmp_path / "p.sqlite"))
    store.ensure_base(0, "r1", lambda: [(key_bytes("a"), pickle.dumps(1)), (key_bytes("b"), pickle.dumps(2))])
    _commit(store, 1000, "r1", {"a": 10, "c": 3})
    _commit(store, 2000, "r1", {"b": None, "c": 30, ("t", "t"): 7})
    assert (store.version, store.run, store.count(), store.keys) == (2000, "r1", 3, 3)
    assert _kv(store) == {"a": 10, "c": 30, ("t", "t"): 7}
    assert _kv(store, 1000) == {"a": 10, "b": 2, "c": 3}
    assert _kv(store, 0) == {"a": 1, "b": 2}
    delta = {pickle.loads(k): (None if v is None else pickle.loads(v)) for k, v in store.changed_since(0, 2000)}
    assert delta == {"a": 10, "b": None, "c": 30, ("t", "t"): 7}
    delta_1 = {pickle.loads(k): (None if v is None else pickle.loads(v)) for k, v in store.changed_since(0, 1000)}
    assert delta_1 == {"a": 10, "c": 3}
    with store.transaction():
        store.rollback(1000)
    assert store.version == 1000 and _kv(store) == {"a": 10, "b": 2, "c": 3}
    store.prune_log(1000)
    with pytest.raises(StateStoreError, match="cannot serve version 0"):
        list(store.items_as_of(0))
    store.close()


def test_ensure_base_keeps_rolls_back_or_reloads(tmp_path):
    path = str(tmp_path / "p.sqlite")
    store = PartitionStore(path)
    loads = []

    def records():
        loads.append(1)
        return [(key_bytes("k"), pickle.dumps(0))]

    assert store.ensure_base(0, "r1", records) == "reloaded"
    _commit(store, 1000, "r1", {"k": 1})
    _commit(store, 2000, "r1", {"k": 2})
    assert store.ensure_base(1000, "r1", records) == "kept"  # same run, already past: never moved back
    assert _kv(store) == {"k": 2}
    assert store.ensure_base(1000, "r2", records) == "rolled back"  # another run: back to the checkpoint
    assert (store.version, store.run, _kv(store)) == (1000, "r2", {"k": 1})
    store.prune_log(1000)
    assert store.ensure_base(0, "r3", records) == "reloaded"  # the log no longer reaches 0
    assert _kv(store) == {"k": 0} and len(loads) == 2
    store.close()


def test_a_lineage_names_a_history_by_its_dropped_batches_and_folds_the_old_ones():
    """Two histories of one version differ in the batches dropped at or before it; folding the drops before a floor
    keeps every id and comparison from the floor on (dstreams/state_lineage.py)."""
    from dstreams.state_lineage import EMPTY, Lineage

    dropped = EMPTY.with_drops([3000, 7000])
    assert dropped.vid("r", 2000) == EMPTY.vid("r", 2000) == "r"  # nothing dropped at or before 2000
    assert dropped.vid("r", 3000) != EMPTY.vid("r", 3000) and dropped.vid("r", 3000).startswith("r.")
    assert dropped.vid("r", 3000) == dropped.vid("r", 6000) != dropped.vid("r", 7000)
    assert not dropped.agrees(EMPTY, 3000) and dropped.agrees(EMPTY, 2999)
    folded = dropped.pruned(5000)
    assert folded.drops == (7000,) and folded.vid("r", 8000) == dropped.vid("r", 8000)
    assert folded.agrees(dropped, 5000) and not folded.agrees(EMPTY, 5000)
    assert folded.digest(4000) is None and folded.agrees(EMPTY, 4000)  # folded past: cannot tell, trusted
    assert Lineage.from_json(folded.to_json()) == folded and EMPTY.to_json() is None
    assert dropped.upto(5000).misses(dropped, 8000) and not dropped.misses(dropped.upto(5000), 8000)


def test_ensure_base_reuses_a_store_only_with_the_same_dropped_batches(tmp_path):
    """A store that applied 2000 before batch 2000's input was dropped (another history of 2000) is reloaded rather
    than kept or rolled back to the checkpoint at 2000 of the history with the drop; one of that history is reused."""
    from dstreams.state_lineage import EMPTY

    redone = EMPTY.with_drops([2000])
    store = PartitionStore(str(tmp_path / "p.sqlite"))
    records = lambda: [(key_bytes("k"), pickle.dumps(-1))]  # noqa: E731 - the checkpoint's state
    store.ensure_base(0, "r1", lambda: [(key_bytes("k"), pickle.dumps(0))])
    _commit(store, 1000, "r1", {"k": 1})
    _commit(store, 2000, "r1", {"k": 2})  # before the drop
    assert store.ensure_base(2000, "r1", records, lineage=redone) == "reloaded"  # same run, another history
    assert (store.version, store.lineage.vid("r1", 2000), _kv(store)) == (2000, redone.vid("r1", 2000), {"k": -1})
    with store.transaction():
        store.write_many(3000, {key_bytes("k"): pickle.dumps(3)}, {key_bytes("k"): pickle.dumps(-1)})
        store.set_version(3000, "r1", redone)
    assert store.ensure_base(2000, "r2", records, lineage=EMPTY) == "reloaded"  # an earlier run's other history
    assert store.lineage == EMPTY and store.run == "r2"
    _commit(store, 3000, "r2", {"k": 3})
    assert store.ensure_base(2000, "r3", records) == "rolled back"  # the same history (no drop): reused
    assert (store.version, store.run, _kv(store)) == (2000, "r3", {"k": -1})
    store.close()


def test_equal_keys_are_one_key_and_a_bulk_load_keeps_a_keys_last_value(tmp_path):
    a = "x" * 3
    b = "".join(["x", "xx"])  # equal to a, another object
    assert key_bytes((a, a)) == key_bytes((a, b))
    store = PartitionStore(str(tmp_path / "p.sqlite"))
    initial = [(key_bytes(k), pickle.dumps(v)) for k, v in [("x", 1), ("y", 2), ("x", 3)]]
    store.ensure_base(0, "r", lambda: initial)  # a bulk load: a duplicate key replaced
    assert _kv(store) == {"x": 3, "y": 2} and store.keys == 2
    with store.transaction():
        store.reload(0, "r", [])
    _commit(store, 1000, "r", {"a": 1, "b": 2, ("c", 1): 3})
    _commit(store, 2000, "r", {"a": None, "b": 20})
    assert _kv(store) == {"b": 20, ("c", 1): 3} and store.keys == 2
    assert _kv(store, 1000) == {"a": 1, "b": 2, ("c", 1): 3}
    assert {pickle.loads(k): pickle.loads(v) for k, v in store.get_many([key_bytes("b"), key_bytes("zz")]).items()} \
        == {"b": 20}
    with store.transaction():
        store.rollback(0)
    assert _kv(store) == {}
    store.close()


@pytest.mark.slow
def test_a_bulk_load_indexes_a_repeated_keys_last_value_only(tmp_path):
    """Records that give a key twice (an initial state with a repeated key): the key's last value is its state,
    and its deadline is the last value's (none here), whichever chunk of the load the first one fell in."""
    def indexer(vb):
        return (pickle.loads(vb), None) if pickle.loads(vb) >= 0 else (None, None)

    store = PartitionStore(str(tmp_path / "p.sqlite"), indexer)
    records = [(key_bytes("x"), pickle.dumps(5)), (key_bytes("y"), pickle.dumps(6)), (key_bytes("x"), pickle.dumps(-1)),
               *((key_bytes(i), pickle.dumps(-1)) for i in range(100_000)), (key_bytes("y"), pickle.dumps(-2))]
    store.ensure_base(0, "r", lambda: records)
    assert _kv(store)["x"] == -1 and _kv(store)["y"] == -2 and store.keys == 100_002
    assert store.due_keys(10, None) == []
    store.close()


def test_the_store_matches_a_dict_batch_by_batch(tmp_path):
    """A model check: random batches of writes and deletes over 40 keys (strings and tuples); after each batch the
    store, its key count, a lookup of any keys, every older version the log reaches and the delta since each of them
    equal a dict's; rollbacks go back to an older dict."""
    import random

    rnd = random.Random(23)
    keys = [f"k{i}" for i in range(30)] + [(i, "t") for i in range(10)]
    store = PartitionStore(str(tmp_path / "p.sqlite"))
    store.ensure_base(0, "r", lambda: [(key_bytes(k), pickle.dumps(-1)) for k in keys[:5]])
    history = {0: {k: -1 for k in keys[:5]}}
    model = dict(history[0])
    version = 0
    for step in range(60):
        if step % 9 == 8 and len(history) > 2:  # back to an older version the log reaches
            back = rnd.choice(sorted(history)[:-1])
            with store.transaction():
                store.rollback(back)
            history = {v: m for v, m in history.items() if v <= back}
            model, version = dict(history[back]), back
        else:
            version += 1000
            batch = {k: (None if rnd.random() < 0.3 else rnd.randrange(100))
                     for k in rnd.sample(keys, rnd.randrange(1, 15))}
            _commit(store, version, "r", batch)
            for k, v in batch.items():
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = v
            history[version] = dict(model)
        assert _kv(store) == model and store.keys == len(model) and store.count() == len(model)
        wanted = rnd.sample(keys, 12)
        with store.reading():
            got = store.get_many([key_bytes(k) for k in wanted])
        assert {pickle.loads(k): pickle.loads(v) for k, v in got.items()} == {k: model[k] for k in wanted if k in model}
        for old_version, old_model in history.items():
            assert _kv(store, old_version) == old_model
            delta = {pickle.loads(k): (None if v is None else pickle.loads(v))
                     for k, v in store.changed_since(old_version, version)}
            assert all(v == model.get(k) for k, v in delta.items())  # each key written since, as it is now
            assert delta.keys() >= {k for k in model.keys() | old_model.keys() if model.get(k) != old_model.get(k)}
    store.close()


def test_a_snapshot_is_the_store_file_as_of_its_version_and_reads_back_with_the_deltas_after_it(tmp_path):
    """A snapshot part is the store's file copied and rolled back to the checkpoint's version (a writer went on
    meanwhile); read back through the checkpoint reader with a delta after it (an update, a delete, a new key), it
    is the state at the delta's version; the part says how many keys it holds."""
    from dstreams.recovery.checkpoint_files import part_keys, read_state_partition
    from dstreams.recovery.storespec import StoreSpec
    from dstreams.statestore import DELTA, FILE_SNAPSHOT, PART_HEADER, file_rows

    store = PartitionStore(str(tmp_path / "p.sqlite"))
    store.ensure_base(0, "r", lambda: [(key_bytes(("k", i)), pickle.dumps(i)) for i in range(500)])
    _commit(store, 1000, "r", {("k", 1): 100, ("k", 2): None, "new": 7})
    _commit(store, 2000, "r", {("k", 3): 300, "new": None, "later": 8})  # after the snapshot's version
    at_1000 = _kv(store, 1000)
    keys = store.export_file(1000, str(tmp_path / "snap"))
    assert keys == len(at_1000) == 500
    assert sorted(os.listdir(tmp_path)) == ["p.sqlite", "p.sqlite-shm", "p.sqlite-wal", "snap"]  # one file
    assert {pickle.loads(k): pickle.loads(v) for k, v in file_rows(str(tmp_path / "snap"))} == at_1000
    copy = PartitionStore(str(tmp_path / "snap"))
    assert (copy.version, copy.log_floor, copy.keys) == (1000, 1000, 500)
    copy.close()
    assert _kv(store) == {**{("k", i): i for i in range(500) if i != 2}, ("k", 1): 100, ("k", 3): 300, "later": 8}
    with pytest.raises(StateStoreError, match="cannot export version 3000"):
        store.export_file(3000, str(tmp_path / "nope"))

    snapshot = [(PART_HEADER, FILE_SNAPSHOT, keys, (tmp_path / "snap").read_bytes())]
    delta = [(PART_HEADER, DELTA), *store.changed_since(1000, 2000)]
    assert part_keys(snapshot) == 500 and part_keys(delta) == 3 and part_keys([("a", 1)]) is None
    folder = tmp_path / "ckpt"
    layers = _write_layers(folder, {"s": snapshot, "d": delta})
    rebuilt = read_state_partition(StoreSpec(folder.as_uri()), layers, 0)
    assert {pickle.loads(k): pickle.loads(v) for k, v in rebuilt} == _kv(store)

    class FileOnly:  # a reload takes the file and the changes, never the records
        def __init__(self, partition):
            self.partition = partition

        def file_snapshot(self, path):
            return self.partition.file_snapshot(path)

        def __iter__(self):
            raise AssertionError("reloaded record by record")

    def indexer(vb):  # the store's deadline index: an even value comes due at batch time "value"
        return (pickle.loads(vb), None) if pickle.loads(vb) % 2 == 0 else (None, None)

    loaded = PartitionStore(str(tmp_path / "loaded.sqlite"), indexer)
    _commit(loaded, 500, "old", {"stale": 1})
    with loaded.transaction():
        loaded.reload(2000, "r2", FileOnly(read_state_partition(StoreSpec(folder.as_uri()), layers, 0)))
    assert _kv(loaded) == _kv(store) and loaded.keys == len(_kv(store)) and loaded.count() == loaded.keys
    assert (loaded.version, loaded.run, loaded.log_floor) == (2000, "r2", 2000)
    assert {pickle.loads(k) for k in loaded.due_keys(10_000, None)} == {k for k, v in _kv(store).items() if v % 2 == 0}
    assert not [f for f in os.listdir(tmp_path) if ".load-" in f]  # the file it attached is gone
    _commit(loaded, 3000, "r2", {"later": 9})  # the attached file detached: the store goes on
    assert _kv(loaded, 2000) == _kv(store)
    loaded.close()
    store.close()


def _format3_file(path: str, rows: dict) -> int:
    """A store file as store format 3 wrote its snapshots: the state keyed by a 63-bit hash of the key as the row
    id, a key whose hash another key held in the side table ``kvx``, no ``user_version``; returns its number of
    keys."""
    import sqlite3

    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE kv(h INTEGER PRIMARY KEY, k BLOB NOT NULL, v BLOB NOT NULL)")
    db.execute("CREATE TABLE kvx(k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
    db.execute("CREATE TABLE log(ver INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    db.execute("CREATE TABLE meta(name TEXT PRIMARY KEY, value) WITHOUT ROWID")
    items = [(key_bytes(k), pickle.dumps(v)) for k, v in rows.items()]
    for i, (k, v) in enumerate(items[:-1]):
        db.execute("INSERT INTO kv VALUES (?, ?, ?)", ((i * 7919) % 1009, k, v))  # row ids out of key order
    db.execute("INSERT INTO kvx VALUES (?, ?)", items[-1])
    db.execute("INSERT INTO meta VALUES ('version', 1000), ('keys', ?)", (len(items),))
    db.close()
    return len(items)


def _snapshot_of_format(path, fmt: int) -> int:
    """A snapshot file of this store layout that says it is of format ``fmt``; returns its number of keys."""
    import sqlite3

    store = PartitionStore(str(path) + ".store")
    store.ensure_base(1000, "r", lambda: [(key_bytes(i), pickle.dumps(i)) for i in range(20)])
    keys = store.export_file(1000, str(path))
    store.close()
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute(f"PRAGMA user_version = {fmt}")
    db.close()
    return keys


@pytest.mark.parametrize("kind", ["store format 3", "another format", "not a store file"])
def test_a_snapshot_of_another_format_is_refused_with_what_to_do(tmp_path, kind):
    """A state snapshot part whose store file is of another format (the older layout of store format 3, which no
    code reads any more, or one that says it is of another number) is refused, by the checkpoint reader and by a
    store's reload alike, with the error that names the part and says what to do; bytes that are no store file are a
    corrupt checkpoint. The store reloading it is left as it was (its transaction rolled back)."""
    from dstreams.recovery.checkpoint_files import read_state_partition
    from dstreams.recovery.checkpoint_format import CheckpointFormatError
    from dstreams.recovery.codec import CorruptCheckpointError
    from dstreams.recovery.storespec import StoreSpec
    from dstreams.statestore import DELTA, FILE_SNAPSHOT, PART_HEADER, file_format

    _snapshot_of_format(tmp_path / "current", FORMAT)
    assert file_format((tmp_path / "current").read_bytes()) == FORMAT  # what an export writes
    snap = tmp_path / "snap"
    if kind == "store format 3":
        keys, found = _format3_file(str(snap), {**{("k", i): i for i in range(30)}, "shared": 11}), 0
    elif kind == "another format":
        keys, found = _snapshot_of_format(snap, FORMAT + 1), FORMAT + 1
    else:
        snap.write_bytes(b"x" * 100)
        keys, found = 1, None
    assert file_format(snap.read_bytes()) == found
    snapshot = [(PART_HEADER, FILE_SNAPSHOT, keys, snap.read_bytes())]
    layers = _write_layers(tmp_path / "ckpt", {"s": snapshot, "d": [(PART_HEADER, DELTA)]})
    spec = StoreSpec((tmp_path / "ckpt").as_uri())
    if found is None:
        error, match = CorruptCheckpointError, "s/part-00000: its state snapshot is not a store file"
    else:
        error = CheckpointFormatError
        match = (f"(?s)the state snapshot in checkpoint part s/part-00000 was written in checkpoint format {found}; "
                 f"this dstreams .* reads checkpoint format {FORMAT} only.*new checkpoint location")
    with pytest.raises(error, match=match):
        list(read_state_partition(spec, layers, 0))
    store = PartitionStore(str(tmp_path / "p.sqlite"))
    _commit(store, 500, "r0", {"kept": 1})
    with pytest.raises(error, match=match), store.transaction():
        store.reload(2000, "r", read_state_partition(spec, layers, 0))
    assert (store.version, store.run, _kv(store)) == (500, "r0", {"kept": 1})
    store.close()


def _write_layers(folder, parts: dict[str, list]) -> list:
    """Checkpoint layers (oldest first) of one partition each, as :func:`state_layers` gives them."""
    from dstreams.recovery.codec import encode_partition

    layers = []
    for name, records in parts.items():
        data, sha, _ = encode_partition(records)
        (folder / name).mkdir(parents=True)
        (folder / name / "part-00000").write_bytes(data)
        layers.append((name, {0: {"index": 0, "key": "part-00000", "sha256": sha}}))
    return layers


def _gone_pid() -> str:
    """The pid of a process that has ended."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_a_reader_streaming_a_snapshot_removes_the_copies_that_killed_readers_left(tmp_path, monkeypatch):
    """A reader that streams a store-file snapshot (the state read back as an RDD) copies it into the system temp
    folder and removes its copy when done; the copies of readers whose process is gone (a killed task) are removed
    by the next reader, a live reader's are kept."""
    import tempfile

    from dstreams.recovery.checkpoint_files import READER_PREFIX, read_state_partition
    from dstreams.recovery.storespec import StoreSpec
    from dstreams.statestore import FILE_SNAPSHOT, PART_HEADER

    store = PartitionStore(str(tmp_path / "p.sqlite"))
    store.ensure_base(0, "r", lambda: [(key_bytes(i), pickle.dumps(i)) for i in range(50)])
    keys = store.export_file(0, str(tmp_path / "snap"))
    store.close()
    layers = _write_layers(tmp_path / "ckpt", {"s": [(PART_HEADER, FILE_SNAPSHOT, keys,
                                                      (tmp_path / "snap").read_bytes())]})
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    gone = _gone_pid()
    doomed = [f"{READER_PREFIX}{gone}-abc123.sqlite", f"{READER_PREFIX}{gone}-abc123.sqlite-journal"]
    kept = [f"{READER_PREFIX}{os.getpid()}-live.sqlite", f"{READER_PREFIX}notes.txt", "other.sqlite"]
    for n in doomed + kept:
        (temp / n).write_bytes(b"x")
    rows = iter(read_state_partition(StoreSpec((tmp_path / "ckpt").as_uri()), layers, 0))
    first = next(rows)
    mine = [n for n in os.listdir(temp) if n not in kept]
    assert len(mine) == 1 and mine[0].startswith(f"{READER_PREFIX}{os.getpid()}-"), mine  # its copy, while read
    assert {pickle.loads(k): pickle.loads(v) for k, v in [first, *rows]} == {i: i for i in range(50)}
    assert sorted(os.listdir(temp)) == sorted(kept)


def test_opening_a_store_sweeps_what_killed_tasks_and_other_formats_left_beside_it(tmp_path):
    """The temporary files of an export or a reload whose process is gone and the partition's store files of another
    format (a cache: the store is rebuilt from the checkpoint) are removed when the partition's store is opened; a
    live process's files, the store's own files and other partitions' are kept."""
    from dstreams.statestore import store_path

    path = store_path(str(tmp_path), "s", 0)
    folder, name = os.path.split(path)
    gone = _gone_pid()
    doomed = [f"{name}.snapshot-5000-{gone}", f"{name}.snapshot-5000-{gone}.copy-wal", f"{name}.load-{gone}",
              f"p-00000.f{FORMAT - 1}.sqlite", f"p-00000.f{FORMAT - 1}.sqlite-wal",
              f"p-00000.f{FORMAT + 1}.sqlite"]
    kept = [f"{name}.load-{os.getpid()}", f"p-00001.f{FORMAT - 1}.sqlite", "notes.txt"]
    for n in doomed + kept:
        (tmp_path / "s" / n).write_bytes(b"x")
    PartitionStore.open(str(tmp_path), "s", 0).close()
    left = [n for n in os.listdir(folder) if n not in (f"{name}-shm", f"{name}-wal")]  # SQLite's, while open
    assert sorted(left) == sorted([name, *kept])


# ---------------------------------------------------------------------------------------------- streams
def _records(seed: int, t: int, partition: int, n: int):
    return [f"w{(t // 1000 * 7 + partition * 3 + i * (t // 1000 % 3 + 1)) % 13}" for i in range(n)]


def _sum_or_drop(values, state):
    total = (state or 0) + sum(values)
    return None if total > 8 else total  # keys leave the state (and come back)


def _count_batches(values, state):
    seen = (state or 0) + 1
    return None if not values and seen > 4 else seen  # idle keys age out (PySpark's rule: called every batch)


def _parse(lines: list[str]) -> list[tuple]:
    import ast

    return [ast.literal_eval(line) for line in lines]


def _app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    pairs = ssc.generatorStream(5, 2, seed=1, recordFunc=_records).map(lambda w: (w, 1))
    pairs.runningReduce(operator.add).checkpoint("2s").saveAsTextFiles(os.path.join(out, "running"))
    pairs.updateStateByKey(_sum_or_drop, 3, initialRDD=[("w1", 20), ("init", 5)]).checkpoint("2s") \
        .saveAsTextFiles(os.path.join(out, "update"))
    pairs.updateStateByKey(_count_batches).checkpoint("2s").saveAsTextFiles(os.path.join(out, "idle"))
    touched = pairs.updateStateByKey(_sum_or_drop, updateIdleKeys=False).checkpoint("2s")
    touched.saveAsTextFiles(os.path.join(out, "touched"))
    touched.changes().saveAsTextFiles(os.path.join(out, "changes"))
    return ssc


def _run(sc, tmp_path, name: str, store: str, monkeypatch, until_ms: int,
         status: dict | None = None) -> dict[str, list[str]]:
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / f"{name}-local"))
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    ckpt, out = str(tmp_path / f"{name}-ckpt"), str(tmp_path / f"{name}-out")
    with app_context(lambda clock: _app(sc, ckpt, out, clock)) as ssc:
        run_until(ssc, until_ms, flush_checkpoints=True)
        if status is not None and ssc.uiWebUrl:
            deadline = time.monotonic() + 60  # checkpoint sizes are read from the manifests in the background
            while True:
                with urllib.request.urlopen(f"{ssc.uiWebUrl}/api/streams", timeout=30) as r:
                    status["api"] = json.loads(r.read())
                states = [n["state"] for n in status["api"]["nodes"] if n["state"] is not None]
                if all(st["checkpoint_bytes"] is not None for st in states) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            with urllib.request.urlopen(f"{ssc.uiWebUrl}/metrics", timeout=30) as r:
                status["metrics"] = r.read().decode()
    return read_outputs(out)


@pytest.mark.slow
def test_store_backed_state_gives_the_rdd_states_outputs_batch_by_batch(sc, tmp_path, monkeypatch):
    expected = _run(sc, tmp_path, "rdd", "rdd", monkeypatch, 12_000)
    status: dict = {}
    got = _run(sc, tmp_path, "store", "executor", monkeypatch, 12_000, status)
    assert sorted(expected) == sorted(f"{n}-{t}" for n in ("running", "update", "idle", "touched", "changes")
                                      for t in range(1000, 13_000, 1000))
    for name in sorted(expected):
        assert got.get(name) == expected[name], name
    # changes() lists what each batch changed, removals as None (checked against the state streams themselves).
    for t in range(2000, 13_000, 1000):
        before = dict(_parse(expected[f"touched-{t - 1000}"]))
        after = dict(_parse(expected[f"touched-{t}"]))
        want = {k: v for k, v in after.items() if before.get(k) != v} | {k: None for k in before if k not in after}
        assert dict(_parse(expected[f"changes-{t}"])) == want, t
    assert any("None" in line for t in range(1000, 13_000, 1000) for line in expected[f"changes-{t}"])
    # The status page and /metrics show each store's keys (as the last batch left them), its bytes on disk and the
    # newest checkpoint's bytes.
    nodes = {n["key"]: n for n in status["api"]["nodes"]}
    touched = max((n for n in nodes.values() if n["type"] == "StoreUpdateStateNode"), key=lambda n: n["key"])
    state = touched["state"]
    assert state["keys"] == len(expected["touched-12000"]) and state["store"]["as_of_ms"] == 12_000
    assert state["bytes"] > 0 and state["checkpoint_bytes"] > 0
    assert f'dstreams_state_keys{{stream="{touched["key"]}"}} {float(state["keys"])}' in status["metrics"]
    assert f'dstreams_state_disk_bytes{{stream="{touched["key"]}"}}' in status["metrics"]
    assert f'dstreams_checkpoint_bytes{{stream="{touched["key"]}"}}' in status["metrics"]
    # Keys left the state and came back, idle keys aged out: the workload exercises deletes.
    assert any("'init'" in line for line in expected["update-1000"])
    assert len(expected["idle-12000"]) < len({x for t in range(1000, 13_000, 1000) for x in expected[f"idle-{t}"]})
    # Checkpoints: deltas on a chain that starts with a snapshot; the chain is kept while needed.
    store = open_store(str(tmp_path / "store-ckpt"))
    node_keys = {k.split("/")[1] for k in store.list("checkpoints/") if "StoreRunningReduceNode" in k}
    (key,) = node_keys
    times = sorted(list_checkpoints(store, key))
    manifests = {t: load_manifest(store, key, t) for t in times}
    for t, m in manifests.items():
        assert m["format"] == FORMAT and set(m["state"]["chain"]) <= set(times), (t, m["state"])
    assert any(m["state"]["chain"] for m in manifests.values())


def _arm_task_kill(fault_plan, tmp_path, point: str):
    """The first task to reach ``point`` (a task-side point of ``dstreams.faults``) SIGKILLs its Python worker;
    returns the marker file that task removes."""
    from dstreams.faults import KILL, Fault, FaultPlan

    marker = tmp_path / f"kill-{point}"
    marker.write_text(f"the first task to reach {point} removes this file and kills itself\n")
    fault_plan(FaultPlan(tasks=(Fault(point, KILL, marker=str(marker)),)))
    return marker


def _killed_and_swept(fault_plan, marker, local_dir, leftover: str) -> None:
    """The armed kill happened, is disarmed, and the killed task's ``leftover`` file is gone."""
    from dstreams.faults import NO_FAULTS

    assert not marker.exists(), f"no task reached the kill point ({marker.name})"
    fault_plan(NO_FAULTS)
    left = [p.name for p in local_dir.rglob("*") if leftover in p.name]
    assert not left, left  # the killed task's file was swept when its partition's store was opened again


def _rdd_reference(sc, tmp_path_factory, app, name: str, last_ms: int) -> dict[str, list[str]]:
    """The outputs of ``app`` on the RDD state through batch ``last_ms``, uninterrupted (for a module fixture)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DSTREAMS_STATE_STORE", "rdd")
    tmp = tmp_path_factory.mktemp(name)
    try:
        with app_context(lambda clock: app(sc, str(tmp / "ckpt"), str(tmp / "out"), clock)) as ssc:
            run_until(ssc, last_ms, flush_checkpoints=True)
    finally:
        mp.undo()
    return read_outputs(str(tmp / "out"))


@pytest.fixture(scope="module")
def restart_reference(sc, tmp_path_factory) -> dict[str, list[str]]:
    """The outputs of :func:`_app` through batch 14 on the RDD state, uninterrupted: computed once for every
    :func:`_restart_case`."""
    return _rdd_reference(sc, tmp_path_factory, _app, "restart-ref", 14_000)


def _restart_case(sc, tmp_path, monkeypatch, expected: dict[str, list[str]], local: str, kill: str | None = None,
                  caplog=None, fault_plan=None) -> None:
    """A store-backed run stopped after batch 7 and resumed from its checkpoint at 10.5 s (``local``: its stores
    kept, lost, or left as files of another format, which are deleted and rebuilt from the checkpoint) gives the
    outputs of an uninterrupted run on the RDD state (``expected``: the ``restart_reference`` fixture's). ``kill``: a
    task point (``dstreams.faults``, installed with ``fault_plan``) at which the first task to reach it SIGKILLs its
    Python worker:
    ``state-export`` in the first run (a checkpoint's snapshot written beside the store), ``state-reload`` in the
    second (a lost store's snapshot written beside it inside the reload's transaction); ``caplog`` sees the failure
    logged."""
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    local_dir = tmp_path / "local"
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(local_dir))
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    marker = _arm_task_kill(fault_plan, tmp_path, kill) if kill == "state-export" else None
    with app_context(lambda clock: _app(sc, ckpt, out, clock), checkpoint=ckpt) as first:
        run_until(first, 7000, flush_checkpoints=True)
    # the driver "dies" after batch 7 (its stores are at 7 s)
    if marker is not None:
        _killed_and_swept(fault_plan, marker, local_dir, ".snapshot-")
        assert any("failed (the next one will be tried)" in r.getMessage() for r in caplog.records
                   if r.name == "dstreams.recovery.checkpointer"), "the killed export failed no checkpoint"
    if local == "lost":
        shutil.rmtree(local_dir)  # the executors' disks are gone: every store is read back from checkpoints
    older = _as_another_format(local_dir) if local == "another format" else []
    marker = _arm_task_kill(fault_plan, tmp_path, kill) if kill == "state-reload" else None
    with app_context(lambda clock: _app(sc, ckpt, out, clock), checkpoint=ckpt, start_ms=10_500) as second:
        run_until(second, 14_000, flush_checkpoints=True)
    if marker is not None:
        _killed_and_swept(fault_plan, marker, local_dir, ".load-")
        assert any("trying the batch again" in r.getMessage() for r in caplog.records
                   if r.name == "dstreams.scheduler"), "the killed reload failed no batch"
    got = read_outputs(out)
    assert sorted(got) == sorted(expected)
    for name in sorted(expected):
        assert got[name] == expected[name], name
    if local == "another format":  # deleted when the partitions' stores were opened, and rebuilt
        assert older and not [p for p in older if p.exists()], older


def _as_another_format(local_dir) -> list:
    """Rename every store file under ``local_dir`` as a file of the previous format (what a dstreams of another format
    left on the executors' disks); returns the new paths."""
    renamed = []
    for path in sorted(local_dir.rglob(f"p-*.f{FORMAT}.sqlite*")):
        renamed.append(path.with_name(path.name.replace(f".f{FORMAT}.sqlite", f".f{FORMAT - 1}.sqlite")))
        path.rename(renamed[-1])
    return renamed


@pytest.mark.slow
@pytest.mark.parametrize("local", ["kept", "lost", "another format"])
def test_restart_from_checkpoint_gives_the_uninterrupted_outputs(sc, tmp_path, monkeypatch, restart_reference, local):
    _restart_case(sc, tmp_path, monkeypatch, restart_reference, local)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["state-export", "state-reload"])
def test_a_task_killed_while_it_exports_or_reloads_a_snapshot_loses_nothing_and_leaves_nothing(
        sc, tmp_path, monkeypatch, caplog, restart_reference, point, fault_plan):
    """``state-export``: a task SIGKILLed inside a checkpoint's snapshot export (its store file written beside the
    store, not yet read): that checkpoint fails and the next one is tried; the outputs equal the RDD state's, the
    killed task's file is removed when the partition's store is opened again, and a restart with the stores lost,
    read back from the checkpoints written after the kill, gives the uninterrupted outputs. ``state-reload``: after
    that restart, a task SIGKILLed while it reloads its lost store from the snapshot (the file written beside the
    store, inside the store's transaction): the batch's retry reloads it, the outputs are the same, the file is
    gone."""
    _restart_case(sc, tmp_path, monkeypatch, restart_reference, "lost", point, caplog, fault_plan)


@pytest.mark.slow
def test_a_restart_before_the_initial_state_was_checkpointed_says_what_to_do(sc, tmp_path, monkeypatch):
    """The initial state is checkpointed at the zero time after the first batch, not stored in the graph: a driver
    that stops before that cannot restore it, and says so; the way out it names (a new location) works."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / "local"))

    def app(ckpt: str, out: str, clock) -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.checkpoint(ckpt)
        pairs = ssc.generatorStream(5, 2, seed=1, recordFunc=_records).map(lambda w: (w, 1))
        pairs.updateStateByKey(_sum_or_drop, 2, initialRDD=[("init", 5)]).saveAsTextFiles(os.path.join(out, "state"))
        return ssc

    ckpt = str(tmp_path / "ckpt")
    with app_context(lambda clock: app(ckpt, str(tmp_path / "out"), clock), checkpoint=ckpt) as first:
        first.start()
    # stopped before any batch: the graph is stored, the initial state is not
    with app_context(lambda clock: app(ckpt, str(tmp_path / "out"), clock), checkpoint=ckpt) as second:
        second.start()
        second.clock.set_time(1000)
        with pytest.raises(Exception, match="before the initial state .* was checkpointed"):
            second.awaitTermination(120)
    fresh = str(tmp_path / "fresh")  # the way out: a new checkpoint location
    with app_context(lambda clock: app(fresh, str(tmp_path / "out3"), clock), checkpoint=fresh) as third:
        run_until(third, 2000, flush_checkpoints=True)
    assert "('init', 5)" in read_outputs(str(tmp_path / "out3"))["state-1000"]


def _removal_app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    pairs = ssc.generatorStream(5, 2, seed=1, recordFunc=_records).map(lambda w: (w, 1))
    pairs.runningReduce(operator.add).checkpoint("4s").saveAsTextFiles(os.path.join(out, "running"))
    pairs.updateStateByKey(_sum_or_drop, updateIdleKeys=False).checkpoint("4s") \
        .saveAsTextFiles(os.path.join(out, "touched"))
    return ssc


@pytest.fixture(scope="module")
def removal_reference(sc, tmp_path_factory) -> dict[str, list[str]]:
    """The outputs of :func:`_removal_app` on the RDD state, batches 1-10, computed once."""
    return _rdd_reference(sc, tmp_path_factory, _removal_app, "removal-ref", 10_000)


@contextlib.contextmanager
def _start_and_remove_stores(sc, tmp_path, monkeypatch, ckpt: str, out: str) -> Iterator[StreamingContext]:
    """A store-backed run of :func:`_removal_app` through batch 7 (its checkpoint of batch 4 adopted long
    before), then the executors' store folder removed (a disk wiped, a host replaced)."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    local_dir = tmp_path / "local"
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(local_dir))
    with app_context(lambda clock: _removal_app(sc, ckpt, out, clock), checkpoint=ckpt) as ssc:
        run_until(ssc, 7000, flush_checkpoints=True)
        shutil.rmtree(local_dir)
        yield ssc


@pytest.mark.slow
def test_stores_removed_under_a_running_stream_are_rebuilt_by_the_batchs_retry(sc, tmp_path, monkeypatch,
                                                                               removal_reference):
    """The batch after the removal fails on the missing stores (``StateStoreError``); its retry recomputes the
    handles from the newest checkpoint through lineage, which loads the stores again: the outputs are those of a
    run without the fault."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with _start_and_remove_stores(sc, tmp_path, monkeypatch, ckpt, out) as ssc:
        run_until(ssc, 10_000, flush_checkpoints=True)
        attempts = {i.batch_time_ms: i.attempts for i in ssc.batchInfos()}
    assert attempts[8000] == 2, attempts  # the first try failed on the removed stores, the retry rebuilt them
    _assert_same_outputs(out, removal_reference)


@pytest.mark.slow
def test_stores_removed_without_retries_stop_the_stream_and_the_named_restart_loses_nothing(
        sc, tmp_path, monkeypatch, removal_reference):
    """With one try per batch (``spark.dstreams.batch.maxAttempts=1``) the batch after the removal fails for good:
    the context stops with the ``StateStoreError`` that says to restart from the checkpoint, the batch not done;
    that restart (``getOrCreate``) then writes exactly the outputs of a run without the fault."""
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with _start_and_remove_stores(sc, tmp_path, monkeypatch, ckpt, out) as first:
        first.clock.set_time(8000)
        with pytest.raises(Exception, match="restart the stream from its checkpoint"):
            first.awaitTermination(180)
    assert not any(name.endswith("-8000") for name in read_outputs(out))  # the failed batch is not done
    monkeypatch.delenv("DSTREAMS_BATCH_MAX_ATTEMPTS")
    with app_context(lambda clock: _removal_app(sc, ckpt, out, clock), checkpoint=ckpt, start_ms=8000) as second:
        run_until(second, 10_000, flush_checkpoints=True)
    _assert_same_outputs(out, removal_reference)


# ------------------------------------------------------------------ the changelog (spark.dstreams.state.changelog)


class _DictChangelog:
    """A changelog in memory (the contract :class:`dstreams.contracts.StateChangelog`), recording what it was asked."""

    def __init__(self, checkpoint: dict[bytes, bytes]) -> None:
        self.checkpoint, self.entries, self.asked = checkpoint, {}, []

    def write(self, run, version, partition, entries):
        self.entries[(run, version, partition)] = list(entries)

    def read(self, run, version, partition):
        self.asked.append(("read", version))
        return self.entries[(run, version, partition)]  # KeyError: never written, or deleted

    def checkpoint_state(self, time_ms, partition):
        self.asked.append(("checkpoint", time_ms))
        return iter(self.checkpoint.items())


def test_catch_up_reloads_a_foreign_store_applies_only_what_a_store_behind_lacks_and_names_a_missing_change(tmp_path):
    """``catch_up`` alone (what a task does on a store that is not where its batch builds on): a store of another run
    is reloaded from the plan's checkpoint and every version since is applied; a store of this run left behind applies
    only the versions after its own; a plan that does not reach the target is refused (False); a change that cannot be
    read is a ``StateStoreError`` (the batch's retry then rebuilds through lineage)."""
    from dstreams.nodes.store_state import catch_up

    changelog = _DictChangelog({key_bytes("a"): pickle.dumps(1), key_bytes("b"): pickle.dumps(2)})
    changelog.write("run", 2000, 0, [(key_bytes("a"), pickle.dumps(10)), (key_bytes("c"), pickle.dumps(3))])
    changelog.write("run", 3000, 0, [(key_bytes("b"), None)])
    plan = (1000, False, (2000, 3000))
    store = PartitionStore(str(tmp_path / "s.sqlite"))
    _commit(store, 5000, "an-older-run", {"z": 26})  # another run's store: nothing of it may survive
    with store.transaction():
        assert catch_up(store, changelog, "run", 0, 3000, plan)
    assert (store.version, store.run) == (3000, "run") and _kv(store) == {"a": 10, "c": 3}
    assert changelog.asked == [("checkpoint", 1000), ("read", 2000), ("read", 3000)]
    assert _kv(store, 2000) == {"a": 10, "b": 2, "c": 3}  # the versions it applied are in its log

    behind = PartitionStore(str(tmp_path / "behind.sqlite"))
    with behind.transaction():
        assert catch_up(behind, changelog, "run", 0, 2000, plan)  # this run's store, at 2000
    changelog.asked.clear()
    with behind.transaction():
        assert catch_up(behind, changelog, "run", 0, 3000, plan)
    assert changelog.asked == [("read", 3000)] and _kv(behind) == {"a": 10, "c": 3}

    with behind.transaction():
        assert not catch_up(behind, changelog, "run", 0, 4000, plan)  # the plan does not reach 4000
    lost = PartitionStore(str(tmp_path / "lost.sqlite"))
    del changelog.entries[("run", 3000, 0)]
    with pytest.raises(StateStoreError, match="could not be brought to version 3000 from the changelog"):
        with lost.transaction():
            catch_up(lost, changelog, "run", 0, 3000, plan)
    assert lost.version is None  # rolled back with the task's transaction




def _changelog_versions(ckpt: str) -> dict[int, set[str]]:
    """Per version: the changelog objects in the checkpoint location (``<run>-p<partition>``)."""
    versions: dict[int, set[str]] = {}
    for key in open_store(ckpt).list("changelogs/"):
        _, _node, version, name = key.split("/")
        versions.setdefault(int(version), set()).add(name)
    return versions


def _assert_same_outputs(out: str, reference: dict[str, list[str]]) -> None:
    """Every output of the run in ``out`` equals the fault-free run's, batch by batch."""
    got = read_outputs(out)
    assert sorted(got) == sorted(reference)
    for name in sorted(reference):
        assert got[name] == reference[name], name


def _run_with_store_fault(sc, tmp_path, monkeypatch, fault: str) -> tuple[dict[int, int], str]:
    """:func:`_removal_app` on the executor store with the changelog on, through batch 10, the executors' stores
    damaged after batch 7: ``removed`` (a host that never ran the partitions, a disk wiped), ``behind`` (the stores
    as they were after batch 5: a host the partitions ran on before), or ``removed-no-changelog`` (removed, and the
    changelog objects since the checkpoint deleted too). Returns each batch's tries, the output folder and how many
    times a task brought a store up to date from the changelog (the streams' ``store_metrics``)."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    monkeypatch.setenv("DSTREAMS_STATE_CHANGELOG", "on")
    local_dir, copy = tmp_path / "local", tmp_path / "local-at-5"
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(local_dir))
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    retried: list[tuple[int, str]] = []
    with app_context(lambda clock: _removal_app(sc, ckpt, out, clock), checkpoint=ckpt) as ssc:
        run_until(ssc, 5000, flush_checkpoints=True)
        shutil.copytree(local_dir, copy)
        run_until(ssc, 7000, flush_checkpoints=True)
        if fault == "changelog-write-fails":
            _block_changelog_writes(ssc, ckpt, 8000, retried)
        else:
            shutil.rmtree(local_dir)
        if fault == "behind":
            shutil.copytree(copy, local_dir)
        if fault == "removed-no-changelog":
            store = open_store(ckpt)
            for key in store.list("changelogs/"):
                store.delete(key)
        run_until(ssc, 10_000, flush_checkpoints=True)
        attempts = {i.batch_time_ms: i.attempts for i in ssc.batchInfos()}
        stores = {n.key: n.store_metrics() for n in ssc._graph.nodes if store_backed(n)}
        metrics = ""
        if ssc.uiWebUrl:
            with urllib.request.urlopen(f"{ssc.uiWebUrl}/metrics", timeout=30) as r:
                metrics = r.read().decode()
    assert len(stores) == 2 and all(m is not None and m["changelog"] for m in stores.values()), stores
    for key, m in stores.items():  # /metrics counts each stream's catch-ups
        assert f'dstreams_state_caught_up_total{{stream="{key}"}} {float(m["caught_up"])}' in metrics, metrics
    if fault == "changelog-write-fails":
        assert retried and retried[0][0] == 8000 and "changelogs/" in retried[0][1], retried
    return attempts, out, sum(m["caught_up"] for m in stores.values())


def _block_changelog_writes(ssc, ckpt: str, version: int, retried: list[tuple[int, str]]) -> None:
    """Make every store-backed stream's changelog writes of batch ``version`` fail (a file where the batch's folder
    of changelog objects goes: the store's put fails, as a store that refuses the write would), until the batch's
    first try failed: the blockers go just before its retry (the scheduler's ``before_batch_retry``)."""
    nodes = [n for n in ssc._graph.nodes if store_backed(n)]
    blockers = [os.path.join(ckpt, "changelogs", n.key, f"{version:015d}") for n in nodes]
    for path in blockers:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("not a folder")
    original = nodes[0].before_batch_retry

    def unblock(time, error):
        retried.append((time.ms, str(error)))
        for path in blockers:
            if os.path.isfile(path):
                os.remove(path)
        original(time, error)

    nodes[0].before_batch_retry = unblock


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["removed", "behind"])
def test_stores_lost_or_behind_are_brought_up_to_date_from_the_changelog(sc, tmp_path, monkeypatch,
                                                                        removal_reference, fault):
    """With ``spark.dstreams.state.changelog=on`` a task that finds its partition's store missing (another host, a
    wiped disk) or at an older version of this run (a host the partition ran on before) brings it up to date inside
    the task, from the newest adopted checkpoint and each batch's changes since: the batch does not fail, and the
    outputs are those of a run without the fault."""
    attempts, out, caught_up = _run_with_store_fault(sc, tmp_path, monkeypatch, fault)
    assert set(attempts.values()) == {1}, attempts  # no batch failed: no retry rebuilt anything through lineage
    assert caught_up >= 2, caught_up  # each stream's partitions (at least one each) caught up
    _assert_same_outputs(out, removal_reference)
    # One object per batch and partition of each store-backed stream (two streams), each run's under its token.
    versions = _changelog_versions(str(tmp_path / "ckpt"))
    assert set(versions) == set(range(1000, 11_000, 1000)), sorted(versions)
    assert all(len(names) == 2 * len({n.rsplit("-p", 1)[1] for n in names}) for names in versions.values())


@pytest.mark.slow
def test_a_changelog_that_cannot_be_read_falls_back_to_the_batchs_retry(sc, tmp_path, monkeypatch,
                                                                        removal_reference):
    """The changelog objects deleted as well as the stores: the catch-up fails with a ``StateStoreError`` naming
    the changelog, and the batch's retry rebuilds the stores through lineage (as without a changelog): the outputs
    are still those of a run without the fault."""
    attempts, out, _ = _run_with_store_fault(sc, tmp_path, monkeypatch, "removed-no-changelog")
    assert attempts[8000] == 2, attempts
    _assert_same_outputs(out, removal_reference)


@pytest.mark.slow
def test_a_changelog_write_that_fails_fails_the_task_inside_the_stores_transaction(sc, tmp_path, monkeypatch,
                                                                                  removal_reference):
    """Batch 8's changelog objects cannot be written: its tasks fail after applying the batch to their stores but
    before the stores commit, so each store rolls back to batch 7; the batch's retry applies it again (no store
    says "applied already" without its changelog) and writes the changelog; the outputs are those of a run without
    the fault, and every batch's changelog objects are there."""
    attempts, out, _ = _run_with_store_fault(sc, tmp_path, monkeypatch, "changelog-write-fails")
    assert attempts[8000] == 2 and {a for t, a in attempts.items() if t != 8000} == {1}, attempts
    _assert_same_outputs(out, removal_reference)
    versions = _changelog_versions(str(tmp_path / "ckpt"))
    assert set(versions) == set(range(1000, 11_000, 1000)), sorted(versions)
    assert len(versions[8000]) == len(versions[7000]), versions


@pytest.mark.slow
def test_the_changelog_is_deleted_with_the_checkpoints_it_builds_on(sc, tmp_path, monkeypatch):
    """Old checkpoints go (two newer ones kept) and the changelog objects at or before them with them: what is
    left reaches back from the oldest kept checkpoint, and every version after it is there."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_CHANGELOG", "on")
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")  # a snapshot every other checkpoint: older chains go
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / "local"))
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with manual_context(1, sc=sc, checkpoint=ckpt) as ssc:
        pairs = ssc.generatorStream(5, 2, seed=1, recordFunc=_records).map(lambda w: (w, 1))
        pairs.runningReduce(operator.add).checkpoint("2s").saveAsTextFiles(os.path.join(out, "running"))
        run_until(ssc, 16_000, flush_checkpoints=True)
    store = open_store(ckpt)
    (key,) = {k.split("/")[1] for k in store.list("checkpoints/") if "StoreRunningReduceNode" in k}
    oldest_kept = min(list_checkpoints(store, key))
    assert oldest_kept > 4000  # checkpoints every 2 s: some were deleted
    versions = _changelog_versions(ckpt)
    assert min(versions) > oldest_kept - 2000, (oldest_kept, sorted(versions))  # none at or before a deleted one
    assert set(range(oldest_kept + 1000, 17_000, 1000)) <= set(versions)


def _initial_app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    pairs = ssc.generatorStream(5, 2, seed=1, recordFunc=_records).map(lambda w: (w, 1))
    initial = sc.parallelize([(f"w{i}", 100 + i) for i in range(13)], 3)
    pairs.updateStateByKey(lambda vs, s: (s or 0) + sum(vs), initialRDD=initial).checkpoint("6s") \
        .saveAsTextFiles(os.path.join(out, "totals"))
    return ssc


@pytest.mark.slow
def test_stores_removed_before_the_first_checkpoint_catch_up_from_the_initial_states_checkpoint(
        sc, tmp_path, tmp_path_factory, monkeypatch):
    """Issue 42: with an ``initialRDD``, the state's checkpoint at the zero time (written right after the first
    batch) is where a store can be brought up to date from: stores removed (a task on another host) before the
    first regular checkpoint catch up from it and the changelog, and no batch fails."""
    reference = _rdd_reference(sc, tmp_path_factory, _initial_app, "initial-ref", 4000)
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_CHANGELOG", "on")
    local_dir = tmp_path / "local"
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(local_dir))
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: _initial_app(sc, ckpt, out, clock), checkpoint=ckpt) as ssc:
        run_until(ssc, 2000, flush_checkpoints=True)  # the zero time's checkpoint is written and adopted
        shutil.rmtree(local_dir)
        run_until(ssc, 4000, flush_checkpoints=True)  # before the checkpoint of 6000
        attempts = {i.batch_time_ms: i.attempts for i in ssc.batchInfos()}
        caught_up = sum(n.store_metrics()["caught_up"] for n in ssc._graph.nodes if store_backed(n))
    assert set(attempts.values()) == {1}, attempts
    assert caught_up >= 1
    _assert_same_outputs(out, reference)
