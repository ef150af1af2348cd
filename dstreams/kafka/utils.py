"""pyspark 2.4's ``KafkaUtils`` (``pyspark.streaming.kafka``, removed in Spark 3): the same names and arguments, on
the dstreams Kafka source. ``from dstreams.kafka import KafkaUtils`` in place of ``from pyspark.streaming.kafka
import KafkaUtils`` is the whole migration.

Differences from pyspark 2.4, all on the safe side: records are read with ``isolation.level=read_committed`` (a
transactional producer's aborted records never show); batches end at the last stable offset; offsets gone from the
broker fail the batch unless ``kafkaParams`` has ``failOnDataLoss: "false"``; a driver restarted from a checkpoint
replays its recorded ranges exactly. ``createStream`` (the receiver-based stream over ZooKeeper) does not exist: the
direct stream replaces it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark import SparkContext

from .. import config
from .offsets import Broker, OffsetRange, TopicAndPartition
from .params import normalize, reader_config, start_position
from .rdd import KafkaRDD, kafka_rdd
from .records import Decoder, KafkaMessageAndMetadata, PairDecoder, utf8_decoder


class KafkaUtils:
    """pyspark 2.4's entry points for Kafka."""

    @staticmethod
    def createStream(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(
            "KafkaUtils.createStream (the receiver-based stream over ZooKeeper) is not provided: use "
            "KafkaUtils.createDirectStream(ssc, [topic], {'bootstrap.servers': ...}) or ssc.kafkaStream(...), which "
            "read exactly once without receivers or ZooKeeper")

    @staticmethod
    def createDirectStream(ssc: Any, topics: Sequence[str], kafkaParams: Mapping[str, Any],
                           fromOffsets: Mapping[TopicAndPartition, int] | None = None,
                           keyDecoder: Decoder = utf8_decoder, valueDecoder: Decoder = utf8_decoder,
                           messageHandler: Callable[[KafkaMessageAndMetadata], Any] | None = None) -> Any:
        """A direct Kafka stream of ``(key, value)`` records (decoded by ``keyDecoder`` / ``valueDecoder``) or of
        ``messageHandler(message)``. Without ``fromOffsets`` partitions start at ``auto.offset.reset``
        (``smallest`` / ``largest``, default ``largest`` as in pyspark 2.4); with it, the named partitions start
        there. Each RDD has ``offsetRanges()``. See :mod:`dstreams.kafka.source` for the guarantees."""
        if not isinstance(topics, (list, tuple, set)) and not isinstance(topics, str):
            raise TypeError(f"topics should be a list of topic names, got {type(topics).__name__}")
        params = dict(kafkaParams)
        fail = str(params.pop("failOnDataLoss", "true")).lower() not in ("false", "0", "no")
        normalize(params)
        starting: Any = dict(fromOffsets) if fromOffsets else start_position(params, "latest")
        return ssc.kafkaStream(list(topics) if not isinstance(topics, str) else [topics], params,
                               startingOffsets=starting,
                               decoder=PairDecoder(keyDecoder, valueDecoder, messageHandler),
                               failOnDataLoss=fail)

    @staticmethod
    def createRDD(sc: SparkContext, kafkaParams: Mapping[str, Any], offsetRanges: Sequence[OffsetRange],
                  leaders: Mapping[TopicAndPartition, Broker] | None = None, keyDecoder: Decoder = utf8_decoder,
                  valueDecoder: Decoder = utf8_decoder,
                  messageHandler: Callable[[KafkaMessageAndMetadata], Any] | None = None) -> KafkaRDD:
        """An RDD of the records in ``offsetRanges`` (one task per range), read_committed; ``leaders`` is accepted
        for compatibility and not needed (the client finds the leaders)."""
        if not isinstance(sc, SparkContext):
            raise TypeError(f"sc should be a SparkContext, got {type(sc).__name__}")
        ranges = list(offsetRanges)
        if not all(isinstance(r, OffsetRange) for r in ranges):
            raise TypeError("offsetRanges should be a list of OffsetRange")
        params = dict(kafkaParams)
        fail = str(params.pop("failOnDataLoss", "true")).lower() not in ("false", "0", "no")
        conf = reader_config(normalize(params))
        poll_s = config.get(config.KAFKA_POLL_MS, sc.getConf()) / 1000.0
        return kafka_rdd(sc, conf, ranges, [r for r in ranges if r.count() > 0],
                         PairDecoder(keyDecoder, valueDecoder, messageHandler), fail, poll_s)
