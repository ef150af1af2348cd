"""Rate control: the PID estimator, the rate limiter, the input contract's limit and hook, the file
sources' maxFilesPerBatch (also across a restart), the socket's receiver.maxRate and backpressure."""

from __future__ import annotations

import os
import time

import pytest

from dstreams import DStream, ManualClock, StreamingContext, config
from dstreams.graph import DStreamGraph
from dstreams.listener import BatchInfo
from dstreams.nodes.input import InputNode
from dstreams.rate import PIDGains, PIDRateEstimator, RateLimiter, RateSettings, rate_settings
from dstreams.testing import collect, manual_context, run_batches
from dstreams.time import BatchTime, Duration

from ..recovery_app import read_outputs

RATE_VARIABLES = [s.env for s in config.SETTINGS if "backpressure" in s.key or "maxRate" in s.key
                  or "maxFiles" in s.key]


@pytest.fixture(autouse=True)
def _no_rate_settings_from_the_environment(monkeypatch):
    for name in RATE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _drive(estimator: RateLimiter, capacity: float, batches: int, interval_ms: int = 1000) -> list[tuple[int, int]]:
    """Simulate a source with an endless backlog whose batches are processed at ``capacity`` records/s,
    one at a time: each batch takes the limiter's limit (one partition) and is fed back once it completes.
    Returns ``(records, scheduling delay ms)`` per batch."""
    pending: list[tuple[int, int, int, int]] = []  # (end, records, processing, scheduling) not yet fed back
    busy_until, out = 0, []
    for k in range(1, batches + 1):
        generated = k * interval_ms
        for done in [p for p in pending if p[0] <= generated]:
            estimator.batch_completed(*done)
            pending.remove(done)
        n = estimator.max_records_per_partition(1)
        assert n is not None
        processing = round(n / capacity * 1000)
        start = max(generated, busy_until)
        busy_until = start + processing
        pending.append((busy_until, n, processing, start - generated))
        out.append((n, start - generated))
    return out


# ---------------------------------------------------------------------- the estimator
def test_no_estimate_before_the_first_batch_nor_from_empty_or_unmeasured_batches():
    e = PIDRateEstimator(1000)
    assert e.estimate is None
    assert e.update(1000, 0, 500, 0) is None  # empty: does not even calibrate
    assert e.update(1100, 100, 0, 0) is None  # no processing delay measured
    assert e.update(1200, 1000, 500, 0) is None  # the first usable batch calibrates only
    assert e.estimate is None
    assert e.update(2200, 0, 400, 0) is None  # empty again
    rate = e.update(2300, 1000, 500, 0)
    assert rate == pytest.approx(2000.0) and e.estimate == rate  # processed at 2000 records/s, no backlog
    assert e.update(2300, 1000, 900, 0) is None  # not after the last batch used
    assert e.update(2000, 1000, 900, 0) is None
    assert e.estimate == rate


def test_the_control_law_with_spark_default_gains():
    e = PIDRateEstimator(1000)  # proportional 1.0, integral 0.2, derivative 0.0
    e.update(1000, 3000, 1500, 0)  # calibrates at 2000 records/s
    # processed at 1000 records/s (error 1000) behind a 2 s scheduling delay (2000 records/s of backlog)
    assert e.update(3000, 1000, 1000, 2000) == pytest.approx(2000 - 1.0 * 1000 - 0.2 * 2000)
    assert e.gains == PIDGains(1.0, 0.2, 0.0, 100.0)


def test_the_derivative_gain_weighs_how_fast_the_error_changes():
    e = PIDRateEstimator(1000, PIDGains(proportional=0.0, integral=0.0, derivative=0.5))
    e.update(1000, 1000, 1000, 0)  # calibrates at 1000 records/s, error 0
    # processed at 500/s: error 500, reached in 2 s -> trend 250/s
    assert e.update(3000, 500, 1000, 0) == pytest.approx(1000 - 0.5 * 250)


def test_the_rate_respects_the_minimum():
    e = PIDRateEstimator(1000)
    e.update(1000, 50, 1000, 0)  # 50 records/s
    assert e.update(2000, 10, 1000, 60_000) == 100.0  # Spark's default minimum
    e = PIDRateEstimator(1000, PIDGains(min_rate=5.0))
    e.update(1000, 50, 1000, 0)
    assert e.update(2000, 10, 1000, 60_000) == 5.0


