"""Kafka in and out, exactly once: the direct source (``ssc.kafkaStream``, pyspark 2.4's ``KafkaUtils``) and the
transactional sink (``DStream.saveToKafka``). Needs confluent-kafka: ``pip install 'dstreams[kafka]'``.

``from dstreams.kafka import KafkaUtils, OffsetRange, TopicAndPartition, Broker`` replaces ``from
pyspark.streaming.kafka import ...``. The modules: :mod:`.source` (offsets fixed per batch on the driver),
:mod:`.reader` (the executors' range reads), :mod:`.rdd`, :mod:`.offsets`, :mod:`.records`, :mod:`.params`
(``kafkaParams``), :mod:`.errors`, :mod:`.sink` (exactly-once output), :mod:`.utils` (``KafkaUtils``),
:mod:`.inspect` (what a topic holds, for tests).
"""

from __future__ import annotations

from .errors import KafkaDataLossError, KafkaDecodeError, KafkaReadTimeoutError
from .offsets import Broker, OffsetRange, TopicAndPartition
from .params import KafkaConfigError
from .rdd import KafkaRDD
from .records import KafkaMessageAndMetadata, KafkaRecord, utf8_decoder
from .utils import KafkaUtils

__all__ = [
    "KafkaUtils",
    "OffsetRange",
    "TopicAndPartition",
    "Broker",
    "KafkaRDD",
    "KafkaRecord",
    "KafkaMessageAndMetadata",
    "utf8_decoder",
    "KafkaDataLossError",
    "KafkaDecodeError",
    "KafkaReadTimeoutError",
    "KafkaConfigError",
]
