"""Exactly-once output into a PostgreSQL table: partitions staged in parallel, the batch committed in one transaction
together with its commit record.

Contract of :func:`save_to_postgres` (the sink behind ``DStream.saveToPostgres``):

* **Stage.** Each task ``COPY``\\ s its partition into the output's staging table (``<table>__dstreams_<hash of the
  columns>``, unlogged, the target's columns plus ``_ds_output``, ``_ds_batch``, ``_ds_part``, ``_ds_row`` and
  ``_ds_attempt``, a fresh id per task attempt) and commits; tasks run in parallel. A retried or speculative
  attempt stages its rows under its own attempt id; the driver takes, per partition, the one attempt whose
  result Spark kept.
* **Commit.** The driver then runs ONE transaction: (1) the fence: the row of ``dstreams_sink_fences`` for this
  output is raised to this driver's epoch (the metadata log's) and locked; a higher epoch there means a newer
  driver owns the output, and the transaction aborts with :class:`~dstreams.recovery.metadata.FencedError`;
  (2) the commit record: when ``dstreams_sink_commits`` already has ``(output, batch)``, the batch was committed
  by an earlier run and nothing is added (a re-run after a kill, a failover, a zombie); (3) the kept attempts'
  rows are moved into the table (``INSERT ... SELECT`` in partition and record order; for ``mode="upsert"`` the
  last record per key wins and ``ON CONFLICT (keyColumns) DO UPDATE``); (4) the commit record is inserted;
  (5) the batch's staging rows (every attempt's) are deleted. The batch's rows become visible at the ``COMMIT``,
  all at once, together with the record that they were committed: exactly once.
* **Staged rows lost.** Before (3) the commit counts the kept attempts' staged rows; fewer than the tasks staged
  (the staging table is unlogged: PostgreSQL empties it in the crash recovery after a crash or an immediate
  shutdown, ``pg_ctl stop -m immediate``) aborts the transaction with :class:`StagingLostError` instead of
  committing the batch short, and the driver stages the batch again and commits (``STAGE_ATTEMPTS`` times in
  all, then the batch fails and the scheduler's batch retries apply).
* **Fencing.** ``guard()`` (the metadata log's check) runs before the staging job, and the epoch row inside the
  commit transaction closes the window between that check and the commit: a zombie driver paused anywhere
  commits nothing once the new owner committed a batch of the output. Without a checkpoint location there is no
  epoch and no fence row (no failover either).
* **The output's name** (``outputName``, the key of the commit records and the fence) defaults to the table and
  the checkpoint location: two jobs, or two outputs of one job, writing one table need distinct names; a job
  started on a new checkpoint location starts new commit records (and epochs from 1).
* **Dead letters** (``onError="deadLetter"``): a record the table refuses at the commit (a unique, check, not-null
  or foreign-key constraint) is written, instead of failing the batch, into ``dstreams_sink_dead_letters`` (in the
  table's schema; created by the sink: ``output, batch_ms, part, row, record`` as JSON, ``error``,
  ``constraint_name``) in the same transaction as the batch's other rows and commit record: exactly once, like
  them. The batch is tried whole first; when refused, in halved ranges of rows until each refused row is alone.
  A record ``COPY`` cannot convert (a value of the wrong type) or that does not fit the columns is found while its
  partition is staged (``COPY`` names the line; the partition is staged again without it, and it is staged as a
  marked row holding the record and the error) and moved to the dead letters by the same commit
  (``constraint_name`` NULL). With ``mode="upsert"``, a refused record
  that a later record of its key replaces in the same range of rows may be replaced rather than reported.
* **Bad input** fails the batch with :class:`PostgresSinkError` naming the batch, the table and, where Postgres
  says, the column and the record (partition and position in it): a missing table or column (before anything
  is written), a value of the wrong type (``COPY`` refuses it: the task fails), a constraint violation (unique,
  not null, check, foreign key: the commit fails, nothing of the batch is visible). A lost connection in the
  commit is retried with the store's retry policy (:class:`~dstreams.recovery.retry.RetryPolicy`; safe, since
  the retried transaction finds the commit record if the lost one committed); a lost connection in a task fails
  the task (Spark's task retries, then the batch's retries). Past the bounds the context stops with the batch
  not done; a restart re-runs it. A write that fails (other than fenced off or on a server down) deletes its
  batch's staged rows (:func:`discard_staged`), so a refused or dropped batch leaves nothing in the staging table;
  a write cut by a kill leaves its rows to the batch's re-run, whose commit deletes every attempt's. (A task of a
  failed staging job that Spark had not stopped yet may still commit its rows after that delete.)
* **Records**: tuples or lists in the order of ``columns`` (default: all of the table's columns in table order),
  or dicts by column name (missing keys are NULL). Values are adapted by psycopg.
* **Records written**: the rows the commit inserted or updated (0 for a batch committed by an earlier run; a commit
  whose reply was lost and that the retry finds is recognised by its token and counted).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark import RDD

from dstreams import faults
from dstreams.errors import DStreamsError
from dstreams.output_records import add_written
from dstreams.recovery.metadata import FencedError
from dstreams.recovery.retry import RetryPolicy
from dstreams.recovery.store.errors import TransientStoreError

log = logging.getLogger(__name__)

COMMITS = "dstreams_sink_commits"
FENCES = "dstreams_sink_fences"
#: The dead letters of the outputs with ``onError="deadLetter"``: the records the table refused, per output and batch.
DEAD_LETTERS = "dstreams_sink_dead_letters"
MODES = ("append", "upsert")
#: The start of the ``application_name`` of the sink's connections (:func:`session_name`).
SESSION_PREFIX = "dstreams-sink e"
#: How long the takeover waits for a lock on the output's fence row after ending the older drivers' sessions.
CLAIM_LOCK_TIMEOUT_S = 30
_META = ("_ds_output", "_ds_batch", "_ds_part", "_ds_row", "_ds_attempt")
#: The staging columns of a record ``COPY`` refused (``onError="deadLetter"``): the record as JSON, the error.
_DEAD_META = ("_ds_dead", "_ds_error")
#: How many times one write stages its batch when the commit finds staged rows lost (module docstring).
STAGE_ATTEMPTS = 3


class PostgresSinkError(DStreamsError, RuntimeError):
    """A batch could not be written to its table: the message names the batch, the table, and where Postgres says,
    the column and the record."""


class StagingLostError(DStreamsError, RuntimeError):
    """The commit found fewer staged rows of the batch than its tasks staged (the unlogged staging table was
    emptied by a crash recovery of the server): nothing was committed; stage again."""


@dataclass(frozen=True)
class PostgresTarget:
    """Where and how an output writes; ``columns`` and ``key_columns`` are resolved against the table."""

    dsn: str
    table: str
    columns: tuple[str, ...]
    mode: str
    key_columns: tuple[str, ...]
    output: str
    #: ``"fail"``: a refused record fails the batch; ``"deadLetter"``: it goes to :data:`DEAD_LETTERS`.
    on_error: str = "fail"

    @property
    def schema_prefix(self) -> str:
        return self.table.rsplit(".", 1)[0] + "." if "." in self.table else ""

    @property
    def dead_letters(self) -> str:
        return self.schema_prefix + DEAD_LETTERS

    @property
    def staging(self) -> str:
        digest = hashlib.sha1(",".join(self.columns).encode()).hexdigest()[:8]
        return f"{self.table}__dstreams_{digest}"


def _connect(dsn: str, session: str | None = None) -> Any:
    """A connection to ``dsn``; ``session``: its ``application_name`` (:func:`session_name`)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - an installation problem
        raise ImportError("saveToPostgres needs psycopg 3: pip install 'dstreams[postgres]'") from None
    if session is None:
        return psycopg.connect(dsn, connect_timeout=10)
    return psycopg.connect(dsn, connect_timeout=10, application_name=session)


