"""Issue 44's acceptance: poison records in each kind of operator and in each sink, through kills and restarts.

The input (2 Redis stream keys, :data:`PER_KEY` entries each) is written beforehand, with :data:`PER_KIND` poison
entries of each kind spread over it: one the parser (``map``) raises on, one the state's update function
(``updateStateByKey``) raises on, one the PostgreSQL table's CHECK constraint refuses, one too large for the Redis
sink, one the Kafka sink cannot encode. The driver (tests/fault/poison_app.py) reads it at 10 entries per key and second
(several batches) and writes the PostgreSQL table, a Redis stream, a Kafka topic, the state of every batch (a Redis
stream) and ``ssc.deadLetters()`` (a Redis stream). The first driver is killed (SIGKILL) inside the table's commit
transaction of its second batch (fault point ``postgres-sink-commit``), the second at a random moment while it
writes, the third drains the input and is stopped with SIGTERM.

Then every output is compared with a model computed from the input: every good record exactly once in each sink,
every poison record exactly once in the right dead-letter place (the table's ``dstreams_sink_dead_letters``, the
Redis stream's ``:dead-letters``, the topic's ``.dead-letters`` read ``read_committed``, ``ssc.deadLetters()``) with
its error, and the state of every batch equal to the sums of the records of the batches up to it (each record's
batch read from the Redis outputs' ids; the other dead-letter places must name the same batch).
"""

from __future__ import annotations

import ast
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from ..kafka_support import create_topic, read_committed
from ..process_support import kill_group, stop_driver, tail, wait_for
from . import poison_app

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.redis, pytest.mark.postgres, pytest.mark.kafka]

APP = os.path.join(os.path.dirname(__file__), "poison_app.py")
KEYS = 2
PER_KEY = 40
PER_KIND = 3
KINDS = ("parse", "state", "pg", "redis", "kafka")
USERS = 4

Entry = tuple[str, str, dict[str, str]]


def _fields(n: int, kind: str | None, k: int) -> dict[str, str]:
    f = {"user": f"u{(n + k) % USERS}", "amount": str(n % 50 + 1), "score": "0.5", "note": "ok"}
    if kind == "parse":
        f["amount"] = "oops"
    elif kind == "state":
        f["user"], f["amount"] = f"s{k}-{n}", "-7"  # a user of its own: its only record is refused
    elif kind == "pg":
        f["amount"] = "5000"
    elif kind == "redis":
        f["note"] = "x" * 400
    elif kind == "kafka":
        f["score"] = "nan"
    return f


def _plan() -> dict[tuple[int, int], str]:
    """(key index, entry number) -> poison kind: PER_KIND of each kind, spread over the keys and the batches."""
    rng = random.Random(44)
    slots = rng.sample([(k, n) for k in range(KEYS) for n in range(PER_KEY)], PER_KIND * len(KINDS))
    return {slot: KINDS[i % len(KINDS)] for i, slot in enumerate(slots)}


def write_input(redis_client: Any, prefix: str) -> tuple[list[Entry], dict[tuple[str, str], str]]:
    """The input entries ``(key, id, fields)`` in order per key, and the poison kind of each poison ``(key, id)``."""
    plan = _plan()
    entries: list[Entry] = []
    kinds: dict[tuple[str, str], str] = {}
    for k in range(KEYS):
        key = f"{prefix}in{k}"
        for n in range(PER_KEY):
            kind = plan.get((k, n))
            f = _fields(n, kind, k)
            eid = redis_client.xadd(key, f)
            entries.append((key, eid, f))
            if kind:
                kinds[(key, eid)] = kind
    return entries, kinds


def _error_of(f: Any, *args: Any) -> str:
    try:
        f(*args)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError(f"{f.__name__}{args!r} did not raise")


@pytest.fixture
def orders_table(postgres_dsn: str, redis_prefix: str) -> Iterator[str]:
    """A table ``orders`` without a key (duplicates would show) and with the CHECK ``amount_small``, in a schema of
    this test's own (dropped afterwards)."""
    import psycopg

    schema = f"t_{redis_prefix.split(':')[1]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.orders (src text NOT NULL, id text NOT NULL, \"user\" text NOT NULL, "
                     "amount int NOT NULL, CONSTRAINT amount_small CHECK (amount < 1000))")
    try:
        yield f"{schema}.orders"
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


