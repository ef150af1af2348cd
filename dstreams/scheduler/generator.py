"""Batch generation: the timer, and every change of graph state, on the event loop's one thread (Spark's
``JobGenerator``).

Contract of :class:`JobGenerator`:

* The **timer** thread waits on the injected clock for each batch time ``t = start + k*batch`` and posts
  :class:`~dstreams.events.GenerateJobs` to the event loop (:mod:`dstreams.events`).
* On the event loop's thread, and only there, graph state changes: a batch is generated (input offsets are fixed,
  then one job per output operation: RDD construction only, no Spark action; then the journal records the batch
  before it is queued), completed batches are cleaned up (``clear_metadata``, the journal's completion record,
  checkpoints started, rate control told), committed data checkpoints are adopted (the lineage cut; queued batches
  are rebuilt on it) and a batch that failed for good under ``onFailure=dropInput`` has its input dropped.
* A batch that fails while it is built is tried again as the :class:`~dstreams.scheduler.failure.FailurePolicy`
  says; past that it stops the context with the batch not recorded (a restart builds it again) or drops its input.
* A batch an earlier driver dropped is dropped again when it is replayed.
"""

from __future__ import annotations

import logging
import threading
import time as _time
from collections.abc import Callable
from typing import Any

from ..clock import Clock
from ..contracts import BatchJournal, Checkpointer, OutagePolicy
from ..events import BatchCompleted, BatchDropped, CheckpointCommitted, Event, EventLoop, GenerateJobs
from ..graph import DStreamGraph
from ..listener import BatchInfo, OutputOperationInfo, StreamingListenerBatchSubmitted
from ..time import BatchTime
from .failure import FailurePolicy, describe, last_line
from .tracker import Batch, BatchTracker

log = logging.getLogger("dstreams.scheduler")


def wall_ms() -> int:
    """Wall-clock epoch milliseconds: the metrics' times (meaningful with a manual clock too)."""
    return int(_time.time() * 1000)


