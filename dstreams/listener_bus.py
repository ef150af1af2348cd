"""The listener bus: delivers the listener events of :mod:`dstreams.listener` to the registered listeners.

Delivery is asynchronous, as in Spark's ``LiveListenerBus``: the engine posts events to the
:class:`ListenerBus`, which queues them and returns at once, and one daemon thread
(``dstreams-listener-bus``) delivers them in posting order. A slow listener therefore never delays
batches, but it sees events late. The queue is bounded (``spark.dstreams.listenerBus.capacity``, 10000
events by default): when listeners fall that far behind, new events are dropped, counted
(``ListenerBus.dropped``) and reported in a warning at most once a minute.
``ListenerBus.wait_until_empty(timeout_s)`` waits until the events posted so far are delivered. Because an
event is handled after the engine moved on, each event holds a snapshot of its
:class:`~dstreams.listener.BatchInfo`/:class:`~dstreams.listener.OutputOperationInfo`, taken when the event
was created (a "batch submitted" event never shows the processing times filled in later), as PySpark's events
hold their own immutable copies.
"""

from __future__ import annotations

import logging
import threading
import time as _time
from collections import deque
from typing import Any

from . import config

log = logging.getLogger(__name__)


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
    #: ``spark.dstreams.listenerBus.capacity``'s default (:data:`dstreams.config.LISTENER_BUS_CAPACITY`).
    DEFAULT_CAPACITY: int = config.LISTENER_BUS_CAPACITY.default

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
            "(spark.dstreams.listenerBus.capacity)",
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
