"""``dstreams.testing``: the harness users test their own pipelines with (collect, run_batches)."""

from __future__ import annotations

import operator
import os

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.testing import collect, run_batches

from ..recovery_app import read_outputs


def test_collect_and_run_batches_drive_a_pipeline_batch_by_batch(sc):
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    counts = ssc.queueStream([["a b a"], ["b"], []]).flatMap(str.split).map(lambda w: (w, 1)).runningReduce(
        operator.add)
    got = collect(counts)
    words = collect(ssc.queueStream([["x"], [], ["y", "z"]]))
    ssc.start()
    try:
        infos = run_batches(ssc, 2)
        assert [i.batch_time.ms for i in infos] == [1000, 2000] and ssc.clock.time_ms() == 2000
        assert [i.batch_time.ms for i in run_batches(ssc, 1)] == [3000]  # the next batch, after the clock's time
    finally:
        ssc.stop(stopSparkContext=False)
    assert {t: sorted(v) for t, v in got.items()} == {1000: [("a", 2), ("b", 1)], 2000: [("a", 2), ("b", 2)],
                                                       3000: [("a", 2), ("b", 2)]}
    assert words == {1000: ["x"], 2000: [], 3000: ["y", "z"]}


def test_run_batches_names_a_failed_batch_and_refuses_what_it_cannot_drive(sc, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "dropInput")
    ssc = StreamingContext(sc, 1, clock=ManualClock())

    def boom(t, rdd) -> None:  # noqa: ANN001
        if rdd.collect() == ["bad"]:
            raise ValueError("the sink refused it")

    ssc.queueStream([["ok"], ["bad"]]).foreachRDD(boom)
    with pytest.raises(RuntimeError, match="call ssc.start"):
        run_batches(ssc, 1)
    ssc.start()
    try:
        run_batches(ssc, 1)
        with pytest.raises(AssertionError, match=r"(?s)batch 2000 was dropped.*the sink refused it"):
            run_batches(ssc, 1)
    finally:
        ssc.stop(stopSparkContext=False)
    plain = StreamingContext(sc, 1)
    plain.queueStream([[1]]).pprint()
    with pytest.raises(TypeError, match="must be a ManualClock"):
        run_batches(plain, 1)


def test_run_pipeline_returns_each_batch_of_one_stream_or_of_named_streams(sc):
    from dstreams.testing import run_pipeline

    def words(lines):  # noqa: ANN001, ANN202
        return lines.flatMap(str.split).map(lambda w: (w, 1)).runningReduce(operator.add)

    got = run_pipeline(words, [["a b a"], ["b"]], batches=3, sort=True, sc=sc)
    assert got == [[("a", 2), ("b", 1)], [("a", 2), ("b", 2)], [("a", 2), ("b", 2)]]
    both = run_pipeline(lambda s: {"upper": s.map(str.upper), "lengths": s.map(len)}, [["x", "yy"], []], sc=sc)
    assert both == {"upper": [["X", "YY"], []], "lengths": [[1, 2], []]}


def test_manual_context_stops_its_context_however_the_block_ends_and_checkpoints_where_asked(sc, tmp_path):
    from dstreams.testing import manual_context

    with pytest.raises(ZeroDivisionError):
        with manual_context(1, sc=sc, checkpoint=str(tmp_path / "ck")) as ssc:
            counts = ssc.queueStream([[("k", 1)], [("k", 2)]]).updateStateByKey(
                lambda new, old: sum(new) + (old or 0))
            got = collect(counts, sort=True)
            ssc.start()
            run_batches(ssc, 2)
            assert got == {1000: [("k", 1)], 2000: [("k", 3)]}
            1 / 0  # noqa: B018
    assert ssc.getState() == "STOPPED"
    assert (tmp_path / "ck").is_dir() and any((tmp_path / "ck").iterdir())
    assert sc._jsc is not None  # the SparkContext is left for the next test


def test_run_batches_backlog_generates_the_batches_together_and_sort_orders_mixed_records(sc):
    from dstreams.testing import manual_context

    with manual_context(1, sc=sc, start_ms=5000) as ssc:
        got = collect(ssc.queueStream([[3, 1, 2], [None, "b", 1]]), sort=True)
        ssc.start()
        infos = run_batches(ssc, 2, backlog=True)
        assert ssc.clock.time_ms() == 7000
    assert [i.batch_time.ms for i in infos] == [6000, 7000]
    assert got == {6000: [1, 2, 3], 7000: sorted([None, "b", 1], key=repr)}


