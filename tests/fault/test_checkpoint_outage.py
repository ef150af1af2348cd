"""Data checkpoint writes ride out a store outage (recovery/checkpointer.py with recovery/outage.py).

A write that meets an outage shorter than the bound is retried and committed; past the bound it is
given up (recorded in ``errors``) while the stream goes on; ``close()`` ends a wait for the store at once.
"""

from __future__ import annotations

import operator
import os
import threading
import time as _time
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.checkpoint_data import CheckpointData
from dstreams.events import CheckpointCommitted, Event
from dstreams.recovery.checkpointer import StoreCheckpointer, list_checkpoints, load_manifest
from dstreams.recovery.outage import StoreOutagePolicy
from dstreams.recovery.store import open_store
from dstreams.recovery.store.errors import StoreUnavailableError
from dstreams.recovery.store.faulty import FaultyStore
from dstreams.recovery.storespec import StoreSpec
from dstreams.time import BatchTime, from_user_time

from ..support import state_node

ENDLESS = 10**9  # faults to inject for an outage that does not end by itself


@dataclass
class _Node:
    """The part of a stateful node the checkpointer uses."""

    key: str = "state-0"
    name: str = "runningReduce"
    remember_duration: Any = None

    @property
    def checkpoint_data(self) -> CheckpointData:
        """The default's: the RDD's records, not hash-partitioned."""
        return CheckpointData(self)


class _Events:
    """The scheduler's event loop as the checkpointer sees it: records what is posted."""

    def __init__(self) -> None:
        self.posted: list[Event] = []

    def post(self, event: Event) -> None:
        self.posted.append(event)

    def wait_idle(self, timeout_s: float) -> bool:
        return True


class _TestPolicy(StoreOutagePolicy):
    """The store outage policy with a chosen wait between attempts; ``waiting`` is set at the first wait."""

    def __init__(self, outage_seconds: float, delay_s: float) -> None:
        super().__init__(outage_seconds)
        self.delay_s = delay_s
        self.waiting = threading.Event()

    def retry_delay(self, error: BaseException, waited_s: float, what: str) -> float | None:
        if super().retry_delay(error, waited_s, what) is None:
            return None
        self.waiting.set()
        return self.delay_s


def _checkpointer(sc, url: str, policy: StoreOutagePolicy) -> tuple[StoreCheckpointer, _Events]:
    events = _Events()
    return StoreCheckpointer(sc, StoreSpec(url), events, outage=policy), events


def _committed(events: _Events) -> list[int]:
    return [e.time.ms for e in events.posted if isinstance(e, CheckpointCommitted)]


def test_a_checkpoint_write_that_meets_a_short_outage_is_retried_and_committed(sc, tmp_path, caplog):
    url = str(tmp_path / "cp")
    ckpt, events = _checkpointer(sc, url, _TestPolicy(outage_seconds=60, delay_s=0.05))
    faulty = FaultyStore(ckpt.store, fail_times=2, error=StoreUnavailableError, ops={"put"})
    ckpt.store = faulty  # the manifest write meets the outage twice
    node = _Node()
    try:
        ckpt.mark(node, BatchTime(1000), sc.parallelize([("a", 1), ("b", 2), ("c", 3)], 2))
        with caplog.at_level("WARNING", logger="dstreams.recovery"):
            ckpt.batch_completed(BatchTime(1000))
            ckpt.flush(60)
    finally:
        ckpt.close()
    assert faulty.failures["put"] == 2 and faulty.remaining == 0
    assert ckpt.errors == []
    manifest = load_manifest(open_store(url), node.key, 1000)
    assert manifest["num_partitions"] == 2 and sum(p["records"] for p in manifest["parts"]) == 3
    assert _committed(events) == [1000]
    messages = [r.getMessage() for r in caplog.records]
    assert any("waits and retries" in m and "spark.dstreams.store.outageSeconds" in m for m in messages), messages
    assert any("checkpoint store is back after" in m for m in messages), messages


