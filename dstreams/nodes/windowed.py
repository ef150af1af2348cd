"""``window``: the union of the parent's RDDs over the last ``window`` duration, every ``slide``.

Contract: the RDD at ``t`` is the union of the parent's RDDs at the valid times in
``(t - window, t]``. Window and slide are multiples of the parent's slide. When every RDD in the
window shares one partitioner the union keeps it (a partition-wise union: no shuffle downstream
for a ``reduceByKey`` with the same partitioning).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark import RDD, StorageLevel

from ..node import DStreamNode, OneParentNode
from ..spark.partitioned import union_rdds
from ..time import BatchTime, Duration

if TYPE_CHECKING:
    from ..graph import DStreamGraph


def check_window(parent_slide: Duration, window: Duration, slide: Duration) -> None:
    if not window.is_multiple_of(parent_slide):
        raise ValueError(
            f"the window duration ({window}) must be a multiple of the parent stream's slide "
            f"duration ({parent_slide})"
        )
    if not slide.is_multiple_of(parent_slide):
        raise ValueError(
            f"the slide duration ({slide}) must be a multiple of the parent stream's slide "
            f"duration ({parent_slide})"
        )


class WindowedNode(OneParentNode):
    def __init__(self, graph: DStreamGraph, parent: DStreamNode, window: Duration, slide: Duration) -> None:
        super().__init__(graph, parent)
        check_window(parent.slide_duration, window, slide)
        self.window = window
        self._slide = slide
        # The parent's RDDs are read by several windows: keep them cached (as Spark does).
        if parent.storage_level is None:
            parent.persist(StorageLevel.MEMORY_ONLY)

    @property
    def slide_duration(self) -> Duration:
        return self._slide

    def describe_params(self) -> list[str]:
        return [f"window={self.window.ms}"]

    @property
    def parent_remember_duration(self) -> Duration:
        assert self.remember_duration is not None
        return self.remember_duration + self.window

    def compute(self, time: BatchTime) -> RDD | None:
        rdds = self.parent.slice(time - self.window + self.parent.slide_duration, time)
        if not rdds:
            return self.graph.sc.emptyRDD()
        return union_rdds(self.graph.sc, rdds)
