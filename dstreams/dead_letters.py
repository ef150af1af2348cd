"""Dead letters: the records a user function raised on, routed to a stream of their own instead of failing the batch.

Contract:

* An operator routes its dead letters when it is made with ``onError="deadLetter"`` (``map``, ``flatMap``,
  ``filter``, ``mapValues``, ``flatMapValues``) or when ``spark.dstreams.onRecordError=deadLetter`` makes that the
  default. Its function is then called once per record inside a guard: a record for which it raises becomes one
  :class:`DeadLetter` (the input record, the operator, the error, the batch time) and yields no output; the other
  records go on as without the guard. ``flatMap``'s elements of one record are all emitted or (it raised while
  they were made) none.
* The operator's RDD of a batch holds tagged records, ``(GOOD, output)`` and ``(DEAD, DeadLetter)``
  (:func:`tag_partition`); the stream the user gets reads the GOOD ones and ``deadLetters()`` the DEAD ones. The
  tagged RDD is persisted for the batch, so the user's function runs once per record when both are used.
* Batches are deterministic (the engine's premise): a re-run of a batch (a retry, a replay after a restart) routes
  the same records to the dead letters, and any exactly-once sink saves the dead-letter stream exactly once.
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


def _guarded(kind: str, f: Callable[[Any], Any], operator: str, batch_ms: int) -> Callable[[Any], Iterator[Any]]:
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


def tag_partition(kind: str, f: Callable[[Any], Any], operator: str, batch_ms: int
                  ) -> Callable[[int, Iterator[Any]], Iterator[Any]]:
    """The partition function of an operator with dead letters (module docstring)."""
    one = _guarded(kind, f, operator, batch_ms)

    def run(_: int, it: Iterator[Any]) -> Iterator[Any]:
        for x in it:
            yield from one(x)

    return run


def good(records: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """The outputs of a tagged partition."""
    return (v for tag, v in records if tag == GOOD)


def dead(records: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """The dead letters of a tagged partition."""
    return (v for tag, v in records if tag == DEAD)
