"""The fluent Kafka stream: ``StreamingContext.kafkaStream`` builds a :class:`KafkaDStream` (the engine's source is
:mod:`dstreams.kafka.source`); a stream with ``onDecodeError="deadLetter"`` has :meth:`KafkaDStream.deadLetters`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dstreams.dead_letters import dead as _dead
from dstreams.dead_letters import good as _good
from dstreams.kafka.records import KafkaRecord
from dstreams.kafka.source import KafkaInputNode

from .owner import GraphOwner
from .stream import DStream


class KafkaDStream(DStream):
    """A Kafka input stream. Its RDDs are :class:`~dstreams.kafka.rdd.KafkaRDD`\\ s: ``rdd.offsetRanges()`` inside
    ``foreachRDD`` and ``transform`` (pyspark 2.4's ``KafkaDStream``), unless the stream routes dead letters."""

    def __init__(self, node: Any, ssc: GraphOwner, dead_letters: DStream | None = None) -> None:
        super().__init__(node, ssc)
        self._dead_letters = dead_letters

    def deadLetters(self) -> DStream:
        """The records the stream's decoder refused, one :class:`~dstreams.kafka.source.KafkaDeadLetter` each
        (topic, partition, offset, timestamp, key, value, error, batchTime), batch by batch: a stream like any other,
        which a sink saves exactly once (``.saveToKafka("orders.dlq", params, keyFunc=lambda d: d.key,
        valueFunc=lambda d: d.value)``). Only with ``kafkaStream(..., onDecodeError="deadLetter")``."""
        if self._dead_letters is None:
            raise ValueError("this Kafka stream has no dead letters: make it with kafkaStream(..., decoder=f, "
                             "onDecodeError='deadLetter') to route the records the decoder refuses")
        return self._dead_letters


def kafka_stream(ssc: GraphOwner, graph: Any, topics: str | Sequence[str] | None, kafkaParams: Mapping[str, Any],
                 pattern: str | None, startingOffsets: Any, decoder: Callable[[KafkaRecord], Any] | None,
                 maxRatePerPartition: float | None, failOnDataLoss: bool, minPartitions: int | None,
                 commitToGroup: str | None, onDecodeError: str) -> KafkaDStream:
    """Build the source node and its stream (see ``StreamingContext.kafkaStream``)."""
    node = KafkaInputNode(graph, kafkaParams, topics, pattern, startingOffsets, decoder, failOnDataLoss,
                          maxRatePerPartition, minPartitions, commitToGroup, onDecodeError)
    if onDecodeError != "deadLetter":
        return KafkaDStream(node, ssc)
    tagged = DStream(node, ssc).cache()  # read once, split in two
    good = tagged.mapPartitions(_good, preservesPartitioning=True)
    dead = tagged.mapPartitions(_dead, preservesPartitioning=True)
    graph.dead_letter_nodes.append(dead._node)  # among ssc.deadLetters()
    return KafkaDStream(good._node, ssc, dead)
