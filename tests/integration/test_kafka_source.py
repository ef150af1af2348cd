"""The Kafka source against the real broker (scripts/services.sh start kafka): offsets fixed per batch from the last
stable offset, pyspark 2.4's KafkaUtils API, rate limits, new partitions, data loss, decode errors and dead letters.
"""

from __future__ import annotations

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.testing import collect, manual_context, run_batches

from ..kafka_support import add_partitions, create_topic, produce, read_committed

pytest.importorskip("confluent_kafka")


def _run(sc, build, batches: int, before_batch=None, timeout_s: float = 60.0):
    """Run ``batches`` 1 s batches of a manual context (``before_batch(i)`` runs before batch i is generated), each
    without a failed output, and return what ``build(ssc, out)`` put in ``out``: an entry it set to
    ``collect(stream)`` comes back as the stream's records per batch, in batch order."""
    out: dict = {}
    times = []
    with manual_context(1.0, sc=sc) as ssc:
        build(ssc, out)
        ssc.start()
        for i in range(1, batches + 1):
            if before_batch is not None:
                before_batch(i)
            times += [info.batch_time.ms for info in run_batches(ssc, 1, timeout=timeout_s)]
    return {name: [got.get(t, []) for t in times] if isinstance(got, dict) else got for name, got in out.items()}


def test_direct_stream_reads_each_record_once_with_offset_ranges(sc, kafka_bootstrap):
    from dstreams.kafka import KafkaUtils, OffsetRange

    topic = create_topic(kafka_bootstrap, partitions=2)
    produce(kafka_bootstrap, topic, [(f"k{i}", f"v{i}") for i in range(10)], partition=0)
    ranges_seen: list[list[OffsetRange]] = []

    def build(ssc, out):
        kvs = KafkaUtils.createDirectStream(ssc, [topic], {"metadata.broker.list": kafka_bootstrap,
                                                           "auto.offset.reset": "smallest"})
        kvs.foreachRDD(lambda rdd: ranges_seen.append(rdd.offsetRanges()))
        out["transformed"] = collect(kvs.transform(lambda rdd: rdd.context.parallelize(
            [str(r) for r in rdd.offsetRanges()])))
        out["records"] = collect(kvs)

    def feed(i):
        if i == 2:
            produce(kafka_bootstrap, topic, [(None, f"w{j}") for j in range(5)], partition=1)

    out = _run(sc, build, 3, feed)
    assert sorted(out["records"][0]) == sorted((f"k{i}", f"v{i}") for i in range(10))
    assert sorted(out["records"][1]) == sorted((None, f"w{j}") for j in range(5))
    assert out["records"][2] == []
    assert ranges_seen[0] == [OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 0, 0)]
    assert ranges_seen[1] == [OffsetRange(topic, 0, 10, 10), OffsetRange(topic, 1, 0, 5)]
    assert out["transformed"][0] == [str(OffsetRange(topic, 0, 0, 10)), str(OffsetRange(topic, 1, 0, 0))]


def test_default_start_is_latest_and_message_handler_gets_metadata(sc, kafka_bootstrap):
    from dstreams.kafka import KafkaUtils, TopicAndPartition

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [("old", "old")], partition=0)

    def build(ssc, out):
        s = KafkaUtils.createDirectStream(ssc, [topic], {"bootstrap.servers": kafka_bootstrap},
                                          messageHandler=lambda m: (m.topic, m.partition, m.offset, m.key, m.message))
        out["latest"] = collect(s)
        s2 = KafkaUtils.createDirectStream(ssc, [topic], {"bootstrap.servers": kafka_bootstrap},
                                           fromOffsets={TopicAndPartition(topic, 0): 1},
                                           valueDecoder=lambda b: b.decode().upper())
        out["from"] = collect(s2)

    out = _run(sc, build, 2, lambda i: produce(kafka_bootstrap, topic, [("k", f"new{i}")], partition=0))
    assert out["latest"] == [[(topic, 0, 1, "k", "new1")], [(topic, 0, 2, "k", "new2")]]
    assert out["from"] == [[("k", "NEW1")], [("k", "NEW2")]]