def test_a_checkpoint_whose_tasks_fail_on_the_outage_is_retried(sc, tmp_path):
    """The outage met inside an executor reaches the driver as a Spark task failure naming the error."""
    url = str(tmp_path / "cp")
    down = tmp_path / "store-down"
    down.write_text("")
    flag = str(down)
    policy = _TestPolicy(outage_seconds=60, delay_s=0.05)
    ckpt, events = _checkpointer(sc, url, policy)

    def part(i: int, it):
        if i == 0 and os.path.exists(flag):  # the first attempt of partition 0 meets the outage
            os.remove(flag)
            raise StoreUnavailableError("injected: the store kept failing (test)")
        return it

    node = _Node()
    try:
        ckpt.mark(node, BatchTime(2000), sc.parallelize(range(6), 2).mapPartitionsWithIndex(part))
        ckpt.batch_completed(BatchTime(2000))
        ckpt.flush(120)
    finally:
        ckpt.close()
    assert not down.exists() and policy.waiting.is_set()  # the outage was met, and waited out by the checkpointer
    assert ckpt.errors == []
    assert sum(p["records"] for p in load_manifest(open_store(url), node.key, 2000)["parts"]) == 6
    assert _committed(events) == [2000]


def test_other_errors_are_recorded_at_once_and_the_next_checkpoint_is_tried(sc, tmp_path):
    url = str(tmp_path / "cp")
    policy = _TestPolicy(outage_seconds=60, delay_s=0.05)
    ckpt, events = _checkpointer(sc, url, policy)
    ckpt.store = FaultyStore(ckpt.store, fail_times=1, error=PermissionError("denied (test)"), ops={"put"})
    node = _Node()
    try:
        ckpt.mark(node, BatchTime(1000), sc.parallelize([1, 2], 2))
        ckpt.mark(node, BatchTime(2000), sc.parallelize([1, 2, 3], 2))
        ckpt.batch_completed(BatchTime(2000))
        ckpt.flush(60)
    finally:
        ckpt.close()
    assert [e.error_type for e in ckpt.errors] == ["PermissionError"] and ckpt.error_count == 1
    assert not policy.waiting.is_set()  # not retried
    assert list_checkpoints(open_store(url), node.key) == [2000]
    assert _committed(events) == [2000]


@pytest.mark.slow
def test_past_the_bound_a_checkpoint_write_gives_up_and_the_stream_goes_on(sc, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "1")
    url = str(tmp_path / "cp")
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(url)
    counts = ssc.queueStream([[("k", 1)] for _ in range(6)]).runningReduce(operator.add).checkpoint("1s")
    seen: dict[int, list] = {}
    counts.foreachRDD(lambda time, rdd: seen.__setitem__(from_user_time(time).ms, sorted(rdd.collect())))
    ssc.start()
    try:
        ckpt, scheduler = ssc._checkpointer, ssc._scheduler
        # One outage policy for the whole driver: the checkpointer waits as long as the journal and scheduler.
        assert ckpt.outage is scheduler.outage is scheduler.journal.outage
        assert ckpt.outage.outage_seconds == 1.0
        clock.set_time(1000)
        ssc.awaitBatch(1000, 120)
        ckpt.flush(60)
        faulty = FaultyStore(ckpt.store, fail_times=ENDLESS, error=StoreUnavailableError, ops={"put"})
        ckpt.store = faulty  # the store goes down for longer than the bound
        with caplog.at_level("WARNING", logger="dstreams.recovery"):
            clock.set_time(2000)
            ssc.awaitBatch(2000, 120)
            ckpt.flush(60)  # the write of checkpoint 2000 is retried until the bound, then given up
        assert faulty.failures["put"] >= 2  # retried, then given up
        assert len(ckpt.errors) == 1 and ckpt.errors[0].outage
        assert any("past the outage bound" in r.getMessage() and "the stream goes on" in r.getMessage()
                   for r in caplog.records)
        ckpt.store = faulty.inner  # the store is back
        for t in range(3000, 7000, 1000):
            clock.set_time(t)
            ssc.awaitBatch(t, 120)
            ckpt.flush(60)
    finally:
        ssc.stop(stopSparkContext=False)
    assert scheduler.error is None, scheduler.error
    assert len(ckpt.errors) == 1
    assert seen[6000] == [("k", 6)]
    times = list_checkpoints(open_store(url), state_node(counts).key)
    assert times[0] == 6000 and 2000 not in times, times


