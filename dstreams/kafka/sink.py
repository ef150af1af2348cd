"""Output into a Kafka topic, exactly once for ``read_committed`` consumers: one Kafka transaction per batch and output
partition, committed inside the Spark task together with a ledger entry saying the batch is written.

Contract of :func:`save_to_kafka` (the sink behind ``DStream.saveToKafka``):

* **Records.** By default a record that is a 2-tuple or 2-list is ``(key, value)``; anything else is the value, with
  no key. ``keyFunc(record)`` / ``valueFunc(record)`` override either part. Keys and values are encoded by
  ``keySerializer`` / ``valueSerializer`` when given (a function returning ``bytes``, ``str`` or None), else by
  :func:`default_serializer`: ``bytes`` as they are, ``str`` as UTF-8, None stays None (a null value: a
  tombstone on a compacted topic), ``int`` and ``float`` as their decimal text, ``bool``, ``dict``, ``list`` and
  ``tuple`` as compact JSON. Anything else fails the batch with a ``TypeError`` naming the batch, the partition
  and the record's position, and the way out (pass a serializer). Kafka partitions records by key with the Java
  client's partitioner (``murmur2_random``): a key lands where a Java producer would put it; records without a
  key are spread.
* **Refused records** (``deadLetterTopic``, ``saveToKafka(..., onError="deadLetter")``): a record that cannot be
  encoded (a ``TypeError`` of the default serializer, a ``keyFunc``/``valueFunc``/serializer that raises) or that
  the producer refuses as too large (``message.max.bytes``) is written instead to the dead-letter topic, in the
  same transaction as the batch's records (exactly once for ``read_committed`` readers, like them): no key, the
  value a JSON object ``output, batch_ms, part, row, record`` (its ``repr``, cut to 1,000 characters), ``error``.
  A record the broker refuses at the commit (a topic whose ``max.message.bytes`` is below the client's) still fails
  the partition's transaction: no single record can be told from the commit's error.
* **Exactly once** (``guarantee="exactly-once"``, the default). Partition ``p`` of the output RDD of batch ``t`` is
  written by its Spark task in ONE Kafka transaction under the stable ``transactional.id``
  ``dstreams-<output hash>-<p>``. The same transaction commits, through ``send_offsets_to_transaction``, the
  offset ``t`` (the batch time in ms) of partition 0 of the **ledger topic** (``ledgerTopic``, default
  ``dstreams-ledger``; one partition, nothing is ever produced to it, it only anchors offsets) for the consumer
  group ``dstreams-sink.<output hash>.<p>``: the group's committed offset IS the last batch written by that
  output partition, and it becomes visible atomically with the batch's records (KIP-98). The offset's metadata
  holds ``{"epoch": driver epoch, "token": write id, "records": n, "producer": producer instance}``. A task:

  1. takes this Python worker's producer for its ``transactional.id`` (kept across batches), or makes one and
     calls ``init_transactions``, which **fences** every older producer of the id (a speculative copy, an
     earlier attempt of the task, a killed Python worker, a zombie driver's task, the producer of another Python
     worker that ran the partition before) and aborts its open transaction;
  2. reads the ledger with a ``read_committed`` consumer (``committed()`` waits out pending transactional offset
     commits, KIP-447): an entry at or after ``t`` means the batch is already written: the task writes nothing
     (a re-run batch, a retried task whose first attempt committed, a driver restarted after a kill). An entry
     written by a driver with a higher epoch than this one's fails the task with :class:`KafkaSinkFencedError`
     (this driver is a zombie);
  3. begins the transaction, produces the partition's records, sends the ledger offset, commits. A kept producer
     that the ledger shows was not the last to commit (the partition ran in another Python worker since: that one
     fenced it) is replaced by a new one first (2-10 ms). So is a kept producer that reported a broker error (every
     broker down, connections refused: a broker restart, an outage) since its last ledger entry, with its ledger
     consumer: after such an outage librdkafka (2.10 and later) would send the next ledger offset to a group
     coordinator it has dropped and wait for it forever (confluentinc/librdkafka#5511). A producer that reports one
     while it writes, after its first ledger entry, gives its transaction up, and so does one whose
     ``send_offsets_to_transaction`` has not returned :data:`SEND_OFFSETS_GRACE_S` after its timeout (librdkafka
     does not always keep it, #5456; the call is left to a helper thread): the write is retried once with a new
     producer, whose ``init_transactions`` aborts the given-up transaction.

  A copy of the task that lost the race to another copy fails to commit (it was fenced: its records are aborted,
  invisible to ``read_committed`` readers); it waits a moment (:data:`FENCED_BACKOFF_S`), retries once with a new
  producer, finds the batch in the ledger and returns 0 (or, fenced a second time, fails: Spark keeps the other
  copy's result). Empty partitions write nothing and start no transaction. Kill (and pause) points for tests
  (:mod:`dstreams.faults`): ``kafka-before-commit`` (the records and the ledger offset are in the open
  transaction) and ``kafka-after-commit`` (the commit returned).
* **Visibility.** Each partition's transaction commits on its own: a batch becomes visible partition by partition,
  and a batch that failed may have some partitions visible; its retry (or its re-run after a restart) writes the
  others and skips those. Records of one key keep their order when they come from one partition of the output RDD
  (e.g. after ``reduceByKey`` or ``partitionBy``), and batches are visible in order.
* **Consumers** must read with ``isolation.level=read_committed`` (confluent-kafka's and dstreams' readers do by
  default; the Java consumer's default is ``read_uncommitted``): only they skip the records of aborted
  transactions. A record then appears exactly once, whatever is killed or re-run.
* **Batches one at a time.** A ledger entry is monotonic per output partition (``t`` written means every earlier
  batch is written too): the sink refuses a context with ``concurrentBatches > 1``.
* **Fencing.** The driver calls ``guard()`` (the metadata log's ``check_owner``) before the batch's job and passes
  its epoch to the tasks; a task checks it against the ledger's (step 2). **The claim at start**
  (:func:`claim_at_start`, issue 42) makes that hold from the moment a new driver takes its epoch: a driver with a
  checkpoint location runs it for each exactly-once output when it starts (``OutputNode.on_start``: in
  ``StartedDriver.start`` after the metadata log gave it its epoch and before the runtime generates the first
  batch; once per start, on the driver, not in a batch: it does not depend on which batch comes first or on
  the output being computed). For every output partition ``p`` whose ledger group exists (the admin client lists
  the groups ``dstreams-sink.<output hash>.*``; up to :data:`CLAIM_THREADS` partitions at once), a new producer
  of ``dstreams-<output hash>-<p>`` calls ``init_transactions`` (fencing every older producer of the id, a zombie
  driver's task among them, and aborting its open transaction: a zombie's open transaction never holds up the new
  owner, nor ``read_committed`` readers), reads the ledger and commits, in one transaction of its own, the same
  ledger offset again (the same batch; ``token`` and ``records`` kept, ``epoch`` this driver's, ``producer`` the
  claim's, ``"claim": true``). From then on a zombie's task either has a fenced producer (its commit fails) or,
  initialising a new one, reads the higher epoch (:class:`KafkaSinkFencedError`). A zombie's task that
  re-initialises during the claim fences the claim's producer: that partition's claim starts again (a new
  producer fences the zombie's in its turn), up to :data:`CLAIM_ATTEMPTS` times, then the start fails naming the
  transactional id (an older driver is still writing: stop it). The claim fails the start with
  :class:`KafkaSinkFencedError` when a newer driver wrote the ledger already, and with :class:`KafkaSinkError` when
  the brokers do not answer (listing the groups: up to 30 s). Limits: an output partition that never had a ledger
  group (the output never wrote it) cannot be claimed: a zombie's first write of it, racing the owner, is the same
  records (functions are deterministic, the batch's input is fixed in the metadata log), which the owner then finds
  in the ledger; so is a zombie's commit that wins the race against a claim still in progress. Nothing is claimed
  without a checkpoint location (no epoch) or for ``guarantee="at-least-once"``. Cost: one transaction per output
  partition with a ledger group, when the driver starts: measured on the project's single-node broker (a loaded
  2-core machine; one batch written per partition, then ``claim_at_start`` timed around the call, 5 claims per size,
  two runs) a median of 7 ms with no ledger group (listing the groups), 16-30 ms for 1 partition, 33-46 ms for 2,
  about 125 ms for 8 and about 470 ms for 32 (761 ms for 32 one partition at a time).
* **The output's name** (``outputName``) keys the transactional ids and the ledger groups. It defaults to the
  topic and the checkpoint location (the topic alone without a checkpoint location): two outputs writing one
  topic need distinct names, and a job restarted on a new checkpoint location starts a new ledger. A ledger says
  which batch *times* were written: a job that starts over at earlier batch times under the same name (a manual
  clock, a clock set back) skips them; give it a new ``outputName``.
* **Records written** (``OutputOperationInfo.records_written``): the records the batch's commits added; a
  partition committed by an earlier attempt of this driver's write of the batch counts once, one committed by
  another driver (before a restart) or by an earlier, successful write of the same batch counts 0.
* **At least once** (``guarantee="at-least-once"``): an idempotent producer (no duplicates from the producer's own
  retries), no transactions, no ledger: each task produces its partition and flushes. Faster; a re-run batch or a
  retried task writes its records again.
* **Errors.** The output topic must exist (``auto.create.topics.enable`` is not relied on): a missing one fails the
  first batch naming it and how to create it. The ledger topic is created by the driver when missing; if that is
  not allowed, the error says how to create it. A record the producer refuses (larger than ``message.max.bytes``)
  fails the task naming the batch, the partition and the record's position and size; a record the broker refuses
  fails the partition's commit, naming the likely cause; either way nothing of the partition's transaction becomes
  visible. Brokers that do not answer fail the task after ``transaction.timeout.ms`` (the timeout of every blocking
  call of the sink, ``send_offsets_to_transaction`` given up :data:`SEND_OFFSETS_GRACE_S` later and retried once
  with a new producer; of the driver's topic checks too, up to 30 s) with a message naming them; Spark's task
  retries, then the batch's retries apply, and nothing is committed twice.
* **Clients.** ``kafkaParams`` are librdkafka settings (:mod:`dstreams.kafka.params`); the sink adds
  :data:`CLIENT_DEFAULTS` unless they are set (connections to every broker made up front: a new producer is ready in
  milliseconds). Each Python worker keeps up to :data:`MAX_CACHED_CLIENTS` producers (one per output partition it
  wrote), least recently used dropped first, and not one that reported a broker error since its last ledger entry
  (step 3). The transactional producer has no delivery callbacks (an error callback only): a record the broker
  refuses fails the commit (the error names the likely cause); the at-least-once producer reports failed deliveries.
* **Limits.** A partition's encoded records are held in the task's memory until its transaction commits (a task
  fenced half-way retries with them). ``transaction.timeout.ms`` (default here 60 s unless ``kafkaParams`` sets
  it; at most the broker's ``transaction.max.timeout.ms``) must exceed the time to produce one partition. A
  producer that dies with an open transaction (a killed executor) blocks ``read_committed`` readers of the
  partitions it wrote (the last stable offset stops) until its ``transactional.id`` is used again (the task's
  retry, the batch's re-run after a restart) or ``transaction.timeout.ms`` passes: keep it moderate. Ledger
  entries are consumer-group offsets: they expire after the broker's ``offsets.retention.minutes`` (7 days by
  default) without a commit; a job stopped longer than that re-writes the batch it was killed in, if any.

This module is an engine module: it imports neither the api nor the recovery layer, and ``confluent_kafka`` only
when a client is made (executors import it when they unpickle a task).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import TYPE_CHECKING, Any

from dstreams.errors import DStreamsError
from dstreams.faults import task_reached
from dstreams.output_records import add_written

from .params import PRODUCER_ONLY, admin_config, client_error, normalize, producer_config, reader_config, require_client

if TYPE_CHECKING:
    from pyspark import RDD

log = logging.getLogger(__name__)

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE)
DEFAULT_LEDGER_TOPIC = "dstreams-ledger"
#: ``transaction.timeout.ms`` unless ``kafkaParams`` sets it; also bounds every blocking call of the sink.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: Driver-side admin calls (topic checks, the ledger topic's creation).
ADMIN_TIMEOUT_S = 30.0
#: Producers (with their ledger consumers) kept per Python worker process, least recently used dropped first.
MAX_CACHED_CLIENTS = 16
#: How long a copy of a task fenced by another copy waits before it tries again (random, seconds).
FENCED_BACKOFF_S = (0.05, 0.3)
#: How long past its own timeout a task waits for ``send_offsets_to_transaction`` before it gives the producer up (the
#: call does not always keep its timeout: see :func:`_send_offsets`).
SEND_OFFSETS_GRACE_S = 5.0
#: Records produced between two polls of the producer's delivery reports.
POLL_EVERY = 5000
#: Client settings the sink uses unless ``kafkaParams`` set them: connect to every broker when a client is made (with
#: librdkafka's default, connecting on first use, a new producer's ``init_transactions`` waited ~500 ms for its
#: coordinator's connection about half the time, against 2-10 ms so), and no Nagle delay on the small requests of a
#: transaction.
CLIENT_DEFAULTS: dict[str, Any] = {"enable.sparse.connections": False, "socket.nagle.disable": True}
Serializer = Callable[[Any], Any]


class KafkaSinkError(DStreamsError, RuntimeError):
    """A batch could not be written to its topic: the message says which batch, partition and (where it is one
    record's fault) record, and what to do."""


class KafkaSinkFencedError(KafkaSinkError):
    """The ledger of this output was written by a driver with a higher epoch: this driver is a zombie and must not
    write (FencedError is the metadata log's name for the same condition)."""


# --------------------------------------------------------------------------------------------- encoding


def default_serializer(value: Any) -> bytes | None:
    """``bytes`` as they are, ``str`` as UTF-8, None as None, ``int``/``float`` as decimal text, ``bool``,
    ``dict``, ``list`` and ``tuple`` as compact JSON; a ``TypeError`` for anything else."""
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool) or isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise TypeError(f"{type(value).__name__} that JSON cannot encode ({e})") from None
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value).encode()
        return str(value).encode()
    raise TypeError(f"{type(value).__name__} (the default serializer takes bytes, str, int, float, bool, dict, "
                    "list, tuple or None)")


