"""Master failover: resume from the metadata log and data checkpoints with exactly-once outputs."""

from __future__ import annotations

import logging
import operator
import os

import pytest

from dstreams import ManualClock, StreamingContext, StreamingContextStateError
from dstreams.recovery.checkpointer import list_checkpoints
from dstreams.recovery.metadata import FencedError, ForeignCheckpointError, GraphChangedError, MetadataLog
from dstreams.recovery.store import open_store
from dstreams.testing import app_context, run_batches, run_through, run_until

from ..recovery_app import build, read_outputs


def _reference(sc, tmp_path, batches: int) -> dict[str, list[str]]:
    out = tmp_path / "ref-out"
    run_through(lambda clock: build(sc, str(tmp_path / "ref-ckpt"), str(out), clock), batches * 1000)
    return read_outputs(str(out))


@pytest.mark.slow
def test_resume_after_abrupt_stop_gives_exactly_the_uninterrupted_outputs(sc, tmp_path):
    expected = _reference(sc, tmp_path, 14)
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: build(sc, ckpt, out, clock), checkpoint=ckpt) as first:
        run_until(first, 7000, flush_checkpoints=True)
    # the driver "dies" after batch 7
    # A half-written output of batch 8 (no _SUCCESS) must be replaced, not kept.
    os.makedirs(os.path.join(out, "counts-8000"))
    with open(os.path.join(out, "counts-8000", "part-00000"), "w") as f:
        f.write("garbage\n")
    called = []
    # Down for a few batches (the clock at 11.5 s): 8..11 are missed and caught up.
    with app_context(lambda clock: called.append(1) or build(sc, ckpt, out, clock), checkpoint=ckpt,
                     start_ms=11_500) as second:
        assert called == []  # pyspark's contract: the graph comes from the checkpoint, setupFunc is not called
        run_until(second, 14_000, flush_checkpoints=True)
        assert second._metadata is not None and second._metadata.head["epoch"] == 2
        counts_key = second._graph.stateful_nodes()[0].key  # the running reduce
    got = read_outputs(out)
    assert got == expected
    # The first driver's checkpoints (2, 4, 6 s) were taken over by the second and deleted in time.
    assert min(list_checkpoints(open_store(ckpt), counts_key)) >= 8000
    assert sorted(expected) == sorted(f"{n}-{t}" for n in ("counts", "sessions", "window")
                                      for t in range(1000, 15000, 1000))


@pytest.mark.slow
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(sc, tmp_path, caplog):
    expected = _reference(sc, tmp_path, 9)
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: build(sc, ckpt, out, clock), checkpoint=ckpt) as first:
        run_until(first, 6000, flush_checkpoints=True)
        node_key = first._graph.stateful_nodes()[0].key  # the running reduce
    store = open_store(ckpt)
    newest = list_checkpoints(store, node_key)[0]
    part = f"checkpoints/{node_key}/{newest:015d}/part-00000"
    store.put(part, store.get(part)[:-3])  # truncated
    with app_context(lambda clock: build(sc, ckpt, out, clock), checkpoint=ckpt, start_ms=6000) as second:
        with caplog.at_level(logging.WARNING, logger="dstreams.recovery.resume"):
            run_until(second, 9000, flush_checkpoints=True)
    assert any("unreadable" in r.message for r in caplog.records)
    assert read_outputs(out) == expected


@pytest.mark.slow
def test_changed_graph_is_refused_with_what_changed(sc, tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: build(sc, ckpt, out, clock), checkpoint=ckpt) as first:
        run_until(first, 2000)
    with app_context(lambda clock: build(sc, ckpt, out, clock, window="20s"), checkpoint=ckpt,
                     rebuildGraph=True) as other, pytest.raises(GraphChangedError, match="window=10000.*window=20000"):
        other.start()


@pytest.mark.slow
def test_plain_start_on_a_used_location_and_foreign_application(sc, tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: build(sc, ckpt, out, clock)) as first:
        run_until(first, 1000)
    with app_context(lambda clock: build(sc, ckpt, out, clock)) as again, pytest.raises(
            StreamingContextStateError, match="getOrCreate"):
        again.start()
    store = open_store(ckpt)
    log = MetadataLog(store, "another-app", [], 1000)
    with pytest.raises(ForeignCheckpointError, match="belongs to application"):
        log.take_over(0)


def test_stale_driver_is_fenced_off():
    store = open_store("memory://fencing-test")
    a = MetadataLog(store, "app", ["g"], 1000)
    assert a.take_over(0) is None
    a.commit(completed_through=1000)
    b = MetadataLog(store, "app", ["g"], 1000)
    prev = b.take_over(0)
    assert prev is not None and prev["epoch"] == 1 and b.head["epoch"] == 2
    with pytest.raises(FencedError, match="replaced by another driver"):
        a.commit(completed_through=2000)
    with pytest.raises(FencedError):
        a.check_owner()
    b.commit(completed_through=2000)
    assert MetadataLog.read(store)["completed_through"] == 2000


