"""Orders from a Kafka topic, totalled per customer, upserted into PostgreSQL exactly once.

    orders = ssc.kafkaStream("orders", bootstrapServers=kafka, startingOffsets="earliest",
                             decoder=lambda r: json.loads(r.value))
    totals = orders.map(lambda o: (o["customer"], (1, o["amount_cents"]))).runningReduce(add_pairs)
    totals.changes().map(...).saveToPostgres(dsn, "order_totals", mode="upsert", keyColumns=["customer"])

The Kafka source is direct (no receiver): each batch's offset ranges are fixed on the driver and written to
the metadata log before the batch runs, and it reads ``read_committed``, so a restarted driver reads exactly
the same records again. The totals are checkpointed state, and ``saveToPostgres`` commits every batch in one
transaction with a commit record for its batch time: a batch that runs again writes nothing twice, through
``kill -9`` and a restart. (To write the totals back to Kafka instead, ``saveToKafka`` is the transactional
sink: see docs/guide/kafka.md.)

Needs a Kafka broker and a PostgreSQL server; the defaults are the project's test services (``bash
scripts/services.sh start kafka postgres``): Kafka at ``$KAFKA_BOOTSTRAP`` or 127.0.0.1:9192, PostgreSQL at
``$POSTGRES_DSN`` or postgresql://dstreams@127.0.0.1:5440/dstreams. The topic is created (2 partitions) when
it does not exist; orders are JSON values ``{"customer": "alice", "amount_cents": 1250}``. Run it::

    python -m dstreams.examples.kafka_to_postgres                      # 20 s, producing 20 sample orders/s itself
    python -m dstreams.examples.kafka_to_postgres --produce 0 --seconds 0    # only read, until Ctrl-C

Run it again with the same ``--checkpoint`` (default ``.dstreams-checkpoints/kafka_to_postgres``) and it
resumes where it stopped (the stream and its arguments come from the checkpoint then). After every batch it
prints the customers it updated, and at the end the table::

    batch 1735732803000 (12:00:03): 3 customers updated: alice 12 orders 345.67, bob 4 orders 80.00, ...
    order_totals: 6 customers, 212 orders, 10532.47 in all
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
from datetime import datetime

from dstreams import StreamingContext

KAFKA_BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP") or f"127.0.0.1:{os.environ.get('DSTREAMS_TEST_KAFKA_PORT') or 9192}"
POSTGRES_DSN = os.environ.get("POSTGRES_DSN") or \
    f"postgresql://dstreams@127.0.0.1:{os.environ.get('DSTREAMS_TEST_POSTGRES_PORT') or 5440}/dstreams"
CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank")


def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    """The input topic, when it does not exist yet."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=10).topics:
        return
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  request_timeout=30)
    try:
        futures[topic].result(30)
    except Exception as e:  # noqa: BLE001
        if "TOPIC_ALREADY_EXISTS" not in str(e):  # made meanwhile by someone else: fine
            raise


def create_table(dsn: str, table: str) -> None:
    """The target table (the sink never creates or alters a user's table)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (customer text PRIMARY KEY, orders bigint NOT NULL, "
                             "amount_cents bigint NOT NULL)").format(sql.Identifier(*table.split("."))))


def produce(bootstrap: str, topic: str, rate: float, stop: threading.Event) -> None:
    """Sample input: ``rate`` random orders per second written to ``topic`` until ``stop``."""
    from confluent_kafka import Producer

    producer, rng = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}), random.Random()
    while not stop.wait(1 / rate):
        order = {"customer": rng.choice(CUSTOMERS), "amount_cents": rng.randrange(100, 10_000)}
        producer.produce(topic, json.dumps(order).encode(), key=order["customer"].encode())
        producer.poll(0)
    producer.flush(10)


def add_pairs(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """(orders, cents) + (orders, cents)."""
    return a[0] + b[0], a[1] + b[1]


def show(time: datetime, rdd) -> None:  # noqa: ANN001 (an RDD)
    """The rows this batch upserted (a few customers: collected on the driver)."""
    rows = sorted(rdd.collect())
    if rows:
        ms = round(time.timestamp() * 1000)
        print(f"batch {ms} ({time.astimezone():%H:%M:%S}): {len(rows)} customers updated: "
              + ", ".join(f"{c} {n} orders {cents / 100:.2f}" for c, n, cents in rows), flush=True)


def create_context(args: argparse.Namespace) -> StreamingContext:
    """The stream (only called when the checkpoint holds none: a restart restores it from there)."""
    ssc = StreamingContext.local(args.batch, master=args.master, appName="kafka-to-postgres")
    orders = ssc.kafkaStream(args.topic, bootstrapServers=args.kafka, startingOffsets="earliest",
                             decoder=lambda r: json.loads(r.value))
    totals = orders.map(lambda o: (o["customer"], (1, int(o["amount_cents"])))).runningReduce(add_pairs)
    rows = totals.changes().map(lambda kv: (kv[0], kv[1][0], kv[1][1])).cache()  # (customer, orders, cents)
    rows.saveToPostgres(args.postgres, args.table, mode="upsert", keyColumns=["customer"],
                        columns=["customer", "orders", "amount_cents"])
    rows.foreachRDD(show)
    return ssc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Kafka -> running totals -> PostgreSQL, exactly once.")
    p.add_argument("--kafka", default=KAFKA_BOOTSTRAP, help=f"bootstrap servers (default $KAFKA_BOOTSTRAP or "
                                                            f"{KAFKA_BOOTSTRAP})")
    p.add_argument("--topic", default="orders", help="the topic to read, made if missing (default orders)")
    p.add_argument("--postgres", default=POSTGRES_DSN, help="PostgreSQL DSN (default $POSTGRES_DSN or the "
                                                            "project's test server)")
    p.add_argument("--table", default="order_totals", help="target table, made if missing (default order_totals)")
    p.add_argument("--checkpoint", default=os.path.join(".dstreams-checkpoints", "kafka_to_postgres"),
                   help="checkpoint folder or s3:// URL; an existing one is resumed")
    p.add_argument("--produce", type=float, default=20, help="sample orders per second to write; 0: none")
    p.add_argument("--batch", default="1s", help="batch interval (default 1s)")
    p.add_argument("--seconds", type=float, default=20, help="how long to run; 0: until Ctrl-C (default 20)")
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)

    create_topic(args.kafka, args.topic)
    create_table(args.postgres, args.table)
    ssc = StreamingContext.getOrCreate(args.checkpoint, lambda: create_context(args))
    stop = threading.Event()
    if args.produce > 0:
        threading.Thread(target=produce, args=(args.kafka, args.topic, args.produce, stop), daemon=True).start()
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
