"""Job generation and job execution, kept apart; every change of graph state on one thread.

Contract (Spark's ``JobScheduler`` and ``JobGenerator``):

* The **timer** thread waits on the injected clock for each batch time ``t = start + k*batch`` and
  posts :class:`~dstreams.events.GenerateJobs` to the **event loop** (:mod:`dstreams.events`).
* On the event loop's one thread, and only there, graph state changes: a batch is generated (input
  offsets are fixed, then one job per output operation: RDD construction only, no Spark action;
  then the journal records the batch before it may run), completed batches are cleaned up
  (``clear_metadata``, the journal's completion record, checkpoints started) and committed data
  checkpoints are adopted (the lineage cut). Other threads post events and never touch nodes.
* The **runners** execute batches in submission order with at most ``concurrent_batches`` in
  flight (timestep pipelining); a batch's output jobs run in registration order. Each batch runs
  under its own Spark job group (``dstreams-<ctx>-<batch ms>``), so its Spark jobs can be found
  (stage counts in tests) and cancelled. A runner posts :class:`~dstreams.events.BatchCompleted`.
* When batch ``t`` and every earlier batch have completed, old RDDs are cleared up to ``t``.
* A failed job is recorded (the first error is re-raised by ``await_termination``) and reported
  in the batch's metrics; later batches still run, as in PySpark. A journal that fails (fenced, or
  the store stayed down past its bound) stops generation.
* Metrics times are wall-clock epoch milliseconds; ``total delay = scheduling + processing``
  (as in Spark), so they stay meaningful with a manual clock.
* Rate control: when a batch completes, every input node's ``batch_completed(info)`` is called on the
  event loop with the batch's :class:`~dstreams.listener.BatchInfo` (its delays known), in the order
  the completions arrive; the sources' per-batch metrics entries (their rate limits) are in
  ``info.input_metadata``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time as _time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import output_records
from .clock import Clock
from .contracts import BatchJournal, Checkpointer, FaultHook, NoOutageRetry, OutagePolicy, no_fault
from .errors import DStreamsError, task_traceback
from .events import BatchCompleted, BatchDropped, CheckpointCommitted, Event, EventLoop, GenerateJobs
from .graph import DStreamGraph, GraphServices, Job, WriteAheadLog
from .listener import (
    BatchInfo,
    OutputOperationInfo,
    StreamingListenerBatchCompleted,
    StreamingListenerBatchStarted,
    StreamingListenerBatchSubmitted,
    StreamingListenerOutputOperationCompleted,
    StreamingListenerOutputOperationStarted,
    StreamingListenerStreamingStarted,
)
from .listener_bus import ListenerBus
from .time import BatchTime, Duration

log = logging.getLogger(__name__)

_ctx_ids = itertools.count(1)


def wall_ms() -> int:
    return int(_time.time() * 1000)


#: What a failed batch's error says about going past a bad record (its second line).
WAYS_PAST_A_BAD_RECORD = (
    "If one record causes it: map/flatMap/filter/mapValues/flatMapValues(..., onError='deadLetter') (or "
    "spark.dstreams.onRecordError=deadLetter) route the records their function raises on to the dead letters "
    "(ssc.deadLetters()), saveToPostgres(..., onError='deadLetter') the rows its table refuses; "
    "spark.dstreams.batch.onFailure=dropInput drops a batch that keeps failing and goes on.")


class BatchFailedError(DStreamsError, RuntimeError):
    """A batch's output operation failed inside Spark; the message carries the Python traceback.

    ``__cause__`` is the original error (a ``Py4JJavaError`` with the full JVM stack trace).
    """

    def __init__(self, batch_time: BatchTime, operation: str, detail: str) -> None:
        cause = last_line(detail)
        super().__init__(f"batch {batch_time.ms} failed in output operation {operation!r}: {cause}\n"
                         f"{WAYS_PAST_A_BAD_RECORD}\n{detail}")
        self.batch_time = batch_time
        self.operation = operation
        self.cause = cause


class BatchNotDoneError(DStreamsError, RuntimeError):
    """Waiting for a batch that will not complete: the context stopped on an error first (``__cause__``)."""


def first_batch_time(clock: Clock, batch: Duration) -> BatchTime:
    """The first batch of a fresh start: the next multiple of ``batch`` after the clock's current time (Spark's
    ``RecurringTimer.getStartTime``). The one place that computes it: the composition root records it in the
    metadata log (its zero time) and the scheduler starts from it."""
    return BatchTime((clock.time_ms() // batch.ms + 1) * batch.ms)


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (a traceback's exception line), at most 1,000 characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:1000] if lines else ""


def retry_delay(attempt: int) -> float:
    """Seconds to wait before try ``attempt + 1`` of a failed batch: 0.5, 1, 2, ... at most 10."""
    return min(10.0, 0.5 * 2 ** (attempt - 1))


def _describe(error: BaseException) -> str:
    """The Python traceback inside a Spark task failure, else the error's own text."""
    tb = task_traceback(error)
    return tb if tb is not None else f"{type(error).__name__}: {error}"


