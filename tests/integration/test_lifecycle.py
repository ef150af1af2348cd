"""Context lifecycle, listeners and bad input: each a clear error, nothing lost."""

from __future__ import annotations

import functools
import operator

import pytest

from dstreams import ManualClock, StreamingContext, StreamingContextStateError, StreamingListener
from dstreams.graph import GraphFrozenError
from dstreams.testing import manual_context, run_batches, run_pipeline


def test_stopped_context_cannot_restart(sc):
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([[1]]).pprint()
        ssc.start()
        assert StreamingContext.getActive() is ssc
        ssc.stop(stopSparkContext=False)
        assert StreamingContext.getActive() is None
        assert ssc.getState() == "STOPPED"
        with pytest.raises(StreamingContextStateError, match="cannot be restarted"):
            ssc.start()


def test_adding_streams_after_start_is_refused(sc):
    with manual_context(1, sc=sc) as ssc:
        s = ssc.queueStream([[1]])
        s.pprint()
        ssc.start()
        with pytest.raises(StreamingContextStateError, match="before ssc.start"):
            s.map(lambda x: x)
        with pytest.raises(StreamingContextStateError, match="before ssc.start"):
            s.pprint()
        with pytest.raises(StreamingContextStateError, match="cannot add an input stream after .* before ssc.start"):
            ssc.queueStream([[2]])
        # The graph refuses in the same words (one message for both checks).
        with pytest.raises(GraphFrozenError, match="cannot add an output operation after .* before ssc.start"):
            ssc._graph.add_output(s._node)


def test_an_input_without_a_batch_duration_is_refused_as_start_is(sc):
    ssc = StreamingContext(sc)
    with pytest.raises(ValueError, match="batch duration is not set"):
        ssc.queueStream([[1]])
    with pytest.raises(ValueError, match="batch duration is not set"):
        ssc._graph.validate()


def test_start_without_outputs_is_a_clear_error(sc):
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([[1]]).map(lambda x: x)
        with pytest.raises(ValueError, match="no output operations"):
            ssc.start()


def test_second_active_context_is_refused(sc):
    with manual_context(1, sc=sc) as a, manual_context(1, sc=sc) as b:
        a.queueStream([[1]]).pprint()
        b.queueStream([[1]]).pprint()
        a.start()
        with pytest.raises(StreamingContextStateError, match="only one StreamingContext"):
            b.start()


def test_malformed_durations(sc):
    with pytest.raises(ValueError, match="malformed batchDuration"):
        StreamingContext(sc, "1 parsec")
    with manual_context(1, sc=sc) as ssc:
        s = ssc.queueStream([[1]])
        with pytest.raises(ValueError, match="malformed windowDuration"):
            s.window("thirty seconds")
        with pytest.raises(ValueError, match="positive"):
            s.window(0)


def test_window_not_a_multiple_of_the_slide(sc):
    with manual_context(1, sc=sc) as ssc:
        s = ssc.queueStream([[("a", 1)]])
        with pytest.raises(ValueError, match="window duration .* multiple of the parent"):
            s.window("1500ms")
        with pytest.raises(ValueError, match="slide duration .* multiple"):
            s.window("4s", "1500ms")
        with pytest.raises(ValueError, match="multiple"):
            s.reduceByKeyAndWindow(operator.add, operator.sub, "2500ms", "1s")
        with pytest.raises(ValueError, match="multiple"):
            s.window("4s", "2s").window("3s", "2s")


def _inverting(ssc):
    s = ssc.queueStream([[1, 2], [0, 3], [4]])

    def invert(x):
        return 10 // x

    seen: list[list[int]] = []
    s.map(invert).foreachRDD(lambda rdd: seen.append(sorted(rdd.collect())))
    return seen


@pytest.mark.slow
def test_function_raising_in_a_batch_reaches_await_termination_and_stops_the_context(sc, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "stop")  # the default only with a checkpoint location
    with manual_context(1, sc=sc) as ssc:
        seen = _inverting(ssc)
        ssc.start()
        run_batches(ssc, 1, timeout=120)
        ssc.clock.advance(2000)  # batch 2 fails (twice), batch 3 is never run
        with pytest.raises(Exception) as excinfo:
            ssc.awaitTermination(timeout=60)
        text = str(excinfo.value)
        assert "ZeroDivisionError" in text and "invert" in text, text  # the user's traceback
        assert text.startswith(f"batch {ssc.startTime.ms + 1000} failed"), text
        assert "ZeroDivisionError" in text.splitlines()[0], text  # the cause on the first line
        assert "\tat org.apache" not in text  # the JVM stack stays in __cause__
        assert ssc.getState() == "STOPPED"
        assert seen == [[5, 10]]  # batch 2 failed for good: nothing after it ran
        infos = ssc.batchInfos()
        assert [i.failed for i in infos] == [False, True] and infos[1].attempts == 2
        assert "ZeroDivisionError" in infos[1].outputOperationInfos()[0].failureReason()
        with pytest.raises(RuntimeError, match="will not complete"):  # waiting for batch 3 ends at once
            ssc.awaitBatch(ssc.startTime.ms + 2000, 60)


