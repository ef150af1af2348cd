"""``DStream.saveToPostgres`` against the real PostgreSQL server (scripts/services.sh start postgres).

Partitions are staged with COPY in parallel; the driver commits a batch in one transaction with its commit record
and a fence check: a re-run batch writes nothing twice, a fenced driver commits nothing, bad input is named.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dstreams import ManualClock, StreamingContext
from dstreams.postgres.sink import (
    PostgresSinkError,
    claim_output,
    commit_batch,
    resolve_target,
    save_to_postgres,
    session_name,
    stage_partition,
)
from dstreams.recovery.metadata import FencedError
from dstreams.recovery.retry import RetryPolicy
from dstreams.testing import manual_context, run_batches

pytestmark = pytest.mark.postgres

NO_RETRY = RetryPolicy(total_seconds=0)


@pytest.fixture
def pg(postgres_dsn: str) -> Iterator[tuple[str, str]]:
    """A fresh schema of this test's own (dropped afterwards) with the table ``<schema>.words``."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.words (word text PRIMARY KEY, n int NOT NULL CHECK (n >= 0), "
                     "note text)")
    try:
        yield postgres_dsn, schema
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _rows(dsn: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def test_a_stream_appends_each_batch_once(sc, pg):
    dsn, schema = pg
    with manual_context(1, sc=sc) as ssc:
        batches = [[("a", 1, None), ("b", 2, "x")], [], [{"word": "c", "n": 3}]]
        ssc.queueStream([sc.parallelize(b, 2) for b in batches]).saveToPostgres(dsn, f"{schema}.words")
        ssc.start()
        infos = run_batches(ssc, 3)
        with urllib.request.urlopen(ssc.uiWebUrl + "/metrics", timeout=10) as r:
            exposition = r.read().decode()
    (family,) = [f for f in text_string_to_metric_families(exposition) if f.name == "dstreams_output_records"]
    assert [s.value for s in family.samples if s.name == "dstreams_output_records_total"] == [3]  # /metrics
    assert _rows(dsn, f"SELECT word, n, note FROM {schema}.words ORDER BY word") == [
        ("a", 1, None), ("b", 2, "x"), ("c", 3, None)]
    assert [[op.records_written for op in i.output_operations.values()] for i in infos] == [[2], [0], [1]]
    assert _rows(dsn, f"SELECT batch_ms, rows FROM {schema}.dstreams_sink_commits ORDER BY 1") == [
        (1000, 2), (2000, 0), (3000, 1)]


def test_a_rerun_batch_writes_nothing_twice(sc, pg):
    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    rdd = sc.parallelize([(f"w{i}", i) for i in range(10)], 3)
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 10
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 0
    assert _rows(dsn, f"SELECT count(*) FROM {schema}.words") == [(10,)]
    assert _rows(dsn, f'SELECT count(*) FROM {schema}."{target.staging.split(".")[1]}"') == [(0,)]


def test_a_kill_between_staging_and_commit_is_completed_once(sc, pg):
    """Partitions staged (twice: a dead attempt's rows are left behind) but not committed, then the driver died:
    the re-run commits the batch once, and only the kept attempts' rows."""
    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    rdd = sc.parallelize([(f"w{i}", i) for i in range(6)], 2)
    rdd.mapPartitionsWithIndex(stage_partition(target, 1000)).collect()  # the dead driver's staging
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 6
    assert sorted(_rows(dsn, f"SELECT word FROM {schema}.words")) == [(f"w{i}",) for i in range(6)]


def test_staged_rows_lost_before_the_commit_are_staged_again_not_committed_short(sc, pg, monkeypatch):
    """The staging table is unlogged: a crash recovery of the server (``pg_ctl stop -m immediate``) empties it. A
    commit that finds fewer staged rows than the tasks staged commits nothing (no short batch, no commit record)
    and the write stages the batch again."""
    import psycopg

    from dstreams.postgres import sink as postgres_sink

    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    staging = f'{schema}."{target.staging.split(".")[1]}"'
    rdd = sc.parallelize([(f"w{i}", i) for i in range(6)], 2)
    staged = rdd.mapPartitionsWithIndex(stage_partition(target, 1000)).collect()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {staging}")  # what the crash recovery does to an unlogged table
    with pytest.raises(postgres_sink.StagingLostError, match="0 staged rows of 6"):
        commit_batch(target, 1000, staged, 1)
    assert _rows(dsn, f"SELECT count(*) FROM {schema}.words") == [(0,)]
    assert _rows(dsn, f"SELECT count(*) FROM {schema}.dstreams_sink_commits") == [(0,)]

    real_commit, calls = postgres_sink.commit_batch, []

    def commit_after_a_crash(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"TRUNCATE {staging}")
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(postgres_sink, "commit_batch", commit_after_a_crash)
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 6
    assert len(calls) == 2
    assert sorted(_rows(dsn, f"SELECT word FROM {schema}.words")) == [(f"w{i}",) for i in range(6)]
    assert _rows(dsn, f"SELECT batch_ms, rows FROM {schema}.dstreams_sink_commits") == [(1000, 6)]


def test_upsert_updates_by_key_and_the_last_record_of_a_key_wins(sc, pg):
    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "upsert", ["word"], ["word", "n"], "out")
    save_to_postgres(sc.parallelize([("a", 1), ("b", 1)], 1), 1000, target, policy=NO_RETRY)
    assert save_to_postgres(sc.parallelize([("a", 5), ("c", 1), ("a", 7)], 2), 2000, target, policy=NO_RETRY) == 2
    assert _rows(dsn, f"SELECT word, n FROM {schema}.words ORDER BY word") == [("a", 7), ("b", 1), ("c", 1)]


