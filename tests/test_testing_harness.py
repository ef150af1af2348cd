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
