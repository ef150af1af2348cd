"""State streams: a chain of hash-partitioned state RDDs merged partition-wise with each batch.

Contract: the state RDD at ``t`` is ``merge(state(t - slide) or initial, prepare(batch(t)))``
where ``prepare`` brings the batch into the state's partitioner (the only shuffle of a batch) and
the merge is narrow: the state itself is never shuffled again. State RDDs are cached and, every
checkpoint interval, checkpointed so that the lineage stays bounded. Subclasses only provide
``prepare`` and ``merge_function(time)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark import RDD, StorageLevel
from pyspark.core.rdd import Partitioner

from ..dead_letters import for_batch
from ..node import DStreamNode, OneParentNode
from ..spark import jvm
from ..spark.partitioned import (
    ensure_partitioned,
    fold,
    merge_ordered,
    pre_combine,
    pre_group_ordered,
    segmented_merge,
    shuffle_ordered,
)
from ..time import BatchTime, Duration

if TYPE_CHECKING:
    from ..graph import DStreamGraph

Merge = Callable[[list[list[Any]]], Iterable[Any]]


def running_reduce_merge(func: Callable[[Any, Any], Any]) -> Merge:
    """``runningReduce``'s merge of a state partition (segment 0) with the batch's pre-combined pairs (segment 1):
    the batch reduced on its own first, then merged into the state (the association of a per-batch
    ``reduceByKey`` followed by the state's update)."""

    def merge(segments: list[list[Any]]) -> Iterable[Any]:
        state = dict(segments[0])
        batch = fold(func, segments[1], {}, "runningReduce")
        fold(func, batch.items(), state, "runningReduce")
        return state.items()

    return merge


def keep_idle(update: Callable[[list[Any], Any], Any]) -> Callable[[list[Any], Any], Any]:
    """``updateStateByKey(..., updateIdleKeys=False)`` on the RDD state: a key without new values keeps its state."""

    def wrapped(values: list[Any], state: Any) -> Any:
        return state if not values and state is not None else update(values, state)

    return wrapped


def update_state_merge(update: Callable[[list[Any], Any], Any]) -> Merge:
    """``updateStateByKey``'s merge of a state partition (segment 0) with the batch's records of
    :func:`shuffle_ordered` (segment 1, grouped here by :func:`merge_ordered`): ``update`` runs for every key with
    a state or new values (``[]`` for a key without)."""

    def merge(segments: list[list[Any]]) -> Iterable[Any]:
        state = dict(segments[0])
        new = dict(merge_ordered(segments[1]))
        out = []
        for k, s in state.items():
            r = update(new.pop(k, []), s)
            if r is not None:
                out.append((k, r))
        for k, vs in new.items():
            r = update(vs, None)
            if r is not None:
                out.append((k, r))
        return out

    return merge


class StateNode(OneParentNode):
    """Base of the per-key state operators."""

    must_checkpoint = True
    #: Merge at every batch, also one without a batch RDD, once there is a state (event-time operators and
    #: timers: the watermark or the batch time alone may change the state).
    merges_every_batch: ClassVar[bool] = False

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, partitioner: Partitioner,
                 initial: RDD | None = None, label: str = "state") -> None:
        super().__init__(graph, parent)
        self.partitioner = partitioner
        self.initial = ensure_partitioned(initial, partitioner) if initial is not None else None
        #: The initial state's records when restored from a checkpointed graph (an RDD is not stored).
        self._initial_records: list[Any] | None = None
        self.label = label
        self.persist(StorageLevel.MEMORY_ONLY)

    @property
    def checkpoint_partitioner(self) -> Partitioner:
        return self.partitioner

    def describe_params(self) -> list[str]:
        return [f"partitions={self.partitioner.numPartitions}"]

    def __getstate__(self) -> dict[str, Any]:
        """The initial state RDD is stored as its records (collected once, when the graph is checkpointed)."""
        state = super().__getstate__()
        if self.initial is not None:
            state["_initial_records"] = self.initial.collect()
            state["initial"] = None
        return state

    def initial_state(self) -> RDD | None:
        """The state before the first batch (the initial RDD, or None)."""
        return self._initial_rdd()

    def _initial_rdd(self) -> RDD | None:
        if self.initial is None and self._initial_records is not None:
            self.initial = ensure_partitioned(self.graph.sc.parallelize(self._initial_records), self.partitioner)
            self._initial_records = None
        return self.initial

    def prepare(self, batch: RDD) -> RDD:
        raise NotImplementedError

    def merge_function(self, time: BatchTime) -> Merge:
        raise NotImplementedError

    def compute(self, time: BatchTime) -> RDD | None:
        previous = self.get_or_compute(time - self.slide_duration)
        if previous is None:
            previous = self._initial_rdd()
        batch = self.parent.get_or_compute(time)
        if batch is None and (previous is None or not self.merges_every_batch):
            return previous
        groups = [[previous] if previous is not None else [], [self.prepare(batch)] if batch is not None else []]
        return segmented_merge(self.graph.sc, groups, self.partitioner, self.merge_function(time))


