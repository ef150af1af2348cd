"""The executor side of the Kafka source: read exactly one :class:`~dstreams.kafka.offsets.OffsetRange`.

Contract of :func:`read_range`:

* It yields the records a read_committed consumer sees at offsets ``fromOffset <= offset < untilOffset`` of the
  range's topic-partition, in offset order, as :class:`~dstreams.kafka.records.KafkaRecord` or what ``decode``
  returns for each. The driver fixed ``untilOffset`` at or below the partition's last stable offset, so every
  offset in the range is decided (committed, aborted, a marker or compacted away): the read never waits for an
  open transaction, and it ends when a record at or past ``untilOffset - 1`` arrives or the consumer's position
  reaches ``untilOffset`` (it never waits for offset ``untilOffset - 1`` itself, which may be a marker).
* **Holes in the offsets are not loss**: transaction markers, aborted records and compaction leave holes in the
  offsets; the reader skips them (a fetch that the broker answers with data starts inside the log). Offsets before
  the log's start (retention, a deleted and re-created topic, a truncated log) are loss: the broker refuses the
  fetch (offset out of range), and with ``fail_on_data_loss`` the task fails with
  :class:`~dstreams.kafka.errors.KafkaDataLossError` naming topic, partition, the range and the log's start; without
  it the reader logs how many offsets it skipped and goes on from the log's start.
* A record that ``decode`` cannot handle fails the task with :class:`~dstreams.kafka.errors.KafkaDecodeError`
  naming topic, partition and offset; with ``on_decode_error`` the reader yields what it returns for the record
  and the error instead (the source's dead letters).
* No record and no end of partition for ``poll_timeout_s`` (a broker down): :class:`KafkaReadTimeoutError`
  (Spark retries the task; the batch's retries follow).
* One consumer per Python worker and configuration is kept between tasks (a Python worker is reused across
  tasks): it is re-assigned to each range; it never joins a group and never commits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import SKIP_LOST_HOW, KafkaDataLossError, KafkaDecodeError, KafkaReadTimeoutError
from .offsets import OffsetRange
from .params import client_error, require_client
from .records import KafkaRecord, record_of

log = logging.getLogger(__name__)

#: Records asked for per ``consume`` call.
READ_CHUNK = 10_000
#: How long one ``consume`` call waits, seconds.
CONSUME_WAIT_S = 0.05

_consumers: dict[tuple[tuple[str, str], ...], Any] = {}
_consumers_lock = threading.Lock()


def _conf_key(conf: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in conf.items()))


def consumer(conf: dict[str, Any]) -> Any:
    """The cached range consumer of this process for ``conf`` (made on first use)."""
    key = _conf_key(conf)
    with _consumers_lock:
        c = _consumers.get(key)
        if c is None:
            ck = require_client()
            try:
                c = ck.Consumer(conf)
            except ck.KafkaException as e:
                raise client_error("range consumer", conf, e) from e
            _consumers[key] = c
        return c


def drop_consumer(conf: dict[str, Any]) -> None:
    """Close and forget this process's consumer for ``conf`` (after an error that may leave it unusable)."""
    with _consumers_lock:
        c = _consumers.pop(_conf_key(conf), None)
    if c is not None:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - closing a broken client
            pass


def log_start(c: Any, topic: str, partition: int) -> int:
    """The partition's first offset on the broker now (its low watermark)."""
    ck = require_client()
    low, _high = c.get_watermark_offsets(ck.TopicPartition(topic, partition), timeout=10, cached=False)
    return int(low)


def _loss(r: OffsetRange, at: int, start: int, fail: bool) -> int:
    """Offsets ``[at, start)`` of range ``r`` are gone: raise, or log and return where to go on."""
    lost = min(start, r.untilOffset) - at
    if fail:
        raise KafkaDataLossError(
            f"Kafka topic {r.topic!r} partition {r.partition}: offsets {at} to {start - 1} of the batch range "
            f"[{r.fromOffset}, {r.untilOffset}) are no longer on the broker (its log now starts at {start}): "
            f"{lost} offsets were deleted (retention, a deleted or re-created topic) before this stream read them. "
            f"{SKIP_LOST_HOW}")
    log.warning("Kafka topic %r partition %d: offsets %d to %d of the range [%d, %d) are gone from the broker (log "
                "start %d); failOnDataLoss=False: %d offsets skipped", r.topic, r.partition, at, start - 1,
                r.fromOffset, r.untilOffset, start, lost)
    return min(start, r.untilOffset)