class JobGenerator:
    """The timer and the event loop's handlers (module docstring).

    ``ride_out(what, func)`` runs ``func`` waiting out store outages; ``notify(callback, event_type, arg)`` posts to
    the listeners; ``fatal(error)`` stops the context on an error; ``report(error)`` reports an error to
    ``awaitTermination`` without stopping; ``stopping`` is set when generation must stop, ``stopped`` when no batch
    may start any more."""

    def __init__(self, graph: DStreamGraph, clock: Clock, events: EventLoop, checkpointer: Checkpointer,
                 tracker: BatchTracker, policy: FailurePolicy, outage: OutagePolicy, *, ctx_id: int,
                 journal: BatchJournal | None, ride_out: Callable[[str, Callable[[], Any]], Any],
                 notify: Callable[[str, Callable[[Any], Any], Any], None], fatal: Callable[[BaseException], None],
                 report: Callable[[BaseException], None], stopping: threading.Event,
                 stopped: threading.Event) -> None:
        self.graph = graph
        self.clock = clock
        self.events = events
        self.checkpointer = checkpointer
        self.tracker = tracker
        self.policy = policy
        self.outage = outage
        self.ctx_id = ctx_id
        self.journal = journal
        self._ride_out = ride_out
        self._notify = notify
        self._fatal = fatal
        self._report = report
        self._stopping = stopping
        self._stopped = stopped
        # Touched on the event loop's thread only:
        self._pending_times: list[int] = []  # submitted, not completed
        self._completed: set[int] = set()
        self._infos_in_flight: dict[int, BatchInfo] = {}  # queued batches' infos, until they complete
        #: Batches recorded as dropped by an earlier driver (``onFailure=dropInput``) that a restart replays:
        #: they are dropped again, so the state is rebuilt as the first run built it.
        self.replay_dropped: set[int] = set()
        self._unrecordable: set[int] = set()  # batches whose completion must never be recorded
        self.batches_dropped = 0
        self.last_generated: BatchTime | None = None
        self.start_time: BatchTime | None = None
        self._timer: threading.Thread | None = None

    # ------------------------------------------------------------------ the timer
    def start_timer(self, first_batch: BatchTime) -> threading.Thread:
        """Start the timer thread at ``first_batch`` (not started: the caller starts it with the runners)."""
        self.start_time = first_batch
        self._timer = threading.Thread(target=self._timer_loop, name=f"dstreams-{self.ctx_id}-timer", daemon=True)
        return self._timer

    def join_timer(self, timeout_s: float) -> None:
        if self._timer is not None:
            self._timer.join(timeout=timeout_s)

    def _timer_loop(self) -> None:
        batch = self.graph.batch_duration
        assert batch is not None and self.start_time is not None
        t = self.start_time
        while not self._stopping.is_set():
            self.clock.wait_till(t.ms, self._stopping)
            if self._stopping.is_set():
                break
            self.events.post(GenerateJobs(t))
            t = t + batch

    # ------------------------------------------------------------------ the event loop's thread
    def handle(self, event: Event) -> None:
        if isinstance(event, GenerateJobs):
            # Batches due before a graceful stop are still generated; none after a fatal error or a hard stop.
            if self.tracker.fatal_error is None and not self._stopped.is_set():
                self.generate_batch(event.time)
        elif isinstance(event, BatchCompleted):
            self.batch_completed(event.time)
        elif isinstance(event, BatchDropped):
            self.drop(event)
        elif isinstance(event, CheckpointCommitted):
            self.checkpoint_committed(event)
        else:
            raise TypeError(f"unknown event {event!r}")

    def generate_batch(self, t: BatchTime) -> None:
        """Build batch ``t`` and queue it for the runners (on the event loop's thread).

        A failure while building (a source, a driver-side function) is tried again like a failed batch; past that,
        the policy stops generating with the batch not recorded (a restart builds it again), or drops its input
        (see :meth:`drop`). A batch an earlier driver dropped is dropped again when it is replayed.
        """
        started = _time.perf_counter()
        info = BatchInfo(t.ms, wall_ms(), job_group=f"dstreams-{self.ctx_id}-{t.ms}")
        b = Batch(t, [], info)
        replayed_drop = t.ms in self.replay_dropped
        if replayed_drop:
            self.replay_dropped.discard(t.ms)
            b.dropped = info.dropped = True
            self.graph.drop_input(t, [])
            log.warning("batch %s was dropped by an earlier driver (spark.dstreams.batch.onFailure=dropInput): it is "
                        "replayed without its input", t)
        elif not self._build(b):
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
            self._report(b.drop_error)
        records = self.graph.input_records(t)
        info.records_per_input = records
        info.num_records = sum(records.values())
        info.input_metadata = {n.id: m for n in self.graph.inputs if (m := n.metadata_at(t))}
        for j in b.jobs:
            info.output_operations[j.output_id] = OutputOperationInfo(t.ms, j.output_id, j.name, j.description)
        self.last_generated = t
        info.generation_ms = (_time.perf_counter() - started) * 1000.0
        self._pending_times.append(t.ms)
        self._infos_in_flight[t.ms] = info
        if not self.tracker.queue(b):  # stopped, or an earlier batch failed for good, while it was being built
            self._pending_times.remove(t.ms)
            self._infos_in_flight.pop(t.ms, None)
            log.info("batch %s is not queued: %s", t, "the context is stopping" if self.tracker.fatal_error is None
                     else "an earlier batch failed for good")
            return
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
                info.failure = f"building the batch: {last_line(describe(e))}"
                step = self.policy.after(info.attempts, stopping=self._stopping.is_set())
                if step == "retry":
                    delay = self.policy.delay(info.attempts)
                    log.warning("batch %s could not be built (attempt %d of %d): %s; trying again in %.1f s", t,
                                info.attempts, self.policy.max_attempts, info.failure, delay, exc_info=True)
                    if self._stopping.wait(delay):
                        return False  # stopped: not recorded, so a restart builds it again
                    info.attempts += 1
                    continue
                if step == "stop":
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

    def batch_completed(self, time: BatchTime) -> None:
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
        self.tracker.mark_done_through(ready, time)

    def checkpoint_committed(self, event: CheckpointCommitted) -> None:
        """Adopt a committed checkpoint: the node's RDD at its time now reads it (the lineage cut).

        Batches still queued (a backlog) are held back while their jobs are rebuilt on the cut
        lineage (see ``DStreamGraph.rebuild_jobs``), then put back in order; running batches keep
        what they run.
        """
        built: list[int] = []

        def adopt(held: list[Batch]) -> None:
            built.append(event.node.checkpoint_data.adopt(event.time, event.reader))
            self._rebuild_queued(event.node, held)

        self.tracker.holding(adopt)
        self.checkpointer.adopted(event.node, event.time, built[0])
        if self.journal is not None:
            self.journal.checkpoint_committed(event.node.key, event.time.ms)

    def drop(self, event: BatchDropped) -> None:
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
            self.tracker.holding(rebuild)
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
            self._report(event.error)

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
