"""Issue 26: a driver writing a Redis stream with ``saveToRedisStream`` (and a PostgreSQL table with
``saveToPostgres``), killed inside a sink's write and at a random moment, adds every entry exactly once.

The input (2 stream keys, 40 entries each) is written beforehand; the driver (tests/fault/redis_sink_app.py) reads it
with ``redisStream`` at 10 entries per key and second (4 batches of 20) and copies each entry to one output
stream in chunks of 3. The first driver kills itself (SIGKILL, fault point ``redis-sink-chunk``) after its 10th
chunk: batch 1 is written, batch 2 only up to its third chunk. The second driver is killed with SIGKILL at a
random moment after more entries arrived; the third drains the input and stops. The output stream must hold
every input entry exactly once. The second test does the same with a table as a second output, the first kill
inside the table's commit transaction (fault point ``postgres-sink-commit``). The third stops a driver (SIGSTOP)
inside its Redis sink, lets a second driver take over and write everything, then resumes the first (a zombie):
neither the stream nor the table gets anything from it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from ..process_support import stop_process, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.redis]

APP = os.path.join(os.path.dirname(__file__), "redis_sink_app.py")
KEYS = 2
PER_KEY = 40


def sink_input(redis_client, redis_prefix: str, per_key: int) -> tuple[str, set[tuple[str, str]]]:
    """Write ``per_key`` entries into each of the ``KEYS`` input keys ``<prefix>in0..``; returns the output stream's
    key and the input entries ``(key, id)``."""
    keys = [f"{redis_prefix}in{i}" for i in range(KEYS)]
    return f"{redis_prefix}out", {(k, redis_client.xadd(k, {"n": str(n)})) for k in keys for n in range(per_key)}


def driver_env() -> dict[str, str]:
    """The drivers' environment: this process's without fault settings, Spark on the loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTREAMS_FAULT_")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    return env


@pytest.fixture
def copied_table(postgres_dsn: str, redis_prefix: str) -> Iterator[tuple[str, Callable[[], list]]]:
    """A table ``copied (src, id)`` with no key (duplicates would show) in a schema of this test's own (dropped
    afterwards), and a function returning its rows."""
    import psycopg

    schema = f"t_{redis_prefix.split(':')[1]}"
    table = f"{schema}.copied"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {table} (src text NOT NULL, id text NOT NULL)")

    def rows() -> list[tuple[str, str]]:
        with psycopg.connect(postgres_dsn) as conn:
            return conn.execute(f"SELECT src, id FROM {table}").fetchall()

    try:
        yield table, rows
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _scenario(tmp_path, redis_url, redis_client, redis_prefix, fault: dict[str, str], after_kill, done,
              pg: tuple[str, ...] = ()) -> set[tuple[str, str]]:
    """Write the input, run the three drivers (the first killed by ``fault``, checked by ``after_kill()``; the second
    killed at a random moment; the third stopped once ``done()``); returns the input entries ``(key, id)``."""
    out_key, expected = sink_input(redis_client, redis_prefix, PER_KEY)
    ckpt, log_path = str(tmp_path / "ckpt"), str(tmp_path / "driver.log")
    base_env = driver_env()

    def start(**fault: str) -> subprocess.Popen:
        log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen([sys.executable, APP, redis_url, f"{redis_prefix}in", str(KEYS), out_key, ckpt, *pg],
                                env={**base_env, **fault}, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))

    def started() -> int:
        with open(log_path, errors="replace") as f:
            return f.read().count("STARTED")

    rng = random.Random(26)
    proc = start(**fault)
    try:
        assert proc.wait(timeout=240) == -signal.SIGKILL, open(log_path, errors="replace").read()[-4000:]
        after_kill()
        proc = start()
        wait_for(lambda: redis_client.xlen(out_key) > 40, 180, "more entries after the first restart", proc, log_path)
        time.sleep(rng.uniform(0, 1))  # a random moment within a batch
        stop_process(proc, signal.SIGKILL)
        proc = start()
        wait_for(lambda: started() == 3, 180, "the third driver to start", proc, log_path)
        wait_for(lambda: redis_client.xlen(out_key) >= len(expected) and done(), 180, "all entries", proc, log_path)
        stop_process(proc, signal.SIGTERM)
        assert proc.returncode == 0, open(log_path, errors="replace").read()[-4000:]
    finally:
        stop_process(proc, signal.SIGKILL)
    entries = redis_client.xrange(out_key)
    copied = [(f["src"], f["id"]) for _, f in entries]
    assert not [x for x, n in Counter(copied).items() if n > 1], "duplicates"
    assert set(copied) == expected and len(entries) == len(expected)
    assert all(int(eid.split("-")[0]) % 1000 == 0 for eid, _ in entries), "ids carry the batch time"
    assert started() == 3
    return expected