def test_without_a_checkpoint_location_a_failed_batch_is_reported_and_later_batches_run(sc, monkeypatch):
    """PySpark's behaviour (its test_failed_func_with_reseting_failure): nothing could run the batch again, so
    ``onFailure=auto`` drops it and goes on; awaitTermination raises the error."""
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    with manual_context(1, sc=sc) as ssc:
        seen = _inverting(ssc)
        ssc.start()
        run_batches(ssc, 3, timeout=120, check=False)  # batch 2 fails
        with pytest.raises(Exception, match="ZeroDivisionError"):
            ssc.awaitTermination(timeout=10)
        assert seen == [[5, 10], [2]]  # batch 2 failed and was dropped, batch 3 still ran
        infos = ssc.batchInfos()
        assert [i.failed for i in infos] == [False, True, False]
        assert [i.dropped for i in infos] == [False, True, False]
        assert ssc.getState() == "ACTIVE"


def test_driver_side_error_in_foreach_is_raised_as_is(sc):
    class BoomError(Exception):
        pass

    def fail(rdd):
        raise BoomError("from my foreachRDD")

    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([[1]]).foreachRDD(fail)
        ssc.start()
        ssc.clock.advance(1000)  # the batch fails for good: the context stops, awaitTermination raises
        with pytest.raises(BoomError, match="from my foreachRDD"):
            ssc.awaitTermination(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["runningReduce", "reduceByKey", "window", "updateStateByKey", "join"])