def test_read_committed_skips_aborted_and_never_waits_for_an_open_transaction(sc, kafka_bootstrap):
    from confluent_kafka import Producer

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, "a1"), (None, "a2")], transactional_id=f"{topic}-tx")
    produce(kafka_bootstrap, topic, [(None, "aborted")], transactional_id=f"{topic}-tx", abort=True)
    produce(kafka_bootstrap, topic, [(None, "b1")], transactional_id=f"{topic}-tx")
    # An open transaction: its records must not show, and the batch must not wait for it.
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-open"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"pending", partition=0)
    p.flush(30)

    def build(ssc, out):
        out["v"] = collect(ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest",
                                           decoder=lambda r: r.value.decode()))

    def feed(i):
        if i == 2:
            p.commit_transaction(30)

    try:
        out = _run(sc, build, 3, feed)
    finally:
        p.flush(5)
    assert out["v"][0] == ["a1", "a2", "b1"]
    assert out["v"][1] + out["v"][2] == ["pending"]


def test_rate_limit_splits_a_backlog_over_batches_and_new_partitions_are_read(sc, kafka_bootstrap):
    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, str(i)) for i in range(25)], partition=0)

    def build(ssc, out):
        s = ssc.kafkaStream([topic], {"bootstrap.servers": kafka_bootstrap}, startingOffsets="earliest",
                            maxRatePerPartition=10, minPartitions=3,
                            decoder=lambda r: (r.partition, int(r.value)))
        out["v"] = collect(s)
        s.foreachRDD(lambda rdd: out.setdefault("tasks", []).append(rdd.getNumPartitions()))

    def feed(i):
        if i == 2:
            add_partitions(kafka_bootstrap, topic, 2)
            produce(kafka_bootstrap, topic, [(None, "100"), (None, "101")], partition=1)

    out = _run(sc, build, 4, feed)
    assert out["v"][0] == [(0, i) for i in range(10)]
    assert out["tasks"][0] == 3  # minPartitions: the 10 offsets in 3 consecutive pieces
    assert sorted(out["v"][1]) == sorted([(0, i) for i in range(10, 20)] + [(1, 100), (1, 101)])
    assert out["v"][2] == [(0, i) for i in range(20, 25)]
    assert out["v"][3] == []


def test_pattern_subscription_reads_matching_topics_also_created_later(sc, kafka_bootstrap):
    import uuid

    prefix = f"pat-{uuid.uuid4().hex[:8]}"
    first = create_topic(kafka_bootstrap, f"{prefix}-a")
    produce(kafka_bootstrap, first, [(None, "a")])
    create_topic(kafka_bootstrap, f"other-{prefix}")

    def build(ssc, out):
        out["v"] = collect(ssc.kafkaStream(pattern=rf"{prefix}-.*", bootstrapServers=kafka_bootstrap,
                                           startingOffsets="earliest", decoder=lambda r: (r.topic, r.value.decode())))

    def feed(i):
        if i == 2:
            second = create_topic(kafka_bootstrap, f"{prefix}-b")
            produce(kafka_bootstrap, second, [(None, "b")])

    out = _run(sc, build, 2, feed)
    assert out["v"] == [[(first, "a")], [(f"{prefix}-b", "b")]]


def test_missing_topic_and_bad_params_fail_clearly(sc, kafka_bootstrap):
    from dstreams.kafka import KafkaConfigError

    with manual_context(1.0, sc=sc) as ssc:
        with pytest.raises(KafkaConfigError, match="bootstrap.servers"):
            ssc.kafkaStream("x", {})
        with pytest.raises(ValueError, match="startingOffsets"):
            ssc.kafkaStream("x", bootstrapServers=kafka_bootstrap, startingOffsets="newest")
        ssc.kafkaStream("no-such-topic-dstreams", bootstrapServers=kafka_bootstrap).foreachRDD(lambda r: None)
        with pytest.raises(ValueError, match=r"do not exist.*create them first"):
            ssc.start()


def test_decode_error_names_topic_partition_offset_and_dead_letters_route_it(sc, kafka_bootstrap):
    from dstreams.kafka.source import KafkaDeadLetter

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, "1"), (None, "x"), (None, "3")], partition=0)

    dlq = create_topic(kafka_bootstrap, partitions=1, prefix="dlq")

    def build(ssc, out):
        s = ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest",
                            decoder=lambda r: int(r.value), onDecodeError="deadLetter")
        out["good"] = collect(s)
        out["dead"] = collect(s.deadLetters())
        s.deadLetters().saveToKafka(dlq, {"bootstrap.servers": kafka_bootstrap}, keyFunc=lambda d: d.key,
                                    valueFunc=lambda d: d.value, outputName=dlq)

    out = _run(sc, build, 1)
    assert out["good"] == [[1, 3]]
    assert [(k, v) for _p, _o, k, v in read_committed(kafka_bootstrap, dlq)] == [(None, b"x")]  # once, as it was
    [[dead]] = out["dead"]
    assert isinstance(dead, KafkaDeadLetter)
    assert (dead.topic, dead.partition, dead.offset, dead.value, dead.batchTime) == (topic, 0, 1, b"x", 1000)
    assert "ValueError" in dead.error

    with manual_context(1.0, sc=sc) as ssc:
        ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest",
                        decoder=lambda r: int(r.value)).foreachRDD(lambda rdd: rdd.collect())
        ssc.start()
        [info] = run_batches(ssc, 1, check=False)  # the batch fails: its error is checked below
    reasons = [op.failure_reason or "" for op in info.output_operations.values()]
    assert any(f"topic '{topic}' partition 0 offset 1" in r for r in reasons), reasons