@pytest.mark.timeout(900)
def test_driver_killed_inside_the_sink_adds_every_entry_exactly_once(tmp_path, redis_url, redis_client,
                                                                    redis_prefix):
    def after_kill() -> None:
        assert redis_client.xlen(f"{redis_prefix}out") == 20 + 3 * 3, "batch 1 whole, batch 2 up to its third chunk"

    _scenario(tmp_path, redis_url, redis_client, redis_prefix,
              {"DSTREAMS_FAULT_KILL": "redis-sink-chunk", "DSTREAMS_FAULT_KILL_AFTER": "10"}, after_kill, lambda: True)


@pytest.mark.timeout(900)
def test_driver_killed_inside_the_table_commit_writes_every_row_exactly_once(tmp_path, redis_url, redis_client,
                                                                             redis_prefix, postgres_dsn, copied_table):
    table, rows = copied_table

    def after_kill() -> None:
        assert len(rows()) == 20, "batch 1 committed, batch 2 killed inside its commit"

    expected = _scenario(tmp_path, redis_url, redis_client, redis_prefix,
                         {"DSTREAMS_FAULT_KILL": "postgres-sink-commit", "DSTREAMS_FAULT_KILL_AFTER": "2"},
                         after_kill, lambda: len(rows()) >= PER_KEY * KEYS, (postgres_dsn, table))
    got = rows()
    assert not [x for x, n in Counter(got).items() if n > 1], "duplicate rows"
    assert set(got) == expected and len(got) == len(expected)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pause", [("sink-write", "3"), ("postgres-sink-commit", "2")],
                         ids=["redis-write", "pg-commit"])
def test_a_zombie_driver_adds_nothing_to_the_stream_or_the_table(tmp_path, redis_url, redis_client, redis_prefix,
                                                                 postgres_dsn, copied_table, pause):
    """The first driver stops itself (SIGSTOP) inside the Redis sink of batch 2, after its fence check (or inside
    the table's commit transaction of batch 2, the fence row locked: issue 42); a second driver takes over and
    writes everything while the first is still stopped; then the first resumes: a zombie in the middle of a write.
    It adds no entry (its ids are at or below the stream's last and equal to what is there) and commits no row
    (the new driver ended its sessions and raised the fence when it started), and the stream and the table hold
    every record once."""
    out_key, expected = sink_input(redis_client, redis_prefix, PER_KEY)
    table, rows = copied_table

    ckpt = str(tmp_path / "ckpt")
    base_env = driver_env()

    def start(log_path: str, **fault: str) -> subprocess.Popen:
        log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen([sys.executable, APP, redis_url, f"{redis_prefix}in", str(KEYS), out_key, ckpt,
                                 postgres_dsn, table], env={**base_env, **fault}, stdout=log,
                                stderr=subprocess.STDOUT, cwd=str(tmp_path))

    def logged(path: str, text: str) -> bool:
        with open(path, errors="replace") as f:
            return text in f.read()

    zlog, nlog = str(tmp_path / "zombie.log"), str(tmp_path / "owner.log")
    # sink-write #1: Redis, batch 1; #2: the table, batch 1; #3: Redis, batch 2. postgres-sink-commit #2: batch 2
    point, nth = pause
    zombie = start(zlog, DSTREAMS_FAULT_PAUSE=point, DSTREAMS_FAULT_PAUSE_AFTER=nth)
    owner = None
    try:
        wait_for(lambda: logged(zlog, f"SIGSTOP at {point} #{nth}"), 240, "the zombie to stop in its sink", zombie,
                 zlog)
        owner = start(nlog)
        wait_for(lambda: redis_client.xlen(out_key) >= len(expected) and len(rows()) >= len(expected), 240,
              "the new owner to write everything", owner, nlog)
        before_stream, before_rows = redis_client.xrange(out_key), sorted(rows())
        zombie.send_signal(signal.SIGCONT)
        try:
            zombie.wait(timeout=180)  # it fails on the fence and stops
        except subprocess.TimeoutExpired:
            pytest.fail("the zombie did not stop after it resumed:\n" + open(zlog, errors="replace").read()[-4000:])
        assert redis_client.xrange(out_key) == before_stream and sorted(rows()) == before_rows
        assert logged(zlog, "Fenced"), open(zlog, errors="replace").read()[-4000:]
        stop_process(owner, signal.SIGTERM)
        assert owner.returncode == 0, open(nlog, errors="replace").read()[-4000:]
    finally:
        stop_process(zombie, signal.SIGKILL)
        if owner is not None:
            stop_process(owner, signal.SIGKILL)
    copied = [(f["src"], f["id"]) for _, f in redis_client.xrange(out_key)]
    for written in (copied, rows()):
        assert not [x for x, n in Counter(written).items() if n > 1], "duplicates"
        assert set(written) == expected and len(written) == len(expected)
