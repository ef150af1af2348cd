"""The executor store's changelog catch-up from the first batch on, and the cleanup of stale store copies (issue 42).

A task whose partition's store is missing on its host, or left behind there, brings it up to date inside the task from
the changelog (``spark.dstreams.state.changelog=on``): from the newest adopted checkpoint, or, before any, from the
state loaded at the zero time (empty, or the ``initialRDD``, whose load writes itself to the changelog). These tests
remove or replace the store folder *inside* a batch (an output operation between two reads of the same state), so
that a task of the same batch and the zero time's checkpoint meet a folder as another host would show it, before the
zero time's checkpoint is adopted, and again between it and the first regular checkpoint. The outputs must equal the
RDD state's, and no batch may fail.

Stale copies: a copy of a partition on a host whose version is below the stream's cleanup horizon (the newest
adopted checkpoint and the oldest version a kept RDD may read) is deleted by the stream's next task on that host,
unless a task holds it open (:func:`dstreams.statestore.sweep_stale`).
"""

from __future__ import annotations

import operator
import os
import pickle
import shutil

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.nodes.store_state import ExecutorStore
from dstreams.spark.jvm import state_level
from dstreams.statestore import PartitionStore, key_bytes, store_path
from dstreams.testing import run_until

from ..recovery_app import read_outputs
from ..support import store_backed

LAST_MS = 5000


def _words(seed: int, t: int, partition: int, n: int) -> list[str]:
    """11 keys, and ``x1``, ``x2``, ``x3`` once each (in batches 1-3): ``track`` times them out two batches later in
    batches without their events, which only its deadline index finds."""
    sec = t // 1000
    once = [f"x{sec}"] if partition == 0 and sec <= 3 else []
    return once + [f"w{(sec * 5 + partition * 3 + i * (sec % 3 + 1)) % 11}" for i in range(n) if (sec + i) % 4]


def _sum_or_drop(values, state):
    total = (state or 0) + sum(values)
    return None if total > 15 else total


def _count_init(key, _value):
    return 1


def _count_update(key, state, _value):
    return None if state >= 5 else state + 1


class _Folder:
    """What happens to the executors' store folder inside a batch (an output operation between two reads of each
    state): ``remove`` at these batch times (a host that never held the stores), ``keep`` a copy at this time and
    ``restore`` it at a later one (a host that ran the partitions before)."""

    def __init__(self, local_dir: str, remove: tuple[int, ...] = (), keep: int | None = None,
                 restore: int | None = None) -> None:
        self.local_dir, self.remove, self.keep, self.restore = local_dir, remove, keep, restore

    def __call__(self, time, rdd) -> None:
        t = round(time.timestamp() * 1000)
        copy = self.local_dir + "-kept"
        if t == self.keep and os.path.isdir(self.local_dir):
            shutil.copytree(self.local_dir, copy)
        if (t in self.remove or t == self.restore) and os.path.isdir(self.local_dir):
            shutil.rmtree(self.local_dir)
        if t == self.restore and os.path.isdir(copy):
            shutil.copytree(copy, self.local_dir)


def _app(sc, ckpt: str, out: str, clock, folder: _Folder) -> StreamingContext:
    """``updateStateByKey`` with an ``initialRDD``, ``runningReduce``, ``track`` (timeouts: its deadline index) and
    the incremental window, checkpointed every 10 s (no regular checkpoint in the run): each state read once, then
    ``folder`` acts, then each read again."""
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    words = ssc.generatorStream(6, 2, seed=1, recordFunc=_words)
    pairs = words.map(lambda w: (w, 1))
    initial = sc.parallelize([(f"w{i}", 10 + i) for i in range(0, 11, 2)] + [("init", 1)], 2)
    states = {
        "update": pairs.updateStateByKey(_sum_or_drop, 2, initialRDD=initial, updateIdleKeys=False),
        "running": pairs.runningReduce(operator.add, 2),
        "track": pairs.track(_count_init, _count_update, "2s", 2),
        "window": pairs.reduceByKeyAndWindow(operator.add, operator.sub, "5s", "1s", 2, lambda kv: kv[1] > 0),
    }
    for name, stream in states.items():
        stream.checkpoint("10s").saveAsTextFiles(os.path.join(out, name))
    words.foreachRDD(folder)
    states["update"].changes().saveAsTextFiles(os.path.join(out, "update-changes"))
    states["track"].map(lambda kv: kv).saveAsTextFiles(os.path.join(out, "track-again"))
    return ssc


