"""``track`` on the executor state store (issue 23): the same outputs as the RDD state, batch by batch.

Every form of ``track`` (no timers; event- and processing-time timers with emitted records; ``emit="updated"``)
runs on the generator's events with their event times, with timeouts, keys dropped by callbacks and coming
back, checkpoints every 2 batches and a snapshot every 2 checkpoints; the store-backed run must write the RDD
state's outputs for every batch. Then a driver restart from the checkpoint (the stores kept, or lost) must give
the uninterrupted run's outputs. Also: the deadline index alone (:meth:`PartitionStore.due_keys` kept through
writes, a rollback and a reload), and that a batch reads only the keys with events or due.
"""

from __future__ import annotations

import os
import pickle
import shutil

import pytest

from dstreams import ManualClock, StreamingContext, Timer, TrackUpdate
from dstreams.nodes.store_track import NEXT_BATCH, track_deadlines
from dstreams.statestore import PartitionStore, key_bytes, value_bytes

from .recovery_app import read_outputs
from .support import drive_batches

BATCHES = 14


# ---------------------------------------------------------------------------------------------- the index alone
def test_the_deadline_index_follows_writes_rollback_and_reload(tmp_path):
    deadlines = track_deadlines(3000)
    store = PartitionStore(str(tmp_path / "p.sqlite"), deadlines)

    def entry(last, timers=None, emitted=(), alive=True):
        return value_bytes((1, last, dict(timers or {}), list(emitted), alive, True))

    assert deadlines(entry(1000)) == (4000, None)
    assert deadlines(entry(1000, {"t": ("processing", 2500), "e": ("event", 900), "f": ("event", 800)})) \
        == (2500, 800)
    assert deadlines(entry(1000, emitted=["x"])) == (NEXT_BATCH, None)
    assert deadlines(entry(1000, alive=False)) == (NEXT_BATCH, None)

    store.ensure_base(0, "r", lambda: [(key_bytes("a"), entry(0))])
    with store.transaction():
        writes = {key_bytes("b"): entry(1000, {"e": ("event", 1500)}), key_bytes("c"): entry(1000, emitted=[1])}
        store.write_many(1000, writes, store.get_many(writes))
        store.set_version(1000, "r")
    assert sorted(pickle.loads(k) for k in store.due_keys(1000, None)) == ["c"]
    assert sorted(pickle.loads(k) for k in store.due_keys(3000, 1499)) == ["a", "c"]
    assert sorted(pickle.loads(k) for k in store.due_keys(3000, 1500)) == ["a", "b", "c"]
    with store.transaction():
        writes = {key_bytes("a"): None, key_bytes("c"): entry(2000)}
        store.write_many(2000, writes, store.get_many(writes))
        store.set_version(2000, "r")
    assert sorted(pickle.loads(k) for k in store.due_keys(4000, None)) == ["b"]
    assert sorted(pickle.loads(k) for k in store.due_keys(5000, None)) == ["b", "c"]
    with store.transaction():
        store.rollback(1000)
    assert sorted(pickle.loads(k) for k in store.due_keys(3000, 1500)) == ["a", "b", "c"]
    with store.transaction():
        store.reload(5000, "r2", [(key_bytes("z"), entry(4000, {"p": ("processing", 4500)}))])
    assert [pickle.loads(k) for k in store.due_keys(4500, None)] == ["z"]
    assert store.due_keys(4499, 10**12) == []
    store.close()


# ---------------------------------------------------------------------------------------------- streams
def events(seed: int, t: int, partition: int, n: int) -> list[tuple[str, int]]:
    """(key, event time in s) records: 11 keys, some idle for several batches, event times up to 2 s late."""
    sec = t // 1000
    if sec % 5 == 4:
        return []  # a batch without events: timeouts and timers alone
    return [(f"k{(sec * 5 + partition * 3 + i * (sec % 4 + 1)) % 11}", sec - i % 3) for i in range(n)
            if (sec + i) % 7]


def init_session(key: str, ts: int) -> TrackUpdate:
    return TrackUpdate([ts], timers={"close": Timer("event", ts + 3), "tick": Timer("processing", ts + 2)})


def update_session(key: str, state: list[int], ts: int) -> TrackUpdate | None:
    if len(state) >= 5:
        return TrackUpdate(None, emit=[("full", key, len(state) + 1)])  # dropped by update, with a record
    return TrackUpdate([*state, ts], timers={"close": Timer("event", max(state[-1], ts) + 3)})


def session_timer(key: str, state: list[int], timer: Timer) -> TrackUpdate:
    if timer.kind == "event":
        return TrackUpdate(None, emit=[("closed", key, sorted(state), timer.time)])
    again = {"tick": Timer("processing", timer.time + 2)} if len(state) % 2 else {}
    return TrackUpdate(state, timers=again, emit=[("tick", key, len(state), timer.time)])