def _user_serialized(out: Any, what: str) -> bytes | None:
    if out is None or type(out) is bytes:
        return out
    if isinstance(out, str):
        return out.encode("utf-8")
    if isinstance(out, (bytearray, memoryview)):
        return bytes(out)
    raise TypeError(f"{what}Serializer returned a {type(out).__name__}; it must return bytes, str or None")


@dataclass(frozen=True)
class KafkaSinkTarget:
    """Where and how an output writes. ``params`` are normalized ``kafkaParams`` (:func:`dstreams.kafka.params.
    normalize`); ``output`` is the output's name (it keys the transactional ids and the ledger groups)."""

    topic: str
    params: Mapping[str, Any]
    output: str
    guarantee: str = EXACTLY_ONCE
    ledger_topic: str = DEFAULT_LEDGER_TOPIC
    key_func: Callable[[Any], Any] | None = None
    value_func: Callable[[Any], Any] | None = None
    key_serializer: Serializer | None = None
    value_serializer: Serializer | None = None
    #: Where refused records go (module docstring); None: they fail the batch.
    dead_letter_topic: str | None = None

    @property
    def digest(self) -> str:
        """A stable hash of the output's name (Python's ``hash`` differs between processes)."""
        return hashlib.sha1(self.output.encode("utf-8")).hexdigest()[:16]

    def transactional_id(self, partition: int) -> str:
        return f"dstreams-{self.digest}-{partition}"

    def ledger_group(self, partition: int) -> str:
        return f"dstreams-sink.{self.digest}.{partition}"

    def where(self, batch_ms: int, partition: int) -> str:
        return f"saveToKafka({self.topic!r}): batch {batch_ms}, partition {partition}"

    def encode(self, record: Any) -> tuple[bytes | None, bytes | None]:
        """``(key, value)`` of one record as bytes (see the module docstring); ``TypeError`` for a part that
        cannot be encoded."""
        pair = isinstance(record, (tuple, list)) and len(record) == 2
        key = self.key_func(record) if self.key_func is not None else (record[0] if pair else None)
        value = self.value_func(record) if self.value_func is not None else (record[1] if pair else record)
        return self._part(key, "key", self.key_serializer), self._part(value, "value", self.value_serializer)

    @staticmethod
    def _part(obj: Any, what: str, serializer: Serializer | None) -> bytes | None:
        if serializer is not None:
            return _user_serialized(serializer(obj), what)
        try:
            return default_serializer(obj)
        except TypeError as e:
            raise TypeError(f"the {what} {obj!r:.200} is a {e}: pass {what}Serializer=<a function {what} -> bytes> "
                            f"(or {what}Func=<record -> {what}>) to saveToKafka") from None


