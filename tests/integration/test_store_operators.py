"""``track`` and incremental windows on the executor state store (issue 23): the RDD state's outputs, batch by batch.

Every form of ``track`` (no timers; event- and processing-time timers with emitted records; ``emit="updated"``)
runs on the generator's events with their event times, with timeouts, keys dropped by callbacks and coming
back, checkpoints every 2 batches and a snapshot every 2 checkpoints; the store-backed run must write the RDD
state's outputs for every batch. Then a driver restart from the checkpoint (the stores kept, or lost) must give
the uninterrupted run's outputs. Also: the deadline index alone (:meth:`PartitionStore.due_keys` kept through
writes, a rollback and a reload). The windows with an inverse function (``reduceByKeyAndWindow`` with and
without ``filterFunc``, with a slide of 2 batches, ``countByValueAndWindow``, ``groupByKeyAndWindow``,
``reduceByWindow``) likewise, against the RDD windows, and across a restart.
"""

from __future__ import annotations

import operator
import os
import pickle
import shutil

import pytest

from dstreams import StreamingContext, Timer, TrackUpdate
from dstreams.nodes.event_window import EventWindow, SessionWindow
from dstreams.nodes.timers import NEXT_BATCH, Track
from dstreams.statestore import PartitionStore, key_bytes, value_bytes
from dstreams.testing import app_context, run_until
from dstreams.time import Duration

from ..recovery_app import read_outputs

BATCHES = 14


# ---------------------------------------------------------------------------------------------- the index alone
def test_the_deadline_index_follows_writes_rollback_and_reload(tmp_path):
    deadlines = Track(None, None, Duration(3000), None, False).indexer()  # the store's index over entry bytes
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


def test_event_window_and_session_deadlines_are_the_next_close():
    final = EventWindow(operator.add, None, Duration(4000), Duration(1000), "final").indexer()  # 4 panes a window
    # Panes 10 and 12, windows through 8 closed: the next window with data is 9 ([9 s, 13 s)), due at W >= 13 s.
    assert final(value_bytes(({10: 1, 12: 1}, None, [], 8, "final"))) == (None, 13_000)
    # No window closed yet: the first window holding pane 10 is 7, due at W >= 11 s.
    assert final(value_bytes(({10: 1}, None, [], None, "final"))) == (None, 11_000)
    # A carried window 9 (inverse): due when window 10 closes (the carry goes, or slides), before pane 20's.
    assert final(value_bytes(({20: 1}, (9, 5, True, 1), [], 9, "final"))) == (None, 14_000)
    assert final(value_bytes(({}, (9, 5, True, 1), [], 9, "final"))) == (None, 14_000)
    assert final(value_bytes(({10: 1}, None, [(6, 2)], 6, "final"))) == (NEXT_BATCH, None)
    assert final(value_bytes(({7: 3, 9: 1}, None, [], 6, "updates"))) == (None, 11_000)  # windows held: 7, 9
    sessions = SessionWindow(Duration(2000), list).indexer()
    assert sessions(value_bytes(([[(5000, "a"), (6000, "b")], [(9000, "c")]], [], []))) == (None, 8000)
    assert sessions(value_bytes(([[(9000, "c")]], [(1000, 3000, ["a"])], []))) == (NEXT_BATCH, None)
    assert sessions(value_bytes(([], [], [(1000, "late")]))) == (NEXT_BATCH, None)


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


def window_words(seed: int, t: int, partition: int, n: int) -> list[str]:
    sec = t // 1000
    if sec % 6 == 5:
        return []
    early = [f"e{(sec + i) % 3}" for i in range(2)] if sec <= 3 else []  # gone from every window after 13 s
    return early + [f"w{(sec * 3 + partition * 5 + i * (sec % 3 + 1)) % 9}" for i in range(n)]