def _run(sc, tmp_path, monkeypatch, store: str, **folder) -> tuple[dict[str, list[str]], dict[int, int], int]:
    """The app through :data:`LAST_MS` on ``store``: its outputs, each batch's tries and the catch-ups counted; every
    checkpoint write succeeded (the zero time's export of the ``initialRDD`` included)."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    monkeypatch.setenv("DSTREAMS_STATE_CHANGELOG", "on")
    local_dir = str(tmp_path / f"{store}-local")
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", local_dir)
    ckpt, out = str(tmp_path / f"{store}-ckpt"), str(tmp_path / f"{store}-out")
    clock = ManualClock()
    ssc = _app(sc, ckpt, out, clock, _Folder(local_dir, **folder))
    try:
        ssc.start()
        run_until(ssc, LAST_MS, flush_checkpoints=True)
        attempts = {i.batch_time_ms: i.attempts for i in ssc.batchInfos()}
        caught_up = sum((n.store_metrics() or {}).get("caught_up", 0) for n in ssc._graph.nodes
                        if store_backed(n))
        errors = [str(e) for e in ssc._checkpointer.errors]
        written = {(w.node_key.split("-")[1], w.time_ms) for w in ssc._checkpointer.recent_writes if w.committed}
    finally:
        ssc.stop(stopSparkContext=False)
    assert not errors, errors
    if store == "executor":
        assert ("StoreUpdateStateNode", 0) in written, written  # the initial state's checkpoint at the zero time
    return read_outputs(out), attempts, caught_up


@pytest.fixture(scope="module")
def reference(sc, tmp_path_factory) -> dict[str, list[str]]:
    """The app's outputs on the RDD state (no store, nothing removed), computed once."""
    mp = pytest.MonkeyPatch()
    try:
        outputs, _, _ = _run(sc, tmp_path_factory.mktemp("catchup-ref"), mp, "rdd")
    finally:
        mp.undo()
    names = {"update", "running", "track", "window", "update-changes", "track-again"}
    assert sorted(outputs) == sorted(f"{n}-{t}" for n in names for t in range(1000, LAST_MS + 1, 1000))
    # The workload exercises what the catch-up must get right: the initial state, keys dropped, timeouts.
    assert "('init', 1)" in outputs["update-1000"] and "('init', 1)" in outputs["update-3000"]
    assert any("None" in line for t in range(2000, LAST_MS + 1, 1000) for line in outputs[f"update-changes-{t}"])
    assert any(line.startswith("('x2'") for line in outputs["track-3000"])
    assert not any(line.startswith("('x2'") for line in outputs["track-4000"])  # timed out through the index
    assert any(line.startswith("('x3'") for line in outputs["track-4000"])
    assert not any(line.startswith("('x3'") for line in outputs["track-5000"])
    return outputs


def _same(got: dict[str, list[str]], expected: dict[str, list[str]]) -> None:
    assert sorted(got) == sorted(expected)
    for name in sorted(expected):
        assert got[name] == expected[name], name


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(600)  # the reference run is computed inside the test's time
def test_the_catch_up_works_from_the_first_batch_on_with_and_without_an_initial_state(sc, tmp_path, monkeypatch,
                                                                                      reference):
    """The stores vanish inside batch 1 (before the zero time's checkpoint of the ``initialRDD`` is written: that
    checkpoint's export and the batch's second reads catch up) and inside batch 3 (after it was adopted, before the
    first regular checkpoint); inside batch 4 the folder is replaced by its copy of batch 2 (a host the partitions ran
    on before: this run's stores, behind). No batch fails, every checkpoint is written, stores are caught up, and the
    outputs equal the RDD state's."""
    got, attempts, caught_up = _run(sc, tmp_path, monkeypatch, "executor", remove=(1000, 3000), keep=2000,
                                    restore=4000)
    assert set(attempts.values()) == {1}, attempts
    assert caught_up >= 12, caught_up  # each of the four state streams caught up after each of the three faults
    _same(got, reference)


# ---------------------------------------------------------------------------------------------- stale copies
def _store_at(local_dir: str, partition: int, version: int, run: str = "run") -> str:
    store = PartitionStore.open(local_dir, "s", partition)
    try:
        with store.transaction():
            writes = {key_bytes(f"k{partition}"): pickle.dumps(version)}
            store.write_many(version, writes, store.get_many(writes))
            store.set_version(version, run)
    finally:
        store.close()
    return store_path(local_dir, "s", partition)


