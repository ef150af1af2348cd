"""Data checkpoints into a store: written after the batch, committed by a manifest, lineage cut."""

from __future__ import annotations

import operator
import pickle
import threading
import time as _time

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.checkpoint_data import CheckpointData
from dstreams.recovery.checkpointer import StoreCheckpointer, list_checkpoints, load_manifest
from dstreams.recovery.codec import CorruptCheckpointError, decode_partition, encode_partition
from dstreams.recovery.store import open_store
from dstreams.recovery.storespec import StoreSpec
from dstreams.time import from_user_time

from ..support import state_node


def test_codec_round_trip_and_corruption():
    data, sha, n = encode_partition([("a", 1), ("b", [2, 3])])
    assert n == 2 and decode_partition(data, sha) == [("a", 1), ("b", [2, 3])]
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        decode_partition(data[:10])
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        decode_partition(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptCheckpointError, match="magic"):
        decode_partition(b"XXXX" + data[4:])


def test_memory_store_is_refused_for_checkpoints(sc):
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    with pytest.raises(ValueError, match="executors"):
        ssc.checkpoint("memory://x")


@pytest.mark.slow
def test_state_is_checkpointed_and_lineage_stays_bounded(sc, tmp_path):
    url = str(tmp_path / "ckpt")
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(url)
    pairs = ssc.queueStream([[("k", 1), (f"x{i % 3}", 1)] for i in range(24)])
    counts = pairs.runningReduce(operator.add).checkpoint("2s")
    seen: list[list] = []
    counts.foreachRDD(lambda rdd: seen.append(sorted(rdd.collect())))
    lineage: list[int] = []
    counts.foreachRDD(lambda rdd: lineage.append(rdd.toDebugString().count(b"PythonRDD")))
    ssc.start()
    try:
        for i in range(1, 25):
            clock.advance(1000)
            ssc.awaitBatch(i * 1000, 120)
            ssc._checkpointer.flush(60)  # make the commits deterministic for the assertions
    finally:
        ssc.stop(stopSparkContext=False)
    assert seen[-1] == [("k", 24), ("x0", 8), ("x1", 8), ("x2", 8)]
    store = open_store(url)
    node_key = state_node(counts).key
    times = list_checkpoints(store, node_key)
    assert times[0] == 24_000 and len(times) <= 3  # older ones deleted
    manifest = load_manifest(store, node_key, times[0])
    headers = len(manifest["parts"]) if "state" in manifest else 0  # the store format's part headers
    assert manifest["num_partitions"] == 2 and sum(p["records"] for p in manifest["parts"]) - headers == 4
    # Lineage: without the cut it grows with every batch; with it, it is periodic (bounded by the
    # checkpoint interval plus the time a commit takes).
    assert max(lineage[-8:]) <= max(lineage[6:14]), lineage
    assert lineage[-1] < lineage[3] * 4, lineage
    assert ssc._checkpointer.errors == []


@pytest.mark.slow
def test_a_checkpoint_is_kept_while_queued_batches_still_reach_it(sc, tmp_path):
    """Regression (seen in CI under load): with a backlog, a batch built on checkpoint 3's lineage
    ran after checkpoints 4, 5 and 6 were committed and 3 had been deleted: the batch failed."""
    url = str(tmp_path / "ckpt")
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(url)
    pairs = ssc.queueStream([[("k", 1)] for _ in range(12)])
    gates = {t: threading.Event() for t in (3000, 4000, 7000)}
    entered = {t: threading.Event() for t in gates}

    def hold(time, rdd) -> None:  # the batch's first job: holds the runner at the gated batches
        ms = from_user_time(time).ms
        if ms in gates:
            entered[ms].set()
            assert gates[ms].wait(60)

    pairs.foreachRDD(hold)
    counts = pairs.runningReduce(operator.add).checkpoint("1s")
    seen: dict[int, list] = {}
    counts.foreachRDD(lambda time, rdd: seen.__setitem__(from_user_time(time).ms, sorted(rdd.collect())))
    ssc.start()
    try:
        clock.set_time(6000)  # batches 1-6 built at once; the runner stops in batch 3
        assert entered[3000].wait(60)
        gates[3000].set()
        assert entered[4000].wait(60)
        ssc._checkpointer.flush(60)  # checkpoint 3 committed: batches 4-6 rebuilt on it
        clock.set_time(7000)  # batch 7 is built on checkpoint 3's lineage
        deadline = _time.monotonic() + 60
        while (ssc._scheduler.last_generated is None or ssc._scheduler.last_generated.ms < 7000):
            assert _time.monotonic() < deadline, "batch 7 was not generated"
            _time.sleep(0.01)
        gates[4000].set()
        assert entered[7000].wait(60)
        ssc._checkpointer.flush(60)  # checkpoints 4, 5, 6 committed while batch 7 waits
        assert 3000 in list_checkpoints(open_store(url), state_node(counts).key)
        gates[7000].set()
        ssc.awaitBatch(7000, 120)
        for t in range(8, 13):
            clock.set_time(t * 1000)
            ssc.awaitBatch(t * 1000, 120)
            ssc._checkpointer.flush(60)
    finally:
        for g in gates.values():
            g.set()
        ssc.stop(stopSparkContext=False)
    assert ssc._scheduler.error is None, ssc._scheduler.error
    assert ssc._checkpointer.errors == []
    assert {t: seen.get(t) for t in (7000, 12000)} == {7000: [("k", 7)], 12000: [("k", 12)]}
    times = list_checkpoints(open_store(url), state_node(counts).key)
    assert times[0] == 12_000 and 3000 not in times and len(times) <= 4, times  # old ones still go


