"""Input nodes: the base contract and the in-memory queue source.

Contract of an input node: its slide is the batch duration; ``start()``/``stop()`` bracket the
run; ``compute(time)`` returns the batch's RDD (never None: an empty RDD when nothing arrived);
``records_at(time)`` reports how many records the batch holds when the source knows it cheaply
(None otherwise); ``offsets_at(time)`` describes what went into the batch so that a replay can
rebuild exactly the same RDD (the recovery layer writes it to the metadata log).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from ..node import DStreamNode
from ..time import BatchTime, Duration

if TYPE_CHECKING:
    from ..graph import DStreamGraph


class InputNode(DStreamNode):
    """Base of every source."""

    def __init__(self, graph: DStreamGraph) -> None:
        super().__init__(graph)
        self._records: dict[int, int] = {}
        self._offsets: dict[int, Any] = {}
        #: Offsets of batches to rebuild exactly as before (set when a driver recovers).
        self.replay: dict[int, Any] = {}
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

    #: Whether a batch can be rebuilt from its offsets after a driver failure.
    replayable = True

    def source_state(self) -> Any:
        """What the source must remember across a driver restart (JSON-able), or None."""
        return None

    def restore_source_state(self, state: Any) -> None:
        """Restore what :meth:`source_state` returned before the restart."""

    def records_at(self, time: BatchTime) -> int | None:
        return self._records.get(time.ms)

    def offsets_at(self, time: BatchTime) -> Any:
        return self._offsets.get(time.ms)

    def _report(self, time: BatchTime, records: int | None, offsets: Any = None) -> None:
        if records is not None:
            self._records[time.ms] = records
        if offsets is not None:
            self._offsets[time.ms] = offsets

    def forget_before(self, time: BatchTime) -> None:
        horizon = time.ms - (self.remember_duration.ms if self.remember_duration else 0)
        for d in (self._records, self._offsets):
            for t in [t for t in d if t <= horizon]:
                del d[t]


class QueueInputNode(InputNode):
    replayable = False

    """``queueStream``: one queued RDD per batch (or all queued RDDs at once), else ``default``.

    Same semantics as PySpark: an exhausted queue yields ``default`` when given, else an empty RDD
    with one partition (PySpark's JVM queue stream defaults to ``makeRDD(Seq.empty, 1)``: ``count()``
    of such a batch is ``[0]``). Not replayable after a driver failure (the queue lives in the driver).
    """

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
