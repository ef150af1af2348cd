"""The asynchronous listener bus (``dstreams.listener_bus.ListenerBus``) and its event snapshots; no Spark.

Every wait has a timeout; nothing sleeps to wait for the bus thread.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from dstreams.listener import (
    BatchInfo,
    OutputOperationInfo,
    StreamingListener,
    StreamingListenerBatchCompleted,
    StreamingListenerBatchStarted,
    StreamingListenerBatchSubmitted,
    StreamingListenerOutputOperationCompleted,
    StreamingListenerOutputOperationStarted,
    StreamingListenerStreamingStarted,
)
from dstreams.listener_bus import ListenerBus

WAIT = 10.0  # generous upper bound for anything that should happen promptly


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.threads: set[str] = set()

    def onBatchSubmitted(self, e):
        self.threads.add(threading.current_thread().name)
        self.events.append(("submitted", e))

    def onBatchCompleted(self, e):
        self.threads.add(threading.current_thread().name)
        self.events.append(("completed", e))


class Blocker:
    """Blocks in ``onBatchSubmitted`` until released (with a timeout, so a failing test cannot hang)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def onBatchSubmitted(self, e):
        self.entered.set()
        assert self.release.wait(WAIT), "test never released the blocking listener"


@pytest.fixture
def bus():
    b = ListenerBus()
    yield b
    b.stop(timeout_s=WAIT)


def test_slow_listener_does_not_delay_post(bus):
    blocker, rec = Blocker(), Recorder()
    bus.add(blocker)
    bus.add(rec)
    started = time.monotonic()
    for i in range(100):
        bus.post("onBatchSubmitted", i)
    assert time.monotonic() - started < 1.0  # post never waits for the blocked listener
    assert blocker.entered.wait(WAIT)
    assert not bus.wait_until_empty(0.05)  # the first event is stuck in the blocker
    blocker.release.set()
    assert bus.wait_until_empty(WAIT)
    assert [e for _, e in rec.events] == list(range(100))
    assert rec.threads == {ListenerBus.THREAD_NAME}
    assert bus.dropped == 0


def test_thread_is_a_lazily_started_daemon():
    b = ListenerBus()
    try:
        assert b._thread is None
        assert b.wait_until_empty(0.0)  # nothing posted: empty at once
        b.post("onBatchSubmitted", 1)  # no listener: dropped at once, no thread woken
        assert b._thread is None
        b.add(Recorder())
        b.post("onBatchSubmitted", 1)
        assert b._thread is not None and b._thread.daemon and b._thread.name == ListenerBus.THREAD_NAME
    finally:
        b.stop(timeout_s=WAIT)
    assert not b._thread.is_alive()


def test_events_delivered_in_order_across_callbacks(bus):
    rec = Recorder()
    bus.add(rec)
    for i in range(500):
        bus.post("onBatchSubmitted" if i % 2 else "onBatchCompleted", i)
    bus.post("onNoSuchCallback", -1)  # listeners without the callback are skipped
    assert bus.wait_until_empty(WAIT)
    assert [e for _, e in rec.events] == list(range(500))
    assert [k for k, _ in rec.events][:2] == ["completed", "submitted"]


def test_raising_listener_does_not_stop_delivery(bus, caplog):
    class Broken(StreamingListener):
        def onBatchSubmitted(self, e):
            raise RuntimeError("listener bug")

    rec = Recorder()
    bus.add(Broken())
    bus.add(rec)
    with caplog.at_level(logging.ERROR, logger="dstreams.listener_bus"):
        for i in range(3):
            bus.post("onBatchSubmitted", i)
        assert bus.wait_until_empty(WAIT)
    assert [e for _, e in rec.events] == [0, 1, 2]
    failures = [r for r in caplog.records if "failed in onBatchSubmitted" in r.getMessage()]
    assert len(failures) == 3 and all(r.exc_info for r in failures)


def test_add_and_remove(bus):
    rec = Recorder()
    bus.add(rec)
    bus.post("onBatchSubmitted", 1)
    assert bus.wait_until_empty(WAIT)
    bus.remove(rec)
    bus.post("onBatchSubmitted", 2)
    assert bus.wait_until_empty(WAIT)
    assert [e for _, e in rec.events] == [1]
    with pytest.raises(ValueError):
        bus.remove(rec)


