"""pyspark 2.4's offset types (:class:`OffsetRange`, :class:`TopicAndPartition`, :class:`Broker`) and the pure
planning functions of the source: splitting large ranges into tasks and sharing a rate limit by lag.

An :class:`OffsetRange` is ``[fromOffset, untilOffset)`` of one topic-partition: the records with offsets
``fromOffset <= offset < untilOffset`` that a read_committed consumer sees (transaction markers, aborted records and
compacted-away offsets take offsets but are not records, so a range may hold fewer than ``count()`` records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


class TopicAndPartition:
    """A topic and a partition number, with value equality (usable as a dict key, as in pyspark 2.4)."""

    __slots__ = ("_topic", "_partition")

    def __init__(self, topic: str, partition: int) -> None:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"a topic is a non-empty str, got {topic!r}")
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"a partition is an int >= 0, got {partition!r}")
        self._topic = topic
        self._partition = partition

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partition(self) -> int:
        return self._partition

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TopicAndPartition) and (self._topic, self._partition) == (other._topic,
                                                                                             other._partition)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((self._topic, self._partition))

    def __reduce__(self) -> Any:
        return (TopicAndPartition, (self._topic, self._partition))

    def __repr__(self) -> str:
        return f"TopicAndPartition(topic: {self._topic}, partition: {self._partition})"

    __str__ = __repr__


class OffsetRange:
    """``[fromOffset, untilOffset)`` of one topic-partition (pyspark 2.4's class, with value equality)."""

    __slots__ = ("topic", "partition", "fromOffset", "untilOffset")

    def __init__(self, topic: str, partition: int, fromOffset: int, untilOffset: int) -> None:
        TopicAndPartition(topic, partition)  # the same checks
        for name, v in (("fromOffset", fromOffset), ("untilOffset", untilOffset)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"OffsetRange {name} is an offset (an int >= 0), got {v!r}")
        if untilOffset < fromOffset:
            raise ValueError(f"OffsetRange({topic!r}, {partition}, {fromOffset}, {untilOffset}): untilOffset is "
                             "before fromOffset")
        self.topic = topic
        self.partition = partition
        self.fromOffset = fromOffset
        self.untilOffset = untilOffset

    def topicAndPartition(self) -> TopicAndPartition:
        return TopicAndPartition(self.topic, self.partition)

    def count(self) -> int:
        """The number of offsets in the range (records, or fewer under transactions and compaction)."""
        return self.untilOffset - self.fromOffset

    def _key(self) -> tuple[str, int, int, int]:
        return (self.topic, self.partition, self.fromOffset, self.untilOffset)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetRange) and self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> Any:
        return (OffsetRange, self._key())

    def __str__(self) -> str:
        return (f"OffsetRange(topic: {self.topic}, partition: {self.partition}, range: [{self.fromOffset} -> "
                f"{self.untilOffset}])")

    __repr__ = __str__

    def to_json(self) -> list[Any]:
        return list(self._key())

    @staticmethod
    def from_json(value: Sequence[Any]) -> OffsetRange:
        topic, partition, start, until = value
        return OffsetRange(str(topic), int(partition), int(start), int(until))


class Broker:
    """pyspark 2.4's broker address (``createRDD``'s ``leaders``; the Python client finds leaders itself, so this is
    accepted and not needed)."""

    __slots__ = ("_host", "_port")

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Broker) and (self._host, self._port) == (other._host, other._port)

    def __hash__(self) -> int:
        return hash((self._host, self._port))

    def __repr__(self) -> str:
        return f"Broker({self._host}:{self._port})"


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None,
                 max_per_task: int | None) -> list[OffsetRange]:
    """The tasks of a batch: each non-empty range as one task, split into consecutive pieces so that no piece holds
    more than ``max_per_task`` offsets and there are at least ``min_partitions`` tasks when the offsets allow
    (Structured Streaming's ``minPartitions``: larger ranges get more pieces, in proportion). Pieces keep the
    ranges' order, so the records of a topic-partition stay in offset order across the RDD's partitions. Empty
    ranges make no task; an all-empty batch is ``[]``."""
    work = [r for r in ranges if r.count() > 0]
    pieces = {i: 1 for i in range(len(work))}
    if max_per_task is not None and max_per_task > 0:
        for i, r in enumerate(work):
            pieces[i] = max(pieces[i], math.ceil(r.count() / max_per_task))
    total = sum(r.count() for r in work)
    if min_partitions is not None and total > 0 and sum(pieces.values()) < min_partitions:
        for i, r in enumerate(work):
            share = math.ceil(min_partitions * r.count() / total)
            pieces[i] = max(pieces[i], min(share, r.count()))
    out: list[OffsetRange] = []
    for i, r in enumerate(work):
        n = pieces[i]
        size, extra = divmod(r.count(), n)
        start = r.fromOffset
        for k in range(n):
            end = start + size + (1 if k < extra else 0)
            if end > start:
                out.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return out


def share_by_lag(lags: Mapping[Any, int], total: int, cap: int | None) -> dict[Any, int]:
    """How many offsets each partition may take when a batch may take ``total`` in all (backpressure's rate times
    the batch interval): in proportion to each partition's lag (Spark's ``maxMessagesPerPartition``), each at least
    1, at most ``cap`` (the static ``maxRatePerPartition`` share) when given."""
    lag_sum = sum(max(0, v) for v in lags.values())
    out: dict[Any, int] = {}
    for tp, lag in lags.items():
        share = total * max(0, lag) / lag_sum if lag_sum > 0 else total / max(1, len(lags))
        n = max(1, math.floor(share + 1e-9))
        if cap is not None:
            n = min(n, cap)
        out[tp] = n
    return out
