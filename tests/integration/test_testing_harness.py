"""``dstreams.testing``: the harness users test their own pipelines with (collect, run_batches)."""

from __future__ import annotations

import operator

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.testing import collect, run_batches


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
