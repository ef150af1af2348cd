"""The Kafka connector's pure parts: pyspark 2.4's offset types, splitting ranges into tasks, sharing a rate by lag,
and ``kafkaParams`` (no broker needed)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstreams.kafka.offsets import Broker, OffsetRange, TopicAndPartition, share_by_lag, split_ranges
from dstreams.kafka.params import KafkaConfigError, normalize, producer_config, reader_config, start_position
from dstreams.kafka.records import KafkaMessageAndMetadata, KafkaRecord, PairDecoder, utf8_decoder


def test_offset_types_have_value_equality_and_pickle():
    assert OffsetRange("t", 0, 1, 5) == OffsetRange("t", 0, 1, 5)
    assert OffsetRange("t", 0, 1, 5) != OffsetRange("t", 0, 1, 6)
    assert str(OffsetRange("t", 1, 2, 3)) == "OffsetRange(topic: t, partition: 1, range: [2 -> 3])"
    assert {TopicAndPartition("t", 0): 1}[TopicAndPartition("t", 0)] == 1
    assert TopicAndPartition("t", 0) != TopicAndPartition("t", 1)
    assert pickle.loads(pickle.dumps(OffsetRange("t", 0, 1, 5))) == OffsetRange("t", 0, 1, 5)
    assert pickle.loads(pickle.dumps(TopicAndPartition("t", 3))) == TopicAndPartition("t", 3)
    assert Broker("h", 1) == Broker("h", 1)
    assert OffsetRange("t", 0, 1, 5).count() == 4
    with pytest.raises(ValueError, match="untilOffset is before fromOffset"):
        OffsetRange("t", 0, 5, 1)
    with pytest.raises(ValueError, match="partition"):
        TopicAndPartition("t", -1)


def test_message_and_metadata_decodes_lazily_and_pickles():
    m = KafkaMessageAndMetadata("t", 2, 7, b"k", b"v")
    assert (m.topic, m.partition, m.offset, m.key, m.message) == ("t", 2, 7, "k", "v")
    m2 = pickle.loads(pickle.dumps(m))
    assert (m2.key, m2.message) == ("k", "v")
    assert utf8_decoder(None) is None
    rec = KafkaRecord("t", 0, 1, 1000, b"k", None)
    assert PairDecoder(utf8_decoder, utf8_decoder, None)(rec) == ("k", None)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=6), st.one_of(st.none(), st.integers(1, 20)),
       st.one_of(st.none(), st.integers(1, 30)))
def test_split_ranges_covers_each_offset_once_in_order(counts, min_partitions, max_per_task):
    ranges = [OffsetRange("t", p, 100 * p, 100 * p + n) for p, n in enumerate(counts)]
    pieces = split_ranges(ranges, min_partitions, max_per_task)
    covered = [(r.partition, o) for r in pieces for o in range(r.fromOffset, r.untilOffset)]
    expected = [(r.partition, o) for r in ranges for o in range(r.fromOffset, r.untilOffset)]
    assert covered == expected  # each offset once, in range order then offset order
    assert all(r.count() > 0 for r in pieces)
    if max_per_task is not None:
        assert all(r.count() <= max_per_task for r in pieces)
    total = sum(counts)
    if min_partitions is not None and total >= min_partitions:
        assert len(pieces) >= min_partitions


def test_share_by_lag_is_proportional_capped_and_at_least_one():
    assert share_by_lag({"a": 300, "b": 100}, 100, None) == {"a": 75, "b": 25}
    assert share_by_lag({"a": 300, "b": 100}, 100, 50) == {"a": 50, "b": 25}
    assert share_by_lag({"a": 0, "b": 100}, 10, None) == {"a": 1, "b": 10}


def test_kafka_params_accept_pyspark_24_names_and_force_the_readers_settings():
    p = normalize({"metadata.broker.list": "h:1", "auto.offset.reset": "smallest", "key.deserializer": "x",
                   "group.id": "g", "isolation.level": "read_uncommitted"})
    assert p["bootstrap.servers"] == "h:1" and "key.deserializer" not in p
    assert start_position(p, "latest") == "earliest"
    assert start_position({"auto.offset.reset": "largest"}, "earliest") == "latest"
    conf = reader_config(p)
    assert conf["isolation.level"] == "read_committed" and conf["enable.auto.commit"] is False
    assert conf["auto.offset.reset"] == "error" and conf["group.id"] != "g"
    assert producer_config(p, "tx")["transactional.id"] == "tx"
    assert "group.id" not in producer_config(p, None)
    with pytest.raises(KafkaConfigError, match="bootstrap.servers"):
        normalize({"group.id": "g"})
    with pytest.raises(KafkaConfigError, match="auto.offset.reset"):
        start_position({"auto.offset.reset": "sometimes"}, "latest")
