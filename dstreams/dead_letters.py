"""Dead letters: the records a user function raised on, routed to a stream of their own instead of failing the batch.

Contract:

* An operator routes its dead letters when it is made with ``onError="deadLetter"`` (``map``, ``flatMap``,
  ``filter``, ``mapValues``, ``flatMapValues``, also on a stream with event time, whose good records keep it) or
  when ``spark.dstreams.onRecordError=deadLetter`` makes that the default. Its function is then called once per
  record inside a guard: a record for which it raises becomes one :class:`DeadLetter` (the input record, the
  operator, the error, the batch time) and yields no output; the other records go on as without the guard.
  ``flatMap``'s elements of one record are all emitted or (it raised while they were made) none.
* The operator's RDD of a batch holds tagged records, ``(GOOD, output)`` and ``(DEAD, DeadLetter)``
  (:func:`tag_partition`); the stream the user gets reads the GOOD ones and ``deadLetters()`` the DEAD ones. The
  tagged RDD is persisted for the batch, so the user's function runs once per record when both are used.
* Batches are deterministic (the engine's premise): a re-run of a batch (a retry, a replay after a restart) routes
  the same records to the dead letters, and any exactly-once sink saves the dead-letter stream exactly once.
* Reduces (``reduceByKey``, ``reduce``, ``runningReduce``, ``reduceByKeyAndWindow``, ``reduceByWindow`` with
  ``onError="deadLetter"``): the records of each partition are first folded by key in input order inside a guard
  (:func:`fold_partition`), Kafka Streams' rule (KIP-1034): when ``func(acc, value)`` raises, the record being added
  is the dead letter and the key's accumulator stays as it was; except that when the accumulator is still the
  key's first value and that value cannot be combined with itself while the new one can (a ``None`` first), the
  first record is the dead letter and the new value starts the key again. A key's value that is alone in its
  partition is a dead letter when ``func(value, value)`` raises (a ``None`` where numbers are summed). A record that
  is not a ``(key, value)`` pair, or whose key cannot be hashed, is a dead letter too. The operator then reduces the
  folded pairs as without the guard: a later combine of two partitions' results, of a result with the state or
  the window, or an ``invFunc`` that raises still fails the batch (no single record can be blamed for it). So a
  value that combines with itself but not with the key's others (a string among numbers) is caught only when a
  partition holds both; validate such values in a ``map(..., onError="deadLetter")`` before the reduce.
* ``updateStateByKey(..., onError="deadLetter")``: a key whose ``updateFunc(newValues, lastState)`` raises keeps its
  state (a key without one gets none) and ``(key, newValues)`` is the dead letter (:class:`GuardedUpdate`); the other
  keys are updated as without the guard.
* ``track(..., onError="deadLetter")``: an ``init(key, event)`` or ``update(key, state, event)`` that raises leaves the
  key's state as it was before that event (a new key gets none) and ``(key, event)`` is the dead letter; an
  ``on_timer(key, state, timer)`` that raises leaves the state as it was, the timer fired, and ``(key, timer)`` is the
  dead letter (:func:`guarded_track`: the failure travels as an emitted :class:`TrackFailure`, which ``emitted()``
  leaves out and ``deadLetters()`` reads). The key's other events go on, in order.
* What is not routed: an error of the operator's input (a record that cannot be unpickled), of the engine, or a
  ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``): those fail the task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

#: The tags of an operator's RDD with dead letters.
GOOD, DEAD = 0, 1

#: ``onError`` values: fail the batch (the default), or route the record to the dead letters.
ON_ERROR = ("fail", "deadLetter")

#: How long the error text of a dead letter may be (characters; the rest is cut with "...").
MAX_ERROR_CHARS = 2000


class DeadLetter(NamedTuple):
    """A record a user function raised on: ``record`` (the operator's input record, as it was), ``operator`` (its
    name in the graph, e.g. ``"map"``), ``error`` (``"ValueError: message"``) and ``batchTime`` (the batch's time,
    ms since the epoch)."""

    record: Any
    operator: str
    error: str
    batchTime: int


def describe_error(e: BaseException) -> str:
    """``"<type>: <message>"``, cut to :data:`MAX_ERROR_CHARS`."""
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def check_on_error(value: str, where: str) -> str:
    if value not in ON_ERROR:
        raise ValueError(f"{where}: onError must be one of {', '.join(map(repr, ON_ERROR))}, got {value!r}")
    return value


def guarded_record(kind: str, f: Callable[[Any], Any], operator: str, batch_ms: int
                   ) -> Callable[[Any], Iterator[Any]]:
    """The tagged outputs of one record for ``kind`` (map, filter, flatMap, mapValues, flatMapValues)."""

    def dead(x: Any, e: Exception) -> tuple[int, DeadLetter]:
        return DEAD, DeadLetter(x, operator, describe_error(e), batch_ms)

    if kind == "map":
        def one(x: Any) -> Iterator[Any]:
            try:
                y = f(x)
            except Exception as e:  # noqa: BLE001 - the record goes to the dead letters
                yield dead(x, e)
                return
            yield GOOD, y
    elif kind == "filter":
        def one(x: Any) -> Iterator[Any]:
            try:
                keep = f(x)
            except Exception as e:  # noqa: BLE001
                yield dead(x, e)
                return
            if keep:
                yield GOOD, x
    elif kind == "flatMap":
        def one(x: Any) -> Iterator[Any]:
            try:
                ys = list(f(x))
            except Exception as e:  # noqa: BLE001
                yield dead(x, e)
                return
            for y in ys:
                yield GOOD, y
    elif kind == "mapValues":
        def one(x: Any) -> Iterator[Any]:
            try:
                y = (x[0], f(x[1]))
            except Exception as e:  # noqa: BLE001
                yield dead(x, e)
                return
            yield GOOD, y
    elif kind == "flatMapValues":
        def one(x: Any) -> Iterator[Any]:
            try:
                k, ys = x[0], list(f(x[1]))
            except Exception as e:  # noqa: BLE001
                yield dead(x, e)
                return
            for y in ys:
                yield GOOD, (k, y)
    else:
        raise ValueError(f"no dead-letter guard for {kind!r}")
    return one


def _probe(func: Callable[[Any, Any], Any], a: Any, b: Any) -> Exception | None:
    """What ``func(a, b)`` raises, if anything (its result is not used)."""
    try:
        func(a, b)
    except Exception as e:  # noqa: BLE001 - a probe: only whether it raises matters
        return e
    return None


def _pair(x: Any, operator: str, batch_ms: int) -> tuple[Any, Any] | DeadLetter:
    """``x`` as a reduce's ``(key, value)``, or the dead letter of a record that is not one."""
    if type(x) is tuple and len(x) == 2:
        return x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[1]
    return DeadLetter(x, operator,
                      f"TypeError: {operator} needs (key, value) pairs, got an element of type {type(x).__name__}",
                      batch_ms)