@pytest.mark.parametrize("wait", [False, True], ids=["hard-stop", "graceful"])
def test_close_during_a_retry_returns_promptly(sc, tmp_path, wait):
    url = str(tmp_path / "cp")
    policy = _TestPolicy(outage_seconds=600, delay_s=30)  # without close() the write would wait 30 s
    ckpt, events = _checkpointer(sc, url, policy)
    ckpt.store = FaultyStore(ckpt.store, fail_times=ENDLESS, error=StoreUnavailableError, ops={"put"})
    node = _Node()
    try:
        ckpt.mark(node, BatchTime(1000), sc.parallelize([1, 2], 2))
        ckpt.batch_completed(BatchTime(1000))
        assert policy.waiting.wait(60), "the write did not meet the outage"
        ckpt.mark(node, BatchTime(2000), sc.parallelize([1, 2, 3], 2))
        ckpt.batch_completed(BatchTime(2000))  # queued behind the waiting write
        started = _time.monotonic()
        ckpt.close(wait=wait)
        # A hard stop drops the queued write (cancelled, never run); every other one ends now.
        _, not_done = wait_futures([f for f in ckpt._started() if not f.cancelled()], timeout=20)
        elapsed = _time.monotonic() - started
    finally:
        ckpt.close(wait=False)
    assert elapsed < 10 and not not_done, f"the writer still ran {elapsed:.1f} s after close()"
    assert ckpt.errors and all(e.outage for e in ckpt.errors)
    assert len(ckpt.errors) == (2 if wait else 1)  # graceful: the queued write is tried once, not waited for
    assert list_checkpoints(open_store(url), node.key) == []
    assert _committed(events) == []


@pytest.mark.slow
def test_failed_writes_are_kept_as_a_bounded_summary_without_frames(sc, tmp_path):
    """Many failed writes: ``errors`` keeps the newest few as text summaries (no exception, traceback or RDD kept
    alive) and ``error_count`` counts them all."""
    import gc
    import types
    import weakref

    from dstreams.recovery.checkpointer import RECENT_ERRORS, CheckpointError

    ckpt, _ = _checkpointer(sc, str(tmp_path / "cp"), _TestPolicy(outage_seconds=60, delay_s=0.05))
    # A new exception each time (one instance raised again would gather every traceback itself).
    ckpt.store = FaultyStore(ckpt.store, fail_times=ENDLESS, error=PermissionError, ops={"put"})
    node = _Node()
    failures = RECENT_ERRORS * 3
    rdds = []
    try:
        for i in range(failures):
            rdd = sc.parallelize([i], 1)
            rdds.append(weakref.ref(rdd))
            ckpt._write(node, (i + 1) * 1000, rdd)
            del rdd
    finally:
        ckpt.close()
    assert ckpt.error_count == failures
    assert len(ckpt.errors) == RECENT_ERRORS
    newest = ckpt.errors[-1]
    assert isinstance(newest, CheckpointError)
    assert (newest.node_key, newest.time_ms, newest.error_type, newest.outage) == (
        node.key, failures * 1000, "PermissionError", False)
    assert "injected fault: put" in newest.message and str(newest).startswith("PermissionError: ")
    assert [e.time_ms for e in ckpt.errors] == [t * 1000 for t in range(failures - RECENT_ERRORS + 1, failures + 1)]
    for error in ckpt.errors:
        assert not isinstance(error, BaseException)
        assert not [r for r in gc.get_referents(error) if isinstance(r, (types.TracebackType, types.FrameType,
                                                                         BaseException))]
    gc.collect()
    assert [r for r in rdds if r() is not None] == []  # no failed write keeps its RDD alive
