"""``DStream.saveToKafka`` against the real Kafka broker: one transaction per batch and output partition, with the
batch's ledger entry committed in it (issue 40, item 3).

Every check reads the topic as a ``read_committed`` consumer and compares with what a fault-free run writes: every
record once, nothing else, each key's records in order. Faults: a batch re-run, a task's Python worker SIGKILLed
inside its commit (before and after ``commit_transaction``), two copies of one task at once, a cached producer
fenced by another copy, a kept producer that saw the brokers go away, a ``send_offsets_to_transaction`` that never
returns, a zombie driver's epoch, the claim at start (a zombie's open transaction, a zombie re-initialising during
the claim), killed and paused driver processes and a zombie's task paused inside its commit
(tests/integration/kafka_sink_app.py), and bad input.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.faults import KILL, NO_FAULTS, TASK_KILL, Fault, FaultPlan
from dstreams.kafka import sink
from dstreams.kafka.params import KafkaConfigError
from dstreams.kafka.sink import (
    KafkaSinkError,
    KafkaSinkFencedError,
    default_serializer,
    make_target,
    save_to_kafka,
    write_partition,
)
from dstreams.testing import manual_context, run_batches

from ..kafka_support import create_topic, read_committed, values
from ..process_support import is_stopped, kill_group, stop_driver, tail, wait_for
from . import kafka_sink_app

pytestmark = pytest.mark.kafka

Record = tuple[str | None, str | None]


def _read(bootstrap: str, topic: str) -> list[Record]:
    """What a read_committed consumer sees, decoded, in partition and offset order."""
    return [(k.decode() if k is not None else None, v.decode() if v is not None else None)
            for _p, _o, k, v in read_committed(bootstrap, topic)]


def _assert_exactly(got: list[Record], expected: Iterable[Record]) -> None:
    """``got`` holds every expected record once and nothing else, and each key's values in the expected order."""
    expected = list(expected)
    dups = [r for r, n in Counter(got).items() if n > 1]
    assert not dups, f"{len(dups)} records written twice, e.g. {dups[:3]}"
    assert sorted(got, key=repr) == sorted(expected, key=repr), (
        f"missing {sorted(set(expected) - set(got), key=repr)[:5]}, "
        f"extra {sorted(set(got) - set(expected), key=repr)[:5]}")
    by_key_got: dict[str | None, list[str | None]] = defaultdict(list)
    by_key_expected: dict[str | None, list[str | None]] = defaultdict(list)
    for k, v in got:
        by_key_got[k].append(v)
    for k, v in expected:
        by_key_expected[k].append(v)
    assert by_key_got == by_key_expected, "a key's records are out of order"


def _batch(t: int, n: int) -> list[Record]:
    """``n`` records of batch ``t`` for ``parallelize(_, 2)``: the keys of the first half differ from the second's, so
    that each key lives in one Spark partition (its order is then defined)."""
    half = n // 2
    return [(f"{'a' if i < half else 'b'}{i % 3}", f"{t}:{i}") for i in range(n)]


def _params(bootstrap: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, **extra}


def _written(infos) -> list[list[int | None]]:
    return [[op.records_written for op in info.output_operations.values()] for info in infos]


def _run(sc, batches: list[list[Record]], save, between=None, check: bool = True) -> list:
    """Run ``batches`` through a context whose stream is written by ``save(stream)``; returns their BatchInfos.
    ``between(i)`` runs before batch ``i`` (1-based); ``check``: no output failed (``dstreams.testing.run_batches``)."""
    infos = []
    with manual_context(1, sc=sc) as ssc:
        save(ssc.queueStream([sc.parallelize(b, 2) for b in batches]))
        ssc.start()
        for i in range(1, len(batches) + 1):
            if between is not None:
                between(i)
            infos += run_batches(ssc, 1, timeout=120, check=check)
    return infos


# ------------------------------------------------------------------------------------------ fault-free runs


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_each_batch_is_written_once_in_key_order(sc, kafka_bootstrap, guarantee):
    topic = create_topic(kafka_bootstrap, partitions=3)
    batches = [_batch(1000, 300), [], _batch(3000, 7)]
    infos = _run(sc, batches, lambda s: s.saveToKafka(topic, _params(kafka_bootstrap), guarantee=guarantee))
    assert _written(infos) == [[300], [0], [7]]
    _assert_exactly(_read(kafka_bootstrap, topic), [r for b in batches for r in b])