def _fold(func: Callable[[Any, Any], Any], operator: str, batch_ms: int,
          items: Iterable[tuple[Any, Any, Any] | DeadLetter]) -> Iterator[tuple[int, Any]]:
    """The guarded fold of :func:`fold_partition` over ``items``: ``(key, value, record)`` (``record``: what a dead
    letter shows) or a :class:`DeadLetter` already made, which is passed on."""
    acc: dict[Any, Any] = {}
    first: dict[Any, Any] = {}  # key -> its one record, while the key's accumulator is that record's value
    for item in items:
        if type(item) is DeadLetter:
            yield DEAD, item
            continue
        k, v, x = item  # type: ignore[misc]
        try:
            present = k in acc
        except TypeError as e:  # an unhashable key
            yield DEAD, DeadLetter(x, operator, describe_error(e), batch_ms)
            continue
        if not present:
            acc[k] = v
            first[k] = x
            continue
        try:
            acc[k] = func(acc[k], v)
        except Exception as e:  # noqa: BLE001 - a record goes to the dead letters
            if k in first and _probe(func, acc[k], acc[k]) is not None and _probe(func, v, v) is None:
                yield DEAD, DeadLetter(first[k], operator, describe_error(e), batch_ms)
                acc[k], first[k] = v, x
            else:
                yield DEAD, DeadLetter(x, operator, describe_error(e), batch_ms)
            continue
        if first:
            first.pop(k, None)
    for k, one in first.items():  # a key's lone value: is it a value func can combine at all?
        failure = _probe(func, acc[k], acc[k])
        if failure is not None:
            yield DEAD, DeadLetter(one, operator, describe_error(failure), batch_ms)
            del acc[k]
    for kv in acc.items():
        yield GOOD, kv


