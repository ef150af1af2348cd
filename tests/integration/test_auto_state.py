"""State picked by size (``spark.dstreams.state.store=auto``, the default; issue 23).

* The rule on its own (:func:`should_move`).
* ``runningReduce`` and ``updateStateByKey(..., updateIdleKeys=False)`` (with an initial state, keys dropped,
  ``changes()``) under ``auto`` with a low ``autoKeys``: each moves into the executor state store in the middle of
  the run (the update stream at batch 2, from its initial state; the running reduce near batch 11, as its state
  outgrows what a batch touches), and the outputs equal the RDD state's batch by batch. Checkpoints before the move
  are snapshots of the RDD state, the first after it may be a delta on one of them, and the manifests say when the
  stream moved.
* Driver restarts: one before the running reduce moved (its checkpoint is of the RDD state, the update stream's of
  the store), one after both moved with the executors' stores lost: the outputs equal the uninterrupted run's.
"""

from __future__ import annotations

import json
import operator
import os
import pickle
import shutil
import signal
import time
import urllib.request

import pytest

from dstreams import StreamingContext, TrackUpdate
from dstreams.nodes.auto_state import TOUCH_RATIO, AutoPolicy, should_move
from dstreams.nodes.timers import Track
from dstreams.recovery.checkpointer import list_checkpoints, load_manifest
from dstreams.recovery.store import open_store
from dstreams.testing import app_context, manual_context, run_until

from ..process_support import is_stopped
from ..recovery_app import read_outputs


def _step(ssc: StreamingContext, until_ms: int) -> None:
    """Start ``ssc`` if need be and run batch after batch up to ``until_ms``, each built after the one before
    ended (so the move is decided on the reports of every batch before it: the times the assertions name)."""
    if ssc.getState() == "INITIALIZED":
        ssc.start()
    clock = ssc.clock
    t = max(ssc.startTime.ms, clock.time_ms() - clock.time_ms() % 1000)
    while t <= until_ms:
        run_until(ssc, t, flush_checkpoints=True)
        t += 1000

BATCHES = 16
INITIAL = [(f"i{n}", n % 5) for n in range(120)]


def test_a_state_moves_once_it_is_large_next_to_what_its_batches_touch() -> None:
    assert not should_move(99, [1], 100)  # too few keys
    assert should_move(100, [10], 100)
    assert not should_move(1000, [101], 100)  # a batch touches more than a tenth of the state
    assert should_move(1000, [100, 3], 100)
    assert should_move(1000, [], 100)
    # The largest batch of the last ones is left out once two reported: a first load does not hold a stream back,
    # bursts that come twice do.
    assert should_move(1000, [1000, 50, 60], 100)
    assert not should_move(1000, [1000, 500, 60], 100)
    assert not should_move(1000, [1000], 100)
    assert TOUCH_RATIO == 10


def test_a_track_batch_counts_the_keys_its_timers_and_timeouts_touch_as_the_store_would() -> None:
    """The rule's count for ``track`` on the RDD state: the keys with events, the keys whose timer fired and the keys
    that timed out (the store reads and writes each of them), not the idle ones."""
    from dstreams.nodes.keyed import rdd_partition
    from dstreams.nodes.timers import PROCESSING, Track, plain_track_step, track_batch
    from dstreams.time import Duration

    def track_touched(plain):
        return Track(None, None, Duration(10_000), None, plain).touched

    previous = [("fires", (1, 0, {"t": (PROCESSING, 1500)}, [], True, False)),
                ("idle", (1, 0, {"later": (PROCESSING, 9000)}, [], True, False)),
                ("times-out", (1, -20_000, {}, [], True, False)),
                ("event", (1, 0, {}, [], True, False))]
    events = [("event", [5]), ("new", [7])]
    out = track_batch(previous, events, init=lambda k, e: e, update=lambda k, s, e: s + e,
                      on_timer=lambda k, s, timer: s + 100, now_ms=2000, timeout_ms=10_000, watermark_ms=None)
    assert {k for k, _ in out} == {"fires", "idle", "event", "new"}
    assert track_touched(False)(previous, out, {"event", "new"}) == 4  # fires, times-out, event, new
    plain_previous = [("idle", (1, 0)), ("times-out", (1, -20_000)), ("event", (1, 0))]
    plain_op = Track(lambda k, e: e, lambda k, s, e: s + e, Duration(10_000), None, True)
    plain_out = rdd_partition(plain_op, plain_track_step(plain_op.init, plain_op.update, 2000, 10_000), plain_previous,
                              [events])
    assert {k for k, _ in plain_out} == {"idle", "event", "new"}
    assert track_touched(True)(plain_previous, plain_out, {"event", "new"}) == 3  # times-out, event, new