def test_it_converges_when_processing_is_slower_than_the_batch_interval():
    limiter = RateLimiter(1000, RateSettings(backpressure=True, initial_rate=1500))
    run = _drive(limiter, capacity=1000.0, batches=40)
    assert run[0] == (1500, 0) and run[1][1] > 0  # 1.5 s of work per 1 s batch: a backlog builds
    assert max(d for _, d in run[:10]) > 0
    for records, delay in run[-10:]:
        assert records == pytest.approx(1000, rel=0.03)  # the capacity
        assert delay == 0  # the scheduling delay settled: the backlog drained


def test_gains_and_intervals_are_checked():
    with pytest.raises(ValueError, match="integral"):
        PIDGains(integral=-0.1)
    with pytest.raises(ValueError, match="minimum rate"):
        PIDGains(min_rate=0)
    with pytest.raises(ValueError, match="batch interval"):
        PIDRateEstimator(0)
    with pytest.raises(ValueError, match="max_rate_per_partition"):
        RateLimiter(1000, RateSettings(max_rate_per_partition=-1.0))


# ---------------------------------------------------------------------- the limiter
def test_no_settings_no_limit():
    limiter = RateLimiter(1000, RateSettings())
    assert limiter.max_records_per_partition(4) is None and limiter.rate() is None
    assert limiter.estimator is None and limiter.batch_completed(1000, 10, 10, 0) is None


def test_the_static_maximum_is_per_partition_per_second_of_batch():
    assert RateLimiter(1000, RateSettings(max_rate_per_partition=100)).max_records_per_partition(4) == 100
    assert RateLimiter(500, RateSettings(max_rate_per_partition=100)).max_records_per_partition(4) == 50
    assert RateLimiter(100, RateSettings(max_rate_per_partition=70)).max_records_per_partition(1) == 7
    assert RateLimiter(1000, RateSettings(max_rate_per_partition=0.2)).max_records_per_partition(3) == 1  # >= 1
    with pytest.raises(ValueError, match="at least one partition"):
        RateLimiter(1000, RateSettings(max_rate_per_partition=1)).max_records_per_partition(0)


def test_backpressure_shares_its_rate_among_partitions_and_the_smaller_limit_wins():
    limiter = RateLimiter(1000, RateSettings(backpressure=True))
    assert limiter.max_records_per_partition(4) is None  # no estimate, no initial rate: unlimited
    limiter = RateLimiter(2000, RateSettings(backpressure=True, initial_rate=1000))
    assert limiter.rate() == 1000 and limiter.max_records_per_partition(4) == 500
    capped = RateLimiter(2000, RateSettings(max_rate_per_partition=100, backpressure=True, initial_rate=1000))
    assert capped.max_records_per_partition(4) == 200  # the static 100/s per partition is below 250/s
    # The estimate replaces the initial rate once there is one.
    limiter.batch_completed(10_000, 2000, 1000, 0)
    assert limiter.rate() == 1000
    assert limiter.batch_completed(12_000, 2000, 4000, 0) == pytest.approx(500.0)
    assert limiter.rate() == pytest.approx(500.0) and limiter.max_records_per_partition(4) == 250
    # Never below one record per partition, whatever the estimate.
    tiny = RateLimiter(100, RateSettings(backpressure=True, gains=PIDGains(min_rate=1.0)))
    tiny.batch_completed(1000, 1, 1000, 0)
    tiny.batch_completed(2000, 1, 1000, 10_000)
    assert tiny.max_records_per_partition(10) == 1


