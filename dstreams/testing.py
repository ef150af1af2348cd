"""Testing your own pipelines: drive a context on a manual clock, batch by batch, and collect what streams held.

A pipeline is a function of its input batches, so a test feeds known batches (``ssc.queueStream``), moves a
:class:`~dstreams.clock.ManualClock` one batch at a time, waits for each batch, and compares what the outputs got
with what it expects: no sleeping, no timing. This module holds the two pieces every such test writes otherwise::

    import operator
    from dstreams import ManualClock, StreamingContext
    from dstreams.testing import collect, run_batches

    ssc = StreamingContext.local("1s", master="local[2]", clock=ManualClock())
    counts = ssc.queueStream([["a b a"], ["b"]]).flatMap(str.split).map(lambda w: (w, 1)).runningReduce(operator.add)
    got = collect(counts)
    ssc.start()
    try:
        run_batches(ssc, 2)
    finally:
        ssc.stop(stopSparkContext=False)
    assert sorted(got[2000]) == [("a", 2), ("b", 2)]

Contract:

* :func:`collect` registers an output (``foreachRDD``) on ``stream`` before ``start()``: the returned dict maps each
  batch's time (ms since the epoch) to the list of the records the stream held in that batch (``rdd.collect()``
  order; an empty batch maps to ``[]``). A batch run twice (a retry) keeps its last run's records.
* :func:`run_batches` moves the context's manual clock to each of the next ``batches`` batch times (the context's
  batch interval apart, aligned on its start time, after the clock's current time) and waits for each batch, at
  most ``timeout`` seconds each; it returns their ``BatchInfo``\\ s. With ``check=True`` (the default) an output
  that failed for good, or a batch dropped, fails the call with an ``AssertionError`` naming the batch and the
  error. The context must run on a :class:`~dstreams.clock.ManualClock` and be started.

This module uses the context only through its public methods (it imports nothing of the api layer).
"""

from __future__ import annotations

from typing import Any

from .clock import ManualClock

__all__ = ["collect", "run_batches"]


def collect(stream: Any) -> dict[int, list[Any]]:
    """The records ``stream`` holds, per batch time in ms (module docstring). Call it before ``ssc.start()``."""
    got: dict[int, list[Any]] = {}

    def save(t: Any, rdd: Any) -> None:
        got[round(t.timestamp() * 1000)] = rdd.collect()

    stream.foreachRDD(save)
    return got


def run_batches(ssc: Any, batches: int, timeout: float = 60.0, check: bool = True) -> list[Any]:
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
    t = zero + ((clock.time_ms() - zero) // step + 1) * step
    infos = []
    for _ in range(batches):
        clock.set_time(t)
        info = ssc.awaitBatch(t, timeout)
        if check:
            failed = {op.output_name: op.failure_reason for op in info.output_operations.values()
                      if op.failure_reason and op.failure_reason != "stopped"}
            if failed or getattr(info, "dropped", False):
                raise AssertionError(f"batch {t} {'was dropped' if getattr(info, 'dropped', False) else 'failed'}: "
                                     + "; ".join(f"{name}: {reason[-2000:]}" for name, reason in failed.items()))
        infos.append(info)
        t += step
    return infos