def _records(seed: int, t: int, partition: int, n: int):
    b = t // 1000
    # Per partition: two new keys (one twice) for the running reduce, whose state grows by 4 keys a batch with 4
    # touched; two keys of the initial state for the update stream (dropped by _sum_or_drop once past 8).
    return [f"k{b * 2}-{partition}", f"k{b * 2}-{partition}", f"k{b * 2 + 1}-{partition}",
            f"i{(b * 7 + partition) % 120}", f"i{(b * 5 + partition + 1) % 120}"]


def _sum_or_drop(values, state):
    total = (state or 0) + sum(values)
    return None if total > 8 else total


def _opened(key, event):
    """A ``track`` key's first event: for the keys of batches 0 and 10 (``k<2b>-p`` or ``k<2b+1>-p`` at batch b), a
    processing-time timer 3 s after that batch, so timers fire at batch 3 (on the RDD state) and 13 (on the store
    when the stream moved at batch 11 or 12, as it does unless the machine is very busy: set before the move).
    The store touches each key a timer fires for, and so does the rule's count: timers firing every batch would
    keep this small state on the RDD state."""
    b = int(key[1:].split("-")[0]) // 2
    return TrackUpdate(event, processingTime=b + 3) if b % 10 == 0 else event


def _fired(key, state, timer):
    return TrackUpdate(state + 100, emit=[(key, state, timer.time)])


def _app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    pairs = ssc.generatorStream(5, 2, seed=1, recordFunc=_records).map(lambda w: (w, 1))
    running = pairs.filter(lambda kv: kv[0][0] == "k").runningReduce(operator.add).checkpoint("2s")
    running.saveAsTextFiles(os.path.join(out, "running"))
    touched = pairs.updateStateByKey(_sum_or_drop, 3, initialRDD=INITIAL, updateIdleKeys=False).checkpoint("2s")
    touched.saveAsTextFiles(os.path.join(out, "touched"))
    touched.changes().saveAsTextFiles(os.path.join(out, "changes"))
    # track: plain (the lighter layout on the RDD state, converted at the move), and with timers, emit="updated"
    # and emitted(); each state grows by the keys of a batch, neither times out.
    sessions = pairs.track(lambda k, e: e, lambda k, s, e: s + e, "1h", 2).checkpoint("2s")
    sessions.saveAsTextFiles(os.path.join(out, "sessions"))
    timed = pairs.filter(lambda kv: kv[0][0] == "k").track(_opened, lambda k, s, e: s + e, "1h", 2, timers=_fired,
                                                           emit="updated").checkpoint("2s")
    timed.saveAsTextFiles(os.path.join(out, "updated"))
    timed.emitted().saveAsTextFiles(os.path.join(out, "emitted"))
    return ssc


def _env(monkeypatch, tmp_path, store: str) -> None:
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    monkeypatch.setenv("DSTREAMS_STATE_AUTO_KEYS", "30")
    monkeypatch.setenv("DSTREAMS_STATE_SNAPSHOT_EVERY", "3")
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / "local"))


def _moves(ssc: StreamingContext) -> dict[str, int | None]:
    """When each state moved into the store (None: it has not), by operator (``track-plain``, ``track-timers``)."""
    return {n.label + ({True: "-plain", False: "-timers"}[n.op.plain] if isinstance(n.op, Track) else ""):
            n.backend.switched_at for n in ssc._graph.nodes if isinstance(getattr(n, "backend", None), AutoPolicy)}


@pytest.mark.slow
@pytest.mark.parametrize("store", ["rdd", "auto"])
def test_a_state_stream_has_an_rdd_from_its_first_batch_even_an_empty_one(sc, monkeypatch, store) -> None:
    """Before any record (a source whose first batches have no partition), the state stream's output still runs
    on an empty state, each batch, on either side (a graceful-stop test saw an output folder missing)."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    batches = [sc.emptyRDD(), sc.emptyRDD(), sc.parallelize([("a", 1)], 2), sc.emptyRDD()]
    seen: dict[int, list] = {}
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream(batches).runningReduce(operator.add, 2).foreachRDD(
            lambda t, rdd: seen.__setitem__(round(t.timestamp() * 1000), sorted(rdd.collect())))
        run_until(ssc, 4000)
    assert seen == {1000: [], 2000: [], 3000: [("a", 1)], 4000: [("a", 1)]}


@pytest.fixture(scope="module")
def rdd_reference(sc, tmp_path_factory) -> dict[str, list[str]]:
    """The outputs of :func:`_app` on the RDD state, computed once."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("auto-ref")
    _env(mp, tmp, "rdd")
    try:
        return _uninterrupted(sc, _app, tmp, BATCHES * 1000)
    finally:
        mp.undo()


