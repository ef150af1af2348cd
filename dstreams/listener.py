"""Batch metrics and streaming listeners, compatible with ``pyspark.streaming.StreamingListener``.

Contract: a listener is any object with some of the callbacks of PySpark's ``StreamingListener``
(``onStreamingStarted``, ``onBatchSubmitted``, ``onBatchStarted``, ``onBatchCompleted``,
``onOutputOperationStarted``, ``onOutputOperationCompleted``, ``onReceiverStarted``,
``onReceiverError``, ``onReceiverStopped``); each receives one event object. The event objects
offer PySpark's (Java-style) accessors, e.g. ``event.batchInfo().processingDelay()``, so listener
code written for ``pyspark.streaming`` works unchanged, plus plain attributes in milliseconds
(``info.processing_delay_ms``). Delays that are not known yet are ``None`` (PySpark: an empty
Scala Option, which the :class:`Option` wrapper mimics with ``isDefined()``/``get()``).
Listener exceptions are logged and never stop the stream.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from .time import BatchTime

log = logging.getLogger(__name__)


class Option(int):
    """An int that also answers the Scala ``Option`` calls PySpark listener code makes."""

    def isDefined(self) -> bool:
        return True

    def isEmpty(self) -> bool:
        return False

    def get(self) -> int:
        return int(self)

    def getOrElse(self, default: Any) -> int:
        return int(self)


class _NoneOption:
    """The empty Option (a delay that is not known yet)."""

    def isDefined(self) -> bool:
        return False

    def isEmpty(self) -> bool:
        return True

    def get(self) -> int:
        raise ValueError("the value is not defined yet (e.g. a delay of a batch that has not finished)")

    def getOrElse(self, default: Any) -> Any:
        return default

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "None"


NONE = _NoneOption()


def _opt(v: int | None) -> Option | _NoneOption:
    return NONE if v is None else Option(v)


class _Time:
    """What ``batchInfo().batchTime()`` returns in PySpark: an object with ``milliseconds()``."""

    def __init__(self, ms: int) -> None:
        self._ms = ms

    def milliseconds(self) -> int:
        return self._ms

    def __repr__(self) -> str:
        return f"{self._ms} ms"


@dataclass
class OutputOperationInfo:
    batch_time_ms: int
    id: int  # noqa: A003 - PySpark's name
    name: str
    description: str
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    failure_reason: str | None = None

    # PySpark-compatible accessors
    def batchTime(self) -> _Time:
        return _Time(self.batch_time_ms)

    def startTime(self):
        return _opt(self.start_time_ms)

    def endTime(self):
        return _opt(self.end_time_ms)

    def failureReason(self):
        return self.failure_reason

    def duration(self):
        if self.start_time_ms is None or self.end_time_ms is None:
            return NONE
        return Option(self.end_time_ms - self.start_time_ms)

    @property
    def duration_ms(self) -> int | None:
        d = self.duration()
        return None if d is NONE else int(d)


@dataclass
class BatchInfo:
    """Metrics of one batch, all times in epoch (or manual-clock) milliseconds."""

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
        if self.processing_end_time_ms is None:
            return None
        return self.processing_end_time_ms - self.batch_time_ms

    @property
    def failed(self) -> bool:
        return any(o.failure_reason for o in self.output_operations.values())

    # PySpark-compatible accessors (Java BatchInfo through Py4J)
    def batchTime(self) -> _Time:
        return _Time(self.batch_time_ms)

    def submissionTime(self) -> int:
        return self.submission_time_ms

    def processingStartTime(self):
        return _opt(self.processing_start_time_ms)

    def processingEndTime(self):
        return _opt(self.processing_end_time_ms)

    def schedulingDelay(self):
        return _opt(self.scheduling_delay_ms)

    def processingDelay(self):
        return _opt(self.processing_delay_ms)

    def totalDelay(self):
        return _opt(self.total_delay_ms)

    def numRecords(self) -> int:
        return self.num_records

    def outputOperationInfos(self) -> dict[int, OutputOperationInfo]:
        return dict(self.output_operations)

    def streamIdToInputInfo(self) -> dict[int, int]:
        return dict(self.records_per_input)


class _Event:
    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


class StreamingListenerStreamingStarted(_Event):
    def __init__(self, time_ms: int) -> None:
        self.time_ms = time_ms

    def time(self) -> int:
        return self.time_ms


class StreamingListenerBatchSubmitted(_Event):
    def __init__(self, info: BatchInfo) -> None:
        self.info = info

    def batchInfo(self) -> BatchInfo:
        return self.info


class StreamingListenerBatchStarted(StreamingListenerBatchSubmitted):
    pass


class StreamingListenerBatchCompleted(StreamingListenerBatchSubmitted):
    pass


class StreamingListenerOutputOperationStarted(_Event):
    def __init__(self, info: OutputOperationInfo) -> None:
        self.info = info

    def outputOperationInfo(self) -> OutputOperationInfo:
        return self.info


class StreamingListenerOutputOperationCompleted(StreamingListenerOutputOperationStarted):
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


class ListenerBus:
    """Delivers events to listeners synchronously, in order, isolating listener failures."""

    def __init__(self) -> None:
        self._listeners: list[Any] = []
        self._lock = threading.Lock()

    def add(self, listener: Any) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove(self, listener: Any) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def post(self, callback: str, event: Any) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            fn = getattr(listener, callback, None)
            if fn is None:
                continue
            try:
                fn(event)
            except Exception:  # a listener must never break the stream
                log.exception("streaming listener %r failed in %s", listener, callback)