def _counting_app(sc, checkpoint: str, out: str, calls: list[int]):  # noqa: ANN001, ANN202
    """An application's setup on the clock it is handed: a running count over a generator source, saved under
    ``out`` (stored with the graph, so a restart restores it without calling setup; and its functions: a restored
    output writes files, not into a dict of this process)."""

    def setup(clock: ManualClock) -> StreamingContext:
        calls.append(clock.time_ms())
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.checkpoint(checkpoint)
        ssc.generatorStream(2, 1, seed=1).map(lambda r: ("n", 1)).runningReduce(operator.add).checkpoint(
            "2s").saveAsTextFiles(os.path.join(out, "counts"))
        return ssc

    return setup


@pytest.mark.slow
def test_app_context_and_run_until_restart_an_app_from_its_checkpoint_where_the_clock_says(sc, tmp_path):
    from dstreams.testing import app_context, run_until

    ckpt, out, calls = str(tmp_path / "ck"), str(tmp_path / "out"), []
    with app_context(_counting_app(sc, ckpt, out, calls), checkpoint=ckpt) as first:
        infos = run_until(first, 4000, flush_checkpoints=True)  # starts the context, the clock jumps to 4 s
        assert first.getState() == "ACTIVE" and first.clock.time_ms() == 4000
        assert [i.batch_time.ms for i in infos] == [1000, 2000, 3000, 4000]
    assert first.getState() == "STOPPED" and calls == [0]  # the driver "dies" after batch 4
    assert read_outputs(out)["counts-4000"] == [str(("n", 8))]
    with app_context(_counting_app(sc, ckpt, out, calls), checkpoint=ckpt, start_ms=6500) as second:
        assert calls == [0]  # restored from the checkpoint: setup is not called
        infos = run_until(second, 8000)
        assert [i.batch_time.ms for i in infos] == [5000, 6000, 7000, 8000]  # 5 and 6 were missed, caught up
    assert read_outputs(out)["counts-8000"] == [str(("n", 16))]


@pytest.mark.slow
def test_run_through_is_a_plain_run_and_run_until_fails_a_failed_batch(sc, tmp_path, monkeypatch):
    from dstreams.testing import app_context, run_through, run_until

    calls: list[int] = []
    out = str(tmp_path / "out")
    infos = run_through(_counting_app(sc, str(tmp_path / "ck"), out, calls), 3000, start_ms=1000)
    assert [i.batch_time.ms for i in infos] == [2000, 3000] and calls == [1000]
    assert read_outputs(out) == {"counts-2000": [str(("n", 2))], "counts-3000": [str(("n", 4))]}

    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "dropInput")

    def failing(clock: ManualClock) -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.queueStream([["ok"], ["bad"]]).foreachRDD(lambda rdd: rdd.map(lambda r: 1 / (r != "bad")).count())
        return ssc

    with app_context(failing) as ssc, pytest.raises(AssertionError, match=r"(?s)batch 2000 was dropped.*Zero"):
        run_until(ssc, 2000)
    with pytest.raises(TypeError, match="clock it is handed"):
        with app_context(lambda clock: StreamingContext(sc, 1)):
            pass
    with pytest.raises(ValueError, match="pass checkpoint too"):
        with app_context(failing, rebuildGraph=True):
            pass


def test_manual_context_forwards_remember_and_concurrent_batches(sc):
    from dstreams.testing import manual_context

    with manual_context(1, sc=sc, remember="5s", concurrentBatches=2, stopGraceFully=True) as ssc:
        assert ssc.concurrent_batches == 2 and ssc._graph.remember_duration.ms == 5000
        ssc.queueStream([[1]]).pprint()
        ssc.start()
        run_batches(ssc, 1)
    assert ssc.getState() == "STOPPED"


def test_await_checkpoints_is_a_barrier_for_the_checkpoints_begun_and_needs_a_started_context(sc, tmp_path):
    from dstreams.testing import manual_context

    with manual_context(1, sc=sc) as ssc:  # no checkpoint location: nothing to wait for
        ssc.queueStream([[1]]).foreachRDD(lambda rdd: None)
        with pytest.raises(RuntimeError, match="not been started"):
            ssc.awaitCheckpoints()
        ssc.start()
        run_batches(ssc, 1)
        ssc.awaitCheckpoints(5.0)
    ckpt = tmp_path / "ck"
    with manual_context(1, sc=sc, checkpoint=str(ckpt)) as ssc:
        counts = ssc.queueStream([[("k", 1)], [("k", 2)], [("k", 3)]]).updateStateByKey(
            lambda new, old: sum(new) + (old or 0))
        counts.checkpoint(1)
        collect(counts)
        ssc.start()
        run_batches(ssc, 3)
        ssc.awaitCheckpoints(60.0)
        written = sorted(p.name for p in (ckpt / "checkpoints").rglob("*") if p.is_dir())
    assert written, "no data checkpoint after the barrier"
