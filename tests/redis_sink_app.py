"""A driver that copies Redis streams into one Redis stream (for the Redis sink's process test).

``python redis_sink_app.py REDIS_URL IN_PREFIX KEYS OUT_KEY CHECKPOINT``: 1 s batches over ``redisStream`` of the
keys ``<IN_PREFIX>0..`` (at most 10 entries per key and second, so the input spreads over several batches); each
entry is added to ``OUT_KEY`` as ``{"src": key, "id": entry id}`` with ``saveToRedisStream`` in chunks of 3 entries
(so a kill at the fault point ``redis-sink-chunk`` cuts a batch's write half-way). Resumes with
``getOrCreate(CHECKPOINT)``. SIGTERM stops gracefully and exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading


def build(sc, url: str, keys: list[str], out_key: str, checkpoint: str):
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(checkpoint)
    entries = ssc.redisStream(keys, url=url, maxRatePerPartition=10)
    entries.map(lambda r: {"src": r[0], "id": r[1]}).saveToRedisStream(url, out_key, chunkSize=3)
    return ssc


def main(url: str, prefix: str, n_keys: int, out_key: str, checkpoint: str) -> int:
    from dstreams import StreamingContext
    from dstreams.sparkconf import create_spark_context

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    keys = [f"{prefix}{i}" for i in range(n_keys)]
    sc = create_spark_context("local[2]", "dstreams-redis-sink-app", {"spark.default.parallelism": "2"})
    ssc = StreamingContext.getOrCreate(checkpoint, lambda: build(sc, url, keys, out_key, checkpoint))
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