class _IdleEvents:
    def post(self, event) -> None:
        raise AssertionError(f"nothing is committed here: {event!r}")

    def wait_idle(self, timeout_s: float) -> bool:
        return True


def test_writes_submitted_from_several_threads_are_all_tracked(sc, tmp_path):
    """``_futures`` is appended from the event loop and rebuilt/read from other threads: no submission is lost,
    so ``flush`` waits for every one."""
    ckpt = StoreCheckpointer(sc, StoreSpec(str(tmp_path / "cp")), _IdleEvents())
    gate = threading.Event()
    ran: list[int] = []
    ckpt._submit(gate.wait, 60)  # holds the one writer thread: nothing submitted below is done yet
    threads = [threading.Thread(target=lambda: [ckpt._submit(ran.append, 1) for _ in range(200)]) for _ in range(4)]
    flusher = threading.Thread(target=lambda: [ckpt._started() for _ in range(200)])
    try:
        for t in [*threads, flusher]:
            t.start()
        for t in [*threads, flusher]:
            t.join(60)
        assert len(ckpt._started()) == 1 + 4 * 200
    finally:
        gate.set()
    ckpt.flush(60)
    ckpt.close()
    assert len(ran) == 800 and all(f.done() for f in ckpt._started())


class _RecordingEvents:
    """Accepts the commit events a checkpointer posts (nothing adopts them here)."""

    def __init__(self) -> None:
        self.posted: list = []

    def post(self, event) -> None:
        self.posted.append(event)

    def wait_idle(self, timeout_s: float) -> bool:
        return True


class _StubNode:
    """The members of a checkpointed node that the checkpointer reads (its checkpoint data: the default's)."""

    key = "001-Stub"
    name = "stub#1"
    remember_duration = None

    @property
    def checkpoint_data(self):
        return CheckpointData(self)


def _needs_checkpoint(url: str, key: str, time_ms: int):
    """A partition function that fails unless the checkpoint ``key`` at ``time_ms`` is still in the store
    (as recomputing an RDD whose lineage reads it would)."""

    def check(it):
        load_manifest(open_store(url), key, time_ms)
        return it

    return check


def test_a_deletion_queued_behind_a_busy_writer_spares_checkpoints_that_later_writes_still_read(sc, tmp_path):
    """Regression (seen in a catch-up after a kill, under load): a deletion queued behind a slow write decided
    what to delete only when it ran, after later batches had completed, and removed a checkpoint that the write
    queued behind it still read (recomputing an RDD built on that checkpoint's lineage)."""
    url = str(tmp_path / "cp")
    node = _StubNode()
    ckpt = StoreCheckpointer(sc, StoreSpec(url), _RecordingEvents())
    for t in (1000, 2000, 3000, 4000, 5000):  # batch 6 is built on checkpoint 2's lineage
        ckpt._write(node, t, sc.parallelize([t], 1))
        ckpt.adopted(node, from_user_time(t / 1000), 6000 if t == 3000 else t)
    gate = threading.Event()
    ckpt._submit(gate.wait, 60)  # the writer is busy (a slow write) ...
    try:
        ckpt.batch_completed(from_user_time(5))  # ... when the deletion of checkpoint 1 is queued
        reads_second = sc.parallelize([6], 1).mapPartitions(_needs_checkpoint(url, node.key, 2000))
        ckpt.mark(node, from_user_time(6), reads_second)
        ckpt.batch_completed(from_user_time(6))  # its write queues behind; checkpoint 2 may go after it
    finally:
        gate.set()
    ckpt.flush(60)
    ckpt.close()
    assert ckpt.errors == [], ckpt.errors
    assert sorted(list_checkpoints(open_store(url), node.key)) == [3000, 4000, 5000, 6000]