def test_keys_values_and_serializers(sc, kafka_bootstrap):
    topic = create_topic(kafka_bootstrap)
    rdd = sc.parallelize([("k", "v"), ["l", b"\x00raw"], {"a": [1, 2.5, None]}, 7, None, ("x", 1, 2)], 1)
    target = make_target(topic, _params(kafka_bootstrap))
    assert save_to_kafka(rdd, 1000, target) == 6
    assert _read(kafka_bootstrap, topic) == [("k", "v"), ("l", "\x00raw"), (None, '{"a":[1,2.5,null]}'),
                                             (None, "7"), (None, None), (None, "[\"x\",1,2]")]
    topic2 = create_topic(kafka_bootstrap)
    target2 = make_target(topic2, _params(kafka_bootstrap), key_func=lambda r: r["id"], value_func=lambda r: r["n"],
                          value_serializer=lambda n: n.to_bytes(2, "big"))
    assert save_to_kafka(sc.parallelize([{"id": 5, "n": 258}], 1), 1000, target2) == 1
    ((_p, _o, key, value),) = read_committed(kafka_bootstrap, topic2)
    assert (key, value) == (b"5", b"\x01\x02")
    assert default_serializer(True) == b"true" and default_serializer(1.5) == b"1.5"


# ------------------------------------------------------------------------------------------ re-runs


def test_a_rerun_batch_writes_nothing_twice(sc, kafka_bootstrap):
    topic = create_topic(kafka_bootstrap, partitions=2)
    target = make_target(topic, _params(kafka_bootstrap))
    first, second = _batch(5000, 40), _batch(6000, 10)
    rdd = sc.parallelize(first, 2)
    assert save_to_kafka(rdd, 5000, target) == 40
    assert save_to_kafka(rdd, 5000, target) == 0
    assert save_to_kafka(sc.parallelize(second, 2), 6000, target) == 10
    assert save_to_kafka(rdd, 5000, target) == 0  # an earlier batch after a later one (the ledger is monotonic)
    _assert_exactly(_read(kafka_bootstrap, topic), first + second)
    # at least once: the re-run writes again (what the guarantee says)
    again = make_target(topic, _params(kafka_bootstrap), output="alo", guarantee="at-least-once")
    assert save_to_kafka(rdd, 5000, again) == 40
    assert save_to_kafka(rdd, 5000, again) == 40
    assert Counter(_read(kafka_bootstrap, topic))[first[0]] == 3


def test_a_retried_write_counts_the_partitions_an_earlier_attempt_committed(kafka_bootstrap):
    """The records-written count of a write is exact across its retries: a partition committed by an earlier attempt
    of the same write (same token) counts its records once; another write of the batch counts 0."""
    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap))
    recs = _batch(1000, 6)
    assert write_partition(target, 1000, 0, recs, token="w1") == (6, False)
    assert write_partition(target, 1000, 0, recs, token="w1") == (6, True)
    assert write_partition(target, 1000, 0, recs, token="w2") == (0, True)
    assert write_partition(target, 1000, 1, [], token="w1") == (0, False)  # an empty partition: no transaction
    _assert_exactly(_read(kafka_bootstrap, topic), recs)


# ------------------------------------------------------------------------------------------ task faults


def _arm(fault_plan, tmp_path, point: str):
    marker = tmp_path / f"kill-{point}"
    marker.write_text(f"the first task to reach {point} removes this file and kills its Python worker\n")
    fault_plan(FaultPlan(tasks=(Fault(point, KILL, marker=str(marker)),)))
    return marker


@pytest.mark.slow
def test_a_worker_killed_inside_its_commit_loses_and_duplicates_nothing(sc, kafka_bootstrap, fault_plan, tmp_path):
    """Batch 1: a task's Python worker is SIGKILLed with its records and ledger offset in the open transaction
    (``kafka-before-commit``); batch 2: right after its commit (``kafka-after-commit``). The batch's retry writes the
    first again (its ``init_transactions`` aborted the dead worker's transaction at once: the transaction timeout is
    2 min, and the records behind it are read without waiting), skips the second's committed partition, and counts
    every record once; what a read_committed consumer sees equals a fault-free run."""
    topic = create_topic(kafka_bootstrap, partitions=2)
    batches = [_batch(t, 200) for t in (1000, 2000, 3000)]
    markers = {}

    def between(i: int) -> None:
        if i > 1:
            assert not markers[i - 1].exists(), f"no task of batch {i - 1} reached its kill point"
        fault_plan(NO_FAULTS)
        if i <= 2:
            markers[i] = _arm(fault_plan, tmp_path, ["kafka-before-commit", "kafka-after-commit"][i - 1])

    params = _params(kafka_bootstrap, **{"transaction.timeout.ms": 120_000})
    started = time.monotonic()
    infos = _run(sc, batches, lambda s: s.saveToKafka(topic, params), between=between, check=False)  # tried again
    fault_plan(NO_FAULTS)
    assert [info.attempts for info in infos[:2]] == [2, 2], "each killed batch was tried again"
    assert _written(infos) == [[200], [200], [200]]
    _assert_exactly(_read(kafka_bootstrap, topic), [r for b in batches for r in b])
    assert time.monotonic() - started < 100, "an aborted transaction waited for its timeout"


