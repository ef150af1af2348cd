"""Writes the metadata log as batches are generated and completed (the scheduler's journal hook).

Contract: ``batch_generated(t)`` runs after batch ``t``'s RDDs are built and before it runs: it
records the batch's input offsets (and the sources' state) in the head, conditionally. If that
fails because another driver took over (:class:`FencedError`), the batch is not run.
``batch_completed(t)`` records that every batch up to ``t`` completed, with the newest committed
data checkpoint of each stateful stream, and prunes offsets no restart can need any more.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from dstreams.time import BatchTime

from .metadata import MetadataLog

if TYPE_CHECKING:
    from dstreams.graph import DStreamGraph

log = logging.getLogger(__name__)


class Journal:
    def __init__(self, metadata: MetadataLog, graph: DStreamGraph) -> None:
        self.metadata = metadata
        self.graph = graph
        self.newest_checkpoint: dict[str, int] = dict(metadata.head.get("checkpoints", {}))
        self._lock = threading.Lock()

    def checkpoint_committed(self, node_key: str, time_ms: int) -> None:
        with self._lock:
            self.newest_checkpoint[node_key] = max(time_ms, self.newest_checkpoint.get(node_key, 0))

    def _replay_horizon(self) -> int | None:
        """Offsets of batches at or before this time can no longer be needed by a restart."""
        stateful = [n for n in self.graph.nodes if n.must_checkpoint]
        base = self.metadata.head.get("completed_through")
        if base is None:
            return None
        if stateful:
            times = [self.newest_checkpoint.get(n.key) for n in stateful]
            if any(t is None for t in times):
                return None  # a stream without a checkpoint replays from the first batch
            base = min(base, *[t for t in times if t is not None])
        remember = self.graph.max_input_remember()
        batch = self.graph.batch_duration.ms if self.graph.batch_duration else 0
        return base - (remember.ms if remember else 0) - 2 * batch

    def batch_generated(self, time: BatchTime) -> None:
        offsets: dict[str, Any] = {}
        sources: dict[str, Any] = {}
        for node in self.graph.inputs:
            o = node.offsets_at(time)
            if o is not None:
                offsets[node.key] = o
            s = node.source_state()
            if s is not None:
                sources[node.key] = s
        all_offsets = dict(self.metadata.head.get("offsets", {}))
        all_offsets[str(time.ms)] = offsets
        self.metadata.commit(offsets=all_offsets, sources=sources)
        try:
            self.metadata.record_batch(time.ms, offsets)
        except Exception as e:  # the audit record is not needed for recovery
            log.warning("could not write the audit record of batch %s: %s", time.ms, e)

    def batch_completed(self, time: BatchTime) -> None:
        with self._lock:
            checkpoints = dict(self.newest_checkpoint)
        offsets = dict(self.metadata.head.get("offsets", {}))
        self.metadata.head["completed_through"] = time.ms  # for the horizon below; committed just after
        horizon = self._replay_horizon()
        dropped: list[Any] = []
        if horizon is not None:
            dropped = [o for t, o in offsets.items() if int(t) <= horizon]
            offsets = {t: o for t, o in offsets.items() if int(t) > horizon}
        self.metadata.commit(completed_through=time.ms, checkpoints=checkpoints, offsets=offsets)
        for batch_offsets in dropped:  # write-ahead-log blocks no restart can need any more
            for o in batch_offsets.values():
                if isinstance(o, dict) and "wal" in o:
                    try:
                        self.metadata.store.delete(o["wal"])
                    except Exception as e:
                        log.warning("could not delete write-ahead-log block %s: %s", o["wal"], e)
