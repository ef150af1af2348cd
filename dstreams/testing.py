"""Testing your own pipelines: drive a context on a manual clock, batch by batch, and collect what streams held.

A pipeline is a function of its input batches, so a test feeds known batches (``ssc.queueStream``), moves a
:class:`~dstreams.clock.ManualClock` one batch at a time, waits for each batch, and compares what the outputs got
with what it expects: no sleeping, no timing. The shortest form, as Spark's ``TestSuiteBase.testOperation``::

    import operator
    from dstreams.testing import run_pipeline

    got = run_pipeline(lambda lines: lines.flatMap(str.split).map(lambda w: (w, 1)).runningReduce(operator.add),
                       [["a b a"], ["b"]], sort=True)
    assert got == [[("a", 2), ("b", 1)], [("a", 2), ("b", 2)]]

and the pieces it is made of, for a test that needs more than one input, a checkpoint or a look between batches::

    from dstreams.testing import collect, manual_context, run_batches

    with manual_context("1s") as ssc:
        counts = ssc.queueStream([["a b a"], ["b"]]).flatMap(str.split).map(lambda w: (w, 1)).runningReduce(
            operator.add)
        got = collect(counts, sort=True)
        ssc.start()
        run_batches(ssc, 2)
    assert got[2000] == [("a", 2), ("b", 2)]

Contract:

* :func:`manual_context` makes a :class:`~dstreams.StreamingContext` on a new :class:`~dstreams.clock.ManualClock`
  at ``start_ms`` (default 0: the first batch is at one batch interval), on ``sc`` or the active SparkContext (one
  is started on ``master`` when none is), checkpointing to ``checkpoint`` when given, and stops it when the block
  ends, however it ends (``stopSparkContext=False``: the SparkContext stays for the next test).
* :func:`collect` registers an output (``foreachRDD``) on ``stream`` before ``start()``: the returned dict maps each
  batch's time (ms since the epoch) to the list of the records the stream held in that batch (``rdd.collect()``
  order, or sorted with ``sort=True``: by value, or by ``repr`` when the records do not compare; an empty batch
  maps to ``[]``). A batch run twice (a retry) keeps its last run's records.
* :func:`run_batches` moves the context's manual clock to each of the next ``batches`` batch times (the context's
  batch interval apart, aligned on its start time, after the clock's current time) and waits for each batch, at
  most ``timeout`` seconds each; it returns their ``BatchInfo``\\ s. With ``backlog=True`` the clock jumps to the
  last of them at once (the batches are generated together, as after a pause) before the waits. With
  ``check=True`` (the default) an output that failed for good, or a batch dropped, fails the call with an
  ``AssertionError`` naming the batch and the error. With ``flush_checkpoints=True`` it waits, after each batch,
  for the checkpoints started so far to be written and adopted (as :func:`run_until` does). The context must run
  on a :class:`~dstreams.clock.ManualClock` and be started.
* :func:`run_pipeline` feeds ``inputs`` (one list of records per batch, ``numPartitions`` partitions each) through
  ``operation`` in a :func:`manual_context`, runs ``batches`` batches (default: one per input; later batches get
  no input) and returns what the output stream held in each, in batch order; ``operation`` may return a dict of
  named streams, and then a dict of those lists comes back. Batches are checked as :func:`run_batches` does.
* :func:`app_context` is :func:`manual_context` for a pipeline your application builds itself: ``setup(clock)``
  makes the :class:`~dstreams.StreamingContext` on the :class:`~dstreams.clock.ManualClock` it is handed (at
  ``start_ms``). With ``checkpoint``, the context is ``StreamingContext.getOrCreate(checkpoint, ...,
  clock=clock)``'s: restored from the checkpoint there when it holds a stream graph (``setup`` is then not called,
  PySpark's contract; the restored context runs on ``clock`` all the same), made by ``setup`` otherwise; a restart
  test runs a second :func:`app_context` on the same folder, its clock at the time the driver comes back.
  ``rebuildGraph`` and ``storeOptions`` go to ``getOrCreate``. Without ``checkpoint``, the context is
  ``setup(clock)`` itself (a plain start). The context is stopped when the block ends, however it ends
  (``stopGraceFully`` as given; the SparkContext stays).
* :func:`run_until` starts the context when it is not started yet, moves its manual clock to ``until_ms`` at once
  (never back: a clock already past it stays), so the batches due are generated together, and waits for every
  batch from the context's start time through ``until_ms``, at most ``timeout`` seconds each, checked as
  :func:`run_batches` does (``check``); it returns their ``BatchInfo``\\ s. With ``flush_checkpoints=True`` it also
  waits, after each batch, for the checkpoints started so far to be written and adopted, so that a context stopped
  next (a driver "dying") leaves them behind for a restart.
* :func:`run_through` is a fault-free reference run: an :func:`app_context` of ``setup`` (its clock at
  ``start_ms``, the zero time of the run it is compared with) run with :func:`run_until` through ``until_ms``
  and stopped; it returns the ``BatchInfo``\\ s. A test compares what the reference wrote with what a run with
  faults (kills, restarts) wrote.

:func:`manual_context` also forwards ``remember`` (``ssc.remember``) and ``concurrentBatches`` to the context, and
stops it with ``stopGraceFully`` as given.

This module is built on the public API only (``from dstreams import StreamingContext``, the context's public
methods), as a user's own test is: it sits beside the applications, above the api layer, and nothing of the
library imports it. ``flush_checkpoints`` waits with ``StreamingContext.awaitCheckpoints``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .clock import ManualClock

if TYPE_CHECKING:
    from dstreams import BatchInfo, StreamingContext

__all__ = ["app_context", "collect", "manual_context", "run_batches", "run_pipeline", "run_through", "run_until"]


def sorted_records(records: list[Any]) -> list[Any]:
    """``records`` sorted by value, or by ``repr`` when they do not compare (mixed types, dicts, None in tuples)."""
    try:
        return sorted(records)
    except TypeError:
        return sorted(records, key=repr)


@contextlib.contextmanager
def manual_context(batchDuration: Any = 1.0, *, sc: Any = None, checkpoint: str | None = None, start_ms: int = 0,
                   master: str = "local[2]", remember: Any = None, concurrentBatches: int | None = None,
                   stopGraceFully: bool = False) -> Iterator[Any]:
    """A streaming context on a manual clock at ``start_ms``, stopped when the block ends (module docstring)."""
    from dstreams import StreamingContext

    clock = ManualClock(start_ms)
    if sc is None:
        ssc = StreamingContext.local(batchDuration, master=master, appName="dstreams-test", clock=clock,
                                     concurrentBatches=concurrentBatches)
    else:
        ssc = StreamingContext(sc, batchDuration, clock=clock, concurrentBatches=concurrentBatches)
    try:
        if checkpoint is not None:
            ssc.checkpoint(checkpoint)
        if remember is not None:
            ssc.remember(remember)
        yield ssc
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=stopGraceFully)


@contextlib.contextmanager
def app_context(setup: Callable[[ManualClock], StreamingContext], *, checkpoint: str | None = None,
                start_ms: int = 0, rebuildGraph: bool = False, stopGraceFully: bool = False,
                **storeOptions: Any) -> Iterator[StreamingContext]:
    """The context ``setup(clock)`` makes on a manual clock at ``start_ms``, or, with ``checkpoint``, the one
    ``StreamingContext.getOrCreate`` restores from there; stopped when the block ends (module docstring)."""
    from dstreams import StreamingContext

    clock = ManualClock(start_ms)
    if checkpoint is None:
        if rebuildGraph or storeOptions:
            raise ValueError("rebuildGraph and storeOptions go to getOrCreate: pass checkpoint too")
        ssc = setup(clock)
    else:
        ssc = StreamingContext.getOrCreate(checkpoint, lambda: setup(clock), rebuildGraph=rebuildGraph, clock=clock,
                                           **storeOptions)
    if not isinstance(ssc.clock, ManualClock):
        ssc.stop(stopSparkContext=False)
        raise TypeError("app_context's setup must make the context on the clock it is handed "
                        "(StreamingContext(sc, batchDuration, clock=clock))")
    try:
        yield ssc
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=stopGraceFully)


def collect(stream: Any, sort: bool = False) -> dict[int, list[Any]]:
    """The records ``stream`` holds, per batch time in ms (module docstring). Call it before ``ssc.start()``."""
    got: dict[int, list[Any]] = {}

    def save(t: Any, rdd: Any) -> None:
        rows = rdd.collect()
        got[round(t.timestamp() * 1000)] = sorted_records(rows) if sort else rows

    stream.foreachRDD(save)
    return got


def run_pipeline(operation: Callable[[Any], Any], inputs: Sequence[Sequence[Any]], *, batches: int | None = None,
                 batchDuration: Any = 1.0, sort: bool = False, numPartitions: int = 2, sc: Any = None,
                 checkpoint: str | None = None, timeout: float = 60.0) -> Any:
    """What ``operation``'s stream(s) held per batch, fed ``inputs`` one list per batch (module docstring)."""
    if batches is None:
        batches = len(inputs)
    with manual_context(batchDuration, sc=sc, checkpoint=checkpoint) as ssc:
        spark = ssc.sparkContext
        source = ssc.queueStream([spark.parallelize(list(batch), numPartitions) for batch in inputs])
        result = operation(source)
        named = result if isinstance(result, Mapping) else {"": result}
        got = {name: collect(stream, sort=sort) for name, stream in named.items()}
        ssc.start()
        times = [info.batch_time.ms for info in run_batches(ssc, batches, timeout=timeout)]
    lists = {name: [seen.get(t, []) for t in times] for name, seen in got.items()}
    return lists if isinstance(result, Mapping) else lists[""]


