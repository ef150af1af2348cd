"""Event-time windows and sessions on the executor state store: a batch costs the keys with records and the
keys whose next window or session the watermark closes.

Chosen with ``spark.dstreams.state.store=executor`` for ``reduceByKeyAndEventWindow``/``reduceByEventWindow``
(both ``emit`` modes, with and without ``invFunc``) and ``sessionWindow``. The rules are those of
:mod:`dstreams.nodes.event_window`, applied by the same per-key steps (:func:`final_step`,
:func:`updates_step`, :func:`session_step`) to the keys a batch must look at: the keys with records in it and
the keys that are **due**. Each stored entry carries its deadline in the store's index
(:meth:`dstreams.statestore.PartitionStore.due_keys`):

* by watermark: the end of the key's next window to close (``emit="final"``: the first window after the last
  one closed, ``jmax``, holding data, or the window after the carried one, whose carry then goes; ``"updates"``:
  the first window still held), or of its first open session;
* by batch time, right away (the next batch): an entry holding this batch's emitted windows or sessions or
  late records, so that it is cleared the next batch (as the RDD state clears them).

Between its deadlines a key's step changes nothing (no window closes, nothing is dropped), so it is not read,
and the outputs equal the RDD state's, batch by batch. The public streams (emitted windows and sessions, late
session records) read what each batch wrote: the keys it touched.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark import RDD
from pyspark.core.rdd import Partitioner

from ..node import DStreamNode
from ..statestore import Indexer, PartitionStore, key_bytes, value_bytes
from ..time import BatchTime, Duration
from .event_time import previous_watermark_at, watermark_at
from .event_window import (
    _closed_through,
    check_event_window,
    final_step,
    pane_batch,
    session_batch,
    session_step,
    updates_step,
)
from .store_state import StoreStateNode, Updater
from .store_track import NEXT_BATCH

if TYPE_CHECKING:
    from ..graph import DStreamGraph

#: A key's step: (its entry or None, the batch's records of it or None) -> the new entry or None (dropped).
KeyStep = Callable[[tuple[Any, ...] | None, Any], tuple[Any, ...] | None]


def stepped(step: KeyStep, wm: int | None, now: int) -> Updater:
    """The updater applying ``step`` to the keys with records and the keys due at ``now``/``wm``."""

    def apply(store: PartitionStore, records: list[Any]) -> tuple[dict[bytes, bytes | None], dict[bytes, bytes]]:
        todo: dict[bytes, Any] = {key_bytes(k): new for k, new in records}  # key -> its records (None: due)
        for kb in store.due_keys(now, wm):
            if kb not in todo:
                todo[kb] = None
        old = store.get_many(todo)
        writes: dict[bytes, bytes | None] = {}
        for kb, new in todo.items():
            ob = old.get(kb)
            entry = step(None if ob is None else pickle.loads(ob), new)
            if entry is not None:
                writes[kb] = value_bytes(entry)
            elif ob is not None:
                writes[kb] = None
        return writes, old

    return apply


def window_deadlines(window_ms: int, slide_ms: int) -> Indexer:
    """Deadlines of event-window entries ``(panes or windows, carry, emitted, jmax, mode)`` (module docstring)."""
    n = window_ms // slide_ms

    def deadlines(vb: bytes) -> tuple[int | None, int | None]:
        held, carry, emitted, jmax, mode = pickle.loads(vb)
        if emitted:
            return NEXT_BATCH, None
        if mode == "updates":  # windows j held until the watermark passes their end
            j = min(held) if held else None
        else:  # panes p: the first window after jmax with data, or the one after the carried window
            j = None
            if held:
                j = min(held) - n + 1
                if jmax is not None:
                    j = max(j, jmax + 1)
            if carry is not None and (j is None or carry[0] + 1 < j):
                j = carry[0] + 1
        return None, None if j is None else j * slide_ms + window_ms

    return deadlines


def session_deadlines(gap_ms: int) -> Indexer:
    """Deadlines of session entries ``(open sessions, emitted, late)``: the end of the first open session."""

    def deadlines(vb: bytes) -> tuple[int | None, int | None]:
        sessions, emitted, late = pickle.loads(vb)
        if emitted or late:
            return NEXT_BATCH, None
        return None, min(s[-1][0] for s in sessions) + gap_ms if sessions else None

    return deadlines


class StoreEventWindowNode(StoreStateNode):
    """``reduceByKeyAndEventWindow`` on the executor state store (module docstring). Entries:
    ``(panes or windows, carry, emitted, jmax, emit mode)``; the public records read ``entry[2]`` as
    :func:`~dstreams.nodes.event_window.emitted_windows` does."""

    applies_every_batch = True

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 inv_func: Callable[[Any, Any], Any] | None, window: Duration, slide: Duration, emit: str,
                 partitioner: Partitioner, local_dir: str | None, snapshot_every: int) -> None:
        check_event_window(emit, window, slide)
        super().__init__(graph, parent, partitioner, None, "reduceByKeyAndEventWindow", local_dir, snapshot_every)
        self.func = func
        self.inv_func = inv_func
        self.window = window
        self.slide = slide
        self.emit = emit

    def describe_params(self) -> list[str]:
        inverse = ["inverse"] if self.inv_func is not None else []
        return [f"window={self.window.ms}", f"eventSlide={self.slide.ms}", f"emit={self.emit}", *inverse,
                *super().describe_params()]

    def prepare(self, batch: RDD) -> RDD:
        return pane_batch(batch, self.func, self.slide.ms, self.partitioner)

    def indexer(self) -> Indexer:
        return window_deadlines(self.window.ms, self.slide.ms)

    def updater(self, time: BatchTime) -> Updater:
        w, s, mode = self.window.ms, self.slide.ms, self.emit
        wm = watermark_at(self, time)
        jmax = _closed_through(wm, w, s)
        jprev = _closed_through(previous_watermark_at(self, time), w, s)
        step = final_step(self.func, self.inv_func, w // s, jprev, jmax) if mode == "final" else \
            updates_step(self.func, w // s, jmax)

        def key_step(entry: tuple[Any, ...] | None, new: Any) -> tuple[Any, ...] | None:
            held, carry, emitted = step(entry[0] if entry else {}, entry[1] if entry else None, new or {})
            if held or carry is not None or emitted:
                return held, carry, emitted, jmax, mode
            return None

        return stepped(key_step, wm, time.ms)


class StoreSessionWindowNode(StoreStateNode):
    """``sessionWindow`` on the executor state store (module docstring). Entries: ``(open sessions, emitted,
    late records)``, as :class:`~dstreams.nodes.event_window.SessionWindowNode`'s."""

    applies_every_batch = True

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, gap: Duration,
                 aggregate: Callable[[list[Any]], Any], partitioner: Partitioner, local_dir: str | None,
                 snapshot_every: int) -> None:
        if gap.ms <= 0:
            raise ValueError(f"the session gap must be positive, got {gap}")
        super().__init__(graph, parent, partitioner, None, "sessionWindow", local_dir, snapshot_every)
        self.gap = gap
        self.aggregate = aggregate

    def describe_params(self) -> list[str]:
        return [f"gap={self.gap.ms}", *super().describe_params()]

    def prepare(self, batch: RDD) -> RDD:
        return session_batch(batch, self.partitioner)

    def indexer(self) -> Indexer:
        return session_deadlines(self.gap.ms)

    def updater(self, time: BatchTime) -> Updater:
        wm = watermark_at(self, time)
        step = session_step(self.gap.ms, self.aggregate, wm)

        def key_step(entry: tuple[Any, ...] | None, new: Any) -> tuple[Any, ...] | None:
            kept, emitted, late = step(entry[0] if entry else [], new)
            return (kept, emitted, late) if kept or emitted or late else None

        return stepped(key_step, wm, time.ms)


def written(view: Callable[[Iterable[Any]], Iterator[Any]]) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """``view`` over what a batch wrote (``changes``: ``(key, entry)``, ``(key, None)`` for a key removed),
    skipping the removals."""

    def run(it: Iterable[Any]) -> Iterator[Any]:
        return view((k, e) for k, e in it if e is not None)

    return run


__all__ = ["StoreEventWindowNode", "StoreSessionWindowNode", "session_deadlines", "stepped", "window_deadlines",
           "written"]