def test_a_fenced_driver_commits_nothing(sc, pg):
    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    save_to_postgres(sc.parallelize([("a", 1)], 1), 1000, target, epoch=2, policy=NO_RETRY)  # the new owner
    with pytest.raises(FencedError, match="epoch 2"):
        save_to_postgres(sc.parallelize([("z", 1)], 1), 2000, target, epoch=1, policy=NO_RETRY)  # the zombie
    staged = sc.parallelize([("y", 1)], 1).mapPartitionsWithIndex(stage_partition(target, 3000)).collect()
    with pytest.raises(FencedError):  # staged before the takeover, committed after it
        commit_batch(target, 3000, staged, 1)
    assert _rows(dsn, f"SELECT word FROM {schema}.words") == [("a",)]


def _in_thread(func, timeout_s: float):  # noqa: ANN001, ANN202
    """``func()``'s result, run in a thread; fails the test if it has not returned within ``timeout_s``."""
    import threading

    out: dict = {}

    def run() -> None:
        try:
            out["value"] = func()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"{func} did not return within {timeout_s} s: it waits on the zombie's locks"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_a_new_driver_claims_its_output_at_start_past_a_zombie_s_open_transactions(sc, pg, tmp_path):
    """Issue 42: a zombie (epoch 1) paused inside its commit (the fence row locked) and inside a COPY (its staging
    transaction open) holds up neither the new driver's set-up nor its claim: the claim ends the zombie's sessions
    and raises the fence to epoch 2 before the new driver commits anything, so the zombie's commit is fenced off;
    an older driver that starts late is refused. A started context claims its output before its first batch."""
    import psycopg

    dsn, schema = pg
    table = f"{schema}.words"
    target = resolve_target(dsn, table, "append", None, ["word", "n"], "out")
    staged = sc.parallelize([("z", 1)], 1).mapPartitionsWithIndex(stage_partition(target, 2000, 1)).collect()
    in_commit = psycopg.connect(dsn, application_name=session_name(target, 1))
    in_copy = psycopg.connect(dsn, application_name=session_name(target, 1))
    try:
        in_commit.execute(f"INSERT INTO {schema}.dstreams_sink_fences (output, epoch) VALUES ('out', 1) "
                          "ON CONFLICT (output) DO UPDATE SET epoch = 1")  # the fence row locked, not committed
        in_copy.execute(f"INSERT INTO {target.staging} (word, n, _ds_output, _ds_batch, _ds_part, _ds_row, "
                        "_ds_attempt) VALUES ('q', 1, 'out', 2000, 0, 0, 'zombie')")  # a COPY in progress
        again = _in_thread(lambda: resolve_target(dsn, table, "append", None, ["word", "n"], "out"), 30)
        assert again == target
        _in_thread(lambda: claim_output(target, 2), 60)
        for conn in (in_commit, in_copy):  # the zombie's sessions were ended: its transactions rolled back
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
    finally:
        in_commit.close()
        in_copy.close()
    assert _rows(dsn, f"SELECT epoch FROM {schema}.dstreams_sink_fences") == [(2,)]
    with pytest.raises(FencedError, match="epoch 2"):  # the new owner has committed nothing yet
        commit_batch(target, 2000, staged, 1)
    with pytest.raises(FencedError, match="epoch 2"):
        claim_output(target, 1)
    claim_output(target, 2)  # a restart of the same driver's epoch: nothing to end, the fence as it is
    assert _rows(dsn, f"SELECT count(*) FROM {schema}.words") == [(0,)]

    (tmp_path / "in").mkdir()
    # a context with a checkpoint claims at start()
    with manual_context(1, sc=sc, checkpoint=str(tmp_path / "ckpt")) as ssc:
        ssc.textFileStream(str(tmp_path / "in")).map(lambda w: (w, 1)).saveToPostgres(dsn, table,
                                                                                    columns=["word", "n"])
        ssc.start()
        (row,) = _rows(dsn, f"SELECT epoch FROM {schema}.dstreams_sink_fences WHERE output <> 'out'")
        assert row == (1,), "claimed before the first batch"


