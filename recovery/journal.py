"""Writes the metadata log as batches are generated and completed (the scheduler's journal hook).

Contract: ``batch_generated(t)`` runs after batch ``t``'s RDDs are built and before it runs: it
records the batch's input offsets (and the sources' state) in the head, conditionally, with what other
nodes fixed for the batch (``CheckpointData.batch_record``: an event-time stream's watermark) under their keys
in the same per-batch map, so that it is kept and pruned with the offsets. If that
fails because another driver took over (:class:`FencedError`), the batch is not run.
``batch_completed(t)`` records that every batch up to ``t`` completed, with the newest committed
data checkpoint of each stateful stream, and prunes offsets no restart can need any more.

A store that is down for a while: each commit is retried by the store's own policy (bounded, see
:mod:`dstreams.recovery.retry`); when that gives up with :class:`StoreUnavailableError`, the journal keeps
retrying the same commit through :func:`~dstreams.recovery.outage.ride_out`, with a warning every attempt,
under the driver's one outage policy (``spark.dstreams.store.outageSeconds``, default 900 s, environment
``DSTREAMS_STORE_OUTAGE_SECONDS``; the same bound as the scheduler and the checkpointer), and warns
"checkpoint store is back after N s" when a commit gets through. Meanwhile batches wait: the generator does
not run a batch whose offsets are not recorded, and the runner does not move on before a completion is
recorded, so nothing is lost and the scheduling delay shows the outage. Past the bound (or when
:meth:`Journal.close` is called) the last error propagates and the driver stops; a restart through
``getOrCreate`` resumes from the log. A fenced driver (:class:`FencedError`) never retries.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from dstreams.contracts import OutagePolicy
from dstreams.time import BatchTime

from .metadata import MetadataLog
from .outage import StoreOutagePolicy, ride_out
from .outage import outage_seconds_from_env as outage_seconds_from_env  # the bound's reader, kept importable here

if TYPE_CHECKING:
    from dstreams.graph import DStreamGraph

log = logging.getLogger(__name__)

#: How many committed checkpoint times of each stream the journal keeps in mind (for the replay horizon).
CHECKPOINT_HISTORY = 8


class Journal:
    """The scheduler's ``BatchJournal`` over ``metadata`` (see the module docstring).

    :param outage: how long a commit waits for an unavailable store; the composition root passes the
        policy the scheduler and the checkpointer use. Default: a :class:`StoreOutagePolicy` with the
        configured bound.
    """

    def __init__(self, metadata: MetadataLog, graph: DStreamGraph, outage: OutagePolicy | None = None) -> None:
        self.metadata = metadata
        self.graph = graph
        self.newest_checkpoint: dict[str, int] = dict(metadata.head.get("checkpoints", {}))
        #: Each stream's committed checkpoint times known to this driver (the newest few), oldest first.
        self._checkpoint_times: dict[str, list[int]] = {k: [int(t)] for k, t in self.newest_checkpoint.items()}
        self._lock = threading.Lock()
        self.outage: OutagePolicy = outage if outage is not None else StoreOutagePolicy()
        self._closed = threading.Event()

    @property
    def outage_seconds(self) -> float:
        """The outage bound of the journal's policy, in seconds (0 for a policy without one: no waiting)."""
        return self.outage.outage_seconds if isinstance(self.outage, StoreOutagePolicy) else 0.0

    def close(self) -> None:
        """Stop waiting for an unavailable store: a commit waiting for it raises its last error at once."""
        self._closed.set()

    def checkpoint_committed(self, node_key: str, time_ms: int) -> None:
        with self._lock:
            self.newest_checkpoint[node_key] = max(time_ms, self.newest_checkpoint.get(node_key, 0))
            times = self._checkpoint_times.setdefault(node_key, [])
            if time_ms not in times:
                times.append(time_ms)
                times.sort()
                del times[:-CHECKPOINT_HISTORY]

    def _replay_horizon(self, completed_through: int, checkpoints: dict[str, list[int]]) -> int | None:
        """Offsets of batches at or before this time can no longer be needed by a restart.

        A restart resumes every stateful stream from its newest checkpoint at or before the oldest of the
        streams' newest ones (:mod:`.resume`), and replays input from there. ``checkpoints``: each stream's
        committed checkpoint times known to this driver, oldest first.
        """
        stateful = self.graph.stateful_nodes()
        base = completed_through
        if stateful:
            if any(not checkpoints.get(n.key) for n in stateful):
                return None  # a stream without a checkpoint replays from the first batch
            common = min(checkpoints[n.key][-1] for n in stateful)
            for n in stateful:
                before = [t for t in checkpoints[n.key] if t <= common]
                if before:
                    base = min(base, before[-1])
                elif n.checkpoint_interval is not None:
                    # Its checkpoints before are not known to this driver (restarted since): the previous one of
                    # its interval is at or after this.
                    base = min(base, common - n.checkpoint_interval.ms)
                else:
                    return None
        remember = self.graph.max_input_remember()
        batch = self.graph.batch_duration.ms if self.graph.batch_duration else 0
        return base - (remember.ms if remember else 0) - 2 * batch

    def batch_generated(self, time: BatchTime) -> None:
        recorded = self.graph.batch_records(time)  # every node's record and state (its checkpoint data)
        offsets, sources = dict(recorded.offsets), recorded.sources

        def changes(head: dict[str, Any]) -> dict[str, Any]:
            # Read and written under the log's lock: the runner prunes the same map (batch_completed).
            return {"offsets": {**head.get("offsets", {}), str(time.ms): offsets}, "sources": sources}

        ride_out(self.outage, f"recording the input offsets of batch {time.ms}",
                 lambda: self.metadata.update(changes), self._closed)
        try:
            self.metadata.record_batch(time.ms, offsets)
        except Exception as e:  # the audit record is not needed for recovery
            log.warning("could not write the audit record of batch %s: %s", time.ms, e)

    def batch_dropped(self, time: BatchTime, reason: str) -> None:
        """Record that batch ``time``'s input was dropped (``spark.dstreams.batch.onFailure=dropInput``).

        The head's ``dropped`` map (batch time -> the failure's one line) keeps the drops a restart may replay
        (pruned with the offsets), so that a replay drops them again; ``dropped_total`` counts every drop of the
        application; ``meta/dropped/<time>.json`` is the drop's audit record (kept).
        """
        def changes(head: dict[str, Any]) -> dict[str, Any]:
            return {"dropped": {**head.get("dropped", {}), str(time.ms): reason[:500]},
                    "dropped_total": int(head.get("dropped_total", 0)) + 1}

        ride_out(self.outage, f"recording the drop of batch {time.ms}",
                 lambda: self.metadata.update(changes), self._closed)
        try:
            self.metadata.record_drop(time.ms, reason)
        except Exception as e:  # the audit record is not needed for recovery
            log.warning("could not write the audit record of the drop of batch %s: %s", time.ms, e)

    def batch_completed(self, time: BatchTime) -> None:
        with self._lock:
            checkpoints = dict(self.newest_checkpoint)
            history = {k: list(v) for k, v in self._checkpoint_times.items()}
        pruned: list[Any] = []

        def changes(head: dict[str, Any]) -> dict[str, Any]:
            # Computed from the head under the log's lock: the generator adds the offsets of new batches to
            # the same map meanwhile (batch_generated), and a map read before its commit would drop them.
            offsets = dict(head.get("offsets", {}))
            drops = dict(head.get("dropped", {}))
            horizon = self._replay_horizon(time.ms, history)
            pruned.clear()
            if horizon is not None:
                pruned.extend(o for t, o in offsets.items() if int(t) <= horizon)
                offsets = {t: o for t, o in offsets.items() if int(t) > horizon}
                drops = {t: r for t, r in drops.items() if int(t) > horizon}
            return {"completed_through": time.ms, "checkpoints": checkpoints, "offsets": offsets, "dropped": drops}

        ride_out(self.outage, f"recording the completion of batch {time.ms}",
                 lambda: self.metadata.update(changes), self._closed)
        for batch_offsets in pruned:  # write-ahead-log blocks no restart can need any more
            for o in batch_offsets.values():
                if isinstance(o, dict) and "wal" in o:
                    try:
                        self.metadata.store.delete(o["wal"])
                    except Exception as e:
                        log.warning("could not delete write-ahead-log block %s: %s", o["wal"], e)
