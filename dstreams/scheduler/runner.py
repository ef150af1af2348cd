"""Batch running: the runner threads (Spark's ``JobScheduler`` job executor).

Contract of :class:`BatchRunner`:

* The runners execute batches in submission order with at most ``concurrent_batches`` in flight (timestep
  pipelining); a batch's output jobs run in registration order. Each batch runs under its own Spark job group
  (``dstreams-<ctx>-<batch ms>``), so its Spark jobs can be found (stage counts in tests) and cancelled.
* A failed output job is retried with the batch as the :class:`~dstreams.scheduler.failure.FailurePolicy` says (a
  try starts at the first job that has not run to its end in this driver); past its last try the batch stops the
  context not done, or is marked dropped (``dropInput``: the generator drops its input on the event loop).
* A stop that cuts the batch (cancels a job, or comes between two jobs or during a wait) leaves it not done, and
  no later job of it starts. A store outage past the outage bound stops the context with the batch not done.
* When a batch ends, the runner keeps its metrics, tells the listeners, and posts
  :class:`~dstreams.events.BatchDropped` (when dropped) and :class:`~dstreams.events.BatchCompleted` (unless not
  done) to the event loop.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .. import faults, output_records
from ..contracts import FaultHook, OutagePolicy
from ..events import BatchCompleted, BatchDropped, EventLoop
from ..graph import DStreamGraph, Job
from ..listener import (
    StreamingListenerBatchCompleted,
    StreamingListenerBatchStarted,
    StreamingListenerOutputOperationCompleted,
    StreamingListenerOutputOperationStarted,
)
from ..time import BatchTime
from .failure import FailurePolicy, describe, last_line, user_facing_error
from .generator import wall_ms
from .tracker import Batch, BatchTracker

log = logging.getLogger("dstreams.scheduler")


@runtime_checkable
class RetryAware(Protocol):
    """A node that drops what made a batch's try fail before the batch is tried again (a store-backed state: its
    cached handles, so that the retry rebuilds them through lineage)."""

    def before_batch_retry(self, time: BatchTime, error: BaseException) -> None:
        """Called before a failed batch ``time`` is tried again, with the try's error."""


@runtime_checkable
class EventTimeReporting(Protocol):
    """An event-time stream: what a batch saw of its event time, for ``BatchInfo.event_time``."""

    def event_time_metrics(self, time: BatchTime) -> dict[str, Any] | None:
        """What batch ``time`` saw (None: nothing yet). Reads only: called on a runner thread."""