def _output_digest(output: str) -> str:
    return hashlib.sha1(output.encode()).hexdigest()[:16]


def session_name(target: PostgresTarget, epoch: int | None) -> str | None:
    """The ``application_name`` of a driver's or task's connections for ``target``'s output under ``epoch``
    (``dstreams-sink e<epoch> <digest of the output>``; None without an epoch): how :func:`claim_output` finds the
    sessions of older drivers."""
    return None if epoch is None else f"{SESSION_PREFIX}{epoch} {_output_digest(target.output)}"


def _ident(name: str) -> Any:
    from psycopg import sql

    return sql.Identifier(*name.split("."))


def _idents(names: Iterable[str]) -> Any:
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def resolve_target(dsn: str, table: str, mode: str, key_columns: Sequence[str] | None,
                   columns: Sequence[str] | None, output: str, on_error: str = "fail") -> PostgresTarget:
    """Check the table and columns (``PostgresSinkError`` naming what is missing) and create the sink's own tables
    (commit records, fences, this output's staging table) when they do not exist. Runs on the driver."""
    from psycopg import sql

    if mode not in MODES:
        raise ValueError(f"saveToPostgres: mode must be one of {MODES}, got {mode!r}")
    with _connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass(%s)::oid", [table]).fetchone()
        if row is None or row[0] is None:
            raise PostgresSinkError(f"saveToPostgres: the table {table!r} does not exist in {_safe_dsn(dsn)}: create "
                                    "it first (the sink never creates or alters a user's table)")
        existing = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", [row[0]])]
        cols = tuple(columns) if columns else tuple(existing)
        keys = tuple(key_columns or ())
        missing = [c for c in (*cols, *keys) if c not in existing]
        if missing:
            raise PostgresSinkError(f"saveToPostgres: the table {table!r} has no column {missing[0]!r} (its columns: "
                                    f"{', '.join(existing)})")
        if mode == "upsert" and (not keys or any(k not in cols for k in keys)):
            raise ValueError("saveToPostgres(mode='upsert') needs keyColumns, a subset of columns, that a unique "
                             f"index of {table!r} covers; got keyColumns={list(keys)}, columns={list(cols)}")
        if on_error not in ("fail", "deadLetter"):
            raise ValueError(f"saveToPostgres: onError must be 'fail' or 'deadLetter', got {on_error!r}")
        target = PostgresTarget(dsn, table, cols, mode, keys, output, on_error)
        schema = target.schema_prefix
        with conn.transaction():
            if on_error == "deadLetter":
                conn.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (output text NOT NULL, batch_ms bigint NOT NULL, part int NOT NULL, "
                    "row bigint NOT NULL, record jsonb, error text NOT NULL, constraint_name text, "
                    "PRIMARY KEY (output, batch_ms, part, row))").format(_ident(target.dead_letters)))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (output text NOT NULL, batch_ms bigint NOT NULL, "
                                 "rows bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), token text, "
                                 "PRIMARY KEY (output, batch_ms))").format(_ident(schema + COMMITS)))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (output text PRIMARY KEY, epoch bigint NOT NULL)")
                         .format(_ident(schema + FENCES)))
            if not _staging_ready(conn, target):
                # DDL only when something is missing: an ALTER or CREATE INDEX waits for every open transaction on
                # the staging table, a paused (zombie) driver's COPY included (issue 42)
                conn.execute(sql.SQL("CREATE UNLOGGED TABLE IF NOT EXISTS {} AS SELECT {} FROM {} WITH NO DATA")
                             .format(_ident(target.staging), _idents(cols), _ident(table)))
                conn.execute(sql.SQL(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS _ds_output text, ADD COLUMN IF NOT EXISTS _ds_batch "
                    "bigint, ADD COLUMN IF NOT EXISTS _ds_part int, ADD COLUMN IF NOT EXISTS _ds_row bigint, ADD "
                    "COLUMN IF NOT EXISTS _ds_attempt text, ADD COLUMN IF NOT EXISTS _ds_dead jsonb, ADD COLUMN IF "
                    "NOT EXISTS _ds_error text").format(_ident(target.staging)))
                conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (_ds_output, _ds_batch, _ds_part)").format(
                    sql.Identifier(_staging_index(target)), _ident(target.staging)))
    return target


