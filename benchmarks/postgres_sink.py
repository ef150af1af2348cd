"""Rows per second into a PostgreSQL table: ``saveToPostgres`` (COPY into staging, one commit transaction) next to
the same protocol staging with ``INSERT`` (executemany), and the at-least-once ``foreachRDD`` users write by hand.

Run from the repository root with the project's PostgreSQL (``bash scripts/services.sh start postgres``)::

    python -m benchmarks.postgres_sink               # 50,000 rows in 4 partitions, 5 runs each: ~1 min
    python -m benchmarks.postgres_sink --records 1000 --repeat 3 --no-save

Contract: one SparkContext (``local[2]``); a batch of ``--records`` rows ``(word text, n int, note text)`` in
``--partitions`` partitions, cached and counted first; each strategy writes it ``--repeat`` times (after one
warm-up) into an emptied table of a scratch schema (dropped at the end); the median wall time gives rows per
second. Output: a table on stdout and ``benchmarks/results/postgres_sink.json``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import sink_bench

RESULTS = Path(__file__).resolve().parent / "results" / "postgres_sink.json"


def _strategies(dsn: str, table: str) -> dict[str, Callable[[Any, int], None]]:
    from dstreams.postgres import sink as ps
    from dstreams.recovery.retry import RetryPolicy

    target = ps.resolve_target(dsn, table, "append", None, None, "bench")
    policy = RetryPolicy(total_seconds=0)

    def copy_staged(rdd: Any, ms: int) -> None:
        ps.save_to_postgres(rdd, ms, target, epoch=1, policy=policy)

    def insert_staged(rdd: Any, ms: int) -> None:
        from psycopg import sql

        columns = target.columns + ps._META
        stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(ps._ident(target.staging), ps._idents(columns),
                                                                 sql.SQL(", ").join(sql.Placeholder() * len(columns)))

        def stage(p: int, it: Any) -> list[tuple]:
            attempt = uuid.uuid4().hex
            rows = [(*r, "bench", ms, p, i, attempt) for i, r in enumerate(it)]
            with ps._connect(dsn) as conn, conn.cursor() as cur:
                cur.executemany(stmt, rows)
            return [(p, attempt, len(rows))]

        staged = rdd.mapPartitionsWithIndex(stage).collect()
        ps.commit_batch(target, ms, staged, 1)

    def foreach_insert(rdd: Any, ms: int) -> None:
        def write(it: Any) -> None:
            with ps._connect(dsn) as conn, conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} (word, n, note) VALUES (%s, %s, %s)", list(it))

        rdd.foreachPartition(write)

    def foreach_copy(rdd: Any, ms: int) -> None:
        def write(it: Any) -> None:
            with ps._connect(dsn) as conn, conn.cursor() as cur, \
                    cur.copy(f"COPY {table} (word, n, note) FROM STDIN") as copy:
                for r in it:
                    copy.write_row(r)

        rdd.foreachPartition(write)

    return {
        "saveToPostgres (COPY into staging, one commit)": copy_staged,
        "same protocol, staging with INSERT (executemany)": insert_staged,
        "foreachRDD INSERT executemany (at least once)": foreach_insert,
        "foreachRDD COPY (at least once)": foreach_copy,
    }


def main(argv: list[str] | None = None) -> None:
    args = sink_bench.parse_args("python -m benchmarks.postgres_sink", __doc__.splitlines()[0], "dsn",
                                 os.environ.get("DSTREAMS_TEST_POSTGRES_DSN",
                                                "postgresql://dstreams@127.0.0.1:5440/dstreams"), argv)

    import psycopg

    from dstreams.spark.sparkconf import create_spark_context

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.words"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {table} (word text, n int, note text)")
    sc = create_spark_context("local[2]", "postgres-sink-bench", None)
    results: dict[str, Any] = {}
    try:
        rdd = sc.parallelize([(f"w{i % 997}", i, "some note") for i in range(args.records)], args.partitions).cache()
        rdd.count()
        for name, write in _strategies(args.dsn, table).items():

            def once(rep: int, name: str = name, write: Callable[[Any, int], None] = write) -> float:
                with psycopg.connect(args.dsn, autocommit=True) as conn:
                    conn.execute(f"TRUNCATE {table}")
                start = time.perf_counter()
                write(rdd, 1000 * (len(results) * 100 + rep + 1))
                elapsed = time.perf_counter() - start
                with psycopg.connect(args.dsn) as conn:
                    (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                assert n == args.records, (name, n)
                return elapsed

            results[name] = sink_bench.time_strategy(name, args.records, args.repeat, once, "rows")
    finally:
        sc.stop()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    sink_bench.save(RESULTS, "postgres_sink", args, results)


if __name__ == "__main__":
    main()
