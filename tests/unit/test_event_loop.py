"""The event loop (dstreams.events) and the rule that only its thread changes graph state."""

from __future__ import annotations

import operator
import threading

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.events import BatchCompleted, EventLoop
from dstreams.node import DStreamNode
from dstreams.time import BatchTime


def test_events_are_handled_in_order_on_one_thread():
    seen: list[tuple[int, str]] = []
    loop = EventLoop("test-loop")
    loop.start(lambda e: seen.append((e.time.ms, threading.current_thread().name)))
    try:
        for t in range(50):
            loop.post(BatchCompleted(BatchTime(t)))
        assert loop.wait_idle(10)
        assert [t for t, _ in seen] == list(range(50))
        assert {name for _, name in seen} == {"test-loop"}
    finally:
        loop.stop(5)


def test_call_runs_on_the_loop_and_returns_or_raises():
    loop = EventLoop("test-loop")
    loop.start(lambda e: None)
    try:
        assert loop.call(lambda: threading.current_thread().name, 10) == "test-loop"
        with pytest.raises(ZeroDivisionError):
            loop.call(lambda: 1 / 0, 10)
        # A call made from the loop itself runs at once (no deadlock).
        assert loop.call(lambda: loop.call(lambda: 42, 10), 10) == 42
    finally:
        loop.stop(5)


def test_a_failing_handler_does_not_stop_the_loop(caplog):
    handled: list[int] = []

    def handler(e: BatchCompleted) -> None:
        if e.time.ms == 1:
            raise RuntimeError("boom")
        handled.append(e.time.ms)

    loop = EventLoop("test-loop")
    loop.start(handler)
    try:
        for t in range(3):
            loop.post(BatchCompleted(BatchTime(t)))
        assert loop.wait_idle(10)
        assert handled == [0, 2]
        assert "boom" in caplog.text
    finally:
        loop.stop(5)


def test_a_failing_handler_is_reported_to_on_error():
    reported: list[BaseException] = []
    loop = EventLoop("test-loop")
    loop.start(lambda e: 1 // e.time.ms, reported.append)
    try:
        for t in (1, 0, 2):
            loop.post(BatchCompleted(BatchTime(t)))
        assert loop.wait_idle(10)
        assert [type(e) for e in reported] == [ZeroDivisionError]
    finally:
        loop.stop(5)


def test_an_error_in_the_schedulers_event_handling_stops_the_context(sc, monkeypatch):
    """Spark's EventLoop.onError: a handler error is reported (awaitTermination raises it), never swallowed."""
    from dstreams.scheduler.generator import JobGenerator

    original = JobGenerator.batch_completed

    def broken(self, time):  # noqa: ANN001, ANN202
        if time.ms == self.start_time.ms + 1000:
            raise RuntimeError("bookkeeping bug")
        return original(self, time)

    monkeypatch.setattr(JobGenerator, "batch_completed", broken)
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.queueStream([[1], [2], [3]], default=[]).foreachRDD(lambda rdd: rdd.count())
    ssc.start()
    try:
        clock.advance(2000)
        with pytest.raises(RuntimeError, match="bookkeeping bug"):
            ssc.awaitTermination(60)
        assert ssc.getState() == "STOPPED"
    finally:
        ssc.stop(stopSparkContext=False)


def test_wait_idle_times_out_while_an_event_is_in_progress():
    release = threading.Event()
    loop = EventLoop("test-loop")
    loop.start(lambda e: release.wait(10))
    try:
        loop.post(BatchCompleted(BatchTime(0)))
        assert loop.wait_idle(0.2) is False
        release.set()
        assert loop.wait_idle(10) is True
    finally:
        release.set()
        loop.stop(5)


def test_after_stop_posts_are_dropped_and_calls_fail():
    loop = EventLoop("test-loop")
    loop.start(lambda e: None)
    loop.stop(5)
    loop.post(BatchCompleted(BatchTime(0)))  # no error, dropped
    assert not loop.running
    assert loop.call(lambda: 7) == 7  # not running: runs on the caller's thread


@pytest.mark.slow
def test_graph_state_changes_only_on_the_event_loop(sc, tmp_path, monkeypatch):
    """compute, clear_metadata and checkpoint adoption of every node run on the generator loop's thread,
    never on a runner, the checkpoint writer or the caller's thread."""
    threads: dict[str, set[str]] = {"compute": set(), "clear_metadata": set(), "adopt_checkpoint": set()}
    lock = threading.Lock()

    def spy(name: str):
        original = getattr(DStreamNode, name)

        def wrapper(self, *args, **kwargs):
            with lock:
                threads[name].add(threading.current_thread().name)
            return original(self, *args, **kwargs)

        return wrapper

    for name in ("clear_metadata", "adopt_checkpoint"):
        monkeypatch.setattr(DStreamNode, name, spy(name))
    original_get = DStreamNode.get_or_compute

    def get_or_compute(self, time):
        with lock:
            threads["compute"].add(threading.current_thread().name)
        return original_get(self, time)

    monkeypatch.setattr(DStreamNode, "get_or_compute", get_or_compute)
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(str(tmp_path / "cp"))
    out: list[list[tuple[str, int]]] = []
    words = ssc.queueStream([[("a", 1)], [("b", 2)], [("a", 3)]] * 4, default=[])
    counts = words.runningReduce(operator.add)
    counts.checkpoint(2)
    counts.foreachRDD(lambda rdd: out.append(sorted(rdd.collect())))
    ssc.start()
    try:
        for t in range(1, 9):
            clock.advance(1000)
            ssc.awaitBatch(t * 1000, 60)
        ssc._checkpointer.flush(60)
        assert ssc._checkpointer.errors == []
        assert len(out) == 8
        # slice from the user's thread runs on the loop too.
        assert len(counts.slice(ssc.startTime.ms / 1000.0, clock.time_ms() / 1000.0)) >= 1
    finally:
        ssc.stop(stopSparkContext=False)
    assert threads["adopt_checkpoint"], "no checkpoint was adopted: the test did not exercise adoption"
    assert threads["clear_metadata"], "nothing was cleared"
    for name, names in threads.items():
        assert names == {"dstreams-generator"}, f"{name} ran on {sorted(names)}"
