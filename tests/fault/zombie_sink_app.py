"""The driver of the zombie-sink test (tests/fault/test_zombie_sink.py): ``python zombie_sink_app.py CKPT OUT``.

A word count over the deterministic generator source (1 s batches, a shuffle into 2 partitions), written
with both exactly-once sinks: ``saveAsTextFiles(OUT/counts)`` (output 0) and
``saveToStore(OUT/store, "json")`` (output 1), so the n-th pass through the ``sink-write`` fault point
(:mod:`dstreams.faults`) is output ``(n - 1) % 2`` of the ``(n + 1) // 2``-th batch.

Prints ``OUTPUT <batch ms> <output id> ok`` (or ``failed: <first line of the error>``) as each output ends
and ``BATCH <batch ms>`` as each batch ends, from a streaming listener.
"""

from __future__ import annotations

import operator
import os
import sys
from typing import Any

from dstreams import StreamingContext
from dstreams.clock import Clock
from dstreams.listener import StreamingListener

try:
    from .. import recovery_app
except ImportError:  # run as a script: python tests/fault/zombie_sink_app.py; recovery_app is in tests/
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import recovery_app  # type: ignore[no-redef]


def records(seed: int, t: int, partition: int, n: int) -> list[str]:
    return [f"w{(t // 1000 * 5 + partition * 3 + i) % 13}" for i in range(n)]


def build(sc: Any, checkpoint: str, out: str, clock: Clock | None = None) -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    counts = ssc.generatorStream(6, 2, seed=1, recordFunc=records).map(lambda w: (w, 1)).reduceByKey(operator.add, 2)
    counts.saveAsTextFiles(os.path.join(out, "counts"))
    counts.saveToStore(os.path.join(out, "store"), "json")
    return ssc


def read_outputs(out: str) -> dict[str, list[str]]:
    """Every committed batch of both outputs (``counts-<ms>`` folders and ``store/<ms>`` prefixes with a
    ``_SUCCESS``) -> its sorted lines."""
    store = os.path.join(out, "store")
    stored = recovery_app.read_outputs(store) if os.path.isdir(store) else {}
    return {**recovery_app.read_outputs(out), **{f"store-{int(t)}": lines for t, lines in stored.items()}}


class _Report(StreamingListener):
    def onOutputOperationCompleted(self, outputOperationCompleted: Any) -> None:
        op = outputOperationCompleted.outputOperationInfo()
        reason = op.failureReason()
        state = "ok" if reason is None else "failed: " + (reason.strip().splitlines() or [""])[-1]
        print(f"OUTPUT {op.batch_time_ms} {op.output_id} {state}", flush=True)

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        print(f"BATCH {batchCompleted.batchInfo().batch_time_ms}", flush=True)


if __name__ == "__main__":
    from dstreams import faults
    from dstreams.spark.sparkconf import create_spark_context

    faults.install(faults.FaultPlan.from_mapping(os.environ))  # the test's DSTREAMS_FAULT_*
    ckpt, out = sys.argv[1], sys.argv[2]
    sc = create_spark_context("local[2]", "dstreams-zombie-sink")
    ssc = StreamingContext.getOrCreate(ckpt, lambda: build(sc, ckpt, out))
    ssc.addStreamingListener(_Report())
    ssc.start()
    print("STARTED", flush=True)
    ssc.awaitTermination()
