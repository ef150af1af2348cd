"""Issue 26: a driver writing a PostgreSQL table with ``saveToPostgres`` while the server is stopped and started,
inside the sink's commit transaction and at random moments, and killed with SIGKILL while the server is down:
the table holds every input record exactly once.

The test runs its own PostgreSQL cluster (``benchmarks.chaos.PostgresServer``: ``initdb``/``pg_ctl`` as
``scripts/services.sh`` runs the shared one, as the ``postgres`` user when we are root), so it can stop it without
disturbing anybody. The input (2 stream keys of the test Redis server, 150 entries each) is written beforehand;
the driver (tests/fault/redis_sink_app.py) reads it with ``redisStream`` at 10 entries per key and second (15 batches of
20) and writes each entry to a Redis stream (``saveToRedisStream``) and as a row ``(src, id)`` to a table without
a key (``saveToPostgres``: a duplicate would show).

1. The first driver stops itself (SIGSTOP, fault point ``postgres-sink-commit``) inside the commit transaction of
   its second batch, the staged rows not yet moved; the server is stopped (``pg_ctl stop -m immediate``: every
   server process killed, the open transaction lost, and the unlogged staging table emptied by
   the crash recovery), the driver resumed while the server is down (its commit fails and is retried), and the
   server started again 0.5-2.5 s later: the commit finds the staged rows gone, stages the batch again and commits
   it once (before the fix in this branch it committed the batch with 0 rows).
2. At a random moment while batches are committed, the server is stopped (``-m fast``), the driver killed with
   SIGKILL while it is down, and the server started again; a second driver resumes from the checkpoint.
3. Under the second driver the server is stopped (fast or immediate) and started three more times at random
   moments, down 0-2 s each. A driver whose batch exhausted its retries meanwhile stops with the error (exit 1):
   the test restarts it, as a supervisor would (at most 4 times).

Every wait is bounded, and every process the test started (drivers, the PostgreSQL server) is stopped by it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..process_support import stop_process, wait_for
from ..support import service_unavailable
from .test_redis_sink_process import KEYS, driver_env, sink_input

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.redis]

APP = os.path.join(os.path.dirname(__file__), "redis_sink_app.py")
PER_KEY = 150  # 10 per key and batch: 15 batches of 20 records
MAX_RESTARTS = 4  # drivers restarted after a batch exhausted its retries while the server was down


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[tuple[object, Callable[[], list[tuple[str, str]]]]]:
    """A PostgreSQL cluster of this test's own (stopped and removed afterwards) with a table ``copied (src, id)``
    without a key; yields the server and a function returning the table's rows."""
    pytest.importorskip("psycopg")
    import psycopg

    from benchmarks.chaos import PostgresServer

    if shutil.which("pg_ctl") is None and not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        service_unavailable("PostgreSQL is not installed (pg_ctl); run `bash scripts/services.sh start postgres`")
    server = PostgresServer.launch(tmp_path / "postgres")
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE copied (src text NOT NULL, id text NOT NULL)")

        def rows() -> list[tuple[str, str]]:
            with psycopg.connect(server.dsn, connect_timeout=5) as conn:
                return conn.execute("SELECT src, id FROM copied").fetchall()

        yield server, rows
    finally:
        server.destroy()


