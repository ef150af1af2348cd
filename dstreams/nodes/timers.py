"""Timers in ``track`` (MillWheel's ``SetTimer``/``ProcessTimer``, Flink's timer service): many per key, by tag.

Contract of :class:`Track` (``track(init, update, timeout, timers=on_timer)``). It keeps ``track``'s
contract (``init(key, event)``, ``update(key, state, event)``, None drops the key, ``timeout`` drops a key
without events) and adds, per key, any number of **timers**, each named by a **tag** (a ``str``, unique per
key across both kinds) and of one of two kinds: ``"event"`` (event time: fires when the watermark reaches
it) or ``"processing"`` (processing time: fires when the batch time reaches it).

* ``init``/``update``/``on_timer`` may return a :class:`TrackUpdate` instead of a plain state:
  ``TrackUpdate(state, timers={tag: Timer(kind, time) or None, ...}, emit=[...])`` sets (or replaces: one
  timer per tag) the timer of each tag mapped to a :class:`Timer` and deletes the timer of each tag mapped
  to None (deleting a tag without a timer does nothing); tags it does not name keep their timers. ``time``
  is seconds since the epoch (int or float) or a ``datetime`` (naive: UTC), kept as integer milliseconds
  (rounded). ``eventTime=t`` and ``processingTime=t`` are short for ``timers={"event": Timer("event", t)}``
  and ``timers={"processing": Timer("processing", t)}`` (the one timer of each kind of the first version).
  ``emit`` adds records to the stream's ``emitted()``. A plain state keeps every timer.
* **Firing.** In batch ``t``, first the batch's events are applied (timers they set that are already due
  fire in this batch), then the key's **due** timers fire: an event-time timer whose time is at or below the
  watermark ``W(t)`` (see :mod:`dstreams.nodes.event_time`; never while there is no watermark, e.g. without
  ``withEventTime`` upstream), a processing-time timer whose time is at or below ``t``. They fire in this
  order: the event-time ones by (time, tag), then the processing-time ones by (time, tag) (the two clocks are
  not compared with each other; event-time first, as with the one timer per kind before). Each calls
  ``on_timer(key, state, Timer(kind, time, tag))`` (``time`` in seconds, as set), which returns the new
  state or a :class:`TrackUpdate`. The due timers are taken when the firing starts: a timer fires at most
  once per batch and is removed before its callback runs; a timer that a callback of this batch sets,
  replaces (even to the same or an earlier time) or deletes does not fire in this batch: one set or
  replaced fires in a later batch at the earliest (the next one if it is due), one deleted never. A state
  of None (from any function) drops the key with all its timers (the timers still due in the batch do not
  fire); so does ``timeout``.
* Timers are part of the key's state: hash-partitioned, checkpointed with it, and fired by a pure function of
  the state, the batch's events, ``W(t)`` (recorded in the metadata log) and ``t``, so a replayed batch fires
  exactly the timers the original did and a timer fires exactly once in the committed output across a
  driver failover.

``track(..., emit="updated")`` (with or without timers) is the ``mapWithState``-style variant: its stream
holds, each batch, only the keys that received events or fired a timer in it (and are still alive).

Records of this node: ``(key, (state, last_event_ms, timers, emitted, alive, touched))`` with ``timers`` a
dict ``tag -> (kind, time_ms)``; the public streams read ``(key, state)`` of the live (and touched) keys and
the ``emitted`` records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import RDD
from pyspark.core.rdd import Partitioner

from ..spark.partitioned import pre_group_ordered
from ..time import BatchTime, Duration
from .event_time import event_ms, seconds, watermark_at
from .keyed import DUE, NEXT_BATCH, Deadline, KeyedOp, KeyStep, entry_records, rdd_partition

EVENT, PROCESSING = "event", "processing"
#: The firing order of the kinds (event-time timers first).
KINDS = (EVENT, PROCESSING)
#: The tags of ``TrackUpdate(eventTime=...)`` and ``TrackUpdate(processingTime=...)``.
DEFAULT_TAGS = {EVENT: "event", PROCESSING: "processing"}

#: A key's timers: tag -> (kind, time in ms).
TimerTable = dict[str, tuple[str, int]]
#: A change of a key's timers: (tag, (kind, time ms)) sets or replaces, (tag, None) deletes.
TimerChange = tuple[str, tuple[str, int] | None]


def _time_ms(value: Any, what: str) -> int:
    """A timer time as integer ms, by the event times' rule (:func:`~.event_time.event_ms`): ``value`` is seconds
    since the epoch (int or float) or a ``datetime``; ``what`` names it in the error."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds since the epoch, got {value!r}")
    try:
        return event_ms(value)
    except TypeError:
        raise TypeError(f"{what} must be seconds since the epoch (int or float) or a datetime, got {value!r:.100} "
                        f"({type(value).__name__}): e.g. Timer('event', ts + 60) for a minute of event time after "
                        "an event's time ts") from None