class Outputs:
    """Reads the driver's outputs."""

    def __init__(self, redis_client: Any, prefix: str, dsn: str, table: str, bootstrap: str, topic: str) -> None:
        self.r, self.prefix, self.dsn, self.table, self.bootstrap, self.topic = (
            redis_client, prefix, dsn, table, bootstrap, topic)
        self.schema = table.split(".")[0]

    def stream(self, name: str) -> list[tuple[str, dict[str, str]]]:
        return self.r.xrange(f"{self.prefix}{name}")

    def xlen(self, name: str) -> int:
        return self.r.xlen(f"{self.prefix}{name}")

    def pg(self, query: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.dsn, connect_timeout=10) as conn:
            return conn.execute(query).fetchall()

    def rows(self) -> list[tuple]:
        return self.pg(f'SELECT src, id, "user", amount FROM {self.table}')

    def pg_dead(self) -> list[tuple]:
        try:
            return self.pg(f"SELECT output, batch_ms, record, error, constraint_name FROM "
                           f"{self.schema}.dstreams_sink_dead_letters")
        except Exception as e:  # not created yet
            if "does not exist" in str(e):
                return []
            raise

    def kafka(self, topic: str) -> list[tuple[str | None, str]]:
        return [(k.decode() if k is not None else None, v.decode())
                for _p, _o, k, v in read_committed(self.bootstrap, topic)]

    def state_batches(self) -> dict[int, list[tuple[str, int]]]:
        out: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for eid, f in self.stream("state"):
            out[int(eid.split("-")[0])].append((f["user"], int(f["total"])))
        return dict(out)


def _no_duplicates(items: list, what: str) -> None:
    dups = [x for x, n in Counter(items).items() if n > 1]
    assert not dups, f"{what}: {len(dups)} written more than once, e.g. {dups[:3]}"


