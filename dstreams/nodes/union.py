"""``union`` of several streams with the same slide: the union of their RDDs of each batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark import RDD

from ..node import DStreamNode
from ..spark.partitioned import union_rdds
from ..time import BatchTime, Duration
from .transformed import require_same_slide

if TYPE_CHECKING:
    from ..graph import DStreamGraph


class UnionNode(DStreamNode):
    def __init__(self, graph: DStreamGraph, parents: Sequence[DStreamNode]) -> None:
        super().__init__(graph)
        if not parents:
            raise ValueError("union needs at least one stream")
        for p in parents:
            if p.graph is not graph:
                raise ValueError("cannot union streams that belong to different StreamingContexts")
        self.parents = list(parents)
        self._slide = require_same_slide(self.parents, "union")

    @property
    def slide_duration(self) -> Duration:
        return self._slide

    @property
    def dependencies(self) -> list[DStreamNode]:
        return list(self.parents)

    def compute(self, time: BatchTime) -> RDD | None:
        rdds = []
        for p in self.parents:
            rdd = p.get_or_compute(time)
            if rdd is None:
                raise RuntimeError(f"{p.name} produced no RDD at {time} inside a union")
            rdds.append(rdd)
        return union_rdds(self.graph.sc, rdds)
