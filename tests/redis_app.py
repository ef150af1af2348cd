"""A driver process reading Redis Streams (for the Redis process tests).

``python redis_app.py REDIS_URL KEY_PREFIX KEYS CHECKPOINT OUT``: 1 s batches over ``redisStream`` of
``KEYS`` stream keys ``<KEY_PREFIX>0..``; every entry is saved as ``<key> <entry id>`` with
``saveAsTextFiles(OUT/entries)`` and a per-key count kept with ``updateStateByKey`` (checkpointed every
2 s) is saved with ``saveAsTextFiles(OUT/counts)``. Resumes with ``getOrCreate(CHECKPOINT)``. SIGTERM
stops gracefully and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def build(sc, url: str, keys: list[str], checkpoint: str, out: str):
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(checkpoint)
    entries = ssc.redisStream(keys, url=url)
    entries.map(lambda r: f"{r[0]} {r[1]}").saveAsTextFiles(os.path.join(out, "entries"))
    counts = entries.map(lambda r: (r[0], 1)).updateStateByKey(lambda new, old: sum(new) + (old or 0))
    counts.checkpoint("2s")
    counts.saveAsTextFiles(os.path.join(out, "counts"))
    return ssc


def main(url: str, prefix: str, n_keys: int, checkpoint: str, out: str) -> int:
    keys = [f"{prefix}{i}" for i in range(n_keys)]
    return run_driver("dstreams-redis-app", checkpoint, lambda sc: build(sc, url, keys, checkpoint, out))


def run_driver(app_name: str, checkpoint: str, setup) -> int:
    """Run ``getOrCreate(checkpoint, setup(sc))`` on ``local[2]`` until SIGTERM (a graceful stop, 0) or the stream
    fails (1); prints ``STARTED`` once started and ``EXIT <rc>`` at the end."""
    from dstreams import StreamingContext, faults
    from dstreams.spark.sparkconf import create_spark_context

    faults.install(faults.FaultPlan.from_mapping(os.environ))  # the test's DSTREAMS_FAULT_*
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sc = create_spark_context("local[2]", app_name, {"spark.default.parallelism": "2"})
    ssc = StreamingContext.getOrCreate(checkpoint, lambda: setup(sc))
    ssc.start()
    print("STARTED", flush=True)
    rc = 0
    try:
        while not stop.is_set():
            if ssc.awaitTerminationOrTimeout(0.5):
                rc = 1
                break
    except BaseException as e:  # the error that stopped the stream
        print(f"DRIVER FAILED: {type(e).__name__}: {e}", flush=True)
        rc = 1
    finally:
        ssc.stop(stopSparkContext=True, stopGraceFully=rc == 0)
    print(f"EXIT {rc}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]))
