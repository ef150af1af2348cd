"""What a Kafka stream's records are: :class:`KafkaRecord` (``ssc.kafkaStream``), pyspark 2.4's
:class:`KafkaMessageAndMetadata` (``KafkaUtils``' ``messageHandler``) and the decoders.

Records are made on the executors by the range readers (:mod:`dstreams.kafka.reader`) and pickled like any record:
:class:`KafkaRecord` is a named tuple (cheap to pickle, compares by value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class KafkaRecord(NamedTuple):
    """One Kafka record as ``ssc.kafkaStream`` delivers it (without a ``decoder``).

    ``key`` and ``value`` are the raw bytes (None for a null key or a tombstone); ``timestamp`` is the record's
    Kafka timestamp in ms since the epoch (its create time, or the broker's append time for topics with
    ``message.timestamp.type=LogAppendTime``; None when the record has none) and ``timestampType`` says which
    (``"create"``, ``"logAppend"`` or None). ``headers`` is a tuple of ``(name, bytes)`` pairs, or None.
    For event time: ``stream.withEventTime(lambda r: r.timestamp / 1000)`` (``withEventTime`` takes seconds).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] | None = None
    timestampType: str | None = None


_TIMESTAMP_TYPES = {1: "create", 2: "logAppend"}  # confluent-kafka's TIMESTAMP_CREATE_TIME, _LOG_APPEND_TIME


def record_of(m: Any) -> KafkaRecord:
    """The :class:`KafkaRecord` of a confluent-kafka message (one without an error)."""
    ts_type, ts = m.timestamp()
    headers = m.headers()
    return KafkaRecord(m.topic(), m.partition(), m.offset(), ts if ts_type in _TIMESTAMP_TYPES else None, m.key(),
                       m.value(), tuple(headers) if headers else None, _TIMESTAMP_TYPES.get(ts_type))


def utf8_decoder(s: bytes | None) -> str | None:
    """pyspark 2.4's default decoder: UTF-8 bytes to str, None stays None."""
    if s is None:
        return None
    return s.decode("utf-8")


Decoder = Callable[[bytes | None], Any]


class KafkaMessageAndMetadata:
    """pyspark 2.4's message with its metadata, as ``KafkaUtils``' ``messageHandler`` receives it: ``topic``,
    ``partition``, ``offset``, and ``key`` / ``message`` decoded with the stream's ``keyDecoder`` /
    ``valueDecoder`` on first access (the raw bytes stay available as ``rawKey`` / ``rawMessage``)."""

    __slots__ = ("topic", "partition", "offset", "rawKey", "rawMessage", "timestamp", "_key_decoder",
                 "_value_decoder")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, message: bytes | None,
                 keyDecoder: Decoder = utf8_decoder, valueDecoder: Decoder = utf8_decoder,
                 timestamp: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.rawKey = key
        self.rawMessage = message
        self.timestamp = timestamp
        self._key_decoder = keyDecoder
        self._value_decoder = valueDecoder

    def __reduce__(self) -> Any:
        return (KafkaMessageAndMetadata, (self.topic, self.partition, self.offset, self.rawKey, self.rawMessage,
                                          self._key_decoder, self._value_decoder, self.timestamp))

    def __repr__(self) -> str:
        return (f"KafkaMessageAndMetadata(topic: {self.topic}, partition: {self.partition}, offset: {self.offset}, "
                f"key: {self.rawKey!r}, message: {self.rawMessage!r})")

    def _set_key_decoder(self, decoder: Decoder) -> None:
        self._key_decoder = decoder

    def _set_value_decoder(self, decoder: Decoder) -> None:
        self._value_decoder = decoder

    @property
    def key(self) -> Any:
        return self._key_decoder(self.rawKey)

    @property
    def message(self) -> Any:
        return self._value_decoder(self.rawMessage)


class PairDecoder:
    """``KafkaUtils``' record function: ``(keyDecoder(key), valueDecoder(value))``, or with a ``messageHandler``
    what it returns for the record's :class:`KafkaMessageAndMetadata`. A plain class (pickled with the node)."""

    def __init__(self, key_decoder: Decoder, value_decoder: Decoder,
                 message_handler: Callable[[KafkaMessageAndMetadata], Any] | None) -> None:
        self.key_decoder = key_decoder
        self.value_decoder = value_decoder
        self.message_handler = message_handler

    def __call__(self, r: KafkaRecord) -> Any:
        if self.message_handler is not None:
            return self.message_handler(KafkaMessageAndMetadata(r.topic, r.partition, r.offset, r.key, r.value,
                                                                self.key_decoder, self.value_decoder, r.timestamp))
        return (self.key_decoder(r.key), self.value_decoder(r.value))