def make_target(topic: str, kafka_params: Mapping[str, Any] | None, output: str | None = None,
                guarantee: str = EXACTLY_ONCE, ledger_topic: str = DEFAULT_LEDGER_TOPIC,
                key_func: Callable[[Any], Any] | None = None, value_func: Callable[[Any], Any] | None = None,
                key_serializer: Serializer | None = None, value_serializer: Serializer | None = None,
                dead_letter_topic: str | None = None) -> KafkaSinkTarget:
    """Check the arguments of ``saveToKafka`` (``ValueError`` / ``KafkaConfigError`` naming what is wrong) and make
    the target; ``output`` defaults to the topic (the api layer passes the topic and the checkpoint location)."""
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"saveToKafka needs a topic name (a non-empty str), got {topic!r}")
    if guarantee not in GUARANTEES:
        raise ValueError(f"saveToKafka's guarantee must be one of {GUARANTEES}, got {guarantee!r}")
    if not isinstance(ledger_topic, str) or not ledger_topic:
        raise ValueError(f"saveToKafka's ledgerTopic must be a topic name, got {ledger_topic!r}")
    if ledger_topic == topic:
        raise ValueError(f"saveToKafka's ledgerTopic must not be the output topic {topic!r}: the ledger holds no "
                         "records, only the sink's committed offsets")
    for name, fn in (("keyFunc", key_func), ("valueFunc", value_func), ("keySerializer", key_serializer),
                     ("valueSerializer", value_serializer)):
        if fn is not None and not callable(fn):
            raise ValueError(f"saveToKafka's {name} must be a function, got {fn!r}")
    if output is not None and (not isinstance(output, str) or not output):
        raise ValueError(f"saveToKafka's outputName must be a non-empty str, got {output!r}")
    if dead_letter_topic is not None and (not isinstance(dead_letter_topic, str) or not dead_letter_topic
                                          or dead_letter_topic in (topic, ledger_topic)):
        raise ValueError("saveToKafka's deadLetterTopic must be a topic name other than the output and ledger topics, "
                         f"got {dead_letter_topic!r}")
    params = normalize(kafka_params)
    if str(params.get("transactional.id", "")) and guarantee == EXACTLY_ONCE:
        log.warning("kafkaParams: transactional.id is ignored: the exactly-once sink uses one id per output "
                    "partition, dstreams-<output hash>-<partition>")
    return KafkaSinkTarget(topic, params, output or topic, guarantee, ledger_topic, key_func, value_func,
                           key_serializer, value_serializer, dead_letter_topic)


# --------------------------------------------------------------------------------------------- the driver side

_prepared: set[tuple[str, str, str, str]] = set()
_prepared_lock = threading.Lock()


def _servers(target: KafkaSinkTarget) -> str:
    return str(target.params.get("bootstrap.servers"))


def _admin(target: KafkaSinkTarget) -> tuple[Any, float]:
    """An admin client of ``target``'s brokers and the timeout its calls get (seconds)."""
    ck = require_client()
    from confluent_kafka.admin import AdminClient

    conf = admin_config(target.params)
    try:
        admin = AdminClient(conf)
    except ck.KafkaException as e:
        raise client_error("admin client", conf, e) from None
    return admin, min(ADMIN_TIMEOUT_S, _timeout_s(target.params))


def prepare_topics(target: KafkaSinkTarget) -> None:
    """On the driver, once per process and target: check that the output topic exists and (exactly once) that the
    ledger topic exists, creating it (one partition) when it does not. :class:`KafkaSinkError` naming the topic and
    how to create it otherwise."""
    ledger = target.ledger_topic if target.guarantee == EXACTLY_ONCE else ""
    key = (_servers(target), target.topic, ledger, target.dead_letter_topic or "")
    with _prepared_lock:
        if key in _prepared:
            return
    admin, timeout_s = _admin(target)
    servers = _servers(target)
    topics = _list_topics(admin, servers, timeout_s)
    if target.topic not in topics:
        raise KafkaSinkError(
            f"saveToKafka: the topic {target.topic!r} does not exist on the Kafka cluster at {servers}: create it "
            f"first, e.g. kafka-topics.sh --bootstrap-server {servers} --create --topic {target.topic} --partitions "
            "<N> (the sink never creates its output topic)")
    dlq = target.dead_letter_topic
    if dlq is not None and dlq not in topics:
        raise KafkaSinkError(
            f"saveToKafka: the dead-letter topic {dlq!r} does not exist on the Kafka cluster at {servers}: create it "
            f"first, e.g. kafka-topics.sh --bootstrap-server {servers} --create --topic {dlq} (the sink never "
            "creates a topic it writes)")
    if ledger and ledger not in topics:
        _create_ledger(admin, target, timeout_s)
    with _prepared_lock:
        _prepared.add(key)