def window_app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    words = ssc.generatorStream(5, 2, seed=5, recordFunc=window_words)
    pairs = words.map(lambda w: (w, 1))
    pairs.reduceByKeyAndWindow(operator.add, operator.sub, "6s", "1s", 3, lambda kv: kv[1] > 0) \
        .checkpoint("2s").saveAsTextFiles(os.path.join(out, "filtered"))
    pairs.reduceByKeyAndWindow(operator.add, operator.sub, "10s", "2s").checkpoint("4s") \
        .saveAsTextFiles(os.path.join(out, "zeros"))
    words.countByValueAndWindow("5s", "1s").checkpoint("2s").saveAsTextFiles(os.path.join(out, "counts"))
    pairs.groupByKeyAndWindow("5s", "1s").mapValues(lambda vs: sorted(vs)).checkpoint("2s") \
        .saveAsTextFiles(os.path.join(out, "groups"))
    words.map(len).reduceByWindow(operator.add, operator.sub, "5s", "1s").checkpoint("2s") \
        .saveAsTextFiles(os.path.join(out, "total"))
    return ssc


def timed_events(seed: int, t: int, partition: int, n: int) -> list[tuple[str, float]]:
    """(key, event time in s): 5 keys in bursts (sessions), event times up to 1.8 s behind the batch time, and
    now and then a record 5.5 s behind (late for its windows and its session)."""
    sec = t // 1000
    stragglers = [(f"u{sec % 5}", sec - 5.5)] if sec % 4 == 2 and partition == 0 else []  # behind the watermark
    return stragglers + [(f"u{j}", sec - (i % 4) * 0.6) for i in range(n) for j in [(i + partition) % 5]
                         if (sec // 3 + j) % 2 == 0]


def event_window_app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    timed = ssc.generatorStream(4, 2, seed=7, recordFunc=timed_events).withEventTime(lambda r: r[1],
                                                                                     allowedLateness="1s")
    pairs = timed.map(lambda r: (r[0], 1))
    outputs = {
        "final": pairs.reduceByKeyAndEventWindow(operator.add, "4s", "1s"),
        "inverse": pairs.reduceByKeyAndEventWindow(operator.add, "4s", "1s", invFunc=operator.sub),
        "updates": pairs.reduceByKeyAndEventWindow(operator.add, "3s", emit="updates", numPartitions=3),
        "all": timed.map(lambda r: r[1]).reduceByEventWindow(max, "2s"),
    }
    sessions = timed.map(lambda r: (r[0], r[1])).sessionWindow("2s", lambda ts: (len(ts), min(ts), max(ts)))
    outputs["sessions"] = sessions
    for name, stream in outputs.items():
        stream.checkpoint("2s").saveAsTextFiles(os.path.join(out, name))
    sessions.lateRecords().saveAsTextFiles(os.path.join(out, "sessionLate"))
    return ssc


APPS = {"track": track_app, "window": window_app, "event": event_window_app}


def _run(sc, tmp_path, monkeypatch, name: str, store: str, app: str = "track") -> dict[str, list[str]]:
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / f"{name}-local"))
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    ckpt, out = str(tmp_path / f"{name}-ckpt"), str(tmp_path / f"{name}-out")
    with app_context(lambda clock: APPS[app](sc, ckpt, out, clock)) as ssc:
        run_until(ssc, BATCHES * 1000, flush_checkpoints=True)
    return read_outputs(out)


def _reference(sc, tmp_path_factory, app: str) -> dict[str, list[str]]:
    mp = pytest.MonkeyPatch()
    try:
        return _run(sc, tmp_path_factory.mktemp(f"{app}-rdd"), mp, "rdd", "rdd", app)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def rdd_outputs(sc, tmp_path_factory):
    """The RDD state's outputs of the track app (the reference of the track tests), computed once."""
    return _reference(sc, tmp_path_factory, "track")


@pytest.fixture(scope="module")
def rdd_window_outputs(sc, tmp_path_factory):
    """The RDD windows' outputs of the window app, computed once."""
    return _reference(sc, tmp_path_factory, "window")


@pytest.mark.slow
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
    _same(_run(sc, tmp_path, monkeypatch, "store", "executor"), rdd_outputs)