def _uninterrupted(sc, app, tmp, last_ms: int) -> dict[str, list[str]]:
    """The outputs of ``app`` run without a restart through batch ``last_ms`` (under ``tmp``)."""
    with app_context(lambda clock: app(sc, str(tmp / "ref-ckpt"), str(tmp / "ref"), clock)) as ssc:
        run_until(ssc, last_ms, flush_checkpoints=True)
    return read_outputs(str(tmp / "ref"))


@pytest.mark.slow
def test_auto_moves_into_the_store_mid_run_and_gives_the_rdd_states_outputs(sc, tmp_path, monkeypatch,
                                                                           rdd_reference) -> None:
    _env(monkeypatch, tmp_path, "auto")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: _app(sc, ckpt, out, clock)) as ssc:
        _step(ssc, BATCHES * 1000)
        moves = _moves(ssc)
        with urllib.request.urlopen(f"{ssc.uiWebUrl}/api/streams", timeout=30) as r:
            api = {n["type"]: n["state"] for n in json.loads(r.read())["nodes"] if n["state"] is not None}
    # Each stream moved, the update stream (120 keys of initial state, a few touched a batch) right after its first
    # batch reported, the running reduce once its state reached 10x the 4 keys a batch touches (batch 11, or a
    # little later on a machine so busy that a batch is built before the one before it ended).
    assert moves["updateStateByKey"] == 2000, moves
    assert moves["runningReduce"] is not None and 11_000 <= moves["runningReduce"] <= 13_000, moves
    assert moves["track-plain"] is not None and moves["track-timers"] is not None, moves
    # The status page says where each state is kept, and since when.
    for kind, label in (("AutoRunningReduceNode", "runningReduce"), ("AutoUpdateStateNode", "updateStateByKey")):
        assert (api[kind]["kept_in"], api[kind]["picked_by_size"], api[kind]["moved_at_ms"]) == \
            ("executor", True, moves[label]), api[kind]
    got = read_outputs(out)
    assert sorted(got) == sorted(rdd_reference)
    assert len(rdd_reference) == 6 * BATCHES
    assert any(lines for name, lines in rdd_reference.items() if name.startswith("emitted-")), "timers fired"
    for name in sorted(rdd_reference):
        assert got[name] == rdd_reference[name], name
    # The checkpoints: the RDD state's are snapshots saying the stream had not moved, the store's say when it
    # did, and a delta builds on an earlier one (possibly of the RDD state).
    store = open_store(ckpt)
    keys = {k.split("/")[1] for k in store.list("checkpoints/")}
    (running,) = [k for k in keys if "AutoRunningReduceNode" in k]
    manifests = {t: load_manifest(store, running, t) for t in list_checkpoints(store, running)}
    before = [m for t, m in manifests.items() if t < moves["runningReduce"]]
    after = [m for t, m in manifests.items() if t >= moves["runningReduce"]]
    assert before and after
    assert all(m["state"]["auto"]["switched_at"] is None and m["state"]["chain"] == [] for m in before)
    assert all(m["state"]["auto"]["switched_at"] == moves["runningReduce"] for m in after)
    assert any(m["state"]["chain"] for m in after), "a delta after the move"
    # Before the move a checkpoint holds the pairs as they are; a store's chain reads it as its base: every
    # checkpoint reads back as the state that batch output.
    from recovery.checkpointer import checkpoint_prefix, reader_rdd
    from recovery.storespec import StoreSpec

    for t, m in manifests.items():
        reader = reader_rdd(sc, StoreSpec(ckpt), checkpoint_prefix(running, t), m, None)
        state = sorted(str((pickle.loads(k), pickle.loads(v))) for k, v in reader.collect())
        assert state == rdd_reference[f"running-{t}"], t
    assert any(os.scandir(tmp_path / "local")), "the stores were used"