def test_create_rdd_reads_given_ranges(sc, kafka_bootstrap):
    from dstreams.kafka import KafkaUtils, OffsetRange

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(f"k{i}", f"v{i}") for i in range(6)], partition=0)
    rdd = KafkaUtils.createRDD(sc, {"metadata.broker.list": kafka_bootstrap}, [OffsetRange(topic, 0, 2, 5)])
    assert rdd.collect() == [("k2", "v2"), ("k3", "v3"), ("k4", "v4")]
    assert rdd.offsetRanges() == [OffsetRange(topic, 0, 2, 5)]
    assert rdd.map(lambda kv: kv[1]).collect() == ["v2", "v3", "v4"]


def _delete_records_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    """Move the partition's log start to ``offset`` (what retention does), and wait until the broker shows it."""
    import time

    from confluent_kafka import TopicPartition

    from ..kafka_support import admin

    a = admin(bootstrap)
    futures = a.delete_records([TopicPartition(topic, partition, offset)], request_timeout=30, operation_timeout=30)
    for f in futures.values():
        f.result(30)
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "dstreams-tests"})
    try:
        deadline = time.monotonic() + 30
        while c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[0] < offset:
            assert time.monotonic() < deadline, "the log start did not move"
            time.sleep(0.1)
    finally:
        c.close()


@pytest.mark.parametrize("fail", [True, False])
def test_offsets_gone_from_the_broker_fail_the_batch_or_are_skipped_and_counted(sc, kafka_bootstrap, fail):
    from dstreams.kafka import KafkaDataLossError

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, str(i)) for i in range(10)], partition=0)
    with manual_context(1.0, sc=sc) as ssc:
        s = ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest",
                            maxRatePerPartition=3, failOnDataLoss=fail, decoder=lambda r: int(r.value))
        out = collect(s)
        ssc.start()
        run_batches(ssc, 1)
        _delete_records_before(kafka_bootstrap, topic, 0, 7)  # offsets 3..6 never read: lost
        if fail:
            with pytest.raises(Exception) as caught:
                run_batches(ssc, 1, check=False)
                ssc.awaitTermination(60)
            text = f"{caught.value}"
            cause = caught.value
            while cause is not None and not isinstance(cause, KafkaDataLossError):
                cause = cause.__cause__ or cause.__context__
            assert isinstance(cause, KafkaDataLossError) or "KafkaDataLossError" in text, text
            assert f"topic '{topic}' partition 0" in text and "failOnDataLoss=False" in text, text
        else:
            [info] = run_batches(ssc, 1)
            assert out == {1000: [0, 1, 2], 2000: [7, 8, 9]}
            [md] = [m for m in info.input_metadata.values()]
            assert md["recordsLost"] == 4
            _assert_lost_shown(ssc, 4)


def _assert_lost_shown(ssc, lost: int) -> None:
    """The status page's JSON and /metrics count the skipped offsets (once the listener bus delivered the batch)."""
    import json
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    url = ssc.uiWebUrl
    assert url, "the status page is off"
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url + "/api/status", timeout=10) as r:
            [source] = json.loads(r.read())["sources"]
        if source["records_lost"] == lost or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert source["records_lost"] == lost
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        exposition = r.read().decode()
    (family,) = [f for f in text_string_to_metric_families(exposition) if f.name == "dstreams_input_records_lost"]
    assert [s.value for s in family.samples if s.name == "dstreams_input_records_lost_total"] == [lost]


