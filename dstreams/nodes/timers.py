"""Timers in ``track`` (MillWheel's ``SetTimer``/``ProcessTimer``): per key, on event time or processing time.

Contract of :class:`TimerTrackNode` (``track(init, update, timeout, timers=on_timer)``). It keeps ``track``'s
contract (``init(key, event)``, ``update(key, state, event)``, None drops the key, ``timeout`` drops a key
without events) and adds, per key, at most one **event-time timer** and one **processing-time timer**:

* ``init``/``update``/``on_timer`` may return a :class:`TrackUpdate` instead of a plain state:
  ``TrackUpdate(state, eventTime=..., processingTime=..., emit=[...])`` sets (replaces) the key's timer of
  that kind (a field left None keeps the current one) and emits records to the stream's ``emitted()``.
* In batch ``t``, after the batch's events are applied, each key's event-time timer whose time is at or
  below the watermark ``W(t)`` (see :mod:`dstreams.nodes.event_time`) fires, and so does each
  processing-time timer whose time is at or below the batch time ``t``: ``on_timer(key, state, timer)``
  (``timer`` a :class:`Timer`) returns the new state (None drops the key and its timers) or a
  :class:`TrackUpdate`. A timer fires once (it is cleared before ``on_timer`` runs; re-arming it for a
  time that is already due fires it in the next batch). Event-time timers need event time upstream
  (``withEventTime``); without it they never fire.
* Timers are part of the key's state: hash-partitioned, checkpointed with it, and fired by a pure function of
  the state, the batch's events, ``W(t)`` (recorded in the metadata log) and ``t``, so a replayed batch fires
  exactly the timers the original did and a timer fires exactly once in the committed output across a
  driver failover.

``track(..., emit="updated")`` (with or without timers) is the ``mapWithState``-style variant: its stream
holds, each batch, only the keys that received events or fired a timer in it (and are still alive).

Records of this node: ``(key, (state, last_event_ms, event_timer_ms, processing_timer_ms, emitted, alive,
touched))``; the public streams read ``(key, state)`` of the live (and touched) keys and the ``emitted``
records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.rdd import Partitioner

from ..node import DStreamNode
from ..time import BatchTime, Duration
from .event_time import event_ms, seconds, watermark_at
from .state import Merge, TrackNode

if TYPE_CHECKING:
    from ..graph import DStreamGraph


@dataclass(frozen=True)
class TrackUpdate:
    """What ``init``/``update``/``on_timer`` may return instead of a plain state (see the module docstring).

    ``state``: the key's new state (None drops the key); ``eventTime``/``processingTime``: set the key's timer
    of that kind (seconds since the epoch or a ``datetime``; None keeps the current one); ``emit``: records
    for the stream's ``emitted()``.
    """

    state: Any
    eventTime: Any = None  # noqa: N815 - the fluent API's camelCase
    processingTime: Any = None  # noqa: N815
    emit: Sequence[Any] = field(default_factory=tuple)


@dataclass(frozen=True)
class Timer:
    """A timer that fires: ``kind`` is ``"event"`` or ``"processing"``, ``time`` its time in seconds since the
    epoch (what it was set to)."""

    kind: str
    time: int | float


class TimerTrackNode(TrackNode):
    """``track(init, update, timeout, timers=on_timer)``; see the module docstring."""

    merges_every_batch = True  # timers fire in batches without events too

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, init: Callable[[Any, Any], Any],
                 update: Callable[[Any, Any, Any], Any], timeout: Duration, partitioner: Partitioner,
                 on_timer: Callable[[Any, Any, Timer], Any] | None) -> None:
        super().__init__(graph, parent, init, update, timeout, partitioner)
        self.on_timer = on_timer

    def describe_params(self) -> list[str]:
        return ["timers" if self.on_timer is not None else "no-timers", *super().describe_params()]

    def merge_function(self, time: BatchTime) -> Merge:
        init, update, on_timer = self.init, self.update, self.on_timer
        now, timeout, wm = time.ms, self.timeout.ms, watermark_at(self, time)

        def merge(segments: list[list[Any]]) -> Iterable[Any]:
            state = dict(segments[0])
            new = dict(segments[1])
            out = []
            for k in [*state, *(k for k in new if k not in state)]:
                entry = state.get(k)
                s, last, et, pt = entry[:4] if entry is not None and entry[5] else (None, None, None, None)
                emitted: list[Any] = []
                for ev in new.get(k, ()):
                    r = init(k, ev) if s is None else update(k, s, ev)
                    s, et, pt = _apply(r, et, pt, emitted)
                    last = now
                    if s is None:
                        et = pt = None
                if s is not None and now - last >= timeout:
                    s = et = pt = None  # timed out (track's contract)
                touched = k in new
                if s is not None and et is not None and wm is not None and et <= wm:
                    fired, et, touched = et, None, True
                    s, et, pt = _apply(_fire(on_timer, k, s, Timer("event", seconds(fired))), et, pt, emitted)
                if s is not None and pt is not None and pt <= now:
                    fired, pt, touched = pt, None, True
                    s, et, pt = _apply(_fire(on_timer, k, s, Timer("processing", seconds(fired))), et, pt, emitted)
                if s is None:
                    et = pt = None
                if s is not None or emitted:
                    out.append((k, (s, last, et, pt, emitted, s is not None, touched)))
            return out

        return merge


def _fire(on_timer: Callable[[Any, Any, Timer], Any] | None, key: Any, state: Any, timer: Timer) -> Any:
    if on_timer is None:
        raise ValueError(f"a {timer.kind}-time timer of key {key!r:.100} fired, but track() has no timers= callback: "
                         "pass timers=on_timer, or do not set timers in init/update")
    return on_timer(key, state, timer)


def _apply(result: Any, et: int | None, pt: int | None, emitted: list[Any]) -> tuple[Any, int | None, int | None]:
    """The state and timers after a user function returned ``result`` (a state or a :class:`TrackUpdate`)."""
    if not isinstance(result, TrackUpdate):
        return result, et, pt
    emitted.extend(result.emit)
    if result.eventTime is not None:
        et = event_ms(result.eventTime)
    if result.processingTime is not None:
        pt = event_ms(result.processingTime)
    return result.state, et, pt


def live_states(it: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    """Partition function: ``(key, state)`` of the live keys."""
    return ((k, e[0]) for k, e in it if e[5])


def updated_states(it: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    """Partition function: ``(key, state)`` of the live keys that had events or fired timers in the batch."""
    return ((k, e[0]) for k, e in it if e[5] and e[6])


def emitted_records(it: Iterator[Any]) -> Iterator[Any]:
    """Partition function: the records the batch's functions emitted."""
    for _, e in it:
        yield from e[4]
