"""``DStream.saveToRedisStream`` against the real Redis server: ids derived from the batch, exactly once.

A re-run batch adds nothing, a write cut off half-way is completed without duplicates, entries of another writer
are reported (not silently taken for ours), and one dstreams job reads with ``redisStream`` what another wrote.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.retry import RetryPolicy
from dstreams.redis.sink import (
    STRIDE,
    RedisStreamConflictError,
    _chunks,
    encode_partition,
    save_to_redis_stream,
    write_chunk,
)
from dstreams.testing import collect, manual_context, run_batches

pytestmark = pytest.mark.redis


def _entries(client, key: str) -> list[tuple[str, dict[str, str]]]:
    return [(eid, fields) for eid, fields in client.xrange(key)]


def test_each_batch_is_added_with_ids_from_its_time_and_positions(sc, redis_url, redis_client, redis_prefix):
    key = f"{redis_prefix}out"
    with manual_context(1, sc=sc) as ssc:
        batches = [[{"n": i, "w": f"w{i}"} for i in range(5)], [], [{"n": 9, "w": "nine"}]]
        ssc.queueStream([sc.parallelize(b, 2) for b in batches]).saveToRedisStream(redis_url, key)
        ssc.start()
        infos = run_batches(ssc, 3)
        with urllib.request.urlopen(ssc.uiWebUrl + "/metrics", timeout=10) as r:
            exposition = r.read().decode()
    written = [[op.records_written for op in info.output_operations.values()] for info in infos]
    assert written == [[5], [0], [1]]
    (family,) = [f for f in text_string_to_metric_families(exposition) if f.name == "dstreams_output_records"]
    assert [s.value for s in family.samples if s.name == "dstreams_output_records_total"] == [6]  # /metrics
    # parallelize(5 records, 2): partition 0 holds 2, partition 1 holds 3; parallelize(1 record, 2): partition 1
    assert _entries(redis_client, key) == [
        ("1000-0", {"n": "0", "w": "w0"}), ("1000-1", {"n": "1", "w": "w1"}),
        (f"1000-{STRIDE}", {"n": "2", "w": "w2"}), (f"1000-{STRIDE + 1}", {"n": "3", "w": "w3"}),
        (f"1000-{STRIDE + 2}", {"n": "4", "w": "w4"}), (f"3000-{STRIDE}", {"n": "9", "w": "nine"})]


def test_fields_name_tuples_or_map_records(sc, redis_url, redis_client, redis_prefix):
    rdd = sc.parallelize([("a", 1), ("b", 2.5)], 1)
    save_to_redis_stream(rdd, 1000, redis_url, f"{redis_prefix}t", fields=["word", "n"])
    save_to_redis_stream(rdd, 1000, redis_url, f"{redis_prefix}f", fields=lambda r: {"k": r[0], "raw": b"\x01"})
    assert _entries(redis_client, f"{redis_prefix}t") == [("1000-0", {"word": "a", "n": "1"}),
                                                          ("1000-1", {"word": "b", "n": "2.5"})]
    assert [f["k"] for _, f in _entries(redis_client, f"{redis_prefix}f")] == ["a", "b"]


def test_a_record_that_is_not_a_mapping_fails_naming_the_batch_and_its_position(sc, redis_url, redis_prefix):
    rdd = sc.parallelize([{"a": 1}, "not a dict"], 1)
    with pytest.raises(Exception, match=r"batch 1000, partition 0, record 1: .*not a non-empty mapping"):
        save_to_redis_stream(rdd, 1000, redis_url, f"{redis_prefix}bad")


def test_a_refused_record_fails_naming_the_way_past_it(sc, redis_url, redis_prefix):
    rdd = sc.parallelize([{"a": 1}, {"a": "x" * 200}], 1)
    with pytest.raises(Exception, match=r"record 1: its entry is 201 bytes, larger than maxEntryBytes=100.*"
                                        r"onError='deadLetter'"):
        save_to_redis_stream(rdd, 1000, redis_url, f"{redis_prefix}big", max_entry_bytes=100)


def test_refused_records_go_once_to_the_dead_letter_stream_through_a_cut_write_and_reruns(
        sc, redis_url, redis_client, redis_prefix):
    """Issue 44: an entry too large and a value Redis cannot hold go to ``<key>:dead-letters`` with the ids they
    would have had, the rest of the batch to the key; a write cut after the dead letters and two re-runs add
    nothing twice."""
    from dstreams.redis.source import client

    key, dead_key = f"{redis_prefix}dl", f"{redis_prefix}dl:dead-letters"
    records = [{"i": 0}, {"i": 1, "blob": "x" * 500}, {"i": 2}, {"i": [3]}, {"i": 4}]
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([sc.parallelize(records, 2)]).saveToRedisStream(redis_url, key, onError="deadLetter",
                                                                        maxEntryBytes=100)
        ssc.start()
        run_batches(ssc, 1)
    assert [f["i"] for _, f in _entries(redis_client, key)] == ["0", "2", "4"]
    dead = _entries(redis_client, dead_key)
    assert [eid for eid, _ in dead] == ["1000-1", f"1000-{STRIDE + 1}"]  # the ids the records would have had
    assert [(f["output"], f["batch_ms"], f["part"], f["row"]) for _, f in dead] == [
        (f"saveToRedisStream({key})", "1000", "0", "1"), (f"saveToRedisStream({key})", "1000", "1", "1")]
    assert json.loads(dead[0][1]["record"]) == records[1]
    assert dead[0][1]["error"] == "ValueError: its entry is 506 bytes, larger than maxEntryBytes=100"
    assert json.loads(dead[1][1]["record"]) == {"i": [3]}
    assert dead[1][1]["error"].startswith("TypeError: field 'i' of the record")
    # a second batch cut after its dead letters were written, then re-run twice: each record once
    key2, dead2 = f"{redis_prefix}cut", f"{redis_prefix}cut:dead-letters"
    rdd = sc.parallelize(records, 2)
    encoded = rdd.mapPartitionsWithIndex(encode_partition(2000, None, 100, f"saveToRedisStream({key2})")).collect()
    assert write_chunk(client(redis_url), dead2, [(e[0], e[1]) for e in encoded if len(e) == 3], 2000) == (2, 0)
    assert save_to_redis_stream(rdd, 2000, redis_url, key2, max_entry_bytes=100, dead_letter_key=dead2) == 3
    assert save_to_redis_stream(rdd, 2000, redis_url, key2, max_entry_bytes=100, dead_letter_key=dead2) == 0
    assert [f["i"] for _, f in _entries(redis_client, key2)] == ["0", "2", "4"]
    assert len(_entries(redis_client, dead2)) == 2


def test_a_rerun_batch_adds_nothing(sc, redis_url, redis_client, redis_prefix):
    key = f"{redis_prefix}rerun"
    rdd = sc.parallelize([{"i": i} for i in range(7)], 3)
    assert save_to_redis_stream(rdd, 5000, redis_url, key, chunk_size=3) == 7
    before = _entries(redis_client, key)
    assert save_to_redis_stream(rdd, 5000, redis_url, key, chunk_size=3) == 0
    # after the next batch was written too (a driver that died before recording the batch complete)
    save_to_redis_stream(sc.parallelize([{"i": 99}], 1), 6000, redis_url, key)
    assert save_to_redis_stream(rdd, 5000, redis_url, key, chunk_size=2) == 0
    assert _entries(redis_client, key)[:7] == before and len(_entries(redis_client, key)) == 8


def test_a_write_cut_off_half_way_is_completed_without_duplicates(sc, redis_url, redis_client, redis_prefix):
    """Partition 0 and part of partition 1 of the batch written, then the driver died: the re-run adds the rest."""
    from dstreams.redis.source import client

    key = f"{redis_prefix}partial"
    rdd = sc.parallelize([{"i": i} for i in range(9)], 3)
    entries = rdd.mapPartitionsWithIndex(encode_partition(7000, None)).collect()
    first = list(_chunks(entries, 4))[0]  # partition 0 (3 records) and the first record of partition 1
    assert write_chunk(client(redis_url), key, first, 7000) == (4, 0)
    assert save_to_redis_stream(rdd, 7000, redis_url, key, chunk_size=2) == 5
    got = _entries(redis_client, key)
    assert [f["i"] for _, f in got] == [str(i) for i in range(9)]
    assert [eid for eid, _ in got] == [eid for eid, _ in entries]


def test_entries_of_another_writer_above_ours_are_reported_not_taken_as_written(sc, redis_url, redis_client,
                                                                                 redis_prefix):
    key = f"{redis_prefix}foreign"
    save_to_redis_stream(sc.parallelize([{"i": 1}], 1), 1000, redis_url, key)
    redis_client.xadd(key, {"someone": "else"})  # XADD *: the wall clock's id, far above batch 2000's
    rdd = sc.parallelize([{"i": 2}], 1)
    policy = RetryPolicy(total_seconds=0)
    with pytest.raises(RedisStreamConflictError, match=r"batch 2000 .*another writer"):
        save_to_redis_stream(rdd, 2000, redis_url, key, policy=policy)
    # a re-run of the batch written before the foreign entry is still recognised as written
    assert save_to_redis_stream(sc.parallelize([{"i": 1}], 1), 1000, redis_url, key, policy=policy) == 0


def test_our_ids_with_other_fields_are_reported(sc, redis_url, redis_client, redis_prefix):
    key = f"{redis_prefix}same-ids"
    redis_client.xadd(key, {"i": "other"}, id="4000-0")  # another job writing this key with the same scheme
    with pytest.raises(RedisStreamConflictError, match=r"entry 4000-0 of batch 4000 .*other fields"):
        save_to_redis_stream(sc.parallelize([{"i": 1}], 1), 4000, redis_url, key)


def test_a_fenced_driver_writes_nothing(sc, redis_url, redis_client, redis_prefix):
    class FencedError(Exception):
        pass

    def guard() -> None:
        raise FencedError("stale epoch")

    with pytest.raises(FencedError):
        save_to_redis_stream(sc.parallelize([{"i": 1}], 1), 1000, redis_url, f"{redis_prefix}fenced", guard=guard)
    assert redis_client.exists(f"{redis_prefix}fenced") == 0


def test_concurrent_batches_are_refused(sc, redis_url, redis_prefix):
    ssc = StreamingContext(sc, 1, clock=ManualClock(), concurrentBatches=2)
    with pytest.raises(ValueError, match="concurrentBatches is 2"):
        ssc.queueStream([]).saveToRedisStream(redis_url, f"{redis_prefix}x")


def test_one_job_reads_with_redis_stream_what_another_wrote(sc, redis_url, redis_client, redis_prefix):
    """Job 1 writes words to ``words``; job 2 reads them with ``redisStream``, counts them and writes the counts
    to ``counts`` with the sink: every word once, in batch order."""
    words, counts = f"{redis_prefix}words", f"{redis_prefix}counts"
    with manual_context(1, sc=sc) as ssc:
        lines = [["a b", "b"], ["c a"]]
        ssc.queueStream([sc.parallelize(b, 2) for b in lines]).flatMap(str.split).map(
            lambda w: {"word": w}).saveToRedisStream(redis_url, words)
        ssc.start()
        run_batches(ssc, 2)

    with manual_context(1, sc=sc) as ssc:
        stream = ssc.redisStream(words, url=redis_url, decoder=lambda k, i, f: f["word"])
        seen = collect(stream, sort=True)
        stream.map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b).saveToRedisStream(redis_url, counts,
                                                                                       fields=["word", "n"])
        ssc.start()
        infos = run_batches(ssc, 1)
    assert seen[1000] == ["a", "a", "b", "b", "c"]
    assert sorted((f["word"], f["n"]) for _, f in _entries(redis_client, counts)) == [("a", "2"), ("b", "2"),
                                                                                     ("c", "1")]
    assert [op.records_written for op in infos[0].output_operations.values()] == [None, 3]