def user_facing_error(error: BaseException, batch_time: BatchTime, operation: str) -> BaseException:
    """Errors raised in the driver stay as they are; task failures (:func:`dstreams.errors.task_traceback`) become
    :class:`BatchFailedError`."""
    tb = task_traceback(error)
    if tb is None:
        return error
    wrapped = BatchFailedError(batch_time, operation, tb)  # its first line: the output and the cause
    wrapped.__cause__ = error
    return wrapped


@dataclass
class Batch:
    time: BatchTime
    jobs: list[Job]
    info: BatchInfo
    error: BaseException | None = None
    #: Its completion must not be recorded: it failed for good (``onFailure=stop``, a store down past the
    #: outage bound) or a stop cut it; a restart runs it again from the metadata log.
    incomplete: bool = False
    #: How many of ``jobs`` have run to their end in this driver: a retry starts after them.
    jobs_done: int = 0
    #: Failed for good under ``onFailure=dropInput``: its input is dropped (see ``JobScheduler``).
    dropped: bool = False
    #: The error a dropped batch reports to ``awaitTermination``, once its drop is recorded.
    drop_error: BaseException | None = None


class JobScheduler:
    """Owns the timer, the event loop, the runner threads and the batch metrics.

    Everything it works with comes through its constructor: the graph, the clock, the listener
    bus, the checkpointer, and optionally the journal (master recovery), the write-ahead log of
    sources that cannot replay and a fault-injection hook (tests).
    """

    def __init__(self, graph: DStreamGraph, clock: Clock, bus: ListenerBus, checkpointer: Checkpointer,
                 events: EventLoop, *, concurrent_batches: int = 1, journal: BatchJournal | None = None,
                 wal: WriteAheadLog | None = None, fault_hook: FaultHook = no_fault,
                 outage: OutagePolicy | None = None, keep_batch_infos: int = 1000, max_attempts: int = 3,
                 on_failure: str = "stop") -> None:
        if concurrent_batches < 1:
            raise ValueError(f"concurrentBatches must be >= 1, got {concurrent_batches}")
        if max_attempts < 1:
            raise ValueError(f"spark.dstreams.batch.maxAttempts must be >= 1, got {max_attempts}")
        if on_failure not in ("stop", "dropInput"):
            raise ValueError(f"spark.dstreams.batch.onFailure must be 'stop' or 'dropInput', got {on_failure!r}")
        #: How many times a failing batch is tried, and what happens after (see the module docstring).
        self.max_attempts = max_attempts
        self.on_failure = on_failure
        self.graph = graph
        self.clock = clock
        self.bus = bus
        self.checkpointer = checkpointer
        self.events = events
        self.concurrent_batches = concurrent_batches
        #: The metadata log seen from here: ``batch_generated(t)`` before a batch runs and
        #: ``batch_completed(t)`` after it; raising there stops this driver (fencing).
        self.journal = journal
        self.wal = wal
        self.fault_hook = fault_hook
        #: Store outages met while building or running a batch are waited out (see ``_ride_out``).
        self.outage: OutagePolicy = outage if outage is not None else NoOutageRetry()
        self.ctx_id = next(_ctx_ids)
        self._stop_generating = threading.Event()
        self._stop_running = threading.Event()
        self._cond = threading.Condition()
        self._queue: deque[Batch] = deque()
        self._running: dict[int, Batch] = {}
        self._held = 0  # queued batches taken out while they are rebuilt on a new checkpoint
        # Touched on the event loop's thread only:
        self._pending_times: list[int] = []  # submitted, not completed
        self._completed: set[int] = set()
        self._done_through = -1  # every batch up to this time has completed and been cleaned up
        self._infos_in_flight: dict[int, BatchInfo] = {}  # queued batches' infos, until they complete
        self.infos: deque[BatchInfo] = deque(maxlen=keep_batch_infos)
        self.last_generated: BatchTime | None = None
        self.last_completed: BatchTime | None = None
        self.start_time: BatchTime | None = None
        self.error: BaseException | None = None
        self.error_event = threading.Event()
        self._fatal_error: BaseException | None = None
        #: Batches recorded as dropped by an earlier driver (``onFailure=dropInput``) that a restart replays:
        #: they are dropped again, so the state is rebuilt as the first run built it.
        self._replay_dropped: set[int] = set()
        self._unrecordable: set[int] = set()  # batches whose completion must never be recorded
        self.batches_dropped = 0
        self._timer: threading.Thread | None = None
        self._runners: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self, first_batch: BatchTime | None = None, zero_time: BatchTime | None = None,
              prepare: Callable[[], None] | None = None, dropped: set[int] | None = None) -> BatchTime:
        """Initialise the graph at ``zero_time`` and generate from ``first_batch`` on.

        ``prepare`` runs after the graph is initialised and before the first batch is generated
        (a recovering driver restores state there). Batch times before the clock's time are
        generated at once (catching up). ``dropped``: batch times (ms) an earlier driver dropped, which
        are dropped again when they are replayed.
        """
        self._replay_dropped = set(dropped or ())
        batch = self.graph.batch_duration
        assert batch is not None
        if first_batch is None:
            first_batch = first_batch_time(self.clock, batch)
        self.start_time = first_batch
        services = GraphServices(self.checkpointer, self.wal)
        # A source whose server is down at start (Redis restarting) is waited for as in a batch, within the
        # outage bound, instead of failing the start.
        self.graph.start(zero_time if zero_time is not None else first_batch - batch, services, self._ride_out)
        if prepare is not None:
            prepare()
        self.events.start(self._handle, self._fatal)
        self._timer = threading.Thread(target=self._timer_loop, name=f"dstreams-{self.ctx_id}-timer", daemon=True)
        for i in range(self.concurrent_batches):
            self._runners.append(threading.Thread(target=self._run_loop, name=f"dstreams-{self.ctx_id}-runner-{i}",
                                                  daemon=True))
        for t in [*self._runners, self._timer]:
            t.start()
        self._notify("onStreamingStarted", StreamingListenerStreamingStarted, wall_ms())
        return first_batch

    def stop(self, graceful: bool, timeout_s: float) -> None:
        """Stop generating; when ``graceful``, first let every generated batch finish (bounded)."""
        self._stop_generating.set()
        if self._timer is not None:
            self._timer.join(timeout=timeout_s)
        if graceful:
            deadline = _time.monotonic() + timeout_s
            self.events.wait_idle(timeout_s)  # batches posted before the stop are generated
            with self._cond:
                while (self._queue or self._running or self._held) and _time.monotonic() < deadline:
                    self._cond.wait(0.05)
                if self._queue or self._running or self._held:
                    log.warning("graceful stop timed out after %.1f s with batches still pending", timeout_s)
            self.events.wait_idle(max(0.1, deadline - _time.monotonic()))  # their completions are recorded
        with self._cond:
            dropped = len(self._queue)
            self._queue.clear()
            running = list(self._running.values())
            self._stop_running.set()
            self._cond.notify_all()
        if dropped:
            log.info("stop: %d queued batch(es) were not run", dropped)
        sc = self.graph.sc
        for b in running:
            try:
                sc.cancelJobGroup(b.info.job_group)
            except Exception:  # the SparkContext may be stopping
                pass
        for t in self._runners:
            t.join(timeout=timeout_s)
        self.events.stop(timeout_s)

    # ------------------------------------------------------------------ the event loop's thread
    def _timer_loop(self) -> None:
        batch = self.graph.batch_duration
        assert batch is not None and self.start_time is not None
        t = self.start_time
        while not self._stop_generating.is_set():
            self.clock.wait_till(t.ms, self._stop_generating)
            if self._stop_generating.is_set():
                break
            self.events.post(GenerateJobs(t))
            t = t + batch

    def _handle(self, event: Event) -> None:
        if isinstance(event, GenerateJobs):
            # Batches due before a graceful stop are still generated; none after a fatal error or a hard stop.
            if self._fatal_error is None and not self._stop_running.is_set():
                self.generate_batch(event.time)
        elif isinstance(event, BatchCompleted):
            self._batch_completed(event.time)
        elif isinstance(event, BatchDropped):
            self._drop(event)
        elif isinstance(event, CheckpointCommitted):
            self._checkpoint_committed(event)
        else:
            raise TypeError(f"unknown event {event!r}")

    def generate_batch(self, t: BatchTime) -> None:
        """Build batch ``t`` and queue it for the runners (on the event loop's thread).

        A failure while building (a source, a driver-side function) is tried again like a failed batch
        (``max_attempts``, the same delays); past that, ``on_failure`` decides: ``stop`` stops generating with
        the batch not recorded (a restart builds it again), ``dropInput`` drops its input (see
        :meth:`_drop`). A batch an earlier driver dropped is dropped again when it is replayed.
        """
        started = _time.perf_counter()
        info = BatchInfo(t.ms, wall_ms(), job_group=f"dstreams-{self.ctx_id}-{t.ms}")
        b = Batch(t, [], info)
        replayed_drop = t.ms in self._replay_dropped
        if replayed_drop:
            self._replay_dropped.discard(t.ms)
            b.dropped = info.dropped = True
            self.graph.drop_input(t, [])
            log.warning("batch %s was dropped by an earlier driver (spark.dstreams.batch.onFailure=dropInput): it is "
                        "replayed without its input", t)
        else:
            built = self._build(b)
            if not built:
                return
        if self.journal is not None:
            try:
                self.journal.batch_generated(t)
                if b.dropped and not replayed_drop:  # a replayed drop is recorded already
                    self.journal.batch_dropped(t, info.failure or "dropped")
            except BaseException as e:
                log.error("could not record batch %s in the metadata log: %s", t, e)
                self._fatal(e)
                return
        if b.dropped and not replayed_drop:
            self.batches_dropped += 1
        if b.drop_error is not None:
            self._report_error(b.drop_error)
        records = self.graph.input_records(t)
        info.records_per_input = records
        info.num_records = sum(records.values())
        info.input_metadata = {n.id: m for n in self.graph.inputs if (m := n.metadata_at(t))}
        for j in b.jobs:
            info.output_operations[j.output_id] = OutputOperationInfo(t.ms, j.output_id, j.name, j.description)
        self.last_generated = t
        info.generation_ms = (_time.perf_counter() - started) * 1000.0
        with self._cond:
            if not self._accepting():  # stopped, or an earlier batch failed for good, while it was being built
                log.info("batch %s is not queued: %s", t, "the context is stopping" if self._fatal_error is None
                         else "an earlier batch failed for good")
                return
            self._pending_times.append(t.ms)
            self._queue.append(b)
            self._infos_in_flight[t.ms] = info
            self._cond.notify_all()
        self._notify("onBatchSubmitted", StreamingListenerBatchSubmitted, info)

    def _build(self, b: Batch) -> bool:
        """Build ``b``'s jobs, trying again after a failure; False when the batch must not be queued."""
        t, info = b.time, b.info
        while True:
            try:
                b.jobs = self._ride_out(f"building batch {t.ms}", lambda: self.graph.generate_jobs(t))
                return True
            except BaseException as e:  # a source or a user function raising while the graph is built
                if self.outage.is_outage(e):
                    log.error("batch %s could not be built: the store stayed unavailable: %s", t, e)
                    self._fatal(e)  # past the outage bound: stop; a restart resumes from the metadata log
                    return False
                info.failure = f"building the batch: {last_line(_describe(e))}"
                if info.attempts < self.max_attempts and not self._stop_generating.is_set():
                    delay = retry_delay(info.attempts)
                    log.warning("batch %s could not be built (attempt %d of %d): %s; trying again in %.1f s", t,
                                info.attempts, self.max_attempts, info.failure, delay, exc_info=True)
                    if self._stop_generating.wait(delay):
                        return False  # stopped: not recorded, so a restart builds it again
                    info.attempts += 1
                    continue
                if self._stop_generating.is_set() or self.on_failure == "stop":
                    log.error("batch %s could not be built (%d attempt(s)): the context stops with the batch not "
                              "done; a restart with getOrCreate builds it again", t, info.attempts, exc_info=True)
                    self._fatal(e)
                    return False
                log.error("batch %s could not be built (%d attempt(s)): its input is dropped "
                          "(spark.dstreams.batch.onFailure=dropInput)", t, info.attempts, exc_info=True)
                b.error = b.drop_error = e  # reported once the drop is recorded (see generate_batch)
                b.dropped = info.dropped = True
                b.jobs = []
                self.graph.drop_input(t, [])
                return True

    def _batch_completed(self, time: BatchTime) -> None:
        """Record, clean up and checkpoint every batch whose predecessors have all completed."""
        started = _time.perf_counter()
        if time.ms in self._unrecordable:
            return  # its drop could not be recorded: it stays not done
        self._completed.add(time.ms)
        ready: list[int] = []
        while self._pending_times and self._pending_times[0] in self._completed:
            t = self._pending_times.pop(0)
            self._completed.discard(t)
            ready.append(t)
        for t in ready:
            if self.journal is not None:
                try:
                    self.journal.batch_completed(BatchTime(t))
                except BaseException as e:
                    log.error("could not record the completion of batch %s: %s", t, e)
                    self._fatal(e)
            try:
                self.graph.clear_metadata(BatchTime(t))
                self.checkpointer.batch_completed(BatchTime(t))
            except Exception:
                log.exception("error clearing metadata at %s", t)
        # The runner finished this info before it posted the event (the queue orders the two threads).
        info = self._infos_in_flight.pop(time.ms, None)
        if info is not None:
            for node in self.graph.inputs:
                try:
                    node.batch_completed(info)
                except Exception:
                    log.exception("rate control of %s failed after batch %s", node.name, time)
            info.cleanup_ms = (_time.perf_counter() - started) * 1000.0
        # Bookkeeping first, then wake waiters: whoever waits for batch t sees its cleanup done
        # and its checkpoints started.
        with self._cond:
            self._done_through = max([self._done_through, *ready]) if ready else self._done_through
            self.last_completed = time if self.last_completed is None else max(self.last_completed, time)
            self._cond.notify_all()

    def _checkpoint_committed(self, event: CheckpointCommitted) -> None:
        """Adopt a committed checkpoint: the node's RDD at its time now reads it (the lineage cut).

        Batches still queued (a backlog) are held back while their jobs are rebuilt on the cut
        lineage (see ``DStreamGraph.rebuild_jobs``), then put back in order; running batches keep
        what they run.
        """
        built: list[int] = []

        def adopt(held: list[Batch]) -> None:
            built.append(event.node.adopt_checkpoint(event.time, event.reader))
            self._rebuild_queued(event.node, held)

        self._holding_queue(adopt)
        self.checkpointer.adopted(event.node, event.time, built[0])
        if self.journal is not None:
            self.journal.checkpoint_committed(event.node.key, event.time.ms)

    def _holding_queue(self, rebuild: Callable[[list[Batch]], None]) -> None:
        """``rebuild(held)`` with the queued batches taken out of the queue (runners cannot start them), then
        put back in order (unless the context stopped meanwhile)."""
        with self._cond:
            held = list(self._queue)
            self._queue.clear()
            self._held += len(held)
        try:
            rebuild(held)
        finally:
            with self._cond:
                self._held -= len(held)
                if self._accepting():
                    self._queue.extendleft(reversed(held))
                self._cond.notify_all()

    def _drop(self, event: BatchDropped) -> None:
        """Batch ``event.time`` failed for good under ``dropInput``: it and the batches queued after it are built
        again without its input (as if nothing had arrived in its interval: state and windows never see it, and a
        restart that replays it drops it again), and the drop is recorded in the metadata log before its
        completion (posted after this event). Outputs of it that had committed before the failure stay. With
        ``concurrentBatches > 1`` a later batch already running keeps what it was built with."""
        t = event.time

        def rebuild(held: list[Batch]) -> None:
            later = [b.time for b in held if b.error is None and b.time > t]
            jobs = self.graph.drop_input(t, later)
            for b in held:
                if b.time.ms in jobs:
                    b.jobs = jobs[b.time.ms]

        try:
            self._holding_queue(rebuild)
            if self.journal is not None:
                self.journal.batch_dropped(t, event.reason)
        except BaseException as e:
            log.error("could not drop the input of batch %s: %s", t, e, exc_info=True)
            self._unrecordable.add(t.ms)
            self._fatal(e)
            return
        self.batches_dropped += 1
        if event.error is not None:
            # Reported only now: a script that ends on awaitTermination's error leaves the drop recorded, and
            # its restart replays the batch without its input instead of failing on it again.
            self._report_error(event.error)

    def _rebuild_queued(self, node: Any, held: list[Batch]) -> None:
        batches = [b for b in held if b.error is None]
        if not batches:
            return
        started = _time.perf_counter()
        try:
            jobs = self.graph.rebuild_jobs(node, [b.time for b in batches])
        except Exception:  # the old jobs compute the same data, on the longer lineage
            log.warning("could not rebuild %d queued batch(es) on the checkpoint of %s; they run as built",
                        len(batches), node.name, exc_info=True)
            return
        for b in batches:
            b.jobs = jobs[b.time.ms]
        log.debug("rebuilt %d queued batch(es) on the checkpoint of %s in %.1f ms", len(batches), node.name,
                  (_time.perf_counter() - started) * 1000.0)

    # ------------------------------------------------------------------ running
    def _run_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and self._accepting():
                    self._cond.wait(0.1)
                if not self._accepting():  # a graceful stop drained the queue before setting it, or a batch failed
                    return
                b = self._queue.popleft()
                self._running[b.time.ms] = b
            try:
                self._run_batch(b)
            finally:
                with self._cond:  # wait_for_batch reads the deque under the lock
                    self.infos.append(b.info)
                self._notify("onBatchCompleted", StreamingListenerBatchCompleted, b.info)
                if b.dropped and not b.incomplete and b.jobs:
                    self.events.post(BatchDropped(b.time, b.info.failure or "failed", b.drop_error))
                if not b.incomplete:
                    # Posted while the batch still counts as running: a graceful stop, which waits for the
                    # running batches and then for the event loop, records its completion (posted after, the
                    # event could reach a stopped loop and the restart would run the batch again).
                    self.events.post(BatchCompleted(b.time))
                with self._cond:
                    self._running.pop(b.time.ms, None)
                    self._cond.notify_all()

    def _run_batch(self, b: Batch) -> None:
        """Run ``b``'s output jobs in order, trying the batch again after a failure (see the module docstring).

        A try starts at the first job that has not run to its end in this driver. A stop that cuts the
        batch (cancels a job, or comes between two jobs or during a wait) leaves it not done, and no later
        job of it starts.
        """
        info = b.info
        info.processing_start_time_ms = wall_ms()
        self._notify("onBatchStarted", StreamingListenerBatchStarted, info)
        sc = self.graph.sc
        try:
            sc.setJobGroup(info.job_group, f"dstreams batch {b.time.ms}", interruptOnCancel=False)
        except Exception:
            log.debug("could not set the job group", exc_info=True)
        while True:
            failed = self._run_jobs(b)
            if failed is None:
                break
            job, error = failed
            if info.attempts >= self.max_attempts:
                self._failed_for_good(b, job, error)
                break
            delay = retry_delay(info.attempts)
            log.warning("batch %s: %s failed (attempt %d of %d): %s; trying the batch again in %.1f s", b.time,
                        job.name, info.attempts, self.max_attempts, info.failure, delay)
            if self._stop_running.wait(delay):
                b.incomplete = True  # a stop came while it waited: a restart runs it again
                break
            for node in self.graph.nodes:
                node.before_batch_retry(b.time, error)
            info.attempts += 1
        info.event_time = {n.id: m for n in self.graph.nodes  # reads only (event-time streams)
                           if (m := n.event_time_metrics(b.time)) is not None}
        info.processing_end_time_ms = wall_ms()

    def _run_jobs(self, b: Batch) -> tuple[Job, BaseException] | None:
        """One try of ``b``: its jobs from ``b.jobs_done`` on, in order, until one fails (returned with its
        error; None when every job ran, or when a stop or a store outage ended the batch)."""
        info = b.info
        for job in b.jobs[b.jobs_done:]:
            if self._stop_running.is_set():
                b.incomplete = True  # cut by a stop: none of its later outputs starts
                log.info("batch %s: stopped before %s", b.time, job.name)
                return None
            if b.jobs_done == 0 and info.attempts == 1:
                self.fault_hook("mid-batch")
            op = info.output_operations[job.output_id]
            op.start_time_ms = wall_ms()
            op.failure_reason = None
            self._notify("onOutputOperationStarted", StreamingListenerOutputOperationStarted, op)
            try:
                with output_records.counting() as written:
                    self._ride_out(f"{job.name} of batch {b.time.ms}", job.run)
                op.records_written = written.total
            except BaseException as e:
                op.end_time_ms = wall_ms()
                if self._stop_running.is_set():
                    log.info("batch %s: %s interrupted by stop()", b.time, job.name)
                    op.failure_reason = "stopped"
                    b.incomplete = True
                    self._notify("onOutputOperationCompleted", StreamingListenerOutputOperationCompleted, op)
                    return None
                op.failure_reason = "".join(traceback.format_exception(type(e), e, e.__traceback__))
                self._notify("onOutputOperationCompleted", StreamingListenerOutputOperationCompleted, op)
                b.error = e
                if self.outage.is_outage(e):
                    # The store stayed down past the bound: this batch must not count as done (a restart
                    # runs it again from the metadata log); stop the driver with the store's error.
                    b.incomplete = True
                    self._fatal(user_facing_error(e, b.time, job.name))
                    return None
                info.failure = f"{job.name}: {last_line(_describe(e))}"
                log.error("error running %s of batch %s (attempt %d of %d)", job.name, b.time, info.attempts,
                          self.max_attempts, exc_info=True)
                return job, e
            op.end_time_ms = wall_ms()
            self._notify("onOutputOperationCompleted", StreamingListenerOutputOperationCompleted, op)
            b.jobs_done += 1
        return None

    def _failed_for_good(self, b: Batch, job: Job, error: BaseException) -> None:
        """``b`` failed ``max_attempts`` times: stop with it not done, or (``dropInput``) drop its input."""
        wrapped = user_facing_error(error, b.time, job.name)
        if self.on_failure == "dropInput":
            log.error("batch %s failed %d time(s) in %s: its input is dropped and the stream goes on "
                      "(spark.dstreams.batch.onFailure=dropInput)", b.time, b.info.attempts, job.name)
            b.dropped = b.info.dropped = True
            b.drop_error = wrapped  # reported once the drop is recorded (see _drop)
            return
        log.error("batch %s failed %d time(s) in %s: the context stops with the batch not done; a restart with "
                  "getOrCreate runs it again", b.time, b.info.attempts, job.name)
        b.incomplete = True
        self._fatal(wrapped)

    def _ride_out(self, what: str, func: Callable[[], Any]) -> Any:
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

    @property
    def fatal_error(self) -> BaseException | None:
        """The error that stopped this scheduler (a batch failed for good, a fence, a store down past the
        outage bound, an error of the event loop), or None."""
        return self._fatal_error

    def _accepting(self) -> bool:
        """Whether a batch may still be queued or started (call holding ``_cond``): not after a stop, and not
        after a fatal error (a batch failed for good: it is the last one that starts)."""
        return self._fatal_error is None and not self._stop_running.is_set()

    def _fatal(self, e: BaseException) -> None:
        """Stop generating batches (e.g. this driver was fenced off) and report ``e``. From here on no batch is
        queued or started: the queue is emptied, a batch being built is not queued, a runner takes nothing more
        (batches already running with ``concurrentBatches > 1`` end as they are)."""
        self._stop_generating.set()
        with self._cond:
            if self._fatal_error is None:
                self._fatal_error = e
            if self._queue:
                log.info("%d queued batch(es) will not run: %s", len(self._queue), last_line(str(e)))
            self._queue.clear()
            self._cond.notify_all()
        self._report_error(e)

    def _report_error(self, e: BaseException) -> None:
        if self.error is None:
            self.error = e
        self.error_event.set()

    # ------------------------------------------------------------------ test & benchmark helpers
    def wait_for_batch(self, t: BatchTime, timeout_s: float) -> BatchInfo:
        """Block until batch ``t`` has completed (raises TimeoutError after ``timeout_s``).

        Raises :class:`BatchNotDoneError` (with the scheduler's fatal error as its cause) as soon as the
        scheduler has stopped on an error and ``t`` is not done: it never will be in this driver.
        """
        deadline = _time.monotonic() + timeout_s
        while True:
            with self._cond:
                while True:
                    if self._done_through >= t.ms:
                        for info in reversed(self.infos):
                            if info.batch_time_ms == t.ms:
                                return info
                        raise KeyError(f"batch {t} completed but its metrics were not kept")
                    remaining = deadline - _time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(f"batch {t} did not complete within {timeout_s} s")
                    if self._fatal_error is not None and not self._running and not self._queue and not self._held:
                        break  # nothing runs any more: see below, outside the lock
                    self._cond.wait(min(remaining, 0.1))
            # Completions already posted are recorded by the event loop: let it finish, then decide.
            self.events.wait_idle(max(0.0, min(5.0, deadline - _time.monotonic())))
            with self._cond:
                if self._done_through >= t.ms:
                    continue
            raise BatchNotDoneError(f"batch {t} will not complete: the streaming context stopped on an error "
                                    f"({last_line(str(self._fatal_error))})") from self._fatal_error
