"""The listener objects answer the calls PySpark listener code makes, with PySpark's values.

In PySpark a callback gets Py4J proxies of ``JavaStreamingListener*`` events: every member is a
method, an unknown time or delay is ``-1``, a missing failure reason is ``None`` and maps are
``java.util.Map`` proxies. These tests drive a real run on a manual clock and check each event type
through those calls only, plus the snapshot rule (an event never shows later changes).
"""

from __future__ import annotations

import copy
import pickle

import pytest

from dstreams import ManualClock, StreamingContext, StreamingListener
from dstreams.listener import NONE, BatchInfo, JavaMap, Option, OutputOperationInfo, StreamInputInfo

TIMEOUT_S = 120
RECORDS_PER_PARTITION, PARTITIONS = 3, 2


class Recorder(StreamingListener):
    """Keeps every event it is given, tagged with the callback's name."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def _keep(self, kind: str, event: object) -> None:
        self.events.append((kind, event))

    def onStreamingStarted(self, e):
        self._keep("streamingStarted", e)

    def onBatchSubmitted(self, e):
        self._keep("batchSubmitted", e)

    def onBatchStarted(self, e):
        self._keep("batchStarted", e)

    def onBatchCompleted(self, e):
        self._keep("batchCompleted", e)

    def onOutputOperationStarted(self, e):
        self._keep("outputStarted", e)

    def onOutputOperationCompleted(self, e):
        self._keep("outputCompleted", e)

    def of(self, kind: str) -> list:
        return [e for k, e in self.events if k == kind]


@pytest.fixture(scope="module")
def run(sc):
    """Two batches of a generator stream with two output operations; the second one fails in batch 2."""
    rec = Recorder()
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.addStreamingListener(rec)
    stream = ssc.generatorStream(RECORDS_PER_PARTITION, PARTITIONS)
    seen: list[int] = []

    def count_lines(rdd):
        seen.append(rdd.count())

    def fail_in_second_batch(rdd):
        if len(seen) == 2:
            raise ValueError("listener-api: output failed on purpose")

    stream.foreachRDD(count_lines)
    stream.foreachRDD(fail_in_second_batch)
    with pytest.MonkeyPatch.context() as mp:  # batch 2 fails once and is dropped; the stream goes on
        mp.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
        mp.setenv("DSTREAMS_BATCH_ON_FAILURE", "dropInput")
        ssc.start()
    start = ssc.startTime.ms
    try:
        for i in range(2):
            clock.advance(1000)
            ssc.awaitBatch(start + i * 1000, TIMEOUT_S)  # returns once the listeners saw the batch too
    finally:
        ssc.stop(stopSparkContext=False)
    assert seen == [RECORDS_PER_PARTITION * PARTITIONS] * 2
    return rec, [start, start + 1000], stream._node.id


def _undefined(value) -> None:
    """What PySpark returns for a time or delay that is not known yet, and dstreams' Option view of it."""
    assert value == -1 and not value.isDefined() and value.isEmpty()
    assert value.getOrElse("fallback") == "fallback"
    with pytest.raises(ValueError):
        value.get()


def _defined(value) -> int:
    assert value.isDefined() and not value.isEmpty() and value >= 0
    assert value.get() == int(value) == value.getOrElse(-1)
    return int(value)


def test_events_come_in_pyspark_order(run):
    rec, times, _ = run
    kinds = [k for k, _ in rec.events]
    per_batch = ["batchSubmitted", "batchStarted", "outputStarted", "outputCompleted",
                 "outputStarted", "outputCompleted", "batchCompleted"]
    assert kinds == ["streamingStarted"] + per_batch * len(times)
    (started,) = rec.of("streamingStarted")
    assert isinstance(started.time(), int) and started.time() > 0


