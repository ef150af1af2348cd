"""Writes the metadata log as batches are generated and completed (the scheduler's journal hook).

Contract: ``batch_generated(t)`` runs after batch ``t``'s RDDs are built and before it runs: it
records the batch's input offsets (and the sources' state) in the head, conditionally. If that
fails because another driver took over (:class:`FencedError`), the batch is not run.
``batch_completed(t)`` records that every batch up to ``t`` completed, with the newest committed
data checkpoint of each stateful stream, and prunes offsets no restart can need any more.

A store that is down for a while: each commit is retried by the store's own policy (bounded, see
:mod:`dstreams.recovery.retry`); when that gives up with :class:`StoreUnavailableError`, the journal keeps
retrying the same commit, with a warning every attempt, for up to ``outage_seconds`` (default
:data:`DEFAULT_OUTAGE_SECONDS`, environment ``DSTREAMS_STORE_OUTAGE_SECONDS``). Meanwhile batches wait:
the generator does not run a batch whose offsets are not recorded, and the runner does not move on
before a completion is recorded, so nothing is lost and the scheduling delay shows the outage. Past the
bound (or when :meth:`Journal.close` is called) the error propagates and the driver stops; a restart
through ``getOrCreate`` resumes from the log. A fenced driver (:class:`FencedError`) never retries.
"""

from __future__ import annotations

import logging
import threading
import time as _time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dstreams import config
from dstreams.time import BatchTime

from .metadata import MetadataLog
from .store.errors import StoreUnavailableError

if TYPE_CHECKING:
    from dstreams.graph import DStreamGraph

log = logging.getLogger(__name__)

ENV_OUTAGE_SECONDS = config.STORE_OUTAGE_SECONDS.env
DEFAULT_OUTAGE_SECONDS: float = config.STORE_OUTAGE_SECONDS.default


def outage_seconds_from_env(conf: config.ConfLike | None = None) -> float:
    """The outage bound in seconds (>= 0): ``spark.dstreams.store.outageSeconds`` of ``conf`` (default: the
    running SparkContext's conf), else ``$DSTREAMS_STORE_OUTAGE_SECONDS``, else the default (15 min).
    ``ValueError`` for a value that is not a number of seconds >= 0."""
    return float(config.get(config.STORE_OUTAGE_SECONDS, conf if conf is not None else config.active_conf()))


class Journal:
    def __init__(self, metadata: MetadataLog, graph: DStreamGraph, outage_seconds: float | None = None) -> None:
        self.metadata = metadata
        self.graph = graph
        self.newest_checkpoint: dict[str, int] = dict(metadata.head.get("checkpoints", {}))
        self._lock = threading.Lock()
        self.outage_seconds = outage_seconds_from_env() if outage_seconds is None else outage_seconds
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop waiting for an unavailable store: a commit in progress raises its last error."""
        self._closed.set()

    def _while_store_is_down(self, what: str, commit: Callable[[], None]) -> None:
        """Run ``commit``; on :class:`StoreUnavailableError` retry it until the outage bound (see module doc)."""
        started = _time.monotonic()
        pause = 1.0
        while True:
            try:
                commit()
                if _time.monotonic() - started > 1.0:
                    log.warning("checkpoint store is back after %.0f s: %s recorded", _time.monotonic() - started,
                                what)
                return
            except StoreUnavailableError as e:
                waited = _time.monotonic() - started
                if waited >= self.outage_seconds or self._closed.is_set():
                    raise
                log.warning("checkpoint store unavailable for %.0f s (%s); %s waits and retries (gives up after "
                            "%.0f s, set %s to change)", waited, e, what, self.outage_seconds, ENV_OUTAGE_SECONDS)
                if self._closed.wait(min(pause, max(0.0, self.outage_seconds - waited))):
                    raise
                pause = min(pause * 2, 10.0)

    def checkpoint_committed(self, node_key: str, time_ms: int) -> None:
        with self._lock:
            self.newest_checkpoint[node_key] = max(time_ms, self.newest_checkpoint.get(node_key, 0))

    def _replay_horizon(self) -> int | None:
        """Offsets of batches at or before this time can no longer be needed by a restart."""
        stateful = self.graph.stateful_nodes()
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
        recorded = self.graph.input_offsets(time)
        offsets, sources = recorded.offsets, recorded.sources

        def commit() -> None:
            all_offsets = dict(self.metadata.head.get("offsets", {}))
            all_offsets[str(time.ms)] = offsets
            self.metadata.commit(offsets=all_offsets, sources=sources)

        self._while_store_is_down(f"batch {time.ms} (its input offsets)", commit)
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
        self._while_store_is_down(
            f"the completion of batch {time.ms}",
            lambda: self.metadata.commit(completed_through=time.ms, checkpoints=checkpoints, offsets=offsets),
        )
        for batch_offsets in dropped:  # write-ahead-log blocks no restart can need any more
            for o in batch_offsets.values():
                if isinstance(o, dict) and "wal" in o:
                    try:
                        self.metadata.store.delete(o["wal"])
                    except Exception as e:
                        log.warning("could not delete write-ahead-log block %s: %s", o["wal"], e)