def test_non_pair_stream_to_pair_operator(sc, op, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")  # the same error on every try: no retries to wait for
    with manual_context(1, sc=sc) as ssc:
        s = ssc.queueStream([["not-a-pair", "not-a-pair-either"]])
        if op == "runningReduce":
            out = s.runningReduce(operator.add)
        elif op == "reduceByKey":
            out = s.reduceByKey(operator.add)
        elif op == "window":
            out = s.reduceByKeyAndWindow(operator.add, operator.sub, 5, 1)
        elif op == "updateStateByKey":
            out = s.updateStateByKey(lambda vs, st: 1)
        else:
            out = s.join(s)
        out.foreachRDD(lambda rdd: rdd.collect())
        ssc.start()
        ssc.clock.advance(1000)
        with pytest.raises(Exception, match=r"\(key, value\) pairs") as excinfo:
            ssc.awaitTermination(timeout=60)
        assert "not-a-pair" in str(excinfo.value)


def test_foreach_rdd_arity_detection(sc):
    calls: dict[str, list] = {"one": [], "two": [], "partial": [], "obj": []}

    class Sink:
        def __call__(self, time, rdd):
            calls["obj"].append((time.tzinfo is not None, rdd.count()))

    def two(time, rdd, tag="x"):
        calls["two"].append(rdd.count())

    def build(s):
        s.foreachRDD(lambda rdd: calls["one"].append(rdd.count()))
        s.foreachRDD(two)
        s.foreachRDD(functools.partial(lambda label, rdd: calls["partial"].append(label), "p"))
        s.foreachRDD(Sink())
        return {}

    run_pipeline(build, [[1, 2], [3]], sc=sc)
    assert calls == {"one": [2, 1], "two": [2, 1], "partial": ["p", "p"], "obj": [(True, 2), (True, 1)]}


def test_foreach_rdd_rejects_wrong_arity(sc):
    with manual_context(1, sc=sc) as ssc, pytest.raises(TypeError, match="must take"):
        ssc.queueStream([[1]]).foreachRDD(lambda a, b, c: None)


def test_listeners_get_pyspark_compatible_events(sc):
    events: list[tuple[str, object]] = []

    class Recorder(StreamingListener):
        def onStreamingStarted(self, e):
            events.append(("started", e.time()))

        def onBatchSubmitted(self, e):
            events.append(("submitted", e.batchInfo().batchTime().milliseconds()))

        def onBatchStarted(self, e):
            events.append(("batchStarted", e.batchInfo().schedulingDelay().isDefined()))

        def onOutputOperationCompleted(self, e):
            events.append(("opDone", e.outputOperationInfo().failureReason()))

        def onBatchCompleted(self, e):
            info = e.batchInfo()
            events.append(("completed", (info.numRecords(), info.processingDelay().get() >= 0,
                                         info.totalDelay().get() >= info.processingDelay().get())))

    class Broken:
        def onBatchCompleted(self, e):
            raise RuntimeError("listener bug")

    with manual_context(1, sc=sc) as ssc:
        ssc.addStreamingListener(Broken())
        ssc.addStreamingListener(Recorder())
        ssc.generatorStream(3, 2).count().foreachRDD(lambda rdd: rdd.collect())
        ssc.start()
        run_batches(ssc, 2, timeout=120)
    kinds = [k for k, _ in events]
    assert kinds[0] == "started"
    assert kinds[1:] == ["submitted", "batchStarted", "opDone", "completed"] * 2
    assert events[1][1] == 1000
    assert events[4] == ("completed", (6, True, True))
    assert events[3] == ("opDone", None)


def test_get_or_create_and_get_active_or_create(sc, tmp_path):
    made = []

    def setup():
        ssc = StreamingContext(sc, 1, clock=ManualClock())
        ssc.queueStream([[1]]).pprint()
        made.append(ssc)
        return ssc

    ssc = StreamingContext.getOrCreate(str(tmp_path / "ckpt"), setup)
    assert ssc is made[0] and ssc.checkpointDirectory == str(tmp_path / "ckpt")
    assert StreamingContext.getActiveOrCreate(None, setup) is made[1]
    made[1].start()
    try:
        assert StreamingContext.getActiveOrCreate(None, setup) is made[1]
        assert len(made) == 2
    finally:
        made[1].stop(stopSparkContext=False)


def test_graceful_stop_runs_queued_batches(sc):
    seen = []
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([[1], [2], [3]]).foreachRDD(lambda rdd: seen.extend(rdd.collect()))
        ssc.start()
        ssc.clock.advance(3000)  # three batches due at once
        ssc.awaitBatch(ssc.startTime.ms, 60)
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
        assert sorted(seen) == [1, 2, 3]
        assert ssc.awaitTerminationOrTimeout(1) is True


def _cached_rdd_names(sc) -> list[str]:
    rdds = sc._jsc.getPersistentRDDs()
    return sorted(str(rdds.get(k).name()) for k in rdds.keySet())


@pytest.mark.slow
def test_stop_unpersists_the_streams_cached_rdds_when_the_spark_context_lives_on(sc):
    before = _cached_rdd_names(sc)
    with manual_context(1.0, sc=sc) as ssc:
        pairs = ssc.queueStream([sc.parallelize([("a", 1), ("b", 2)], 2) for _ in range(6)])
        pairs.runningReduce(operator.add).foreachRDD(lambda rdd: rdd.collect())
        pairs.reduceByKeyAndWindow(operator.add, operator.sub, 3, 1).foreachRDD(lambda rdd: rdd.collect())
        pairs.window(3, 1).count().foreachRDD(lambda rdd: rdd.collect())
        ssc.start()
        run_batches(ssc, 5)
        assert len(_cached_rdd_names(sc)) > len(before) + 5  # state, window and input RDDs are cached
    # Unpersisting is asynchronous on the executors, but the driver's registry drops them at once.
    # The only one allowed to stay is the engine's shared marker RDD (one per partition count, reused).
    left = [n for n in _cached_rdd_names(sc) if not n.startswith("dstreams-segment-markers")]
    assert left == [n for n in before if not n.startswith("dstreams-segment-markers")]


def test_a_start_that_fails_half_way_leaves_nothing_running(sc, monkeypatch):
    """Issue 22 item 6: a failed start() stops what it started (scheduler threads, event loop, status server,
    the sources' own threads); the context is not active and a new one starts."""
    import socket
    import threading
    import time

    from dstreams.scheduler import JobScheduler

    def running() -> set[str]:
        return {t.name for t in threading.enumerate() if t.name.startswith("dstreams") and t.is_alive()}

    before = running()
    original = JobScheduler.start

    def start_then_fail(self, *args, **kwargs):  # noqa: ANN001, ANN202
        original(self, *args, **kwargs)
        raise RuntimeError("restoring the state failed")

    monkeypatch.setattr(JobScheduler, "start", start_then_fail)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        with manual_context(1, sc=sc) as ssc:  # its stop() at the end comes after the checks of the failed start
            ssc.socketTextStream("127.0.0.1", server.getsockname()[1]).pprint()
            with pytest.raises(RuntimeError, match="restoring the state failed"):
                ssc.start()
            deadline = time.monotonic() + 30
            while running() - before and time.monotonic() < deadline:
                time.sleep(0.05)
            assert running() - before == set(), "threads left running after a failed start()"
            assert StreamingContext.getActive() is None and ssc.uiWebUrl is None
            assert ssc.getState() == "STOPPED"  # as Spark marks a context whose start() failed
    finally:
        server.close()
    monkeypatch.setattr(JobScheduler, "start", original)
    with manual_context(1, sc=sc) as again:
        again.queueStream([[1]]).pprint()
        again.start()
