"""The event-time streams of the fluent API: what ``DStream.withEventTime`` returns.

A :class:`TimedDStream` is a ``DStream`` whose records carry an event time the user does not see: its
``map``, ``flatMap``, ``filter``, ``mapValues``, ``flatMapValues`` and ``union`` (with another timed
stream) keep each record's event time, and the event-time operators (``reduceByKeyAndEventWindow``,
``reduceByEventWindow``, ``sessionWindow``, ``lateRecords``) read it; the window and session streams are
:class:`EventWindowView` s, with the ``lateRecords()`` of what each dropped. Every other ``DStream``
method works on the plain records and returns an ordinary ``DStream``, whose records no longer carry an
event time but whose **watermark** still flows downstream (a window over ``timed.reduceByKey(...)`` is not possible, a
``watermarks()`` of it is). The engine side is :mod:`dstreams.nodes.event_time`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import TYPE_CHECKING, Any, Self

from dstreams.node import DStreamNode
from dstreams.nodes.event_time import EventTimeNode, LateRecordsNode
from dstreams.nodes.store_state import StateChangesNode, StateViewNode, checkpointed_node
from dstreams.nodes.transformed import TransformedNode
from dstreams.nodes.union import UnionNode
from dstreams.time import Duration, DurationLike, parse_duration

from .stream import DStream, K, T, T_co, U, V

if TYPE_CHECKING:
    from .owner import GraphOwner


def _values(_: int, it: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    return (r[1] for r in it)


class StateView(DStream[T_co]):
    """The public stream of an event-time state operator (windows, sessions, timers): ``checkpoint(interval)``
    sets the checkpoint interval of the operator's state, which is what a checkpoint must cut."""

    def __init__(self: StateView[Any], state: DStreamNode, view: Callable[[Iterable[Any]], Iterator[Any]], label: str,
                 ssc: GraphOwner, source: DStreamNode | None = None) -> None:
        """Records: ``view`` over each partition of ``source`` (default: ``state``)."""
        source = state if source is None else source
        super().__init__(TransformedNode(state.graph, [source], lambda rdds, t: rdds[0].mapPartitions(view), label),
                         ssc)
        self._state = state

    def checkpoint(self, interval: DurationLike) -> Self:
        """Checkpoint the operator's state every ``interval`` (a multiple of the batch interval)."""
        self._check_open()
        checkpointed_node(self._state).checkpoint_interval = parse_duration(interval, "checkpoint interval")
        self.is_checkpointed = True
        return self


class EventWindowView(StateView[T_co]):
    """The stream of an event-time window or session operator, with :meth:`lateRecords`, what it dropped."""

    def __init__(self: EventWindowView[Any], state: DStreamNode, view: Callable[[Iterable[Any]], Iterator[Any]],
                 label: str, ssc: GraphOwner, late: Callable[[], DStreamNode], source: DStreamNode | None = None,
                 ) -> None:
        super().__init__(state, view, label, ssc, source)
        self._late = late
        self._all_sessions: DStreamNode | None = None  # a guarded session operator's every emitted session

    def lateRecords(self) -> DStream[tuple[Any, float, list[tuple[float, float]]]]:
        """Per batch, the records this operator dropped from at least one of their windows because that window
        had closed (its end at or below the batch's watermark): ``(record, eventTime, missedWindows)`` with
        ``record`` the operator's input record (``(key, value)``; the value for ``reduceByEventWindow``),
        ``eventTime`` in seconds since the epoch and ``missedWindows`` the ``(start, end)`` windows it missed,
        in time order. One record per late record, not per missed window: a record of a sliding window can
        miss some windows and still count in the others (it is listed with the ones it missed only), and a
        count of this stream is the number of records that lost data. For ``sessionWindow`` the record missed
        the session it would have opened, ``[(eventTime, eventTime + gap)]``, and counted nowhere."""
        self._check_open()
        return DStream(self._late(), self._ssc)