def _list_topics(admin: Any, servers: str, timeout_s: float) -> set[str]:
    ck = require_client()
    try:
        md = admin.list_topics(timeout=timeout_s)
    except ck.KafkaException as e:
        raise KafkaSinkError(f"saveToKafka: the Kafka brokers at {servers} did not answer within {timeout_s:.0f} s "
                             f"({e.args[0]}): is the cluster up and bootstrap.servers right?") from None
    return {name for name, t in md.topics.items() if t.error is None}


def _create_ledger(admin: Any, target: KafkaSinkTarget, timeout_s: float) -> None:
    ck = require_client()
    from confluent_kafka.admin import NewTopic

    ledger, servers = target.ledger_topic, _servers(target)
    futures = admin.create_topics([NewTopic(ledger, num_partitions=1, replication_factor=-1)],
                                  operation_timeout=timeout_s, request_timeout=timeout_s)
    try:
        futures[ledger].result(timeout_s)
        log.info("saveToKafka: created the ledger topic %r (1 partition) on %s", ledger, servers)
    except ck.KafkaException as e:
        if e.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaSinkError(
                f"saveToKafka: the ledger topic {ledger!r} does not exist on the Kafka cluster at {servers} and "
                f"could not be created ({e.args[0]}). Create it (one partition; nothing is ever written to it, the "
                f"sink commits its consumer-group offsets there): kafka-topics.sh --bootstrap-server {servers} "
                f"--create --topic {ledger} --partitions 1; or pass ledgerTopic=<an existing topic>") from None
    deadline = time.monotonic() + timeout_s
    while ledger not in _list_topics(admin, servers, timeout_s):
        if time.monotonic() > deadline:
            raise KafkaSinkError(f"saveToKafka: the ledger topic {ledger!r} was created on {servers} but its metadata "
                                 f"did not show within {timeout_s:.0f} s")
        time.sleep(0.1)


#: The write id of each batch of an output this driver is writing: the same for the retries of a failed write
#: (their partitions committed by an earlier attempt count once), a new one for a batch written before.
_tokens: dict[tuple[str, int], str] = {}
_tokens_lock = threading.Lock()


def save_to_kafka(rdd: RDD, batch_ms: int, target: KafkaSinkTarget, guard: Callable[[], None] | None = None,
                  epoch: int | None = None, before_write: Callable[[], None] | None = None) -> int:
    """Write batch ``batch_ms`` of ``rdd`` to ``target`` (module docstring); returns the records written.
    ``guard()`` (the fence check) runs before the write's job, then ``before_write()`` (the api layer's driver-side
    fault point ``sink-write``)."""
    prepare_topics(target)
    if guard is not None:
        guard()
    if before_write is not None:
        before_write()
    with _tokens_lock:
        token = _tokens.setdefault((target.output, batch_ms), uuid.uuid4().hex)
    results = rdd.mapPartitionsWithIndex(partition_writer(target, batch_ms, epoch, token)).collect()
    with _tokens_lock:
        for k in [k for k in _tokens if k[0] == target.output and k[1] <= batch_ms]:
            del _tokens[k]
    written = sum(n for _p, n, _skipped in results)
    skipped = [p for p, _n, was in results if was]
    if skipped:
        log.info("saveToKafka(%r): batch %d: partitions %s were already committed (%d records written now)",
                 target.topic, batch_ms, skipped, written)
    add_written(written)
    return written


# --------------------------------------------------------------------------------------------- the task side


def partition_writer(target: KafkaSinkTarget, batch_ms: int, epoch: int | None = None, token: str = ""
                     ) -> Callable[[int, Iterable[Any]], Iterator[tuple[int, int, bool]]]:
    """The executor side of one batch: writes partition ``p`` and yields ``(p, records written, already
    committed)``."""

    def write(p: int, records: Iterable[Any]) -> Iterator[tuple[int, int, bool]]:
        n, skipped = write_partition(target, batch_ms, p, records, epoch, token)
        yield p, n, skipped

    return write


def write_partition(target: KafkaSinkTarget, batch_ms: int, partition: int, records: Iterable[Any],
                    epoch: int | None = None, token: str = "") -> tuple[int, bool]:
    """Write one partition of a batch (module docstring); returns ``(records written, already committed)``. Safe to
    call from two threads or processes for the same batch and partition: one copy's records become visible."""
    it = iter(records)
    first = next(it, _EMPTY)
    if first is _EMPTY:
        return 0, False
    if target.guarantee == AT_LEAST_ONCE:
        return _write_at_least_once(target, batch_ms, partition, chain((first,), it)), False
    return _write_exactly_once(target, batch_ms, partition, chain((first,), it), epoch, token)


_EMPTY = object()


@dataclass(eq=False)
class _Clients:
    """This process's producer for one configuration (one ``transactional.id``), with its ledger consumer (exactly
    once) and the delivery errors of the write that uses it (at least once)."""

    conf: dict[str, Any]
    consumer_conf: dict[str, Any] | None = None
    producer: Any = None
    consumer: Any = None
    ready: bool = False  # init_transactions done
    instance: str = ""  # this producer instance's id, written into the ledger entries it commits
    pid: int = field(default_factory=os.getpid)
    errors: list[tuple[Any, Any]] = field(default_factory=list)
    # Exactly once: the errors the producer reported (its error callback: brokers down, connections refused) since
    # its last ledger entry, and whether it sent one (librdkafka then keeps the group coordinator it found for it).
    broker_errors: list[Any] = field(default_factory=list)
    coordinator_known: bool = False

    def new_producer(self) -> None:
        """Replace the producer by a new instance (not yet initialized)."""
        ck = require_client()
        self.drop_producer()
        # Delivery reports (failures only) for the at-least-once producer; the transactional one has none: its commit
        # fails when a record was not delivered. (With delivery callbacks, confluent-kafka 2.16 was seen to call one
        # with a Python exception pending when its producer was fenced half-way through a flush: a SystemError.)
        # The transactional one reports its errors (brokers down, ...) instead: see _broker_trouble. A list of its own
        # per producer: a producer given up but still in use by another thread (_send_offsets) records nothing here.
        self.broker_errors, self.coordinator_known = [], False
        callbacks = ({"error_cb": _broker_error_recorder(self.broker_errors)} if "transactional.id" in self.conf
                     else {"on_delivery": _error_recorder(self.errors), "delivery.report.only.error": True})
        try:
            self.producer = ck.Producer({**self.conf, **callbacks})
        except ck.KafkaException as e:
            raise client_error("producer", self.conf, e) from None
        self.ready, self.instance = False, uuid.uuid4().hex[:16]

    def drop_producer(self) -> None:
        """Drop the producer without waiting for a broker (fenced, broken): its queued records are purged and its last
        reference goes here, so that it is destroyed now, in this thread (under :data:`_lifecycle`)."""
        if self.producer is None or self.pid != os.getpid():
            self.producer = None
            return
        try:
            self.producer.purge()
        except Exception:  # fenced, fatal: nothing to purge
            pass
        with _lifecycle:
            self.producer, self.ready = None, False

    def give_up_producer(self) -> None:
        """Forget a producer that another thread is still blocked in (:func:`_send_offsets`): that thread drops the
        last reference when the call returns. Nothing is purged (that could wait on the stuck instance)."""
        with _lifecycle:
            self.producer, self.ready = None, False

    def ledger_consumer(self) -> Any:
        if self.consumer is None:
            ck = require_client()
            try:
                self.consumer = ck.Consumer(self.consumer_conf)
            except ck.KafkaException as e:
                raise client_error("ledger consumer", self.consumer_conf or {}, e) from None
        return self.consumer

    def close(self) -> None:
        self.drop_producer()
        if self.consumer is not None and self.pid == os.getpid():
            try:
                self.consumer.close()
            except Exception:
                pass
        self.consumer = None