@pytest.mark.timeout(900)
def test_postgres_restarts_inside_the_commit_and_a_kill_while_it_is_down_write_every_row_once(
        tmp_path, redis_url, redis_client, redis_prefix, own_postgres):
    server, rows = own_postgres
    out_key, expected = sink_input(redis_client, redis_prefix, PER_KEY)
    ckpt, log_path = str(tmp_path / "ckpt"), str(tmp_path / "driver.log")
    base_env = driver_env()
    rng = random.Random(int(os.environ.get("DSTREAMS_TEST_SEED") or 26))

    def start(**fault: str) -> subprocess.Popen:
        log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen([sys.executable, APP, redis_url, f"{redis_prefix}in", str(KEYS), out_key, ckpt,
                                 server.dsn, "copied"], env={**base_env, **fault}, stdout=log,
                                stderr=subprocess.STDOUT, cwd=str(tmp_path))

    def logged(text: str) -> int:
        with open(log_path, errors="replace") as f:
            return f.read().count(text)

    def count_rows() -> int:
        try:
            return len(rows())
        except Exception:  # noqa: BLE001 - the server is being restarted
            return -1

    def log_tail() -> str:
        return open(log_path, errors="replace").read()[-4000:]

    restarts = 0
    proc = start(DSTREAMS_FAULT_PAUSE="postgres-sink-commit", DSTREAMS_FAULT_PAUSE_AFTER="2")
    try:
        # 1. stopped inside the commit of batch 2: the server goes down under the open transaction
        wait_for(lambda: logged("SIGSTOP at postgres-sink-commit #2") == 1, 240, "the driver to stop in its commit",
              proc, log_path)
        assert count_rows() == 20, "batch 1 committed, batch 2 inside its commit"
        server.stop("immediate")
        proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + rng.uniform(0.5, 2.5)  # the resumed commit fails and is retried meanwhile
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_tail()
            time.sleep(0.1)
        server.start()
        wait_for(lambda: count_rows() >= 60, 180, "batches 2 and 3 committed after the restart", proc, log_path)

        # 2. the server stopped while batches are committed, the driver killed with SIGKILL while it is down
        time.sleep(rng.uniform(0, 1))  # a random moment within a batch
        server.stop("fast")
        time.sleep(rng.uniform(0.2, 1.5))
        stop_process(proc, signal.SIGKILL)
        assert proc.returncode in (-signal.SIGKILL, 1), log_tail()  # 1: its batch's retries ran out first
        server.start()
        killed_at = count_rows()
        assert 60 <= killed_at < len(expected), killed_at
        proc = start()
        wait_for(lambda: logged("STARTED") == 2, 180, "the second driver to start", proc, log_path)

        # 3. three more restarts of the server at random moments; a driver stopped by a batch's error is restarted
        def supervise() -> None:
            nonlocal proc, restarts
            if proc.poll() is not None and proc.returncode == 1 and restarts < MAX_RESTARTS:
                restarts += 1
                proc = start()

        def wait_supervised(cond: Callable[[], bool], timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not cond():
                supervise()
                if proc.poll() is not None:
                    raise AssertionError(f"driver exited ({proc.returncode}) waiting for {what}\n{log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out after {timeout} s waiting for {what} ({count_rows()} rows, "
                                       f"{redis_client.xlen(out_key)} entries of {len(expected)})\n{log_tail()}")
                time.sleep(0.2)

        for _ in range(3):
            before = max(count_rows(), killed_at)
            wait_supervised(lambda b=before: count_rows() > b or count_rows() >= len(expected), 180,
                            "more rows before a restart")
            time.sleep(rng.uniform(0, 1))
            server.stop(rng.choice(("fast", "immediate")))
            time.sleep(rng.uniform(0, 2))
            server.start()
        wait_supervised(lambda: count_rows() >= len(expected) and redis_client.xlen(out_key) >= len(expected), 300,
                        "every row and entry")
        stop_process(proc, signal.SIGTERM)
        assert proc.returncode == 0, log_tail()
    finally:
        if proc.poll() is None and proc.returncode is None:
            try:
                proc.send_signal(signal.SIGCONT)  # a driver still stopped at the fault point cannot exit otherwise
            except ProcessLookupError:
                pass
        stop_process(proc, signal.SIGKILL)

    got = rows()
    assert not [x for x, n in Counter(got).items() if n > 1], "duplicate rows"
    assert set(got) == expected and len(got) == len(expected)
    copied = [(f["src"], f["id"]) for _, f in redis_client.xrange(out_key)]
    assert not [x for x, n in Counter(copied).items() if n > 1], "duplicate entries"
    assert set(copied) == expected
    assert logged("STARTED") == 2 + restarts
    # the immediate stop emptied the unlogged staging table under the paused commit: staged again, not committed short
    assert logged("staging the batch again") >= 1, log_tail()