def fold_partition(func: Callable[[Any, Any], Any], operator: str, batch_ms: int, key: Any = None,
                   pairs: bool = True) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    """A reduce's guarded map-side fold (module docstring): a partition's ``(key, value)`` records (``pairs=False``:
    values, all of ``key``) folded by key with ``func`` in input order, tagged: ``(DEAD, DeadLetter)`` for each
    record routed, then ``(GOOD, (key, folded))`` per key, in first-seen order."""

    def items(it: Iterable[Any]) -> Iterator[tuple[Any, Any, Any] | DeadLetter]:
        for x in it:
            if not pairs:
                yield key, x, x
                continue
            kv = _pair(x, operator, batch_ms)
            yield kv if type(kv) is DeadLetter else (kv[0], kv[1], x)

    def run(_: int, it: Iterable[Any]) -> Iterator[Any]:
        return _fold(func, operator, batch_ms, items(it))

    return run


def fold_event_partition(func: Callable[[Any, Any], Any], operator: str, batch_ms: int, window_ms: int,
                         slide_ms: int, watermark: int | None, keyed: bool = True
                         ) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    """An event-time window reduce's guarded map-side fold: a partition's timed records ``(event_ms, (key, value))``
    folded by key and pane (the slide-long slice of event time whose records belong to the same windows) with
    ``func`` in input order, by :func:`fold_partition`'s rules; each fold is tagged ``(GOOD, (pane start, (key,
    folded)))``, which counts in exactly the windows of its records. A record late for every one of its windows
    (the newest ends at or below ``watermark``, the batch's) is left out without calling ``func``: the window
    operator would drop it, and its ``lateRecords()`` (read from the operator's input) lists it. A dead letter
    shows the record as the user gave it (``keyed=False``: the value alone)."""

    def run(_: int, it: Iterable[Any]) -> Iterator[Any]:
        def items() -> Iterator[tuple[Any, Any, Any] | DeadLetter]:
            for ts, x in it:
                pane = ts - ts % slide_ms
                if watermark is not None and pane + window_ms <= watermark:
                    continue
                shown = x if keyed else x[1]  # reduceByEventWindow's records are (None, value)
                kv = _pair(x, operator, batch_ms)
                yield kv if type(kv) is DeadLetter else ((kv[0], pane), kv[1], shown)

        for tag, out in _fold(func, operator, batch_ms, items()):
            if tag == GOOD:
                (k, pane), folded = out
                yield GOOD, (pane, (k, folded))
            else:
                yield tag, out

    return run


class FailedAggregate(NamedTuple):
    """A session whose ``aggregate`` raised (:class:`GuardedAggregate`): its values and the error, in place of the
    aggregate in the state's emitted sessions; the user's stream leaves it out, ``deadLetters()`` reads it."""

    values: list[Any]
    error: str


class GuardedAggregate:
    """``sessionWindow(..., onError="deadLetter")``'s ``aggregate``: a session whose aggregate raises becomes a
    :class:`FailedAggregate` instead of failing the task."""

    def __init__(self, aggregate: Callable[[list[Any]], Any]) -> None:
        self.aggregate = aggregate

    def __call__(self, values: list[Any]) -> Any:
        try:
            return self.aggregate(values)
        except Exception as e:  # noqa: BLE001 - the session goes to the dead letters
            return FailedAggregate(values, describe_error(e))


def sessions_without_failures(records: Iterable[Any]) -> Iterator[Any]:
    """The emitted sessions ``((key, (start, end)), aggregate)`` whose aggregate did not raise."""
    return (r for r in records if type(r[1]) is not FailedAggregate)


def session_failures(operator: str, batch_ms: int) -> Callable[[Iterable[Any]], Iterator[DeadLetter]]:
    """Partition function over emitted sessions: a :class:`DeadLetter` ``(((key, (start, end)), values), ...)`` per
    session whose aggregate raised."""

    def run(records: Iterable[Any]) -> Iterator[DeadLetter]:
        for session, value in records:
            if type(value) is FailedAggregate:
                yield DeadLetter((session, value.values), operator, value.error, batch_ms)

    return run


class FailedUpdate(NamedTuple):
    """The state of a key whose update function raised (:class:`GuardedUpdate`): ``state`` (the key's state before,
    None for a key that had none, which it keeps), the batch's ``values`` of the key, the ``error`` and the
    ``batchTime`` of that batch. Streams the user reads never hold it: the state stream shows ``state``, the dead
    letters ``(key, values)``."""

    state: Any
    values: list[Any]
    error: str
    batchTime: int


def unwrap_state(value: Any) -> Any:
    """A state value as the user sees it (a :class:`FailedUpdate`'s ``state``)."""
    return value.state if type(value) is FailedUpdate else value