_COPY = """
import json, os, sys, time
from dstreams.kafka.sink import make_target, write_partition
bootstrap, topic, copy, batch_ms, go = sys.argv[1:6]
target = make_target(topic, {"bootstrap.servers": bootstrap})
records = [(f"k{i % 5}", f"{batch_ms}:{copy}{i}") for i in range(20_000)]
open(go + "." + copy, "w").close()  # ready
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("no go signal within 60 s")
    time.sleep(0.001)
try:
    print("RESULT " + json.dumps(list(write_partition(target, int(batch_ms), 0, records, epoch=1, token=copy))))
except Exception as e:
    print("RESULT " + json.dumps(f"{type(e).__name__}: {e}"))
"""


def test_two_copies_of_a_task_at_once_make_one_copy_visible(kafka_bootstrap, tmp_path):
    """A speculative copy: two processes (as two Python workers) write the same batch and partition at the same moment,
    with distinguishable records, two batches in a row: each batch shows the records of exactly one copy, once. The
    other copy returns 0 (fenced, it found the batch written), or fails after being fenced twice (Spark then keeps the
    winner's result)."""
    topic = create_topic(kafka_bootstrap, partitions=2)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    expected: list[Record] = []
    for batch_ms in (1000, 2000):
        go = tmp_path / f"go-{batch_ms}"
        procs = {c: subprocess.Popen([sys.executable, "-c", _COPY, kafka_bootstrap, topic, c, str(batch_ms), str(go)],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                 for c in "ab"}
        try:
            deadline = time.monotonic() + 60
            while not all(os.path.exists(f"{go}.{c}") for c in procs):  # both ready, waiting for the signal
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs.values()), "a copy failed"
                time.sleep(0.01)
            go.write_text("go")
            outs = {c: p.communicate(timeout=120)[0] for c, p in procs.items()}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait(30)
        results = {c: json.loads(out.split("RESULT ", 1)[1]) for c, out in outs.items()}
        batch = [r for r in _read(kafka_bootstrap, topic) if r[1].startswith(f"{batch_ms}:")]
        assert batch, results
        winner = batch[0][1].split(":")[1][0]
        loser = "b" if winner == "a" else "a"
        assert results[winner] == [20_000, False], results
        assert results[loser] == [0, True] or "another copy of this task" in str(results[loser]), results
        expected += [(f"k{i % 5}", f"{batch_ms}:{winner}{i}") for i in range(20_000)]
    _assert_exactly(_read(kafka_bootstrap, topic), expected)


def test_a_cached_producer_fenced_by_another_copy_retries_with_a_new_one(kafka_bootstrap):
    """Another executor's copy of partition 0 (here: a producer of the same transactional id) fences this process's
    cached producer; the next batch fails in its first transactional call, retries once with a new producer and
    writes: nothing lost, nothing twice."""
    from confluent_kafka import Producer

    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap))
    one, two = _batch(1000, 10), _batch(2000, 10)
    assert write_partition(target, 1000, 0, one) == (10, False)  # the producer is cached
    other = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": target.transactional_id(0)})
    other.init_transactions(30)  # fences the cached producer
    assert write_partition(target, 2000, 0, two) == (10, False)
    _assert_exactly(_read(kafka_bootstrap, topic), one + two)


def _kept(target, partition: int):
    """This process's kept clients for ``target``'s output partition (the sink's cache; the same object across
    writes, whatever producer it holds)."""
    from dstreams.kafka import sink

    tid = target.transactional_id(partition)
    (clients,) = [c for c in sink._clients.values() if c.conf.get("transactional.id") == tid]
    return clients


def test_a_kept_producer_that_saw_the_brokers_go_away_is_replaced(kafka_bootstrap):
    """After an outage of every broker (a restart), a kept producer would send its next ledger entry to the group
    coordinator it knew, a broker object librdkafka dropped when it re-bootstrapped, and wait for it forever
    (confluentinc/librdkafka#5511): a kept producer that reported a broker error since its last ledger entry is
    replaced before it writes again. The outage's error event is injected here (tests/fault/test_kafka_broker_restart.py
    restarts the broker)."""
    from confluent_kafka import KafkaError

    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap))
    one, two, three = _batch(1000, 10), _batch(2000, 10), _batch(3000, 10)
    assert write_partition(target, 1000, 0, one) == (10, False)
    kept = _kept(target, 0)
    first = kept.instance
    kept.broker_errors.append(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert write_partition(target, 2000, 0, two) == (10, False)
    second = kept.instance
    assert second != first  # a new producer wrote batch 2000
    assert write_partition(target, 3000, 0, three) == (10, False)
    assert kept.instance == second  # no error since its ledger entry: kept
    _assert_exactly(_read(kafka_bootstrap, topic), one + two + three)


class _StuckProducer:
    """A producer whose ``send_offsets_to_transaction`` does not return until ``release`` is set (librdkafka does not
    always keep that call's timeout: confluentinc/librdkafka#5456); everything else goes to the real one."""

    def __init__(self, producer, release: threading.Event):
        self._producer, self._release = producer, release

    def send_offsets_to_transaction(self, *_args):
        self._release.wait(120)
        raise RuntimeError("released by the test")

    def __getattr__(self, name):
        return getattr(self._producer, name)


def test_a_send_offsets_that_never_returns_is_given_up_and_retried_with_a_new_producer(kafka_bootstrap, monkeypatch):
    """The ledger entry's call is bounded (its timeout plus SEND_OFFSETS_GRACE_S): the stuck producer is given up, a
    new one fences it (its open transaction, with the batch's records, is aborted) and writes the batch once."""
    from dstreams.kafka import sink

    monkeypatch.setattr(sink, "SEND_OFFSETS_GRACE_S", 0.5)
    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap, **{"transaction.timeout.ms": 3000}))
    one, two = _batch(1000, 10), _batch(2000, 10)
    assert write_partition(target, 1000, 0, one) == (10, False)
    kept = _kept(target, 0)
    release = threading.Event()
    kept.producer = _StuckProducer(kept.producer, release)
    try:
        started = time.monotonic()
        assert write_partition(target, 2000, 0, two) == (10, False)
        assert 3.5 <= time.monotonic() - started < 20
        assert kept.producer is not None and not isinstance(kept.producer, _StuckProducer)
    finally:
        release.set()  # the helper thread returns and drops the given-up producer
    _assert_exactly(_read(kafka_bootstrap, topic), one + two)