def _restart(sc, tmp_path, monkeypatch, app: str, local: str) -> dict[str, list[str]]:
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "2")
    local_dir = tmp_path / "local"
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(local_dir))
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: APPS[app](sc, ckpt, out, clock), checkpoint=ckpt) as first:
        run_until(first, 7000, flush_checkpoints=True)
    # the driver "dies" after batch 7; its checkpoints are older
    if local == "lost":
        shutil.rmtree(local_dir)  # the executors' disks are gone: the stores are read back from checkpoints
    with app_context(lambda clock: APPS[app](sc, ckpt, out, clock), checkpoint=ckpt, start_ms=10_500) as second:
        run_until(second, BATCHES * 1000, flush_checkpoints=True)
    return read_outputs(out)


def _same(got: dict[str, list[str]], expected: dict[str, list[str]]) -> None:
    assert sorted(got) == sorted(expected)
    for name in sorted(expected):
        assert got[name] == expected[name], name


@pytest.mark.slow
@pytest.mark.parametrize("local", ["kept", "lost"])
def test_store_backed_track_restarted_from_its_checkpoint_gives_the_uninterrupted_outputs(
        sc, tmp_path, monkeypatch, rdd_outputs, local):
    _same(_restart(sc, tmp_path, monkeypatch, "track", local), rdd_outputs)


# ---------------------------------------------------------------------------------------------- windows
@pytest.mark.slow
def test_the_window_workload_keeps_zero_counts_and_filters_them(rdd_window_outputs):
    expected = rdd_window_outputs
    times = range(1000, (BATCHES + 1) * 1000, 1000)
    assert sorted(expected) == sorted([f"{n}-{t}" for n in ("filtered", "counts", "groups", "total") for t in times]
                                      + [f"zeros-{t}" for t in range(2000, (BATCHES + 1) * 1000, 2000)])
    assert any(line.endswith(", 0)") for t in range(2000, 15_000, 2000) for line in expected[f"zeros-{t}"])
    assert not any(line.endswith(", 0)") for t in times for line in expected[f"filtered-{t}"])


@pytest.mark.slow
def test_store_backed_windows_give_the_rdd_windows_outputs_batch_by_batch(sc, tmp_path, monkeypatch,
                                                                        rdd_window_outputs):
    _same(_run(sc, tmp_path, monkeypatch, "store", "executor", "window"), rdd_window_outputs)


@pytest.mark.slow
def test_store_backed_windows_restarted_from_their_checkpoint_give_the_uninterrupted_outputs(
        sc, tmp_path, monkeypatch, rdd_window_outputs):
    _same(_restart(sc, tmp_path, monkeypatch, "window", "lost"), rdd_window_outputs)


# ---------------------------------------------------------------------------------------------- event time
@pytest.fixture(scope="module")
def rdd_event_outputs(sc, tmp_path_factory):
    """The RDD state's outputs of the event-time app, computed once."""
    return _reference(sc, tmp_path_factory, "event")


@pytest.mark.slow
def test_the_event_time_workload_closes_windows_and_sessions_and_drops_late_records(rdd_event_outputs):
    expected = rdd_event_outputs
    times = range(1000, (BATCHES + 1) * 1000, 1000)
    for name in ("final", "inverse", "updates", "all", "sessions", "sessionLate"):
        assert sum(len(expected[f"{name}-{t}"]) for t in times) > 0, name
    assert sum(len(expected[f"sessions-{t}"]) for t in times) >= 5


@pytest.mark.slow
def test_store_backed_event_windows_and_sessions_give_the_rdd_states_outputs(sc, tmp_path, monkeypatch,
                                                                            rdd_event_outputs):
    _same(_run(sc, tmp_path, monkeypatch, "store", "executor", "event"), rdd_event_outputs)


@pytest.mark.slow
def test_store_backed_event_windows_restarted_from_their_checkpoint_give_the_uninterrupted_outputs(
        sc, tmp_path, monkeypatch, rdd_event_outputs):
    _same(_restart(sc, tmp_path, monkeypatch, "event", "kept"), rdd_event_outputs)
