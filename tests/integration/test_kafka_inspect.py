"""``dstreams.kafka.inspect``: what a topic holds as a read_committed consumer sees it (what tests of a pipeline's
Kafka output read), against the project's broker."""

from __future__ import annotations

import time

import pytest

from dstreams.kafka import KafkaRecord
from dstreams.kafka.inspect import end_offsets, read_topic

from ..kafka_support import create_topic, produce, unique_topic


def test_read_topic_returns_committed_records_in_order_without_aborted_ones(kafka_bootstrap):
    topic = create_topic(kafka_bootstrap, partitions=2)
    ts = int(time.time() * 1000)
    produce(kafka_bootstrap, topic, [("a", "1"), ("a", "2")], partition=0, timestamp_ms=ts)
    produce(kafka_bootstrap, topic, [("b", "x")], partition=1, transactional_id=unique_topic("tx"), abort=True)
    produce(kafka_bootstrap, topic, [("b", "3")], partition=1, transactional_id=unique_topic("tx"))
    produce(kafka_bootstrap, topic, [(None, None)], partition=1)

    records = read_topic(kafka_bootstrap, topic, timeout_s=30)

    assert all(isinstance(r, KafkaRecord) for r in records)
    assert [(r.partition, r.key, r.value) for r in records] == [
        (0, b"a", b"1"), (0, b"a", b"2"), (1, b"b", b"3"), (1, None, None)]
    assert [r.offset for r in records[:2]] == [0, 1]
    assert records[0].timestamp == ts and records[0].timestampType == "create"
    # the aborted record and both transactions' markers take offsets: partition 1 ends past its records
    assert end_offsets(kafka_bootstrap, topic) == {0: 2, 1: records[-1].offset + 1}
    assert records[-1].offset > 2
    assert [r.value for r in read_topic({"metadata.broker.list": kafka_bootstrap}, topic, partitions=[0])] == [
        b"1", b"2"]


def test_read_topic_names_a_missing_topic(kafka_bootstrap):
    missing = unique_topic("missing")
    with pytest.raises(ValueError, match=missing):
        read_topic(kafka_bootstrap, missing, timeout_s=10)