@pytest.mark.parametrize("racer", ["previous owner", "another driver"])
def test_a_take_over_that_loses_a_race(racer, monkeypatch):
    """A write lands between the new driver's read of the head and its conditional write. The previous owner's
    commit (a zombie resumed in the middle of a commit it had checked, e.g. frozen holding the local folder's lock
    the new driver was waiting for): the take-over starts again from the newer head, and the old owner is fenced at
    its next commit. Another driver's take-over: this one is fenced."""
    store = open_store(f"memory://take-over-race-{racer.replace(' ', '-')}")
    a = MetadataLog(store, "app", ["g"], 1000)
    a.take_over(0)
    a.commit(completed_through=1000)
    real = store.put_if_match
    raced: list[bool] = []

    def racing(key: str, data: bytes, etag: str) -> str:
        if not raced:
            raced.append(True)
            if racer == "previous owner":
                a.commit(completed_through=2000)
            else:
                MetadataLog(store, "app", ["g"], 1000).take_over(0)
        return real(key, data, etag)

    monkeypatch.setattr(store, "put_if_match", racing)
    b = MetadataLog(store, "app", ["g"], 1000)
    if racer == "another driver":
        with pytest.raises(FencedError, match="at the same moment"):
            b.take_over(0)
        assert MetadataLog.read(store)["epoch"] == 2
        return
    prev = b.take_over(0)
    assert prev is not None and prev["completed_through"] == 2000 and prev["epoch"] == 1
    assert b.head["epoch"] == 2 and MetadataLog.read(store)["completed_through"] == 2000
    with pytest.raises(FencedError, match="replaced by another driver"):
        a.commit(completed_through=3000)
    b.commit(completed_through=3000)
    assert MetadataLog.read(store)["owner"] == b.owner


@pytest.mark.slow
def test_socket_batches_are_replayed_from_the_write_ahead_log(sc, tmp_path):
    import operator

    from .test_sources import _LineServer, _wait_buffered

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    server = _LineServer()

    def setup(clock: ManualClock) -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.checkpoint(ckpt)
        lines = ssc.socketTextStream("127.0.0.1", server.port)
        counts = lines.flatMap(str.split).map(lambda w: (w, 1)).runningReduce(operator.add).checkpoint("2s")
        counts.saveAsTextFiles(os.path.join(out, "counts"))
        return ssc

    with app_context(setup, checkpoint=ckpt) as first:
        first.start()
        for text in [b"a b\n", b"b c\n", b"c d\n", b"d e\n", b"e f\n"]:
            server.send(text)
            _wait_buffered(first._graph.inputs[0], 1)
            run_batches(first, 1, timeout=120, flush_checkpoints=True)
    expected = read_outputs(out)
    import shutil

    shutil.rmtree(os.path.join(out, "counts-5000"))  # batch 5 comes after the last checkpoint (4000)
    try:
        with app_context(setup, checkpoint=ckpt, start_ms=5000) as second:
            run_until(second, 5000)
    finally:
        server.close()
    assert read_outputs(out) == expected  # batch 5 rebuilt from the write-ahead log, not from the socket
    assert expected["counts-5000"] == sorted(str(x) for x in [("a", 1), ("b", 2), ("c", 2), ("d", 2), ("e", 2),
                                                                ("f", 1)])


class _Outage:
    """Wraps the metadata log's store: while ``down`` is set every call fails as an exhausted retry would."""

    def __init__(self, inner) -> None:
        import threading

        self.inner = inner
        self.down = threading.Event()
        self.refused = 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            from dstreams.recovery.store.errors import StoreUnavailableError

            if self.down.is_set():
                self.refused += 1
                raise StoreUnavailableError(f"{name}: store unreachable (injected outage)")
            return attr(*args, **kwargs)

        return call


@pytest.mark.slow
def test_batches_wait_for_a_store_that_is_down_for_a_while_and_lose_nothing(sc, tmp_path, caplog):
    expected = _reference(sc, tmp_path, 8)
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    with app_context(lambda clock: build(sc, ckpt, out, clock)) as ssc:
        run_until(ssc, 3000, flush_checkpoints=True)
        outage = _Outage(ssc._metadata.store)
        ssc._metadata.store = outage
        outage.down.set()
        ssc.clock.set_time(8000)
        with caplog.at_level(logging.WARNING, logger="dstreams.recovery.journal"):
            with pytest.raises(TimeoutError):
                ssc.awaitBatch(5000, 4.0)  # batch 4's offsets cannot be recorded: it waits, not runs
            assert outage.refused >= 2  # retried, not given up
            assert ssc._scheduler.last_generated.ms <= 4000
            outage.down.clear()  # the store is back
            for t in range(4000, 8001, 1000):
                ssc.awaitBatch(t, 120)
        ssc._checkpointer.flush(60)
        assert any("unavailable" in r.message and "waits and retries" in r.message for r in caplog.records)
    assert read_outputs(out) == expected


