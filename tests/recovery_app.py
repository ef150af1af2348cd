"""The stateful pipeline used by the failover tests (also runnable as a driver process).

runningReduce + a 10 s invertible window + track over the deterministic generator source, each
written with saveAsTextFiles (exactly once) under ``<out>/<name>-<batch ms>``.
"""

from __future__ import annotations

import functools
import operator
import os
import sys

from dstreams import StreamingContext
from dstreams.clock import Clock


def records(seed: int, t: int, partition: int, n: int):
    return [f"w{(t // 1000 * 7 + partition * 3 + i) % 11}" for i in range(n)]


#: With ``RECOVERY_APP_STATE_KEYS=N`` the app adds a large state: ``updateStateByKey`` with an initial state of N
#: keys ``k0 .. k{N-1}``, of which each batch updates a few spread over the whole range (:func:`big_records`); its
#: ``changes()`` are the output ``big`` (the updated keys' counts, so a key read back wrong after a restart shows).
STATE_KEYS_ENV = "RECOVERY_APP_STATE_KEYS"


def big_records(seed: int, t: int, partition: int, n: int, keys: int = 1000):
    return [(f"k{(t // 1000 * 7919 + partition * 104_729 + i * 15_485_863) % keys}", 1) for i in range(n)]


def add_counts(values, last):
    return (last or 0) + sum(values)


def build(sc, checkpoint: str, out: str, clock: Clock | None = None, checkpoint_interval: str = "2s",
          window: str = "10s") -> StreamingContext:
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    words = ssc.generatorStream(4, 2, seed=1, recordFunc=records).map(lambda w: (w, 1))
    counts = words.runningReduce(operator.add).checkpoint(checkpoint_interval)
    counts.saveAsTextFiles(os.path.join(out, "counts"))
    win = words.reduceByKeyAndWindow(operator.add, operator.sub, window, "1s", filterFunc=lambda kv: kv[1] > 0)
    win.checkpoint(checkpoint_interval)
    win.saveAsTextFiles(os.path.join(out, "window"))
    sessions = words.track(lambda k, e: e, lambda k, s, e: s + e if s < 5 else None, "3s")
    sessions.saveAsTextFiles(os.path.join(out, "sessions"))
    keys = int(os.environ.get(STATE_KEYS_ENV) or 0)
    if keys:
        initial = sc.range(0, keys, numSlices=4).map(lambda i: (f"k{i}", 0))
        big = ssc.generatorStream(8, 2, seed=2, recordFunc=functools.partial(big_records, keys=keys)).updateStateByKey(
            add_counts, 2, initial, updateIdleKeys=False).checkpoint(checkpoint_interval)
        big.changes().saveAsTextFiles(os.path.join(out, "big"))
    return ssc


def read_outputs(out: str) -> dict[str, list[str]]:
    """Committed output folders (with _SUCCESS) -> sorted lines."""
    result: dict[str, list[str]] = {}
    for name in sorted(os.listdir(out)):
        folder = os.path.join(out, name)
        if not os.path.exists(os.path.join(folder, "_SUCCESS")):
            continue
        lines: list[str] = []
        for part in sorted(os.listdir(folder)):
            if part.startswith("part-"):
                with open(os.path.join(folder, part)) as f:
                    lines.extend(x for x in f.read().splitlines() if x)
        result[name] = sorted(lines)
    return result


if __name__ == "__main__":  # driver process for the kill tests: python recovery_app.py CKPT OUT
    import logging

    from dstreams import faults
    from dstreams.spark.sparkconf import create_spark_context

    faults.install(faults.FaultPlan.from_mapping(os.environ))  # the test's DSTREAMS_FAULT_*
    # the kill tests read when a state picked by size moves into the executor state store
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dstreams.nodes.auto_state").setLevel(logging.INFO)
    ckpt, out = sys.argv[1], sys.argv[2]
    sc = create_spark_context("local[2]", "dstreams-failover")
    ssc = StreamingContext.getOrCreate(ckpt, lambda: build(sc, ckpt, out))
    ssc.start()
    print("STARTED", flush=True)
    ssc.awaitTermination()