def test_rate_settings_read_spark_keys_the_dstreams_keys_and_the_environment(monkeypatch):
    spark = {"spark.streaming.backpressure.enabled": "true", "spark.streaming.backpressure.initialRate": "500",
             "spark.streaming.kafka.maxRatePerPartition": "50", "spark.streaming.receiver.maxRate": "7",
             "spark.streaming.backpressure.pid.proportional": "0.5",
             "spark.streaming.backpressure.pid.integral": "0.1",
             "spark.streaming.backpressure.pid.derived": "0.05", "spark.streaming.backpressure.pid.minRate": "10"}
    got = rate_settings(spark)
    assert got == RateSettings(50.0, True, 500.0, PIDGains(0.5, 0.1, 0.05, 10.0))
    assert rate_settings(spark, config.RECEIVER_MAX_RATE).max_rate_per_partition == 7.0
    ours = {**spark, "spark.dstreams.source.maxRatePerPartition": "80"}
    assert rate_settings(ours).max_rate_per_partition == 80.0  # the dstreams key comes first
    assert rate_settings({"spark.streaming.kafka.maxRatePerPartition": "0"}) == RateSettings()  # 0: no limit
    assert not rate_settings({}).limits
    monkeypatch.setenv("DSTREAMS_BACKPRESSURE_ENABLED", "on")
    assert rate_settings({}).backpressure and rate_settings({}).limits
    assert not rate_settings({"spark.streaming.backpressure.enabled": "false"}).backpressure  # conf beats env
    with pytest.raises(ValueError, match=r"spark\.streaming\.backpressure\.pid\.minRate='0' is not a number of "
                                         r"records per second > 0.*spark\.dstreams\.backpressure\.pid\.minRate"):
        rate_settings({"spark.streaming.backpressure.pid.minRate": "0"})
    assert config.get(config.FILES_MAX_FILES_PER_BATCH, {"spark.dstreams.files.maxFilesPerBatch": "0"}) is None
    with pytest.raises(ValueError, match="a whole number >= 0"):
        config.get(config.FILES_MAX_FILES_PER_BATCH, {"spark.dstreams.files.maxFilesPerBatch": "2.5"})


# ---------------------------------------------------------------------- the input contract
class _Backlog(InputNode):
    """Test-only source with an endless backlog in ``partitions`` partitions: each batch takes the most
    its rate limit allows (``unlimited`` per partition without one)."""

    def __init__(self, graph: DStreamGraph, partitions: int = 2, unlimited: int = 1000) -> None:
        super().__init__(graph)
        self.partitions = partitions
        self.unlimited = unlimited

    def compute(self, time: BatchTime):
        limit = self.max_records_per_partition(time, self.partitions)
        n = limit if limit is not None else self.unlimited
        self.report_batch(time, n * self.partitions, {"perPartition": n})
        return self.graph.sc.parallelize(range(n * self.partitions), self.partitions)


def _completed(node: InputNode, t_ms: int, records: int, processing_ms: int, scheduling_ms: int = 0) -> BatchInfo:
    info = BatchInfo(t_ms, t_ms + 5, records_per_input={node.id: records})
    info.processing_start_time_ms = t_ms + 5 + scheduling_ms
    info.processing_end_time_ms = info.processing_start_time_ms + processing_ms
    return info


