"""The Kafka source: the direct approach (no receivers), Spark's ``DirectKafkaInputDStream`` on the D-Streams model.

Contract (``StreamingContext.kafkaStream`` and ``KafkaUtils.createDirectStream``):

* **A batch is a pure function of its offset ranges.** While batch ``t`` is generated (on the event loop), the
  driver fixes one :class:`~dstreams.kafka.offsets.OffsetRange` ``[from, until)`` per topic-partition: ``from`` is
  where the previous batch ended, ``until`` the partition's **last stable offset** (what a ``read_committed``
  consumer can see: an open transaction holds it back, so a batch never waits for one), lowered by the rate limit.
  The ranges are the batch's offsets, written to the metadata log before the batch runs (the input contract of
  :mod:`dstreams.nodes.input`). The executors read exactly those ranges (:mod:`dstreams.kafka.reader`), one task
  per range, large ranges split into consecutive pieces (``minPartitions``, ``spark.dstreams.kafka.
  maxRecordsPerTask``). Lineage recomputation, speculation and a restarted driver read the same records: with an
  exactly-once sink every record counts once end to end.
* **Start.** ``startingOffsets``: ``"earliest"``, ``"latest"`` or a dict ``{TopicAndPartition | (topic, partition)
  | "topic:partition": offset}`` (partitions not named start at ``auto.offset.reset`` of ``kafkaParams``, else
  at the stream's default). A restarted driver goes on where the last recorded batch ended.
* **Topics** by name (a list) or by ``pattern`` (a regular expression matched against the whole topic name,
  internal ``__`` topics excluded). The partitions are listed again for every batch: partitions added to a topic,
  and with a pattern topics created, while the stream runs are read from their earliest offset on.
* **Rate limits.** ``maxRatePerPartition`` (or ``spark.streaming.kafka.maxRatePerPartition``) caps each
  partition at that many records per second of batch interval; with backpressure
  (``spark.streaming.backpressure.enabled``) the estimated rate for the whole stream is shared among the
  partitions by their lag (Spark's ``maxMessagesPerPartition``), each capped by the static maximum.
* **Data loss.** Offsets the stream has not read that are gone from the broker (retention, a deleted topic or
  partition, a topic deleted and re-created) fail the batch with :class:`~dstreams.kafka.errors.KafkaDataLossError`
  naming topic, partition and the range; with ``failOnDataLoss=False`` the stream goes on from the log's start
  and counts the offsets it skipped (``recordsLost`` in the batch's input metadata, the status page and
  ``dstreams_input_records_lost`` in ``/metrics``). Transaction markers, aborted records and compaction leave
  holes in the offsets that are never loss. A topic named in ``topics`` that does not exist fails ``start()``.
* **Fixing a batch changes nothing until the batch is fixed** (the input contract's failure rule): ranges are
  fixed on copies of the positions; a broker that does not answer raises
  :class:`~dstreams.contracts.SourceUnavailableError`, which the driver rides out like a store outage.
* **Records**: :class:`~dstreams.kafka.records.KafkaRecord` (topic, partition, offset, timestamp, key, value,
  headers, timestampType) or what ``decoder(record)`` returns; a decoder that raises fails the task naming topic,
  partition and offset, or with ``onDecodeError="deadLetter"`` the record goes to the stream's dead letters
  (``KafkaDStream.deadLetters()``), which any sink saves exactly once.
* **Positions for monitoring** (``commitToGroup="<group>"``): after each completed batch, the ends of its ranges are
  committed to the consumer group on a background thread (for lag dashboards; never what the stream resumes
  from; a failed commit is logged).
* The record count of a batch (``numRecords``, the rate controller's input) is its number of offsets: under
  transactions and compaction it may count a few more than the records delivered.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from .. import config
from ..contracts import SourceUnavailableError
from ..dead_letters import DEAD, GOOD
from ..nodes.group_positions import GROUP_WRITER_STOP_S, GroupPositionWriter
from ..nodes.input import InputNode
from ..time import BatchTime
from .errors import SKIP_LOST_HOW, KafkaDataLossError
from .offsets import OffsetRange, TopicAndPartition, share_by_lag, split_ranges
from .params import admin_config, client_error, normalize, reader_config, require_client, start_position
from .rdd import kafka_rdd
from .records import KafkaRecord

if TYPE_CHECKING:
    from ..graph import DStreamGraph

log = logging.getLogger(__name__)

TP = tuple[str, int]
#: Seconds the driver waits for one metadata or offsets request.
REQUEST_TIMEOUT_S = 15.0
ON_DECODE_ERROR = ("fail", "deadLetter")


def parse_starting(value: Any) -> str | dict[TP, int]:
    """``startingOffsets`` / ``fromOffsets`` as ``"earliest"``, ``"latest"`` or ``{(topic, partition): offset}``."""
    if isinstance(value, str):
        if value not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be 'earliest', 'latest' or a dict {{TopicAndPartition: offset}}, "
                             f"got {value!r}")
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"startingOffsets must be 'earliest', 'latest' or a dict, got {type(value).__name__}")
    out: dict[TP, int] = {}
    for k, v in value.items():
        if isinstance(k, TopicAndPartition):
            tp = (k.topic, k.partition)
        elif isinstance(k, tuple) and len(k) == 2:
            tp = (str(k[0]), int(k[1]))
        elif isinstance(k, str) and ":" in k:
            t, _, p = k.rpartition(":")
            tp = (t, int(p))
        else:
            raise ValueError(f"startingOffsets key {k!r} is not a TopicAndPartition, a (topic, partition) tuple or "
                             "'topic:partition'")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"startingOffsets[{k!r}] = {v!r} is not an offset (an int >= 0)")
        out[tp] = v
    return out


#: Errors of the driver's Kafka requests that mean "the broker is not ready" (an outage, ridden out as one): a broker
#: down or restarting, a partition without its leader yet. UNKNOWN_LEADER_EPOCH / FENCED_LEADER_EPOCH: a restarted
#: KRaft broker answers list_offsets with them until its metadata catches up (seen for about 2 s after a restart).
TRANSIENT_ERRORS = ("_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_RESOLVE", "REQUEST_TIMED_OUT",
                    "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE",
                    "COORDINATOR_LOAD_IN_PROGRESS", "BROKER_NOT_AVAILABLE", "NETWORK_EXCEPTION", "UNKNOWN_LEADER_EPOCH",
                    "FENCED_LEADER_EPOCH", "REPLICA_NOT_AVAILABLE", "KAFKA_STORAGE_ERROR", "OFFSET_NOT_AVAILABLE")


def _unavailable(servers: str, what: str, error: BaseException) -> SourceUnavailableError:
    return SourceUnavailableError(f"Kafka at {servers} is unavailable while {what}: {type(error).__name__}: {error}")


class KafkaInputNode(InputNode):
    """``kafkaStream`` / ``KafkaUtils.createDirectStream``: see the module docstring for the contract."""

    def __init__(self, graph: DStreamGraph, kafka_params: Mapping[str, Any], topics: Sequence[str] | None = None,
                 pattern: str | None = None, starting: Any = "latest", decoder: Callable[[KafkaRecord], Any] |
                 None = None, fail_on_data_loss: bool = True, max_rate_per_partition: float | None = None,
                 min_partitions: int | None = None, commit_to_group: str | None = None,
                 on_decode_error: str = "fail") -> None:
        params = normalize(kafka_params)
        if pattern is None:
            if isinstance(topics, str):
                topics = [topics]
            topics = list(topics or [])
            if not all(isinstance(t, str) and t for t in topics):
                raise ValueError(f"Kafka topics are non-empty strings, got {topics!r}")
            if len(set(topics)) != len(topics):
                raise ValueError(f"Kafka topics must be distinct, got {topics!r}")
        else:
            if topics:
                raise ValueError("give Kafka topics by name or by pattern, not both")
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"the Kafka topic pattern {pattern!r} is not a regular expression: {e}") from None
            topics = []
        default = starting if isinstance(starting, str) else "latest"
        start = parse_starting(starting)
        if isinstance(start, str):
            start = start_position(params, start) if "auto.offset.reset" in params else start
        if not topics and pattern is None and not (isinstance(start, dict) and start):
            raise ValueError("a Kafka stream needs topics (a list of names), a pattern, or fromOffsets")
        if max_rate_per_partition is not None and max_rate_per_partition <= 0:
            raise ValueError(f"maxRatePerPartition must be positive, got {max_rate_per_partition}")
        if min_partitions is not None and (isinstance(min_partitions, bool) or int(min_partitions) < 1):
            raise ValueError(f"minPartitions must be an int >= 1, got {min_partitions!r}")
        if commit_to_group is not None and (not isinstance(commit_to_group, str) or not commit_to_group):
            raise ValueError(f"commitToGroup must be a consumer group id (a non-empty string), got {commit_to_group!r}")
        if on_decode_error not in ON_DECODE_ERROR:
            raise ValueError(f"onDecodeError must be one of {ON_DECODE_ERROR}, got {on_decode_error!r}")
        if on_decode_error == "deadLetter" and decoder is None:
            raise ValueError("onDecodeError='deadLetter' routes the records a decoder refuses: pass a decoder")
        fail = fail_on_data_loss
        if isinstance(params.get("failOnDataLoss"), (str, bool)):  # KafkaUtils passes it in kafkaParams
            fail = str(params.pop("failOnDataLoss")).lower() not in ("false", "0", "no")
        super().__init__(graph)
        self.params = params
        self.servers = str(params["bootstrap.servers"])
        self.topics = list(topics)
        self.pattern = pattern
        self.start_from = start
        self.default_start = start_position(params, default) if isinstance(start, dict) else start
        self.decoder = decoder
        self.fail_on_data_loss = bool(fail)
        self.max_rate_per_partition = max_rate_per_partition
        self.min_partitions = int(min_partitions) if min_partitions is not None else None
        self.commit_to_group = commit_to_group
        self.on_decode_error = on_decode_error
        #: The offset each topic-partition's next batch starts at (the end of the last generated batch).
        self.positions: dict[TP, int] = {}
        self._restored = False
        self._started = False

    _admin: Any = None
    _group_writer: GroupPositionWriter | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for k in ("_admin", "_group_writer"):
            state.pop(k, None)
        state["positions"] = [[t, p, o] for (t, p), o in self.positions.items()]
        if isinstance(self.start_from, dict):
            state["start_from"] = [[t, p, o] for (t, p), o in self.start_from.items()]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["positions"] = {(str(t), int(p)): int(o) for t, p, o in state.get("positions", [])}
        if isinstance(state.get("start_from"), list):
            state["start_from"] = {(str(t), int(p)): int(o) for t, p, o in state["start_from"]}
        self.__dict__.update(state)

    def describe_params(self) -> list[str]:
        return [f"topics={','.join(self.topics)}" if self.pattern is None else f"pattern={self.pattern}"]

    # ----------------------------------------------------------------- driver clients
    def admin(self) -> Any:
        if self._admin is None:
            ck = require_client()
            from confluent_kafka.admin import AdminClient

            conf = admin_config(self.params)
            try:
                self._admin = AdminClient(conf)
            except ck.KafkaException as e:
                raise client_error("admin client", conf, e) from e
        return self._admin

    def _call(self, what: str, func: Callable[[], Any]) -> Any:
        ck = require_client()
        try:
            return func()
        except ck.KafkaException as e:
            err = e.args[0] if e.args else None
            code = err.code() if err is not None and hasattr(err, "code") else None
            transient = code in {getattr(ck.KafkaError, name, None) for name in TRANSIENT_ERRORS} - {None}
            if transient or (err is not None and hasattr(err, "retriable") and err.retriable()):
                raise _unavailable(self.servers, what, e) from e
            raise

    def _partitions(self) -> dict[TP, None]:
        """The topic-partitions the stream reads now (topics by name or pattern, plus startingOffsets' ones)."""
        md = self._call("listing topics", lambda: self.admin().list_topics(timeout=REQUEST_TIMEOUT_S))
        out: dict[TP, None] = {}
        if self.pattern is not None:
            rx = re.compile(self.pattern)
            names = sorted(t for t in md.topics if not t.startswith("__") and rx.fullmatch(t))
        else:
            names = list(self.topics)
        for name in names:
            t = md.topics.get(name)
            if t is None or self._topic_gone(t):
                continue
            for p in sorted(t.partitions):
                out[(name, p)] = None
        if isinstance(self.start_from, dict):
            for tp in self.start_from:
                t = md.topics.get(tp[0])
                if t is not None and not self._topic_gone(t) and tp[1] in t.partitions:
                    out.setdefault(tp, None)
        return out

    def _topic_gone(self, t: Any) -> bool:
        """Whether topic metadata ``t`` says the topic does not exist; any other error (no leader yet, a broker
        that is starting) is an outage (:class:`~dstreams.contracts.SourceUnavailableError`), never a deletion."""
        ck = require_client()
        if t.error is None:
            return False
        if t.error.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
            return True
        raise SourceUnavailableError(f"Kafka at {self.servers}: topic {t.topic!r} is not available: {t.error}")

    def _list_offsets(self, tps: Sequence[TP], which: str) -> dict[TP, int]:
        """Per topic-partition its earliest offset or (read_committed) last stable offset, in one request."""
        if not tps:
            return {}
        ck = require_client()
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()
        request = {ck.TopicPartition(t, p): spec for t, p in tps}

        def ask() -> dict[TP, int]:
            futures = self.admin().list_offsets(request, isolation_level=ck.IsolationLevel.READ_COMMITTED,
                                                request_timeout=REQUEST_TIMEOUT_S)
            return {(tp.topic, tp.partition): int(f.result(REQUEST_TIMEOUT_S).offset) for tp, f in futures.items()}

        return self._call(f"listing the {which} offsets", ask)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.pattern is None and self.topics:
            md = self._call("listing topics", lambda: self.admin().list_topics(timeout=REQUEST_TIMEOUT_S))
            missing = [t for t in self.topics if t not in md.topics or self._topic_gone(md.topics[t])]
            if missing:
                raise ValueError(
                    f"the Kafka topic(s) {missing} do not exist at {self.servers}: create them first (kafka-topics.sh "
                    "--create, or an AdminClient), or fix the topic names")
        if not (self._restored or self.positions):
            tps = list(self._partitions())
            named = self.start_from if isinstance(self.start_from, dict) else {}
            rest = [tp for tp in tps if tp not in named]
            base = self._list_offsets(rest, self.default_start)
            positions = dict(base)
            positions.update(named)
            self.positions = positions
        self._started = True
        if self.commit_to_group is not None and self._group_writer is None:
            self._group_writer = GroupPositionWriter(f"dstreams-kafka-group-{self.key}", self._commit_group,
                                                     f"consumer group {self.commit_to_group!r} at {self.servers}",
                                                     newer=lambda a, b: True)

    def stop(self) -> None:
        writer, self._group_writer = self._group_writer, None
        if writer is not None:
            writer.stop(GROUP_WRITER_STOP_S)

    def node_state(self) -> Any:
        return {"positions": [[t, p, o] for (t, p), o in sorted(self.positions.items())]}

    def restore_node_state(self, state: Any) -> None:
        if isinstance(state, dict) and isinstance(state.get("positions"), list):
            self.positions = {(str(t), int(p)): int(o) for t, p, o in state["positions"]}
            self._restored = True

    # ----------------------------------------------------------------- monitoring positions
    def batch_completed(self, info: Any) -> None:
        super().batch_completed(info)
        writer = self._group_writer
        offsets = self.offsets_at(BatchTime(info.batch_time_ms)) if writer is not None else None
        if writer is None or info.failed or not isinstance(offsets, dict):
            return
        writer.offer({"offsets": [(t, p, u) for t, p, _f, u in offsets.get("ranges", [])]})

    def wait_group_positions(self, timeout_s: float) -> bool:
        writer = self._group_writer
        return True if writer is None else writer.wait_idle(timeout_s)

    def _commit_group(self, _key: str, ends: list[tuple[str, int, int]]) -> None:
        ck = require_client()
        conf = reader_config(self.params)
        conf["group.id"] = self.commit_to_group
        c = ck.Consumer(conf)
        try:
            c.commit(offsets=[ck.TopicPartition(t, p, u) for t, p, u in ends], asynchronous=False)
        finally:
            c.close()

    # ----------------------------------------------------------------- fixing a batch
    def _limits(self, time: BatchTime, lags: dict[TP, int]) -> dict[TP, int] | None:
        """Per topic-partition the most offsets batch ``time`` may take (None: no limit)."""
        if not lags:
            return None
        seconds = self.slide_duration.ms / 1000.0
        static = max(1, int(self.max_rate_per_partition * seconds)) if self.max_rate_per_partition else None
        uniform = self.max_records_per_partition(time, len(lags))  # the conf's maximum and backpressure
        limiter = self.rate_limiter
        rate = limiter.rate() if limiter is not None else None
        if rate is None:
            caps = [n for n in (static, uniform) if n is not None]
            return {tp: min(caps) for tp in lags} if caps else None
        conf_cap = None
        if limiter is not None and limiter.settings.max_rate_per_partition is not None:
            conf_cap = max(1, int(limiter.settings.max_rate_per_partition * seconds))
        caps = [n for n in (static, conf_cap) if n is not None]
        return share_by_lag(lags, max(1, int(rate * seconds)), min(caps) if caps else None)

    def compute(self, time: BatchTime) -> RDD | None:
        """Batch ``time``'s ranges, fixed on a copy of the positions (see the module docstring)."""
        positions = dict(self.positions)
        lost = 0
        replayed = self.replayed_offsets(time)
        if replayed is not None:
            ranges = [OffsetRange.from_json(r) for r in replayed["ranges"]]
            for r in ranges:
                tp = (r.topic, r.partition)
                positions[tp] = max(positions.get(tp, 0), r.untilOffset)
            lost = int(replayed.get("lost", 0)) + (0 if self.fail_on_data_loss else self._lost_under(ranges))
        else:
            current = self._partitions()
            gone = [tp for tp in positions if tp not in current]
            if gone:
                if self.fail_on_data_loss:
                    raise KafkaDataLossError(
                        f"Kafka topic-partition(s) {[f'{t}:{p}' for t, p in gone]} no longer exist at {self.servers} "
                        f"(the stream had read them up to offsets {[positions[tp] for tp in gone]}): a topic was "
                        f"deleted. {SKIP_LOST_HOW}")
                for tp in gone:
                    log.warning("Kafka topic %r partition %d no longer exists; failOnDataLoss=False: the stream stops "
                                "reading it", *tp)
                    del positions[tp]
            new = [tp for tp in current if tp not in positions]
            tps = list(current)
            earliest = self._list_offsets(tps, "earliest")
            latest = self._list_offsets(tps, "latest")
            for tp in new:
                positions[tp] = earliest[tp]  # a partition or topic that appeared: all of it
                log.info("Kafka topic %r partition %d: new, read from its earliest offset %d", *tp, earliest[tp])
            for tp in tps:
                at, first, end = positions[tp], earliest[tp], latest[tp]
                if at < first or at > end:
                    what = (f"offsets {at} to {first - 1} were deleted (its log now starts at {first})" if at < first
                            else f"the stream's position {at} is past the partition's end {end} (the topic was "
                                 "deleted and re-created, or its log truncated)")
                    if self.fail_on_data_loss:
                        raise KafkaDataLossError(f"Kafka topic {tp[0]!r} partition {tp[1]}: {what} before this stream "
                                                 f"read them. {SKIP_LOST_HOW}")
                    lost += first - at if at < first else 0
                    log.warning("Kafka topic %r partition %d: %s; failOnDataLoss=False: going on from offset %d",
                                tp[0], tp[1], what, first)
                    positions[tp] = first
            limits = self._limits(time, {tp: latest[tp] - positions[tp] for tp in tps})
            ranges = []
            for tp in tps:
                at = positions[tp]
                until = latest[tp] if limits is None else min(latest[tp], at + limits[tp])
                ranges.append(OffsetRange(tp[0], tp[1], at, until))
                positions[tp] = until
        rdd = self.read(time, ranges)
        # The batch is fixed: commit it in one step that cannot fail.
        self.positions = positions
        offsets: dict[str, Any] = {"ranges": [r.to_json() for r in ranges]}
        metadata: dict[str, Any] = {"offsetRanges": [str(r) for r in ranges if r.count()]}
        if lost:
            offsets["lost"] = lost
            metadata["recordsLost"] = lost
        self.report_batch(time, sum(r.count() for r in ranges), offsets, metadata)
        return rdd

    def _lost_under(self, ranges: Sequence[OffsetRange]) -> int:
        """How many offsets of recorded ``ranges`` the broker no longer has (a replayed batch whose records were
        deleted since it was recorded: its readers skip them under ``failOnDataLoss=False``)."""
        wanted = [r for r in ranges if r.count()]
        if not wanted:
            return 0
        current = self._partitions()
        tps = [(r.topic, r.partition) for r in wanted if (r.topic, r.partition) in current]
        earliest = self._list_offsets(tps, "earliest") if tps else {}
        lost = 0
        for r in wanted:
            first = earliest.get((r.topic, r.partition))
            lost += r.count() if first is None else max(0, min(r.untilOffset, first) - r.fromOffset)
        if lost:
            log.warning("Kafka: %d offset(s) of the recorded ranges of a replayed batch are no longer on the broker; "
                        "failOnDataLoss=False: they are skipped", lost)
        return lost

    def read(self, time: BatchTime, ranges: Sequence[OffsetRange]) -> RDD:
        """The batch's RDD: a :class:`~dstreams.kafka.rdd.KafkaRDD` over ``ranges`` split into tasks."""
        sc = self.graph.sc
        conf = sc.getConf()
        min_partitions = self.min_partitions or config.get(config.KAFKA_MIN_PARTITIONS, conf)
        tasks = split_ranges(ranges, min_partitions, config.get(config.KAFKA_MAX_RECORDS_PER_TASK, conf))
        poll_s = config.get(config.KAFKA_POLL_MS, conf) / 1000.0
        on_error = None
        if self.on_decode_error == "deadLetter":
            on_error = DeadLetterTag(time.ms)
        return kafka_rdd(sc, reader_config(self.params), ranges, tasks, self._decode_fn(on_error is not None),
                         self.fail_on_data_loss, poll_s, on_error)

    def _decode_fn(self, tagged: bool) -> Callable[[KafkaRecord], Any] | None:
        if not tagged:
            return self.decoder
        return GoodTag(self.decoder)


class KafkaDeadLetter(tuple):
    """A record the stream's decoder refused (``onDecodeError="deadLetter"``): the raw record, the error and the
    batch. Fields: ``topic, partition, offset, timestamp, key, value, error, batchTime`` (ms)."""

    __slots__ = ()
    _fields = ("topic", "partition", "offset", "timestamp", "key", "value", "error", "batchTime")

    def __new__(cls, topic: str, partition: int, offset: int, timestamp: int | None, key: bytes | None,
                value: bytes | None, error: str, batchTime: int) -> KafkaDeadLetter:
        return tuple.__new__(cls, (topic, partition, offset, timestamp, key, value, error, batchTime))

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    topic = property(lambda self: self[0])
    partition = property(lambda self: self[1])
    offset = property(lambda self: self[2])
    timestamp = property(lambda self: self[3])
    key = property(lambda self: self[4])
    value = property(lambda self: self[5])
    error = property(lambda self: self[6])
    batchTime = property(lambda self: self[7])

    def __repr__(self) -> str:
        return (f"KafkaDeadLetter(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
                f"error={self.error!r})")




class GoodTag:
    """The decoder of a stream with dead letters: ``(GOOD, decoder(record))``."""

    def __init__(self, decoder: Callable[[KafkaRecord], Any] | None) -> None:
        self.decoder = decoder

    def __call__(self, r: KafkaRecord) -> Any:
        return (GOOD, r if self.decoder is None else self.decoder(r))


class DeadLetterTag:
    """What a reader of a stream with dead letters yields for a refused record: ``(DEAD, KafkaDeadLetter)``."""

    def __init__(self, batch_ms: int) -> None:
        self.batch_ms = batch_ms

    def __call__(self, r: KafkaRecord, error: BaseException) -> Any:
        return (DEAD, KafkaDeadLetter(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value,
                                      f"{type(error).__name__}: {error}"[:2000], self.batch_ms))