class RunningReduceNode(StateNode):
    """``runningReduce(f)``: per key, the reduce of every value seen so far."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 partitioner: Partitioner) -> None:
        super().__init__(graph, parent, partitioner, label="runningReduce")
        self.func = func

    def compute(self, time: BatchTime) -> RDD | None:
        """As every state stream, except that a batch with no partition at all (an empty folder listing, an
        exhausted queue) leaves the state as it was: the previous batch's RDD is this batch's too, with no
        Spark stage, so a run of empty intervals (a catch-up after a downtime) costs only its outputs."""
        batch = self.parent.get_or_compute(time)
        if batch is not None and jvm.has_no_partitions(batch):
            previous = self.get_or_compute(time - self.slide_duration)
            if previous is None:
                previous = self._initial_rdd()
            if previous is not None:
                return previous
        return super().compute(time)

    def prepare(self, batch: RDD) -> RDD:
        """The batch's combined pairs in the state's partitioner, not merged (:func:`pre_combine`): the merge
        reduces them, so the batch needs no Python stage of its own after the shuffle."""
        return pre_combine(batch, self.func, self.partitioner, "runningReduce")

    def merge_function(self, time: BatchTime) -> Merge:
        return running_reduce_merge(self.func)


class UpdateStateNode(StateNode):
    """``updateStateByKey(updateFunc)``: ``updateFunc(newValues, lastState)``; None drops the key.

    As in PySpark, ``updateFunc`` runs for every key that has a state or new values (a key with a
    state and no new values gets ``[]``). ``newValues`` keeps the input order of the batch.
    """

    def __init__(self, graph: DStreamGraph, parent: DStreamNode,
                 update: Callable[[list[Any], Any], Any], partitioner: Partitioner,
                 initial: RDD | None) -> None:
        super().__init__(graph, parent, partitioner, initial, label="updateStateByKey")
        self.update = update

    def prepare(self, batch: RDD) -> RDD:
        return shuffle_ordered(batch, self.partitioner, "updateStateByKey")  # merged by update_state_merge

    def merge_function(self, time: BatchTime) -> Merge:
        return update_state_merge(for_batch(self.update, time.ms))


class TrackNode(StateNode):
    """``track(init, update, timeout)``: the paper's state tracking.

    For each (key, event) of a batch, in input order: a key without state gets
    ``init(key, event)``; a key with state gets ``update(key, state, event)``. A None result drops
    the key's state. A key that receives no event for ``timeout`` (measured between batch times)
    is dropped. Records of this node are ``(key, (state, last_event_time_ms))``; the public stream
    maps them to ``(key, state)``.
    """

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, init: Callable[[Any, Any], Any],
                 update: Callable[[Any, Any, Any], Any], timeout: Duration,
                 partitioner: Partitioner) -> None:
        super().__init__(graph, parent, partitioner, label="track")
        self.init = init
        self.update = update
        self.timeout = timeout

    def describe_params(self) -> list[str]:
        return [f"timeout={self.timeout.ms}", *super().describe_params()]

    def prepare(self, batch: RDD) -> RDD:
        return pre_group_ordered(batch, self.partitioner, "track")

    def merge_function(self, time: BatchTime) -> Merge:
        return track_merge(self.init, self.update, time.ms, self.timeout.ms)


def track_merge(init: Callable[[Any, Any], Any], update: Callable[[Any, Any, Any], Any], now: int,
                timeout: int) -> Merge:
    """:class:`TrackNode`'s merge of a state partition (``(key, (state, last_event_ms))``) with the batch at
    ``now`` ms (``(key, [events])``, in input order)."""

    def merge(segments: list[list[Any]]) -> Iterable[Any]:
        state = dict(segments[0])
        out = []
        for k, events in segments[1]:
            entry = state.pop(k, None)
            s = entry[0] if entry is not None else None
            for ev in events:
                s = init(k, ev) if s is None else update(k, s, ev)
            if s is not None:
                out.append((k, (s, now)))
        for k, entry in state.items():
            if now - entry[1] < timeout:
                out.append((k, entry))
        return out

    return merge