def _staging_index(target: PostgresTarget) -> str:
    return target.staging.rsplit(".", 1)[-1] + "_batch"


def _staging_ready(conn: Any, target: PostgresTarget) -> bool:
    """Whether the staging table, its columns and its index exist, read from the catalog (no lock on the table)."""
    row = conn.execute("SELECT to_regclass(%s)::oid", [_quoted(target.staging)]).fetchone()
    if row is None or row[0] is None:
        return False
    have = {r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT "
                                       "attisdropped", [row[0]])}
    if not {*target.columns, *_META, *_DEAD_META} <= have:
        return False
    index = (target.schema_prefix + _staging_index(target)) if target.schema_prefix else _staging_index(target)
    found = conn.execute("SELECT to_regclass(%s)::oid", [_quoted(index)]).fetchone()
    return found is not None and found[0] is not None


def _quoted(name: str) -> str:
    """``schema.name`` as a quoted identifier for ``to_regclass`` (the sink quotes every name it creates)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def claim_output(target: PostgresTarget, epoch: int) -> None:
    """Take the output for the driver of ``epoch`` when it starts, before its first batch (issue 42): end the
    sessions of older drivers of this output (found by :func:`session_name`; a zombie's open transaction is rolled
    back and its locks go), then raise the output's fence row to ``epoch``. From then on an older driver's commit
    fails with ``FencedError``, whether or not this driver has committed anything yet. Raises ``FencedError`` when
    a newer driver owns the output already, and ``PostgresSinkError`` when the fence row stays locked for
    :data:`CLAIM_LOCK_TIMEOUT_S` (a session this one could not end: another database user's)."""
    import psycopg
    from psycopg import sql

    mine = session_name(target, epoch)
    assert mine is not None
    digest = _output_digest(target.output)
    with _connect(target.dsn, mine) as conn:
        conn.autocommit = True
        older = [(pid, name) for pid, name in conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE application_name LIKE %s AND pid <> "
            "pg_backend_pid()", [f"{SESSION_PREFIX}% {digest}"]).fetchall()
            if _session_epoch(name) is not None and _session_epoch(name) < epoch]  # type: ignore[operator]
        for pid, name in older:
            try:
                conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                log.warning("saveToPostgres into %r: ended session %d (%s) of an older driver of output %r",
                            target.table, pid, name, target.output)
            except psycopg.Error as e:  # not allowed (another user's session): the lock timeout below bounds it
                log.warning("saveToPostgres into %r: could not end session %d of an older driver: %s", target.table,
                            pid, e)
        conn.autocommit = False
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                    sql.Literal(f"{CLAIM_LOCK_TIMEOUT_S}s")))
                (owner,) = conn.execute(sql.SQL(
                    "INSERT INTO {} AS f (output, epoch) VALUES (%s, %s) ON CONFLICT (output) DO UPDATE SET epoch = "
                    "GREATEST(f.epoch, EXCLUDED.epoch) RETURNING epoch").format(
                    _ident(target.schema_prefix + FENCES)), [target.output, epoch]).fetchone()
        except psycopg.errors.LockNotAvailable:
            raise PostgresSinkError(
                f"saveToPostgres into {target.table!r}: the fence row of output {target.output!r} stayed locked for "
                f"{CLAIM_LOCK_TIMEOUT_S} s by a session this driver could not end (see pg_locks): end it "
                "(pg_terminate_backend) and start again") from None
    if owner > epoch:
        raise FencedError(f"saveToPostgres into {target.table!r}: a newer driver (epoch {owner}) owns the output "
                          f"{target.output!r}; this one (epoch {epoch}) must not write it")