def test_a_task_of_a_zombie_driver_is_fenced_by_the_ledger_epoch(kafka_bootstrap):
    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap))
    assert write_partition(target, 1000, 0, _batch(1000, 4), epoch=2) == (4, False)
    with pytest.raises(KafkaSinkFencedError, match=r"newer driver \(epoch 2\).*this one \(epoch 1\)"):
        write_partition(target, 2000, 0, _batch(2000, 4), epoch=1)
    assert write_partition(target, 2000, 0, _batch(2000, 4), epoch=3) == (4, False)
    _assert_exactly(_read(kafka_bootstrap, topic), _batch(1000, 4) + _batch(2000, 4))


def _ledger_entries(bootstrap: str, target, partitions: Iterable[int], stable: bool = True
                    ) -> dict[int, tuple[int, dict]]:
    """The ledger entry (batch, metadata) of each output partition, as a read_committed consumer sees it (it waits
    out a pending transactional offset commit: KIP-447); ``stable=False``: the entry committed now, without waiting
    (a paused task's open transaction holds one pending)."""
    from confluent_kafka import Consumer, TopicPartition

    entries = {}
    for p in partitions:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": target.ledger_group(p), "enable.auto.commit": False,
                      "isolation.level": "read_committed" if stable else "read_uncommitted"})
        try:
            (tp,) = c.committed([TopicPartition(target.ledger_topic, 0)], timeout=30)
        finally:
            c.close()
        entries[p] = (tp.offset, json.loads(tp.metadata) if tp.metadata else {})
    return entries


