"""Job generation and job execution, kept apart.

Contract:

* The **generator** thread waits on the injected clock for each batch time ``t = start + k*batch``
  and, on its own thread, builds the batch: input offsets are fixed, then one job per output
  operation (RDD construction only, no Spark action). The batch is then queued for the runner.
* The **runner** executes batches in submission order with at most ``concurrent_batches`` in
  flight (timestep pipelining); a batch's output jobs run in registration order. Each batch runs
  under its own Spark job group (``dstreams-<ctx>-<batch ms>``), so its Spark jobs can be found
  (stage counts in tests) and cancelled.
* When batch ``t`` and every earlier batch have completed, old RDDs are cleared up to ``t``.
* A failed job is recorded (the first error is re-raised by ``await_termination``) and reported
  in the batch's metrics; later batches still run, as in PySpark.
* Metrics times are wall-clock epoch milliseconds; ``total delay = scheduling + processing``
  (as in Spark), so they stay meaningful with a manual clock.
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

from .clock import Clock
from .graph import DStreamGraph, Job
from .listener import (
    BatchInfo,
    ListenerBus,
    OutputOperationInfo,
    StreamingListenerBatchCompleted,
    StreamingListenerBatchStarted,
    StreamingListenerBatchSubmitted,
    StreamingListenerOutputOperationCompleted,
    StreamingListenerOutputOperationStarted,
    StreamingListenerStreamingStarted,
)
from .time import BatchTime

log = logging.getLogger(__name__)

_ctx_ids = itertools.count(1)


def wall_ms() -> int:
    return int(_time.time() * 1000)


class BatchFailedError(RuntimeError):
    """A batch's output operation failed inside Spark; the message carries the Python traceback.

    ``__cause__`` is the original error (a ``Py4JJavaError`` with the full JVM stack trace).
    """

    def __init__(self, batch_time: BatchTime, operation: str, detail: str) -> None:
        super().__init__(f"batch {batch_time.ms} failed in output operation {operation!r}:\n{detail}")
        self.batch_time = batch_time
        self.operation = operation


def python_traceback_of(error: BaseException) -> str | None:
    """The Python worker's traceback inside a Spark task failure, if ``error`` carries one."""
    text = str(error)
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    end = text.find("\n\tat ", start)
    return text[start:end if end > 0 else None].rstrip()


def user_facing_error(error: BaseException, batch_time: BatchTime, operation: str) -> BaseException:
    """Errors raised in the driver stay as they are; task failures become :class:`BatchFailedError`."""
    tb = python_traceback_of(error) if type(error).__name__ == "Py4JJavaError" else None
    if tb is None:
        return error
    wrapped = BatchFailedError(batch_time, operation, tb)
    wrapped.__cause__ = error
    return wrapped


@dataclass
class Batch:
    time: BatchTime
    jobs: list[Job]
    info: BatchInfo
    error: BaseException | None = None