@pytest.mark.slow
def test_stores_removed_right_after_the_move_come_back_and_every_output_equals_the_rdd_states(
        sc, tmp_path, monkeypatch, rdd_reference) -> None:
    """The executors' store folder removed right after ``updateStateByKey`` moved into the store (batch 2): every
    output equals the RDD state's run. (Here the stores come back from the moving batch's checkpoint, read back
    lazily once it was adopted, so every batch runs in one try; the tries are printed.)"""
    _env(monkeypatch, tmp_path, "auto")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: _app(sc, ckpt, out, clock)) as ssc:
        _step(ssc, 2000)
        assert _moves(ssc)["updateStateByKey"] == 2000
        assert any(os.scandir(tmp_path / "local")), "the moved state's stores"
        shutil.rmtree(tmp_path / "local")
        _step(ssc, BATCHES * 1000)
        attempts = {i.batch_time_ms: i.attempts for i in ssc.batchInfos()}
    print("tries per batch:", attempts)
    got = read_outputs(out)
    for name in sorted(rdd_reference):
        assert got[name] == rdd_reference[name], name


def _poll(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.05)
    return value


@pytest.mark.slow
@pytest.mark.fault
def test_stores_removed_inside_the_moving_batch_are_loaded_again_by_its_retry(sc, tmp_path, monkeypatch,
                                                                              rdd_reference, fault_plan) -> None:
    """A task of the batch that moves ``updateStateByKey`` into the store (batch 2) stops right after it loaded its
    partition's store with the RDD state (task point ``state-loaded``); the executors' store folder is removed, then
    the task goes on. Its batch fails on a store that is not at the loaded version (no changelog under a local
    master: nothing to catch up from) and is tried again; the retry drops the move's cached handle with the batch's
    (:meth:`ExecutorStore.retry`), so it loads the state again before it applies the batch. Every output equals the
    RDD state's run (through batch 6: four batches on the store after the move, two checkpoints)."""
    from dstreams.faults import NO_FAULTS, PAUSE, Fault, FaultPlan

    _env(monkeypatch, tmp_path, "auto")
    ckpt, out, marker = str(tmp_path / "ckpt"), str(tmp_path / "out"), tmp_path / "pause-loaded"
    with app_context(lambda clock: _app(sc, ckpt, out, clock)) as ssc:
        _step(ssc, 1000)
        marker.write_text("removed by the task that pauses\n")
        fault_plan(FaultPlan(tasks=(Fault("state-loaded", PAUSE, marker=str(marker)),)))
        ssc.clock.set_time(2000)  # batch 2 runs: the update stream moves, and its first loading task stops
        paused = tmp_path / "pause-loaded.paused"
        worker = int(_poll(lambda: paused.exists() and paused.read_text(), 120, "a loading task to pause"))
        try:
            _poll(lambda: is_stopped(worker), 30, "the paused task's process to stop")
            fault_plan(NO_FAULTS)
            # The other partitions' tasks may still be writing: removed again until gone.
            local = tmp_path / "local"
            _poll(lambda: not shutil.rmtree(local, ignore_errors=True) and not local.exists(), 30, "the stores gone")
        finally:
            os.kill(worker, signal.SIGCONT)
        _step(ssc, 6000)
        assert _moves(ssc)["updateStateByKey"] == 2000
        attempts = {i.batch_time_ms: i.attempts for i in ssc.batchInfos()}
    assert attempts[2000] >= 2, attempts  # the try that met the removed stores failed
    got = read_outputs(out)
    expected = {name: lines for name, lines in rdd_reference.items() if int(name.rsplit("-", 1)[1]) <= 6000}
    assert sorted(got) == sorted(expected)
    for name in sorted(expected):
        assert got[name] == expected[name], name


@pytest.mark.slow
def test_restarts_before_and_after_the_move_give_the_uninterrupted_outputs(sc, tmp_path, monkeypatch,
                                                                         rdd_reference) -> None:
    _env(monkeypatch, tmp_path, "auto")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    moves: list[dict[str, int | None]] = []
    start, until = 0, [7000, 13_000, BATCHES * 1000]
    for run, stop_at in enumerate(until):
        if run == 2:
            shutil.rmtree(tmp_path / "local")  # the executors' disks are gone before the last restart
        with app_context(lambda clock: _app(sc, ckpt, out, clock), checkpoint=ckpt,
                         start_ms=start + (500 if run else 0)) as ssc:
            _step(ssc, stop_at)
            moves.append(_moves(ssc))
        # the driver "dies" after batch stop_at
        start = stop_at
    # First run: the update stream moved, the running reduce not yet (its checkpoint of 6 s is of the RDD state);
    # second: the running reduce moved too; third: both resumed on the store from their checkpoints.
    assert moves[0]["updateStateByKey"] == 2000 and moves[0]["runningReduce"] is None, moves
    assert moves[1]["runningReduce"] is not None, moves
    assert moves[2]["updateStateByKey"] == 2000 and moves[2]["runningReduce"] == moves[1]["runningReduce"], moves
    for kind in ("track-plain", "track-timers"):  # both moved by the end, and resumed on the side they were on
        assert moves[2][kind] is not None and moves[2][kind] == (moves[1][kind] or moves[2][kind]), moves
    got = read_outputs(out)
    assert sorted(got) == sorted(rdd_reference)
    for name in sorted(rdd_reference):
        assert got[name] == rdd_reference[name], name