def test_every_write_is_reported_with_its_duration_and_outcome(sc, tmp_path):
    """The monitoring hook: each write that ended, committed or failed, reaches ``recent_writes`` and the
    observers (an observer that raises changes nothing); a removed observer hears no more."""
    node = _StubNode()
    ckpt = StoreCheckpointer(sc, StoreSpec(str(tmp_path / "cp")), _RecordingEvents())
    heard: list = []

    def broken(write) -> None:
        raise RuntimeError("observer bug")

    ckpt.add_write_observer(heard.append)
    ckpt.add_write_observer(broken)
    ckpt._write(node, 1000, sc.parallelize([1, 2], 2))

    def fail(it):
        raise ValueError("checkpoint test: this partition fails on purpose")

    ckpt._write(node, 2000, sc.parallelize([3], 1).mapPartitions(fail))
    ckpt.remove_write_observer(heard.append)
    ckpt._write(node, 3000, sc.parallelize([4], 1))
    ckpt.close()
    committed, failed, later = ckpt.recent_writes
    assert heard == [committed, failed]
    assert (committed.node_key, committed.time_ms, committed.committed, committed.error) == (node.key, 1000, True, None)
    assert (failed.time_ms, failed.committed) == (2000, False) and "fails on purpose" in failed.error
    assert later.time_ms == 3000 and later.committed
    assert all(w.seconds > 0 for w in (committed, failed, later))
    assert len(ckpt.errors) == 1


def _zombie_and_owner(url: str):
    """The metadata logs of a driver that another one took over from (the zombie, epoch 1) and of that owner."""
    from dstreams.recovery.metadata import MetadataLog

    zombie = MetadataLog(open_store(url), "zombie-ckpt", ["g"], 1000)
    zombie.take_over(0)
    owner = MetadataLog(open_store(url), "zombie-ckpt", ["g"], 1000)
    owner.take_over(0)
    return zombie, owner


def test_a_fenced_checkpointer_neither_deletes_nor_overwrites_the_owners_checkpoints(sc, tmp_path):
    """The rule of the sinks holds for data checkpoints: the fence is checked before anything destructive. A
    zombie's deletion of an old checkpoint (one the new owner may have restored from) deletes nothing, and its
    write of a checkpoint stops before its tasks overwrite parts the owner wrote under the same keys."""
    from dstreams.recovery.checkpointer import checkpoint_prefix
    from dstreams.recovery.metadata import FencedError

    url = str(tmp_path / "cp")
    zombie, _ = _zombie_and_owner(url)
    node = _StubNode()
    ckpt = StoreCheckpointer(sc, StoreSpec(url), _RecordingEvents(), zombie)
    store = open_store(url)
    owners = {}
    for t in (1000, 2000):  # the owner's checkpoint at 1000 (committed) and its write at 2000 (parts only)
        prefix = checkpoint_prefix(node.key, t)
        owners[f"{prefix}/part-00000"] = f"owner {t}".encode()
        if t == 1000:
            owners[f"{prefix}/MANIFEST.json"] = b"{}"
    for key, data in owners.items():
        store.put(key, data)
    try:
        ckpt._delete([(node.key, 1000)])
        ckpt._write(node, 2000, sc.parallelize(["zombie"], 1))
    finally:
        ckpt.close()
    assert {k: store.get(k) for k in store.list("checkpoints/")} == owners
    assert [e.error_type for e in ckpt.errors] == [FencedError.__name__]


