"""The engine's checkpoint hook for stateful streams.

Contract: when a stateful node (``must_checkpoint``) builds its RDD at a batch time that falls on
its checkpoint interval, it calls ``graph.checkpointer.mark(node, time, rdd)``. The checkpointer
must make sure that, once the batch's jobs have run, the RDD's lineage no longer reaches back to
earlier batches (the lineage cut), so a long run keeps bounded lineage and driver memory.

The implementation (``dstreams.recovery.checkpointer.StoreCheckpointer``) writes checkpoints
into a store (a local folder by default, or S3) asynchronously and adopts a reader of each committed
checkpoint as the node's RDD; the engine only knows this interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark import RDD

from .time import BatchTime

if TYPE_CHECKING:
    from .node import DStreamNode


class Checkpointer:
    """Interface: called by stateful nodes when a checkpoint is due."""

    def mark(self, node: DStreamNode, time: BatchTime, rdd: RDD) -> None:
        raise NotImplementedError

    def batch_completed(self, time: BatchTime) -> None:
        """Called after every batch (in batch order); a hook for asynchronous commits."""

    def resumed(self, node: DStreamNode, restored_ms: int | None, existing: list[int]) -> None:
        """Called by a restarted driver for each stateful node: the checkpoint it restored from
        (None: none usable) and the node's checkpoints found in the store."""