def _open_transaction(target, partition: int, batch_ms: int, records: list[Record], epoch: int):
    """A zombie driver's task paused at ``kafka-before-commit``: its producer with the partition's records and
    ledger offset in an open transaction."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    conf, consumer_conf = sink._exactly_once_confs(target, partition)
    producer = Producer(conf)
    producer.init_transactions(30)
    consumer = Consumer(consumer_conf)
    producer.begin_transaction()
    for k, v in records:
        producer.produce(target.topic, v.encode(), k.encode())
    meta = json.dumps({"epoch": epoch, "token": "zombie", "records": len(records), "producer": "zombie"})
    producer.send_offsets_to_transaction([TopicPartition(target.ledger_topic, 0, batch_ms, meta)],
                                         consumer.consumer_group_metadata(), 30)
    assert producer.flush(30) == 0
    consumer.close()
    return producer


def test_the_claim_at_start_fences_a_zombies_open_transaction_and_raises_the_ledger_epoch(kafka_bootstrap):
    """The claim (issue 42): the zombie's producer (its batch's records and ledger offset in an open transaction)
    is fenced and its transaction aborted; each ledger entry is the same batch under the new epoch; the zombie's
    re-initialised task then finds the higher epoch; the new owner writes the batch once."""
    topic = create_topic(kafka_bootstrap, partitions=2)
    target = make_target(topic, _params(kafka_bootstrap))
    assert sink.claim_at_start(target, 1) == {}  # no ledger group yet: nothing to claim
    for p in (0, 1):
        assert write_partition(target, 1000, p, _batch(1000 + p, 4), epoch=1, token="t1") == (4, False)
    zombie = _open_transaction(target, 0, 2000, _batch(2000, 4), epoch=1)
    assert sink.claim_at_start(target, 2) == {0: 1000, 1: 1000}
    with pytest.raises(Exception) as fenced:
        zombie.commit_transaction(30)
    assert sink._fenced(fenced.value), fenced.value
    entries = _ledger_entries(kafka_bootstrap, target, (0, 1))
    for p in (0, 1):
        batch, meta = entries[p]
        assert batch == 1000 and meta["epoch"] == 2 and meta["claim"] is True, entries
        assert meta["token"] == "t1" and meta["records"] == 4, entries  # the batch's write, restated
    with pytest.raises(KafkaSinkFencedError, match=r"newer driver \(epoch 2\).*this one \(epoch 1\)"):
        write_partition(target, 2000, 0, _batch(2000, 4), epoch=1)
    assert write_partition(target, 2000, 0, _batch(2000, 4), epoch=2) == (4, False)
    _assert_exactly(_read(kafka_bootstrap, topic), _batch(1000, 4) + _batch(1001, 4) + _batch(2000, 4))
    with pytest.raises(KafkaSinkFencedError, match=r"newer driver \(epoch 2\).*this one \(epoch 1\)"):
        sink.claim_at_start(target, 1)  # a driver of an older epoch that starts late
    assert sink.claim_at_start(make_target(topic, _params(kafka_bootstrap), guarantee="at-least-once"), 3) == {}


def test_a_claim_fenced_by_a_zombie_re_initialising_is_tried_again_then_fails_clearly(kafka_bootstrap, monkeypatch):
    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap))
    assert write_partition(target, 1000, 0, _batch(1000, 4), epoch=1) == (4, False)
    monkeypatch.setattr(sink, "FENCED_BACKOFF_S", (0.0, 0.01))
    from confluent_kafka import Producer

    read_ledger = sink._ledger
    fences = {"left": 2, "done": 0}
    zombies = []

    def fenced_meanwhile(clients, target_, timeout_s):
        """Between the claim's init_transactions and its commit, a zombie's task takes the id over."""
        if fences["left"] > 0:
            fences["left"] -= 1
            fences["done"] += 1
            zombie = Producer(sink._exactly_once_confs(target, 0)[0])
            zombie.init_transactions(30)
            zombies.append(zombie)
        return read_ledger(clients, target_, timeout_s)

    monkeypatch.setattr(sink, "_ledger", fenced_meanwhile)
    assert sink.claim_at_start(target, 2) == {0: 1000}
    assert fences["done"] == 2
    assert _ledger_entries(kafka_bootstrap, target, (0,))[0][1]["epoch"] == 2
    fences["left"] = sink.CLAIM_ATTEMPTS
    with pytest.raises(KafkaSinkError, match=rf"fenced the claim {sink.CLAIM_ATTEMPTS} times.*stop it"):
        sink.claim_at_start(target, 3)
    assert _ledger_entries(kafka_bootstrap, target, (0,))[0][1]["epoch"] == 2  # nothing claimed for epoch 3
    _assert_exactly(_read(kafka_bootstrap, topic), _batch(1000, 4))


# ------------------------------------------------------------------------------------------ bad input


def test_a_missing_topic_fails_the_first_batch_naming_it(sc, kafka_bootstrap):
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    target = make_target(topic, _params(kafka_bootstrap))
    with pytest.raises(KafkaSinkError, match=rf"the topic '{topic}' does not exist .*create it first.*--topic {topic}"):
        save_to_kafka(sc.parallelize([1], 1), 1000, target)


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_a_topic_deleted_after_the_check_fails_the_task_naming_it(kafka_bootstrap, guarantee):
    """The driver checked the topic at the first batch; a task finds it gone: the records are not delivered (after
    the producer's timeout) and the error names the topic and how to create it; nothing is committed."""
    topic = f"gone-{uuid.uuid4().hex[:8]}"
    params = _params(kafka_bootstrap, **{"transaction.timeout.ms": 3000, "message.timeout.ms": 3000})
    target = make_target(topic, params, guarantee=guarantee)
    with pytest.raises(KafkaSinkError, match=rf"batch 1000, partition 0: .*the topic '{topic}' does not exist"):
        write_partition(target, 1000, 0, [("k", "v")])


def test_an_unserializable_record_fails_naming_batch_partition_and_record(sc, kafka_bootstrap):
    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap))
    rdd = sc.parallelize([("k", "ok"), ("k", object())], 1)
    with pytest.raises(Exception, match=r"batch 1000, partition 0, record 1: the value <object .*pass valueSerializer"):
        save_to_kafka(rdd, 1000, target)
    with pytest.raises(TypeError, match=r"record 0: keySerializer returned a int"):
        write_partition(make_target(topic, _params(kafka_bootstrap), key_serializer=len), 1000, 0, [("ab", "v")])
    assert read_committed(kafka_bootstrap, topic) == []  # the partition's transaction never began