def test_write_ahead_logs_of_two_drivers_never_replace_each_others_blocks():
    """A zombie building batch t from its own socket writes its block beside the new owner's, not over it."""
    from dstreams.recovery.checkpointer import StoreWriteAheadLog

    store = open_store("memory://wal-two-drivers")
    owner, zombie = StoreWriteAheadLog(store), StoreWriteAheadLog(store)
    recorded = owner.write("wal/socket-0/000000000003000", ["owner a"])
    zombie.write("wal/socket-0/000000000003000", ["zombie x", "zombie y"])
    again = owner.write("wal/socket-0/000000000003000", ["owner a", "owner b"])  # the owner's batch built again
    assert again == recorded and recorded.startswith("wal/socket-0/000000000003000.")
    assert owner.read(recorded) == ["owner a", "owner b"]
    assert len(store.list("wal/")) == 2


class _OtherStubNode(_StubNode):
    key = "002-Stub"
    name = "stub#2"


@pytest.mark.slow
def test_a_checkpoint_a_restart_resumes_from_is_kept_while_another_stream_lags(sc, tmp_path):
    """Streams checkpointed at different intervals (or one whose write failed): a restart resumes every stream
    from its newest checkpoint at or before the oldest of their newest ones, so each stream keeps that one,
    however many newer ones it has."""
    url = str(tmp_path / "cp")
    fast, slow = _StubNode(), _OtherStubNode()
    ckpt = StoreCheckpointer(sc, StoreSpec(url), _RecordingEvents())
    ckpt._write(slow, 2000, sc.parallelize([0], 1))
    ckpt.adopted(slow, from_user_time(2), 2000)
    for t in range(1000, 9000, 1000):
        ckpt._write(fast, t, sc.parallelize([t], 1))
        ckpt.adopted(fast, from_user_time(t / 1000), t)
        ckpt.batch_completed(from_user_time(t / 1000))
    ckpt.flush(60)
    store = open_store(url)
    assert sorted(list_checkpoints(store, fast.key)) == [2000, 3000, 4000, 5000, 6000, 7000, 8000]
    ckpt._write(slow, 6000, sc.parallelize([0], 1))  # the slow stream catches up: 6 s is where a restart resumes
    ckpt.adopted(slow, from_user_time(6), 6000)
    ckpt.batch_completed(from_user_time(8))
    ckpt.flush(60)
    ckpt.close()
    assert ckpt.errors == [], ckpt.errors
    assert sorted(list_checkpoints(store, fast.key)) == [6000, 7000, 8000]
    assert sorted(list_checkpoints(store, slow.key)) == [2000, 6000]


@pytest.mark.slow
@pytest.mark.parametrize("store", ["rdd", "executor"])
def test_a_state_of_a_class_the_standard_pickle_cannot_name_is_checkpointed(sc, tmp_path, monkeypatch,
                                                                                        store):
    """A state value of a class that pickle can only refer to by a name it cannot import (a class of the user's
    script's ``__main__``, here a local class): PySpark ships it by value (cloudpickle), and the checkpoints (RDD
    state, executor store) keep it the same way (``dstreams.pickling``), which ``pickle.loads`` reads back. Before,
    every checkpoint failed (PicklingError) and the lineage was never cut."""
    import collections

    from dstreams.pickling import dumps

    total = collections.namedtuple("Total", "n")  # made here: pickle cannot import it by its name
    with pytest.raises(Exception):  # noqa: B017 - what the standard pickle does with it
        pickle.dumps(total(1))
    assert pickle.loads(dumps(total(1))).n == 1
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / "local"))
    cpd = str(tmp_path / "ckpt")

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=ManualClock())
        ssc.checkpoint(cpd)
        pairs = ssc.queueStream([[("k", 1), ("j", 2)] for _ in range(4)], default=[[("k", 1)]])
        state = pairs.updateStateByKey(lambda vs, s: total((s.n if s else 0) + sum(vs))).checkpoint("2s")
        state.map(lambda kv: (kv[0], kv[1].n)).foreachRDD(lambda t, rdd: seen.__setitem__(t, sorted(rdd.collect())))
        return ssc

    seen: dict = {}
    first = StreamingContext.getOrCreate(cpd, setup)
    first.start()
    try:
        for i in range(1, 5):
            first.clock.advance(1000)
            first.awaitBatch(i * 1000, 120)
        first._checkpointer.flush(60)
        assert first._checkpointer.errors == []
    finally:
        first.stop(stopSparkContext=False, stopGraceFully=True)
    assert list(seen.values())[-1] == [("j", 8), ("k", 4)]