class TimedDStream(DStream[T_co]):
    """A stream whose records carry an event time (see the module docstring).

    ``_timed`` is the engine node whose records are ``(event_ms, value)``; the ``DStream`` view
    (``_node``) holds the values only. ``_event`` is the :class:`EventTimeNode` this stream comes from
    (None after a union of several).
    """

    def __init__(self: TimedDStream[Any], timed: DStreamNode, event: EventTimeNode | None, ssc: GraphOwner) -> None:
        plain = TransformedNode(timed.graph, [timed],
                                lambda rdds, t: rdds[0].mapPartitionsWithIndex(_values, True), "eventTimeValues")
        super().__init__(plain, ssc)
        self._timed = timed
        self._event = event

    def _timed_op(self, label: str, func: Callable[[int, Iterable[tuple[int, Any]]], Iterator[Any]],
                  preserves: bool = False) -> TimedDStream[Any]:
        self._check_open()
        node = TransformedNode(self._timed.graph, [self._timed],
                               lambda rdds, t: rdds[0].mapPartitionsWithIndex(func, preserves), label)
        return TimedDStream(node, self._event, self._ssc)

    def _timed_dead_letters(self, kind: str, f: Callable[[Any], Any], preserves: bool,
                            onError: str | None) -> TimedDStream[Any] | None:
        """``kind`` with its function guarded (``onError``, else ``spark.dstreams.onRecordError``; None when it does
        not route): a timed stream of the good outputs, each with its record's event time, whose ``deadLetters()``
        holds the records ``f`` raised on (the values, as the user's function saw them); one persisted tagged RDD."""
        if not self._routes_dead_letters(onError, kind):
            return None
        from dstreams.dead_letters import DEAD, GOOD, guarded_record

        def tagger(name: str, t: Any) -> Callable[[int, Iterable[tuple[int, Any]]], Iterator[Any]]:
            one = guarded_record(kind, f, name, t.ms)

            def run(_: int, it: Iterable[tuple[int, Any]]) -> Iterator[Any]:
                for event_ms, value in it:
                    for label, out in one(value):
                        yield (GOOD, (event_ms, out)) if label == GOOD else (DEAD, out)

            return run

        return self._routing_timed(kind, tagger, preserves)

    def _routing_timed(self, label: str, tagger: Callable[[str, Any], Callable[[int, Iterable[Any]], Iterator[Any]]],
                       preserves: bool) -> TimedDStream[Any]:
        """A timed stream of the GOOD outputs of ``tagger(operator name, batch time)`` over this stream's timed
        records (each output ``(event_ms, value)``), whose ``deadLetters()`` are the DEAD ones; one persisted tagged
        RDD (:mod:`dstreams.dead_letters`)."""
        from pyspark import StorageLevel

        from dstreams.dead_letters import dead, good

        self._check_open()
        graph = self._timed.graph
        name = f"{label}#{len(graph.dead_letter_nodes) + 1}"

        def tag(rdds: list[Any], t: Any) -> Any:
            return rdds[0].mapPartitionsWithIndex(tagger(name, t), preserves)

        tagged = TransformedNode(graph, [self._timed], tag, label)
        tagged.persist(StorageLevel.MEMORY_ONLY)
        kept = TransformedNode(graph, [tagged], lambda rdds, t: rdds[0].mapPartitions(good, True), label)
        routed = TransformedNode(graph, [tagged], lambda rdds, t: rdds[0].mapPartitions(dead, True), "deadLetters")
        graph.dead_letter_nodes.append(routed)
        out = TimedDStream(kept, self._event, self._ssc)
        out._dead_letters = DStream(routed, self._ssc)
        return out

    # ------------------------------------------------------------------ per-record operators keeping event time
    def map(self: TimedDStream[T], f: Callable[[T], U], preservesPartitioning: bool = False, *,
            onError: str | None = None) -> TimedDStream[U]:
        """``f(value)`` for every record, keeping its event time; ``onError`` as for :meth:`DStream.map`."""
        return self._timed_dead_letters("map", f, preservesPartitioning, onError) or self._timed_op(
            "map", lambda _, it: ((r[0], f(r[1])) for r in it), preservesPartitioning)

    def flatMap(self: TimedDStream[T], f: Callable[[T], Iterable[U]], preservesPartitioning: bool = False, *,
                onError: str | None = None) -> TimedDStream[U]:
        return self._timed_dead_letters("flatMap", f, preservesPartitioning, onError) or self._timed_op(
            "flatMap", lambda _, it: chain.from_iterable(((r[0], y) for y in f(r[1])) for r in it),
            preservesPartitioning)

    def filter(self: TimedDStream[T], f: Callable[[T], bool], *, onError: str | None = None) -> TimedDStream[T]:
        return self._timed_dead_letters("filter", f, True, onError) or self._timed_op(
            "filter", lambda _, it: (r for r in it if f(r[1])), True)

    def mapValues(self: TimedDStream[tuple[K, V]], f: Callable[[V], U], *,
                  onError: str | None = None) -> TimedDStream[tuple[K, U]]:
        return self._timed_dead_letters("mapValues", f, True, onError) or self._timed_op(
            "mapValues", lambda _, it: ((r[0], (r[1][0], f(r[1][1]))) for r in it), True)

    def flatMapValues(self: TimedDStream[tuple[K, V]], f: Callable[[V], Iterable[U]], *,
                      onError: str | None = None) -> TimedDStream[tuple[K, U]]:
        return self._timed_dead_letters("flatMapValues", f, True, onError) or self._timed_op(
            "flatMapValues",
            lambda _, it: chain.from_iterable(((r[0], (r[1][0], y)) for y in f(r[1][1])) for r in it), True)

    def union(self: TimedDStream[T], other: DStream[U]) -> DStream[T | U]:
        """With another timed stream: a timed stream (watermark: the minimum of the two); else a plain union."""
        if not isinstance(other, TimedDStream):
            return super().union(other)
        self._check_open()
        node = UnionNode(self._timed.graph, [self._timed, other._timed])
        return TimedDStream(node, self._event if self._event is other._event else None, self._ssc)

    # ------------------------------------------------------------------ event-time windows
    def reduceByKeyAndEventWindow(self: TimedDStream[tuple[K, V]], func: Callable[[V, V], V],
                                  windowDuration: DurationLike, slideDuration: DurationLike | None = None,
                                  invFunc: Callable[[V, V], V] | None = None, emit: str = "final",
                                  numPartitions: int | None = None, *, onError: str | None = None,
                                  ) -> EventWindowView[tuple[tuple[K, tuple[float, float]], V]]:
        """Per key, the reduce with ``func`` of the values whose event time falls in each window.

        Records are ``(key, value)`` pairs. Windows are ``[start, start + windowDuration)`` with ``start`` a
        multiple of ``slideDuration`` (default: ``windowDuration``, tumbling) since the epoch;
        ``windowDuration`` must be a multiple of ``slideDuration``. Output records:
        ``((key, (start, end)), value)``, ``start``/``end`` in seconds since the epoch (the unit of event
        times). A window is **open** in batch ``t`` while its end is above the batch's watermark ``W(t)``: a
        record of batch ``t`` counts in each of its windows that is open, also when its event time is behind
        the watermark, and is late only for the windows that closed (``lateRecords()`` of the returned stream
        lists it with them). ``emit="final"``: each window once, in the batch whose watermark reaches its end
        (``end <= W(t)``), with the records of the batches before (its final value); ``emit="updates"``: each
        window in every batch that brings it records (a first value as soon as it has data, then
        corrections), until the watermark reaches its end (the allowed lateness is in the watermark).
        ``invFunc`` (``emit="final"``) makes sliding windows
        incremental: the next window is the previous one, ``invFunc`` the pane that left, ``func`` the pane
        that entered. The state is per key, hash-partitioned into ``numPartitions`` and checkpointed like
        ``updateStateByKey``'s; it holds only windows the watermark has not passed.
        ``onError="deadLetter"`` folds each partition's records by key and pane inside a guard first, with the
        rules of :meth:`DStream.reduceByKey`'s (:func:`~dstreams.dead_letters.fold_event_partition`): a record
        ``func`` raises on goes to the returned stream's ``deadLetters()``; a later combine (with the window's
        state, of two partitions, ``invFunc``) still fails the batch.
        """
        return self._event_window(func, windowDuration, slideDuration, invFunc, emit, numPartitions, keyed=True,
                                  label="reduceByKeyAndEventWindow", onError=onError)

    def _event_window(self, func: Callable[[Any, Any], Any], windowDuration: DurationLike,
                      slideDuration: DurationLike | None, invFunc: Callable[[Any, Any], Any] | None, emit: str,
                      numPartitions: int | None, keyed: bool, label: str, onError: str | None,
                      ) -> EventWindowView[Any]:
        self._check_open()
        from dstreams.nodes.event_window import WindowLateRecordsNode
        from dstreams.spark.partitioned import hash_partitioner

        w = parse_duration(windowDuration, "windowDuration")
        s = self._duration(slideDuration, "slideDuration") or w
        part = hash_partitioner(self._default_partitions(numPartitions))
        timed = self._timed
        late = lambda: WindowLateRecordsNode(timed.graph, timed, w, s, keyed)  # noqa: E731
        if self._routes_dead_letters(onError, label):
            folded = self._folded_for_event_window(label, func, w.ms, s.ms, keyed)
            view = self._windows_of(folded._timed, func, invFunc, w, s, emit, part, keyed, late)
            view._dead_letters = folded._dead_letters
            return view
        return self._windows_of(timed, func, invFunc, w, s, emit, part, keyed, late)

    def _folded_for_event_window(self, label: str, func: Callable[[Any, Any], Any], window_ms: int, slide_ms: int,
                                 keyed: bool) -> TimedDStream[Any]:
        """This stream's records folded by key and pane inside a guard (``fold_event_partition``), as a timed
        stream whose ``deadLetters()`` has the records routed; one persisted tagged RDD."""
        from dstreams.dead_letters import fold_event_partition
        from dstreams.nodes.event_time import watermark_at

        timed = self._timed
        return self._routing_timed(label, lambda name, t: fold_event_partition(
            func, name, t.ms, window_ms, slide_ms, watermark_at(timed, t), keyed), False)

    def _windows_of(self, timed: DStreamNode, func: Callable[[Any, Any], Any],
                    invFunc: Callable[[Any, Any], Any] | None, w: Duration, s: Duration, emit: str, part: Any,
                    keyed: bool, late: Callable[[], DStreamNode]) -> EventWindowView[Any]:
        """The event-window operator over ``timed`` on the state backend in force."""
        from dstreams.nodes.event_window import EventWindow, emitted_windows

        node = self._state_node(EventWindow(func, invFunc, w, s, emit), part, parent=timed)
        changes = StateChangesNode(node.graph, node) if isinstance(node, StateViewNode) else None
        return EventWindowView(node, emitted_windows(w.ms, s.ms, keyed=keyed), "eventWindows", self._ssc, late,
                               source=changes)

    def reduceByEventWindow(self: TimedDStream[T], reduceFunc: Callable[[T, T], T], windowDuration: DurationLike,
                            slideDuration: DurationLike | None = None,
                            invReduceFunc: Callable[[T, T], T] | None = None,
                            emit: str = "final", *,
                            onError: str | None = None) -> EventWindowView[tuple[tuple[float, float], T]]:
        """The reduce of all records whose event time falls in each window (one state partition): records
        ``((start, end), value)``; otherwise (``onError`` too) as :meth:`reduceByKeyAndEventWindow`."""
        keyed = self.map(lambda x: (None, x), onError="fail")
        assert isinstance(keyed, TimedDStream)
        return keyed._event_window(reduceFunc, windowDuration, slideDuration, invReduceFunc, emit, 1, keyed=False,
                                   label="reduceByEventWindow", onError=onError)

    def sessionWindow(self: TimedDStream[tuple[K, V]], gap: DurationLike,
                      aggregate: Callable[[list[V]], Any] | None = None, numPartitions: int | None = None, *,
                      onError: str | None = None) -> EventWindowView[tuple[tuple[K, tuple[float, float]], Any]]:
        """Per key, sessions of activity separated by at least ``gap`` of event time without a record.

        Records are ``(key, value)`` pairs. A session runs from its first record's event time to its last
        one's plus ``gap``. Each session is emitted once, in the batch whose watermark reaches its end
        (``last event + gap <= W(t)``), with the records of the batches before: ``((key, (start, end)),
        aggregate(values))``, ``values`` in event-time order (ties in arrival order), bounds in seconds since
        the epoch (``aggregate`` defaults to the list itself). A record that arrives after others (also one
        behind the watermark) joins the open session it falls in, extends one, or merges the two it bridges;
        it is late only when the session it would belong to has closed (it is not within ``gap`` of an open
        session and its own ``eventTime + gap`` is at or below the watermark): then it is dropped and listed
        by ``lateRecords()`` of the returned stream. The open sessions are per-key state, hash-partitioned
        into ``numPartitions`` and checkpointed. ``onError="deadLetter"``: a session whose ``aggregate`` raises is
        not emitted; ``((key, (start, end)), values)`` goes to the returned stream's ``deadLetters()`` instead.
        """
        self._check_open()
        from dstreams.dead_letters import GuardedAggregate
        from dstreams.nodes.event_window import late_session_records
        from dstreams.spark.partitioned import hash_partitioner

        g = parse_duration(gap, "gap")
        part = hash_partitioner(self._default_partitions(numPartitions))
        aggregate = aggregate if aggregate is not None else list
        guarded = self._routes_dead_letters(onError, "sessionWindow")
        view = self._sessions_of(g, GuardedAggregate(aggregate) if guarded else aggregate, part,
                                 late_session_records(g.ms), guarded)
        if guarded:
            from dstreams.dead_letters import session_failures

            graph = self._timed.graph
            name = f"sessionWindow#{len(graph.dead_letter_nodes) + 1}"
            sessions = view._all_sessions
            assert sessions is not None

            def failures(rdds: list[Any], t: Any) -> Any:
                return rdds[0].mapPartitions(session_failures(name, t.ms))

            routed = TransformedNode(graph, [sessions], failures, "deadLetters")
            graph.dead_letter_nodes.append(routed)
            view._dead_letters = DStream(routed, self._ssc)
        return view

    def _sessions_of(self, g: Duration, aggregate: Callable[[list[Any]], Any], part: Any,
                     late: Callable[[Iterable[Any]], Iterator[Any]], guarded: bool) -> EventWindowView[Any]:
        """The session operator on the state backend in force; ``guarded``: its aggregate is a
        ``GuardedAggregate``, whose failed sessions the view leaves out (``_all_sessions`` is the node of every
        emitted session, failed ones included)."""
        from dstreams.dead_letters import sessions_without_failures
        from dstreams.nodes.event_window import SessionWindow, emitted_sessions

        graph = self._timed.graph
        emitted: Callable[[Iterable[Any]], Iterator[Any]] = emitted_sessions
        if guarded:
            emitted = lambda it: sessions_without_failures(emitted_sessions(it))  # noqa: E731
        node = self._state_node(SessionWindow(g, aggregate), part, parent=self._timed)
        # On the executor store the outputs are read from what each batch wrote, else from the state.
        source = StateChangesNode(graph, node) if isinstance(node, StateViewNode) else node
        out = EventWindowView(node, emitted, "sessions", self._ssc,
                              lambda: TransformedNode(graph, [source], lambda rdds, t: rdds[0].mapPartitions(late),
                                                      "sessionLate"), source=source)
        if guarded:
            out._all_sessions = TransformedNode(graph, [source],
                                                lambda rdds, t: rdds[0].mapPartitions(emitted_sessions), "sessions")
        return out

    # ------------------------------------------------------------------ late records
    def lateRecords(self: TimedDStream[T]) -> DStream[T]:
        """The records behind the watermark of their batch (event time below it), as they were before
        ``withEventTime``; counted in the batch metrics (``BatchInfo.event_time``'s ``lateRecords``). By default
        they stay in this stream and the event-time windows and sessions count them in the windows still open
        (their own ``lateRecords()`` list what each dropped); with ``withEventTime(..., dropLate=True)`` they
        are dropped from this stream."""
        self._check_open()
        if self._event is None:
            raise ValueError("lateRecords() needs the stream of one withEventTime: call it on each stream "
                             "before the union")
        return DStream(LateRecordsNode(self._timed.graph, self._event), self._ssc)


