"""Store outages met while a batch is built or run are waited out (recovery/outage.py, JobScheduler._ride_out);
the journal's commits wait through the same policy (recovery.outage.ride_out)."""

from __future__ import annotations

import logging
import threading
import time as _time

import pytest

from dstreams.recovery.journal import Journal
from dstreams.recovery.metadata import FencedError, MetadataLog
from dstreams.recovery.outage import StoreOutagePolicy, is_store_outage, ride_out
from dstreams.recovery.store import open_store
from dstreams.recovery.store.errors import StoreUnavailableError, TransientStoreError
from dstreams.recovery.store.faulty import FaultyStore
from dstreams.testing import manual_context, run_batches
from dstreams.time import BatchTime


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


@pytest.mark.slow
def test_an_output_that_meets_an_outage_is_run_again_and_the_batch_completes(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "60")
    flaky = _FlakyStore(failures=2)
    seen: list[int] = []

    def save(rdd):
        flaky()
        seen.append(rdd.count())

    with manual_context(1, sc=sc, checkpoint=str(tmp_path / "cp")) as ssc:
        ssc.generatorStream(3, 1).foreachRDD(save)
        ssc.start()
        [info] = run_batches(ssc, 1)
    assert flaky.calls == 3 and seen == [3]
    assert ssc._scheduler.error is None
    assert all(op.failure_reason is None for op in info.output_operations.values())


def test_building_a_batch_rides_out_an_outage(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "60")
    flaky = _FlakyStore(failures=1)
    out: list[int] = []

    def listing(rdd):  # stands for a source listing an s3:// prefix while the batch is built
        flaky()
        return rdd

    with manual_context(1, sc=sc, checkpoint=str(tmp_path / "cp")) as ssc:
        ssc.generatorStream(2, 1).transform(listing).foreachRDD(lambda rdd: out.append(rdd.count()))
        ssc.start()
        run_batches(ssc, 1)
    assert flaky.calls == 2 and out == [2]


@pytest.mark.slow
def test_past_the_bound_the_driver_stops_and_the_batch_is_not_recorded_as_done(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "1")
    flaky = _FlakyStore(failures=10_000)
    cp = str(tmp_path / "cp")
    ok: list[int] = []

    def save(rdd):
        if ok:  # batch 1 succeeds, batch 2 meets an outage that outlasts the bound
            flaky()
        ok.append(rdd.count())

    with manual_context(1, sc=sc, checkpoint=cp) as ssc:
        ssc.generatorStream(1, 1).foreachRDD(save)
        ssc.start()
        run_batches(ssc, 1)
        ssc.clock.set_time(2000)
        with pytest.raises(StoreUnavailableError):
            ssc.awaitTermination(60)
    head = MetadataLog.read(open_store(cp))
    assert head["completed_through"] == 1000  # batch 2 will run again after a restart


# ----------------------------------------------------------------- ride_out (the journal's and checkpointer's loop)


class _QuickPolicy(StoreOutagePolicy):
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


def test_ride_out_retries_an_outage_until_the_store_is_back(caplog):
    flaky = _FlakyStore(failures=2)
    with caplog.at_level(logging.WARNING, logger="dstreams.recovery.outage"):
        assert ride_out(_QuickPolicy(60, 0.01), "writing x", lambda: flaky() or "done", threading.Event()) == "done"
    assert flaky.calls == 3
    waits = [r.getMessage() for r in caplog.records if "waits and retries" in r.getMessage()]
    assert len(waits) == 2
    assert all("writing x" in m and "gives up after 60 s" in m and "spark.dstreams.store.outageSeconds" in m
               and "DSTREAMS_STORE_OUTAGE_SECONDS" in m for m in waits), waits
    assert any(r.getMessage().startswith("checkpoint store is back after") for r in caplog.records)


def test_ride_out_does_not_retry_other_errors():
    calls: list[int] = []

    def fenced() -> None:
        calls.append(1)
        raise FencedError("another driver took over (test)")

    with pytest.raises(FencedError):
        ride_out(_QuickPolicy(60, 0.01), "x", fenced, threading.Event())
    assert calls == [1]


def test_ride_out_gives_up_past_the_bound_with_the_last_error(caplog):
    flaky = _FlakyStore(failures=10_000)
    started = _time.monotonic()
    with caplog.at_level(logging.ERROR, logger="dstreams.recovery.outage"):
        with pytest.raises(StoreUnavailableError):
            ride_out(_QuickPolicy(0.3, 0.02), "writing y", flaky, threading.Event())
    assert 0.3 <= _time.monotonic() - started < 10 and flaky.calls >= 2
    assert any("writing y gives up" in r.getMessage() for r in caplog.records)


def test_ride_out_stops_waiting_at_once_when_told_to():
    policy = _QuickPolicy(600, 30)  # without the stop it would wait 30 s
    stop = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            ride_out(policy, "z", _FlakyStore(failures=10_000), stop)
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert policy.waiting.wait(30)
    started = _time.monotonic()
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and _time.monotonic() - started < 5
    assert len(raised) == 1 and isinstance(raised[0], StoreUnavailableError)


# ----------------------------------------------------------------- the journal's commits


class _NoStatefulGraph:
    """The part of the graph ``Journal.batch_completed`` reads, for a graph without state."""

    batch_duration = None

    def stateful_nodes(self) -> list:
        return []

    def max_input_remember(self) -> None:
        return None


def _journal(tmp_path, policy: StoreOutagePolicy, fail_times: int) -> tuple[Journal, FaultyStore]:
    metadata = MetadataLog(open_store(str(tmp_path / "cp")), "outage-test", ["graph"], 1000)
    metadata.take_over(zero_ms=0)
    faulty = FaultyStore(metadata.store, fail_times=fail_times, error=StoreUnavailableError, ops={"put_if_match"})
    metadata.store = faulty  # the head's conditional writes meet the outage
    return Journal(metadata, _NoStatefulGraph(), outage=policy), faulty


def test_a_journal_commit_waits_for_the_store_and_is_recorded(tmp_path, caplog):
    journal, faulty = _journal(tmp_path, _QuickPolicy(60, 0.01), fail_times=3)
    with caplog.at_level(logging.WARNING, logger="dstreams.recovery"):
        journal.batch_completed(BatchTime(1000))
    assert faulty.failures["put_if_match"] == 3
    assert MetadataLog.read(open_store(str(tmp_path / "cp")))["completed_through"] == 1000
    assert any("recording the completion of batch 1000 waits and retries" in r.getMessage() for r in caplog.records)
    assert any("checkpoint store is back after" in r.getMessage() for r in caplog.records)


def test_the_journal_bound_is_its_policy_bound(tmp_path):
    policy = StoreOutagePolicy(outage_seconds=42)
    journal, _ = _journal(tmp_path, policy, fail_times=0)
    assert journal.outage is policy and journal.outage_seconds == 42


def test_closing_the_journal_makes_a_waiting_commit_raise_at_once(tmp_path):
    policy = _QuickPolicy(600, 30)
    journal, _ = _journal(tmp_path, policy, fail_times=10_000)
    raised: list[BaseException] = []

    def complete() -> None:
        try:
            journal.batch_completed(BatchTime(1000))
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=complete, daemon=True)
    thread.start()
    assert policy.waiting.wait(30)
    started = _time.monotonic()
    journal.close()
    thread.join(10)
    assert not thread.is_alive() and _time.monotonic() - started < 5
    assert len(raised) == 1 and isinstance(raised[0], StoreUnavailableError)
    assert MetadataLog.read(open_store(str(tmp_path / "cp")))["completed_through"] is None