class BatchRunner:
    """The runner threads (module docstring); the callbacks are the :class:`JobScheduler`'s."""

    def __init__(self, graph: DStreamGraph, events: EventLoop, tracker: BatchTracker, policy: FailurePolicy,
                 outage: OutagePolicy, *, ctx_id: int, concurrent_batches: int, fault_hook: FaultHook,
                 ride_out: Callable[[str, Callable[[], Any]], Any],
                 notify: Callable[[str, Callable[[Any], Any], Any], None], fatal: Callable[[BaseException], None],
                 stopped: threading.Event) -> None:
        if concurrent_batches < 1:
            raise ValueError(f"concurrentBatches must be >= 1, got {concurrent_batches}")
        self.graph = graph
        self.events = events
        self.tracker = tracker
        self.policy = policy
        self.outage = outage
        self.ctx_id = ctx_id
        self.concurrent_batches = concurrent_batches
        self.fault_hook = fault_hook
        self._ride_out = ride_out
        self._notify = notify
        self._fatal = fatal
        self._stopped = stopped
        self._threads: list[threading.Thread] = []

    def threads(self) -> list[threading.Thread]:
        """The runner threads (made here, started by the caller with the timer)."""
        self._threads = [threading.Thread(target=self._run_loop, name=f"dstreams-{self.ctx_id}-runner-{i}",
                                          daemon=True) for i in range(self.concurrent_batches)]
        return self._threads

    def join(self, timeout_s: float) -> None:
        for t in self._threads:
            t.join(timeout=timeout_s)

    def cancel(self, running: list[Batch]) -> None:
        """Cancel the Spark jobs of ``running`` (a hard stop)."""
        sc = self.graph.sc
        for b in running:
            try:
                sc.cancelJobGroup(b.info.job_group)
            except Exception:  # the SparkContext may be stopping
                pass

    def _run_loop(self) -> None:
        while True:
            b = self.tracker.take()
            if b is None:
                return
            try:
                self._run_batch(b)
            finally:
                self.tracker.record_info(b.info)  # wait_for_batch reads the infos
                self._notify("onBatchCompleted", StreamingListenerBatchCompleted, b.info)
                if b.dropped and not b.incomplete and b.jobs:
                    self.events.post(BatchDropped(b.time, b.info.failure or "failed", b.drop_error))
                if not b.incomplete:
                    # Posted while the batch still counts as running: a graceful stop, which waits for the
                    # running batches and then for the event loop, records its completion (posted after, the
                    # event could reach a stopped loop and the restart would run the batch again).
                    self.events.post(BatchCompleted(b.time))
                self.tracker.finished(b)

    def _run_batch(self, b: Batch) -> None:
        """Run ``b``'s output jobs in order, trying the batch again after a failure (module docstring)."""
        info = b.info
        info.processing_start_time_ms = wall_ms()
        self._notify("onBatchStarted", StreamingListenerBatchStarted, info)
        sc = self.graph.sc
        try:
            sc.setJobGroup(info.job_group, f"dstreams batch {b.time.ms}", interruptOnCancel=False)
            faults.carry(sc)  # a test's task-side faults, to this batch's tasks
        except Exception:
            log.debug("could not set the job group", exc_info=True)
        while True:
            failed = self._run_jobs(b)
            if failed is None:
                break
            job, error = failed
            if self.policy.after(info.attempts) != "retry":
                self._failed_for_good(b, job, error)
                break
            delay = self.policy.delay(info.attempts)
            log.warning("batch %s: %s failed (attempt %d of %d): %s; trying the batch again in %.1f s", b.time,
                        job.name, info.attempts, self.policy.max_attempts, info.failure, delay)
            if self._stopped.wait(delay):
                b.incomplete = True  # a stop came while it waited: a restart runs it again
                break
            for node in self.graph.nodes:
                if isinstance(node, RetryAware):
                    node.before_batch_retry(b.time, error)
            info.attempts += 1
        info.event_time = {n.id: m for n in self.graph.nodes  # reads only (event-time streams)
                           if isinstance(n, EventTimeReporting) and (m := n.event_time_metrics(b.time)) is not None}
        info.processing_end_time_ms = wall_ms()

    def _run_jobs(self, b: Batch) -> tuple[Job, BaseException] | None:
        """One try of ``b``: its jobs from ``b.jobs_done`` on, in order, until one fails (returned with its
        error; None when every job ran, or when a stop or a store outage ended the batch)."""
        info = b.info
        for job in b.jobs[b.jobs_done:]:
            if self._stopped.is_set():
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
                if self._stopped.is_set():
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
                info.failure = f"{job.name}: {last_line(describe(e))}"
                log.error("error running %s of batch %s (attempt %d of %d)", job.name, b.time, info.attempts,
                          self.policy.max_attempts, exc_info=True)
                return job, e
            op.end_time_ms = wall_ms()
            self._notify("onOutputOperationCompleted", StreamingListenerOutputOperationCompleted, op)
            b.jobs_done += 1
        return None

    def _failed_for_good(self, b: Batch, job: Job, error: BaseException) -> None:
        """``b`` had its last try: stop with it not done, or (``dropInput``) mark it dropped."""
        wrapped = user_facing_error(error, b.time, job.name)
        if self.policy.after(b.info.attempts) == "drop":
            log.error("batch %s failed %d time(s) in %s: its input is dropped and the stream goes on "
                      "(spark.dstreams.batch.onFailure=dropInput)", b.time, b.info.attempts, job.name)
            b.dropped = b.info.dropped = True
            b.drop_error = wrapped  # reported once the drop is recorded (see JobGenerator.drop)
            return
        log.error("batch %s failed %d time(s) in %s: the context stops with the batch not done; a restart with "
                  "getOrCreate runs it again", b.time, b.info.attempts, job.name)
        b.incomplete = True
        self._fatal(wrapped)