def claim_at_start(target_of: Callable[[], PostgresTarget], epoch: int, dsn: str,
                   policy: RetryPolicy | None = None) -> None:
    """:func:`claim_output` of ``target_of()`` (which resolves the target, checking the table) when a driver starts,
    riding out a server that does not answer (restarting, unreachable) like the sink's commit does: retried with
    ``policy`` (the store's retry policy), then ``StoreUnavailableError``."""
    import psycopg

    def attempt() -> None:
        try:
            claim_output(target_of(), epoch)
        except psycopg.errors.LockNotAvailable:
            raise
        except psycopg.OperationalError as e:
            raise TransientStoreError(f"PostgreSQL unreachable while claiming the output at start: {e}") from e

    (policy or RetryPolicy.from_env()).call(attempt, op="claim", key="saveToPostgres", where=_safe_dsn(dsn))


def _session_epoch(name: str) -> int | None:
    try:
        return int(name[len(SESSION_PREFIX):].split(" ", 1)[0])
    except ValueError:
        return None


def _safe_dsn(dsn: str) -> str:
    """The DSN without a password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", re.sub(r"password=\S+", "password=***", dsn))


def _values(record: Any, columns: tuple[str, ...]) -> tuple[Any, ...]:
    if isinstance(record, Mapping):
        unknown = [k for k in record if k not in columns]
        if unknown:
            raise TypeError(f"the record has the field {unknown[0]!r}, which is not one of the columns {list(columns)}")
        return tuple(record.get(c) for c in columns)
    if isinstance(record, (tuple, list)) and len(record) == len(columns):
        return tuple(record)
    raise TypeError(f"the record {record!r:.200} is neither a dict nor a tuple of {len(columns)} values for the "
                    f"columns {list(columns)}")


_COPY_LINE = re.compile(r"COPY [^,]+, line (\d+)(?:, column (\w+))?")


def _dead_record(record: Any, columns: tuple[str, ...]) -> str:
    """A refused record as the dead letters' ``record`` JSON: an object of the columns when it has their shape."""
    if isinstance(record, Mapping):
        shown: Any = {str(k): v for k, v in record.items()}
    elif isinstance(record, (tuple, list)) and len(record) == len(columns):
        shown = dict(zip(columns, record, strict=True))
    else:
        shown = record
    try:
        return json.dumps(shown, default=repr)
    except (TypeError, ValueError):
        return json.dumps(repr(record))


