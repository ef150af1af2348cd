"""Orders from a Redis stream, totalled per customer, upserted into PostgreSQL exactly once.

    orders = ssc.redisStream("orders", url=redis, decoder=...)          # (customer, (1, amount in cents))
    totals = orders.runningReduce(lambda a, b: (a[0] + b[0], a[1] + b[1]))
    totals.changes().map(...).saveToPostgres(dsn, "order_totals", mode="upsert", keyColumns=["customer"])

Why it is exactly once, even through ``kill -9`` and a restart: the Redis entry ids each batch reads are
written to the metadata log before the batch runs (a restarted driver reads exactly the same entries again);
the running totals are state, checkpointed with the stream; and ``saveToPostgres`` commits each batch in one
transaction together with a commit record for its batch time, so a batch that runs again writes nothing twice.
``changes()`` sends only the customers a batch changed, so a batch costs what it touched.

Needs a Redis server and a PostgreSQL server; the defaults are the project's test services
(``bash scripts/services.sh start redis postgres``): Redis at ``$REDIS_URL`` or redis://127.0.0.1:6390/0,
PostgreSQL at ``$POSTGRES_DSN`` or postgresql://dstreams@127.0.0.1:5440/dstreams. Run it::

    python -m dstreams.examples.redis_to_postgres                     # 20 s, writing 20 sample orders/s itself
    python -m dstreams.examples.redis_to_postgres --produce 0 --seconds 0   # only read (XADD orders * ...)

Run it again with the same ``--checkpoint`` (default ``.dstreams-checkpoints/redis_to_postgres``): it resumes
where it stopped, with the stream, its settings and the totals restored from the checkpoint (changed arguments
other than ``--produce`` and ``--seconds`` have no effect then; use a new checkpoint folder). Orders are entries
with the fields ``customer`` and ``amount_cents``. After every batch it prints the customers it updated, and at
the end the table::

    batch 1735732803000 (12:00:03): 3 customers updated: alice 12 orders 345.67, bob 4 orders 80.00, ...
    order_totals: 6 customers, 212 orders, 10532.47 in all
"""

from __future__ import annotations

import argparse
import os
import random
import threading
from datetime import datetime

from dstreams import StreamingContext

REDIS_URL = os.environ.get("REDIS_URL") or f"redis://127.0.0.1:{os.environ.get('DSTREAMS_TEST_REDIS_PORT') or 6390}/0"
POSTGRES_DSN = os.environ.get("POSTGRES_DSN") or \
    f"postgresql://dstreams@127.0.0.1:{os.environ.get('DSTREAMS_TEST_POSTGRES_PORT') or 5440}/dstreams"
CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank")


def create_table(dsn: str, table: str) -> None:
    """The target table (the sink never creates or alters a user's table)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (customer text PRIMARY KEY, orders bigint NOT NULL, "
                             "amount_cents bigint NOT NULL)").format(sql.Identifier(*table.split("."))))


def produce(url: str, key: str, rate: float, stop: threading.Event) -> None:
    """Sample input: ``rate`` random orders per second appended to the stream ``key`` until ``stop``."""
    import redis

    client, rng = redis.Redis.from_url(url), random.Random()
    while not stop.wait(1 / rate):
        client.xadd(key, {"customer": rng.choice(CUSTOMERS), "amount_cents": rng.randrange(100, 10_000)})


def show(time: datetime, rdd) -> None:  # noqa: ANN001 (an RDD)
    """The rows this batch upserted (a few customers: collected on the driver)."""
    rows = sorted(rdd.collect())
    if rows:
        ms = round(time.timestamp() * 1000)
        print(f"batch {ms} ({time.astimezone():%H:%M:%S}): {len(rows)} customers updated: "
              + ", ".join(f"{c} {n} orders {cents / 100:.2f}" for c, n, cents in rows), flush=True)


def create_context(args: argparse.Namespace) -> StreamingContext:
    """The stream (only called when the checkpoint holds none: a restart restores it from there)."""
    ssc = StreamingContext.local(args.batch, master=args.master, appName="redis-to-postgres")
    orders = ssc.redisStream(args.key, url=args.redis, startFrom="earliest",
                             decoder=lambda key, id, f: (f["customer"], (1, int(f["amount_cents"]))))
    totals = orders.runningReduce(lambda a, b: (a[0] + b[0], a[1] + b[1]))
    rows = totals.changes().map(lambda kv: (kv[0], kv[1][0], kv[1][1])).cache()  # (customer, orders, cents)
    rows.saveToPostgres(args.postgres, args.table, mode="upsert", keyColumns=["customer"],
                        columns=["customer", "orders", "amount_cents"])
    rows.foreachRDD(show)
    return ssc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Redis Streams -> running totals -> PostgreSQL, exactly once.")
    p.add_argument("--redis", default=REDIS_URL, help=f"Redis URL (default $REDIS_URL or {REDIS_URL})")
    p.add_argument("--key", default="orders", help="the Redis stream key to read (default orders)")
    p.add_argument("--postgres", default=POSTGRES_DSN, help="PostgreSQL DSN (default $POSTGRES_DSN or the "
                                                            "project's test server)")
    p.add_argument("--table", default="order_totals", help="target table, made if missing (default order_totals)")
    p.add_argument("--checkpoint", default=os.path.join(".dstreams-checkpoints", "redis_to_postgres"),
                   help="checkpoint folder or s3:// URL; an existing one is resumed")
    p.add_argument("--produce", type=float, default=20, help="sample orders per second to write; 0: none")
    p.add_argument("--batch", default="1s", help="batch interval (default 1s)")
    p.add_argument("--seconds", type=float, default=20, help="how long to run; 0: until Ctrl-C (default 20)")
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)

    create_table(args.postgres, args.table)
    ssc = StreamingContext.getOrCreate(args.checkpoint, lambda: create_context(args))
    stop = threading.Event()
    if args.produce > 0:
        threading.Thread(target=produce, args=(args.redis, args.key, args.produce, stop), daemon=True).start()
    ssc.start()
    try:
        if args.seconds > 0:
            ssc.awaitTerminationOrTimeout(args.seconds)
        else:
            ssc.awaitTermination()
    finally:
        stop.set()
        ssc.stop(stopSparkContext=True, stopGraceFully=True)
    summary(args.postgres, args.table)


def summary(dsn: str, table: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        n, orders, cents = conn.execute(sql.SQL("SELECT count(*), coalesce(sum(orders), 0), "
                                                "coalesce(sum(amount_cents), 0) FROM {}")
                                        .format(sql.Identifier(*table.split(".")))).fetchone()
    print(f"{table}: {n} customers, {orders} orders, {cents / 100:.2f} in all", flush=True)


if __name__ == "__main__":
    main()
