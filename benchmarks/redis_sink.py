"""Rows per second into a Redis stream: ``saveToRedisStream``'s ways of writing a batch, next to the at-least-once
``foreachRDD`` users write by hand.

Run from the repository root with a Redis server (``bash scripts/services.sh start redis``, or ``--url``)::

    python -m benchmarks.redis_sink              # ~1 min on 2 cores
    python -m benchmarks.redis_sink --records 20000 --repeat 3

Contract: one SparkContext (``local[2]``); a batch of ``--records`` records (dicts of two short fields) in
``--partitions`` partitions, cached and counted first (the source is not measured); each strategy writes the
batch ``--repeat`` times, each time to a fresh key, and the median wall time of the write (Spark job(s), the
driver's round trips, Redis) gives entries per second. Strategies:

* ``batch, chunks of 1000`` - what ``saveToRedisStream`` does: one job encodes the batch on the executors and
  collects it; the driver runs one atomic script per 1,000 entries, in id order (check + ``XADD``).
* ``batch, one script`` - the same with the whole batch in one script (one atomic unit per batch, as one
  ``MULTI``/``EXEC`` per batch would be; blocks the server for the whole batch).
* ``partition, one job each`` - the executors write, one Spark job per partition in partition order (ids must
  arrive in order), one script per partition (one atomic unit per partition).
* ``batch, MULTI/EXEC, no check`` - the collected batch in one ``MULTI``/``EXEC`` of explicit-id ``XADD``\\ s:
  the transaction alone, without the script's check (not exactly once: a re-run fails on the first id).
* ``foreachRDD XADD * (at least once)`` - the hand-written sink: each partition pipelines ``XADD *`` from its
  executor, in parallel. A re-run batch adds its entries again.

Output: a table on stdout and ``benchmarks/results/redis_sink.json``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import sink_bench

RESULTS = Path(__file__).resolve().parent / "results" / "redis_sink.json"


def _strategies(url: str, partitions: int) -> dict[str, Callable[[Any, int, str], None]]:
    from dstreams.recovery.retry import RetryPolicy
    from dstreams.redis.sink import encode_partition, save_to_redis_stream, write_chunk
    from dstreams.redis.source import client

    policy = RetryPolicy(total_seconds=0)

    def chunked(rdd: Any, ms: int, key: str) -> None:
        save_to_redis_stream(rdd, ms, url, key, policy=policy)

    def one_script(rdd: Any, ms: int, key: str) -> None:
        save_to_redis_stream(rdd, ms, url, key, chunk_size=10**9, policy=policy)

    def per_partition(rdd: Any, ms: int, key: str) -> None:
        encode = encode_partition(ms, None)

        def write(p: int, it: Any) -> list[int]:
            entries = list(encode(p, it))
            return [write_chunk(client(url), key, entries, ms)[0]] if entries else [0]

        sc = rdd.context
        written = rdd.mapPartitionsWithIndex(write)
        for p in range(rdd.getNumPartitions()):
            sc.runJob(written, lambda it: list(it), [p])

    def multi_exec(rdd: Any, ms: int, key: str) -> None:
        entries = rdd.mapPartitionsWithIndex(encode_partition(ms, None)).collect()
        pipe = client(url).pipeline(transaction=True)
        for eid, flat in entries:
            pipe.xadd(key, dict(zip(flat[::2], flat[1::2], strict=True)), id=eid)
        pipe.execute()

    def foreach_rdd(rdd: Any, ms: int, key: str) -> None:
        def write(it: Any) -> None:
            pipe = client(url).pipeline(transaction=False)
            for n, record in enumerate(it, 1):
                pipe.xadd(key, record)
                if n % 1000 == 0:
                    pipe.execute()
            pipe.execute()

        rdd.foreachPartition(write)

    return {
        "batch, chunks of 1000 (saveToRedisStream)": chunked,
        "batch, one script": one_script,
        "partition, one job each": per_partition,
        "batch, MULTI/EXEC, no check": multi_exec,
        "foreachRDD XADD * (at least once)": foreach_rdd,
    }


def main(argv: list[str] | None = None) -> None:
    args = sink_bench.parse_args("python -m benchmarks.redis_sink", __doc__.splitlines()[0], "url",
                                 os.environ.get("DSTREAMS_TEST_REDIS_URL", "redis://127.0.0.1:6390/0"), argv)

    from dstreams.redis.source import client
    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", "redis-sink-bench", None)
    results: dict[str, Any] = {}
    try:
        rdd = sc.parallelize([{"word": f"w{i % 997}", "n": i} for i in range(args.records)], args.partitions).cache()
        rdd.count()
        r = client(args.url)
        for name, write in _strategies(args.url, args.partitions).items():

            def once(rep: int, name: str = name, write: Callable[[Any, int, str], None] = write) -> float:
                key = f"bench:redis-sink:{uuid.uuid4().hex[:8]}"
                start = time.perf_counter()
                write(rdd, 1000 * (rep + 1), key)
                elapsed = time.perf_counter() - start
                assert r.xlen(key) == args.records, (name, r.xlen(key))
                r.unlink(key)
                return elapsed

            results[name] = sink_bench.time_strategy(name, args.records, args.repeat, once, "entries")
    finally:
        sc.stop()
    sink_bench.save(RESULTS, "redis_sink", args, results)


if __name__ == "__main__":
    main()
