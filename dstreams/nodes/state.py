"""The per-key operators ``runningReduce`` and ``updateStateByKey`` (:class:`~.keyed.KeyedOp`), and the RDD state.

The RDD state (:class:`StateNode`, :func:`rdd_state`): a chain of hash-partitioned state RDDs, the one at ``t``
the partition-wise merge of the one at ``t - slide`` (or the initial state) with the batch brought into the state's
partitioner by the operator's ``prepare`` (the only shuffle of a batch): the state itself is never shuffled again.
State RDDs are cached and, every checkpoint interval, checkpointed so that the lineage stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.core.rdd import Partitioner

from ..dead_letters import for_batch
from ..node import DStreamNode
from ..spark.partitioned import (
    ensure_partitioned,
    fold,
    merge_ordered,
    pre_combine,
    segmented_merge,
    shuffle_ordered,
)
from ..time import BatchTime
from .keyed import ALL, TOUCHED, KeyedNode, KeyedOp, KeyStep, rdd_partition

if TYPE_CHECKING:
    from ..graph import DStreamGraph

class RunningReduce(KeyedOp):
    """``runningReduce(f)``: per key, the reduce of every value seen so far. The batch is reduced on its own first,
    then merged into the state (the association of a per-batch ``reduceByKey`` followed by the state's update)."""

    kind, label = "RunningReduceNode", "runningReduce"

    def __init__(self, func: Callable[[Any, Any], Any]) -> None:
        self.func = func

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        """The batch's combined pairs, not merged (:func:`pre_combine`): :meth:`group` reduces them, so the batch
        needs no Python stage of its own after the shuffle."""
        return pre_combine(batch, self.func, partitioner, "runningReduce")

    def group(self, segments: list[list[Any]]) -> dict[Any, Any]:
        return fold(self.func, segments[0], {}, "runningReduce") if segments else {}

    def step(self, node: DStreamNode, time: BatchTime) -> KeyStep:
        func = self.func
        return lambda k, entry, v: v if entry is None else func(entry, v)

    def apply(self, step: KeyStep, entries: dict[Any, Any], batch: dict[Any, Any], keys: Iterable[Any]) -> None:
        """The step in bulk (:func:`fold`'s fast paths; a state of None is a state here)."""
        fold(self.func, batch.items(), entries, "runningReduce")


class UpdateState(KeyedOp):
    """``updateStateByKey(updateFunc)``: ``updateFunc(newValues, lastState)``, None drops the key; ``newValues`` in
    the batch's input order. With ``update_idle_keys`` (PySpark's rule) it runs for every key of the state each batch
    (``[]`` for a key without values); without, only for the keys with values, the others keeping their state."""

    kind, label = "UpdateStateNode", "updateStateByKey"

    def __init__(self, update: Callable[[list[Any], Any], Any], update_idle_keys: bool) -> None:
        self.update = update
        self.update_idle_keys = update_idle_keys
        self.visits = ALL if update_idle_keys else TOUCHED

    def params(self) -> list[str]:
        return [f"updateIdleKeys={self.update_idle_keys}"]

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        return shuffle_ordered(batch, partitioner, "updateStateByKey")  # grouped by merge_ordered

    def group(self, segments: list[list[Any]]) -> dict[Any, Any]:
        return dict(merge_ordered(segments[0])) if segments else {}

    def step(self, node: DStreamNode, time: BatchTime) -> KeyStep:
        update = for_batch(self.update, time.ms)
        return lambda k, state, values: update(values if values is not None else [], state)


def rdd_state(node: Any, time: BatchTime, previous: RDD | None,
              report: Callable[[int, list[list[Any]], list[Any]], None] | None = None) -> RDD | None:
    """The RDD state of ``node`` (its ``op``, ``parent`` and ``partitioner``) at ``time``: ``previous`` (None: no
    state yet) merged partition-wise with the batch's prepared records by :func:`rdd_partition`; ``previous`` itself
    when the batch applies nothing (none, or without partitions for a :data:`TOUCHED` operator). ``report(partition,
    segments, out)`` sees each partition's work (the auto policy's counts)."""
    op: KeyedOp = node.op
    batches = op.batches(node, time, skip_empty=previous is not None)
    if batches is None or (previous is None and not batches):
        return previous
    step, group = op.step(node, time), op.grouper(node, time)

    def merge(i: int, segments: list[list[Any]]) -> Iterable[Any]:
        out = rdd_partition(op, step, segments[0], segments[1:], group)
        if report is not None:
            report(i, segments, out)
        return out

    groups = [[previous] if previous is not None else [], *([b] for b in batches)]
    return segmented_merge(node.graph.sc, groups, node.partitioner, merge, with_index=True)


class StateNode(KeyedNode):
    """The RDD state of the operator ``op`` (module docstring): its step applied by :func:`rdd_state`."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, op: KeyedOp, partitioner: Partitioner,
                 initial: RDD | None = None) -> None:
        super().__init__(graph, parent, op, partitioner)
        self.initial = ensure_partitioned(initial, partitioner) if initial is not None else None
        #: The initial state's records when restored from a checkpointed graph (an RDD is not stored).
        self._initial_records: list[Any] | None = None
        self.persist(StorageLevel.MEMORY_ONLY)

    def __getstate__(self) -> dict[str, Any]:
        """The initial state RDD is stored as its records (collected once, when the graph is checkpointed)."""
        state = super().__getstate__()
        if self.initial is not None:
            state["_initial_records"] = self.initial.collect()
            state["initial"] = None
        return state

    def initial_state(self) -> RDD | None:
        """The state before the first batch (the initial RDD, or None)."""
        if self.initial is None and self._initial_records is not None:
            self.initial = ensure_partitioned(self.graph.sc.parallelize(self._initial_records), self.partitioner)
            self._initial_records = None
        return self.initial

    def compute(self, time: BatchTime) -> RDD | None:
        previous = self.get_or_compute(time - self.slide_duration)
        return rdd_state(self, time, previous if previous is not None else self.initial_state())
