"""``track`` on the executor state store: a batch costs the keys with events and the keys that are due.

Chosen with ``spark.dstreams.state.store=executor`` for every form of ``track`` (with and without ``timers=``,
``emit="all"`` or ``"updated"``). The rule is :mod:`dstreams.nodes.timers`'s, applied by the same function
(:func:`~dstreams.nodes.timers.track_batch`) to the keys a batch must look at, which are the keys with events
in it and the keys whose **deadline** has come. Each stored entry (the layout of
:class:`~dstreams.nodes.timers.TimerTrackNode`: ``(state, last_event_ms, timers, emitted, alive, touched)``)
has up to two deadlines, kept in the store's index (:meth:`dstreams.statestore.PartitionStore.due_keys`) by
:func:`track_deadlines`:

* by batch time: the timeout (``last_event_ms + timeout``), the earliest processing-time timer, and right away
  (the next batch) for an entry holding this batch's emitted records or a dropped key's, so that they are
  cleared the next batch as the RDD state clears them;
* by watermark: the earliest event-time timer.

A key that is not due and has no events would come out of ``track_batch`` unchanged, so it is not read: the
outputs equal the RDD state's, batch by batch. The public streams read the whole state lazily (``emit="all"``:
:func:`~dstreams.nodes.timers.live_states` over the state), or what the batch wrote (``emit="updated"`` and
``emitted()``: the keys it touched).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark import RDD
from pyspark.core.rdd import Partitioner

from ..node import DStreamNode
from ..spark.partitioned import pre_group_ordered
from ..statestore import Indexer, PartitionStore, key_bytes, value_bytes
from ..time import BatchTime, Duration
from .event_time import watermark_at
from .store_state import StoreStateNode, Updater
from .timers import EVENT, Timer, track_batch

if TYPE_CHECKING:
    from ..graph import DStreamGraph

#: The batch-time deadline of an entry to clear the next batch (below every batch time).
NEXT_BATCH = -1


def track_deadlines(timeout_ms: int) -> Indexer:
    """The store's deadline function for ``track`` entries with timeout ``timeout_ms`` (see the module
    docstring): entry bytes -> (due at batch time, due at watermark)."""

    def deadlines(vb: bytes) -> tuple[int | None, int | None]:
        _, last, timers, emitted, alive, _ = pickle.loads(vb)
        if not alive or emitted:
            return NEXT_BATCH, None
        p, e = last + timeout_ms, None
        for kind, ms in timers.values():
            if kind == EVENT:
                e = ms if e is None or ms < e else e
            elif ms < p:
                p = ms
        return p, e

    return deadlines


class StoreTrackNode(StoreStateNode):
    """``track(init, update, timeout, timers=..., emit=...)`` on the executor state store (module docstring)."""

    applies_every_batch = True  # timeouts and timers come due in batches without events too

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, init: Callable[[Any, Any], Any],
                 update: Callable[[Any, Any, Any], Any], timeout: Duration, partitioner: Partitioner,
                 on_timer: Callable[[Any, Any, Timer], Any] | None, local_dir: str | None,
                 snapshot_every: int) -> None:
        super().__init__(graph, parent, partitioner, None, "track", local_dir, snapshot_every)
        self.init = init
        self.update = update
        self.timeout = timeout
        self.on_timer = on_timer

    def describe_params(self) -> list[str]:
        return ["timers" if self.on_timer is not None else "no-timers", f"timeout={self.timeout.ms}",
                *super().describe_params()]

    def prepare(self, batch: RDD) -> RDD:
        return pre_group_ordered(batch, self.partitioner, "track")

    def indexer(self) -> Indexer:
        return track_deadlines(self.timeout.ms)

    def updater(self, time: BatchTime) -> Updater:
        init, update, on_timer = self.init, self.update, self.on_timer
        now, timeout, wm = time.ms, self.timeout.ms, watermark_at(self, time)

        def apply(store: PartitionStore, records: list[Any]) -> tuple[dict[bytes, bytes | None], dict[bytes, bytes]]:
            kb_of: dict[Any, bytes] = {}
            events = []
            for k, evs in records:
                kb_of[k] = key_bytes(k)
                events.append((k, evs))
            with_events = set(kb_of.values())
            wanted = [*with_events, *(kb for kb in store.due_keys(now, wm) if kb not in with_events)]
            old = store.get_many(wanted)
            previous = []
            for kb, vb in old.items():
                k = pickle.loads(kb)
                kb_of.setdefault(k, kb)
                previous.append((k, pickle.loads(vb)))
            out = track_batch(previous, events, init=init, update=update, on_timer=on_timer, now_ms=now,
                              timeout_ms=timeout, watermark_ms=wm)
            writes: dict[bytes, bytes | None] = {kb: None for kb in old}  # dropped unless in the output
            for k, entry in out:
                writes[kb_of[k]] = value_bytes(entry)
            return writes, old

        return apply


def updated_entries(it: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """Partition function over what a batch wrote (``changes``): ``(key, state)`` of the live keys it touched."""
    return ((k, e[0]) for k, e in it if e is not None and e[-2] and e[-1])


def emitted_entries(it: Iterable[Any]) -> Iterator[Any]:
    """Partition function over what a batch wrote: the records its functions emitted."""
    for _, e in it:
        if e is not None:
            yield from e[-3]


__all__ = ["StoreTrackNode", "emitted_entries", "track_deadlines", "updated_entries"]
