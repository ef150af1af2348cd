"""Event-time windows (tumbling, sliding, sessions) over event time, closed by the low watermark.

Contract of :class:`EventWindow` (``reduceByKeyAndEventWindow``/``reduceByEventWindow``). The parent's
records are ``(event_ms, (key, value))`` (an event-time stream, :mod:`dstreams.nodes.event_time`); the late
ones are already gone. Windows are ``[j * slide, j * slide + window)`` for every integer ``j`` (aligned to the
epoch, as Structured Streaming's), ``window`` a multiple of ``slide`` (equal: tumbling). A window's value is
the reduce with ``func`` (associative and commutative, as for ``reduceByKey``) of the values of the records
whose event time falls in it. With ``W(t)`` the watermark of batch ``t`` (see ``event_time``):

* ``emit="final"``: batch ``t`` emits each window with data whose end is in ``(W(t - 1), W(t)]``, once: no
  record of it can arrive any more (a record of batch ``t`` or later is at or above ``W(t)``, or late).
* ``emit="updates"``: batch ``t`` emits each window that received records in batch ``t``, with its value so
  far: a first result as soon as it has data, then a corrected one with every batch that brings it more
  (late records inside the allowed lateness); the last one emitted is the final value. A window is
  forgotten once ``W`` passes its end (the watermark already contains the allowed lateness).

The state is per key and hash-partitioned like every state stream (``StateNode``): each batch is pre-reduced
per (key, pane) on the map side, shuffled once into the state's partitioner and merged partition-wise with
the previous state (no state shuffle), and checkpointed (lineage cut) every checkpoint interval. A pane is
one slide of event time; the state holds, per key, the panes of windows not closed yet (bounded by the
watermark: a pane is dropped once its last window closed, a key once it holds nothing).

With ``invFunc`` (``emit="final"``) the sliding windows are computed incrementally: the next window is the
previous one minus (``invFunc``) the pane that left plus the pane that entered, the previous window being
carried in the state across batches (and kept up to date with the records that land in its panes), so
emitting a window costs two calls instead of ``window / slide``. Without it, each window is the reduce of
its panes. Both give the same values (``tests/property/test_event_time_windows.py``).

Session windows are the same kind of keyed operator (:class:`SessionWindow`, ``sessionWindow``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark import RDD
from pyspark.core.rdd import Partitioner

from ..node import DStreamNode, OneParentNode
from ..spark import jvm
from ..spark.partitioned import pre_group_ordered, require_pair
from ..time import BatchTime, Duration
from .event_time import previous_watermark_at, seconds, watermark_at
from .keyed import DUE, NEXT_BATCH, Deadline, KeyedOp, KeyStep, entry_records

if TYPE_CHECKING:
    from ..graph import DStreamGraph

EMIT_MODES = ("final", "updates")
_MISSING = object()


def _add(func: Callable[[Any, Any], Any], acc: dict[int, Any], p: int, v: Any) -> None:
    old = acc.get(p, _MISSING)
    acc[p] = v if old is _MISSING else func(old, v)


def _closed_through(watermark: int | None, window: int, slide: int) -> int | None:
    """The largest window index ``j`` whose end ``j * slide + window`` is at or below ``watermark``."""
    return None if watermark is None else (watermark - window) // slide


class EventWindow(KeyedOp):
    """``reduceByKeyAndEventWindow`` (module docstring). Entries ``(panes or windows, carry, emitted)``, and on the
    store also the window closed through (``jmax``) and the mode, which its deadline reads
    (:meth:`deadline`); the public records read ``entry[2]`` (:func:`emitted_windows`)."""

    kind, label, visits = "EventWindowNode", "reduceByKeyAndEventWindow", DUE

    def __init__(self, func: Callable[[Any, Any], Any], inv_func: Callable[[Any, Any], Any] | None, window: Duration,
                 slide: Duration, emit: str) -> None:
        if emit not in EMIT_MODES:
            raise ValueError(f"emit must be one of {EMIT_MODES}, got {emit!r}")
        if window.ms <= 0 or slide.ms <= 0 or not window.is_multiple_of(slide):
            raise ValueError(f"the event-time window ({window}) must be a positive multiple of its slide ({slide})")
        self.func, self.inv_func, self.window, self.slide, self.emit = func, inv_func, window, slide, emit

    def params(self) -> list[str]:
        inverse = ["inverse"] if self.inv_func is not None else []
        return [f"window={self.window.ms}", f"eventSlide={self.slide.ms}", f"emit={self.emit}", *inverse]

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        """``(key, {pane: value})`` per key of the batch (panes of one slide), in the state's partitioner (one
        shuffle)."""
        func, s = self.func, self.slide.ms

        def combine(it: Iterable[Any]) -> Iterable[tuple[Any, dict[int, Any]]]:
            acc: dict[Any, dict[int, Any]] = {}
            for ts, kv in it:
                k, v = require_pair(kv, "reduceByKeyAndEventWindow")
                _add(func, acc.setdefault(k, {}), ts // s, v)
            return acc.items()

        def merge(it: Iterable[tuple[Any, dict[int, Any]]]) -> Iterable[tuple[Any, dict[int, Any]]]:
            acc: dict[Any, dict[int, Any]] = {}
            for k, panes in it:
                cur = acc.setdefault(k, panes)
                if cur is not panes:
                    for p, v in panes.items():
                        _add(func, cur, p, v)
            return acc.items()

        return jvm.shuffle(batch.mapPartitions(combine), partitioner).mapPartitions(merge, preservesPartitioning=True)

    def _jmax(self, node: Any, time_ms: int) -> int | None:
        return _closed_through(watermark_at(node, BatchTime(time_ms)), self.window.ms, self.slide.ms)

    def step(self, node: Any, time: BatchTime) -> KeyStep:
        w, s, mode = self.window.ms, self.slide.ms, self.emit
        jmax = self._jmax(node, time.ms)
        jprev = _closed_through(previous_watermark_at(node, time), w, s)
        step = final_step(self.func, self.inv_func, w // s, jprev, jmax) if mode == "final" else \
            updates_step(self.func, w // s, jmax)
        tail = (jmax, mode) if node.on_store(time.ms) else ()

        def key_step(k: Any, entry: Any, new: Any) -> Any:
            held, carry, emitted = step(entry[0] if entry else {}, entry[1] if entry else None, new or {})
            return (held, carry, emitted, *tail) if held or carry is not None or emitted else None

        return key_step

    def deadline(self) -> Deadline:
        """An entry's deadline (the store's layout): by watermark the end of the key's next window to close
        (``emit="final"``: the first window after the last one closed, ``jmax``, holding data, or the window after
        the carried one, whose carry then goes; ``"updates"``: the first window still held); the next batch for an
        entry holding emitted windows."""
        window_ms, slide_ms = self.window.ms, self.slide.ms
        n = window_ms // slide_ms

        def deadline(entry: Any) -> tuple[int | None, int | None]:
            held, carry, emitted, jmax, mode = entry
            if emitted:
                return NEXT_BATCH, None
            if mode == "updates":  # windows j held until the watermark passes their end
                j = min(held) if held else None
            else:  # panes p: the first window after jmax with data, or the one after the carried one
                j = None
                if held:
                    j = min(held) - n + 1
                    if jmax is not None:
                        j = max(j, jmax + 1)
                if carry is not None and (j is None or carry[0] + 1 < j):
                    j = carry[0] + 1
            return None, None if j is None else j * slide_ms + window_ms

        return deadline

    def to_store(self, node: Any, time_ms: int) -> Callable[[Any], Any] | None:
        """An RDD entry of batch ``t`` gets ``t``'s ``jmax``: on the RDD state every key steps every batch, so every
        window through it is closed for every key."""
        jmax, mode = self._jmax(node, time_ms), self.emit
        return lambda e: (e[0], e[1], e[2], jmax, mode)

    def from_store(self) -> Callable[[Any], Any] | None:
        return lambda e: (e[0], e[1], e[2])

    def rdd_changes(self, current: RDD, time: BatchTime) -> RDD | None:
        return current.filter(lambda kv: kv[1][2])  # the entries holding windows the batch emitted


Step = Callable[[dict[int, Any], Any, dict[int, Any]], tuple[dict[int, Any], Any, list[tuple[int, Any]]]]


def final_step(func: Callable[[Any, Any], Any], inv: Callable[[Any, Any], Any] | None, n: int,
               jprev: int | None, jmax: int | None) -> Step:
    """One key's step with ``emit="final"``: ``(panes, carry, new panes) -> (panes, carry, emitted)``.

    ``carry`` (with ``inv``): ``(j, value of window j, whether pane j has data, its value)`` for the last
    window emitted, kept while the next window may slide from it (a tuple without sentinels: the state is
    pickled between batches)."""

    def step(old: dict[int, Any], carry: Any, new: dict[int, Any]) -> tuple[dict[int, Any], Any, list]:
        panes = dict(old)
        emitted: list[tuple[int, Any]] = []
        if jmax is not None:  # first the windows W(t) closes, from the records of the batches before t
            low = None if jprev is None else jprev + 1
            for j in sorted({j for p in panes for j in range(p - n + 1 if low is None else max(p - n + 1, low),
                                                            min(p, jmax) + 1)}):
                if inv is not None and carry is not None and carry[0] == j - 1:  # slid from the window before
                    value = inv(carry[1], carry[3]) if carry[2] else carry[1]
                    if j + n - 1 in panes:
                        value = func(value, panes[j + n - 1])
                else:  # the reduce of its panes (at least one holds data)
                    value = reduce(func, [panes[q] for q in range(j, j + n) if q in panes])
                emitted.append((j, value))
                if inv is not None:
                    carry = (j, value, j in panes, panes.get(j))
            panes = {p: v for p, v in panes.items() if p > jmax}
            if carry is not None and carry[0] != jmax:
                carry = None  # the next window cannot slide from it (the windows between had no data)
        for p in sorted(new):  # then the batch's records, in the windows still open
            if jmax is not None and p <= jmax:
                continue  # every window of pane p has closed: late for all of them
            v = new[p]
            _add(func, panes, p, v)
            if carry is not None and carry[0] < p < carry[0] + n:
                carry = (carry[0], func(carry[1], v), carry[2], carry[3])
        return panes, carry, emitted

    return step


def updates_step(func: Callable[[Any, Any], Any], n: int, jmax: int | None) -> Step:
    """One key's step with ``emit="updates"``: ``(windows, None, new panes) -> (windows, None, emitted)``."""

    def step(old: dict[int, Any], carry: Any, new: dict[int, Any]) -> tuple[dict[int, Any], Any, list]:
        windows = dict(old)
        changed: set[int] = set()
        for p in sorted(new):  # the batch's records count in their windows still open (j > jmax)
            for j in range(p - n + 1 if jmax is None else max(p - n + 1, jmax + 1), p + 1):
                _add(func, windows, j, new[p])
                changed.add(j)
        emitted = [(j, windows[j]) for j in sorted(changed)]
        if jmax is not None:
            windows = {j: v for j, v in windows.items() if j > jmax}
        return windows, None, emitted

    return step