def test_a_stale_copy_is_deleted_and_a_current_or_open_one_is_kept(tmp_path):
    """:func:`sweep_stale` over a host's folder of one stream: copies below the horizon go (this run's or another's),
    with SQLite's files beside them and their lock; a copy at or above it stays; a stale copy a task holds open stays
    (the sweep never waits for it), and is deleted by a later sweep once closed; a store opened after a deletion is
    a new, empty one."""
    from dstreams.statestore import sweep_stale

    local = str(tmp_path / "host")
    stale = _store_at(local, 0, 3000)
    other_run = _store_at(local, 1, 2000, run="older")
    current = _store_at(local, 2, 8000)
    at_horizon = _store_at(local, 3, 6000)
    held = _store_at(local, 4, 3000)
    task = PartitionStore.open(local, "s", 4)  # a running task of partition 4 on this host
    try:
        removed = sweep_stale(os.path.dirname(stale), 6000)
        assert sorted(removed) == [0, 1]
        names = set(os.listdir(os.path.dirname(stale)))
        for path in (stale, other_run):
            assert not any(n.startswith(os.path.basename(path)) for n in names), names
            assert not any(n.startswith(os.path.basename(path).split(".")[0] + ".") for n in names), names
        for path in (current, at_horizon, held):
            assert os.path.basename(path) in names
        assert task.version == 3000
    finally:
        task.close()
    assert sweep_stale(os.path.dirname(stale), 6000) == [4]
    fresh = PartitionStore.open(local, "s", 0)
    try:
        assert fresh.version is None and fresh.count() == 0
    finally:
        fresh.close()


def _counts_through(last_ms: int) -> list[str]:
    """The running counts of :func:`_words` (two input partitions of 6 records) through batch ``last_ms``, as
    ``saveAsTextFiles`` writes them."""
    counts: dict[str, int] = {}
    for t in range(1000, last_ms + 1, 1000):
        for p in range(2):
            for w in _words(1, t, p, 6):
                counts[w] = counts.get(w, 0) + 1
    return sorted(str(kv) for kv in counts.items())