def test_a_missing_table_or_column_is_named(pg):
    dsn, schema = pg
    with pytest.raises(PostgresSinkError, match=r"table '.*\.nope' does not exist"):
        resolve_target(dsn, f"{schema}.nope", "append", None, None, "out")
    with pytest.raises(PostgresSinkError, match=r"has no column 'count'.*word, n, note"):
        resolve_target(dsn, f"{schema}.words", "append", None, ["word", "count"], "out")


def test_a_value_of_the_wrong_type_names_the_batch_record_and_column(sc, pg):
    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    rdd = sc.parallelize([("a", 1), ("b", "two")], 1)
    with pytest.raises(Exception, match=r"batch 1000, partition 0, record 1, column 'n': invalid input syntax"):
        save_to_postgres(rdd, 1000, target, policy=NO_RETRY)
    assert _rows(dsn, f"SELECT count(*) FROM {schema}.words") == [(0,)]


def test_a_constraint_violation_names_the_batch_column_and_record(sc, pg):
    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    with pytest.raises(PostgresSinkError, match=r"batch 1000, partition 1, record 0, column 'n'.*not-null"):
        save_to_postgres(sc.parallelize([("a", 1), ("b", None)], 2), 1000, target, policy=NO_RETRY)
    with pytest.raises(PostgresSinkError, match=r"batch 2000.*constraint 'words_pkey'.*Key \(word\)=\(a\)"):
        save_to_postgres(sc.parallelize([("a", 1), ("a", 2)], 2), 2000, target, policy=NO_RETRY)
    with pytest.raises(PostgresSinkError, match=r"batch 3000.*constraint 'words_n_check'"):
        save_to_postgres(sc.parallelize([(f"w{i}", i) for i in range(300)] + [("a", -1)], 3), 3000, target,
                         policy=NO_RETRY)
    assert _rows(dsn, f"SELECT count(*) FROM {schema}.words") == [(0,)]
    # A refused batch leaves nothing in the staging table (a try of it stages again).
    assert _rows(dsn, f'SELECT count(*) FROM {schema}."{target.staging.split(".")[1]}"') == [(0,)]


def test_a_connection_lost_in_the_commit_is_retried_and_commits_once(sc, pg, monkeypatch):
    """The first commit attempt loses its connection (after the server committed it: the worst case); the retry
    finds the commit record, adds nothing, and still counts the rows as written by this write."""
    import psycopg

    from dstreams.postgres import sink as postgres_sink

    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    real_commit = postgres_sink.commit_batch
    calls = []

    def lossy_commit(*args, **kwargs):
        calls.append(1)
        written = real_commit(*args, **kwargs)
        if len(calls) == 1:  # committed, but the reply was lost
            try:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            except psycopg.OperationalError as e:
                raise postgres_sink.TransientStoreError(f"lost: {e}") from e
        return written

    monkeypatch.setattr(postgres_sink, "commit_batch", lossy_commit)
    written = save_to_postgres(sc.parallelize([("a", 1), ("b", 2)], 2), 1000, target,
                               policy=RetryPolicy(total_seconds=10, initial=0.01))
    assert len(calls) == 2 and written == 2  # the retry found the batch committed, by this write (its token)
    assert _rows(dsn, f"SELECT word, n FROM {schema}.words ORDER BY word") == [("a", 1), ("b", 2)]