def test_the_input_contract_limits_records_reports_them_and_learns_from_completed_batches(sc, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BACKPRESSURE_ENABLED", "true")
    monkeypatch.setenv("DSTREAMS_SOURCE_MAX_RATE_PER_PARTITION", "400")
    node = _Backlog(DStreamGraph(sc, Duration(1000)), partitions=2)
    assert node.max_records_per_partition(BatchTime(1000), 2) == 400  # static only: no estimate yet
    assert node.metadata_at(BatchTime(1000)) == {"maxRecordsPerPartition": 400, "partitions": 2,
                                                 "maxRatePerPartition": 400.0}
    node.batch_completed(_completed(node, 1000, 800, 1000))  # calibration: 800 records/s
    node.batch_completed(_completed(node, 2000, 800, 2000))  # processed at 400 records/s
    assert node.max_records_per_partition(BatchTime(3000), 2) == 200
    assert node.metadata_at(BatchTime(3000))["rate"] == pytest.approx(400.0)
    failed = _completed(node, 3000, 10, 10_000)
    from dstreams.listener import OutputOperationInfo

    failed.output_operations[0] = OutputOperationInfo(3000, 0, "out", "out", failure_reason="boom")
    node.batch_completed(failed)  # a failed batch says nothing about the processing rate
    node.batch_completed(BatchInfo(4000, 4005))  # neither does one without this source's records or delays
    assert node.max_records_per_partition(BatchTime(5000), 2) == 200
    node.forget_before(BatchTime(3000))
    assert node.metadata_at(BatchTime(1000)) == {}

    quiet = _Backlog(DStreamGraph(sc, Duration(1000)))
    monkeypatch.delenv("DSTREAMS_BACKPRESSURE_ENABLED")
    monkeypatch.delenv("DSTREAMS_SOURCE_MAX_RATE_PER_PARTITION")
    assert quiet.max_records_per_partition(BatchTime(1000), 2) is None and quiet.rate_limiter is None
    assert quiet.metadata_at(BatchTime(1000)) == {}
    quiet.batch_completed(_completed(quiet, 1000, 10, 10))  # no limiter: nothing to do


@pytest.mark.slow
def test_backpressure_shrinks_the_limit_of_a_source_whose_batches_take_longer_than_the_interval(sc, monkeypatch):
    interval_ms, capacity = 500, 2000.0  # records/s the output operation processes
    monkeypatch.setenv("DSTREAMS_BACKPRESSURE_ENABLED", "true")
    monkeypatch.setenv("DSTREAMS_BACKPRESSURE_INITIAL_RATE", "3000")  # 1500 records per batch: 0.75 s each
    with manual_context(interval_ms / 1000, sc=sc) as ssc:
        node = _Backlog(ssc._graph, partitions=2)
        DStream(node, ssc).foreachRDD(lambda rdd: time.sleep(rdd.count() / capacity))
        batches = 16
        ssc.start()
        started = time.monotonic()
        for k in range(1, batches + 1):  # the manual clock moves at the pace of wall time
            time.sleep(max(0.0, started + k * interval_ms / 1000 - time.monotonic()))
            ssc.clock.set_time(k * interval_ms)
        ssc.awaitBatch(batches * interval_ms, 120)
        infos = sorted(ssc.batchInfos(), key=lambda i: i.batch_time_ms)
    assert len(infos) == batches
    limits = [i.streamIdToInputInfo()[node.id].metadata()["maxRecordsPerPartition"] for i in infos]
    records = [i.streamIdToInputInfo()[node.id].numRecords() for i in infos]
    assert records == [2 * n for n in limits]
    assert limits[0] == 750  # the initial rate: 3000/s * 0.5 s / 2 partitions
    assert "rate" in infos[0].streamIdToInputInfo()[node.id].metadata()
    # The first batches queue up (0.75 s of work every 0.5 s); once they complete, the limit falls below
    # the capacity (500 per partition, less Spark's overhead) while the backlog drains, then comes back up.
    assert min(limits) < 375 and max(limits[5:]) < 750, limits
    delays = [i.scheduling_delay_ms for i in infos]
    processing = [i.processing_delay_ms for i in infos]
    assert max(delays[-3:]) < max(delays) / 2, (limits, delays)  # the scheduling delay settles, not grows
    assert max(processing[-3:]) < 1.5 * interval_ms, (limits, processing)


# ---------------------------------------------------------------------- file sources
def _put(folder, name: str, text: str) -> None:
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(folder, name))  # appears atomically


def _backlog_files(folder, first: int, count: int) -> list[str]:
    lines = []
    for i in range(first, first + count):
        _put(folder, f"f{i:03d}.txt", f"f{i:03d}-a\nf{i:03d}-b\n")
        lines += [f"f{i:03d}-a", f"f{i:03d}-b"]
    return lines


def test_a_backlog_of_25_files_drains_10_per_batch_each_line_once(sc, tmp_path):
    folder = str(tmp_path / "in")
    os.makedirs(folder)
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.textFileStream(folder, maxFilesPerBatch=10)
        seen = collect(stream, sort=True)
        ssc.start()
        lines = _backlog_files(folder, 0, 25)
        infos = run_batches(ssc, 4, timeout=120)
    got = [seen[t] for t in (1000, 2000, 3000, 4000)]
    assert [len(b) for b in got] == [20, 20, 10, 0]
    assert got[0] == lines[:20] and got[2] == lines[40:]  # listing order
    flat = [x for b in got for x in b]
    assert sorted(flat) == sorted(lines) and len(flat) == len(set(flat))  # every line exactly once
    metadata = [dict(i.streamIdToInputInfo()[stream._node.id].metadata()) for i in infos]
    assert metadata == [{"maxFilesPerBatch": 10, "files": 10, "filesWaiting": 15},
                        {"maxFilesPerBatch": 10, "files": 10, "filesWaiting": 5},
                        {"maxFilesPerBatch": 10, "files": 5, "filesWaiting": 0},
                        {"maxFilesPerBatch": 10, "files": 0, "filesWaiting": 0}]
    assert [i.streamIdToInputInfo()[stream._node.id].numRecords() for i in infos] == [0, 0, 0, 0]  # unknown


