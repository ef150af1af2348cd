"""``kafkaParams``: the settings a user passes, turned into librdkafka configurations for each client the connector
makes (the driver's planning consumer and admin client, the executors' range readers, the sink's producers).

Contract:

* Accepted names are pyspark 2.4's (Kafka 0.8: ``metadata.broker.list``, ``auto.offset.reset`` = ``smallest`` /
  ``largest``) and the current ones (``bootstrap.servers``, ``earliest`` / ``latest``). Anything else is passed to
  librdkafka as it is (security settings, ``client.id``, timeouts...), so a misspelt key fails with librdkafka's
  own message, wrapped by :func:`client_error` with the key named.
* Settings that only the Java client knows (``key.deserializer``, ``value.serializer``, ``zookeeper.connect``...)
  are dropped: the Python client has its own decoders and serializers (``keyDecoder`` / ``valueDecoder``,
  ``keySerializer`` / ``valueSerializer``).
* Settings the connector owns are forced, whatever the user passes: the readers never commit, never reset an
  offset silently (``auto.offset.reset=error``), read ``read_committed`` and report the end of a partition; the
  exactly-once producer is transactional and idempotent. :data:`READER_OWNED` and :data:`PRODUCER_OWNED` list
  them; a user value that differs is logged and ignored.
* ``auto.offset.reset`` is not a client setting here: it says where a stream without recorded offsets starts
  (:func:`start_position`).

This module imports the standard library only (executors import it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dstreams.errors import DStreamsError

log = logging.getLogger(__name__)

#: pyspark 2.4 / Kafka 0.8 names -> current names.
RENAMED = {"metadata.broker.list": "bootstrap.servers"}
#: ``auto.offset.reset`` values of Kafka 0.8 -> current ones.
RESET_VALUES = {"smallest": "earliest", "largest": "latest", "earliest": "earliest", "latest": "latest"}
#: Java-client-only settings, dropped (the connector decodes and encodes in Python).
JAVA_ONLY = frozenset({
    "key.deserializer", "value.deserializer", "key.serializer", "value.serializer", "zookeeper.connect",
    "zookeeper.connection.timeout.ms", "serializer.class", "key.serializer.class", "partitioner.class",
    "interceptor.classes", "metric.reporters", "default.api.timeout.ms",
})
#: Settings of the connector's own that are not librdkafka settings (removed before a client is made).
CONNECTOR_KEYS = frozenset({"auto.offset.reset"})

#: What the executors' range readers and the driver's planning consumer always use.
READER_OWNED: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "enable.partition.eof": True,
    "isolation.level": "read_committed",
}

#: What the exactly-once sink's producers always use (the ``transactional.id`` is the sink's, per partition).
PRODUCER_OWNED: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
}

#: Defaults of the range readers that ``kafkaParams`` may override: fetching ahead until a million records are queued
#: (bounded by librdkafka's ``queued.max.messages.kbytes``, 64 MB) read a 250,000-record range 2.5x faster than
#: librdkafka's default of 100,000 (medians of 9 interleaved reads, 100-byte records, one partition).
#: ``fetch.wait.max.ms`` 50 instead of 500: a range ending at the partition's end learns it (end of partition) after
#: one broker wait, and a read_committed fetch of a range of small transactions waited that long before its first
#: records too (51 offsets of 17 transactions: 0.1 s instead of 1.0 s to read).
READER_DEFAULTS: dict[str, Any] = {"queued.min.messages": 1_000_000, "fetch.wait.max.ms": 50}

#: Producer settings ``kafkaParams`` may hold that a consumer (a range reader, the sink's ledger reader) must not get
#: (librdkafka warns).
PRODUCER_ONLY = frozenset({
    "transactional.id", "transaction.timeout.ms", "enable.idempotence", "acks", "request.required.acks", "linger.ms",
    "queue.buffering.max.ms", "compression.type", "compression.codec", "compression.level", "batch.size",
    "batch.num.messages", "message.timeout.ms", "delivery.timeout.ms", "partitioner", "queue.buffering.max.messages",
    "queue.buffering.max.kbytes", "message.send.max.retries", "retries", "enable.gapless.guarantee",
    "sticky.partitioning.linger.ms", "max.in.flight.requests.per.connection", "max.in.flight"})

#: The group id the readers give librdkafka (it wants one to make a consumer; they never join or commit).
READER_GROUP = "dstreams-reader"


class KafkaConfigError(DStreamsError, ValueError):
    """``kafkaParams`` cannot make a client (no servers, a setting librdkafka refuses)."""


def normalize(kafka_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``kafka_params`` with the old names renamed, Java-only settings dropped and values as strings where
    librdkafka wants them; raises :class:`KafkaConfigError` without ``bootstrap.servers`` (or
    ``metadata.broker.list``)."""
    if kafka_params is None:
        kafka_params = {}
    if not isinstance(kafka_params, Mapping):
        raise KafkaConfigError(f"kafkaParams must be a dict of Kafka settings, got {type(kafka_params).__name__}")
    out: dict[str, Any] = {}
    for key, value in kafka_params.items():
        if not isinstance(key, str):
            raise KafkaConfigError(f"kafkaParams keys are setting names (str), got {key!r}")
        name = RENAMED.get(key, key)
        if name in JAVA_ONLY:
            log.debug("kafkaParams: %s is a Java client setting; ignored (the Python client decodes itself)", key)
            continue
        if name in out and out[name] != value:
            raise KafkaConfigError(f"kafkaParams sets {name} twice with different values ({key}={value!r} and "
                                   f"{name}={out[name]!r}): keep one")
        out[name] = value
    servers = out.get("bootstrap.servers")
    if not servers or not isinstance(servers, str):
        raise KafkaConfigError(
            "kafkaParams needs the brokers: {'bootstrap.servers': 'host:port,host:port'} (pyspark 2.4's "
            f"'metadata.broker.list' is accepted too); got {dict(kafka_params)!r}")
    return out


