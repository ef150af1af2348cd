"""A driver with poison records for every operator and sink that routes dead letters (issue 44's process test,
tests/fault/test_poison_process.py).

``python poison_app.py REDIS_URL PREFIX KEYS CHECKPOINT POSTGRES_DSN TABLE BOOTSTRAP TOPIC``: 1 s batches over
``redisStream`` of the keys ``<PREFIX>in0..`` (at most :data:`RATE` entries per key and second, so the input spreads
over several batches). Each entry ``(key, id, fields)`` is parsed by :func:`parse` (``map(..., onError="deadLetter")``:
an ``amount`` that is not a number is a dead letter); the parsed records then go

* into the PostgreSQL ``TABLE (src, id, user, amount)``, whose CHECK constraint ``amount_small`` refuses an amount of
  1000 or more (``saveToPostgres(..., onError="deadLetter")``: ``dstreams_sink_dead_letters``);
* into the Redis stream ``<PREFIX>out`` (``saveToRedisStream(..., onError="deadLetter")`` with ``maxEntryBytes`` at
  :data:`MAX_ENTRY_BYTES`: a record with a long ``note`` is too large and goes to ``<PREFIX>out:dead-letters``);
* into the Kafka topic ``TOPIC`` as ``(user, {src, id, amount, score})`` (``saveToKafka(..., onError="deadLetter")``:
  a ``nan`` score cannot be JSON-encoded and goes to ``TOPIC.dead-letters``);
* per user, the sum of the amounts with ``updateStateByKey(`` :func:`update` ``, onError="deadLetter")``, which
  raises on a negative amount (the key keeps its state: a user whose only record is negative gets none); the state
  of every batch is added to the Redis stream ``<PREFIX>state`` as ``user, total`` (checkpointed every 2 s).

``ssc.deadLetters()`` (the parser's and the state's) is added to the Redis stream ``<PREFIX>dead`` as ``operator,
record`` (its ``repr``), ``error``, ``batch_ms``. Resumes with ``getOrCreate(CHECKPOINT)``; SIGTERM stops gracefully
and exits 0 (``tests/redis_app.py``'s ``run_driver``). ``DSTREAMS_FAULT_KILL`` (:mod:`dstreams.faults`) works
as for any driver.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Entries per input key and second.
RATE = 10
#: The Redis sink's limit on one entry (field names and values): a record with a long note is refused.
MAX_ENTRY_BYTES = 256
#: Long: a transaction left open by a killed driver is resolved by the restarted driver's tasks, not by a timeout.
TRANSACTION_TIMEOUT_MS = 120_000


def parse(entry: tuple[str, str, dict[str, str]]) -> dict[str, Any]:
    """An input entry as a record; raises ValueError on an amount that is not an integer."""
    key, eid, f = entry
    return {"src": key, "id": eid, "user": f["user"], "amount": int(f["amount"]), "score": float(f["score"]),
            "note": f["note"]}


def update(new: list[tuple[str, str, int]], total: int | None) -> int:
    """A user's total of amounts; raises ValueError on a negative amount."""
    total = total or 0
    for src, eid, amount in new:
        if amount < 0:
            raise ValueError(f"negative amount {amount} in {src} {eid}")
        total += amount
    return total


def pg_row(o: dict[str, Any]) -> tuple[str, str, str, int]:
    return o["src"], o["id"], o["user"], o["amount"]


def redis_entry(o: dict[str, Any]) -> dict[str, Any]:
    return {"src": o["src"], "id": o["id"], "user": o["user"], "amount": o["amount"], "note": o["note"]}


def kafka_record(o: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return o["user"], {"src": o["src"], "id": o["id"], "amount": o["amount"], "score": o["score"]}


def dead_entry(d: Any) -> dict[str, Any]:
    return {"operator": d.operator, "record": repr(d.record), "error": d.error, "batch_ms": d.batchTime}


def build(sc: Any, url: str, prefix: str, n_keys: int, checkpoint: str, dsn: str, table: str, bootstrap: str,
          topic: str) -> Any:
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(checkpoint)
    entries = ssc.redisStream([f"{prefix}in{i}" for i in range(n_keys)], url=url, maxRatePerPartition=RATE)
    parsed = entries.map(parse, onError="deadLetter")
    parsed.map(pg_row).saveToPostgres(dsn, table, columns=["src", "id", "user", "amount"], onError="deadLetter")
    parsed.map(redis_entry).saveToRedisStream(url, f"{prefix}out", chunkSize=5, onError="deadLetter",
                                              maxEntryBytes=MAX_ENTRY_BYTES)
    parsed.map(kafka_record).saveToKafka(topic, {"bootstrap.servers": bootstrap,
                                                 "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS},
                                         onError="deadLetter")
    totals = parsed.map(lambda o: (o["user"], (o["src"], o["id"], o["amount"]))).updateStateByKey(
        update, onError="deadLetter")
    totals.checkpoint("2s")  # a restart resumes from it instead of replaying every batch from the first
    totals.saveToRedisStream(url, f"{prefix}state", ["user", "total"])
    ssc.deadLetters().map(dead_entry).saveToRedisStream(url, f"{prefix}dead")
    return ssc


def main(url: str, prefix: str, n_keys: str, checkpoint: str, dsn: str, table: str, bootstrap: str,
         topic: str) -> int:
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, where redis_app is
    from redis_app import run_driver

    return run_driver("dstreams-poison-app", checkpoint,
                      lambda sc: build(sc, url, prefix, int(n_keys), checkpoint, dsn, table, bootstrap, topic))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
