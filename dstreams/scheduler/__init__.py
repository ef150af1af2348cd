"""Batch generation, batch running and the failure policy, kept apart (Spark's ``JobGenerator`` and
``JobScheduler``); :class:`JobScheduler` wires them and owns the lifecycle.

The parts:

* :mod:`~dstreams.scheduler.generator` (``JobGenerator``): the timer and the event loop's handlers; every change of
  graph state happens there, on the event loop's one thread (generation, cleanup after completion, checkpoint
  adoption, dropped input).
* :mod:`~dstreams.scheduler.runner` (``BatchRunner``): the runner threads that execute the batches' output jobs.
* :mod:`~dstreams.scheduler.failure` (``FailurePolicy``): how many tries a failing batch gets and what happens
  after (stop, or drop its input); the errors a failed batch surfaces as.
* :mod:`~dstreams.scheduler.tracker` (``BatchTracker``): where each batch is (queued, held, running, done), the one
  lock the generator and the runners share, and waiting for a batch.

Contract of :class:`JobScheduler`:

* :meth:`JobScheduler.start` initialises the graph, starts the event loop, the timer and the runners; a failed
  job is recorded (the first error is re-raised by ``awaitTermination``) and reported in the batch's metrics;
  later batches still run, as in PySpark. A journal that fails (fenced, or the store stayed down past its bound)
  stops generation.
* Metrics times are wall-clock epoch milliseconds; ``total delay = scheduling + processing`` (as in Spark), so
  they stay meaningful with a manual clock.
* Rate control: when a batch completes, every input node's ``batch_completed(info)`` is called on the event loop
  with the batch's :class:`~dstreams.listener.BatchInfo` (its delays known), in the order the completions arrive;
  the sources' per-batch metrics entries (their rate limits) are in ``info.input_metadata``.
* Store outages met while building or running a batch are waited out (:meth:`JobScheduler.ride_out`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time as _time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..clock import Clock
from ..contracts import BatchJournal, Checkpointer, FaultHook, NoOutageRetry, OutagePolicy, no_fault
from ..events import EventLoop
from ..graph import DStreamGraph, GraphServices, WriteAheadLog
from ..listener import BatchInfo, StreamingListenerStreamingStarted
from ..listener_bus import ListenerBus
from ..time import BatchTime, Duration
from .failure import (
    WAYS_PAST_A_BAD_RECORD,
    BatchFailedError,
    BatchNotDoneError,
    FailurePolicy,
    last_line,
    retry_delay,
    user_facing_error,
)
from .generator import JobGenerator, wall_ms
from .runner import BatchRunner
from .tracker import Batch, BatchTracker

__all__ = ["WAYS_PAST_A_BAD_RECORD", "Batch", "BatchFailedError", "BatchNotDoneError", "FailurePolicy",
           "JobScheduler", "first_batch_time", "last_line", "retry_delay", "user_facing_error", "wall_ms"]

log = logging.getLogger(__name__)

_ctx_ids = itertools.count(1)


def first_batch_time(clock: Clock, batch: Duration) -> BatchTime:
    """The first batch of a fresh start: the next multiple of ``batch`` after the clock's current time (Spark's
    ``RecurringTimer.getStartTime``). The one place that computes it: the composition root records it in the
    metadata log (its zero time) and the scheduler starts from it."""
    return BatchTime((clock.time_ms() // batch.ms + 1) * batch.ms)


class JobScheduler:
    """Owns the lifecycle and wires the generator, the runners, the failure policy and the tracker.

    Everything it works with comes through its constructor: the graph, the clock, the listener bus, the
    checkpointer, and optionally the journal (master recovery), the write-ahead log of sources that cannot replay
    and a fault-injection hook (tests).
    """

    def __init__(self, graph: DStreamGraph, clock: Clock, bus: ListenerBus, checkpointer: Checkpointer,
                 events: EventLoop, *, concurrent_batches: int = 1, journal: BatchJournal | None = None,
                 wal: WriteAheadLog | None = None, fault_hook: FaultHook = no_fault,
                 outage: OutagePolicy | None = None, keep_batch_infos: int = 1000, max_attempts: int = 3,
                 on_failure: str = "stop") -> None:
        self.policy = FailurePolicy(max_attempts, on_failure)
        self.graph = graph
        self.clock = clock
        self.bus = bus
        self.checkpointer = checkpointer
        self.events = events
        #: The metadata log seen from here: ``batch_generated(t)`` before a batch runs and
        #: ``batch_completed(t)`` after it; raising there stops this driver (fencing).
        self.journal = journal
        self.wal = wal
        #: Store outages met while building or running a batch are waited out (see :meth:`ride_out`).
        self.outage: OutagePolicy = outage if outage is not None else NoOutageRetry()
        self.ctx_id = next(_ctx_ids)
        self._stop_generating = threading.Event()
        self._stop_running = threading.Event()
        self.tracker = BatchTracker(keep_batch_infos)
        self.error: BaseException | None = None
        self.error_event = threading.Event()
        self.generator = JobGenerator(graph, clock, events, checkpointer, self.tracker, self.policy, self.outage,
                                      ctx_id=self.ctx_id, journal=journal, ride_out=self.ride_out,
                                      notify=self._notify, fatal=self._fatal, report=self._report_error,
                                      stopping=self._stop_generating, stopped=self._stop_running)
        self.runner = BatchRunner(graph, events, self.tracker, self.policy, self.outage, ctx_id=self.ctx_id,
                                  concurrent_batches=concurrent_batches, fault_hook=fault_hook,
                                  ride_out=self.ride_out, notify=self._notify, fatal=self._fatal,
                                  stopped=self._stop_running)

    # ------------------------------------------------------------------ what others read
    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts

    @property
    def on_failure(self) -> str:
        return self.policy.on_failure

    @property
    def infos(self) -> deque[BatchInfo]:
        """The metrics of the most recent finished batches (oldest first)."""
        return self.tracker.infos

    @property
    def start_time(self) -> BatchTime | None:
        return self.generator.start_time

    @property
    def last_generated(self) -> BatchTime | None:
        return self.generator.last_generated

    @property
    def last_completed(self) -> BatchTime | None:
        return self.tracker.last_completed

    @property
    def batches_dropped(self) -> int:
        return self.generator.batches_dropped

    @property
    def fatal_error(self) -> BaseException | None:
        """The error that stopped this scheduler (a batch failed for good, a fence, a store down past the
        outage bound, an error of the event loop), or None."""
        return self.tracker.fatal_error

    # ------------------------------------------------------------------ lifecycle
    def start(self, first_batch: BatchTime | None = None, zero_time: BatchTime | None = None,
              prepare: Callable[[], None] | None = None, dropped: set[int] | None = None) -> BatchTime:
        """Initialise the graph at ``zero_time`` and generate from ``first_batch`` on.

        ``prepare`` runs after the graph is initialised and before the first batch is generated
        (a recovering driver restores state there). Batch times before the clock's time are
        generated at once (catching up). ``dropped``: batch times (ms) an earlier driver dropped, which
        are dropped again when they are replayed.
        """
        self.generator.replay_dropped = set(dropped or ())
        batch = self.graph.batch_duration
        assert batch is not None
        if first_batch is None:
            first_batch = first_batch_time(self.clock, batch)
        timer = self.generator.start_timer(first_batch)
        services = GraphServices(self.checkpointer, self.wal)
        # A source whose server is down at start (Redis restarting) is waited for as in a batch, within the
        # outage bound, instead of failing the start.
        self.graph.start(zero_time if zero_time is not None else first_batch - batch, services, self.ride_out)
        if prepare is not None:
            prepare()
        self.events.start(self.generator.handle, self._fatal)
        for t in [*self.runner.threads(), timer]:
            t.start()
        self._notify("onStreamingStarted", StreamingListenerStreamingStarted, wall_ms())
        return first_batch

    def stop(self, graceful: bool, timeout_s: float) -> None:
        """Stop generating; when ``graceful``, first let every generated batch finish (bounded)."""
        self._stop_generating.set()
        self.generator.join_timer(timeout_s)
        if graceful:
            deadline = _time.monotonic() + timeout_s
            self.events.wait_idle(timeout_s)  # batches posted before the stop are generated
            if not self.tracker.drain(deadline):
                log.warning("graceful stop timed out after %.1f s with batches still pending", timeout_s)
            self.events.wait_idle(max(0.1, deadline - _time.monotonic()))  # their completions are recorded
        self._stop_running.set()
        dropped, running = self.tracker.stop_running()
        if dropped:
            log.info("stop: %d queued batch(es) were not run", dropped)
        self.runner.cancel(running)
        self.runner.join(timeout_s)
        self.events.stop(timeout_s)

    # ------------------------------------------------------------------ shared by the parts
    def ride_out(self, what: str, func: Callable[[], Any]) -> Any:
        """``func()``, tried again while the outage policy says the store is down and worth waiting for.

        Safe because building a batch is idempotent (memoised RDDs, offsets fixed once) and the
        exactly-once sinks turn a re-run output operation into a rewrite of the same data.
        """
        started = _time.monotonic()
        while True:
            try:
                return func()
            except BaseException as e:
                delay = self.outage.retry_delay(e, _time.monotonic() - started, what)
                if delay is None or self._stop_running.is_set():
                    raise
                if self._stop_running.wait(delay):
                    raise

    def _notify(self, callback: str, event_type: Callable[[Any], Any], arg: Any) -> None:
        """Post ``event_type(arg)`` (a snapshot) to the listeners; nothing is built when none listens."""
        if self.bus.has_listeners:
            self.bus.post(callback, event_type(arg))

    def _fatal(self, e: BaseException) -> None:
        """Stop generating batches (e.g. this driver was fenced off) and report ``e``. From here on no batch is
        queued or started (see :meth:`BatchTracker.fail`)."""
        self._stop_generating.set()
        self.tracker.fail(e)
        self._report_error(e)

    def _report_error(self, e: BaseException) -> None:
        if self.error is None:
            self.error = e
        self.error_event.set()

    # ------------------------------------------------------------------ test & benchmark helpers
    def wait_for_batch(self, t: BatchTime, timeout_s: float) -> BatchInfo:
        """Block until batch ``t`` has completed (raises TimeoutError after ``timeout_s``); raises
        :class:`BatchNotDoneError` as soon as the scheduler stopped on an error and ``t`` is not done."""
        return self.tracker.wait_for_batch(t, timeout_s, self.events.wait_idle)