def test_a_connection_lost_while_staging_is_an_outage_not_a_batch_failure(sc, pg):
    """A server restarting or unreachable while a task stages its rows (psycopg's ``OperationalError``, such as
    ``AdminShutdown`` from a server going down under the COPY) is a store outage, which the batch rides out
    (``spark.dstreams.store.outageSeconds``), not an error that fails the batch after its few tries."""
    import dataclasses

    from dstreams.recovery.outage import is_store_outage

    dsn, schema = pg
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out")
    gone = dataclasses.replace(target, dsn="postgresql://dstreams@127.0.0.1:9/dstreams")  # nothing listens there
    with pytest.raises(Exception) as raised:
        sc.parallelize([("a", 1), ("b", 2)], 2).mapPartitionsWithIndex(stage_partition(gone, 1000)).collect()
    assert is_store_outage(raised.value), str(raised.value)[-2000:]
    assert "PostgreSQL connection lost while staging saveToPostgres" in str(raised.value)


def _services(*args: str) -> None:
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"
    done = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"services.sh {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
@pytest.mark.serial  # the shared server stops and starts
def test_a_postgres_restart_between_batches_loses_and_repeats_nothing(sc, pg, monkeypatch):
    """The server is stopped after batch 1; batch 2 fails (no server) and is retried by the scheduler while the
    server starts again; every row is in the table once."""
    import os

    from ..support import POSTGRES_DSN

    if os.environ.get("DSTREAMS_TEST_POSTGRES_DSN"):
        pytest.skip("DSTREAMS_TEST_POSTGRES_DSN names a server scripts/services.sh does not own: not restarted")
    dsn, schema = pg
    assert dsn == POSTGRES_DSN
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "8")  # 0.5 + 1 + 2 + ... s between attempts
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    batches = [[(f"a{i}", i) for i in range(5)], [(f"b{i}", i) for i in range(5)], [("c", 1)]]
    ssc.queueStream([sc.parallelize(b, 2) for b in batches]).saveToPostgres(dsn, f"{schema}.words",
                                                                            columns=["word", "n"])
    ssc.start()
    try:
        run_batches(ssc, 1, check=False)
        _services("stop", "postgres")
        try:
            clock.set_time(2000)  # batch 2 runs against no server
        finally:
            _services("start", "postgres")
        ssc.awaitBatch(2000, 120)
        clock.set_time(3000)
        ssc.awaitBatch(3000, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    rows = _rows(dsn, f"SELECT word FROM {schema}.words")
    assert sorted(rows) == sorted((w,) for b in batches for w, _ in b)


def test_refused_records_go_to_the_dead_letters_in_the_batch_transaction(sc, pg):
    """With onError='deadLetter' the records the table refuses (check, not null, unique) are written to
    dstreams_sink_dead_letters in the batch's transaction and the other rows are committed, in order; a re-run
    writes nothing twice. The failing write's error names that way out."""
    dsn, schema = pg
    plain = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "plain")
    with pytest.raises(PostgresSinkError, match=r"onError='deadLetter'.*dstreams_sink_dead_letters"):
        save_to_postgres(sc.parallelize([("a", -1)], 1), 1000, plain, policy=NO_RETRY)
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out", "deadLetter")
    records = [(f"w{i}", i) for i in range(40)]
    records[7] = ("bad-check", -7)
    records[21] = ("bad-null", None)
    records[33] = ("w3", 33)  # a duplicate key of record 3
    rdd = sc.parallelize(records, 3)
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 37
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 0
    assert _rows(dsn, f"SELECT count(*) FROM {schema}.words") == [(37,)]
    dead = _rows(dsn, f"SELECT output, batch_ms, record, constraint_name, error FROM {schema}."
                      "dstreams_sink_dead_letters ORDER BY part, row")
    assert [(o, b, r) for o, b, r, _c, _e in dead] == [
        ("out", 1000, {"word": "bad-check", "n": -7}), ("out", 1000, {"word": "bad-null", "n": None}),
        ("out", 1000, {"word": "w3", "n": 33})]
    assert dead[0][3] == "words_n_check" and dead[2][3] == "words_pkey"
    assert dead[1][4].startswith("NotNullViolation") and "Key (word)=(w3)" in dead[2][4]
    assert _rows(dsn, f'SELECT count(*) FROM {schema}."{target.staging.split(".")[1]}"') == [(0,)]