class JobScheduler:
    """Owns the generator thread, the runner threads and the batch metrics."""

    def __init__(self, graph: DStreamGraph, clock: Clock, bus: ListenerBus, concurrent_batches: int = 1,
                 keep_batch_infos: int = 1000) -> None:
        if concurrent_batches < 1:
            raise ValueError(f"concurrentBatches must be >= 1, got {concurrent_batches}")
        self.graph = graph
        self.clock = clock
        self.bus = bus
        self.concurrent_batches = concurrent_batches
        self.ctx_id = next(_ctx_ids)
        self._stop_generating = threading.Event()
        self._stop_running = threading.Event()
        self._cond = threading.Condition()
        self._queue: deque[Batch] = deque()
        self._running: dict[int, Batch] = {}
        self._pending_times: list[int] = []  # submitted, not completed
        self._completed: set[int] = set()
        self._done_through = -1  # every batch up to this time has completed and been cleaned up
        self.infos: deque[BatchInfo] = deque(maxlen=keep_batch_infos)
        self.last_generated: BatchTime | None = None
        self.last_completed: BatchTime | None = None
        self.start_time: BatchTime | None = None
        self.error: BaseException | None = None
        self.error_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self.on_generate: list[Callable[[BatchTime], None]] = []
        #: Optional journal (master recovery): ``batch_generated(t)`` before a batch runs and
        #: ``batch_completed(t)`` after it; raising there stops this driver (fencing).
        self.journal: Any = None
        #: Optional fault-injection hook (tests): called with a point name.
        self.fault_hook: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def first_batch_time(self) -> BatchTime:
        """The next batch boundary after the clock's current time."""
        batch = self.graph.batch_duration
        assert batch is not None
        return BatchTime((self.clock.time_ms() // batch.ms + 1) * batch.ms)

    def start(self, first_batch: BatchTime | None = None, zero_time: BatchTime | None = None,
              prepare: Callable[[], None] | None = None) -> BatchTime:
        """Initialise the graph at ``zero_time`` and generate from ``first_batch`` on.

        ``prepare`` runs after the graph is initialised and before the first batch is generated
        (a recovering driver restores state there). Batch times before the clock's time are
        generated at once (catching up).
        """
        batch = self.graph.batch_duration
        assert batch is not None
        if first_batch is None:
            first_batch = self.first_batch_time()
        self.start_time = first_batch
        self.graph.start(zero_time if zero_time is not None else first_batch - batch)
        if prepare is not None:
            prepare()
        gen = threading.Thread(target=self._generate_loop, name=f"dstreams-{self.ctx_id}-generator", daemon=True)
        self._threads.append(gen)
        for i in range(self.concurrent_batches):
            t = threading.Thread(target=self._run_loop, name=f"dstreams-{self.ctx_id}-runner-{i}", daemon=True)
            self._threads.append(t)
        for t in self._threads:
            t.start()
        self.bus.post("onStreamingStarted", StreamingListenerStreamingStarted(wall_ms()))
        return first_batch

    def stop(self, graceful: bool, timeout_s: float) -> None:
        """Stop generating; when ``graceful``, first let every queued batch finish (bounded)."""
        self._stop_generating.set()
        threads = list(self._threads)
        if threads:
            threads[0].join(timeout=timeout_s)
        if graceful:
            deadline = _time.monotonic() + timeout_s
            with self._cond:
                while (self._queue or self._running) and _time.monotonic() < deadline:
                    self._cond.wait(0.05)
                if self._queue or self._running:
                    log.warning("graceful stop timed out after %.1f s with batches still pending", timeout_s)
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
        for t in threads[1:]:
            t.join(timeout=timeout_s)

    # ------------------------------------------------------------------ generation
    def _generate_loop(self) -> None:
        batch = self.graph.batch_duration
        assert batch is not None and self.start_time is not None
        t = self.start_time
        while not self._stop_generating.is_set():
            self.clock.wait_till(t.ms, self._stop_generating)
            if self._stop_generating.is_set():
                break
            self.generate_batch(t)
            t = t + batch

    def generate_batch(self, t: BatchTime) -> None:
        started = _time.perf_counter()
        info = BatchInfo(t.ms, wall_ms(), job_group=f"dstreams-{self.ctx_id}-{t.ms}")
        b = Batch(t, [], info)
        try:
            for hook in self.on_generate:
                hook(t)
            b.jobs = self.graph.generate_jobs(t)
        except BaseException as e:  # a user function raising while the graph is built
            log.error("error generating the jobs of batch %s", t, exc_info=True)
            b.error = e
            self._report_error(e)
        if self.journal is not None and b.error is None:
            try:
                self.journal.batch_generated(t)
            except BaseException as e:
                log.error("could not record batch %s in the metadata log: %s", t, e)
                self._fatal(e)
                return
        records = self.graph.input_records(t)
        info.records_per_input = records
        info.num_records = sum(records.values())
        for j in b.jobs:
            info.output_operations[j.output_id] = OutputOperationInfo(t.ms, j.output_id, j.name, j.description)
        self.last_generated = t
        info.generation_ms = (_time.perf_counter() - started) * 1000.0
        with self._cond:
            self._queue.append(b)
            self._pending_times.append(t.ms)
            self._cond.notify_all()
        self.bus.post("onBatchSubmitted", StreamingListenerBatchSubmitted(info))

    # ------------------------------------------------------------------ running
    def _run_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop_running.is_set():
                    self._cond.wait(0.1)
                if self._stop_running.is_set() and not self._queue:
                    return
                b = self._queue.popleft()
                self._running[b.time.ms] = b
            try:
                self._run_batch(b)
            finally:
                with self._cond:
                    self._running.pop(b.time.ms, None)
                    self._cond.notify_all()
                self._batch_done(b)

    def _run_batch(self, b: Batch) -> None:
        info = b.info
        info.processing_start_time_ms = wall_ms()
        self.bus.post("onBatchStarted", StreamingListenerBatchStarted(info))
        sc = self.graph.sc
        try:
            sc.setJobGroup(info.job_group, f"dstreams batch {b.time.ms}", interruptOnCancel=False)
        except Exception:
            log.debug("could not set the job group", exc_info=True)
        for i, job in enumerate(b.jobs):
            if i == 0 and self.fault_hook is not None:
                self.fault_hook("mid-batch")
            op = info.output_operations[job.output_id]
            op.start_time_ms = wall_ms()
            self.bus.post("onOutputOperationStarted", StreamingListenerOutputOperationStarted(op))
            try:
                job.run()
            except BaseException as e:
                if self._stop_running.is_set():
                    log.info("batch %s: %s interrupted by stop()", b.time, job.name)
                    op.failure_reason = "stopped"
                else:
                    log.error("error running %s of batch %s", job.name, b.time, exc_info=True)
                    op.failure_reason = "".join(traceback.format_exception(type(e), e, e.__traceback__))
                    b.error = b.error or e
                    self._report_error(user_facing_error(e, b.time, job.name))
            op.end_time_ms = wall_ms()
            self.bus.post("onOutputOperationCompleted", StreamingListenerOutputOperationCompleted(op))
        info.processing_end_time_ms = wall_ms()

    def _batch_done(self, b: Batch) -> None:
        started = _time.perf_counter()
        self.infos.append(b.info)
        self.bus.post("onBatchCompleted", StreamingListenerBatchCompleted(b.info))
        with self._cond:
            self._completed.add(b.time.ms)
            # Clear only up to the newest batch whose predecessors have all completed.
            ready: list[int] = []
            while self._pending_times and self._pending_times[0] in self._completed:
                t = self._pending_times.pop(0)
                self._completed.discard(t)
                ready.append(t)
        # Bookkeeping first, then wake waiters: whoever waits for batch t sees its cleanup done
        # and its checkpoints started.
        for t in ready:
            if self.journal is not None:
                try:
                    self.journal.batch_completed(BatchTime(t))
                except BaseException as e:
                    log.error("could not record the completion of batch %s: %s", t, e)
                    self._fatal(e)
            try:
                self.graph.clear_metadata(BatchTime(t))
                if self.graph.checkpointer is not None:
                    self.graph.checkpointer.batch_completed(BatchTime(t))
            except Exception:
                log.exception("error clearing metadata at %s", t)
        b.info.cleanup_ms = (_time.perf_counter() - started) * 1000.0
        with self._cond:
            self._done_through = max([self._done_through, *ready]) if ready else self._done_through
            self.last_completed = b.time if self.last_completed is None else max(self.last_completed, b.time)
            self._cond.notify_all()

    def _fatal(self, e: BaseException) -> None:
        """Stop generating batches (e.g. this driver was fenced off) and report ``e``."""
        self._stop_generating.set()
        with self._cond:
            self._queue.clear()
            self._cond.notify_all()
        self._report_error(e)

    def _report_error(self, e: BaseException) -> None:
        if self.error is None:
            self.error = e
        self.error_event.set()

    # ------------------------------------------------------------------ test & benchmark helpers
    def wait_for_batch(self, t: BatchTime, timeout_s: float) -> BatchInfo:
        """Block until batch ``t`` has completed (raises TimeoutError after ``timeout_s``)."""
        deadline = _time.monotonic() + timeout_s
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
                self._cond.wait(min(remaining, 0.1))