def _error_recorder(errors: list[tuple[Any, Any]]) -> Callable[[Any, Any], None]:
    """The at-least-once producer's delivery callback (failed deliveries only): keeps the first errors in ``errors``.
    A closure over the list, not a method of :class:`_Clients`: a producer referring to its own holder would be a
    reference cycle, freed by the garbage collector at any moment in any thread, with confluent-kafka's destructor
    running there."""

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None and len(errors) < 10:
            errors.append((err, msg))

    return on_delivery


def _broker_error_recorder(errors: list[Any]) -> Callable[[Any], None]:
    """The transactional producer's error callback (served by its ``poll``, ``flush`` and transactional calls): keeps
    the first errors in ``errors``. A closure over the list, for the reason given at :func:`_error_recorder`."""

    def on_error(err: Any) -> None:
        if len(errors) < 10:
            errors.append(err)

    return on_error


_clients: OrderedDict[tuple[Any, ...], _Clients] = OrderedDict()
_clients_lock = threading.Lock()
#: Held while a producer is destroyed or initialized. With two threads of one process writing the same partition (the
#: tests' copies of a task), a fenced producer destroyed while another thread's producer ran ``init_transactions``
#: corrupted the heap (librdkafka 2.x, about once in 100 races: glibc's "double free or corruption" at the exit of
#: the destroyed producer's thread). A Python worker runs one task at a time, so the lock is uncontended there.
_lifecycle = threading.RLock()


def _cache_key(conf: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(v)) for k, v in conf.items()))


def _checkout(key: tuple[Any, ...]) -> _Clients | None:
    """This process's clients for ``key``, taken out of the cache (a second user at the same time makes its own)."""
    with _clients_lock:
        clients = _clients.pop(key, None)
    if clients is not None and clients.pid != os.getpid():  # inherited through a fork: never touch it
        return None
    return clients


def _checkin(key: tuple[Any, ...], clients: _Clients) -> None:
    clients.errors.clear()
    with _clients_lock:
        old = _clients.pop(key, None)
        _clients[key] = clients
        evicted = [_clients.popitem(last=False)[1] for _ in range(max(0, len(_clients) - MAX_CACHED_CLIENTS))]
    for c in ([old] if old is not None else []) + evicted:
        c.close()


def _timeout_s(conf: Mapping[str, Any]) -> float:
    return max(2.0, float(conf.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)) / 1000.0)


def _with_defaults(conf: dict[str, Any]) -> dict[str, Any]:
    for k, v in CLIENT_DEFAULTS.items():
        conf.setdefault(k, v)
    return conf


def _record_error(err: Any) -> bool:
    """An error of ``produce()`` that is the record's fault (the others are the producer's state: fenced, a failed
    transaction)."""
    ck = require_client()
    return err.code() in (ck.KafkaError.MSG_SIZE_TOO_LARGE, ck.KafkaError.INVALID_MSG_SIZE, ck.KafkaError._INVALID_ARG)


def _produce(clients: _Clients, target: KafkaSinkTarget, batch_ms: int, partition: int,
             encoded: Iterable[Encoded]) -> int:
    """Produce ``encoded`` records (each to its topic: the output's or the dead-letter topic) waiting on a full
    queue; a record the producer refuses goes to the dead-letter topic when there is one. Returns how many went to
    the output topic."""
    ck = require_client()
    n = sent = 0
    # ``clients.producer``, never a local: a failed write's traceback must not keep a discarded producer alive
    for row, topic, key, value in encoded:
        while True:
            try:
                clients.producer.produce(topic, value, key)
                break
            except BufferError:
                clients.producer.poll(0.05)
            except ck.KafkaException as e:
                err = e.args[0]
                if not _record_error(err):  # the producer's state (fenced, a failed transaction): for the caller
                    raise
                error = f"the producer refused it: {err.str()} ({err.name()}){_too_large_hint(err, key, value)}"
                if target.dead_letter_topic is None or topic != target.topic:
                    raise KafkaSinkError(f"{target.where(batch_ms, partition)}, record {row}: {error}"
                                         f"{_DEAD_LETTER_HINT if topic == target.topic else ''}") from None
                shown = f"<{len(key or b'') + len(value or b'')} bytes; key {key!r:.200}, value {value!r:.400}>"
                topic, key, value = target.dead_letter_topic, None, _dead_letter(target, batch_ms, partition, row,
                                                                                  shown, error)
                continue
        if topic == target.topic:
            n += 1
        sent += 1
        if sent % POLL_EVERY == 0:
            clients.producer.poll(0)
    return n


#: A record ready to produce: (its position in the partition, topic, key, value).
Encoded = tuple[int, str, "bytes | None", "bytes | None"]
_DEAD_LETTER_HINT = ("; saveToKafka(..., onError='deadLetter', deadLetterTopic=...) writes such records to a "
                     "dead-letter topic instead and goes on")


def _dead_letter(target: KafkaSinkTarget, batch_ms: int, partition: int, row: int, shown: str, error: str) -> bytes:
    """A refused record's dead-letter value (module docstring)."""
    return json.dumps({"output": target.output, "batch_ms": batch_ms, "part": partition, "row": row,
                       "record": shown[:1000], "error": error[:2000]}, separators=(",", ":")).encode("utf-8")


def _too_large_hint(err: Any, key: bytes | None, value: bytes | None) -> str:
    ck = require_client()
    if err.code() not in (ck.KafkaError.MSG_SIZE_TOO_LARGE,):
        return ""
    size = len(key or b"") + len(value or b"")
    return (f"; the record is {size} bytes: raise message.max.bytes in kafkaParams and the topic's max.message.bytes "
            "(or the broker's message.max.bytes), or write smaller records")


def _missing_topic(clients: _Clients, target: KafkaSinkTarget) -> str:
    """A hint when the output topic does not exist (any more), else ""."""
    try:
        t = clients.producer.list_topics(target.topic, timeout=10).topics.get(target.topic)
    except Exception:  # only for the message
        return ""
    if t is not None and t.error is None:
        return ""
    return (f"the topic {target.topic!r} does not exist (any more) on {_servers(target)}: create it (kafka-topics.sh "
            f"--create --topic {target.topic})")


def _delivery_error(clients: _Clients, target: KafkaSinkTarget, batch_ms: int, partition: int) -> KafkaSinkError:
    """Records the at-least-once producer could not deliver (its delivery reports)."""
    ck = require_client()
    err, msg = clients.errors[0]
    hint = _too_large_hint(err, msg.key(), msg.value()) if err.code() == ck.KafkaError.MSG_SIZE_TOO_LARGE else ""
    missing = _missing_topic(clients, target)
    hint += f": {missing}" if missing else ""
    return KafkaSinkError(f"{target.where(batch_ms, partition)}: {len(clients.errors)} record(s) not delivered, the "
                          f"first (key {msg.key()!r:.100}) with {err.str()} ({err.name()}){hint}")