def test_a_record_too_large_fails_naming_it_and_nothing_of_its_partition_is_visible(kafka_bootstrap):
    topic = create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap))
    recs = [("k", "small"), ("k", "x" * 2_000_000)]
    with pytest.raises(KafkaSinkError, match=r"batch 1000, partition 0, record 1: .*too large.*2000001 bytes.*message"
                                             r"\.max\.bytes"):
        write_partition(target, 1000, 0, recs)
    assert read_committed(kafka_bootstrap, topic) == []
    assert write_partition(target, 1000, 0, recs[:1]) == (1, False)  # the producer is still usable


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_refused_records_go_to_the_dead_letter_topic_once_and_the_rest_is_written(sc, kafka_bootstrap, guarantee):
    """Issue 44: an unserializable and a too-large record go, in the partition's transaction, to the dead-letter
    topic; the other records to the output; a re-run of the batch writes neither twice (exactly once)."""
    topic, dlq = create_topic(kafka_bootstrap), create_topic(kafka_bootstrap)
    target = make_target(topic, _params(kafka_bootstrap), guarantee=guarantee, dead_letter_topic=dlq)
    recs = [("k", "small"), ("k", object()), ("k", "x" * 2_000_000), ("k", "last")]
    assert write_partition(target, 1000, 0, recs)[0] == 2
    if guarantee == "exactly-once":
        assert write_partition(target, 1000, 0, recs) == (0, True)  # a re-run: already written
    assert values(read_committed(kafka_bootstrap, topic)) == ["small", "last"]
    dead = [json.loads(r[3]) for r in read_committed(kafka_bootstrap, dlq)]
    assert [(d["output"], d["batch_ms"], d["part"], d["row"]) for d in dead] == [(topic, 1000, 0, 1),
                                                                                  (topic, 1000, 0, 2)]
    assert dead[0]["record"].startswith("('k', <object object") and "pass valueSerializer" in dead[0]["error"]
    assert "too large" in dead[1]["error"].lower() and dead[1]["record"].startswith("<2000001 bytes; key b'k'")


def test_the_dead_letter_way_out_is_named_and_its_topic_must_exist(sc, kafka_bootstrap):
    topic = create_topic(kafka_bootstrap)
    with pytest.raises(KafkaSinkError, match=r"record 1: .*too large.*onError='deadLetter', deadLetterTopic"):
        write_partition(make_target(topic, _params(kafka_bootstrap)), 1000, 0, [("k", "a"), ("k", "x" * 2_000_000)])
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(KafkaSinkError, match=rf"the dead-letter topic '{missing}' does not exist.*create it"):
        save_to_kafka(sc.parallelize([1], 1), 1000, make_target(topic, _params(kafka_bootstrap),
                                                               dead_letter_topic=missing))
    with manual_context(1, sc=sc) as ssc:
        with pytest.raises(ValueError, match="deadLetterTopic must be a topic name other than"):
            ssc.queueStream([]).saveToKafka(topic, _params(kafka_bootstrap), onError="deadLetter",
                                            deadLetterTopic=topic)


def test_brokers_that_do_not_answer_fail_with_a_clear_message(sc):
    """On the driver (the topic check before the first batch) and in a task (brokers gone after it)."""
    dead = {"bootstrap.servers": "127.0.0.1:9", "transaction.timeout.ms": 2000}
    target = make_target("t", dead)
    with pytest.raises(KafkaSinkError, match=r"the Kafka brokers at 127.0.0.1:9 did not answer within 2 s"):
        save_to_kafka(sc.parallelize([1], 1), 1000, target)
    with pytest.raises(KafkaSinkError, match=r"the Kafka brokers at 127.0.0.1:9 did not answer \(init_transactions"):
        write_partition(target, 1000, 0, [("k", "v")])


def test_bad_arguments_are_refused_when_the_output_is_defined(sc, kafka_bootstrap):
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.queueStream([])
        with pytest.raises(ValueError, match="guarantee must be one of"):
            stream.saveToKafka("t", _params(kafka_bootstrap), guarantee="exactly_once")
        with pytest.raises(KafkaConfigError, match="needs the brokers"):
            stream.saveToKafka("t", {})
        with pytest.raises(ValueError, match="valueSerializer must be a function"):
            stream.saveToKafka("t", _params(kafka_bootstrap), valueSerializer="utf-8")
    concurrent = StreamingContext(sc, 1, clock=ManualClock(), concurrentBatches=2)
    with pytest.raises(ValueError, match="concurrentBatches is 2"):
        concurrent.queueStream([]).saveToKafka("t", _params(kafka_bootstrap))
    concurrent.queueStream([]).saveToKafka("t", _params(kafka_bootstrap), guarantee="at-least-once")


# ------------------------------------------------------------------------------------------ driver processes

APP = os.path.join(os.path.dirname(__file__), "kafka_sink_app.py")


def _app_expected(times: Iterable[int]) -> list[Record]:
    return [r for t in times for p in range(kafka_sink_app.PARTITIONS)
            for r in kafka_sink_app.records(7, t, p, kafka_sink_app.PER_PARTITION)]


def _assert_app_output(bootstrap: str, topic: str) -> list[int]:
    """The topic holds the app's records of a contiguous run of batches, each whole, once, in key order; returns
    the batch times."""
    got = _read(bootstrap, topic)
    times = sorted({int(v.split(":")[0]) for _k, v in got})
    assert times and times == list(range(times[0], times[-1] + 1000, 1000)), f"batches missing: {times}"
    _assert_exactly(got, _app_expected(times))
    return times