def start_position(params: Mapping[str, Any], default: str) -> str:
    """``"earliest"`` or ``"latest"``: where partitions without a given offset start, from ``auto.offset.reset``
    (``smallest``/``largest`` accepted) or ``default``."""
    raw = params.get("auto.offset.reset")
    if raw is None:
        return default
    value = RESET_VALUES.get(str(raw).lower())
    if value is None:
        raise KafkaConfigError(f"auto.offset.reset={raw!r} is not one of smallest, largest, earliest, latest")
    return value


def _owned(params: dict[str, Any], owned: Mapping[str, Any], what: str) -> dict[str, Any]:
    for key, value in owned.items():
        if key in params and str(params[key]).lower() != str(value).lower():
            log.warning("kafkaParams: %s=%r is ignored: the %s always uses %s=%r", key, params[key], what, key,
                        value)
        params[key] = value
    return params


def client_base(params: Mapping[str, Any]) -> dict[str, Any]:
    """The settings every client of the connector shares: ``params`` without the connector's own keys."""
    return {k: v for k, v in params.items() if k not in CONNECTOR_KEYS}


def reader_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """A range reader's (or the driver's planning consumer's) librdkafka configuration."""
    conf = {k: v for k, v in client_base(params).items() if k not in PRODUCER_ONLY}
    conf.pop("group.id", None)  # the user's group is for commitToGroup only: readers never join it
    for key, value in READER_DEFAULTS.items():
        conf.setdefault(key, value)
    conf = _owned(conf, READER_OWNED, "range reader")
    conf["auto.offset.reset"] = "error"
    conf["group.id"] = READER_GROUP
    return conf


def admin_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """An admin client's configuration (consumer- and producer-only settings removed)."""
    consumer_or_producer_only = {"group.id", "enable.auto.commit", "enable.auto.offset.store", "isolation.level",
                                 "enable.partition.eof", "session.timeout.ms", "max.poll.interval.ms",
                                 "fetch.min.bytes", "fetch.wait.max.ms", "queued.min.messages",
                                 "transactional.id", "enable.idempotence", "acks", "linger.ms", "compression.type",
                                 "batch.num.messages", "batch.size", "transaction.timeout.ms", "partitioner",
                                 "queue.buffering.max.ms", "queue.buffering.max.messages", "message.timeout.ms",
                                 "delivery.timeout.ms", "group.instance.id", "auto.commit.interval.ms"}
    return {k: v for k, v in client_base(params).items() if k not in consumer_or_producer_only}


def producer_config(params: Mapping[str, Any], transactional_id: str | None) -> dict[str, Any]:
    """A sink producer's configuration: transactional under ``transactional_id`` (exactly once), else idempotent
    (at least once). Consumer-only settings are removed."""
    consumer_only = {"group.id", "enable.auto.commit", "enable.auto.offset.store", "isolation.level",
                     "enable.partition.eof", "session.timeout.ms", "max.poll.interval.ms", "fetch.min.bytes",
                     "fetch.wait.max.ms", "queued.min.messages", "group.instance.id", "auto.commit.interval.ms"}
    conf = {k: v for k, v in client_base(params).items() if k not in consumer_only}
    conf.setdefault("partitioner", "murmur2_random")  # the Java client's partitioner: keys land where Java's would
    conf = _owned(conf, PRODUCER_OWNED, "sink")
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
    else:
        conf.pop("transactional.id", None)
    return conf


def client_error(what: str, params: Mapping[str, Any], error: BaseException) -> KafkaConfigError:
    """A client that librdkafka refused to make, with the settings it was given (no secrets: values of keys
    that name passwords or secrets are hidden)."""
    shown = {k: ("***" if any(s in k for s in ("password", "secret", "sasl.oauthbearer")) else v)
             for k, v in params.items()}
    return KafkaConfigError(f"cannot make the Kafka {what} from kafkaParams {shown}: {error}. Check the setting "
                            "it names: kafkaParams take librdkafka's names (https://github.com/confluentinc/"
                            "librdkafka/blob/master/CONFIGURATION.md), plus pyspark 2.4's metadata.broker.list and "
                            "auto.offset.reset=smallest/largest")


def require_client() -> Any:
    """The ``confluent_kafka`` module, or an ImportError that says how to install it."""
    try:
        import confluent_kafka
    except ImportError:  # pragma: no cover - an installation problem
        raise ImportError("the Kafka connector needs confluent-kafka: pip install 'dstreams[kafka]' (or pip install "
                          "confluent-kafka)") from None
    return confluent_kafka