def _undelivered_error(clients: _Clients, target: KafkaSinkTarget, batch_ms: int, partition: int, err: Any
                       ) -> KafkaSinkError:
    """Records of a transaction that the broker refused (the exactly-once producer has no delivery callbacks: the
    commit reports them): the reason, with the likely causes checked."""
    hint = _missing_topic(clients, target) or (
        "the usual causes: the topic was deleted, a record is larger than the topic's max.message.bytes, the client "
        "may not write the topic")
    return KafkaSinkError(f"{target.where(batch_ms, partition)}: the broker did not take the partition's records "
                          f"({err.str()}); nothing of the partition was committed; {hint}")


def _encoded(target: KafkaSinkTarget, batch_ms: int, partition: int, records: Iterable[Any]) -> Iterator[Encoded]:
    topic, dlq = target.topic, target.dead_letter_topic
    for i, record in enumerate(records):
        try:
            key, value = target.encode(record)
        except Exception as e:
            if dlq is not None:
                try:
                    shown = repr(record)
                except Exception:  # noqa: BLE001 - a repr that raises too
                    shown = f"<{type(record).__name__} whose repr raises>"
                yield i, dlq, None, _dead_letter(target, batch_ms, partition, i, shown, f"{type(e).__name__}: {e}")
                continue
            if isinstance(e, TypeError):
                raise TypeError(f"{target.where(batch_ms, partition)}, record {i}: {e}{_DEAD_LETTER_HINT}") from None
            raise KafkaSinkError(f"{target.where(batch_ms, partition)}, record {i}: keyFunc, valueFunc or a serializer "
                                 f"failed on {record!r:.200}: {type(e).__name__}: {e}{_DEAD_LETTER_HINT}") from e
        yield i, topic, key, value


def _kafka_failure(target: KafkaSinkTarget, batch_ms: int, partition: int, step: str, e: BaseException,
                   timeout_s: float) -> KafkaSinkError:
    err = e.args[0] if e.args else e
    code = getattr(err, "name", lambda: "")()
    if target.guarantee == EXACTLY_ONCE and _fenced(e):
        return KafkaSinkError(f"{target.where(batch_ms, partition)}: fenced in {step} ({err}): another copy of this "
                              f"task (a speculative or retried attempt, or a zombie driver's task) took over the "
                              f"transactional id {target.transactional_id(partition)} twice; this copy gives up and "
                              "wrote nothing, the other one writes the partition")
    if code in ("_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_MSG_TIMED_OUT", "REQUEST_TIMED_OUT"):
        return KafkaSinkError(f"{target.where(batch_ms, partition)}: the Kafka brokers at {_servers(target)} did not "
                              f"answer ({step}, waited up to {timeout_s:.0f} s: {err}); is the cluster up? The task's "
                              "retry, then the batch's, write the partition "
                              + ("(once: they read the ledger first)" if target.guarantee == EXACTLY_ONCE
                                 else "(records already delivered are written again: at least once)"))
    return KafkaSinkError(f"{target.where(batch_ms, partition)}: {step} failed: {err}")


def _fenced(e: BaseException) -> bool:
    """A producer that another instance of its transactional id fenced (or that hit another fatal error)."""
    err = e.args[0] if e.args else None
    if err is None or not hasattr(err, "fatal"):
        return False
    # _STATE: produce() or a transactional call in a transaction that failed, most often because it was fenced
    return bool(err.fatal()) or err.name() in ("_FATAL", "_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH",
                                               "_STATE")


