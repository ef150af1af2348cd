"""A stream's checkpoint data: what the recovery layer records of a node, writes of it, and hands back to it.

As Spark's ``DStreamCheckpointData``, every node has one (:attr:`DStreamNode.checkpoint_data
<dstreams.node.DStreamNode.checkpoint_data>`), and the recovery layer and the scheduler reach a node's recovery
only through it: the journal, the resume plan, the checkpointer and the adoption of a committed checkpoint.
:class:`CheckpointData` is the behaviour of a node whose only recovery is its RDDs (a stateless stream, the RDD
state, a window); a node of another kind returns its own subclass:

* an input's (:class:`~dstreams.nodes.input.InputCheckpointData`): its offsets per batch and its source state;
* an event-time stream's (:class:`~dstreams.nodes.event_time.EventTimeCheckpointData`): its watermark per batch;
* a store-backed state's (:class:`~dstreams.nodes.store_state.StoreCheckpointData`): its deltas and snapshots,
  the chain a checkpoint builds on, a checkpoint read back into the executors' stores; the state picked by size
  (:class:`~dstreams.nodes.auto_state.AutoCheckpointData`) adds when it moved into the store;
* a keyed state or an incremental window: the default's, with the state's partitioner.

The object holds nothing of its own: what a node keeps for its recovery stays on the node (what a stored graph
resets, see ``DStreamNode.__getstate__``), and ``checkpoint_data`` builds one on each access.

Two groups of members:

* **The metadata log** (called for every node): :meth:`CheckpointData.batch_record` is what the node fixed on the
  driver while building batch ``time`` that a replay must reuse (JSON-able; None: nothing), which the journal writes
  with the batch's input offsets; :meth:`CheckpointData.node_state` what it must remember across a restart beyond
  its batches (None: nothing; recorded with every batch). A restarted driver hands the newest state back through
  :meth:`CheckpointData.restore_node_state`, then the recorded batches through :meth:`CheckpointData.replay_records`,
  before it generates.
* **Data checkpoints** (called for a node whose state chain is checkpointed, ``must_checkpoint``): the checkpointer
  writes what :meth:`CheckpointData.export` returns and keeps :attr:`CheckpointData.partitioner` in the manifest; a
  committed checkpoint is adopted on the event loop (:meth:`CheckpointData.adopt`: the lineage cut); a restarted
  driver reads a checkpoint back (whole, to verify it, unless :meth:`CheckpointData.reads_to_verify` says no),
  hands its manifest to :meth:`CheckpointData.manifest`, installs it with :meth:`CheckpointData.restore` and says
  which chain it resumed on with :meth:`CheckpointData.restored`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.core.rdd import Partitioner

    from .node import DStreamNode
    from .time import BatchTime


class CheckpointData:
    """The checkpoint data of ``node`` (module docstring); ``partitioner``: the one a reader of its checkpoint must
    keep (None: the checkpoint is not hash-partitioned)."""

    def __init__(self, node: DStreamNode, partitioner: Partitioner | None = None) -> None:
        self.node = node
        self._partitioner = partitioner

    # ----------------------------------------------------------------- the metadata log
    def batch_record(self, time: BatchTime) -> Any:
        """What the node fixed for batch ``time`` that a replay must reuse (JSON-able), or None.

        Called on the event loop after the batch is built and before it runs (the journal)."""
        return None

    def replay_records(self, records: Mapping[int, Any]) -> None:
        """A restarted driver hands back what :meth:`batch_record` returned, by batch time (ms), before it generates
        a batch (only the times that recorded something; not called when none did)."""

    def node_state(self) -> Any:
        """What the node must remember across a driver restart beyond its batches' records (JSON-able; e.g. the
        files a folder source consumed), or None. Recorded with every batch; the newest one is handed back."""
        return None

    def restore_node_state(self, state: Any) -> None:
        """A restarted driver hands back the newest :meth:`node_state` recorded, before :meth:`replay_records`."""

    # ----------------------------------------------------------------- data checkpoints
    @property
    def partitioner(self) -> Partitioner | None:
        """The partitioner a reader of the node's checkpoint must keep (None: not hash-partitioned)."""
        return self._partitioner

    def export(self, time_ms: int, rdd: RDD) -> tuple[RDD, dict[str, Any]]:
        """What the checkpoint of ``rdd`` (the node's RDD at ``time_ms``) writes, and entries to add to its manifest.
        Default: the RDD's records, nothing added (a store-backed state writes its changes)."""
        return rdd, {}

    def reads_to_verify(self, manifest: dict[str, Any]) -> bool:
        """Whether a restarted driver reads the node's checkpoint (whose manifest is ``manifest``) whole to verify
        it before resuming from it, so that a corrupt one is skipped for the one before (False: the executor state
        store, which checks that the parts exist and reads them only where a store needs them)."""
        return True

    def manifest(self, time_ms: int, manifest: dict[str, Any]) -> None:
        """A restarted driver is about to install the node's checkpoint at ``time_ms`` (:meth:`restore`);
        ``manifest`` is that checkpoint's manifest, with the entries :meth:`export` added. Default: nothing to do."""

    def restore(self, time: BatchTime, reader: RDD) -> None:
        """Install ``reader``, which reads a committed checkpoint, as the node's RDD at ``time``: when a driver
        recovers and when a checkpoint is adopted (:meth:`adopt`); later batches build on it. Default: ``reader``
        itself (:meth:`DStreamNode.restore_from_checkpoint <dstreams.node.DStreamNode.restore_from_checkpoint>`)."""
        self.node.restore_from_checkpoint(time, reader)

    def restored(self, time_ms: int, chain: list[int]) -> None:
        """A restarted driver resumes the node from its checkpoint at ``time_ms``, which builds on the checkpoints
        ``chain`` (oldest first; empty unless the node writes deltas). Default: nothing to do."""

    def adopt(self, time: BatchTime, reader: RDD) -> int:
        """A checkpoint committed while running replaces the node's RDD at ``time`` (the lineage cut, on the event
        loop's thread: :meth:`DStreamNode.adopt_checkpoint <dstreams.node.DStreamNode.adopt_checkpoint>`, which
        installs ``reader`` through :meth:`restore`). Returns the newest batch time of the node built before the
        adoption."""
        return self.node.adopt_checkpoint(time, reader)


__all__ = ["CheckpointData"]