class GuardedUpdate:
    """``updateStateByKey``'s ``updateFunc`` with dead letters: :meth:`for_batch` gives the function a state node calls
    in one batch; a raise keeps the key's state and records the failure in it (:class:`FailedUpdate`)."""

    def __init__(self, update: Callable[[list[Any], Any], Any], keep_idle: bool) -> None:
        self.update = update
        #: ``updateIdleKeys=False`` on the RDD state: a key without new values keeps its state without a call.
        self.keep_idle = keep_idle

    def for_batch(self, batch_ms: int) -> Callable[[list[Any], Any], Any]:
        update, keep_idle = self.update, self.keep_idle

        def call(values: list[Any], last: Any) -> Any:
            if type(last) is FailedUpdate:  # an earlier batch's failure: the state is as it was before it
                last = last.state
            if last is None and not values:
                return None  # the placeholder of a key whose first values failed
            if keep_idle and not values:
                return last
            try:
                return update(values, last)
            except Exception as e:  # noqa: BLE001 - the key's values go to the dead letters
                return FailedUpdate(last, list(values), describe_error(e), batch_ms)

        return call

    def __call__(self, values: list[Any], last: Any) -> Any:
        raise RuntimeError("a GuardedUpdate is called through for_batch(batch_ms) (dead_letters.for_batch): a state "
                           "node that calls it directly would lose the batch time of its dead letters")


def for_batch(f: Callable[..., Any], batch_ms: int) -> Callable[..., Any]:
    """The function a state node calls in the batch at ``batch_ms``: ``f.for_batch(batch_ms)`` for a function that
    needs its batch (:class:`GuardedUpdate`), else ``f``."""
    bind = getattr(f, "for_batch", None)
    return bind(batch_ms) if bind is not None else f


class TrackFailure(NamedTuple):
    """A ``track`` function's failure, emitted in place of its result (:func:`guarded_track`)."""

    record: Any
    operator: str
    error: str


def guarded_track(init: Callable[[Any, Any], Any], update: Callable[[Any, Any, Any], Any],
                  on_timer: Callable[[Any, Any, Any], Any] | None, operator: str
                  ) -> tuple[Callable[[Any, Any], Any], Callable[[Any, Any, Any], Any],
                             Callable[[Any, Any, Any], Any] | None]:
    """``track``'s functions with dead letters (module docstring): a raise returns the state as it was with a
    :class:`TrackFailure` emitted."""
    from dstreams.nodes.timers import TrackUpdate

    def failed(state: Any, record: Any, e: Exception) -> Any:
        return TrackUpdate(state, emit=[TrackFailure(record, operator, describe_error(e))])

    def g_init(k: Any, ev: Any) -> Any:
        try:
            return init(k, ev)
        except Exception as e:  # noqa: BLE001 - the event goes to the dead letters
            return failed(None, (k, ev), e)

    def g_update(k: Any, s: Any, ev: Any) -> Any:
        try:
            return update(k, s, ev)
        except Exception as e:  # noqa: BLE001
            return failed(s, (k, ev), e)

    if on_timer is None:
        return g_init, g_update, None

    def g_timer(k: Any, s: Any, timer: Any) -> Any:
        try:
            return on_timer(k, s, timer)
        except Exception as e:  # noqa: BLE001
            return failed(s, (k, timer), e)

    return g_init, g_update, g_timer


def emitted_without_failures(records: Iterable[Any]) -> Iterator[Any]:
    """A partition of ``emitted()`` as the user sees it: without the :class:`TrackFailure` records."""
    return (x for x in records if type(x) is not TrackFailure)


def track_failures(batch_ms: int) -> Callable[[Iterable[Any]], Iterator[DeadLetter]]:
    """The dead letters of the batch at ``batch_ms`` among a partition of its emitted records."""

    def run(records: Iterable[Any]) -> Iterator[DeadLetter]:
        for x in records:
            if type(x) is TrackFailure:
                yield DeadLetter(x.record, x.operator, x.error, batch_ms)

    return run


def tag_partition(kind: str, f: Callable[[Any], Any], operator: str, batch_ms: int
                  ) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    """The partition function of an operator with dead letters (module docstring)."""
    one = guarded_record(kind, f, operator, batch_ms)

    def run(_: int, it: Iterable[Any]) -> Iterator[Any]:
        for x in it:
            yield from one(x)

    return run


def good(records: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """The outputs of a tagged partition."""
    return (v for tag, v in records if tag == GOOD)


def dead(records: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """The dead letters of a tagged partition."""
    return (v for tag, v in records if tag == DEAD)