def _stage_routing(target: PostgresTarget, batch_ms: int, p: int, records: list[Any], attempt: str,
                   copy_sql: Any, dead_sql: Any, where: str, epoch: int | None) -> int:
    """``stage`` with dead letters: ``COPY`` the partition; when ``COPY`` refuses line ``i`` (a value it cannot
    convert), that record becomes a marked staging row (its JSON and the error, the columns NULL) and the partition
    is staged again, until ``COPY`` takes it. Returns the rows staged (marked ones included)."""
    import psycopg

    dead: dict[int, str] = {}
    for i, record in enumerate(records):
        try:
            _values(record, target.columns)
        except TypeError as e:
            dead[i] = f"TypeError: {e}"
    while True:
        try:
            with _connect(target.dsn, session_name(target, epoch)) as conn, conn.cursor() as cur:
                with cur.copy(copy_sql) as copy:
                    for i, record in enumerate(records):
                        if i not in dead:
                            copy.write_row((*_values(record, target.columns), target.output, batch_ms, p, i, attempt))
                if dead:
                    cur.executemany(dead_sql, [(target.output, batch_ms, p, i, attempt,
                                                _dead_record(records[i], target.columns), error)
                                               for i, error in sorted(dead.items())])
            return len(records)
        except psycopg.errors.DataError as e:
            diag = e.diag
            m = _COPY_LINE.search(diag.context or "")
            if not m:
                raise PostgresSinkError(f"{where}: {diag.message_primary}") from None
            line = int(m.group(1)) - 1  # the line among those sent: the records not yet routed, in order
            i = [j for j in range(len(records)) if j not in dead][line]
            column = f"column {m.group(2)!r}: " if m.group(2) else ""
            dead[i] = f"{type(e).__name__}: {column}{diag.message_primary}"
            log.warning("%s, record %d: %s%s; routed to %s", where, i, column, diag.message_primary,
                        target.dead_letters)


def stage_partition(target: PostgresTarget, batch_ms: int, epoch: int | None = None
                    ) -> Callable[[int, Iterable[Any]], Iterator[tuple]]:
    """The executor side: ``COPY`` partition ``p`` into the staging table under a fresh attempt id and commit;
    yields ``(p, attempt, rows)``. A record that cannot be converted or that Postgres refuses fails the task with
    a ``PostgresSinkError`` naming the batch, the partition, the record's position and (where known) the column;
    with dead letters it is staged as a marked row instead (:func:`_stage_routing`)."""
    from psycopg import sql

    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(_ident(target.staging), _idents(target.columns + _META))
    dead_sql = sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s, %s, %s, %s)").format(
        _ident(target.staging), _idents(_META + _DEAD_META))

    def stage(p: int, records: Iterable[Any]) -> Iterator[tuple]:
        import psycopg

        attempt = uuid.uuid4().hex
        where = f"saveToPostgres into {target.table!r}: batch {batch_ms}, partition {p}"
        if target.on_error == "deadLetter":
            try:
                n = _stage_routing(target, batch_ms, p, list(records), attempt, copy_sql, dead_sql, where, epoch)
            except psycopg.OperationalError as e:
                raise TransientStoreError(f"PostgreSQL connection lost while staging {where}: {e}") from e
            yield p, attempt, n
            return
        n = 0
        try:
            with _connect(target.dsn, session_name(target, epoch)) as conn, conn.cursor() as cur, \
                    cur.copy(copy_sql) as copy:
                for record in records:
                    try:
                        values = _values(record, target.columns)
                    except TypeError as e:
                        raise PostgresSinkError(f"{where}, record {n}: {e}; saveToPostgres(..., onError='deadLetter') "
                                                f"writes such records to {target.dead_letters} instead") from None
                    copy.write_row((*values, target.output, batch_ms, p, n, attempt))
                    n += 1
        except psycopg.errors.DataError as e:
            diag = e.diag
            m = _COPY_LINE.search(diag.context or "")
            row = f", record {int(m.group(1)) - 1}" if m else ""
            column = f", column {m.group(2)!r}" if m and m.group(2) else ""
            raise PostgresSinkError(f"{where}{row}{column}: {diag.message_primary}; saveToPostgres(..., "
                                    f"onError='deadLetter') writes such records to {target.dead_letters} instead "
                                    "and commits the rest of the batch") from None
        except psycopg.OperationalError as e:  # the server restarting or unreachable: ridden out as an outage
            raise TransientStoreError(f"PostgreSQL connection lost while staging {where}: {e}") from e
        yield p, attempt, n

    return stage