def test_submitted_batch_has_times_but_no_processing(run):
    rec, times, stream_id = run
    submitted = [e.batchInfo() for e in rec.of("batchSubmitted")]
    assert [b.batchTime().milliseconds() for b in submitted] == times
    for b in submitted:
        assert b.submissionTime() > 0
        for value in (b.processingStartTime(), b.processingEndTime(), b.schedulingDelay(),
                      b.processingDelay(), b.totalDelay()):
            _undefined(value)
        assert b.numRecords() == RECORDS_PER_PARTITION * PARTITIONS

        inputs = b.streamIdToInputInfo()
        assert inputs.size() == 1 and list(inputs) == [stream_id] and inputs.containsKey(stream_id)
        one = inputs[stream_id]
        assert one.inputStreamId() == stream_id and one.numRecords() == b.numRecords()
        assert one.metadata().isEmpty() and one.metadataDescription() is None

        outputs = b.outputOperationInfos()
        assert outputs.size() == 2 and sorted(outputs.keySet()) == [0, 1]
        for op_id in outputs:
            op = outputs[op_id]
            assert op.id() == op_id
            assert op.batchTime().milliseconds() == b.batchTime().milliseconds()
            _undefined(op.startTime())
            _undefined(op.endTime())
            _undefined(op.duration())
            assert op.failureReason() is None


def test_output_operations_report_ids_names_descriptions(run):
    rec, times, _ = run
    started = [e.outputOperationInfo() for e in rec.of("outputStarted")]
    assert [(op.batchTime().milliseconds(), op.id(), op.name()) for op in started] == [
        (t, i, name) for t in times for i, name in enumerate(("count_lines", "fail_in_second_batch"))
    ]
    for op in started:
        assert isinstance(op.description(), str) and op.description()
        _defined(op.startTime())
        _undefined(op.endTime())
        assert op.failureReason() is None


def test_completed_output_operation_has_its_duration_and_failure(run):
    rec, times, _ = run
    done = {(op.batchTime().milliseconds(), op.id()): op
            for op in (e.outputOperationInfo() for e in rec.of("outputCompleted"))}
    assert sorted(done) == [(t, i) for t in times for i in (0, 1)]
    for op in done.values():
        start, end = _defined(op.startTime()), _defined(op.endTime())
        assert _defined(op.duration()) == end - start
    failed = [key for key, op in done.items() if op.failureReason() is not None]
    assert failed == [(times[1], 1)]
    reason = done[(times[1], 1)].failureReason()
    assert isinstance(reason, str) and "listener-api: output failed on purpose" in reason


def test_started_and_completed_batches_have_their_delays(run):
    rec, times, _ = run
    for b in (e.batchInfo() for e in rec.of("batchStarted")):
        start = _defined(b.processingStartTime())
        assert _defined(b.schedulingDelay()) == start - b.submissionTime()
        _undefined(b.processingEndTime())
        _undefined(b.processingDelay())
        _undefined(b.totalDelay())

    completed = [e.batchInfo() for e in rec.of("batchCompleted")]
    assert [b.batchTime().milliseconds() for b in completed] == times
    for b in completed:
        start, end = _defined(b.processingStartTime()), _defined(b.processingEndTime())
        assert _defined(b.schedulingDelay()) == start - b.submissionTime()
        assert _defined(b.processingDelay()) == end - start
        assert _defined(b.totalDelay()) == end - b.submissionTime() == b.schedulingDelay() + b.processingDelay()
        ops = b.outputOperationInfos()
        assert all(ops[i].endTime().isDefined() for i in ops)
    first, second = completed
    assert not first.failed and second.failed
    assert second.outputOperationInfos()[1].failureReason() is not None
    assert second.outputOperationInfos()[0].failureReason() is None


def test_each_event_keeps_the_values_of_its_moment(run):
    rec, times, _ = run
    submitted = rec.of("batchSubmitted")[0].batchInfo()
    completed = rec.of("batchCompleted")[0].batchInfo()
    assert submitted.batchTime() == completed.batchTime() and submitted is not completed
    # The batch finished long ago, yet the stored "submitted" event still shows it unprocessed.
    _undefined(submitted.processingDelay())
    _undefined(submitted.outputOperationInfos()[0].endTime())
    assert completed.processingDelay().isDefined()
    op_started = rec.of("outputStarted")[0].outputOperationInfo()
    _undefined(op_started.endTime())
    # Asking twice gives the same values: the event does not follow the engine.
    assert rec.of("batchSubmitted")[0].batchInfo() is submitted