@pytest.mark.slow
def test_a_store_down_longer_than_the_outage_bound_stops_the_driver_with_the_error(sc, tmp_path, monkeypatch):
    from dstreams.recovery.store.errors import StoreUnavailableError

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "1.5")  # read once, when the context starts
    with app_context(lambda clock: build(sc, ckpt, out, clock)) as ssc:
        run_until(ssc, 2000, flush_checkpoints=True)
        assert ssc._scheduler.journal.outage_seconds == 1.5
        outage = _Outage(ssc._metadata.store)
        ssc._metadata.store = outage
        outage.down.set()
        ssc.clock.set_time(4000)
        with pytest.raises(StoreUnavailableError, match="injected outage"):
            ssc.awaitTermination(60)
    # Nothing after batch 2 was committed as output; a restart resumes from the log (see the tests above).
    assert all(int(name.rsplit("-", 1)[1]) <= 3000 for name in read_outputs(out))


# ----------------------------------------------------------------- checkpoints of different times


def _files_app(sc, ckpt: str, inp: str, out: str, clock: ManualClock, window_interval: str = "2s") -> StreamingContext:
    """Two checkpointed streams over a file source whose batch ``k`` holds file ``k - 1`` (one file per batch,
    files written ahead): input taken again from new files would show in the outputs."""
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    words = ssc.textFileStream(inp, maxFilesPerBatch=1).map(lambda w: (w, 1))
    counts = words.runningReduce(operator.add).checkpoint("2s")
    counts.saveAsTextFiles(os.path.join(out, "counts"))
    win = words.reduceByKeyAndWindow(operator.add, operator.sub, "3s", "1s", filterFunc=lambda kv: kv[1] > 0)
    win.checkpoint(window_interval).saveAsTextFiles(os.path.join(out, "window"))
    words.map(lambda kv: kv[0]).saveAsTextFiles(os.path.join(out, "events"))
    return ssc


def _write_files(folder: str, n: int) -> None:
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        with open(os.path.join(folder, f"in-{i:04d}.txt"), "w") as f:
            f.write("".join(f"f{i}-{j} w{(i * 3 + j) % 5}\n".split()[0] + "\n" for j in range(3)))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["one-manifest-missing", "different-intervals"])
def test_a_restart_where_the_streams_newest_checkpoints_differ_replays_the_recorded_input(sc, tmp_path, case):
    """``one-manifest-missing``: the driver died after the checkpoint of one stateful stream at t committed and
    before the other's did (the randomized fault schedule's ``checkpoint-write`` kill); ``different-intervals``:
    the streams checkpoint every 2 s and every 3 s. The restart resumes from the older newest checkpoint; the
    stream restored at a later one must not rebuild its state from the first batch with input taken anew (which
    moved every source 20 batches ahead in the schedule's run: their input was lost)."""
    interval = "3s" if case == "different-intervals" else "2s"
    batches = 24
    ref_in, ref_out = str(tmp_path / "ref-in"), str(tmp_path / "ref-out")
    with app_context(lambda clock: _files_app(sc, str(tmp_path / "ref-ckpt"), ref_in, ref_out, clock,
                                              interval)) as ref:
        os.makedirs(ref_in)
        ref.start()
        _write_files(ref_in, 60)  # after the start: a new file source ignores the files it finds at its start
        run_until(ref, batches * 1000)
    expected = read_outputs(ref_out)
    assert sorted(expected) == sorted(f"{n}-{t}" for n in ("counts", "window", "events")
                                      for t in range(1000, (batches + 1) * 1000, 1000))

    ckpt, inp, out = str(tmp_path / "ckpt"), str(tmp_path / "in"), str(tmp_path / "out")
    with app_context(lambda clock: _files_app(sc, ckpt, inp, out, clock, interval)) as first:
        os.makedirs(inp)
        first.start()
        _write_files(inp, 60)
        run_until(first, 20_000, flush_checkpoints=True)
        counts_key, window_key = (n.key for n in first._graph.stateful_nodes())
    store = open_store(ckpt)
    assert list_checkpoints(store, counts_key)[0] == 20_000
    if case == "one-manifest-missing":
        assert list_checkpoints(store, window_key)[0] == 20_000
        # The driver died between the two manifests of 20 s: the window's checkpoint at 20 s has parts only.
        store.delete(f"checkpoints/{window_key}/{20_000:015d}/MANIFEST.json")
    else:
        assert list_checkpoints(store, window_key)[0] == 18_000
    with app_context(lambda clock: _files_app(sc, ckpt, inp, out, clock, interval), checkpoint=ckpt,
                     start_ms=20_000) as second:
        second.start()
        assert second.startTime.ms == 19_000  # resumed after the window's checkpoint at 18 s
        run_until(second, batches * 1000)
    got = read_outputs(out)
    assert got == expected
