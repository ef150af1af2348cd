"""getOrCreate with pyspark's contract: the graph comes back from the checkpoint, setupFunc is not called."""

from __future__ import annotations

import logging
import operator
import os

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.graph_store import GRAPH_KEY, GraphLoadError, GraphNotSerializableError
from dstreams.recovery.store import open_store

from ..recovery_app import read_outputs


def _files_setup(sc, inputd: str, out: str, clock: ManualClock, calls: list[int], initial=None):
    def setup() -> StreamingContext:
        calls.append(1)
        ssc = StreamingContext(sc, 1, clock=clock)
        words = ssc.textFileStream(inputd).flatMap(str.split).map(lambda w: (w, 1))
        initial_rdd = sc.parallelize(initial) if initial else None
        counts = words.updateStateByKey(lambda vs, s: sum(vs, s or 0), initialRDD=initial_rdd)
        counts.checkpoint(2)
        counts.map(lambda kv: f"{kv[0]},{kv[1]}").saveAsTextFiles(os.path.join(out, "counts"))
        return ssc

    return setup


def _step(ssc: StreamingContext, inputd: str, t_ms: int, text: str) -> None:
    with open(os.path.join(inputd, f"f{t_ms}.txt"), "w") as f:
        f.write(text)
    ssc.clock.set_time(t_ms)
    ssc.awaitBatch(t_ms, 120)


@pytest.mark.slow
def test_restore_does_not_call_setup_and_state_continues(sc, tmp_path):
    inputd, out, cpd = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "cp")
    os.makedirs(inputd)
    calls: list[int] = []
    first = StreamingContext.getOrCreate(cpd, _files_setup(sc, inputd, out, ManualClock(), calls, [("z", 10)]))
    assert calls == [1]
    first.start()
    try:
        for t in (1000, 2000, 3000):
            _step(first, inputd, t, "a b a\n")
        first._checkpointer.flush(60)
    finally:
        first.stop(stopSparkContext=False, stopGraceFully=True)
    assert open_store(cpd).exists(GRAPH_KEY)

    second = StreamingContext.getOrCreate(cpd, _files_setup(sc, inputd, out, ManualClock(), calls),
                                          clock=ManualClock(3000))
    assert calls == [1], "setupFunc must not be called when the checkpoint holds the graph"
    assert second.sparkContext is sc  # the active SparkContext is reused
    second.start()
    try:
        _step(second, inputd, 4000, "a c\n")
    finally:
        second.stop(stopSparkContext=False)
    lines = sorted(read_outputs(out)["counts-4000"])
    assert lines == ["a,7", "b,3", "c,1", "z,10"]  # the initial state and the counts carried over


def test_a_function_capturing_the_spark_context_fails_start(sc, tmp_path):
    inputd = str(tmp_path / "in")
    os.makedirs(inputd)

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=ManualClock())

        def process(time, rdd):
            sc.parallelize(range(3))  # captures the SparkContext: cannot be checkpointed

        ssc.textFileStream(inputd).foreachRDD(process)
        return ssc

    ssc = StreamingContext.getOrCreate(str(tmp_path / "cp"), setup)
    with pytest.raises(GraphNotSerializableError) as info:
        ssc.start()
    text = str(info.value)
    assert "process" in text and "It appears that you are attempting to reference SparkContext" in text
    assert ssc.getState() == "INITIALIZED"
    ssc.stop(stopSparkContext=False)
    assert not os.path.exists(str(tmp_path / "cp" / "meta" / "head.json"))  # nothing was taken over
    assert os.path.isdir(str(tmp_path / "cp"))  # as in Spark, checkpoint() creates a local folder at once


def test_a_queue_stream_is_not_stored_and_setup_rebuilds_it(sc, tmp_path, caplog):
    cpd = str(tmp_path / "cp")
    calls: list[int] = []

    def setup() -> StreamingContext:
        calls.append(1)
        ssc = StreamingContext(sc, 1, clock=ManualClock())
        ssc.queueStream([[1, 2]], default=[]).map(lambda x: (x, 1)).runningReduce(operator.add).pprint()
        return ssc

    first = StreamingContext.getOrCreate(cpd, setup)
    with caplog.at_level(logging.WARNING, logger="dstreams.recovery.graph_store"):
        first.start()
    try:
        first.clock.set_time(1000)
        first.awaitBatch(1000, 60)
    finally:
        first.stop(stopSparkContext=False)
    assert any("setupFunc" in r.message for r in caplog.records)
    second = StreamingContext.getOrCreate(cpd, setup)
    assert calls == [1, 1]
    second.stop(stopSparkContext=False)


def test_a_corrupt_stored_graph_says_what_to_do_and_rebuild_is_an_opt_in(sc, tmp_path):
    inputd, out, cpd = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "cp")
    os.makedirs(inputd)
    calls: list[int] = []
    first = StreamingContext.getOrCreate(cpd, _files_setup(sc, inputd, out, ManualClock(), calls))
    first.start()
    try:
        _step(first, inputd, 1000, "a\n")
    finally:
        first.stop(stopSparkContext=False)
    store = open_store(cpd)
    raw = store.get(GRAPH_KEY)
    store.put(GRAPH_KEY, raw[:-10] + b"0123456789")
    with pytest.raises(GraphLoadError, match="corrupt"):
        StreamingContext.getOrCreate(cpd, _files_setup(sc, inputd, out, ManualClock(), calls))
    # A graph that does not unpickle names both ways out.
    import hashlib
    import json

    head = json.loads(raw[len(b"DSTREAMS-GRAPH\n"):].split(b"\n", 1)[0])
    head["sha256"] = hashlib.sha256(b"not a pickle").hexdigest()
    store.put(GRAPH_KEY, b"DSTREAMS-GRAPH\n" + json.dumps(head).encode() + b"\nnot a pickle")
    with pytest.raises(GraphLoadError, match="rebuildGraph=True") as info:
        StreamingContext.getOrCreate(cpd, _files_setup(sc, inputd, out, ManualClock(), calls))
    assert "empty checkpoint location" in str(info.value)
    rebuilt = StreamingContext.getOrCreate(cpd, _files_setup(sc, inputd, out, ManualClock(), calls),
                                           rebuildGraph=True, clock=ManualClock(1000))
    assert calls == [1, 1]
    rebuilt.start()
    try:
        _step(rebuilt, inputd, 2000, "a\n")
    finally:
        rebuilt.stop(stopSparkContext=False)
    assert sorted(read_outputs(out)["counts-2000"]) == ["a,2"]
