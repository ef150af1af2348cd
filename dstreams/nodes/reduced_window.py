"""``reduceByKeyAndWindow`` as its own operator, with or without an inverse function.

Contract: the parent is the per-batch combined stream (one RDD per batch, hash-partitioned and
cached; :func:`dstreams.spark.partitioned.pre_combine`: a key once per map partition, not yet merged, so the
batch costs no Python stage after its shuffle). The RDD at ``t`` holds, per key, the reduce of the
parent's values over ``(t - window, t]``; each batch is reduced on its own first (one segment per batch
in the merge), then the batches are combined, oldest first.

* With an inverse function and a previous window available (and, as in Spark, a window of at
  least 5 slides), the window is updated incrementally: previous window, minus (``invFunc``) the
  reduce of the batches that left, plus (``func``) the reduce of the batches that entered. One
  narrow merge: its cost depends on the state and the slide, not on the window's length.
* Otherwise the window is the partition-wise reduce of the cached per-batch reductions (no shuffle).

``filterFunc`` (optional) keeps only the pairs it accepts; use it to drop keys whose value has
fallen back to the neutral element. Reductions are applied oldest batch first, so order-sensitive
functions (``groupByKeyAndWindow``'s list concatenation) see values in time order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.core.rdd import Partitioner

from ..node import DStreamNode, OneParentNode
from ..spark.partitioned import fold, segmented_merge
from ..time import BatchTime, Duration
from .windowed import check_window

if TYPE_CHECKING:
    from ..graph import DStreamGraph


def reduce_segments(func: Callable[[Any, Any], Any], segments: Iterable[list[Any]]) -> dict[Any, Any]:
    """Each segment (one batch's combined pairs, a key once per map partition) reduced on its own, then
    the segments' results folded in order: the association of the per-batch reduce, then of the window."""
    acc: dict[Any, Any] = {}
    for seg in segments:
        fold(func, fold(func, seg, {}, "reduceByKeyAndWindow").items(), acc)
    return acc


class ReducedWindowNode(OneParentNode):
    label = "reduceByKeyAndWindow"

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 inv_func: Callable[[Any, Any], Any] | None, window: Duration, slide: Duration,
                 partitioner: Partitioner, filter_func: Callable[[Any], bool] | None) -> None:
        super().__init__(graph, parent)
        check_window(parent.slide_duration, window, slide)
        self.func = func
        self.inv_func = inv_func
        self.window = window
        self._slide = slide
        self.partitioner = partitioner
        self.filter_func = filter_func
        parent.persist(StorageLevel.MEMORY_ONLY)
        self.persist(StorageLevel.MEMORY_ONLY)

    @property
    def must_checkpoint(self) -> bool:  # type: ignore[override]
        return self.inv_func is not None

    @property
    def checkpoint_partitioner(self) -> Partitioner:
        return self.partitioner

    def describe_params(self) -> list[str]:
        inverse = ["inverse"] if self.inv_func is not None else []
        return [f"window={self.window.ms}", f"partitions={self.partitioner.numPartitions}", *inverse]

    @property
    def slide_duration(self) -> Duration:
        return self._slide

    @property
    def parent_remember_duration(self) -> Duration:
        assert self.remember_duration is not None
        return self.remember_duration + self.window

    def incremental(self) -> bool:
        return self.inv_func is not None and self.window.ms >= 5 * self._slide.ms

    def compute(self, time: BatchTime) -> RDD | None:
        previous = self.get_or_compute(time - self._slide) if self.incremental() else None
        plan = window_plan(self, time, previous)
        if plan is None or isinstance(plan, RDD):
            return plan
        groups, merge = plan
        return segmented_merge(self.graph.sc, groups, self.partitioner, merge)


#: What :func:`window_plan` gives for a merge: the groups (in the node's partitioner) and the merge of their
#: segments.
WindowPlan = tuple[list[list[RDD]], Callable[[list[list[Any]]], Iterable[Any]]]


def window_plan(node: Any, time: BatchTime, previous: RDD | None) -> WindowPlan | RDD | None:
    """The window of ``node`` (a reduceByKeyAndWindow node: its ``func``, ``inv_func``, ``filter_func``,
    ``window``, ``slide_duration`` and parent) at ``time``: incrementally from ``previous``
    (the window one slide before; the module docstring), else the reduce of the batches in it. A plan of one
    merge (its first group is ``previous``'s when incremental), an RDD to stand as is, or None (no batch)."""
    sc, slide = node.graph.sc, node.slide_duration
    pslide = node.parent.slide_duration
    begin = time - node.window
    func, inv, keep = node.func, node.inv_func, node.filter_func
    if previous is not None:
        old = node.parent.slice(begin - slide + pslide, begin)
        new = node.parent.slice(time - slide + pslide, time)
        leaving = len(old)

        def merge(segments: list[list[Any]]) -> Iterable[Any]:
            window = dict(segments[0])
            left = reduce_segments(func, segments[1:1 + leaving])
            for k, v in left.items():
                if k in window:
                    window[k] = inv(window[k], v)
            fold(func, reduce_segments(func, segments[1 + leaving:]).items(), window)
            if keep is None:
                return window.items()
            return [kv for kv in window.items() if keep(kv)]

        # One segment per batch: each batch is reduced on its own before the batches are combined.
        return [[previous], *([r] for r in old), *([r] for r in new)], merge

    current = node.parent.slice(begin + pslide, time)
    if not current:
        return None if inv is not None else sc.emptyRDD()

    def reduce_all(segments: list[list[Any]]) -> Iterable[Any]:
        acc = reduce_segments(func, segments)
        if keep is None:
            return acc.items()
        return [kv for kv in acc.items() if keep(kv)]

    # One segment per batch: each batch is reduced on its own before the batches are combined.
    return [[r] for r in current], reduce_all