def test_a_range_read_after_its_offsets_were_deleted_fails_or_skips(sc, kafka_bootstrap):
    from dstreams.kafka import KafkaUtils, OffsetRange

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, str(i)) for i in range(10)], partition=0)
    _delete_records_before(kafka_bootstrap, topic, 0, 5)
    ranges = [OffsetRange(topic, 0, 2, 8)]
    rdd = KafkaUtils.createRDD(sc, {"bootstrap.servers": kafka_bootstrap}, ranges)
    with pytest.raises(Exception, match=r"offsets 2 to 4 of the batch range \[2, 8\) are no longer on the broker"):
        rdd.collect()
    skipping = KafkaUtils.createRDD(sc, {"bootstrap.servers": kafka_bootstrap, "failOnDataLoss": "false"}, ranges)
    assert skipping.values().collect() == ["5", "6", "7"]


def test_commit_to_group_moves_the_groups_offsets_after_each_batch(sc, kafka_bootstrap):
    from confluent_kafka import Consumer, TopicPartition

    topic = create_topic(kafka_bootstrap, partitions=2)
    produce(kafka_bootstrap, topic, [(None, "a")], partition=0)
    produce(kafka_bootstrap, topic, [(None, "b"), (None, "c")], partition=1)
    group = f"{topic}-monitor"
    holder: dict = {}

    def build(ssc, out):
        s = ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest", commitToGroup=group)
        holder["node"] = s._node
        s.foreachRDD(lambda rdd: rdd.count())

    _run(sc, build, 1)
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
    finally:
        c.close()
    assert [tp.offset for tp in committed] == [1, 2]


def test_a_deleted_topic_fails_with_its_name(sc, kafka_bootstrap):
    from ..kafka_support import delete_topic

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, "a")], partition=0)
    with manual_context(1.0, sc=sc) as ssc:
        ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest").foreachRDD(
            lambda rdd: rdd.count())
        ssc.start()
        run_batches(ssc, 1)
        delete_topic(kafka_bootstrap, topic)
        with pytest.raises(Exception, match=rf"{topic}:0.*no longer exist"):
            run_batches(ssc, 1, check=False)
            ssc.awaitTermination(60)


def test_one_worker_reads_overlapping_ranges_of_a_partition_one_after_another(sc, kafka_bootstrap):
    """A Python worker keeps its consumer between tasks: a range read after a later one (a recomputation) gets its
    own records, not ones fetched for the earlier assignment."""
    from dstreams.kafka import KafkaUtils, OffsetRange

    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, str(i)) for i in range(200)], partition=0)
    ranges = [OffsetRange(topic, 0, 0, 100), OffsetRange(topic, 0, 150, 160), OffsetRange(topic, 0, 10, 12),
              OffsetRange(topic, 0, 100, 200), OffsetRange(topic, 0, 5, 6)]
    for r in ranges:  # one task each, run one after another on the same reused worker
        got = KafkaUtils.createRDD(sc, {"bootstrap.servers": kafka_bootstrap}, [r]).values().collect()
        assert got == [str(i) for i in range(r.fromOffset, r.untilOffset)], r
    assert KafkaUtils.createRDD(sc, {"bootstrap.servers": kafka_bootstrap}, ranges[:1]).take(3) == [
        (None, "0"), (None, "1"), (None, "2")]


def test_backpressure_shares_the_rate_among_partitions_by_lag(sc, kafka_bootstrap):
    from dstreams.rate import RateLimiter, RateSettings

    topic = create_topic(kafka_bootstrap, partitions=2)
    produce(kafka_bootstrap, topic, [(None, str(i)) for i in range(30)], partition=0)
    produce(kafka_bootstrap, topic, [(None, str(i)) for i in range(10)], partition=1)

    def build(ssc, out):
        s = ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest")
        # Backpressure's rate before any estimate: 20 records/s for the stream, shared 3:1 by the lags.
        s._node.rate_limiter = RateLimiter(1000, RateSettings(backpressure=True, initial_rate=20))
        s.foreachRDD(lambda rdd: out.setdefault("ranges", []).append(
            [(r.partition, r.count()) for r in rdd.offsetRanges()]))

    out = _run(sc, build, 1)
    assert out["ranges"] == [[(0, 15), (1, 5)]]


