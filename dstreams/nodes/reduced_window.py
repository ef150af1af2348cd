"""``reduceByKeyAndWindow`` as its own operator, with or without an inverse function.

Contract: the parent is the per-batch combined stream (one RDD per batch, hash-partitioned and
cached; :func:`dstreams.spark.partitioned.pre_combine`: a key once per map partition, not yet merged, so the
batch costs no Python stage after its shuffle). The window at ``t`` holds, per key, the reduce of the
parent's values over ``(t - window, t]``; each batch is reduced on its own first (one segment per batch
in the merge), then the batches are combined, oldest first.

* With an inverse function (and, as in Spark, a window of at least 5 slides) the window is a keyed state updated
  incrementally (:class:`IncrementalWindow`, on any state backend): previous window, minus (``invFunc``) the
  reduce of the batches that left, plus (``func``) the reduce of the batches that entered. One narrow merge: its
  cost depends on the state and the slide, not on the window's length.
* Otherwise (:class:`ReducedWindowNode`) the window is the partition-wise reduce of the cached per-batch reductions
  (no shuffle).

``filterFunc`` (optional) keeps only the pairs it accepts; use it to drop keys whose value has
fallen back to the neutral element. Reductions are applied oldest batch first, so order-sensitive
functions (``groupByKeyAndWindow``'s list concatenation) see values in time order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.core.rdd import Partitioner

from ..checkpoint_data import CheckpointData
from ..node import DStreamNode
from ..spark import jvm
from ..spark.partitioned import fold, segmented_merge
from ..time import BatchTime, Duration
from .keyed import KeyedOp, KeyStep
from .windowed import WindowedNode

if TYPE_CHECKING:
    from ..graph import DStreamGraph


def reduce_segments(func: Callable[[Any, Any], Any], segments: Iterable[list[Any]]) -> dict[Any, Any]:
    """Each segment (one batch's combined pairs, a key once per map partition) reduced on its own, then
    the segments' results folded in order: the association of the per-batch reduce, then of the window."""
    acc: dict[Any, Any] = {}
    for seg in segments:
        fold(func, fold(func, seg, {}, "reduceByKeyAndWindow").items(), acc)
    return acc


class IncrementalWindow(KeyedOp):
    """``reduceByKeyAndWindow(func, invFunc, window, slide, ..., filterFunc)`` updated incrementally as a keyed state
    (on the executor store, or picked by size; :class:`ReducedWindowNode` is the RDD window). The parent is the
    per-batch combined stream. Per key, the reduce of the window ending at the state's batch; a slide's values for a
    key are the reduces of the batches that left the window and of those that entered it (each batch reduced on its
    own first, oldest first: :func:`reduce_segments`), and its step ``invFunc(value, left)``, then ``func(value,
    entered)`` (``entered`` for a new key); ``filterFunc`` drops a key it refuses. The state starts empty: before the
    window is full no batch has left it, so that equals the first window's reduce."""

    kind, label = "WindowNode", "reduceByKeyAndWindow"

    def __init__(self, func: Callable[[Any, Any], Any], inv_func: Callable[[Any, Any], Any], window: Duration,
                 slide: Duration, filter_func: Callable[[Any], bool] | None) -> None:
        self.func, self.inv_func, self.filter_func = func, inv_func, filter_func
        self.parent_window, self.state_slide = window, slide

    def params(self) -> list[str]:
        assert self.parent_window is not None
        return [f"window={self.parent_window.ms}", "inverse"]

    def _slices(self, node: Any, time: BatchTime) -> tuple[list[RDD], list[RDD]]:
        """The parent's batches that leave the window at ``time`` and those that enter it."""
        assert self.parent_window is not None and self.state_slide is not None
        parent, slide = node.parent, self.state_slide
        pslide, begin = parent.slide_duration, time - self.parent_window
        return parent.slice(begin - slide + pslide, begin), parent.slice(time - slide + pslide, time)

    def batches(self, node: Any, time: BatchTime, skip_empty: bool = False) -> list[RDD] | None:
        old, new = self._slices(node, time)
        return [*old, *new] if old or new else None

    def grouper(self, node: Any, time: BatchTime) -> Callable[[list[list[Any]]], dict[Any, Any]]:
        """Per key, ``(left, entered)``: each a 1-tuple holding the reduce of the batches that left (entered) the
        window, or ``()`` (no sentinel object: the step runs in another process than the one that built it)."""
        leaving, func = len(self._slices(node, time)[0]), self.func

        def group(segments: list[list[Any]]) -> dict[Any, Any]:
            left, entered = reduce_segments(func, segments[:leaving]), reduce_segments(func, segments[leaving:])
            return {k: ((left[k],) if k in left else (), (entered[k],) if k in entered else ())
                    for k in (*left, *entered)}

        return group

    def step(self, node: Any, time: BatchTime) -> KeyStep:
        """``(key, (value,) or None, (left, entered)) -> (value,) or None``: the window's value boxed, as a window
        may reduce to None."""
        func, inv, keep = self.func, self.inv_func, self.filter_func

        def step(k: Any, entry: Any, values: tuple[tuple[Any, ...], tuple[Any, ...]]) -> Any:
            left, entered = values
            if entry is not None:
                value = entry[0]
                if left:
                    value = inv(value, left[0])
                if entered:
                    value = func(value, entered[0])
            elif entered:
                value = entered[0]
            else:
                return None  # left a window it was not in (filtered out earlier)
            return (value,) if keep is None or keep((k, value)) else None

        return step

    def apply(self, step: KeyStep, entries: dict[Any, Any], batch: dict[Any, Any], keys: Iterable[Any]) -> None:
        """The step on boxed values (the state holds them unboxed)."""
        for k in keys:
            new = step(k, (entries[k],) if k in entries else None, batch[k])
            if new is None:
                entries.pop(k, None)
            else:
                entries[k] = new[0]


class ReducedWindowNode(WindowedNode):
    """``reduceByKeyAndWindow`` without a keyed state (module docstring): the window of :class:`WindowedNode` reduced
    per key, in ``partitioner``."""

    label = "reduceByKeyAndWindow"

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 inv_func: Callable[[Any, Any], Any] | None, window: Duration, slide: Duration,
                 partitioner: Partitioner, filter_func: Callable[[Any], bool] | None) -> None:
        super().__init__(graph, parent, window, slide)
        self.func, self.inv_func, self.partitioner, self.filter_func = func, inv_func, partitioner, filter_func
        #: With an inverse function the window's RDD at ``t`` builds on the one at ``t - slide``: a state chain,
        #: checkpointed and cached as a state's (a second copy off ``local[N]``: ``spark.dstreams.state.replicas``);
        #: without one each window is reduced from its batches again, and one copy is enough.
        self.must_checkpoint = inv_func is not None
        self.persist(jvm.state_level(str(graph.sc.master), graph.sc.getConf()) if self.must_checkpoint
                     else StorageLevel.MEMORY_ONLY)

    @property
    def checkpoint_data(self) -> CheckpointData:
        return CheckpointData(self, self.partitioner)

    def describe_params(self) -> list[str]:
        inverse = ["inverse"] if self.inv_func is not None else []
        return [*super().describe_params(), f"partitions={self.partitioner.numPartitions}", *inverse]

    def compute(self, time: BatchTime) -> RDD | None:
        """The reduce of the cached per-batch reductions in the window, partition-wise (no shuffle)."""
        current = self.parent.slice(time - self.window + self.parent.slide_duration, time)
        if not current:
            return None if self.inv_func is not None else self.graph.sc.emptyRDD()
        func, keep = self.func, self.filter_func

        def reduce_all(segments: list[list[Any]]) -> Iterable[Any]:
            acc = reduce_segments(func, segments)
            return acc.items() if keep is None else [kv for kv in acc.items() if keep(kv)]

        # One segment per batch: each batch is reduced on its own before the batches are combined.
        return segmented_merge(self.graph.sc, [[r] for r in current], self.partitioner, reduce_all)