@pytest.mark.timeout(900)
def test_poison_records_go_to_their_dead_letters_exactly_once_through_kills(
        tmp_path, redis_url, redis_client, redis_prefix, postgres_dsn, orders_table, kafka_bootstrap):
    entries, kinds = write_input(redis_client, redis_prefix)
    topic = create_topic(kafka_bootstrap, partitions=2, prefix="poison")
    create_topic(kafka_bootstrap, name=f"{topic}.dead-letters")
    out = Outputs(redis_client, redis_prefix, postgres_dsn, orders_table, kafka_bootstrap, topic)

    # ---- the model
    parsed = {(key, eid): poison_app.parse((key, eid, f)) for key, eid, f in entries
              if kinds.get((key, eid)) != "parse"}
    by_kind: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for ke, kind in kinds.items():
        by_kind[kind].append(ke)
    final_totals: dict[str, int] = defaultdict(int)
    for ke, o in parsed.items():
        if kinds.get(ke) != "state":
            final_totals[o["user"]] += o["amount"]

    ckpt = str(tmp_path / "ckpt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTREAMS_FAULT_")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen] = []

    def start(name: str, **fault: str) -> tuple[subprocess.Popen, str]:
        log_path = str(tmp_path / f"{name}.log")
        log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, APP, redis_url, redis_prefix, str(KEYS), ckpt, postgres_dsn,
                                 orders_table, kafka_bootstrap, topic], env={**env, **fault}, stdout=log,
                                stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True)
        procs.append(proc)
        return proc, log_path

    def final_state_written() -> bool:
        batches = out.state_batches()
        return bool(batches) and dict(batches[max(batches)]) == final_totals

    def drained() -> bool:
        n = len(parsed)
        return (out.xlen("out") + out.xlen("out:dead-letters") == n
                and out.xlen("dead") == len(by_kind["parse"]) + len(by_kind["state"])
                and len(out.rows()) + len(out.pg_dead()) == n
                and final_state_written()
                and len(out.kafka(topic)) + len(out.kafka(f"{topic}.dead-letters")) == n)

    rng = random.Random()
    started = time.monotonic()
    try:
        # 1. killed inside the table's commit of its second batch (the first is committed)
        proc, log_path = start("driver1", DSTREAMS_FAULT_KILL="postgres-sink-commit", DSTREAMS_FAULT_KILL_AFTER="2")
        try:
            proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"driver 1 did not die in the table's commit:\n{tail(log_path)}")
        assert proc.returncode == -signal.SIGKILL, tail(log_path)
        kill_group(proc)
        first = {(key, eid) for key, eid, _f in entries[:poison_app.RATE] + entries[PER_KEY:PER_KEY + poison_app.RATE]
                 } & set(parsed)  # batch 1: the first RATE entries of each key
        assert len(out.rows()) + len(out.pg_dead()) == len(first), "batch 1 committed, batch 2 killed in its commit"
        assert {r[:2] for r in out.rows()} == {ke for ke in first if kinds.get(ke) != "pg"}

        # 2. killed at a random moment while it writes
        proc, log_path = start("driver2")
        seen = out.xlen("out")
        wait_for(lambda: out.xlen("out") > seen, 240, "more entries after the first restart", proc, log_path)
        time.sleep(rng.uniform(0, 3))  # within the next batches
        kill_group(proc)
        assert proc.returncode == -signal.SIGKILL, tail(log_path)

        # 3. drains the input, then SIGTERM
        proc, log_path = start("driver3", DSTREAMS_GRACEFUL_STOP_TIMEOUT="3s")  # it stops behind: empty batches
        wait_for(drained, 300, "every output to hold the whole input", proc, log_path, step=1.0,
                 details=lambda: f"out {out.xlen('out')}+{out.xlen('out:dead-letters')}, dead {out.xlen('dead')}, "
                                 f"rows {len(out.rows())}+{len(out.pg_dead())} of {len(parsed)}")
        stop_driver(proc)
        assert proc.returncode == 0, tail(log_path)
    finally:
        for p in procs:
            kill_group(p)
    print(f"drivers ran for {time.monotonic() - started:.0f} s")

    # ---- the Redis stream and its dead letters: every record's batch
    batch_of: dict[tuple[str, str], int] = {}
    written = [(f["src"], f["id"]) for _eid, f in out.stream("out")]
    _no_duplicates(written, "Redis stream")
    assert set(written) == set(parsed) - set(by_kind["redis"])
    for eid, f in out.stream("out"):
        assert f == {k: str(v) for k, v in poison_app.redis_entry(parsed[(f["src"], f["id"])]).items()}
        batch_of[(f["src"], f["id"])] = int(eid.split("-")[0])
    dead_redis = out.stream("out:dead-letters")
    refused = [tuple(json.loads(f["record"])[c] for c in ("src", "id")) for _eid, f in dead_redis]
    assert sorted(refused) == sorted(by_kind["redis"]), "each record too large once in the dead letters"
    from dstreams.redis.sink import encode_record

    for eid, f in dead_redis:
        record = json.loads(f["record"])
        ke = (record["src"], record["id"])
        assert kinds.get(ke) == "redis" and record == poison_app.redis_entry(parsed[ke])
        size = sum(len(b) for b in encode_record(record, None))
        assert f["error"] == (f"ValueError: its entry is {size} bytes, larger than "
                              f"maxEntryBytes={poison_app.MAX_ENTRY_BYTES}")
        assert f["output"] == f"saveToRedisStream({redis_prefix}out)" and int(f["batch_ms"]) == int(eid.split("-")[0])
        batch_of[ke] = int(f["batch_ms"])
    assert set(batch_of) == set(parsed)
    assert all(ms % 1000 == 0 for ms in batch_of.values()), "ids carry the batch time"
    for k in range(KEYS):  # a key's entries in batches in order
        times = [batch_of[(key, eid)] for key, eid, _f in entries if key == f"{redis_prefix}in{k}"
                 and (key, eid) in batch_of]
        assert times == sorted(times)

    # ---- the table and its dead letters
    rows = out.rows()
    _no_duplicates(rows, "table")
    assert sorted(rows) == sorted(poison_app.pg_row(o) for ke, o in parsed.items() if kinds.get(ke) != "pg")
    pg_dead = out.pg_dead()
    refused = [(record["src"], record["id"]) for _o, _b, record, _e, _c in pg_dead]
    assert sorted(refused) == sorted(by_kind["pg"]), f"each refused row once in the dead letters: {pg_dead}"
    for output, batch_ms, record, error, constraint in pg_dead:
        ke = (record["src"], record["id"])
        assert kinds.get(ke) == "pg" and record == dict(zip(("src", "id", "user", "amount"),
                                                            poison_app.pg_row(parsed[ke]), strict=True))
        assert constraint == "amount_small" and error.startswith("CheckViolation: new row for relation \"orders\" "
                                                                 "violates check constraint \"amount_small\""), error
        assert batch_ms == batch_of[ke] and output.startswith(orders_table), (output, batch_ms)

    # ---- the topic and its dead letters (read_committed)
    from dstreams.kafka.sink import default_serializer, make_target

    encode = make_target(topic, {"bootstrap.servers": kafka_bootstrap}).encode

    got = out.kafka(topic)
    _no_duplicates(got, "topic")
    expected = [(k, default_serializer(v).decode()) for k, v in
                (poison_app.kafka_record(o) for ke, o in parsed.items() if kinds.get(ke) != "kafka")]
    assert sorted(got) == sorted(expected)
    dead_kafka = [(k, json.loads(v)) for k, v in out.kafka(f"{topic}.dead-letters")]
    assert len(dead_kafka) == len(by_kind["kafka"]), dead_kafka
    seen_kafka = set()
    for k, d in dead_kafka:
        ke = next((ke for ke in by_kind["kafka"] if repr(poison_app.kafka_record(parsed[ke])) == d["record"]), None)
        assert k is None and ke is not None and ke not in seen_kafka, d
        seen_kafka.add(ke)
        assert d["error"] == _error_of(encode, poison_app.kafka_record(parsed[ke])), d
        assert d["batch_ms"] == batch_of[ke] and d["output"].startswith(topic), d

    # ---- ssc.deadLetters(): the parser's and the state's
    dead = [(f["operator"], f["record"], f["error"], int(f["batch_ms"])) for _eid, f in out.stream("dead")]
    _no_duplicates(dead, "ssc.deadLetters()")
    fields_of = {(key, eid): f for key, eid, f in entries}
    parse_dead = [d for d in dead if d[0] == "map#1"]
    assert sorted(ast.literal_eval(r)[:2] for _o, r, _e, _t in parse_dead) == sorted(by_kind["parse"])
    for _o, r, e, t in parse_dead:
        key, eid, f = ast.literal_eval(r)
        assert f == fields_of[(key, eid)] and e == _error_of(poison_app.parse, (key, eid, f))
        i = entries.index((key, eid, f))  # between the batches of the key's parsed entries around it
        before = [batch_of[(k2, e2)] for k2, e2, _f in entries[:i] if k2 == key and (k2, e2) in batch_of]
        after = [batch_of[(k2, e2)] for k2, e2, _f in entries[i:] if k2 == key and (k2, e2) in batch_of]
        assert t % 1000 == 0 and max(before, default=0) <= t <= min(after, default=t), (r, t)
    state_dead = [d for d in dead if d[0] == "updateStateByKey#2"]
    assert len(state_dead) + len(parse_dead) == len(dead), dead
    expected_state_dead = []
    for ke in by_kind["state"]:
        o = parsed[ke]
        new = [(o["src"], o["id"], o["amount"])]
        expected_state_dead.append((repr((o["user"], new)), _error_of(poison_app.update, new, None), batch_of[ke]))
    assert sorted((r, e, t) for _o, r, e, t in state_dead) == sorted(expected_state_dead)

    # ---- the state of every batch: the sums of the batches up to it
    batches = out.state_batches()
    times = sorted(batches)
    assert times == list(range(times[0], times[-1] + 1000, 1000)), f"batches without their state: {times}"
    assert times[0] <= min(batch_of.values()) and times[-1] >= max(batch_of.values())
    for t in times:
        users = [u for u, _ in batches[t]]
        _no_duplicates(users, f"the state of batch {t}")
        model: dict[str, int] = defaultdict(int)
        for ke, o in parsed.items():
            if batch_of[ke] <= t and kinds.get(ke) != "state":
                model[o["user"]] += o["amount"]
        assert dict(batches[t]) == dict(model), f"the state of batch {t}"
    assert dict(batches[times[-1]]) == final_totals
