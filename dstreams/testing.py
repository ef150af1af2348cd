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
  ``AssertionError`` naming the batch and the error. The context must run on a
  :class:`~dstreams.clock.ManualClock` and be started.
* :func:`run_pipeline` feeds ``inputs`` (one list of records per batch, ``numPartitions`` partitions each) through
  ``operation`` in a :func:`manual_context`, runs ``batches`` batches (default: one per input; later batches get
  no input) and returns what the output stream held in each, in batch order; ``operation`` may return a dict of
  named streams, and then a dict of those lists comes back. Batches are checked as :func:`run_batches` does.

This module is built on the public API only (``from dstreams import StreamingContext``, the context's public
methods), as a user's own test is: it sits beside the applications, above the api layer, and nothing of the
library imports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .clock import ManualClock

__all__ = ["collect", "manual_context", "run_batches", "run_pipeline"]


def sorted_records(records: list[Any]) -> list[Any]:
    """``records`` sorted by value, or by ``repr`` when they do not compare (mixed types, dicts, None in tuples)."""
    try:
        return sorted(records)
    except TypeError:
        return sorted(records, key=repr)


@contextlib.contextmanager
def manual_context(batchDuration: Any = 1.0, *, sc: Any = None, checkpoint: str | None = None, start_ms: int = 0,
                   master: str = "local[2]") -> Iterator[Any]:
    """A streaming context on a manual clock at ``start_ms``, stopped when the block ends (module docstring)."""
    from dstreams import StreamingContext

    clock = ManualClock(start_ms)
    if sc is None:
        ssc = StreamingContext.local(batchDuration, master=master, appName="dstreams-test", clock=clock)
    else:
        ssc = StreamingContext(sc, batchDuration, clock=clock)
    try:
        if checkpoint is not None:
            ssc.checkpoint(checkpoint)
        yield ssc
    finally:
        ssc.stop(stopSparkContext=False)


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
                backlog: bool = False) -> list[Any]:
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
            failed = {op.output_name: op.failure_reason for op in info.output_operations.values()
                      if op.failure_reason and op.failure_reason != "stopped"}
            if failed or getattr(info, "dropped", False):
                raise AssertionError(f"batch {t} {'was dropped' if getattr(info, 'dropped', False) else 'failed'}: "
                                     + "; ".join(f"{name}: {reason[-2000:]}" for name, reason in failed.items()))
        infos.append(info)
    return infos