def _commit_sql(target: PostgresTarget, ranged: bool = False) -> Any:
    """``INSERT INTO table ... SELECT`` the kept attempts' staged rows of one batch (params: output, batch,
    partitions[], attempts[]; ``ranged``: only the rows ``(rparts[i], rrows[i])``)."""
    from psycopg import sql

    cols = _idents(target.columns)
    only = " AND (s._ds_part, s._ds_row) IN (SELECT * FROM unnest(%(rparts)s::int[], %(rrows)s::bigint[]))" \
        if ranged else ""
    picked = sql.SQL("FROM {} s WHERE s._ds_output = %(output)s AND s._ds_batch = %(batch)s AND (s._ds_part, "
                     "s._ds_attempt) IN (SELECT * FROM unnest(%(parts)s::int[], %(attempts)s::text[])) AND "
                     "s._ds_dead IS NULL" + only).format(_ident(target.staging))
    if target.mode == "append":
        return sql.SQL("INSERT INTO {} ({}) SELECT {} {} ORDER BY s._ds_part, s._ds_row").format(
            _ident(target.table), cols, cols, picked)
    keys = _idents(target.key_columns)
    others = [c for c in target.columns if c not in target.key_columns]
    action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others)) if others \
        else sql.SQL("DO NOTHING")
    return sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} {} ORDER BY {}, s._ds_part DESC, s._ds_row DESC "
                   "ON CONFLICT ({}) {}").format(_ident(target.table), cols, keys, cols, picked, keys, keys, action)


def commit_batch(target: PostgresTarget, batch_ms: int, staged: list[tuple[int, str, int]], epoch: int | None,
                 token: str = "") -> int:
    """The driver's one transaction (module docstring): fence, commit record, move, record, clean up. Returns the
    rows written, 0 when the batch was committed before by another write; ``token`` (one per write, the same for its
    retries) recognises a commit of this write whose reply was lost. ``TransientStoreError`` for a lost
    connection."""
    import psycopg
    from psycopg import sql

    schema = target.table.rsplit(".", 1)[0] + "." if "." in target.table else ""
    params = {"output": target.output, "batch": batch_ms, "parts": [p for p, _, _ in staged],
              "attempts": [a for _, a, _ in staged]}
    try:
        with _connect(target.dsn, session_name(target, epoch)) as conn, conn.transaction():
            if epoch is not None:
                (owner,) = conn.execute(sql.SQL(
                    "INSERT INTO {} AS f (output, epoch) VALUES (%s, %s) ON CONFLICT (output) DO UPDATE SET epoch = "
                    "GREATEST(f.epoch, EXCLUDED.epoch) RETURNING epoch").format(_ident(schema + FENCES)),
                    [target.output, epoch]).fetchone()
                if owner > epoch:
                    raise FencedError(f"saveToPostgres into {target.table!r}: a newer driver (epoch {owner}) owns the "
                                      f"output {target.output!r}; this one (epoch {epoch}) must not commit batch "
                                      f"{batch_ms}")
            done = conn.execute(sql.SQL("SELECT rows, token FROM {} WHERE output = %s AND batch_ms = %s").format(
                _ident(schema + COMMITS)), [target.output, batch_ms]).fetchone()
            if done is not None:
                written = int(done[0]) if token and done[1] == token else 0
            else:
                faults.reached("postgres-sink-commit")
                (found,) = conn.execute(sql.SQL(
                    "SELECT count(*) FROM {} s WHERE s._ds_output = %(output)s AND s._ds_batch = %(batch)s AND "
                    "(s._ds_part, s._ds_attempt) IN (SELECT * FROM unnest(%(parts)s::int[], %(attempts)s::text[]))")
                    .format(_ident(target.staging)), params).fetchone()
                want = sum(n for _, _, n in staged)
                if found != want:
                    raise StagingLostError(f"saveToPostgres into {target.table!r}: batch {batch_ms}: {found} staged "
                                           f"rows of {want} found (the staging table was emptied, e.g. by a server "
                                           "crash recovery); nothing committed")
                if target.on_error == "deadLetter":
                    written = _move_routing_refused(conn, target, params)
                else:
                    written = conn.execute(_commit_sql(target), params).rowcount
                conn.execute(sql.SQL("INSERT INTO {} (output, batch_ms, rows, token) VALUES (%s, %s, %s, %s)").format(
                    _ident(schema + COMMITS)), [target.output, batch_ms, written, token or None])
            conn.execute(sql.SQL("DELETE FROM {} WHERE _ds_output = %s AND _ds_batch = %s").format(
                _ident(target.staging)), [target.output, batch_ms])
    except psycopg.errors.IntegrityError as e:
        raise PostgresSinkError(_integrity_message(target, batch_ms, params, e)) from None
    except psycopg.errors.InvalidColumnReference as e:  # ON CONFLICT without a matching unique index
        raise PostgresSinkError(f"saveToPostgres into {target.table!r}: batch {batch_ms}: {e.diag.message_primary} "
                                f"(keyColumns={list(target.key_columns)} needs a unique index or primary key on "
                                "exactly those columns)") from None
    except psycopg.OperationalError as e:
        raise TransientStoreError(f"PostgreSQL connection lost while committing batch {batch_ms} into "
                                  f"{target.table!r}: {e}") from e
    return written