def test_full_queue_drops_counts_and_warns_once(caplog):
    b = ListenerBus(capacity=3)
    blocker, rec = Blocker(), Recorder()
    b.add(blocker)
    b.add(rec)
    try:
        b.post("onBatchSubmitted", 0)  # taken by the thread, blocks in the listener
        assert blocker.entered.wait(WAIT)
        with caplog.at_level(logging.WARNING, logger="dstreams.listener_bus"):
            for i in range(1, 4):  # fills the queue (capacity 3)
                b.post("onBatchSubmitted", i)
            assert b.dropped == 0
            for i in range(4, 9):
                b.post("onBatchSubmitted", i)
        assert b.dropped == 5
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1  # rate limited: one warning per minute
        msg = warnings[0].getMessage()
        assert "dropped 1 events from the listener bus since" in msg
        assert "too slow" in msg and "raise the capacity (spark.dstreams.listenerBus.capacity)" in msg
        blocker.release.set()
        assert b.wait_until_empty(WAIT)
        assert [e for _, e in rec.events] == [0, 1, 2, 3]
        # the next drop after the interval reports how many were dropped since the last warning
        b.drop_warning_interval_s = 0.0
        caplog.clear()
        blocker.release.clear()
        blocker.entered.clear()
        b.post("onBatchSubmitted", 10)
        assert blocker.entered.wait(WAIT)
        for i in range(11, 15):
            b.post("onBatchSubmitted", i)
        assert b.dropped == 6
        msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(msgs) == 1 and "dropped 5 events from the listener bus since" in msgs[0]
        assert "(6 in total)" in msgs[0]
    finally:
        blocker.release.set()
        b.stop(timeout_s=WAIT)


def test_wait_until_empty_times_out_then_succeeds(bus):
    blocker = Blocker()
    bus.add(blocker)
    bus.post("onBatchSubmitted", 0)
    assert blocker.entered.wait(WAIT)
    started = time.monotonic()
    assert bus.wait_until_empty(0.2) is False  # the event being delivered counts
    assert time.monotonic() - started >= 0.15
    blocker.release.set()
    assert bus.wait_until_empty(WAIT) is True


def test_wait_until_empty_from_a_listener_does_not_deadlock(bus):
    results: list[bool] = []

    class Waiter:
        def onBatchSubmitted(self, e):
            results.append(bus.wait_until_empty(WAIT))

    bus.add(Waiter())
    started = time.monotonic()
    bus.post("onBatchSubmitted", 0)
    assert bus.wait_until_empty(WAIT)
    assert results == [False]
    assert time.monotonic() - started < WAIT / 2


def test_listener_may_post(bus):
    rec = Recorder()

    class Reposter:
        def onBatchSubmitted(self, e):
            if e < 3:
                bus.post("onBatchSubmitted", e + 1)

    bus.add(Reposter())
    bus.add(rec)
    bus.post("onBatchSubmitted", 0)
    deadline = time.monotonic() + WAIT
    while len(rec.events) < 4 and time.monotonic() < deadline:
        bus.wait_until_empty(WAIT)
    assert [e for _, e in rec.events] == [0, 1, 2, 3]


def test_stop_drains_the_queue_and_then_post_is_a_no_op(caplog):
    b = ListenerBus()
    blocker, rec = Blocker(), Recorder()
    b.add(blocker)
    b.add(rec)
    b.post("onBatchSubmitted", 0)
    assert blocker.entered.wait(WAIT)
    for i in range(1, 50):
        b.post("onBatchSubmitted", i)
    threading.Timer(0.1, blocker.release.set).start()
    b.stop(timeout_s=WAIT)
    assert [e for _, e in rec.events] == list(range(50))
    assert not b._thread.is_alive()
    with caplog.at_level(logging.DEBUG, logger="dstreams.listener_bus"):
        b.post("onBatchSubmitted", 99)  # dropped silently
    assert [e for _, e in rec.events] == list(range(50))
    assert b.dropped == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert b.wait_until_empty(0.0)
    b.stop(timeout_s=WAIT)  # idempotent
    with pytest.raises(RuntimeError):
        b.start()


def test_stop_is_bounded_by_its_timeout(caplog):
    b = ListenerBus()
    blocker, rec = Blocker(), Recorder()
    b.add(blocker)
    b.add(rec)
    try:
        b.post("onBatchSubmitted", 0)
        assert blocker.entered.wait(WAIT)
        for i in range(1, 5):
            b.post("onBatchSubmitted", i)
        with caplog.at_level(logging.WARNING, logger="dstreams.listener_bus"):
            started = time.monotonic()
            b.stop(timeout_s=0.2)
            assert time.monotonic() - started < WAIT / 2
        assert any("4 queued events were not delivered" in r.getMessage() for r in caplog.records)
        assert b.wait_until_empty(0.0) is False  # event 0 is still being delivered
    finally:
        blocker.release.set()
    b._thread.join(WAIT)
    assert not b._thread.is_alive()
    assert [e for _, e in rec.events] == [0]  # the discarded events are never delivered
    assert b.wait_until_empty(WAIT)


def test_stop_without_any_post_and_capacity_validation():
    b = ListenerBus(capacity=5)
    assert b.capacity == 5
    b.stop(timeout_s=0.1)
    assert b._thread is None
    with pytest.raises(ValueError):
        ListenerBus(capacity=0)


