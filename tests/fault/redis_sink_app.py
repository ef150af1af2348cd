"""A driver that copies Redis streams into one Redis stream (for the Redis sink's process test).

``python redis_sink_app.py REDIS_URL IN_PREFIX KEYS OUT_KEY CHECKPOINT``: 1 s batches over ``redisStream`` of the
keys ``<IN_PREFIX>0..`` (at most 10 entries per key and second, so the input spreads over several batches); each
entry is added to ``OUT_KEY`` as ``{"src": key, "id": entry id}`` with ``saveToRedisStream`` in chunks of 3 entries
(so a kill at the fault point ``redis-sink-chunk`` cuts a batch's write half-way). Resumes with
``getOrCreate(CHECKPOINT)``. SIGTERM stops gracefully and exits 0. With ``POSTGRES_DSN TABLE`` after those
arguments, each entry is also written as a row ``(src, id)`` into ``TABLE`` with ``saveToPostgres``.
"""

from __future__ import annotations

import os
import sys


def build(sc, url: str, keys: list[str], out_key: str, checkpoint: str, pg: list[str]):
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(checkpoint)
    entries = ssc.redisStream(keys, url=url, maxRatePerPartition=10)
    entries.map(lambda r: {"src": r[0], "id": r[1]}).saveToRedisStream(url, out_key, chunkSize=3)
    if pg:
        entries.map(lambda r: (r[0], r[1])).saveToPostgres(pg[0], pg[1], columns=["src", "id"])
    return ssc


def main(url: str, prefix: str, n_keys: int, out_key: str, checkpoint: str, *pg: str) -> int:
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, where redis_app is
    from redis_app import run_driver

    keys = [f"{prefix}{i}" for i in range(n_keys)]
    return run_driver("dstreams-redis-sink-app", checkpoint,
                      lambda sc: build(sc, url, keys, out_key, checkpoint, list(pg)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], *sys.argv[6:]))