def _move_routing_refused(conn: Any, target: PostgresTarget, params: dict[str, Any]) -> int:
    """Move the batch's kept rows into the table inside the commit transaction, routing the rows the table refuses
    (a constraint: unique, check, not null, foreign key) to :data:`DEAD_LETTERS` instead of failing; returns the
    rows written. The whole batch is tried at once (a savepoint); when the table refuses it, the rows are tried in
    ranges halved until each refused row is alone (about k log n statements for k refused rows of n), in partition
    and record order, so the rows written and their order are those of a batch without the refused rows (upsert:
    the last record per key wins)."""
    import psycopg
    from psycopg import sql

    conn.execute(sql.SQL(  # the records COPY refused while staging (marked rows)
        "INSERT INTO {} (output, batch_ms, part, row, record, error, constraint_name) SELECT s._ds_output, "
        "s._ds_batch, s._ds_part, s._ds_row, s._ds_dead, s._ds_error, NULL FROM {} s WHERE s._ds_output = "
        "%(output)s AND s._ds_batch = %(batch)s AND (s._ds_part, s._ds_attempt) IN (SELECT * FROM "
        "unnest(%(parts)s::int[], %(attempts)s::text[])) AND s._ds_dead IS NOT NULL ON CONFLICT DO NOTHING").format(
        _ident(target.dead_letters), _ident(target.staging)), params)
    try:
        with conn.transaction():
            return int(conn.execute(_commit_sql(target), params).rowcount)
    except psycopg.errors.IntegrityError:
        pass
    keys = conn.execute(sql.SQL(
        "SELECT s._ds_part, s._ds_row FROM {} s WHERE s._ds_output = %(output)s AND s._ds_batch = %(batch)s AND "
        "(s._ds_part, s._ds_attempt) IN (SELECT * FROM unnest(%(parts)s::int[], %(attempts)s::text[])) "
        "AND s._ds_dead IS NULL ORDER BY 1, 2").format(_ident(target.staging)), params).fetchall()
    ranged = _commit_sql(target, ranged=True)
    cols = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(c)) for c in target.columns)
    dead_sql = sql.SQL(
        "INSERT INTO {} (output, batch_ms, part, row, record, error, constraint_name) SELECT s._ds_output, "
        "s._ds_batch, s._ds_part, s._ds_row, (SELECT to_jsonb(r) FROM (SELECT {}) r), %(error)s, %(constraint)s "
        "FROM {} s WHERE s._ds_output = %(output)s AND s._ds_batch = %(batch)s AND s._ds_part = %(part)s "
        "AND s._ds_row = %(row)s AND s._ds_attempt = %(attempt)s ON CONFLICT DO NOTHING").format(
        _ident(target.dead_letters), cols, _ident(target.staging))
    attempt_of = dict(zip(params["parts"], params["attempts"], strict=True))
    written = 0
    pending = [keys]
    while pending:
        chunk = pending.pop()
        try:
            with conn.transaction():
                written += int(conn.execute(ranged, {**params, "rparts": [p for p, _ in chunk],
                                                     "rrows": [r for _, r in chunk]}).rowcount)
        except psycopg.errors.IntegrityError as e:
            if len(chunk) > 1:
                half = len(chunk) // 2
                pending += [chunk[half:], chunk[:half]]  # the first half next: partition and record order kept
                continue
            (part, row), diag = chunk[0], e.diag
            detail = f" ({diag.message_detail})" if diag.message_detail else ""
            conn.execute(dead_sql, {**params, "part": part, "row": row, "attempt": attempt_of[part],
                                    "error": f"{type(e).__name__}: {diag.message_primary}{detail}",
                                    "constraint": diag.constraint_name})
            log.warning("saveToPostgres into %r: batch %d, partition %d, record %d refused (%s); routed to %s",
                        target.table, params["batch"], part, row, diag.message_primary, target.dead_letters)
    return written