def _ledger(clients: _Clients, target: KafkaSinkTarget, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """The last batch committed by this output partition (-1 for none) and its entry's metadata."""
    ck = require_client()
    (tp,) = clients.ledger_consumer().committed([ck.TopicPartition(target.ledger_topic, 0)], timeout=timeout_s)
    if tp.error is not None:
        raise ck.KafkaException(tp.error)
    try:
        meta = json.loads(tp.metadata) if tp.metadata else {}
    except ValueError:
        meta = {}
    return (tp.offset if tp.offset >= 0 else -1), (meta if isinstance(meta, dict) else {})


def _written_before(last: int, meta: Mapping[str, Any], batch_ms: int, epoch: int | None, token: str, where: str
                    ) -> tuple[int, bool] | None:
    """What the ledger entry ``(last, meta)`` says of batch ``batch_ms``: None to write it; ``(records, True)`` when it
    was written (the records of this write's earlier attempt, same ``token``, else 0); :class:`KafkaSinkFencedError`
    when a driver with a higher epoch than ``epoch`` wrote the entry."""
    stored_epoch = meta.get("epoch")
    if epoch is not None and isinstance(stored_epoch, int) and stored_epoch > epoch:
        raise KafkaSinkFencedError(f"{where}: a newer driver (epoch {stored_epoch}) wrote this output (batch {last}); "
                                   f"this one (epoch {epoch}) was replaced and must not write (FencedError)")
    if last < batch_ms:
        return None
    same = bool(token) and meta.get("token") == token and last == batch_ms
    return (int(meta.get("records", 0)) if same else 0), True


def _exactly_once_confs(target: KafkaSinkTarget, partition: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The transactional producer's and the ledger consumer's settings for output partition ``partition``."""
    conf = _with_defaults(producer_config(target.params, target.transactional_id(partition)))
    conf.setdefault("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    consumer_conf = _with_defaults({k: v for k, v in reader_config(target.params).items() if k not in PRODUCER_ONLY})
    consumer_conf["group.id"] = target.ledger_group(partition)
    return conf, consumer_conf


def _write_exactly_once(target: KafkaSinkTarget, batch_ms: int, partition: int, records: Iterable[Any],
                        epoch: int | None, token: str) -> tuple[int, bool]:
    ck = require_client()
    conf, consumer_conf = _exactly_once_confs(target, partition)
    key = _cache_key({**conf, **{f"consumer.{k}": v for k, v in consumer_conf.items()}})
    timeout_s = _timeout_s(conf)
    where = target.where(batch_ms, partition)
    encoded: list[Encoded] | None = None
    clients = _checkout(key) or _Clients(conf, consumer_conf)
    for attempt in (1, 2):
        step = "init_transactions"
        try:
            if clients.ready and (trouble := _broker_trouble(clients)):
                # The brokers went away (a restart, an outage) since this kept producer's last ledger entry: it may
                # wait forever for the group coordinator it knew (_send_offsets). New clients take over.
                log.info("%s: the kept producer reported %s since its last write; a new one takes over", where,
                         trouble)
                clients.close()
            cached = clients.ready
            if not clients.ready:
                _init(clients, timeout_s)
            step = "reading the ledger"
            last, meta = _ledger(clients, target, timeout_s)
            try:
                done = _written_before(last, meta, batch_ms, epoch, token, where)
                if done is None and cached and last >= 0 and meta.get("producer") != clients.instance:
                    # Another instance of the id (the task ran in another Python worker since) committed after this
                    # kept producer's last commit: it fenced this one. Take a new one now rather than fail later.
                    step = "init_transactions"
                    clients.drop_producer()
                    _init(clients, timeout_s)
                    step = "reading the ledger"
                    last, meta = _ledger(clients, target, timeout_s)
                    done = _written_before(last, meta, batch_ms, epoch, token, where)
            except KafkaSinkFencedError:
                _checkin(key, clients)
                raise
            if done is not None:
                _checkin(key, clients)
                return done
            if encoded is None:
                try:
                    encoded = list(_encoded(target, batch_ms, partition, records))
                except BaseException:
                    _checkin(key, clients)
                    raise
            clients.producer.begin_transaction()
            step = "producing the records"
            try:
                n = _produce(clients, target, batch_ms, partition, encoded)
            except KafkaSinkError:
                _abort(clients, key, timeout_s)
                raise
            # The ledger entry while the records are on their way (its two round trips overlap their delivery).
            step = "send_offsets_to_transaction (the ledger entry)"
            meta_out = json.dumps({"epoch": epoch, "token": token, "records": n, "producer": clients.instance},
                                  separators=(",", ":"))
            if trouble := _broker_trouble(clients):
                raise _StaleProducerError(f"the producer reported {trouble} while it wrote")
            clients.broker_errors.clear()  # those of a producer that did not know its group coordinator yet
            _send_offsets(clients, [ck.TopicPartition(target.ledger_topic, 0, batch_ms, meta_out)], timeout_s)
            step = "flush"
            left = clients.producer.flush(timeout_s + 5.0)  # past message.timeout.ms: undelivered records have failed
            if left:
                raise ck.KafkaException(ck.KafkaError(ck.KafkaError._TIMED_OUT, f"{left} records not delivered"))
            task_reached("kafka-before-commit")
            step = "commit_transaction"
            _commit(clients, timeout_s)
            task_reached("kafka-after-commit")
            _checkin(key, clients)
            return n, False
        except _StaleProducerError as e:
            # Its open transaction (records, ledger offset) is aborted by the next instance's init_transactions.
            clients.close()
            if attempt == 1:
                log.info("%s: %s; trying once more with a new producer", where, e)
                continue
            raise KafkaSinkError(f"{where}: the Kafka brokers at {_servers(target)} did not answer ({step}: {e}); is "
                                 "the cluster up? The task's retry, then the batch's, write the partition (once: they "
                                 "read the ledger first)") from None
        except ck.KafkaException as e:
            err = e.args[0] if e.args else None
            if step == "commit_transaction" and err is not None and err.txn_requires_abort():
                error = _undelivered_error(clients, target, batch_ms, partition, err)  # records the broker refused
                _abort(clients, key, timeout_s)
                raise error from None
            clients.drop_producer()
            if attempt == 1 and _fenced(e):
                log.info("%s: the producer was fenced in %s (%s): another copy of the task is writing; trying once "
                         "more with a new producer", where, step, err)
                # A moment for the other copy to commit: the retry then finds the batch in the ledger, instead of
                # fencing the other copy in its turn (a ping-pong that makes one of them fail)
                time.sleep(random.uniform(*FENCED_BACKOFF_S))
                continue
            clients.close()
            raise _kafka_failure(target, batch_ms, partition, step, e, timeout_s) from None
    raise AssertionError("unreachable")  # pragma: no cover


class _StaleProducerError(Exception):
    """A producer not to use any further: it saw the brokers go away after it found its group coordinator, or its
    ``send_offsets_to_transaction`` did not return in time (the message says which). Retried once with new clients."""


def _broker_trouble(clients: _Clients) -> str:
    """What the exactly-once producer reported since its last ledger entry, when that makes it unsafe to use: "" if
    nothing, or if it has not sent a ledger entry yet.

    Why: after an outage of every broker it knew, librdkafka (2.10 and later: KIP-899's re-bootstrap) replaces its
    broker objects by new ones, but its cache of group coordinators keeps the old object it found for
    ``send_offsets_to_transaction``. The next ``send_offsets_to_transaction`` waits for that object to come up, which
    it never does, and the call's timeout is not enforced (confluentinc/librdkafka#5511 and #5456, open in 2.16):
    it blocks until some other connection of the producer changes state, minutes later or never. Seen as the Python
    workers hanging in it after a broker restart. An outage first shows as an error event (``_ALL_BROKERS_DOWN``,
    connections refused), served here by ``poll(0)``."""
    clients.producer.poll(0)
    if not clients.coordinator_known or not clients.broker_errors:
        return ""
    shown = "; ".join(f"{err.name()}: {err.str()}" for err in clients.broker_errors[:3])
    return f"{len(clients.broker_errors)} broker error(s) ({shown})"


def _send_offsets(clients: _Clients, offsets: list[Any], timeout_s: float) -> None:
    """``send_offsets_to_transaction`` (the ledger entry), bounded: librdkafka does not always keep the call's timeout
    (:func:`_broker_trouble`), so the call runs in a helper thread, and a producer that has not returned after
    ``timeout_s`` + :data:`SEND_OFFSETS_GRACE_S` is given up (:class:`_StaleProducerError`): it stays with that thread,
    which drops it (under :data:`_lifecycle`) if the call ever returns; the next instance's ``init_transactions``
    fences it and aborts its transaction."""
    # The producer in a list, never in a local: the thread's frame (kept by the traceback of an error it raises) must
    # not keep a given-up producer alive, and its last reference must go under _lifecycle
    held: list[Any] = [clients.producer, clients.ledger_consumer().consumer_group_metadata()]
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def call() -> None:
        try:
            held[0].send_offsets_to_transaction(offsets, held[1], timeout_s)
            outcome.append(None)
        except BaseException as e:  # raised in the task's thread below
            outcome.append(e)
        finally:
            with _lifecycle:
                held.clear()
            done.set()

    threading.Thread(target=call, name="dstreams-kafka-send-offsets", daemon=True).start()
    waited = timeout_s + SEND_OFFSETS_GRACE_S
    if not done.wait(waited):
        log.warning("send_offsets_to_transaction did not return within %.0f s (its timeout: %.0f s); the producer is "
                    "given up", waited, timeout_s)
        clients.give_up_producer()
        raise _StaleProducerError(f"send_offsets_to_transaction did not return within {waited:.0f} s")
    error = outcome.pop()
    if error is not None:
        raise error
    clients.coordinator_known = True


def _init(clients: _Clients, timeout_s: float) -> None:
    """A new producer instance, ``init_transactions``: it fences every older instance of the transactional id and
    aborts their open transaction."""
    with _lifecycle:
        if clients.producer is None:
            clients.new_producer()
        clients.ledger_consumer()
        clients.producer.init_transactions(timeout_s)
        clients.ready = True


def _abort(clients: _Clients, key: tuple[Any, ...], timeout_s: float) -> None:
    """Abort the open transaction of a write that fails, keeping the clients when that works."""
    try:
        clients.producer.abort_transaction(timeout_s)
    except Exception as e:  # the producer is broken: the next task's init_transactions aborts the transaction
        log.info("abort_transaction failed (%s); the producer is dropped", e)
        clients.drop_producer()
    _checkin(key, clients)


def _commit(clients: _Clients, timeout_s: float) -> None:
    """``commit_transaction``, resumed once when it timed out (a retriable error: calling it again resumes it)."""
    ck = require_client()
    try:
        clients.producer.commit_transaction(timeout_s)
    except ck.KafkaException as e:
        if not e.args[0].retriable():
            raise
    else:
        return
    clients.producer.commit_transaction(timeout_s)


# --------------------------------------------------------------------------------------------- the claim at start

#: How many times the claim of one output partition is tried when another producer of its ``transactional.id`` (a
#: zombie driver's task starting its write again) fences the claim's producer before it committed.
CLAIM_ATTEMPTS = 5
#: Output partitions claimed at once.
CLAIM_THREADS = 8


def claim_at_start(target: KafkaSinkTarget, epoch: int) -> dict[int, int]:
    """Take the output for the driver of ``epoch`` when it starts, before its first batch (issue 42; module
    docstring, "Fencing"): for every output partition with a ledger group, a new producer of its ``transactional.id``
    (``init_transactions`` fences every older producer of the id and aborts its open transaction) commits, in one
    transaction, the group's ledger entry again (the same batch) under ``epoch``. Returns ``{partition: batch}``
    of the entries claimed. :class:`KafkaSinkFencedError` when a newer driver wrote the ledger already;
    :class:`KafkaSinkError` when the brokers do not answer or another producer of an id fenced the claim
    :data:`CLAIM_ATTEMPTS` times. Nothing to do for an at-least-once output."""
    if target.guarantee != EXACTLY_ONCE:
        return {}
    started = time.monotonic()
    partitions = _ledger_partitions(target)
    if len(partitions) <= 1:
        batches = [_claim_partition(target, p, epoch) for p in partitions]
    else:  # the partitions' round trips overlap (init_transactions and destruction stay one at a time: _lifecycle)
        with ThreadPoolExecutor(min(CLAIM_THREADS, len(partitions)), thread_name_prefix="dstreams-kafka-claim") as pool:
            batches = list(pool.map(lambda p: _claim_partition(target, p, epoch), partitions))
    claimed = {p: b for p, b in zip(partitions, batches, strict=True) if b is not None}
    if partitions:
        log.info("saveToKafka(%r): output %r claimed for epoch %d at start: %d of %d ledger groups (%.0f ms)",
                 target.topic, target.output, epoch, len(claimed), len(partitions),
                 (time.monotonic() - started) * 1000)
    return claimed


def _ledger_partitions(target: KafkaSinkTarget) -> list[int]:
    """The output partitions that have a ledger group (``dstreams-sink.<output hash>.<p>``), in order."""
    admin, timeout_s = _admin(target)
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout_s + 5.0)
    except Exception as e:  # a KafkaException, or the future's TimeoutError
        raise KafkaSinkError(
            f"saveToKafka({target.topic!r}): the Kafka brokers at {_servers(target)} did not list their consumer "
            f"groups within {timeout_s:.0f} s ({e}); the driver claims its exactly-once outputs when it starts: is "
            "the cluster up and bootstrap.servers right?") from None
    prefix = target.ledger_group(0)[:-1]
    return sorted(int(g.group_id[len(prefix):]) for g in listed.valid
                  if g.group_id.startswith(prefix) and g.group_id[len(prefix):].isdigit())


def _claim_partition(target: KafkaSinkTarget, partition: int, epoch: int) -> int | None:
    """The claim of one output partition (:func:`claim_at_start`); returns the batch of the ledger entry claimed, or
    None when the group has no entry (its offsets expired): its producers are fenced all the same."""
    ck = require_client()
    conf, consumer_conf = _exactly_once_confs(target, partition)
    timeout_s = _timeout_s(conf)
    tid = target.transactional_id(partition)
    where = f"saveToKafka({target.topic!r}): the claim of output partition {partition} (epoch {epoch})"
    clients = _Clients(conf, consumer_conf)
    try:
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            step = "init_transactions"
            try:
                _init(clients, timeout_s)
                step = "reading the ledger"
                last, meta = _ledger(clients, target, timeout_s)
                stored = meta.get("epoch")
                if isinstance(stored, int) and stored > epoch:
                    raise KafkaSinkFencedError(
                        f"{where}: a newer driver (epoch {stored}) wrote this output (batch {last}); this one (epoch "
                        f"{epoch}) was replaced and must not write (FencedError)")
                if last < 0:
                    return None
                # The same batch, records and write id; this driver's epoch and the claim's producer (so that a kept
                # producer of a Python worker knows it was fenced: step 3).
                meta_out = json.dumps({**meta, "epoch": epoch, "producer": clients.instance, "claim": True},
                                      separators=(",", ":"))
                step = "begin_transaction"
                clients.producer.begin_transaction()
                step = "send_offsets_to_transaction (the ledger entry)"
                _send_offsets(clients, [ck.TopicPartition(target.ledger_topic, 0, last, meta_out)], timeout_s)
                step = "commit_transaction"
                _commit(clients, timeout_s)
                return last
            except _StaleProducerError as e:
                clients.close()
                if attempt == 1:
                    log.info("%s: %s; trying once more with a new producer", where, e)
                    continue
                raise KafkaSinkError(f"{where}: the Kafka brokers at {_servers(target)} did not answer ({step}: {e}); "
                                     "is the cluster up?") from None
            except ck.KafkaException as e:
                clients.drop_producer()
                if not _fenced(e):
                    raise KafkaSinkError(f"{where}: {step} failed (waited up to {timeout_s:.0f} s): "
                                         f"{e.args[0] if e.args else e}; are the Kafka brokers at {_servers(target)} "
                                         "up? The driver claims its exactly-once outputs when it starts") from None
                if attempt < CLAIM_ATTEMPTS:
                    # Another instance of the id (a zombie driver's task starting its write again) took over between
                    # this one's init_transactions and its commit. A new instance fences it in its turn; if it
                    # committed meanwhile, that was its batch's records, which the claim's entry then covers.
                    log.info("%s: fenced in %s (%s) by another producer of %s; claiming again", where, step,
                             e.args[0] if e.args else e, tid)
                    time.sleep(random.uniform(*FENCED_BACKOFF_S))
                    continue
                raise KafkaSinkError(
                    f"{where}: another producer of the transactional id {tid} fenced the claim {CLAIM_ATTEMPTS} times "
                    f"(last in {step}: {e.args[0] if e.args else e}): an older driver of this output is still "
                    "writing it; stop it, then start this driver again") from None
    finally:
        clients.close()
    raise AssertionError("unreachable")  # pragma: no cover


def _write_at_least_once(target: KafkaSinkTarget, batch_ms: int, partition: int, records: Iterable[Any]) -> int:
    conf = _with_defaults(producer_config(target.params, None))
    if "delivery.timeout.ms" not in conf:
        conf.setdefault("message.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    key = _cache_key(conf)
    timeout_s = 5.0 + float(conf.get("message.timeout.ms", conf.get("delivery.timeout.ms", 0))) / 1000.0
    clients = _checkout(key) or _Clients(conf)
    if clients.producer is None:
        clients.new_producer()
    clients.errors.clear()
    ck = require_client()
    try:
        n = _produce(clients, target, batch_ms, partition, _encoded(target, batch_ms, partition, records))
        left = clients.producer.flush(timeout_s)
    except ck.KafkaException as e:  # a fatal producer error
        clients.close()
        raise _kafka_failure(target, batch_ms, partition, "producing the records", e, timeout_s) from None
    except BaseException:
        clients.close()
        raise
    if clients.errors:
        error = _delivery_error(clients, target, batch_ms, partition)
        _checkin(key, clients)
        raise error
    if left:
        clients.close()
        raise KafkaSinkError(f"{target.where(batch_ms, partition)}: {left} records not delivered within "
                             f"{timeout_s:.0f} s: are the Kafka brokers at {_servers(target)} up?")
    _checkin(key, clients)
    return n


def with_output(target: KafkaSinkTarget, output: str) -> KafkaSinkTarget:
    """``target`` under another output name."""
    return replace(target, output=output)
