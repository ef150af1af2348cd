"""``dstreams.kafka.inspect``'s end offsets ride out a retriable broker error (a partition's leader just elected or
moving answers ``NOT_LEADER_FOR_PARTITION`` for a moment; a test read its output then and failed), and fail at once
on any other error. No broker: a stand-in consumer."""

from __future__ import annotations

from typing import Any

import pytest

kafka = pytest.importorskip("confluent_kafka")

from dstreams.kafka import inspect  # noqa: E402


class _Consumer:
    """Answers ``errors`` (raised in turn) before the offsets (0, 42)."""

    def __init__(self, errors: list[Any]) -> None:
        self.errors = list(errors)
        self.calls = 0

    def get_watermark_offsets(self, partition: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.calls += 1
        if self.errors:
            raise kafka.KafkaException(self.errors.pop(0))
        return 0, 42


def test_a_retriable_error_is_asked_again() -> None:
    not_leader = kafka.KafkaError(kafka.KafkaError.NOT_LEADER_FOR_PARTITION, "not the leader", retriable=True)
    consumer = _Consumer([not_leader, not_leader])
    assert inspect._end(consumer, kafka.TopicPartition("t", 0)) == 42
    assert consumer.calls == 3


def test_another_error_fails_at_once() -> None:
    denied = kafka.KafkaError(kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")
    consumer = _Consumer([denied])
    with pytest.raises(kafka.KafkaException):
        inspect._end(consumer, kafka.TopicPartition("t", 0))
    assert consumer.calls == 1


def test_a_retriable_error_that_lasts_fails_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspect, "CALL_TIMEOUT_S", 0.3)
    not_leader = kafka.KafkaError(kafka.KafkaError.NOT_LEADER_FOR_PARTITION, "not the leader", retriable=True)
    consumer = _Consumer([not_leader] * 100)
    with pytest.raises(kafka.KafkaException):
        inspect._end(consumer, kafka.TopicPartition("t", 0))
    assert 1 < consumer.calls < 100
