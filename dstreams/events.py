"""The graph's event loop: every change of graph state happens on one thread.

As in Spark's ``JobGenerator`` (``GenerateJobs``, ``ClearMetadata``, ``DoCheckpoint``,
``ClearCheckpointData``), other threads never touch nodes: the timer posts :class:`GenerateJobs`
at each batch time, a runner posts :class:`BatchCompleted` when a batch's jobs ran, the checkpoint
writer posts :class:`CheckpointCommitted` when a checkpoint's manifest is written, and a user
thread that needs the graph (``DStream.slice``) posts a :class:`Call` and waits for its result.
Events are handled one at a time, in the order they were posted, by the handler given to
:meth:`EventLoop.start` (the scheduler's). A handler that raises is logged and reported to the
``on_error`` given to :meth:`EventLoop.start` (the scheduler stops generating and reports the error, as
Spark's ``EventLoop.onError`` does); the loop goes on handling what is queued (completions of batches
still running, calls of waiting threads).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from .time import BatchTime

if TYPE_CHECKING:
    from .node import DStreamNode

log = logging.getLogger(__name__)


class Event:
    """Base of the events handled on the loop's thread."""


@dataclass
class GenerateJobs(Event):
    time: BatchTime


@dataclass
class BatchCompleted(Event):
    time: BatchTime


@dataclass
class BatchDropped(Event):
    """Batch ``time`` failed for good and its input is dropped (``spark.dstreams.batch.onFailure=dropInput``);
    ``reason`` is the failure's one-line summary; ``error`` (the batch's error) is reported to
    ``awaitTermination`` once the drop is recorded. Posted before the batch's :class:`BatchCompleted`."""

    time: BatchTime
    reason: str
    error: BaseException | None = None


@dataclass
class CheckpointCommitted(Event):
    """A data checkpoint of ``node`` at ``time`` is committed; ``reader`` reads it back."""

    node: DStreamNode
    time: BatchTime
    reader: RDD


@dataclass
class Call(Event):
    """Run ``func`` on the loop's thread; the poster waits on ``done`` for ``result``/``error``."""

    func: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


_STOP = object()


class EventLoop:
    """One daemon thread handling posted events in order (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._handler: Callable[[Event], None] | None = None
        self._on_error: Callable[[BaseException], None] | None = None
        self._stopped = threading.Event()
        self._idle = threading.Condition()
        self._unfinished = 0

    def start(self, handler: Callable[[Event], None],
              on_error: Callable[[BaseException], None] | None = None) -> None:
        """Handle posted events with ``handler`` on the loop's thread; ``on_error(e)`` is told of every error a
        handler raises (after it is logged)."""
        if self._thread is not None:
            raise RuntimeError(f"event loop {self.name} already started")
        self._handler = handler
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopped.is_set()

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def post(self, event: Event) -> None:
        """Queue ``event`` (never blocks); dropped with a debug line once the loop has stopped."""
        if self._stopped.is_set():
            log.debug("event loop %s stopped: %s dropped", self.name, type(event).__name__)
            if isinstance(event, Call):
                event.error = RuntimeError("the streaming context has stopped")
                event.done.set()
            return
        with self._idle:
            self._unfinished += 1
        self._queue.put(event)

    def call(self, func: Callable[[], Any], timeout_s: float = 300.0) -> Any:
        """Run ``func`` on the loop's thread and return its result (directly when already on it,
        or when the loop is not running)."""
        if self.in_loop() or not self.running:
            return func()
        ev = Call(func)
        self.post(ev)
        if not ev.done.wait(timeout_s):
            raise TimeoutError(f"the event loop {self.name} did not run the call within {timeout_s} s")
        if ev.error is not None:
            raise ev.error
        return ev.result

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every event posted so far has been handled; False on timeout."""
        if self.in_loop():
            return self._unfinished <= 1
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0 or self._stopped.is_set(), timeout_s)

    def stop(self, timeout_s: float = 10.0, drain: bool = False) -> None:
        """Stop the thread after the event in progress (``drain``: after every queued event)."""
        if self._thread is None:
            self._stopped.set()
            return
        if drain:
            self.wait_idle(timeout_s)
        self._stopped.set()
        self._queue.put(_STOP)
        if not self.in_loop():
            self._thread.join(timeout_s)
        with self._idle:
            self._idle.notify_all()

    def _run(self) -> None:
        assert self._handler is not None
        while True:
            event = self._queue.get()
            if event is _STOP:
                break
            try:
                if self._stopped.is_set():
                    if isinstance(event, Call):
                        event.error = RuntimeError("the streaming context has stopped")
                    continue
                if isinstance(event, Call):
                    try:
                        event.result = event.func()
                    except BaseException as e:
                        event.error = e
                else:
                    self._handler(event)
            except Exception as e:
                log.exception("error handling %s on %s", type(event).__name__, self.name)
                if self._on_error is not None:
                    try:
                        self._on_error(e)
                    except Exception:
                        log.exception("error reporting an error of %s", self.name)
            finally:
                if isinstance(event, Call):
                    event.done.set()
                with self._idle:
                    self._unfinished -= 1
                    self._idle.notify_all()
        # Wake callers of events that will never be handled.
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(event, Call):
                event.error = RuntimeError("the streaming context has stopped")
                event.done.set()