def count_init(key: str, ts: int) -> int:
    return 1


def count_update(key: str, state: int, ts: int) -> int | None:
    return None if state >= 6 else state + 1


def track_app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    timed = ssc.generatorStream(6, 2, seed=3, recordFunc=events).withEventTime(lambda r: r[1])
    plain = timed.map(lambda r: r).track(count_init, count_update, "3s", 3)
    plain.checkpoint("2s").saveAsTextFiles(os.path.join(out, "plain"))
    sessions = timed.track(init_session, update_session, "4s", timers=session_timer)
    sessions.checkpoint("2s").saveAsTextFiles(os.path.join(out, "sessions"))
    sessions.emitted().saveAsTextFiles(os.path.join(out, "emitted"))
    updated = timed.track(init_session, update_session, "4s", 2, timers=session_timer, emit="updated")
    updated.checkpoint("2s").saveAsTextFiles(os.path.join(out, "updated"))
    return ssc


def _run(sc, tmp_path, monkeypatch, name: str, store: str) -> dict[str, list[str]]:
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / f"{name}-local"))
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    ckpt, out = str(tmp_path / f"{name}-ckpt"), str(tmp_path / f"{name}-out")
    clock = ManualClock()
    ssc = track_app(sc, ckpt, out, clock)
    try:
        ssc.start()
        drive_batches(ssc, clock, BATCHES * 1000)
    finally:
        ssc.stop(stopSparkContext=False)
    return read_outputs(out)


@pytest.fixture(scope="module")
def rdd_outputs(sc, tmp_path_factory):
    """The RDD state's outputs (the reference of every test below), computed once."""
    mp = pytest.MonkeyPatch()
    try:
        return _run(sc, tmp_path_factory.mktemp("track-rdd"), mp, "rdd", "rdd")
    finally:
        mp.undo()


def test_the_reference_workload_exercises_every_path(rdd_outputs):
    expected = rdd_outputs
    assert sorted(expected) == sorted(f"{n}-{t}" for n in ("plain", "sessions", "emitted", "updated")
                                      for t in range(1000, (BATCHES + 1) * 1000, 1000))
    emitted = " ".join(line for t in range(1000, (BATCHES + 1) * 1000, 1000) for line in expected[f"emitted-{t}"])
    assert "'closed'" in emitted and "'tick'" in emitted and "'full'" in emitted
    # Keys time out and come back; the updated stream holds fewer keys than the whole state.
    plain_keys = [len(expected[f"plain-{t}"]) for t in range(1000, (BATCHES + 1) * 1000, 1000)]
    assert min(plain_keys[2:]) < max(plain_keys)
    assert sum(len(expected[f"updated-{t}"]) for t in range(1000, 15_000, 1000)) \
        < sum(len(expected[f"sessions-{t}"]) for t in range(1000, 15_000, 1000))


@pytest.mark.slow
def test_store_backed_track_gives_the_rdd_states_outputs_batch_by_batch(sc, tmp_path, monkeypatch, rdd_outputs):
    got = _run(sc, tmp_path, monkeypatch, "store", "executor")
    assert sorted(got) == sorted(rdd_outputs)
    for name in sorted(rdd_outputs):
        assert got[name] == rdd_outputs[name], name


@pytest.mark.slow
@pytest.mark.parametrize("local", ["kept", "lost"])
def test_store_backed_track_restarted_from_its_checkpoint_gives_the_uninterrupted_outputs(
        sc, tmp_path, monkeypatch, rdd_outputs, local):
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    local_dir = tmp_path / "local"
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(local_dir))
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    clock = ManualClock()
    first = StreamingContext.getOrCreate(ckpt, lambda: track_app(sc, ckpt, out, clock))
    try:
        first.start()
        drive_batches(first, clock, 7000)
    finally:
        first.stop(stopSparkContext=False)  # the driver "dies" after batch 7; its checkpoint is of batch 6
    if local == "lost":
        shutil.rmtree(local_dir)  # the executors' disks are gone: the stores are read back from checkpoints
    clock2 = ManualClock(10_500)
    second = StreamingContext.getOrCreate(ckpt, lambda: track_app(sc, ckpt, out, clock2), clock=clock2)
    try:
        second.start()
        drive_batches(second, clock2, BATCHES * 1000)
    finally:
        second.stop(stopSparkContext=False)
    got = read_outputs(out)
    assert sorted(got) == sorted(rdd_outputs)
    for name in sorted(rdd_outputs):
        assert got[name] == rdd_outputs[name], name
