"""What a topic holds now, as a ``read_committed`` consumer sees it: for tests of a pipeline's Kafka output and for
checks after a run (the project's own tests and chaos run use it; it is not part of a stream).

Contract:

* :func:`end_offsets` gives per partition the end a consumer sees with the isolation asked for (``read_committed``:
  the last stable offset, before any open transaction; ``read_uncommitted``: the high watermark).
* :func:`read_topic` reads every partition (or those asked for) from its first offset up to the last stable offset
  as it was when called, and returns the records in partition and offset order as
  :class:`~dstreams.kafka.records.KafkaRecord` with raw ``key``/``value`` bytes. Aborted records and transaction
  markers are never returned (they take offsets, so offsets have holes). It waits at most ``timeout_s`` and raises
  :class:`TimeoutError` naming the partitions that did not reach their end.
* Neither joins a consumer group nor commits anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from .params import PRODUCER_ONLY, normalize, require_client
from .records import KafkaRecord, record_of

#: How long one metadata or offsets request may take.
CALL_TIMEOUT_S = 15.0


def _consumer_conf(kafka_params: Mapping[str, Any] | str, isolation: str) -> dict[str, Any]:
    params = normalize({"bootstrap.servers": kafka_params} if isinstance(kafka_params, str) else kafka_params)
    conf = {k: v for k, v in params.items() if k not in PRODUCER_ONLY and k != "auto.offset.reset"}
    conf.update({"group.id": conf.get("group.id", "dstreams-inspect"), "isolation.level": isolation,
                 "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    return conf


def _ends(consumer: Any, topic: str, partitions: Iterable[int] | None) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    meta = consumer.list_topics(topic, timeout=CALL_TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None:
        raise ValueError(f"the topic {topic!r} does not exist or cannot be described: "
                         f"{None if meta is None else meta.error}")
    wanted = set(meta.partitions) if partitions is None else set(partitions)
    return {p: _end(consumer, TopicPartition(topic, p)) for p in sorted(wanted & set(meta.partitions))}


def _end(consumer: Any, partition: Any) -> int:
    """The partition's end offset; a retriable broker error (a leader just elected or moving:
    ``NOT_LEADER_FOR_PARTITION``) is asked again for up to :data:`CALL_TIMEOUT_S`."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + CALL_TIMEOUT_S
    while True:
        try:
            return int(consumer.get_watermark_offsets(partition, timeout=CALL_TIMEOUT_S, cached=False)[1])
        except KafkaException as e:
            error: Any = e.args[0] if e.args else None
            if not (hasattr(error, "retriable") and error.retriable()) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def end_offsets(kafka_params: Mapping[str, Any] | str, topic: str,
                isolation: str = "read_committed") -> dict[int, int]:
    """Per partition of ``topic`` the end offset a consumer with ``isolation`` sees now. ``kafka_params`` is a
    ``kafkaParams`` dict or just the bootstrap servers."""
    kafka = require_client()
    consumer = kafka.Consumer(_consumer_conf(kafka_params, isolation))
    try:
        return _ends(consumer, topic, None)
    finally:
        consumer.close()


def read_topic(kafka_params: Mapping[str, Any] | str, topic: str, partitions: Iterable[int] | None = None,
               timeout_s: float = 60.0) -> list[KafkaRecord]:
    """Every record a ``read_committed`` consumer sees in ``topic`` (or its ``partitions``) up to the last stable
    offsets of the moment of the call, in partition and offset order."""
    kafka = require_client()
    from confluent_kafka import KafkaError, TopicPartition

    consumer = kafka.Consumer(_consumer_conf(kafka_params, "read_committed"))
    out: list[KafkaRecord] = []
    try:
        wanted = {p: end for p, end in _ends(consumer, topic, partitions).items() if end > 0}
        if not wanted:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
        done: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < len(wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(set(wanted) - done)} did not reach their "
                                   f"ends {wanted} within {timeout_s:.0f} s")
            for m in consumer.consume(1000, 0.5):
                p = m.partition()
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic} partition {p}: {m.error()}")
                    if consumer.position([TopicPartition(topic, p)])[0].offset >= wanted[p]:
                        done.add(p)  # an end reached through markers or aborted records
                    continue
                if p in done or m.offset() >= wanted[p]:
                    done.add(p)
                    continue
                out.append(record_of(m))
                if m.offset() >= wanted[p] - 1:
                    done.add(p)
    finally:
        consumer.close()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out