@pytest.mark.slow
def test_a_checkpoint_written_under_rdd_names_the_setting_that_resumes_it(sc, tmp_path, monkeypatch) -> None:
    """The default moved from ``rdd`` to ``auto``. With the graph stored in the checkpoint (the default) a restart
    runs the stored graph, built under ``rdd``; with ``spark.dstreams.checkpoint.graph=off`` setupFunc builds it
    again under ``auto``: another graph. The error then says which setting resumes the checkpoint, and with that
    setting the restart resumes (the outputs of an uninterrupted run)."""
    from dstreams.recovery.metadata import GraphChangedError

    def app(ckpt: str, out: str, clock) -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.checkpoint(ckpt)
        pairs = ssc.generatorStream(5, 2, seed=1, recordFunc=_records).map(lambda w: (w, 1))
        pairs.runningReduce(operator.add).checkpoint("2s").saveAsTextFiles(os.path.join(out, "running"))
        return ssc

    _env(monkeypatch, tmp_path, "rdd")
    monkeypatch.setenv("DSTREAMS_CHECKPOINT_GRAPH", "off")
    ref_out, ckpt, out = str(tmp_path / "ref"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: app(str(tmp_path / "ref-ckpt"), ref_out, clock)) as ref:
        run_until(ref, 5000, flush_checkpoints=True)
    with app_context(lambda clock: app(ckpt, out, clock), checkpoint=ckpt) as first:
        run_until(first, 3000, flush_checkpoints=True)
    monkeypatch.delenv("DSTREAMS_STATE_STORE")  # the default: auto
    with pytest.raises(GraphChangedError, match=r"built with spark.dstreams.state.store=rdd, this driver's with auto"):
        with app_context(lambda clock: app(ckpt, out, clock), checkpoint=ckpt, start_ms=3500) as refused:
            refused.start()
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "rdd")  # the way out the error names
    with app_context(lambda clock: app(ckpt, out, clock), checkpoint=ckpt, start_ms=3500) as second:
        run_until(second, 5000, flush_checkpoints=True)
    assert read_outputs(out) == read_outputs(ref_out)


def _unique_users(seed: int, t: int, partition: int, n: int):
    """Two new users a partition each batch (one of them twice)."""
    b = t // 1000
    return [f"u{b}-{partition}", f"u{b}-{partition}", f"v{b}-{partition}"]


def _timed_users(seed: int, t: int, partition: int, n: int):
    """``user@event_ms``: the users of :func:`_unique_users` a little before the batch time, and every fifth batch
    one record 25 s back (at 0 before batch 25; from batch 15 on its session would have closed: late)."""
    b = t // 1000
    out = [f"{u}@{t - 100 * (i + 1)}" for i, u in enumerate(_unique_users(seed, t, partition, n))]
    return out + ([f"late{b}@{max(0, t - 25_000)}"] if partition == 0 and b % 5 == 0 else [])


def _window_app(sc, ckpt: str, out: str, clock) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    users = ssc.generatorStream(3, 2, seed=3, recordFunc=_unique_users).map(lambda u: (u, 1))
    window = users.reduceByKeyAndWindow(operator.add, operator.sub, "20s", "1s", 2, lambda kv: kv[1] > 0)
    window.checkpoint("3s").saveAsTextFiles(os.path.join(out, "window"))
    users.countByValueAndWindow("8s", "2s", 2).saveAsTextFiles(os.path.join(out, "count"))  # 4 slides: no state
    # Sessions of the same users by event time (12 s gap: a user's session closes 12 s after its batch).
    timed = ssc.generatorStream(3, 2, seed=3, recordFunc=_timed_users).withEventTime(
        lambda r: int(r.rsplit("@", 1)[1]) / 1000)
    sessions = timed.map(lambda r: (r.rsplit("@", 1)[0], 1)).sessionWindow("12s", len, 2)
    sessions.checkpoint("3s").saveAsTextFiles(os.path.join(out, "sessions"))
    sessions.lateRecords().saveAsTextFiles(os.path.join(out, "late"))
    # Event-time windows of 20 s sliding every 5 s (a key held about 20 s after its records), incremental.
    windows = timed.map(lambda r: (r.rsplit("@", 1)[0], 1)).reduceByKeyAndEventWindow(
        operator.add, "20s", "5s", invFunc=operator.sub, numPartitions=2)
    windows.checkpoint("3s").saveAsTextFiles(os.path.join(out, "eventWindows"))
    return ssc