class TrackedDStream(StateView[tuple[Any, Any]]):
    """What ``track(..., timers=on_timer)`` or ``track(..., emit="updated")`` returns (and every ``track`` on the
    executor state store): ``(key, state)`` of the live keys each batch (only those with events or fired timers
    in it with ``emit="updated"``), and :meth:`emitted`, the records the functions emitted
    (:mod:`dstreams.nodes.timers`).

    On the RDD state ``node`` is the track node itself; on the executor state store it is the state's view
    (whole state, read lazily) and ``changes`` the node of what each batch wrote, which ``emit="updated"`` and
    :meth:`emitted` read (the keys the batch touched)."""

    def __init__(self, node: DStreamNode, ssc: GraphOwner, updated_only: bool = False,
                 changes: DStreamNode | None = None) -> None:
        from dstreams.nodes.timers import live_states, updated_states

        self._changes = changes
        super().__init__(node, updated_states if updated_only else live_states, "trackStates", ssc,
                         source=changes if updated_only else None)

    def emitted(self) -> DStream[Any]:
        """The records ``init``/``update``/``on_timer`` emitted with ``TrackUpdate(..., emit=[...])``, per batch."""
        self._check_open()
        if self._dead_letters is not None:  # made with onError="deadLetter": the failures are not the user's
            from dstreams.dead_letters import emitted_without_failures

            return self._all_emitted().mapPartitions(emitted_without_failures, preservesPartitioning=True)
        return self._all_emitted()

    def _routing_failures(self) -> Self:
        """This stream, made with guarded functions (``dstreams.dead_letters.guarded_track``), with the failures its
        functions emitted as :meth:`deadLetters` (stamped with their batch's time)."""
        from dstreams.dead_letters import track_failures

        raw = self._all_emitted()
        graph = self._node.graph

        def failures(rdds: list[Any], t: Any) -> Any:
            return rdds[0].mapPartitions(track_failures(t.ms))

        dead = raw._derive(TransformedNode(graph, [raw._node], failures, "deadLetters"))
        graph.dead_letter_nodes.append(dead._node)
        self._dead_letters = dead
        return self

    def _all_emitted(self) -> DStream[Any]:
        from dstreams.nodes.timers import emitted_records

        return StateView(self._state, emitted_records, "trackEmitted", self._ssc, source=self._changes)

