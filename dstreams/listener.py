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

Delivery is asynchronous, as in Spark's ``LiveListenerBus``: the engine posts events to the
:class:`ListenerBus`, which queues them and returns at once, and one daemon thread
(``dstreams-listener-bus``) delivers them in posting order. A slow listener therefore never delays
batches, but it sees events late. The queue is bounded (10000 events by default): when listeners
fall that far behind, new events are dropped, counted (``ListenerBus.dropped``) and reported in a
warning at most once a minute. ``ListenerBus.wait_until_empty(timeout_s)`` waits until the events
posted so far are delivered. Because an event is handled after the engine moved on, each event
holds a snapshot of its :class:`BatchInfo`/:class:`OutputOperationInfo`, taken when the event was
created (a "batch submitted" event never shows the processing times filled in later).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time as _time
from collections import deque
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

    def snapshot(self) -> OutputOperationInfo:
        """An independent copy (what a listener event holds: later changes do not show in it)."""
        return dataclasses.replace(self)


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

    def snapshot(self) -> BatchInfo:
        """An independent copy (what a listener event holds: later changes do not show in it): the
        fields, with the ``records_per_input`` and ``output_operations`` dicts and each
        :class:`OutputOperationInfo` in it copied too."""
        return dataclasses.replace(
            self,
            records_per_input=dict(self.records_per_input),
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
    """Holds a snapshot of ``info`` taken at construction (events are delivered asynchronously)."""

    def __init__(self, info: BatchInfo) -> None:
        self.info = info.snapshot()

    def batchInfo(self) -> BatchInfo:
        return self.info


class StreamingListenerBatchStarted(StreamingListenerBatchSubmitted):
    pass


class StreamingListenerBatchCompleted(StreamingListenerBatchSubmitted):
    pass


class StreamingListenerOutputOperationStarted(_Event):
    """Holds a snapshot of ``info`` taken at construction (events are delivered asynchronously)."""

    def __init__(self, info: OutputOperationInfo) -> None:
        self.info = info.snapshot()

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
    """Delivers events to listeners asynchronously, like Spark's ``LiveListenerBus``/``AsyncEventQueue``.

    * :meth:`post` never waits for a listener: it appends ``(callback, event)`` to a bounded queue and
      returns. One daemon thread (``dstreams-listener-bus``), started by :meth:`start` or lazily by the
      first :meth:`post`, delivers the events in the order they were posted, each event to every
      listener (registered at the time of delivery) that has the callback.
    * Listener isolation: an exception raised by a listener is logged and delivery goes on, to the
      other listeners and with the next events. A listener must never break the stream.
    * A full queue (``capacity`` events waiting, not counting the one being delivered) drops the new
      event: :attr:`dropped` counts every dropped event, and a warning is logged at most once every
      :attr:`drop_warning_interval_s` seconds (the first drop warns at once).
    * :meth:`wait_until_empty` waits (with a timeout) until every event posted so far is delivered;
      :meth:`stop` delivers what is queued (bounded by a timeout) and ends the thread, after which
      :meth:`post` is a no-op. A stopped bus cannot be started again.
    * Listeners may post events and register or remove listeners from their callbacks.
    """

    THREAD_NAME = "dstreams-listener-bus"
    DEFAULT_CAPACITY = 10000

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"the listener bus capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        #: Total number of events dropped because the queue was full.
        self.dropped = 0
        #: Minimum seconds between two warnings about dropped events (Spark: 60 s).
        self.drop_warning_interval_s = 60.0
        self._listeners: list[Any] = []
        self._listeners_lock = threading.Lock()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)  # notified each time an event is done
        self._queue: deque[tuple[str, Any]] = deque()
        self._posted = 0  # events accepted into the queue, ever
        self._done = 0  # events delivered (or discarded by a timed-out stop), ever; in posting order
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._created_wall = _time.time()
        self._last_drop_warning: float | None = None  # monotonic time of the last warning
        self._last_drop_warning_wall: float | None = None
        self._unreported_drops = 0

    # ------------------------------------------------------------------ listeners
    def add(self, listener: Any) -> None:
        """Register ``listener``; it receives the events delivered from now on."""
        with self._listeners_lock:
            self._listeners.append(listener)

    def remove(self, listener: Any) -> None:
        """Unregister ``listener`` (``ValueError`` if it is not registered). An event being delivered
        at this moment may still reach it; later events do not."""
        with self._listeners_lock:
            self._listeners.remove(listener)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the delivery thread (idempotent; :meth:`post` also starts it). ``RuntimeError``
        after :meth:`stop`: a stopped bus cannot be restarted."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the listener bus has been stopped and cannot be started again")
            self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Deliver the events already queued, then end the delivery thread; wait at most ``timeout_s``.

        From then on :meth:`post` drops events silently. If the timeout passes first (a listener is
        too slow or stuck), the events still queued are discarded with a warning and the thread ends
        after the listener call in progress returns. Called from a listener callback (on the bus
        thread), it returns at once and the thread ends after delivering what is queued. Idempotent.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            thread = self._thread
            self._not_empty.notify_all()
            pending = self._drop_report_locked(final=True)
        if pending is not None:
            log.warning(*pending)
        if thread is None:
            return
        if thread is threading.current_thread():
            log.debug("listener bus stop() called from a listener: the bus thread ends after the queue")
            return
        thread.join(max(0.0, timeout_s))
        if not thread.is_alive():
            return
        with self._lock:
            discarded = len(self._queue)
            self._queue.clear()
            self._done += discarded
            self._progress.notify_all()
        log.warning(
            "listener bus stopped after waiting %.1f s for its listeners: %d queued events were not "
            "delivered; a listener is still running and the bus thread ends when it returns",
            timeout_s, discarded,
        )

    # ------------------------------------------------------------------ posting
    @property
    def has_listeners(self) -> bool:
        """Whether any listener is registered (posters skip building events nobody would receive)."""
        return bool(self._listeners)

    def post(self, callback: str, event: Any) -> None:
        """Queue ``event`` for the listeners' ``callback`` (e.g. ``"onBatchCompleted"``); never blocks.

        A full queue drops the event (counted in :attr:`dropped`, warned about at most once a minute);
        after :meth:`stop` the event is dropped silently. With no listener registered the event is
        dropped at once (no queueing, no thread woken), as a synchronous delivery to nobody would be.
        """
        if not self._listeners:
            return
        with self._lock:
            if self._stopped:
                log.debug("listener bus stopped: %s event dropped", callback)
                return
            if len(self._queue) >= self.capacity:
                self.dropped += 1
                self._unreported_drops += 1
                report = self._drop_report_locked(final=False)
            else:
                self._queue.append((callback, event))
                self._posted += 1
                self._start_locked()
                self._not_empty.notify()
                return
        if report is not None:
            log.warning(*report)

    def _drop_report_locked(self, final: bool) -> tuple[Any, ...] | None:
        """The warning to log for the drops not reported yet, or None (rate-limited; lock held)."""
        if self._unreported_drops == 0:
            return None
        now = _time.monotonic()
        if (not final and self._last_drop_warning is not None
                and now - self._last_drop_warning < self.drop_warning_interval_s):
            return None
        if self._last_drop_warning_wall is None:
            since = f"the bus was created ({_fmt_wall(self._created_wall)})"
        else:
            since = _fmt_wall(self._last_drop_warning_wall)
        count, self._unreported_drops = self._unreported_drops, 0
        self._last_drop_warning = now
        self._last_drop_warning_wall = _time.time()
        return (
            "dropped %d events from the listener bus since %s (%d in total): the streaming listeners "
            "are too slow to keep up with the events and the queue of %d events is full; make the "
            "listener callbacks faster (hand slow work to another thread) or raise the capacity "
            "(ListenerBus(capacity=...))",
            count, since, self.dropped, self.capacity,
        )

    # ------------------------------------------------------------------ waiting
    def wait_until_empty(self, timeout_s: float) -> bool:
        """Block until every event posted before this call has been delivered to every listener
        (including the event being delivered now) or ``timeout_s`` seconds pass.

        Returns True when they all are delivered (at once if nothing is pending), False on timeout.
        Called from a listener callback (on the bus thread) it returns False at once: the event being
        delivered is the caller's own, so the bus cannot be empty, and waiting would deadlock.
        """
        if threading.current_thread() is self._thread:
            log.debug("wait_until_empty() called from a listener callback: not waiting")
            return False
        deadline = _time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            target = self._posted
            while self._done < target:
                remaining = deadline - _time.monotonic()
                if remaining <= 0:
                    return False
                self._progress.wait(remaining)
            return True

    # ------------------------------------------------------------------ delivery thread
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stopped:
                    self._not_empty.wait()
                if not self._queue:  # stopped and drained
                    return
                callback, event = self._queue.popleft()
            try:
                self._deliver(callback, event)
            except BaseException:  # keep the thread alive whatever happens: later events still count
                log.exception("listener bus: unexpected error delivering %s", callback)
            finally:
                with self._lock:
                    self._done += 1
                    self._progress.notify_all()

    def _deliver(self, callback: str, event: Any) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            fn = getattr(listener, callback, None)
            if fn is None:
                continue
            try:
                fn(event)
            except Exception:  # a listener must never break the stream
                log.exception("streaming listener %r failed in %s", listener, callback)


def _fmt_wall(t: float) -> str:
    return _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(t))
