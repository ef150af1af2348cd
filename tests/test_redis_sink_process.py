"""Issue 26: a driver writing a Redis stream with ``saveToRedisStream`` (and a PostgreSQL table with
``saveToPostgres``), killed inside a sink's write and at a random moment, adds every entry exactly once.

The input (2 stream keys, 40 entries each) is written beforehand; the driver (tests/redis_sink_app.py) reads it
with ``redisStream`` at 10 entries per key and second (4 batches of 20) and copies each entry to one output
stream in chunks of 3. The first driver kills itself (SIGKILL, fault point ``redis-sink-chunk``) after its 10th
chunk: batch 1 is written, batch 2 only up to its third chunk. The second driver is killed with SIGKILL at a
random moment after more entries arrived; the third drains the input and stops. The output stream must hold
every input entry exactly once. The second test does the same with a table as a second output, the first kill
inside the table's commit transaction (fault point ``postgres-sink-commit``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from .test_redis_process import _stop, _wait

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.redis]

APP = os.path.join(os.path.dirname(__file__), "redis_sink_app.py")
KEYS = 2
PER_KEY = 40


def _scenario(tmp_path, redis_url, redis_client, redis_prefix, fault: dict[str, str], after_kill, done,
              pg: tuple[str, ...] = ()) -> set[tuple[str, str]]:
    """Write the input, run the three drivers (the first killed by ``fault``, checked by ``after_kill()``; the second
    killed at a random moment; the third stopped once ``done()``); returns the input entries ``(key, id)``."""
    keys = [f"{redis_prefix}in{i}" for i in range(KEYS)]
    out_key = f"{redis_prefix}out"
    expected = {(k, redis_client.xadd(k, {"n": str(n)})) for k in keys for n in range(PER_KEY)}
    ckpt, log_path = str(tmp_path / "ckpt"), str(tmp_path / "driver.log")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DSTREAMS_FAULT_")}
    base_env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)

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
        _wait(lambda: redis_client.xlen(out_key) > 40, 180, "more entries after the first restart", proc, log_path)
        time.sleep(rng.uniform(0, 1))  # a random moment within a batch
        _stop(proc, signal.SIGKILL)
        proc = start()
        _wait(lambda: started() == 3, 180, "the third driver to start", proc, log_path)
        _wait(lambda: redis_client.xlen(out_key) >= len(expected) and done(), 180, "all entries", proc, log_path)
        _stop(proc, signal.SIGTERM)
        assert proc.returncode == 0, open(log_path, errors="replace").read()[-4000:]
    finally:
        _stop(proc, signal.SIGKILL)
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
                                                                             redis_prefix, postgres_dsn):
    import psycopg

    schema = f"t_{redis_prefix.split(':')[1]}"
    table = f"{schema}.copied"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {table} (src text NOT NULL, id text NOT NULL)")  # no key: duplicates would show

    def rows() -> list[tuple[str, str]]:
        with psycopg.connect(postgres_dsn) as conn:
            return conn.execute(f"SELECT src, id FROM {table}").fetchall()

    def after_kill() -> None:
        assert len(rows()) == 20, "batch 1 committed, batch 2 killed inside its commit"

    try:
        expected = _scenario(tmp_path, redis_url, redis_client, redis_prefix,
                             {"DSTREAMS_FAULT_KILL": "postgres-sink-commit", "DSTREAMS_FAULT_KILL_AFTER": "2"},
                             after_kill, lambda: len(rows()) >= PER_KEY * KEYS, (postgres_dsn, table))
        got = rows()
        assert not [x for x, n in Counter(got).items() if n > 1], "duplicate rows"
        assert set(got) == expected and len(got) == len(expected)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
