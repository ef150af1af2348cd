"""The engine's checkpoint hook for stateful streams.

Contract: when a stateful node (``must_checkpoint``) builds its RDD at a batch time that falls on
its checkpoint interval, it calls ``graph.checkpointer.mark(node, time, rdd)``. The checkpointer
must make sure that, once the batch's jobs have run, the RDD's lineage no longer reaches back to
earlier batches (the lineage cut), so a long run keeps bounded lineage and driver memory.

:class:`SparkCheckpointer` (the default) uses Spark's reliable RDD checkpointing into the
context's checkpoint directory (a local folder unless the user set another). Master failover with
checkpoints in an S3-compatible store plugs in here as another implementation.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyspark import RDD

from .time import BatchTime

if TYPE_CHECKING:
    from .node import DStreamNode

log = logging.getLogger(__name__)


class Checkpointer:
    """Interface: called by stateful nodes when a checkpoint is due."""

    def mark(self, node: DStreamNode, time: BatchTime, rdd: RDD) -> None:
        raise NotImplementedError

    def batch_completed(self, time: BatchTime) -> None:
        """Called after every batch (in batch order); a hook for asynchronous commits."""


class SparkCheckpointer(Checkpointer):
    """Cut lineage with Spark's reliable checkpoint (``rdd.checkpoint()``) into ``directory``."""

    def __init__(self, sc, directory: str) -> None:
        self.sc = sc
        self.directory = directory
        sc.setCheckpointDir(directory)
        self.marked = 0

    def mark(self, node: DStreamNode, time: BatchTime, rdd: RDD) -> None:
        if not rdd.is_cached:
            # Checkpointing recomputes the RDD in a second job unless it is cached.
            rdd.cache()
        rdd.checkpoint()
        self.marked += 1
        log.debug("checkpoint of %s at %s marked", node.name, time)