def emitted_windows(window_ms: int, slide_ms: int, keyed: bool) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """Partition function over the state or its changes: the public records of the windows emitted in a batch:
    ``((key, (start, end)), value)`` (keyed) or ``((start, end), value)``, bounds in seconds since the epoch."""

    def record(k: Any, window: tuple[int, Any]) -> Any:
        j, value = window
        bounds = (seconds(j * slide_ms), seconds(j * slide_ms + window_ms))
        return ((k, bounds), value) if keyed else (bounds, value)

    return entry_records(2, record)


class SessionWindow(KeyedOp):
    """``sessionWindow(gap, aggregate)``: per key, sessions of records closer than ``gap`` in event time.

    A session holds the records of one key whose event times, sorted, are each less than ``gap`` after the
    previous one; its bounds are ``(first event time, last event time + gap)``. A session is **open** in
    batch ``t`` while its end is above the watermark ``W(t)``. Batch ``t`` first closes the sessions whose
    end is at or below ``W(t)`` and emits them once, with the records of the batches before ``t``; then its
    records join the open sessions: a record joins the session it falls in, extends one, or **merges** the
    two it bridges, also when it is behind the watermark. A record whose session (alone, or with other
    records of the batch) would end at or below ``W(t)`` is **late**: it missed a session that closed and is
    dropped (:func:`late_session_records`). Emitted records: ``((key, (start, end)), aggregate(values))``,
    the values in event-time order (ties in arrival order), bounds in seconds since the epoch. Entries:
    ``(open sessions, emitted, late records)``; a key is dropped once it has no open session.
    """

    kind, label, visits = "SessionWindowNode", "sessionWindow", DUE

    def __init__(self, gap: Duration, aggregate: Callable[[list[Any]], Any]) -> None:
        if gap.ms <= 0:
            raise ValueError(f"the session gap must be positive, got {gap}")
        self.gap, self.aggregate = gap, aggregate

    def params(self) -> list[str]:
        return [f"gap={self.gap.ms}"]

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        """``(key, [(event_ms, value), ...])`` per key of the batch, in arrival order, in the state's partitioner."""

        def by_key(it: Iterable[Any]) -> Iterable[tuple[Any, tuple[int, Any]]]:
            for ts, kv in it:
                k, v = require_pair(kv, "sessionWindow")
                yield k, (ts, v)

        return pre_group_ordered(batch.mapPartitions(by_key), partitioner, "sessionWindow")

    def step(self, node: Any, time: BatchTime) -> KeyStep:
        """A key's step in batch ``time``, with watermark ``W(t)``: its open sessions, the batch's records (None:
        none) -> ``(open sessions, emitted (start, end, aggregate), late records)`` (the class docstring's rule)."""
        gap, aggregate, wm = self.gap.ms, self.aggregate, watermark_at(node, time)

        def step(k: Any, entry: Any, records: list[tuple[int, Any]] | None) -> Any:
            kept, emitted, late = [], [], []
            for session in entry[0] if entry else []:  # first the sessions W(t) closes, as the batches before left them
                end = session[-1][0] + gap
                if wm is not None and end <= wm:
                    emitted.append((session[0][0], end, aggregate([e[1] for e in session])))
                else:
                    kept.append(session)
            if records is not None:  # re-cut the open sessions with the new records (merging those they bridge)
                events = sorted([*(e for session in kept for e in session), *records], key=lambda e: e[0])
                kept = []
                for session in _sessions(events, gap):
                    if wm is not None and session[-1][0] + gap <= wm:
                        late.extend(session)  # the batch's records alone, in a session closed already
                    else:
                        kept.append(session)
            return (kept, emitted, late) if kept or emitted or late else None

        return step

    def deadline(self) -> Deadline:
        """By watermark the end of the entry's first open session; the next batch for an entry holding emitted
        sessions or late records."""
        gap = self.gap.ms

        def deadline(entry: Any) -> tuple[int | None, int | None]:
            sessions, emitted, late = entry
            if emitted or late:
                return NEXT_BATCH, None
            return None, min(s[-1][0] for s in sessions) + gap if sessions else None

        return deadline

    def rdd_changes(self, current: RDD, time: BatchTime) -> RDD | None:
        return current.filter(lambda kv: kv[1][1] or kv[1][2])  # sessions emitted or records found late