def _integrity_message(target: PostgresTarget, batch_ms: int, params: dict[str, Any], e: Any) -> str:
    """A constraint violation, with the column and (when it can be found) the staged record that broke it."""
    diag = e.diag
    column = diag.column_name
    where = ""
    if column and column in target.columns and type(e).__name__ == "NotNullViolation":
        where = _find_null(target, params, column)
    detail = f" ({diag.message_detail})" if diag.message_detail else ""
    constraint = f", constraint {diag.constraint_name!r}" if diag.constraint_name else ""
    col = f", column {column!r}" if column else ""
    return (f"saveToPostgres into {target.table!r}: batch {batch_ms}{where}{col}{constraint}: {diag.message_primary}"
            f"{detail}; nothing of the batch was committed. To go on without such records, write with "
            f"saveToPostgres(..., onError='deadLetter'): the table's refused records then go to "
            f"{target.dead_letters} in the batch's transaction")


def _find_null(target: PostgresTarget, params: dict[str, Any], column: str) -> str:
    from psycopg import sql

    try:
        with _connect(target.dsn) as conn:
            row = conn.execute(sql.SQL(
                "SELECT s._ds_part, s._ds_row FROM {} s WHERE s._ds_output = %(output)s AND s._ds_batch = %(batch)s "
                "AND (s._ds_part, s._ds_attempt) IN (SELECT * FROM unnest(%(parts)s::int[], %(attempts)s::text[])) "
                "AND {} IS NULL ORDER BY 1, 2 LIMIT 1").format(_ident(target.staging), sql.Identifier(column)),
                params).fetchone()
    except Exception:  # only for the message
        return ""
    return f", partition {row[0]}, record {row[1]}" if row else ""


def save_to_postgres(rdd: RDD, batch_ms: int, target: PostgresTarget, guard: Callable[[], None] | None = None,
                     epoch: int | None = None, policy: RetryPolicy | None = None) -> int:
    """Write batch ``batch_ms`` into ``target`` exactly once (module docstring); returns the rows written."""
    if guard is not None:
        guard()
    faults.reached("sink-write")
    policy = policy or RetryPolicy.from_env()
    token = uuid.uuid4().hex
    try:
        for attempt in range(1, STAGE_ATTEMPTS + 1):
            staged = rdd.mapPartitionsWithIndex(stage_partition(target, batch_ms, epoch)).collect()
            try:
                written = policy.call(partial(commit_batch, target, batch_ms, staged, epoch, token), op="commit",
                                      key=target.table, where=_safe_dsn(target.dsn))
                break
            except StagingLostError as e:
                if attempt == STAGE_ATTEMPTS:
                    raise
                log.warning("%s; staging the batch again (attempt %d of %d)", e, attempt + 1, STAGE_ATTEMPTS)
    except (FencedError, TransientStoreError):
        raise  # a newer driver may be staging this batch; a server down is retried (its next commit cleans up)
    except Exception:
        discard_staged(target, batch_ms)  # a refused batch leaves nothing behind (a re-run stages it again)
        raise
    add_written(written)
    return written


def discard_staged(target: PostgresTarget, batch_ms: int) -> None:
    """Delete the staged rows of ``batch_ms`` for ``target``'s output (every attempt's), after a write that failed:
    the batch is staged again by its next try, or never (dropped). Best effort: a server that does not answer
    leaves them to the batch's next commit (which deletes every attempt's rows of its batch)."""
    from psycopg import sql

    try:
        with _connect(target.dsn) as conn, conn.transaction():
            n = conn.execute(sql.SQL("DELETE FROM {} WHERE _ds_output = %s AND _ds_batch = %s").format(
                _ident(target.staging)), [target.output, batch_ms]).rowcount
        if n:
            log.info("saveToPostgres into %r: deleted %d staged row(s) of failed batch %d", target.table, n, batch_ms)
    except Exception as e:  # noqa: BLE001 - cleaning up after a failure must not hide it
        log.warning("saveToPostgres into %r: could not delete the staged rows of failed batch %d: %s", target.table,
                    batch_ms, e)
