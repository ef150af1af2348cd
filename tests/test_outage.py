"""Store outages met while a batch is built or run are waited out (recovery/outage.py, JobScheduler._ride_out)."""

from __future__ import annotations

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.metadata import MetadataLog
from dstreams.recovery.outage import StoreOutagePolicy, is_store_outage
from dstreams.recovery.store import open_store
from dstreams.recovery.store.errors import StoreUnavailableError, TransientStoreError


class _FlakyStore:
    """Raises StoreUnavailableError on the first ``failures`` calls (as an exhausted store retry would)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise StoreUnavailableError("the store kept failing for 30 s (test)")


def test_what_counts_as_an_outage():
    assert is_store_outage(StoreUnavailableError("x"))
    assert is_store_outage(TransientStoreError("x"))
    try:
        try:
            raise StoreUnavailableError("inner")
        except StoreUnavailableError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as wrapped:
        assert is_store_outage(wrapped)
    assert not is_store_outage(ValueError("a bug"))
    assert not is_store_outage(FileNotFoundError("a missing key is not an outage"))
    policy = StoreOutagePolicy(outage_seconds=5)
    assert policy.retry_delay(ValueError("x"), 0, "x") is None
    assert 1.0 <= policy.retry_delay(StoreUnavailableError("x"), 0, "x") <= 5.0
    assert policy.retry_delay(StoreUnavailableError("x"), 5.0, "x") is None


def test_an_output_that_meets_an_outage_is_run_again_and_the_batch_completes(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "60")
    flaky = _FlakyStore(failures=2)
    seen: list[int] = []
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(str(tmp_path / "cp"))

    def save(rdd):
        flaky()
        seen.append(rdd.count())

    ssc.generatorStream(3, 1).foreachRDD(save)
    ssc.start()
    try:
        clock.set_time(1000)
        info = ssc.awaitBatch(1000, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    assert flaky.calls == 3 and seen == [3]
    assert ssc._scheduler.error is None
    assert all(op.failure_reason is None for op in info.output_operations.values())


def test_building_a_batch_rides_out_an_outage(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "60")
    flaky = _FlakyStore(failures=1)
    out: list[int] = []
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(str(tmp_path / "cp"))

    def listing(rdd):  # stands for a source listing an s3:// prefix while the batch is built
        flaky()
        return rdd

    ssc.generatorStream(2, 1).transform(listing).foreachRDD(lambda rdd: out.append(rdd.count()))
    ssc.start()
    try:
        clock.set_time(1000)
        ssc.awaitBatch(1000, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    assert flaky.calls == 2 and out == [2]


@pytest.mark.slow
def test_past_the_bound_the_driver_stops_and_the_batch_is_not_recorded_as_done(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "1")
    flaky = _FlakyStore(failures=10_000)
    clock = ManualClock()
    cp = str(tmp_path / "cp")
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(cp)
    ok: list[int] = []

    def save(rdd):
        if ok:  # batch 1 succeeds, batch 2 meets an outage that outlasts the bound
            flaky()
        ok.append(rdd.count())

    ssc.generatorStream(1, 1).foreachRDD(save)
    ssc.start()
    try:
        clock.set_time(1000)
        ssc.awaitBatch(1000, 60)
        clock.set_time(2000)
        with pytest.raises(StoreUnavailableError):
            ssc.awaitTermination(60)
    finally:
        ssc.stop(stopSparkContext=False)
    head = MetadataLog.read(open_store(cp))
    assert head["completed_through"] == 1000  # batch 2 will run again after a restart
