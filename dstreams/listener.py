"""PySpark's listener types: batch metrics, the events and ``StreamingListener`` (``pyspark.streaming.listener``).

Contract: a listener is any object with some of the callbacks of PySpark's ``StreamingListener``
(``onStreamingStarted``, ``onBatchSubmitted``, ``onBatchStarted``, ``onBatchCompleted``,
``onOutputOperationStarted``, ``onOutputOperationCompleted``, ``onReceiverStarted``,
``onReceiverError``, ``onReceiverStopped``); each receives one event object.

**The PySpark surface.** In PySpark a listener callback receives Py4J proxies of the JVM's
``JavaStreamingListener*`` events (``JavaStreamingListenerWrapper`` converts Spark's Scala events to
them). Every member is a method call, and the objects here answer the same calls with the same
values:

* events: ``batchInfo()`` (batch events), ``outputOperationInfo()`` (output-operation events),
  ``time()`` (streaming started), ``receiverInfo()`` (receiver events);
* :class:`BatchInfo` (``JavaBatchInfo``): ``batchTime()`` (an object with ``milliseconds()``),
  ``submissionTime()``, ``processingStartTime()``, ``processingEndTime()``, ``schedulingDelay()``,
  ``processingDelay()``, ``totalDelay()``, ``numRecords()``, ``streamIdToInputInfo()`` and
  ``outputOperationInfos()``;
* :class:`OutputOperationInfo` (``JavaOutputOperationInfo``): ``batchTime()``, ``id()``,
  ``name()``, ``description()``, ``startTime()``, ``endTime()``, ``failureReason()`` (the error
  text, or ``None`` when the operation did not fail or has not finished), plus Scala's
  ``duration()``;
* :class:`StreamInputInfo` (``JavaStreamInputInfo``): ``inputStreamId()``, ``numRecords()``,
  ``metadata()`` and ``metadataDescription()`` (the metadata's ``"Description"``, else ``None``);
* maps (``streamIdToInputInfo()``, ``outputOperationInfos()``, ``metadata()``) are a read-only
  :class:`JavaMap`: a ``dict`` that also answers the ``java.util.Map`` calls Py4J passes through
  (``size()``, ``isEmpty()``, ``containsKey(k)``, ``containsValue(v)``, ``keySet()``); as with
  Py4J, ``m[k]`` of a missing key is ``None``.
* A time or delay that is not known yet is ``-1``, as in PySpark (the Java objects hold ``-1`` where
  Scala holds ``None``). The values are ints that also answer the Scala ``Option`` calls
  (``isDefined()``, ``isEmpty()``, ``get()``, ``getOrElse(d)``): a known value is an
  :class:`Option`; the unknown one, :data:`NONE`, equals ``-1`` and is not defined.

**dstreams' own attributes.** The same objects carry plain attributes in milliseconds for the
engine and for tools (``info.batch_time_ms``, ``info.processing_delay_ms`` (``None`` when unknown),
``info.output_operations``, ``op.start_time_ms``, ``op.failure_reason``...). Where a PySpark method
name is taken (``id``, ``name``, ``description``, ``metadata``) the attribute has another name:
``op.output_id``, ``op.output_name``, ``op.output_description``, ``input_info.metadata_map``.

Listener exceptions are logged and never stop the stream.

The bus that delivers the events (asynchronously, on its own thread) is :mod:`dstreams.listener_bus`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .time import BatchTime


# ---------------------------------------------------------------------- values as PySpark returns them
class Option(int):
    """A known time or delay (ms): an ``int``, as PySpark returns it, that also answers the Scala
    ``Option`` calls (``isDefined()`` is True, ``get()``/``getOrElse(d)`` return the value)."""

    def isDefined(self) -> bool:
        return True

    def isEmpty(self) -> bool:
        return False

    def get(self) -> int:
        return int(self)

    def getOrElse(self, default: Any) -> int:
        return int(self)


class _NoneOption(int):
    """A time or delay that is not known yet: the int ``-1``, as PySpark returns it, that answers the
    Scala ``Option`` calls of an empty Option (``isDefined()`` is False, ``get()`` raises
    ``ValueError``, ``getOrElse(d)`` returns ``d``). Use :data:`NONE`; test it with ``isDefined()``
    or ``== -1``, not with ``is`` (a copy or an unpickled one is another object)."""

    def __new__(cls) -> _NoneOption:
        return super().__new__(cls, -1)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_NoneOption, ())

    def isDefined(self) -> bool:
        return False

    def isEmpty(self) -> bool:
        return True

    def get(self) -> NoReturn:
        raise ValueError("the value is not defined yet (e.g. a delay of a batch that has not finished)")

    def getOrElse(self, default: Any) -> Any:
        return default

    def __repr__(self) -> str:
        return "-1"

    __str__ = __repr__


#: The unknown time or delay: equals ``-1`` (PySpark's value) and ``isDefined()`` is False.
NONE = _NoneOption()


def _opt(v: int | None) -> Option | _NoneOption:
    return NONE if v is None else Option(v)


class _Time:
    """What ``batchTime()`` returns in PySpark (a Spark ``Time``): ``milliseconds()``, and
    ``toString()`` as ``"<ms> ms"``. Equal to another ``_Time`` of the same milliseconds."""

    __slots__ = ("_ms",)

    def __init__(self, ms: int) -> None:
        self._ms = int(ms)

    def milliseconds(self) -> int:
        return self._ms

    def toString(self) -> str:
        return f"{self._ms} ms"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Time) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    def __repr__(self) -> str:
        return self.toString()


class JavaMap(dict):
    """A read-only map as PySpark listeners see one (a ``java.util.Map`` through Py4J's ``JavaMap``).

    It is a ``dict`` (iteration over the keys, ``len``, ``in``, ``keys()``/``values()``/``items()``,
    ``get(k, default)``, ``==`` with a dict) that also answers the Java calls: ``size()``,
    ``isEmpty()``, ``containsKey(k)``, ``containsValue(v)`` and ``keySet()`` (a set). As with Py4J,
    ``m[k]`` of a missing key is ``None`` (Java's ``get`` answers ``null``), not a ``KeyError``.
    Changing it raises ``TypeError``: it belongs to an event that every listener shares.
    """

    def __missing__(self, key: Any) -> None:
        return None

    def size(self) -> int:
        return len(self)

    def isEmpty(self) -> bool:
        return not self

    def containsKey(self, key: Any) -> bool:
        return key in self

    def containsValue(self, value: Any) -> bool:
        return any(v == value for v in self.values())

    def keySet(self) -> set[Any]:
        return set(self)

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a listener event's map is read-only")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))

    def __copy__(self) -> JavaMap:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> JavaMap:
        return type(self)(copy.deepcopy(dict(self), memo))


# ---------------------------------------------------------------------- metrics
#: The ``StreamInputInfo.metadata()`` key whose value is the input's description (Spark's name).
METADATA_KEY_DESCRIPTION = "Description"


@dataclass
class StreamInputInfo:
    """What one input stream holds in a batch (PySpark: ``JavaStreamInputInfo``).

    ``inputStreamId()`` (the input's stream id), ``numRecords()``, ``metadata()`` (a
    :class:`JavaMap` of ``str`` to values) and ``metadataDescription()`` (``str`` of the metadata's
    ``"Description"`` entry, ``None`` without one). The metadata holds what a source reported for
    the batch beyond its record count, e.g. its rate limit (``maxRecordsPerPartition``, ``rate``: see
    :mod:`dstreams.nodes.input`); empty when it reported nothing else.
    """

    input_stream_id: int
    num_records: int
    metadata_map: Mapping[str, Any] = field(default_factory=dict)

    def inputStreamId(self) -> int:
        return self.input_stream_id

    def numRecords(self) -> int:
        return self.num_records

    def metadata(self) -> JavaMap:
        return JavaMap(self.metadata_map)

    def metadataDescription(self) -> str | None:
        d = self.metadata_map.get(METADATA_KEY_DESCRIPTION)
        return None if d is None else str(d)


@dataclass
class OutputOperationInfo:
    """One output operation of one batch (PySpark: ``JavaOutputOperationInfo``).

    Built by the engine as ``OutputOperationInfo(batch_time_ms, output_id, output_name,
    output_description)``; it then sets ``start_time_ms``, ``end_time_ms``, ``records_written`` (what
    its sink reported writing, :mod:`dstreams.output_records`; ``None`` when the sink reports nothing,
    e.g. the user's own ``foreachRDD``) and, when the operation raised, ``failure_reason`` (the error
    text; ``"stopped"`` when ``stop()`` interrupted it).

    PySpark calls: ``batchTime()``, ``id()``, ``name()``, ``description()``, ``startTime()`` and
    ``endTime()`` (``-1`` until known), ``failureReason()`` (``None`` unless it failed); plus
    ``duration()`` (``endTime - startTime``, ``-1`` until both are known), as in Scala.
    """

    batch_time_ms: int
    output_id: int
    output_name: str
    output_description: str
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    failure_reason: str | None = None
    records_written: int | None = None

    @property
    def duration_ms(self) -> int | None:
        if self.start_time_ms is None or self.end_time_ms is None:
            return None
        return self.end_time_ms - self.start_time_ms

    def snapshot(self) -> OutputOperationInfo:
        """An independent copy (what a listener event holds: later changes do not show in it)."""
        return dataclasses.replace(self)

    # PySpark-compatible calls (JavaOutputOperationInfo through Py4J)
    def batchTime(self) -> _Time:
        return _Time(self.batch_time_ms)

    def id(self) -> int:  # noqa: A003 - PySpark's name
        return self.output_id

    def name(self) -> str:
        return self.output_name

    def description(self) -> str:
        return self.output_description

    def startTime(self) -> Option | _NoneOption:
        return _opt(self.start_time_ms)

    def endTime(self) -> Option | _NoneOption:
        return _opt(self.end_time_ms)

    def failureReason(self) -> str | None:
        return self.failure_reason

    def duration(self) -> Option | _NoneOption:
        return _opt(self.duration_ms)


@dataclass
class BatchInfo:
    """Metrics of one batch, all times in epoch (or manual-clock) milliseconds (PySpark:
    ``JavaBatchInfo``).

    The engine fills the attributes as the batch goes: ``submission_time_ms``, ``num_records``,
    ``records_per_input`` (input stream id to records) and ``input_metadata`` (input stream id to the
    metrics entries its source reported, e.g. its rate limit) when it is generated,
    ``processing_start_time_ms``/``processing_end_time_ms`` when it runs, one
    :class:`OutputOperationInfo` per output operation in ``output_operations`` (by output id). The
    derived delays are ``None`` until known: ``scheduling_delay_ms`` (submission to processing start),
    ``processing_delay_ms`` (processing start to end) and ``total_delay_ms`` (their sum: submission to
    processing end, as Spark's ``totalDelay``).

    PySpark calls: ``batchTime()``, ``submissionTime()``, ``processingStartTime()``,
    ``processingEndTime()``, ``schedulingDelay()``, ``processingDelay()``, ``totalDelay()`` (each
    ``-1`` until known), ``numRecords()``, ``streamIdToInputInfo()`` (a :class:`JavaMap` of
    :class:`StreamInputInfo`, one per input that reported a record count or metadata; ``numRecords()``
    is 0 for an input that reported metadata only, as Spark's file streams report) and
    ``outputOperationInfos()`` (a :class:`JavaMap` of :class:`OutputOperationInfo`, by output id).
    """

    batch_time_ms: int
    submission_time_ms: int
    num_records: int = 0
    records_per_input: dict[int, int] = field(default_factory=dict)
    processing_start_time_ms: int | None = None
    processing_end_time_ms: int | None = None
    output_operations: dict[int, OutputOperationInfo] = field(default_factory=dict)
    job_group: str = ""
    #: Driver time (ms, monotonic clock) spent building this batch's RDDs and jobs, and clearing
    #: old metadata after it: engine overhead outside Spark jobs (``benchmarks floor`` reports it).
    generation_ms: float | None = None
    cleanup_ms: float | None = None
    input_metadata: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Per event-time stream id (``withEventTime``), filled when the batch's jobs ran: ``stream`` (its
    #: name), ``watermarkMs`` (the low watermark the batch was built with; None before there is one),
    #: ``lateRecords`` (records dropped as late), ``records`` and ``partitionsCounted`` (the partitions
    #: the batch's jobs read to their end; see :mod:`dstreams.nodes.event_time`).
    event_time: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: How many times the batch was tried (``spark.dstreams.batch.maxAttempts``); 1 when it ran once.
    attempts: int = 1
    #: It failed for good and its input was dropped (``spark.dstreams.batch.onFailure=dropInput``), or it
    #: replays a batch an earlier driver dropped.
    dropped: bool = False
    #: One line on the last failure of the batch (the output and the error), None when none failed.
    failure: str | None = None

    def snapshot(self) -> BatchInfo:
        """An independent copy (what a listener event holds: later changes do not show in it): the
        fields, with the ``records_per_input``, ``input_metadata`` and ``output_operations`` dicts and each
        :class:`OutputOperationInfo` in it copied too."""
        return dataclasses.replace(
            self,
            records_per_input=dict(self.records_per_input),
            input_metadata={k: dict(m) for k, m in self.input_metadata.items()},
            event_time={k: dict(m) for k, m in self.event_time.items()},
            output_operations={k: op.snapshot() for k, op in self.output_operations.items()},
        )

    @property
    def batch_time(self) -> BatchTime:
        return BatchTime(self.batch_time_ms)

    @property
    def scheduling_delay_ms(self) -> int | None:
        if self.processing_start_time_ms is None:
            return None
        return self.processing_start_time_ms - self.submission_time_ms

    @property
    def processing_delay_ms(self) -> int | None:
        if self.processing_start_time_ms is None or self.processing_end_time_ms is None:
            return None
        return self.processing_end_time_ms - self.processing_start_time_ms

    @property
    def total_delay_ms(self) -> int | None:
        """Scheduling delay + processing delay: from the batch's submission to the end of its processing, as
        Spark defines ``totalDelay`` (not from its batch time: a batch submitted late, e.g. a backlog after a
        restart, does not count the wait before its submission). ``None`` until processing ended."""
        if self.processing_end_time_ms is None:
            return None
        return self.processing_end_time_ms - self.submission_time_ms

    @property
    def failed(self) -> bool:
        """Whether it failed for good: dropped, or an output operation whose last try failed."""
        return self.dropped or any(o.failure_reason for o in self.output_operations.values())

    # PySpark-compatible calls (JavaBatchInfo through Py4J)
    def batchTime(self) -> _Time:
        return _Time(self.batch_time_ms)

    def submissionTime(self) -> int:
        return self.submission_time_ms

    def processingStartTime(self) -> Option | _NoneOption:
        return _opt(self.processing_start_time_ms)

    def processingEndTime(self) -> Option | _NoneOption:
        return _opt(self.processing_end_time_ms)

    def schedulingDelay(self) -> Option | _NoneOption:
        return _opt(self.scheduling_delay_ms)

    def processingDelay(self) -> Option | _NoneOption:
        return _opt(self.processing_delay_ms)

    def totalDelay(self) -> Option | _NoneOption:
        return _opt(self.total_delay_ms)

    def numRecords(self) -> int:
        return self.num_records

    def streamIdToInputInfo(self) -> JavaMap:
        records, metadata = self.records_per_input, self.input_metadata
        ids = [*records, *(sid for sid in metadata if sid not in records)]
        return JavaMap({sid: StreamInputInfo(sid, records.get(sid, 0), dict(metadata.get(sid, {}))) for sid in ids})

    def outputOperationInfos(self) -> JavaMap:
        return JavaMap(self.output_operations)


@dataclass(frozen=True)
class ReceiverInfo:
    """A receiver's state (PySpark: ``JavaReceiverInfo``), for the ``onReceiver*`` events.

    PySpark calls: ``streamId()``, ``name()``, ``active()``, ``location()``, ``executorId()``,
    ``lastErrorMessage()``, ``lastError()`` (strings, ``""`` when none) and ``lastErrorTime()``
    (ms, ``-1`` when none). dstreams' sources are not receivers, so the engine posts no such event.
    """

    stream_id: int
    receiver_name: str
    is_active: bool
    receiver_location: str = ""
    executor_id: str = ""
    last_error_message: str = ""
    last_error: str = ""
    last_error_time_ms: int = -1

    def streamId(self) -> int:
        return self.stream_id

    def name(self) -> str:
        return self.receiver_name

    def active(self) -> bool:
        return self.is_active

    def location(self) -> str:
        return self.receiver_location

    def executorId(self) -> str:
        return self.executor_id

    def lastErrorMessage(self) -> str:
        return self.last_error_message

    def lastError(self) -> str:
        return self.last_error

    def lastErrorTime(self) -> int:
        return self.last_error_time_ms


# ---------------------------------------------------------------------- events
class _Event:
    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


class StreamingListenerStreamingStarted(_Event):
    """``time()``: when the context started (epoch ms), also ``time_ms``."""

    def __init__(self, time_ms: int) -> None:
        self.time_ms = time_ms

    def time(self) -> int:
        return self.time_ms


class StreamingListenerBatchSubmitted(_Event):
    """``batchInfo()``: a snapshot of ``info`` taken at construction (events are delivered
    asynchronously: later changes to ``info`` do not show in it)."""

    def __init__(self, info: BatchInfo) -> None:
        self.info = info.snapshot()

    def batchInfo(self) -> BatchInfo:
        return self.info


class StreamingListenerBatchStarted(StreamingListenerBatchSubmitted):
    pass


class StreamingListenerBatchCompleted(StreamingListenerBatchSubmitted):
    pass


class StreamingListenerOutputOperationStarted(_Event):
    """``outputOperationInfo()``: a snapshot of ``info`` taken at construction (events are delivered
    asynchronously: later changes to ``info`` do not show in it)."""

    def __init__(self, info: OutputOperationInfo) -> None:
        self.info = info.snapshot()

    def outputOperationInfo(self) -> OutputOperationInfo:
        return self.info


class StreamingListenerOutputOperationCompleted(StreamingListenerOutputOperationStarted):
    pass


class StreamingListenerReceiverStarted(_Event):
    """``receiverInfo()``: the receiver's :class:`ReceiverInfo` (immutable)."""

    def __init__(self, info: ReceiverInfo) -> None:
        self.info = info

    def receiverInfo(self) -> ReceiverInfo:
        return self.info


class StreamingListenerReceiverError(StreamingListenerReceiverStarted):
    pass


class StreamingListenerReceiverStopped(StreamingListenerReceiverStarted):
    pass


class StreamingListener:
    """Base class with no-op callbacks (same names as ``pyspark.streaming.StreamingListener``)."""

    def onStreamingStarted(self, streamingStarted: Any) -> None:
        pass

    def onReceiverStarted(self, receiverStarted: Any) -> None:
        pass

    def onReceiverError(self, receiverError: Any) -> None:
        pass

    def onReceiverStopped(self, receiverStopped: Any) -> None:
        pass

    def onBatchSubmitted(self, batchSubmitted: Any) -> None:
        pass

    def onBatchStarted(self, batchStarted: Any) -> None:
        pass

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        pass

    def onOutputOperationStarted(self, outputOperationStarted: Any) -> None:
        pass

    def onOutputOperationCompleted(self, outputOperationCompleted: Any) -> None:
        pass
