"""Input nodes: the public input contract and the in-memory queue source.

**The input contract** (what a new source implements; the recovery layer calls nothing else). A
source is a subclass of :class:`InputNode`; its slide is the batch duration.

* ``start()`` / ``stop()`` bracket the run (open connections, take an initial listing, ...).
* ``compute(time) -> RDD`` builds batch ``time``'s RDD (never None: an empty RDD when nothing
  arrived). It first asks :meth:`InputNode.replayed_offsets`: when a restarted driver handed back
  the offsets this batch had before the failure, the batch must be rebuilt from exactly those, so
  that it holds the same records. Otherwise it fixes new offsets (e.g. the files that appeared, a
  partition's ``[from, until)`` range). Either way it calls :meth:`InputNode.report_batch` with the
  number of records (None when unknown) and the offsets, a JSON-able value.
* **Fixing a batch has no effect on the node until the whole batch is fixed** (Structured Streaming's
  offset log; MillWheel's "checkpoint, then acknowledge"). ``compute(time)`` either returns the
  batch's RDD, or raises and leaves the node exactly as it was before the call: it works on local
  copies (the positions it reads from, the files it takes, the queued RDDs, the received lines),
  builds the RDD, and only then, in one step that cannot fail (no I/O, no Spark call), commits them
  (moves its positions, remembers the files as consumed, pops the queue, drops the lines from its
  buffer) and calls :meth:`InputNode.report_batch` last. So when anything fails half-way (a connection
  error on the 2nd of 4 keys, a listing or a write-ahead-log write that fails, a Spark call that
  fails), the scheduler can call ``compute(time)`` again and gets the same batch with the input that
  arrived meanwhile: nothing skipped, nothing taken twice. A replayed batch's recorded offsets stay
  handed out (:meth:`InputNode.replayed_offsets`) until ``report_batch`` for that time, so a replay
  that fails half-way is rebuilt from the same offsets too. What a ``compute`` committed counts once the
  scheduler has recorded the batch (``offsets_at`` and ``node_state`` in the metadata log); a driver that
  cannot record it stops, and its restart starts from the last recorded ``node_state``, so an unrecorded
  commit is never acted on. ``tests/integration/test_source_contract.py`` checks this rule for every source kind.
* The node's checkpoint data (``dstreams.checkpoint_data``, :class:`InputCheckpointData`) is, for an input,
  its offsets and its state: the scheduler has the offsets of every batch written to the metadata log after
  ``compute`` and before the batch runs (its ``batch_record`` is :meth:`InputNode.offsets_at`); a restarted
  driver passes the recorded ones back (its ``replay_records``, which is :meth:`InputNode.replay_from`) before
  generating.
* ``node_state()`` / ``restore_node_state(state)``: what the source must remember across a driver restart
  beyond the offsets of each batch (JSON-able; e.g. the files already consumed); its checkpoint data records the
  one and hands the newest recorded back to the other.
* ``replayable``: whether a batch can be rebuilt from its offsets. A source that cannot replay (a
  socket) writes each block to the write-ahead log (``self.graph.wal``) and records its key.

``compute`` runs on the scheduler's event loop; ``start``/``stop`` on the thread that starts or
stops the context. A source with a background thread (a receiver) hands its data to ``compute``
under its own lock.

**Rate control** (Spark's ``maxRatePerPartition``, ``receiver.maxRate`` and backpressure). A source
that can bound a batch asks, in ``compute`` while it fixes new offsets (not for a replayed batch),
:meth:`InputNode.max_records_per_partition` ``(time, partitions)``: the most records each of its
``partitions`` may put in batch ``time`` (at least 1), or None for no limit. It then takes at most
that many per partition and leaves the rest for later batches, and reports the records it took with
:meth:`InputNode.report_batch` (a count, so that backpressure can use it). The source knows nothing
else: the base class builds the source's :class:`~dstreams.rate.RateLimiter` from the conf on the
first call (the static maximum of :attr:`InputNode.max_rate_setting`, backpressure's switch, initial
rate and PID parameters; see :mod:`dstreams.config`), and the scheduler calls
:meth:`InputNode.batch_completed` on the event loop with the :class:`~dstreams.listener.BatchInfo` of
every batch that completes, which feeds the batch's records of this source and its processing and
scheduling delays to the estimator. The limit of each batch is in its metrics: the batch's
``streamIdToInputInfo()[id].metadata()`` holds ``maxRecordsPerPartition``, ``partitions`` and, when
set, ``maxRatePerPartition`` (the static maximum, records/s per partition) and ``rate`` (backpressure's
rate for the whole source, records/s). A source may add its own entries with ``report_batch(...,
metadata=...)`` (the file sources: ``maxFilesPerBatch``, ``files``, ``filesWaiting``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark import RDD

from .. import config
from ..checkpoint_data import CheckpointData
from ..contracts import InputNotRecordedError, SourceNotCheckpointableError
from ..node import DStreamNode
from ..rate import RateLimiter, RateSettings, rate_settings
from ..time import BatchTime, Duration

if TYPE_CHECKING:
    from ..graph import DStreamGraph
    from ..listener import BatchInfo

log = logging.getLogger(__name__)


class InputNode(DStreamNode):
    """Base of every source (see the module docstring for the contract)."""

    #: Whether a batch can be rebuilt from its offsets after a driver failure.
    replayable = True

    #: The setting of this kind of source's static maximum (records per partition per second).
    max_rate_setting: ClassVar[config.Setting] = config.SOURCE_MAX_RATE_PER_PARTITION

    def __init__(self, graph: DStreamGraph) -> None:
        super().__init__(graph)
        self._records: dict[int, int] = {}
        self._offsets: dict[int, Any] = {}
        self._metadata: dict[int, dict[str, Any]] = {}
        self._replay: dict[int, Any] = {}
        #: Built from the conf on the first :meth:`max_records_per_partition` (tests may set one before).
        self.rate_limiter: RateLimiter | None = None
        self._rate_settings_read = False
        graph.add_input(self)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_fixed_through", None)  # what this run fixed: a restart learns it from the metadata log
        return state

    @property
    def slide_duration(self) -> Duration:
        assert self.graph.batch_duration is not None
        return self.graph.batch_duration

    @property
    def dependencies(self) -> list[DStreamNode]:
        return []

    def start(self) -> None:
        """Called when the context starts (open sockets, list initial files, ...); called again after it raised
        an outage error (:class:`~dstreams.contracts.SourceUnavailableError`, an unavailable store) while the
        scheduler waits the outage out, so a call after a failed one must start over safely."""

    def stop(self) -> None:
        """Called once when the context stops."""

    # ----------------------------------------------------------------- offsets
    def report_batch(self, time: BatchTime, records: int | None, offsets: Any = None,
                     metadata: Mapping[str, Any] | None = None) -> None:
        """Record what batch ``time`` holds: its record count (None: unknown), offsets (JSON-able) and
        entries for its metrics (``StreamInputInfo.metadata()``, next to the rate limit's).

        The last step of ``compute`` (the module docstring's failure rule): from here on the batch is
        fixed, and a replayed batch's recorded offsets are not handed out again."""
        self._replay.pop(time.ms, None)
        if records is not None:
            self._records[time.ms] = records
        if offsets is not None:
            self._offsets[time.ms] = offsets
            self._fixed_through = max(self._fixed_through or 0, time.ms)
        if metadata:
            self._metadata.setdefault(time.ms, {}).update(metadata)

    def metadata_at(self, time: BatchTime) -> dict[str, Any]:
        """The metrics entries of batch ``time`` (its rate limit, what the source reported); empty if none."""
        return dict(self._metadata.get(time.ms, {}))

    def records_at(self, time: BatchTime) -> int | None:
        """Records of batch ``time``, when the source knows it cheaply."""
        return self._records.get(time.ms)

    def offsets_at(self, time: BatchTime) -> Any:
        """The offsets reported for batch ``time`` (what the metadata log records), or None."""
        return self._offsets.get(time.ms)

    # ----------------------------------------------------------------- replay after a driver restart
    def replay_from(self, offsets_by_time: Mapping[int, Any]) -> None:
        """Rebuild the batches at these times (ms) from these recorded offsets (a restarted driver)."""
        self._replay = {int(t): o for t, o in offsets_by_time.items()}
        if self._replay:
            self._fixed_through = max(self._fixed_through or 0, *self._replay)

    #: The newest batch time (ms) this source fixed offsets for, here or in an earlier driver (None: none yet).
    _fixed_through: int | None = None

    def replayed_offsets(self, time: BatchTime) -> Any:
        """The offsets batch ``time`` must be rebuilt from, or None (then fix new ones).

        A batch is fixed once: the offsets an earlier driver recorded for it (handed out until the batch is
        reported by :meth:`report_batch`, so a ``compute`` that fails half-way through a replayed batch gets
        the same offsets when it is called again), else the offsets this node reported for it (a batch built
        again, e.g. after its RDD was forgotten, holds the same input and moves nothing). Raises
        :class:`~dstreams.contracts.InputNotRecordedError` for a batch at or before the newest one fixed (here or
        by an earlier driver) whose offsets are no longer known: fixing new input for it would move the source
        past input that no batch delivers.
        """
        replayed = self._replay.get(time.ms)
        if replayed is None:
            replayed = self._offsets.get(time.ms)
        if replayed is None and self._fixed_through is not None and time.ms <= self._fixed_through:
            raise InputNotRecordedError(
                f"{self.name}: batch {time.ms} is needed again, but its input offsets are no longer known (the "
                f"source has fixed batches up to {self._fixed_through}), so it cannot be rebuilt with the input "
                "it had: fixing new input instead would skip that input for good. Nothing was consumed. "
                "DStream.slice() reaches back only as far as the stream remembers (StreamingContext.remember()); "
                "from a window or a restart this is a defect of the engine: please report it with the driver's "
                "log (the checkpoint location is left as it is)")
        return replayed

    def event_time_watermark(self, time: BatchTime) -> int | None:
        """A low watermark this source declares for event time (ms since the epoch), or None (the default).

        MillWheel's injector watermark: the source promises that the records it puts in batch ``time`` and
        later have no event time below it (e.g. the modification time of the oldest file not yet read).
        An event-time stream downstream caps its watermark for batch ``time`` with it
        (:mod:`dstreams.nodes.event_time`). Asked on the event loop while batch ``time`` is built; the
        answer is recorded in the metadata log (a replayed batch does not ask again).
        """
        return None

    # ----------------------------------------------------------------- what the metadata log records
    @property
    def checkpoint_data(self) -> InputCheckpointData:
        """The input's checkpoint data: its offsets per batch and its :meth:`node_state`."""
        return InputCheckpointData(self)

    def node_state(self) -> Any:
        """What the source must remember across a driver restart beyond its batches' offsets (JSON-able; e.g. the
        files a folder source consumed), or None (the default). Recorded with every batch; the newest one is handed
        back to :meth:`restore_node_state`."""
        return None

    def restore_node_state(self, state: Any) -> None:
        """A restarted driver hands back the newest :meth:`node_state` recorded, before the recorded offsets
        (:meth:`replay_from`). The default does nothing."""

    # ----------------------------------------------------------------- rate control
    def max_records_per_partition(self, time: BatchTime, partitions: int) -> int | None:
        """The most records each of ``partitions`` partitions may hold in batch ``time`` (>= 1), or None
        (unlimited). Asked by a source in ``compute`` while it fixes new offsets; the answer goes into the
        batch's metrics. Asking again for the same batch answers the same (until a batch completes)."""
        limiter = self._limiter()
        if limiter is None:
            return None
        limit = limiter.max_records_per_partition(partitions)
        if limit is not None:
            entries: dict[str, Any] = {"maxRecordsPerPartition": limit, "partitions": partitions}
            if limiter.settings.max_rate_per_partition is not None:
                entries["maxRatePerPartition"] = limiter.settings.max_rate_per_partition
            rate = limiter.rate()
            if rate is not None:
                entries["rate"] = rate
            self._metadata.setdefault(time.ms, {}).update(entries)
        return limit

    def _limiter(self) -> RateLimiter | None:
        if self.rate_limiter is None and not self._rate_settings_read:
            self._rate_settings_read = True
            settings = self.limiter_settings(rate_settings(self.graph.sc.getConf(), self.max_rate_setting))
            if settings is not None:
                self.rate_limiter = RateLimiter(self.slide_duration.ms, settings)
        return self.rate_limiter

    def limiter_settings(self, settings: RateSettings) -> RateSettings | None:
        """The settings of this source's rate limiter, from the conf's (None: no limiter). A source whose unit
        is not the record (a file source) adapts them."""
        return settings if settings.limits else None

    def completed_units(self, info: BatchInfo) -> int | None:
        """What backpressure counts of a completed batch of this source: its records (None: unknown)."""
        return info.records_per_input.get(self.id)

    def batch_completed(self, info: BatchInfo) -> None:
        """Batch ``info.batch_time_ms`` completed (the scheduler calls this on the event loop): with
        backpressure, its records of this source (:meth:`completed_units`) and its delays update the
        estimator. A failed batch, or one whose records or delays are unknown, leaves it as it is."""
        limiter = self.rate_limiter
        if limiter is None or limiter.estimator is None or info.failed:
            return
        records = self.completed_units(info)
        processing, scheduling = info.processing_delay_ms, info.scheduling_delay_ms
        if records is None or processing is None or scheduling is None or info.processing_end_time_ms is None:
            return
        rate = limiter.batch_completed(info.processing_end_time_ms, records, processing, scheduling)
        if rate is not None:
            log.debug("%s: backpressure rate %.1f records/s after batch %d (%d records, processing %d ms, "
                      "scheduling delay %d ms)", self.name, rate, info.batch_time_ms, records, processing, scheduling)

    def forget_before(self, time: BatchTime) -> None:
        horizon = time.ms - (self.remember_duration.ms if self.remember_duration else 0)
        for d in (self._records, self._offsets, self._metadata, self._replay):
            for t in [t for t in d if t <= horizon]:
                del d[t]


class InputCheckpointData(CheckpointData):
    """An input's checkpoint data (``dstreams.checkpoint_data``): the record of a batch is its offsets
    (:meth:`InputNode.offsets_at`), replayed through :meth:`InputNode.replay_from`; the node's state is the source's
    (:meth:`InputNode.node_state`)."""

    node: InputNode

    def batch_record(self, time: BatchTime) -> Any:
        return self.node.offsets_at(time)

    def replay_records(self, records: Mapping[int, Any]) -> None:
        self.node.replay_from(records)

    def node_state(self) -> Any:
        return self.node.node_state()

    def restore_node_state(self, state: Any) -> None:
        self.node.restore_node_state(state)


class QueueInputNode(InputNode):
    """``queueStream``: one queued RDD per batch (or all queued RDDs at once), else ``default``.

    Same semantics as PySpark: an exhausted queue yields ``default`` when given, else an empty RDD
    with one partition (PySpark's JVM queue stream defaults to ``makeRDD(Seq.empty, 1)``: ``count()``
    of such a batch is ``[0]``). Not replayable after a driver failure (the queue lives in the driver).
    """

    replayable = False

    def __getstate__(self) -> dict[str, Any]:
        raise SourceNotCheckpointableError(
            "queueStream holds RDDs that live in this driver only (PySpark refuses to checkpoint it too)")

    def __init__(self, graph: DStreamGraph, rdds: Iterable[RDD], one_at_a_time: bool, default: RDD | None):
        super().__init__(graph)
        self.queue: deque[RDD] = deque(rdds)
        self.one_at_a_time = one_at_a_time
        self.default = default if default is not None else graph.sc.parallelize([], 1)
        self._lock = threading.Lock()

    def compute(self, time: BatchTime) -> RDD | None:
        # The queue is only popped once the batch's RDD is built (the failure rule of the input contract):
        # only this method removes from the queue, so its first ``len(taken)`` RDDs are still ``taken``.
        with self._lock:
            taken = [self.queue[0]] if self.queue and self.one_at_a_time else list(self.queue)
        if not taken:
            return self.default
        rdd = taken[0] if len(taken) == 1 else self.graph.sc.union(taken)
        with self._lock:
            for _ in taken:
                self.queue.popleft()
        return rdd