def test_kafka_timestamps_drive_event_time(sc, kafka_bootstrap):
    topic = create_topic(kafka_bootstrap, partitions=1)
    base_ms = 1_700_000_000_000
    for i in range(5):
        produce(kafka_bootstrap, topic, [(None, str(i))], partition=0, timestamp_ms=base_ms + i * 1000)

    def build(ssc, out):
        s = ssc.kafkaStream(topic, bootstrapServers=kafka_bootstrap, startingOffsets="earliest")
        timed = s.withEventTime(lambda r: r.timestamp / 1000)
        out["watermarks"] = collect(timed.watermarks())
        s.foreachRDD(lambda rdd: out.setdefault("ts", []).append(
            [(r.timestamp, r.timestampType) for r in rdd.collect()]))

    out = _run(sc, build, 2)
    assert out["ts"][0] == [(base_ms + i * 1000, "create") for i in range(5)]
    assert out["watermarks"][1] == [(base_ms + 4000) / 1000]  # batch 2's watermark: batch 1's newest event time


def test_offsets_gone_under_a_recorded_batch_are_skipped_after_the_restart_the_error_names(
        sc, kafka_bootstrap, tmp_path, monkeypatch):
    """Batch 2's range is recorded in the metadata log and the batch fails before reading it; offsets of that range
    are then deleted from the broker. The restart from the stored graph fails with KafkaDataLossError (the stored
    failOnDataLoss=True) and names the way out; the restart it names (getOrCreate(..., rebuildGraph=True) with
    failOnDataLoss=False) replays batch 2 without the deleted offsets and goes on: every record still on the broker
    is written once. A changed topic list is refused on that path (it is the topology); failOnDataLoss is not."""
    import os

    from dstreams.recovery.metadata import GraphChangedError
    from dstreams.time import from_user_time

    from ..recovery_app import read_outputs

    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")  # a failed batch stops the context at once
    topic = create_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(None, str(i)) for i in range(10)], partition=0)
    ckpt, out, hold = str(tmp_path / "ckpt"), str(tmp_path / "out"), str(tmp_path / "hold-batch-2")

    def build(clock: ManualClock, topics: list[str], fail: bool = True) -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.checkpoint(ckpt)
        records = ssc.kafkaStream(topics, bootstrapServers=kafka_bootstrap, startingOffsets="earliest",
                                  maxRatePerPartition=3, failOnDataLoss=fail, decoder=lambda r: r.value.decode())

        def held(t, rdd) -> None:  # while the file exists, batch 2 fails before its records are read
            if from_user_time(t).ms == 2000 and os.path.exists(hold):
                raise RuntimeError("batch 2 held")

        records.foreachRDD(held)
        records.saveAsTextFiles(os.path.join(out, "lines"))
        return ssc

    clock = ManualClock()
    first = StreamingContext.getOrCreate(ckpt, lambda: build(clock, [topic]))
    first.start()
    try:
        run_batches(first, 1)
        open(hold, "w").close()
        clock.advance(1000)
        with pytest.raises(Exception, match="batch 2 held"):
            first.awaitTerminationOrTimeout(60)
    finally:
        first.stop(stopSparkContext=False)
    os.remove(hold)
    _delete_records_before(kafka_bootstrap, topic, 0, 5)  # offsets 3 and 4, in recorded batch 2 [3, 6), are gone

    stored = StreamingContext.getOrCreate(ckpt, lambda: pytest.fail("setupFunc called"), clock=ManualClock(2000))
    stored.start()
    try:
        with pytest.raises(Exception, match=r"restart with StreamingContext.getOrCreate\(path, setupFunc, "
                                            r"rebuildGraph=True\) where setupFunc passes it") as failed:
            stored.awaitTerminationOrTimeout(60)
        assert f"topic '{topic}' partition 0" in str(failed.value)
    finally:
        stored.stop(stopSparkContext=False)

    other = create_topic(kafka_bootstrap, partitions=1)
    other_topics = StreamingContext.getOrCreate(ckpt, lambda: build(ManualClock(2000), [topic, other], False),
                                                rebuildGraph=True)
    with pytest.raises(GraphChangedError, match="topics="):
        other_topics.start()
    other_topics.stop(stopSparkContext=False)

    clock3 = ManualClock(2000)
    rebuilt = StreamingContext.getOrCreate(ckpt, lambda: build(clock3, [topic], False), rebuildGraph=True)
    rebuilt.start()
    try:
        info = rebuilt.awaitBatch(2000, 60)
        assert [md["recordsLost"] for md in info.input_metadata.values()] == [2]
        clock3.advance(1000)
        rebuilt.awaitBatch(3000, 60)
    finally:
        rebuilt.stop(stopSparkContext=False)
    lines = [line for name, got in read_outputs(out).items() if name.startswith("lines-") for line in got]
    assert sorted(lines, key=int) == ["0", "1", "2", "5", "6", "7", "8"]
