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
* The scheduler has the offsets of every batch written to the metadata log after ``compute`` and
  before the batch runs (``offsets_at``); a restarted driver passes the recorded ones back through
  :meth:`InputNode.replay_from` before generating.
* ``source_state()`` / ``restore_source_state(state)``: what the source must remember across a
  driver restart beyond the offsets of each batch (JSON-able; e.g. the files already consumed).
* ``replayable``: whether a batch can be rebuilt from its offsets. A source that cannot replay (a
  socket) writes each block to the write-ahead log (``self.graph.wal``) and records its key.

``compute`` runs on the scheduler's event loop; ``start``/``stop`` on the thread that starts or
stops the context. A source with a background thread (a receiver) hands its data to ``compute``
under its own lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from ..contracts import SourceNotCheckpointableError
from ..node import DStreamNode
from ..time import BatchTime, Duration

if TYPE_CHECKING:
    from ..graph import DStreamGraph


class InputNode(DStreamNode):
    """Base of every source (see the module docstring for the contract)."""

    #: Whether a batch can be rebuilt from its offsets after a driver failure.
    replayable = True

    def __init__(self, graph: DStreamGraph) -> None:
        super().__init__(graph)
        self._records: dict[int, int] = {}
        self._offsets: dict[int, Any] = {}
        self._replay: dict[int, Any] = {}
        graph.add_input(self)

    @property
    def slide_duration(self) -> Duration:
        assert self.graph.batch_duration is not None
        return self.graph.batch_duration

    @property
    def dependencies(self) -> list[DStreamNode]:
        return []

    def start(self) -> None:
        """Called once when the context starts (open sockets, list initial files, ...)."""

    def stop(self) -> None:
        """Called once when the context stops."""

    # ----------------------------------------------------------------- offsets
    def report_batch(self, time: BatchTime, records: int | None, offsets: Any = None) -> None:
        """Record what batch ``time`` holds: its record count (None: unknown) and offsets (JSON-able)."""
        if records is not None:
            self._records[time.ms] = records
        if offsets is not None:
            self._offsets[time.ms] = offsets

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

    def replayed_offsets(self, time: BatchTime) -> Any:
        """The recorded offsets batch ``time`` must be rebuilt from, or None (then fix new ones).

        Each recorded batch is handed out once.
        """
        return self._replay.pop(time.ms, None)

    def source_state(self) -> Any:
        """What the source must remember across a driver restart (JSON-able), or None."""
        return None

    def restore_source_state(self, state: Any) -> None:
        """Restore what :meth:`source_state` returned before the restart."""

    def forget_before(self, time: BatchTime) -> None:
        horizon = time.ms - (self.remember_duration.ms if self.remember_duration else 0)
        for d in (self._records, self._offsets):
            for t in [t for t in d if t <= horizon]:
                del d[t]


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
        with self._lock:
            if self.queue and self.one_at_a_time:
                taken = [self.queue.popleft()]
            else:
                taken = list(self.queue)
                self.queue.clear()
        if taken:
            return taken[0] if len(taken) == 1 else self.graph.sc.union(taken)
        return self.default