# ---------------------------------------------------------------------- event snapshots
def _info() -> BatchInfo:
    info = BatchInfo(1000, 1005, num_records=7, records_per_input={0: 7}, job_group="g")
    info.output_operations[0] = OutputOperationInfo(1000, 0, "foreachRDD", "desc")
    return info


def _records(info: BatchInfo) -> dict[int, int]:
    return {k: v.numRecords() for k, v in info.streamIdToInputInfo().items()}


def test_submitted_event_is_a_snapshot_delivered_with_the_old_values(bus):
    blocker, rec = Blocker(), Recorder()
    bus.add(blocker)
    bus.add(rec)
    info = _info()
    bus.post("onBatchSubmitted", StreamingListenerBatchSubmitted(info))
    assert blocker.entered.wait(WAIT)  # delivery is under way, the engine moves on:
    info.processing_start_time_ms = 1010
    info.processing_end_time_ms = 1050
    info.num_records = 99
    info.records_per_input[1] = 92
    info.output_operations[0].start_time_ms = 1011
    info.output_operations[0].failure_reason = "boom"
    info.output_operations[1] = OutputOperationInfo(1000, 1, "other", "")
    bus.post("onBatchCompleted", StreamingListenerBatchCompleted(info))
    blocker.release.set()
    assert bus.wait_until_empty(WAIT)
    (k1, submitted), (k2, completed) = rec.events
    assert (k1, k2) == ("submitted", "completed")

    old = submitted.batchInfo()
    assert old is not info
    assert old.processingStartTime().isDefined() is False
    assert old.processingEndTime().isEmpty() and old.processing_end_time_ms is None
    assert old.processingDelay().getOrElse(-1) == -1 and old.totalDelay().getOrElse(-1) == -1
    assert old.schedulingDelay().getOrElse(-1) == -1
    assert old.numRecords() == 7 and _records(old) == {0: 7}
    assert list(old.outputOperationInfos()) == [0]
    op = old.outputOperationInfos()[0]
    assert op.startTime().isEmpty() and op.failureReason() is None and not old.failed

    new = completed.batchInfo()
    assert new.processingDelay().get() == 40 and new.totalDelay().get() == 45
    assert new.schedulingDelay().get() == 5 and new.numRecords() == 99
    assert _records(new) == {0: 7, 1: 92}
    assert sorted(new.outputOperationInfos()) == [0, 1] and new.failed


def test_every_event_accessor_works_on_snapshots():
    info = _info()
    info.processing_start_time_ms = 1010
    info.processing_end_time_ms = 1030
    info.generation_ms = 1.5
    for cls in (StreamingListenerBatchSubmitted, StreamingListenerBatchStarted, StreamingListenerBatchCompleted):
        e = cls(info)
        b = e.batchInfo()
        assert b == info and b is not info
        assert b.output_operations[0] is not info.output_operations[0]
        assert b.records_per_input is not info.records_per_input
        assert b.batchTime().milliseconds() == 1000 and b.batch_time.ms == 1000
        assert b.submissionTime() == 1005
        assert b.processingStartTime().get() == 1010 and b.processingEndTime().get() == 1030
        assert b.schedulingDelay().get() == 5 and b.processingDelay().get() == 20
        assert b.totalDelay().get() == 25 and b.total_delay_ms == 25
        assert b.numRecords() == 7 and _records(b) == {0: 7}
        assert b.job_group == "g" and b.generation_ms == 1.5
        assert type(e).__name__ in repr(e)

    op = OutputOperationInfo(1000, 3, "saveAsTextFiles", "d", start_time_ms=1010)
    for cls in (StreamingListenerOutputOperationStarted, StreamingListenerOutputOperationCompleted):
        e = cls(op)
        o = e.outputOperationInfo()
        assert o == op and o is not op
        assert o.batchTime().milliseconds() == 1000 and o.id() == 3 and o.name() == "saveAsTextFiles"
        assert o.startTime().get() == 1010 and o.endTime().isEmpty() and o.duration().isEmpty()
        assert o.duration_ms is None and o.failureReason() is None
    op.end_time_ms = 1015
    done = StreamingListenerOutputOperationCompleted(op)
    op.end_time_ms = 2000
    assert done.outputOperationInfo().duration().get() == 5 and done.outputOperationInfo().duration_ms == 5

    assert StreamingListenerStreamingStarted(123).time() == 123


def test_snapshot_methods_copy_nested_values():
    info = _info()
    snap = info.snapshot()
    assert snap == info
    snap.output_operations[0].end_time_ms = 5
    snap.output_operations[9] = OutputOperationInfo(1000, 9, "x", "")
    snap.records_per_input[3] = 1
    assert info.output_operations[0].end_time_ms is None and list(info.output_operations) == [0]
    assert info.records_per_input == {0: 7}
    op = info.output_operations[0]
    op_snap = op.snapshot()
    op.failure_reason = "late"
    assert op_snap.failure_reason is None
