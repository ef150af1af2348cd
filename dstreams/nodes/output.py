"""Output operations: the nodes that turn a batch into a job.

Contract: ``generate_job(time)`` returns a :class:`~dstreams.graph.Job` whose ``run()`` calls
``func(rdd, time)`` with the parent's RDD of that batch, or None when the parent has no RDD at
``time`` (e.g. a windowed stream between two slides).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark import RDD

from ..graph import Job
from ..node import DStreamNode, OneParentNode
from ..time import BatchTime

if TYPE_CHECKING:
    from ..graph import DStreamGraph

ForeachFunc = Callable[[RDD, BatchTime], None]


class OutputNode(OneParentNode):
    #: The output operation (``foreachRDD``, ``saveAsTextFiles``...): it names the node's jobs, not the node
    #: (``OutputNode#<id>``).
    label: str
    named_by_label = False

    #: Called on the driver once it has taken its epoch, before its first batch (a sink that claims its output
    #: there: ``saveToPostgres``); None for most outputs.
    on_start: Callable[[], None] | None = None

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: ForeachFunc, label: str,
                 on_start: Callable[[], None] | None = None) -> None:
        super().__init__(graph, parent)
        if parent.graph is not graph:
            raise ValueError("the stream belongs to a different StreamingContext")
        self.func = func
        self.label = label
        self.on_start = on_start
        graph.add_output(self)
        self.output_id = len(graph.outputs) - 1

    def compute(self, time: BatchTime) -> RDD | None:
        return self.parent.get_or_compute(time)

    def generate_job(self, time: BatchTime) -> Job | None:
        rdd = self.get_or_compute(time)
        if rdd is None:
            return None
        func = self.func
        return Job(time, self.output_id, self.label, f"{self.label} at {time.ms}", lambda: func(rdd, time))