def test_max_files_per_batch_from_the_conf_for_binary_records(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_FILES_MAX_FILES_PER_BATCH", "2")
    with manual_context(1, sc=sc) as ssc:
        got = collect(ssc.binaryRecordsStream(str(tmp_path), 2), sort=True)
        ssc.start()
        for i in range(5):
            (tmp_path / f"r{i}.bin").write_bytes(f"{i}a{i}b".encode())
        run_batches(ssc, 3, timeout=120)
    assert [got[t] for t in (1000, 2000, 3000)] == [
        [b"0a", b"0b", b"1a", b"1b"], [b"2a", b"2b", b"3a", b"3b"], [b"4a", b"4b"]]


@pytest.mark.slow
def test_backpressure_learns_a_file_source_rate_in_files_per_second(sc, tmp_path, monkeypatch):
    """A backlog of one-line files processed at 20 files/s (at most: the machine's load only slows it), 0.5 s
    batches run one after the other: the first batch takes maxFilesPerBatch (30 files, no estimate yet), then
    the estimator, fed with files per second of processing, limits a batch to what keeps up (20 files/s x 0.5 s
    = 10), and every line is read once, in listing order. (That the scheduling delay settles under a backlog is
    the record sources' test above: the file source shares the limiter.)"""
    interval_ms, capacity = 500, 20.0
    monkeypatch.setenv("DSTREAMS_BACKPRESSURE_ENABLED", "true")
    monkeypatch.setenv("DSTREAMS_BACKPRESSURE_INITIAL_RATE", "100000")  # records/s: not for a file source
    folder = str(tmp_path / "in")
    os.makedirs(folder)
    seen: list[str] = []

    def work(rdd) -> None:
        lines = rdd.collect()
        seen.extend(lines)
        time.sleep(len(lines) / capacity)

    written = [f"line-{i:04d}" for i in range(120)]
    with manual_context(interval_ms / 1000, sc=sc) as ssc:
        stream = ssc.textFileStream(folder, maxFilesPerBatch=30)
        stream.foreachRDD(work)
        ssc.start()
        for i, line in enumerate(written):
            _put(folder, f"f{i:04d}.txt", line + "\n")
        # each batch generated once the one before completed: no scheduling delay
        infos = run_batches(ssc, 8, timeout=120)
    metadata = [dict(i.streamIdToInputInfo()[stream._node.id].metadata()) for i in infos]
    limits = [m["maxFilesPerBatch"] for m in metadata]
    assert limits[0] == 30 and "rate" not in metadata[0], metadata  # no estimate yet; the initial rate is in records
    assert all(m.get("rate", 0) >= 2.0 for m in metadata[-4:]), metadata  # floor: one file per batch
    assert max(limits[-4:]) <= 12, metadata  # 20 files/s * 0.5 s = 10 per batch keep up (slower when loaded)
    assert sum(m["files"] for m in metadata) == len(seen) and seen == written[:len(seen)]  # listing order, once


def test_max_files_per_batch_is_checked(sc, tmp_path):
    with manual_context(1, sc=sc) as ssc:
        for bad in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match="maxFilesPerBatch must be a positive int"):
                ssc.textFileStream(str(tmp_path), maxFilesPerBatch=bad)
        assert ssc._graph.inputs == []  # a rejected source leaves nothing behind in the graph


def _counting_setup(sc, inputd: str, out: str, clock: ManualClock):
    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        lines = ssc.textFileStream(inputd, maxFilesPerBatch=10)
        lines.saveAsTextFiles(os.path.join(out, "lines"))
        counts = lines.map(lambda x: (x, 1)).updateStateByKey(lambda vs, s: sum(vs, s or 0))
        counts.checkpoint(2)
        counts.map(lambda kv: f"{kv[0]},{kv[1]}").saveAsTextFiles(os.path.join(out, "counts"))
        return ssc

    return setup


@pytest.mark.slow
def test_files_left_over_are_read_once_across_a_restart(sc, tmp_path):
    inputd, out, cpd = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "cp")
    os.makedirs(inputd)
    first = StreamingContext.getOrCreate(cpd, _counting_setup(sc, inputd, out, ManualClock()))
    first.start()
    try:
        lines = _backlog_files(inputd, 0, 25)
        run_batches(first, 1, timeout=120)  # 10 files; no checkpoint yet (every 2 s): batch 1 is replayed below
    finally:
        first.stop(stopSparkContext=False)  # the driver "dies" with 15 files waiting
    lines += _backlog_files(inputd, 25, 2)  # arrived while the driver was down
    called: list[int] = []
    second = StreamingContext.getOrCreate(cpd, lambda: called.append(1) or None, clock=ManualClock(1000))
    assert called == []  # the graph (and maxFilesPerBatch) came back from the checkpoint
    second.start()
    try:
        second.awaitBatch(1000, 120)  # due at the restart: its clock is at 1000
        run_batches(second, 3, timeout=120)
        second._checkpointer.flush(60)  # no checkpoint write left running after the test
    finally:
        second.stop(stopSparkContext=False)
    got = read_outputs(out)
    per_batch = [got[f"lines-{t}"] for t in (1000, 2000, 3000, 4000)]
    assert [len(b) for b in per_batch] == [20, 20, 14, 0]  # batch 1 rebuilt from its recorded files
    assert per_batch[0] == sorted(lines[:20])
    flat = [x for b in per_batch for x in b]
    assert sorted(flat) == sorted(lines) and len(flat) == len(set(flat))  # every line exactly once
    assert got["counts-4000"] == sorted(f"{x},1" for x in lines)  # the state counted each line once