def test_maps_are_read_only_and_answer_like_py4j(run):
    rec, _, stream_id = run
    outputs = rec.of("batchCompleted")[0].batchInfo().outputOperationInfos()
    assert outputs[99] is None  # a Java map's get() of a missing key: null
    assert not outputs.containsKey(99) and 99 not in outputs
    assert outputs.containsValue(outputs[1]) and dict(outputs.items()) == {0: outputs[0], 1: outputs[1]}
    with pytest.raises(TypeError):
        outputs[5] = outputs[0]
    with pytest.raises(TypeError):
        outputs.pop(0)
    inputs = rec.of("batchCompleted")[0].batchInfo().streamIdToInputInfo()
    with pytest.raises(TypeError):
        inputs.clear()
    assert inputs.containsKey(stream_id) and inputs.keySet() == {stream_id}


# ---------------------------------------------------------------------- without a running context
def test_unknown_value_is_minus_one_and_survives_copies():
    assert NONE == -1 and repr(NONE) == "-1" and NONE >= -1
    for clone in (pickle.loads(pickle.dumps(NONE)), copy.deepcopy(NONE)):
        _undefined(clone)
    known = Option(12)
    assert known == 12 and _defined(pickle.loads(pickle.dumps(known))) == 12


def test_total_delay_is_scheduling_plus_processing_delay():
    """Spark's definition (``BatchInfo.totalDelay``): from the batch's submission to the end of its processing,
    not from its batch time: a batch submitted late (a backlog after a restart) does not count the wait before
    its submission."""
    info = BatchInfo(2000, 9000)
    info.processing_start_time_ms, info.processing_end_time_ms = 9004, 9030
    assert (info.scheduling_delay_ms, info.processing_delay_ms) == (4, 26)
    assert info.total_delay_ms == 30 == info.totalDelay()
    assert info.total_delay_ms == info.scheduling_delay_ms + info.processing_delay_ms
    info.processing_end_time_ms = None
    assert info.total_delay_ms is None and info.totalDelay() == -1


def test_snake_case_attributes_stay_in_milliseconds():
    info = BatchInfo(2000, 2003, num_records=4, records_per_input={7: 4})
    info.output_operations[0] = OutputOperationInfo(2000, 0, "save", "save at 2000")
    assert info.scheduling_delay_ms is None and info.schedulingDelay() == -1
    info.processing_start_time_ms, info.processing_end_time_ms = 2010, 2025
    assert (info.scheduling_delay_ms, info.processing_delay_ms, info.total_delay_ms) == (7, 15, 22)
    op = info.output_operations[0]
    assert (op.output_id, op.output_name, op.output_description) == (0, "save", "save at 2000")
    assert (op.id(), op.name(), op.description()) == (0, "save", "save at 2000")
    assert op.duration_ms is None and op.duration() == -1
    assert info.streamIdToInputInfo() == {7: StreamInputInfo(7, 4)}
    described = StreamInputInfo(3, 0, {"Description": "files: a, b", "files": ["a", "b"]})
    assert described.metadataDescription() == "files: a, b"
    assert described.metadata() == JavaMap({"Description": "files: a, b", "files": ["a", "b"]})


def test_the_bus_capacity_is_a_setting(sc, monkeypatch):
    """``spark.dstreams.listenerBus.capacity`` (here through its environment variable: the shared SparkContext's
    conf is fixed) sizes the context's listener bus; the default is ListenerBus's."""
    assert StreamingContext(sc, 1)._bus.capacity == 10000
    monkeypatch.setenv("DSTREAMS_LISTENER_BUS_CAPACITY", "7")
    assert StreamingContext(sc, 1)._bus.capacity == 7
    monkeypatch.setenv("DSTREAMS_LISTENER_BUS_CAPACITY", "0")
    with pytest.raises(ValueError, match="DSTREAMS_LISTENER_BUS_CAPACITY='0' is not a whole number >= 1"):
        StreamingContext(sc, 1)
