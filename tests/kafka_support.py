"""Kafka helpers for the tests: unique topics on the project's broker, producing test records, and reading back
what a ``read_committed`` consumer sees (the exactly-once checks compare that with a fault-free run).

Every call is bounded by a timeout. The broker is ``tests.support.KAFKA_BOOTSTRAP`` (``scripts/services.sh start
kafka``); a test gets it from the ``kafka_bootstrap`` fixture, which fails or skips when it does not answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from dstreams.kafka import inspect

TIMEOUT_S = 30.0


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, name: str | None = None, partitions: int = 1, config: dict[str, str] | None = None,
                 prefix: str = "t") -> str:
    """Create a topic (a unique name by default) and wait until its metadata shows every partition."""
    from confluent_kafka.admin import NewTopic

    name = name or unique_topic(prefix)
    a = admin(bootstrap)
    futures = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
                              operation_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S)
    futures[name].result(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        md = a.list_topics(name, timeout=5)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return name
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} did not show {partitions} partitions within {TIMEOUT_S} s")


def add_partitions(bootstrap: str, name: str, total: int) -> None:
    from confluent_kafka.admin import NewPartitions

    a = admin(bootstrap)  # kept until the futures resolve (a dropped client fails them with _DESTROY)
    futures = a.create_partitions([NewPartitions(name, total)], operation_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S)
    futures[name].result(TIMEOUT_S)


def delete_topic(bootstrap: str, name: str) -> None:
    a = admin(bootstrap)
    futures = a.delete_topics([name], operation_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S)
    futures[name].result(TIMEOUT_S)


def _bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    return str(v).encode()


def produce(bootstrap: str, topic: str, records: Iterable[tuple[Any, Any]], partition: int | None = None,
            transactional_id: str | None = None, abort: bool = False, timestamp_ms: int | None = None) -> None:
    """Produce ``(key, value)`` records (str values are UTF-8 encoded), to ``partition`` or by key; with
    ``transactional_id`` in one transaction, aborted when ``abort``. Waits for every delivery."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"}
    if transactional_id:
        conf["transactional.id"] = transactional_id
    p = Producer(conf)
    errors: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    if transactional_id:
        p.init_transactions(TIMEOUT_S)
        p.begin_transaction()
    for key, value in records:
        kwargs: dict[str, Any] = {"key": _bytes(key), "value": _bytes(value), "on_delivery": delivered}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        while True:
            try:
                p.produce(topic, **kwargs)
                break
            except BufferError:
                p.poll(0.1)
    if transactional_id:
        p.flush(TIMEOUT_S)  # the records reach the log first: an aborted transaction's records take offsets
        if abort:
            p.abort_transaction(TIMEOUT_S)
        else:
            p.commit_transaction(TIMEOUT_S)
    remaining = p.flush(TIMEOUT_S)
    assert remaining == 0, f"{remaining} records not delivered within {TIMEOUT_S} s"
    assert not errors, f"delivery failed: {errors[:3]}"


def end_offsets(bootstrap: str, topic: str, isolation: str = "read_committed") -> dict[int, int]:
    """Per partition the end a consumer with ``isolation`` sees (read_committed: the last stable offset)."""
    return inspect.end_offsets(bootstrap, topic, isolation)


def read_committed(bootstrap: str, topic: str, timeout_s: float = TIMEOUT_S,
                   partitions: Sequence[int] | None = None) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Everything a read_committed consumer sees in ``topic`` now: ``(partition, offset, key, value)`` sorted by
    partition and offset, read up to each partition's last stable offset (``dstreams.kafka.inspect.read_topic``)."""
    return [(r.partition, r.offset, r.key, r.value)
            for r in inspect.read_topic(bootstrap, topic, partitions=partitions, timeout_s=timeout_s)]


def values(records: Iterable[tuple[int, int, bytes | None, bytes | None]]) -> list[str]:
    """The values of ``read_committed``'s records, decoded."""
    return [v.decode() if v is not None else None for _p, _o, _k, v in records]  # type: ignore[misc]