def _versions(folder: str) -> dict[int, int | None]:
    """Per partition: the version of its copy in one stream's store folder on a 'host'."""
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".sqlite"):
            store = PartitionStore(os.path.join(folder, name))
            try:
                found[int(name[2:7])] = store.version
            finally:
                store.close()
    return found


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(600)  # 180 s measured with the machine's two cores shared by about 20 busy processes
def test_a_hosts_stale_copies_are_deleted_by_its_next_task_and_its_current_ones_kept(sc, tmp_path, monkeypatch):
    """'Host' A (a store folder) runs the four partitions of a ``runningReduce`` through batch 2, host B takes them
    from batch 3 (caught up from the checkpoint of 2 and the changelog) and checkpoints 4 and 6 are adopted; when A
    runs the stream again at batch 8 its copies (version 2000) are below the cleanup horizon (3000 there: the log
    floor, older than the checkpoint of 6): the first task that finishes on A deletes those no task holds (at least
    two: two task slots), and their tasks rebuild them from the checkpoint and the changelog. The later sweeps on A
    (horizons 4000 and 5000) keep its current copies. No batch fails; the outputs are the exact running counts."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_CHANGELOG", "on")
    host_a, host_b = str(tmp_path / "host-a"), str(tmp_path / "host-b")
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", host_a)
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    pairs = ssc.generatorStream(6, 2, seed=1, recordFunc=_words).map(lambda w: (w, 1))
    pairs.runningReduce(operator.add, 4).checkpoint("2s").saveAsTextFiles(os.path.join(out, "running"))
    (node,) = [n for n in ssc._graph.nodes if isinstance(getattr(n, "backend", None), ExecutorStore)]
    try:
        ssc.start()
        run_until(ssc, 2000, flush_checkpoints=True)
        folder_a = os.path.join(host_a, node.backend.store_id())
        node.backend.local_dir = host_b  # the batches from 3 on run on host B
        run_until(ssc, 7000, flush_checkpoints=True)
        assert _versions(folder_a) == {p: 2000 for p in range(4)}  # A's copies, stale once A sweeps
        node.backend.local_dir = host_a
        run_until(ssc, 10_000, flush_checkpoints=True)
        attempts = {i.batch_time_ms: i.attempts for i in ssc.batchInfos()}
        metrics = node.store_metrics()
    finally:
        ssc.stop(stopSparkContext=False)
    assert set(attempts.values()) == {1}, attempts
    assert metrics is not None and 2 <= metrics["stale_removed"] <= 4, metrics
    assert metrics["caught_up"] >= 4 + metrics["stale_removed"], metrics  # B took all four, A rebuilt the removed
    assert _versions(folder_a) == {p: 10_000 for p in range(4)}  # A's current copies kept by the later sweeps
    with open(os.path.join(folder_a, "swept")) as f:
        assert int(f.read()) == 5000  # swept at batches 8, 9 and 10 (horizons 3000, 4000, 5000)
    got = read_outputs(out)
    for t in range(1000, 10_001, 1000):
        assert got[f"running-{t}"] == _counts_through(t), t


def test_a_host_is_swept_once_per_horizon_and_copies_written_since_its_last_sweep_are_not_opened(tmp_path):
    """:func:`sweep_stale_once`: one sweep per horizon on a host (negative horizons too: a stream whose zero time is
    0), the next one only for a higher horizon; a stale copy written since the host's previous sweep is left to the
    sweep after (a copy in use is written every batch)."""
    from dstreams.statestore import sweep_stale_once

    local = str(tmp_path / "host")
    first = _store_at(local, 0, 1000)
    folder = os.path.dirname(first)
    assert sweep_stale_once(folder, -2000) == []
    assert sweep_stale_once(folder, -2000) is None and sweep_stale_once(folder, -3000) is None
    os.utime(first, (1, 1))  # written long before the previous sweep
    assert sweep_stale_once(folder, 2000) == [0]
    second = _store_at(local, 1, 1500)  # written after the previous sweep: in use, not opened
    os.utime(os.path.join(folder, "swept"), (1, 1))
    assert sweep_stale_once(folder, 3000) == []
    os.utime(second, (1, 1))
    assert sweep_stale_once(folder, 4000) == [1]
    assert sorted(os.listdir(folder)) == ["swept"]



# ---------------------------------------------------------------------------------------------- a lost host
@pytest.mark.slow
def test_every_handle_is_cached_at_the_state_level(sc, tmp_path, monkeypatch):
    """The handles a stream builds (the zero time's, with an ``initialRDD``, included) are cached at
    :func:`state_level` of the context's master (the engine keeps the level the store chose)."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_CHANGELOG", "on")
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / "host"))
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    ssc.checkpoint(str(tmp_path / "ckpt"))
    pairs = ssc.generatorStream(6, 2, seed=1, recordFunc=_words).map(lambda w: (w, 1))
    initial = sc.parallelize([("w1", 100)], 2)
    pairs.updateStateByKey(_sum_or_drop, 2, initialRDD=initial).checkpoint("30s").pprint()
    (node,) = [n for n in ssc._graph.nodes if isinstance(getattr(n, "backend", None), ExecutorStore)]
    try:
        run_until(ssc, 3000)
        handles = [*node.generated.values(), *node.backend._loaded.values()]  # the zero time's among the loaded
        levels = [str(h.getStorageLevel()) for h in handles if h is not None]  # released by the stop
    finally:
        ssc.stop(stopSparkContext=False)
    assert len(levels) >= 4 and set(levels) == {str(state_level(str(sc.master)))} == {str(node.level)}, levels


def test_off_a_local_master_the_state_chains_get_two_copies_and_a_plain_window_one(sc, monkeypatch):
    """Defined under a cluster master (``sc.master`` as a standalone driver sees it; nothing runs here), the RDD
    state and a window with an inverse function, both chains, are cached on two executors; a window without one is
    reduced from its batches again each slide, so it keeps one copy; ``spark.dstreams.state.replicas=1`` keeps one
    everywhere."""
    monkeypatch.delenv("DSTREAMS_STATE_STORE", raising=False)

    def replication(replicas: str | None) -> dict[str, int]:
        if replicas is None:
            monkeypatch.delenv("DSTREAMS_STATE_REPLICAS", raising=False)
        else:
            monkeypatch.setenv("DSTREAMS_STATE_REPLICAS", replicas)
        monkeypatch.setattr(sc, "master", "spark://127.0.0.1:7077")
        ssc = StreamingContext(sc, 1, clock=ManualClock())
        pairs = ssc.generatorStream(6, 2, seed=1, recordFunc=_words).map(lambda w: (w, 1))
        streams = {"state": pairs.updateStateByKey(_sum_or_drop, 2),
                   "inverse": pairs.reduceByKeyAndWindow(operator.add, operator.sub, 4, 2),
                   "plain": pairs.reduceByKeyAndWindow(operator.add, None, 4, 2)}
        monkeypatch.undo()  # the master back before anything could run
        ssc.stop(stopSparkContext=False)  # never started
        return {name: s._node.storage_level.replication for name, s in streams.items()}

    assert replication(None) == {"state": 2, "inverse": 2, "plain": 1}
    assert replication("1") == {"state": 1, "inverse": 1, "plain": 1}