def test_records_copy_cannot_convert_go_to_the_dead_letters_with_the_batch(sc, pg):
    """A value of the wrong type and a record of the wrong shape: with onError='deadLetter' each is staged as a
    marked row and moved to the dead letters by the batch's commit, with a constraint refusal beside them; the other
    rows are committed; a re-run writes nothing twice. Without it the error names that way out."""
    dsn, schema = pg
    plain = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "plain")
    with pytest.raises(Exception, match=r"record 1, column 'n': invalid input syntax.*onError='deadLetter'"):
        save_to_postgres(sc.parallelize([("a", 1), ("b", "two")], 1), 1000, plain, policy=NO_RETRY)
    target = resolve_target(dsn, f"{schema}.words", "append", None, ["word", "n"], "out", "deadLetter")
    records = [("a", 1), ("b", "two"), ("c", 3), ("short",), ("d", "4x"), ("e", -5), ("f", 6)]
    rdd = sc.parallelize(records, 2)  # partition 0: a, b, short; partition 1: short.. d, e, f
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 3
    assert save_to_postgres(rdd, 1000, target, epoch=1, policy=NO_RETRY) == 0
    assert _rows(dsn, f"SELECT word, n FROM {schema}.words ORDER BY word") == [("a", 1), ("c", 3), ("f", 6)]
    dead = _rows(dsn, f"SELECT record, error, constraint_name FROM {schema}.dstreams_sink_dead_letters "
                      "ORDER BY part, row")
    assert [r for r, _e, _c in dead] == [{"word": "b", "n": "two"}, ["short"], {"word": "d", "n": "4x"},
                                         {"word": "e", "n": -5}]
    assert dead[0][1].startswith("InvalidTextRepresentation: column 'n': invalid input syntax for type integer")
    assert dead[1][1].startswith("TypeError: the record ('short',) is neither a dict nor a tuple of 2 values")
    assert [c for _r, _e, c in dead] == [None, None, None, "words_n_check"]
    assert _rows(dsn, f'SELECT count(*) FROM {schema}."{target.staging.split(".")[1]}"') == [(0,)]


def test_a_stream_routes_refused_records_and_goes_on(sc, pg):
    dsn, schema = pg
    with manual_context(1, sc=sc) as ssc:
        batches = [[("a", 1, None), ("b", -2, None)], [("c", 3, None)]]
        ssc.queueStream([sc.parallelize(b, 2) for b in batches]).saveToPostgres(dsn, f"{schema}.words",
                                                                               onError="deadLetter")
        ssc.start()
        infos = run_batches(ssc, 2, check=False)  # what the outputs met is checked below
    assert not [op.failure_reason for i in infos for op in i.output_operations.values() if op.failure_reason]
    assert _rows(dsn, f"SELECT word, n FROM {schema}.words ORDER BY word") == [("a", 1), ("c", 3)]
    assert _rows(dsn, f"SELECT batch_ms, record FROM {schema}.dstreams_sink_dead_letters") == [
        (1000, {"word": "b", "n": -2, "note": None})]


def test_a_claim_at_start_rides_out_a_server_that_does_not_answer():
    """A driver starting while PostgreSQL restarts (refused connections) retries its claim with the store's retry
    policy, as the commit does, and then says the store is unavailable, rather than failing ``start()`` at once."""
    import socket

    from dstreams.postgres.sink import PostgresTarget, claim_at_start
    from dstreams.recovery.store.errors import StoreUnavailableError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"postgresql://nobody@127.0.0.1:{port}/none"
    calls = []

    def target() -> PostgresTarget:
        calls.append(1)
        return PostgresTarget(dsn, "t", ("a",), "append", (), "out")

    with pytest.raises(StoreUnavailableError, match="claim"):
        claim_at_start(target, 2, dsn, RetryPolicy(total_seconds=1.5))
    assert len(calls) >= 2, "retried"
