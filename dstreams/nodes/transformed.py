"""Stateless transformations: one function from the parents' RDDs of a batch to the batch's RDD.

Contract: all parents share one slide; ``func(rdds, time)`` receives the parents' RDDs of batch
``time`` (in order) and returns an RDD (None is an error: a transform must return an RDD). Narrow
PySpark operations chained here pipeline into one Python task per partition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pyspark import RDD

from ..node import DStreamNode
from ..time import BatchTime, Duration

if TYPE_CHECKING:
    from ..graph import DStreamGraph

TransformFunc = Callable[[list[RDD], BatchTime], RDD]


def require_same_slide(parents: Sequence[DStreamNode], what: str, message: str | None = None) -> Duration:
    """The common slide duration of ``parents``; ValueError (``message``, or one naming ``what``) otherwise.

    The one place that checks it (unions, joins, transforms over several streams).
    """
    slides = {p.slide_duration for p in parents}
    if len(slides) != 1:
        got = ", ".join(str(s) for s in sorted(slides))
        raise ValueError(f"{message or what + ' needs streams with the same slide duration'}, got {got}")
    return next(iter(slides))


class TransformedNode(DStreamNode):
    def __init__(self, graph: DStreamGraph, parents: Sequence[DStreamNode], func: TransformFunc,
                 label: str = "transform") -> None:
        super().__init__(graph)
        if not parents:
            raise ValueError("a transformation needs at least one parent stream")
        for p in parents:
            if p.graph is not graph:
                raise ValueError("cannot combine streams that belong to different StreamingContexts")
        self.parents = list(parents)
        self._slide = require_same_slide(self.parents, label)
        self.func = func
        self.label = label

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
                return None
            rdds.append(rdd)
        out = self.func(rdds, time)
        if not isinstance(out, RDD):
            raise TypeError(
                f"the function given to {self.label}() must return an RDD, got {type(out).__name__}"
            )
        return out