def _driver_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DSTREAMS_FAULT_") and k != "KAFKA_SINK_APP_DIE_WITH"}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, **extra)
    return env


def _start(tmp_path, bootstrap: str, topic: str, log_name: str, **env: str) -> tuple[subprocess.Popen, str]:
    log_path = str(tmp_path / log_name)
    log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, APP, bootstrap, topic, str(tmp_path / "ckpt")], env=_driver_env(**env),
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True)
    return proc, log_path


def _batches_visible(bootstrap: str, topic: str) -> int:
    """How many batches' worth of records a read_committed consumer sees (offsets also count transaction markers)."""
    return len(read_committed(bootstrap, topic)) // (kafka_sink_app.PER_PARTITION * kafka_sink_app.PARTITIONS)


def _caught_up(bootstrap: str, topic: str) -> bool:
    """The newest batch visible is within 3 s of the wall clock (the driver's batch times): a driver that ran the
    batches missed while none ran; stopped gracefully now, it leaves no batch half-written."""
    times = [int(v.split(":")[0]) for _k, v in _read(bootstrap, topic)]
    return bool(times) and max(times) >= time.time() * 1000 - 3000


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(600)
def test_killed_and_zombie_drivers_write_every_record_once(tmp_path, kafka_bootstrap):
    """Four drivers on one checkpoint (one test covering several faults):

    1. dies (SIGKILL) as soon as a task of its has its records and ledger offset in an open transaction
       (``kafka-before-commit``; the task's Python worker is killed too: the transaction is left open);
    2. dies as soon as a task committed (``kafka-after-commit``; the rest of the batch not written);
    3. stops itself (SIGSTOP) in the sink of its third batch, after its fence check: a zombie in the making;
    4. takes over (epoch 4) and writes; then the third resumes: its tasks fence the owner's producers but find a newer
       epoch in the ledger and write nothing, and it stops on the fence. The owner goes on (its fenced producers
       replaced), catches up and is stopped gracefully.

    The topic holds every batch that ran, each record once, in key order, with no batch missing."""
    topic = create_topic(kafka_bootstrap, partitions=3)
    procs: list[subprocess.Popen] = []
    try:
        for i, point in enumerate(["kafka-before-commit", "kafka-after-commit"]):
            marker = tmp_path / f"kill-{i}"
            marker.write_text("removed by the task that reaches the kill point\n")
            proc, log_path = _start(tmp_path, kafka_bootstrap, topic, f"driver{i}.log",
                                    **{TASK_KILL: f"{point}:{marker}", "KAFKA_SINK_APP_DIE_WITH": str(marker)})
            procs.append(proc)
            try:
                proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                pytest.fail(f"driver {i} did not die at {point}:\n{tail(log_path)}")
            assert proc.returncode == -signal.SIGKILL and "KILLING THE DRIVER" in tail(log_path), tail(log_path)
            kill_group(proc)  # its JVM and Python workers
        zombie, zlog = _start(tmp_path, kafka_bootstrap, topic, "zombie.log", DSTREAMS_FAULT_PAUSE="sink-write",
                              DSTREAMS_FAULT_PAUSE_AFTER="3")
        procs.append(zombie)
        wait_for(lambda: "SIGSTOP at sink-write #3" in tail(zlog), 240, "the zombie to stop in its sink", zombie, zlog)
        owner, olog = _start(tmp_path, kafka_bootstrap, topic, "owner.log")
        procs.append(owner)
        seen = _batches_visible(kafka_bootstrap, topic)
        wait_for(lambda: _batches_visible(kafka_bootstrap, topic) >= seen + 3, 240, "the owner to write", owner, olog)
        os.killpg(zombie.pid, signal.SIGCONT)
        try:
            zombie.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("the zombie did not stop after it resumed:\n" + tail(zlog))
        assert "Fenced" in tail(zlog, 200_000), tail(zlog)
        seen = _batches_visible(kafka_bootstrap, topic)
        wait_for(lambda: _batches_visible(kafka_bootstrap, topic) >= seen + 2 and _caught_up(kafka_bootstrap, topic),
                 240, "the owner to go on and catch up", owner, olog)
        stop_driver(owner)
        assert owner.returncode == 0, tail(olog)
    finally:
        for p in procs:
            kill_group(p)
    times = _assert_app_output(kafka_bootstrap, topic)
    assert len(times) >= 8


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(600)
def test_a_new_driver_claims_the_output_at_start_so_a_paused_zombie_task_cannot_commit(tmp_path, kafka_bootstrap):
    """Issue 42 item 4: the fence holds from the moment a new driver takes its epoch, before its first batch.

    1. a driver (the zombie) writes a few batches; then a task of its stops (SIGSTOP) at ``kafka-before-commit``:
       its batch's records and ledger offset are in an open transaction; the whole driver is then stopped;
    2. a new driver starts on the checkpoint and stops itself in its first batch's sink (``sink-write``): its start,
       with the claim, is done, none of its tasks ran. Every ledger entry is now the same batch under its epoch;
    3. the zombie resumes: its task's commit fails (fenced), its re-initialised producer finds the higher epoch in the
       ledger, and it stops. No ledger entry of the zombie's epoch appears after the claim;
    4. the new driver resumes, catches up and stops gracefully: every record once (read_committed), no batch
       missing."""
    topic = create_topic(kafka_bootstrap, partitions=2)
    target = make_target(topic, _params(kafka_bootstrap), output=f"{topic}@{tmp_path / 'ckpt'}")
    parts = range(kafka_sink_app.PARTITIONS)
    marker = str(tmp_path / "pause-task")
    procs: list[subprocess.Popen] = []
    try:
        zombie, zlog = _start(tmp_path, kafka_bootstrap, topic, "zombie.log",
                              DSTREAMS_FAULT_TASK_PAUSE=f"kafka-before-commit:{marker}")
        procs.append(zombie)
        wait_for(lambda: _batches_visible(kafka_bootstrap, topic) >= 2, 240, "the zombie to write", zombie, zlog)
        with open(marker, "w") as f:  # arms the pause: the next task at kafka-before-commit stops
            f.write("removed by the task that pauses\n")
        paused = wait_for(lambda: os.path.exists(marker + ".paused") and open(marker + ".paused").read(), 120,
                          "a task of the zombie to pause in its commit", zombie, zlog)
        worker = int(paused)
        wait_for(lambda: is_stopped(worker), 30, "the paused task's process to stop", zombie, zlog, step=0.1)
        os.killpg(zombie.pid, signal.SIGSTOP)  # the whole zombie (driver, JVM, workers) pauses
        wait_for(lambda: is_stopped(zombie.pid), 30, "the zombie driver to stop", zombie, zlog, step=0.1)
        before = _ledger_entries(kafka_bootstrap, target, parts, stable=False)
        z_epochs = {meta.get("epoch") for _batch_ms, meta in before.values()}
        assert len(z_epochs) == 1 and all(b > 0 for b, _m in before.values()), before
        (z_epoch,) = z_epochs

        owner, olog = _start(tmp_path, kafka_bootstrap, topic, "owner.log", DSTREAMS_FAULT_PAUSE="sink-write")
        procs.append(owner)
        wait_for(lambda: "SIGSTOP at sink-write #1" in tail(olog), 240, "the new driver to start and reach its sink",
                 owner, olog)
        claimed = _ledger_entries(kafka_bootstrap, target, parts, stable=False)

        os.killpg(zombie.pid, signal.SIGCONT)
        os.kill(worker, signal.SIGCONT)
        try:
            zombie.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("the zombie did not stop after it resumed:\n" + tail(zlog))
        after = _ledger_entries(kafka_bootstrap, target, parts)
        written = {p: (b, m.get("epoch")) for p, (b, m) in after.items()
                   if m.get("epoch") == z_epoch and (b, m) != before[p]}
        assert not written, (f"the zombie (epoch {z_epoch}) committed after the new driver started: {written} "
                             f"(ledger before: {before}; at the new driver's first batch: {claimed})")
        owner_epoch = claimed[0][1].get("epoch")
        assert isinstance(owner_epoch, int) and owner_epoch > z_epoch, (before, claimed)
        assert all(m.get("claim") and m.get("epoch") == owner_epoch and b == before[p][0]
                   for p, (b, m) in claimed.items()), (before, claimed)  # the same batches, under the new epoch
        assert after == claimed, (claimed, after)
        zombie_log = tail(zlog, 400_000)
        assert "Failed to end transaction" in zombie_log and "fenced" in zombie_log, zombie_log  # its commit
        # It stops as fenced, by whichever check comes first: its task's re-initialised producer finds the newer epoch
        # in the ledger, or its driver's metadata log finds the newer driver (both are a FencedError of the new epoch).
        assert (f"a newer driver (epoch {owner_epoch})" in zombie_log
                or f"replaced by another driver (now epoch {owner_epoch}" in zombie_log), zombie_log
        assert "DRIVER FAILED: " in zombie_log and "Fenced" in zombie_log.split("DRIVER FAILED: ", 1)[1], zombie_log

        os.kill(owner.pid, signal.SIGCONT)
        seen = _batches_visible(kafka_bootstrap, topic)
        wait_for(lambda: _batches_visible(kafka_bootstrap, topic) >= seen + 2 and _caught_up(kafka_bootstrap, topic),
                 240, "the new driver to go on and catch up", owner, olog)
        stop_driver(owner)
        assert owner.returncode == 0, tail(olog)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGCONT)  # a stopped process group takes its SIGKILL all the same; to be sure
            except ProcessLookupError:
                pass
            kill_group(p)
    assert all(m.get("epoch") == owner_epoch for _b, m in _ledger_entries(kafka_bootstrap, target, parts).values())
    _assert_app_output(kafka_bootstrap, topic)