@pytest.mark.slow
def test_state_after_a_restart_in_the_middle_of_a_drain_keeps_counting_once(sc, tmp_path):
    """Same as above with a checkpoint to restore from: the drain goes on after the checkpointed batch."""
    inputd, out, cpd = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "cp")
    os.makedirs(inputd)
    first = StreamingContext.getOrCreate(cpd, _counting_setup(sc, inputd, out, ManualClock()))
    first.start()
    try:
        lines = _backlog_files(inputd, 0, 25)
        run_batches(first, 2, timeout=120)
        first._checkpointer.flush(60)
    finally:
        first.stop(stopSparkContext=False)
    second = StreamingContext.getOrCreate(cpd, lambda: None, clock=ManualClock(2000))
    second.start()
    try:
        run_batches(second, 1, timeout=120)
    finally:
        second.stop(stopSparkContext=False)
    got = read_outputs(out)
    assert [len(got[f"lines-{t}"]) for t in (1000, 2000, 3000)] == [20, 20, 10]
    assert got["counts-3000"] == sorted(f"{x},1" for x in lines)
    assert sorted(x for t in (1000, 2000, 3000) for x in got[f"lines-{t}"]) == sorted(lines)


# ---------------------------------------------------------------------- the socket source
def test_the_socket_takes_at_most_receiver_max_rate_lines_per_batch(sc, monkeypatch):
    from .test_sources import _LineServer, _wait_buffered

    monkeypatch.setenv("DSTREAMS_RECEIVER_MAX_RATE", "2")
    server = _LineServer()
    try:
        with manual_context(1, sc=sc) as ssc:
            stream = ssc.socketTextStream("127.0.0.1", server.port)
            got = collect(stream)
            ssc.start()
            server.send(b"l1\nl2\nl3\nl4\nl5\n")
            _wait_buffered(stream._node, 5)
            infos = run_batches(ssc, 4, timeout=120)
    finally:
        server.close()
    # the rest stayed queued, in order
    assert [got[t] for t in (1000, 2000, 3000, 4000)] == [["l1", "l2"], ["l3", "l4"], ["l5"], []]
    assert [i.numRecords() for i in infos] == [2, 2, 1, 0]
    assert dict(infos[0].streamIdToInputInfo()[stream._node.id].metadata()) == {
        "maxRecordsPerPartition": 2, "partitions": 1, "maxRatePerPartition": 2.0}


# ---------------------------------------------------------------------- a log source
def test_the_engine_limit_bounds_the_redis_source(sc, monkeypatch, redis_url, redis_client, redis_prefix):
    """``spark.dstreams.source.maxRatePerPartition`` (here its variable) reaches a log source through the input
    contract, with no argument of its own, and each batch's limit is in its metrics."""
    monkeypatch.setenv("DSTREAMS_SOURCE_MAX_RATE_PER_PARTITION", "10")
    keys = [f"{redis_prefix}{i}" for i in range(2)]
    for k in keys:
        for i in range(25):
            redis_client.xadd(k, {"n": str(i)})
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.redisStream(keys, url=redis_url)
        seen = collect(stream.map(lambda r: (r[0], int(r[2]["n"]))), sort=True)
        ssc.start()
        infos = run_batches(ssc, 4)
    got = [seen[t] for t in (1000, 2000, 3000, 4000)]
    assert [len(b) for b in got] == [20, 20, 10, 0]
    flat = [x for b in got for x in b]
    assert sorted(flat) == sorted((k, i) for k in keys for i in range(25))  # each entry exactly once
    metadata = infos[0].streamIdToInputInfo()[stream._node.id].metadata()
    assert metadata["maxRecordsPerPartition"] == 10 and metadata["partitions"] == 2
