"""The tests' Kafka broker (scripts/services.sh start kafka): it answers, runs transactions that a read_committed
consumer sees only once committed, and keeps its data across `scripts/services.sh restart kafka` (the broker restart
that later tests use as a fault). Every wait here is bounded."""

from __future__ import annotations

import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import kafka_is_external

ROOT = Path(__file__).resolve().parents[2]


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 3000})


@pytest.fixture
def new_topic(kafka_bootstrap: str) -> Iterator:
    """``new_topic(partitions=1)`` creates a topic of a unique name and returns it; the test's topics are deleted
    afterwards (the broker does not create topics on demand: auto.create.topics.enable=false)."""
    from confluent_kafka.admin import NewTopic

    created: list[str] = []
    admin = _admin(kafka_bootstrap)  # kept: a future of a client that was garbage-collected fails (_DESTROY)

    def create(partitions: int = 1) -> str:
        name = f"dstreams-test-{uuid.uuid4().hex[:12]}"
        futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
        futures[name].result(timeout=60)
        created.append(name)
        return name

    yield create
    if created:
        try:
            for future in admin.delete_topics(created, operation_timeout=30).values():
                future.result(timeout=60)
        except Exception as e:  # the broker may be down after a failed restart test: nothing to fail it for
            warnings.warn(f"could not delete the test topics {created}: {e}", stacklevel=1)


def _read_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0) -> list[bytes]:
    """Every record of partition 0 of ``topic`` a read_committed consumer sees, read from the beginning until the
    end (the last stable offset) once at least ``expected`` records arrived, or ``timeout_s`` passed."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"dstreams-test-{uuid.uuid4().hex[:8]}",  # never joined: assign() reads without a group
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    })
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and len(values) >= expected:
                    break
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consumer error on {topic}: {msg.error()}")
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_broker_answers(kafka_bootstrap: str) -> None:
    metadata = _admin(kafka_bootstrap).list_topics(timeout=10)
    assert len(metadata.brokers) == 1, metadata.brokers
    assert metadata.cluster_id


def test_transaction_commits_and_aborts(kafka_bootstrap: str, new_topic) -> None:
    from confluent_kafka import Producer

    topic = new_topic()
    producer = Producer({
        "bootstrap.servers": kafka_bootstrap,
        "transactional.id": f"dstreams-test-{uuid.uuid4().hex[:12]}",
        "transaction.timeout.ms": 60000,
    })
    t = time.monotonic()
    producer.init_transactions(60)
    init_s = time.monotonic() - t
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"committed-{i}".encode(), partition=0)
    producer.commit_transaction(60)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"aborted-{i}".encode(), partition=0)
    producer.flush(30)  # the aborted records reach the log: the reader must skip them
    producer.abort_transaction(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed-last", partition=0)
    producer.commit_transaction(60)

    values = _read_all(kafka_bootstrap, topic, expected=11)
    assert values == [f"committed-{i}".encode() for i in range(10)] + [b"committed-last"]
    assert init_s < 30, f"init_transactions took {init_s:.1f} s"


@pytest.mark.serial  # the shared broker restarts
@pytest.mark.skipif(kafka_is_external(), reason="DSTREAMS_TEST_KAFKA_BOOTSTRAP names a broker not restarted here")
def test_restart_keeps_data(kafka_bootstrap: str, new_topic) -> None:
    from confluent_kafka import Producer

    topic = new_topic()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(100):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0, "records not delivered within 30 s"

    t = time.monotonic()
    result = subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "restart", "kafka"], cwd=ROOT,
                            capture_output=True, text=True, timeout=240)
    restart_s = time.monotonic() - t
    assert result.returncode == 0, f"restart failed:\n{result.stdout}\n{result.stderr}"
    assert "kafka: 127.0.0.1:" in result.stdout, result.stdout + result.stderr

    assert topic in _admin(kafka_bootstrap).list_topics(timeout=10).topics
    assert _read_all(kafka_bootstrap, topic, expected=100) == [f"v{i}".encode() for i in range(100)]
    assert restart_s < 120, f"restart took {restart_s:.1f} s"