def read_range(conf: dict[str, Any], r: OffsetRange, decode: Callable[[KafkaRecord], Any] | None,
               fail_on_data_loss: bool, poll_timeout_s: float,
               on_decode_error: Callable[[KafkaRecord, BaseException], Any] | None = None) -> Iterator[Any]:
    """The records of ``r`` (see the module docstring)."""
    if r.count() <= 0:
        return
    ck = require_client()
    c = consumer(conf)
    tp = ck.TopicPartition(r.topic, r.partition, r.fromOffset)
    pos = r.fromOffset
    try:
        c.assign([tp])
        last_progress = time.monotonic()
        while pos < r.untilOffset:
            msgs = c.consume(min(READ_CHUNK, r.untilOffset - pos), CONSUME_WAIT_S)
            if not msgs:
                if time.monotonic() - last_progress > poll_timeout_s:
                    raise KafkaReadTimeoutError(
                        f"Kafka topic {r.topic!r} partition {r.partition}: nothing read for {poll_timeout_s:.0f} s at "
                        f"offset {pos} of the range [{r.fromOffset}, {r.untilOffset}) (is the broker up? "
                        "spark.streaming.kafka.consumer.poll.ms sets this timeout)")
                continue
            last_progress = time.monotonic()
            for m in msgs:
                err = m.error()
                if err is not None:
                    code = err.code()
                    if code == ck.KafkaError._PARTITION_EOF:
                        end = c.position([ck.TopicPartition(r.topic, r.partition)])[0].offset
                        if end >= r.untilOffset:
                            pos = r.untilOffset
                        elif end >= 0 and end > pos:
                            pos = end
                        continue
                    if code in (ck.KafkaError._AUTO_OFFSET_RESET, ck.KafkaError.OFFSET_OUT_OF_RANGE):
                        start = log_start(c, r.topic, r.partition)
                        if start <= pos:  # out of range at the end: the log was truncated below our range
                            raise KafkaDataLossError(
                                f"Kafka topic {r.topic!r} partition {r.partition}: offset {pos} of the batch range "
                                f"[{r.fromOffset}, {r.untilOffset}) is out of range on the broker (log start "
                                f"{start}): the partition's log was truncated or the topic re-created. "
                                f"{SKIP_LOST_HOW}")
                        pos = _loss(r, pos, start, fail_on_data_loss)
                        if pos < r.untilOffset:
                            c.assign([ck.TopicPartition(r.topic, r.partition, pos)])
                        break
                    if code == ck.KafkaError.UNKNOWN_TOPIC_OR_PART or code == ck.KafkaError._UNKNOWN_PARTITION:
                        if fail_on_data_loss:
                            raise KafkaDataLossError(
                                f"Kafka topic {r.topic!r} partition {r.partition} no longer exists: the batch range "
                                f"[{r.fromOffset}, {r.untilOffset}) cannot be read. {SKIP_LOST_HOW}")
                        log.warning("Kafka topic %r partition %d no longer exists; failOnDataLoss=False: the range "
                                    "[%d, %d) is skipped", r.topic, r.partition, r.fromOffset, r.untilOffset)
                        return
                    raise RuntimeError(f"reading Kafka topic {r.topic!r} partition {r.partition} at offset {pos} "
                                       f"(range [{r.fromOffset}, {r.untilOffset})): {err}")
                off = m.offset()
                if off < pos:  # fetched for an earlier assignment of this consumer: not this range's
                    continue
                if off >= r.untilOffset:
                    pos = r.untilOffset
                    break
                # A hole between ``pos`` and ``off`` (transaction markers, aborted records, compaction) is never
                # loss: the broker answered a fetch at or below ``pos`` with data, and a fetch below the log's start
                # is answered OFFSET_OUT_OF_RANGE instead (handled above). Asking for the log start at each hole
                # cost ~0.5 s per transaction marker (the query waits behind the consumer's fetch).
                pos = off + 1
                record = record_of(m)
                if decode is None:
                    yield record
                    continue
                try:
                    value = decode(record)
                except Exception as e:
                    if on_decode_error is not None:
                        yield on_decode_error(record, e)  # the record, routed (e.g. a tagged dead letter)
                        continue
                    raise KafkaDecodeError(
                        f"the decoder failed on the Kafka record at topic {r.topic!r} partition {r.partition} offset "
                        f"{off} ({type(e).__name__}: {e}); key {record.key!r:.100}, value {record.value!r:.200}"
                    ) from e
                yield value
    except GeneratorExit:  # the task stopped reading early (take(n)): leave the consumer clean for the next
        _unassign(c)
        raise
    except Exception:
        drop_consumer(conf)  # a failed read may leave fetched data of this range queued: start clean next time
        raise
    _unassign(c)


def _unassign(c: Any) -> None:
    """Stop fetching the range's partition (an idle cached consumer would prefetch the rest of it into memory)."""
    try:
        c.unassign()
    except Exception:  # noqa: BLE001 - best effort; a broken consumer is replaced on its next error
        pass