def _sessions(events: list[tuple[int, Any]], gap: int) -> list[list[tuple[int, Any]]]:
    """``events`` (sorted by event time) cut where two neighbours are ``gap`` or more apart."""
    out: list[list[tuple[int, Any]]] = []
    for e in events:
        if out and e[0] - out[-1][-1][0] < gap:
            out[-1].append(e)
        else:
            out.append([e])
    return out


#: Partition function over the state or its changes: ``((key, (start, end)), aggregate)`` for the sessions emitted
#: in a batch.
emitted_sessions = entry_records(1, lambda k, s: ((k, (seconds(s[0]), seconds(s[1]))), s[2]))


def late_session_records(gap_ms: int) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """Partition function over the state or its changes: ``((key, value), event time, [(event time, event time +
    gap)])`` for each record a batch's sessions dropped as late (the session it alone would have opened had closed
    already), times in seconds since the epoch."""
    return entry_records(2, lambda k, r: ((k, r[1]), seconds(r[0]), [(seconds(r[0]), seconds(r[0] + gap_ms))]))


class WindowLateRecordsNode(OneParentNode):
    """``lateRecords()`` of an event-time window stream: per batch, the records of the window operator's input
    that missed at least one of their windows (it had closed: its end at or below the batch's watermark),
    with the windows they missed (:meth:`compute`). A pure function of the batch's records and
    its recorded watermark, so a replayed batch reports the same records."""

    label = "windowLateRecords"

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, window: Duration, slide: Duration,
                 keyed: bool) -> None:
        super().__init__(graph, parent)
        self.window, self.slide, self.keyed = window, slide, keyed

    def describe_params(self) -> list[str]:
        return [f"window={self.window.ms}", f"eventSlide={self.slide.ms}", "keyed" if self.keyed else "unkeyed"]

    def compute(self, time: BatchTime) -> RDD | None:
        """Per record ``(event_ms, (key, value))`` of batch ``time`` with a window closed through index ``jmax`` (by
        its watermark): ``(record, event time, [(start, end), ...])``, ``record`` the ``(key, value)`` (the value when
        not ``keyed``), the windows it missed in time order, times in seconds since the epoch."""
        rdd = self.parent.get_or_compute(time)
        w, s, keyed = self.window.ms, self.slide.ms, self.keyed
        jmax = _closed_through(watermark_at(self, time), w, s)
        if rdd is None:
            return None

        def late(it: Iterable[Any]) -> Iterator[Any]:
            if jmax is None:
                return
            for ts, kv in it:
                p = ts // s
                missed = range(p - w // s + 1, min(p, jmax) + 1)
                if missed:
                    yield kv if keyed else kv[1], seconds(ts), [(seconds(j * s), seconds(j * s + w)) for j in missed]

        return rdd.mapPartitions(late)