def run_batches(ssc: Any, batches: int, timeout: float = 60.0, check: bool = True,
                backlog: bool = False, flush_checkpoints: bool = False) -> list[Any]:
    """Run the next ``batches`` batches of the started context ``ssc`` on its manual clock (module docstring)."""
    clock = ssc.clock
    if not isinstance(clock, ManualClock):
        raise TypeError("run_batches moves the context's clock, which must be a ManualClock: make the context with "
                        "clock=ManualClock() (dstreams.ManualClock)")
    start = ssc.startTime
    if start is None:
        raise RuntimeError("run_batches runs a started context: call ssc.start() first")
    if not isinstance(batches, int) or batches < 0:
        raise ValueError(f"batches must be a count (an int >= 0), got {batches!r}")
    step, zero = ssc.batchDuration.ms, start.ms - ssc.batchDuration.ms
    first = zero + ((clock.time_ms() - zero) // step + 1) * step
    if backlog and batches:
        clock.set_time(first + (batches - 1) * step)
    infos = []
    for t in range(first, first + batches * step, step):
        if not backlog:
            clock.set_time(t)
        info = ssc.awaitBatch(t, timeout)
        if check:
            _check_batch(info, t)
        if flush_checkpoints:
            _await_checkpoints(ssc, timeout)
        infos.append(info)
    return infos


def run_until(ssc: StreamingContext, until_ms: int, *, timeout: float = 120.0, check: bool = True,
              flush_checkpoints: bool = False) -> list[BatchInfo]:
    """Start ``ssc`` if need be, move its manual clock to ``until_ms`` and wait for every batch from its start time
    through ``until_ms`` (module docstring)."""
    clock = ssc.clock
    if not isinstance(clock, ManualClock):
        raise TypeError("run_until moves the context's clock, which must be a ManualClock: make the context with "
                        "clock=ManualClock() (dstreams.ManualClock)")
    if ssc.getState() == "INITIALIZED":
        ssc.start()
    start, batch = ssc.startTime, ssc.batchDuration
    if start is None or batch is None:
        raise RuntimeError("run_until runs a started context")
    clock.set_time(max(clock.time_ms(), until_ms))
    infos = []
    for t in range(start.ms, until_ms + 1, batch.ms):
        info = ssc.awaitBatch(t, timeout)
        if check:
            _check_batch(info, t)
        if flush_checkpoints:
            _await_checkpoints(ssc, timeout)
        infos.append(info)
    return infos


def run_through(setup: Callable[[ManualClock], StreamingContext], until_ms: int, *, start_ms: int = 0,
                checkpoint: str | None = None, timeout: float = 300.0) -> list[BatchInfo]:
    """A fault-free reference run of ``setup``'s context from ``start_ms`` through ``until_ms`` (module
    docstring)."""
    with app_context(setup, checkpoint=checkpoint, start_ms=start_ms) as ssc:
        return run_until(ssc, until_ms, timeout=timeout)


def _check_batch(info: Any, t: int) -> None:
    """Raise ``AssertionError`` naming batch ``t`` and the errors when one of its outputs failed for good (a stop
    is no failure) or the batch was dropped."""
    failed = {op.output_name: op.failure_reason for op in info.output_operations.values()
              if op.failure_reason and op.failure_reason != "stopped"}
    dropped = getattr(info, "dropped", False)
    if failed or dropped:
        raise AssertionError(f"batch {t} {'was dropped' if dropped else 'failed'}: "
                             + "; ".join(f"{name}: {reason[-2000:]}" for name, reason in failed.items()))


def _await_checkpoints(ssc: StreamingContext, timeout: float = 60.0) -> None:
    """Wait for the checkpoints the started context ``ssc`` has begun writing to be written and adopted
    (``StreamingContext.awaitCheckpoints``; nothing to wait for without a checkpoint location)."""
    ssc.awaitCheckpoints(timeout)