def _check_tag(tag: Any) -> None:
    if not isinstance(tag, str):
        raise TypeError(f"a timer's tag must be a str, got {tag!r:.100} ({type(tag).__name__}): name timers with "
                        "strings, e.g. f'window-{start}'")


@dataclass(frozen=True)
class Timer:
    """A timer: ``kind`` is ``"event"`` (event time) or ``"processing"`` (processing time), ``time`` seconds since
    the epoch (int or float) or a ``datetime`` (naive: UTC), ``tag`` its name (a ``str``).

    To set one, map its tag to it in ``TrackUpdate(timers={tag: Timer(kind, time)})`` (``tag`` may be left
    None there, or must equal the key). The timer ``on_timer`` receives carries its tag and its time in seconds
    (an int when whole), as set, rounded to ms. Invalid values raise ``TypeError``/``ValueError`` when the
    timer is built.
    """

    kind: str
    time: Any
    tag: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a timer's kind must be 'event' or 'processing', got {self.kind!r:.100}: "
                             "Timer('event', t) fires when the watermark reaches t, Timer('processing', t) "
                             "when the batch time does")
        _time_ms(self.time, f"the time of a {self.kind}-time timer")
        if self.tag is not None:
            _check_tag(self.tag)


@dataclass(frozen=True)
class TrackUpdate:
    """What ``init``/``update``/``on_timer`` may return instead of a plain state (see the module docstring).

    ``state``: the key's new state (None drops the key and its timers); ``timers``: a mapping ``tag -> Timer``
    (set or replace the timer of that tag) or ``tag -> None`` (delete it); ``eventTime``/``processingTime``:
    set the timer of tag ``"event"``/``"processing"`` (seconds since the epoch or a ``datetime``; None: no
    change); ``emit``: records for the stream's ``emitted()``. Invalid values raise ``TypeError``/
    ``ValueError`` when the update is built.
    """

    state: Any
    eventTime: Any = None  # noqa: N815 - the fluent API's camelCase
    processingTime: Any = None  # noqa: N815
    emit: Sequence[Any] = field(default_factory=tuple)
    timers: Mapping[str, Timer | None] | None = None
    #: The timer changes, validated, in ms (computed from the fields above).
    changes: tuple[TimerChange, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        changes: list[TimerChange] = []
        for kind, value in ((EVENT, self.eventTime), (PROCESSING, self.processingTime)):
            if value is not None:
                changes.append((DEFAULT_TAGS[kind], (kind, _time_ms(value, f"TrackUpdate's {kind}Time="))))
        if self.timers is not None:
            if not isinstance(self.timers, Mapping):
                raise TypeError(f"TrackUpdate's timers= must be a dict tag -> Timer(kind, time) (set or replace) "
                                f"or None (delete), got {type(self.timers).__name__}: e.g. timers={{'flush': "
                                f"Timer('event', end), 'idle': None}}")
            named = {tag for tag, _ in changes}
            for tag, timer in self.timers.items():
                _check_tag(tag)
                if tag in named:
                    kind = EVENT if tag == DEFAULT_TAGS[EVENT] else PROCESSING
                    raise ValueError(f"TrackUpdate sets the timer of tag {tag!r} twice: by {kind}Time= and by "
                                     f"timers[{tag!r}]; use one of them")
                if timer is None:
                    changes.append((tag, None))
                    continue
                if not isinstance(timer, Timer):
                    raise TypeError(f"timers[{tag!r}] must be a Timer(kind, time) (set or replace) or None "
                                    f"(delete), got {timer!r:.100} ({type(timer).__name__})")
                if timer.tag is not None and timer.tag != tag:
                    raise ValueError(f"timers[{tag!r}] has tag {timer.tag!r}: the key of timers= is the tag; "
                                     f"leave Timer's tag out there (or equal to {tag!r})")
                changes.append((tag, (timer.kind, _time_ms(timer.time, f"the time of timers[{tag!r}]"))))
        object.__setattr__(self, "changes", tuple(changes))


class Track(KeyedOp):
    """``track(init, update, timeout, timers=on_timer, emit=...)`` (module docstring): entries ``(state,
    last_event_ms, timers, emitted, alive, touched)`` (:func:`timer_track_step`), or, ``plain`` (no timers, every live
    key emitted) on the RDD state, the lighter ``(state, last_event_ms)`` (:func:`plain_track_step`; converted when
    the state moves into the store, which holds the timers' layout). Deadlines: :meth:`deadline`."""

    kind, label, visits = "TrackNode", "track", DUE

    def __init__(self, init: Callable[[Any, Any], Any], update: Callable[[Any, Any, Any], Any], timeout: Duration,
                 on_timer: Callable[[Any, Any, Timer], Any] | None, plain: bool) -> None:
        self.init, self.update, self.timeout, self.on_timer, self.plain = init, update, timeout, on_timer, plain

    def params(self) -> list[str]:
        return ["timers" if self.on_timer is not None else "no-timers", f"timeout={self.timeout.ms}",
                *(["plain"] if self.plain else [])]

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        return pre_group_ordered(batch, partitioner, "track")

    def step(self, node: Any, time: BatchTime) -> KeyStep:
        if self.plain and not node.on_store(time.ms):
            return plain_track_step(self.init, self.update, time.ms, self.timeout.ms)
        return timer_track_step(self.init, self.update, self.on_timer, time.ms, self.timeout.ms,
                                watermark_at(node, time))

    def deadline(self) -> Deadline:
        """An entry's deadlines (the timers' layout): by batch time the timeout (``last_event_ms + timeout``), the
        earliest processing-time timer, or the next batch for an entry holding emitted records or a dropped key's;
        by watermark the earliest event-time timer."""
        timeout_ms = self.timeout.ms

        def deadline(entry: Any) -> tuple[int | None, int | None]:
            _, last, timers, emitted, alive, _ = entry
            if not alive or emitted:
                return NEXT_BATCH, None
            p, e = last + timeout_ms, None
            for kind, ms in timers.values():
                if kind == EVENT:
                    e = ms if e is None or ms < e else e
                elif ms < p:
                    p = ms
            return p, e

        return deadline

    def to_store(self, node: Any, time_ms: int) -> Callable[[Any], Any] | None:
        return (lambda e: (e[0], e[1], {}, [], True, False)) if self.plain else None

    def from_store(self) -> Callable[[Any], Any] | None:
        return (lambda e: (e[0], e[1])) if self.plain else None

    def touched(self, previous: list[Any], out: list[Any], keys: set[Any]) -> int:
        """As the store touches them: keys with events, keys gone from the state (timed out, or ended by the user's
        function) and, with timers, keys whose timer fired (their entry's ``touched`` flag)."""
        kept = {kv[0] for kv in out}
        touched = keys | {kv[0] for kv in previous if kv[0] not in kept}
        if not self.plain:
            touched.update(kv[0] for kv in out if kv[1][-1])
        return len(touched)

    def rdd_changes(self, current: RDD, time: BatchTime) -> RDD | None:
        """The entries the batch touched, emitted records with or dropped (timers' layout), or the keys with events
        (plain, whose dropped keys are gone), as the store's changes read."""
        if not self.plain:
            return current.filter(lambda kv: kv[1][-1] or kv[1][-3] or not kv[1][-2])
        now = time.ms
        return current.filter(lambda kv: kv[1][1] == now).mapValues(lambda e: (e[0], e[1], {}, [], True, True))


def plain_track_step(init: Callable[[Any, Any], Any], update: Callable[[Any, Any, Any], Any], now: int,
                     timeout: int) -> KeyStep:
    """Plain ``track``'s step at batch ``now`` ms: per event, in input order, ``init`` for a key without state, else
    ``update``; a key without events for ``timeout`` ms is dropped."""

    def step(k: Any, entry: Any, events: Any) -> Any:
        if events is None:
            return entry if now - entry[1] < timeout else None
        s = entry[0] if entry is not None else None
        for ev in events:
            s = init(k, ev) if s is None else update(k, s, ev)
        return None if s is None else (s, now)

    return step


def track_batch(previous: Iterable[tuple[Any, tuple[Any, ...]]], events: Iterable[tuple[Any, Iterable[Any]]], *,
                init: Callable[[Any, Any], Any], update: Callable[[Any, Any, Any], Any],
                on_timer: Callable[[Any, Any, Timer], Any] | None, now_ms: int, timeout_ms: int,
                watermark_ms: int | None) -> list[tuple[Any, tuple[Any, ...]]]:
    """One batch of a partition on the RDD state: :func:`timer_track_step` over every key of ``previous`` and of the
    batch's ``(key, events)``. A pure function of its input."""
    step = timer_track_step(init, update, on_timer, now_ms, timeout_ms, watermark_ms)
    return rdd_partition(Track(init, update, Duration(timeout_ms), on_timer, False), step, previous, [list(events)])


def timer_track_step(init: Callable[[Any, Any], Any], update: Callable[[Any, Any, Any], Any],
                     on_timer: Callable[[Any, Any, Timer], Any] | None, now_ms: int, timeout_ms: int,
                     watermark_ms: int | None) -> KeyStep:
    """A key's step of ``track`` with timers at batch time ``now_ms`` and watermark ``watermark_ms``: its entry
    (or None) with its events (None: none) applied and its due timers fired (the rule of the module
    docstring)."""

    def due(kind: str, ms: int) -> bool:
        return ms <= now_ms if kind == PROCESSING else watermark_ms is not None and ms <= watermark_ms

    def step(k: Any, entry: Any, events: Any) -> Any:
        if (entry is not None and len(entry) == 6 and entry[4] and not entry[3] and not entry[5] and events is None
                and now_ms - entry[1] < timeout_ms and not any(due(*timer) for timer in entry[2].values())):
            # An idle key: a live entry holding no emitted record, not touched by the batch
            # before (its flag stays False), not timed out, no timer due. The rule below gives the same entry.
            return entry
        if entry is not None and entry[4]:
            s, last, timers = entry[0], entry[1], dict(entry[2])
        else:
            s, last, timers = None, None, {}
        emitted: list[Any] = []
        for ev in events or ():
            s = _apply(init(k, ev) if s is None else update(k, s, ev), timers, emitted, None)
            last = now_ms
            if s is None:
                timers.clear()  # dropped with its timers: a later event of the batch starts the key again
        if s is not None and now_ms - last >= timeout_ms:
            s = None  # timed out (track's contract)
        touched = events is not None
        if s is not None and timers:
            due_now = sorted((KINDS.index(kind), ms, tag) for tag, (kind, ms) in timers.items() if due(kind, ms))
            changed: set[str] = set()  # tags set, replaced or deleted by this batch's callbacks
            for rank, ms, tag in due_now:
                if tag in changed:
                    continue
                del timers[tag]
                touched = True
                s = _apply(_fire(on_timer, k, s, Timer(KINDS[rank], seconds(ms), tag)), timers, emitted, changed)
                if s is None:
                    break
        if s is None:
            return (None, last, {}, emitted, False, touched) if emitted else None  # the key goes with its timers
        return s, last, timers, emitted, True, touched

    return step


def _fire(on_timer: Callable[[Any, Any, Timer], Any] | None, key: Any, state: Any, timer: Timer) -> Any:
    if on_timer is None:
        raise ValueError(f"the {timer.kind}-time timer {timer.tag!r} of key {key!r:.100} fired, but track() has no "
                         "timers= callback: pass timers=on_timer, or do not set timers in init/update")
    return on_timer(key, state, timer)


def _apply(result: Any, timers: TimerTable, emitted: list[Any], changed: set[str] | None) -> Any:
    """The state after a user function returned ``result`` (a state or a :class:`TrackUpdate`); applies the
    update's timer changes to ``timers`` (noting their tags in ``changed``) and its records to ``emitted``."""
    if not isinstance(result, TrackUpdate):
        return result
    emitted.extend(result.emit)
    for tag, timer in result.changes:
        if timer is None:
            timers.pop(tag, None)
        else:
            timers[tag] = timer
        if changed is not None:
            changed.add(tag)
    return result.state


# The public streams read the last three fields, ``emitted, alive, touched``; over what a batch wrote (``changes``)
# a removed key is ``(key, None)``.
def live_states(it: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """Partition function over the state: ``(key, state)`` of the live keys (an entry of the plain layout,
    ``(state, last_event_ms)``, is always live)."""
    return ((k, e[0]) for k, e in it if len(e) == 2 or e[-2])


def updated_states(it: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """Partition function over the state or its changes: ``(key, state)`` of the live keys that had events or fired
    timers in the batch."""
    return ((k, e[0]) for k, e in it if e is not None and e[-2] and e[-1])


#: Partition function over the state or its changes: the records the batch's functions emitted.
emitted_records = entry_records(-3, lambda k, record: record)