@pytest.mark.slow
def test_an_incremental_window_and_sessions_move_and_give_the_rdd_states_outputs(sc, tmp_path, monkeypatch) -> None:
    """``reduceByKeyAndWindow`` with an inverse function over 20 slides of new users (4 keys a batch, the window
    full at batch 20, keys leaving from batch 21): the window's state reaches 10 times the keys a slide touches
    near batch 10 and moves into the store. ``sessionWindow`` of the same users by event time (12 s gap, so the
    sessions open at a time reach about 48, closing from batch 14 on, late records every fifth batch) and
    ``reduceByKeyAndEventWindow`` (20 s windows sliding every 5 s, with an inverse function) move too (all three
    near batches 11-13).
    A driver restart at batch 15 with the executors' stores lost resumes them there (from the store's checkpoint
    chains), and every output equals the RDD state's, batch by batch."""
    last = 24
    _env(monkeypatch, tmp_path, "rdd")
    expected = _uninterrupted(sc, _window_app, tmp_path, last * 1000)
    assert len(expected) == 4 * last + last // 2
    assert sum(bool(expected[f"eventWindows-{t}"]) for t in range(1000, last * 1000 + 1, 1000)) >= 3
    assert any(expected[f"sessions-{t}"] for t in range(14_000, last * 1000 + 1, 1000)), "sessions closed"
    assert any(expected[f"late-{t}"] for t in range(1000, last * 1000 + 1, 1000)), "late records"

    _env(monkeypatch, tmp_path, "auto")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    moves: list[dict[str, int | None]] = []
    start = 0
    for run, stop_at in enumerate((15, last)):
        if run:
            shutil.rmtree(tmp_path / "local")  # the executors' disks are gone before the restart
        with app_context(lambda clock: _window_app(sc, ckpt, out, clock), checkpoint=ckpt,
                         start_ms=start + (500 if run else 0)) as ssc:
            _step(ssc, stop_at * 1000)
            moves.append(_moves(ssc))
        start = stop_at * 1000
    moved = moves[0]["reduceByKeyAndWindow"]
    assert moved is not None and 9000 <= moved <= 13_000, moves
    assert moves[1]["reduceByKeyAndWindow"] == moved, moves  # resumed on the store
    assert moves[1]["sessionWindow"] is not None and moves[1]["reduceByKeyAndEventWindow"] is not None, moves
    got = read_outputs(out)
    assert sorted(got) == sorted(expected)
    for name in sorted(expected):
        assert got[name] == expected[name], name


@pytest.mark.slow
def test_a_restart_before_the_initial_states_checkpoint_committed_has_the_initial_state(sc, tmp_path, monkeypatch,
                                                                                      rdd_reference) -> None:
    """A driver that dies before the zero time's checkpoint of ``updateStateByKey``'s ``initialRDD`` commits
    (here: every checkpoint of the stream is gone) restarts with the initial state from the stored graph, as on
    the RDD state (the ``executor`` setting's node keeps it in that checkpoint only, and says so)."""
    _env(monkeypatch, tmp_path, "auto")
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    start = 0
    for run, stop_at in enumerate((3000, 6000)):
        if run:
            store = open_store(ckpt)
            keys = {k.split("/")[1] for k in store.list("checkpoints/") if "AutoUpdateStateNode" in k}
            assert keys
            for key in keys:
                for k in store.list(f"checkpoints/{key}/"):
                    store.delete(k)
            shutil.rmtree(tmp_path / "local")
        with app_context(lambda clock: _app(sc, ckpt, out, clock), checkpoint=ckpt,
                         start_ms=start + (500 if run else 0)) as ssc:
            _step(ssc, stop_at)
        start = stop_at
    got = read_outputs(out)
    for name in ("touched", "changes"):
        for t in range(1000, 6001, 1000):
            assert got[f"{name}-{t}"] == rdd_reference[f"{name}-{t}"], (name, t)
