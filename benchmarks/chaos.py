"""A randomized fault schedule (issues 22 and 40): exactly-once on every failure path, batch by batch.

Run from the repository root, with the Ceph RADOS Gateway of ``scripts/services.sh`` running::

    python -m benchmarks chaos --seed 7 --minutes 2 --steady-wait 30   # the short one (CI: tests/fault/test_chaos.py)
    python -m benchmarks chaos --seed 22 --minutes 30        # the long one (every fault kind several times)
    python -m benchmarks chaos --seed 7 --minutes 1.5 --gap 9,13 --steady-wait 5 --kafka own   # CI's, with Kafka

**What runs.** The driver ``benchmarks/chaos_app.py`` (its docstring has the pipeline: ``redisStream`` and
``textFileStream`` on an ``s3://`` prefix, ``updateStateByKey``, ``reduceByKeyAndWindow`` with an inverse,
an event-time window, a session window, ``saveToStore`` to Ceph, ``saveAsTextFiles``, the exactly-once
sinks ``saveToRedisStream`` and ``saveToPostgres``, a ``foreachRDD``; with ``--kafka``, a Kafka ->
``updateStateByKey`` -> ``saveToKafka`` branch as well)
as a subprocess in its own process group, restarted with ``getOrCreate`` after every kill, stop or crash,
as a supervisor would. The run owns everything it breaks, so the shared services stay untouched:

* its own ``redis-server`` (Debian's; a free port from 6391 up, its own folder, ``--appendonly yes
  --appendfsync always``), which it really stops (SIGTERM or SIGKILL) and starts again;
* a fault proxy (:mod:`benchmarks.chaos_proxy`) in front of that Redis server and one in front of the
  Ceph gateway; the app is given the proxies' addresses (``redis://127.0.0.1:<p>``,
  ``AWS_ENDPOINT_URL_S3``), so "gateway down" (the proxy refuses and resets every connection) is what
  the driver and the executors would see of a stopped gateway. ``--stop-gateway`` stops and starts the
  real radosgw instead (``scripts/services.sh``; only on a machine where nobody else uses it);
* its own PostgreSQL cluster (``initdb``/``pg_ctl`` as ``scripts/services.sh`` runs the shared one, run as
  the ``postgres`` user when we are root; a free port from 5441 up; its folder is ``<work>/postgres``, or a
  folder of its own in the temporary folder when we are root, since the postgres user may not reach the work
  folder), holding the ``saveToPostgres`` output's tables ``run_events`` and ``ref_events``, which it really
  stops and starts; the driver connects to it directly (no proxy). The ``saveToRedisStream`` output goes to
  the key ``sink-run`` of the run's Redis server, through the proxy like the source;
* its own bucket ``chaos-<seed>-<random>`` and temporary folder (removed at the end unless ``--keep``);
* with ``--kafka own``, its own single-node Kafka broker (:class:`KafkaBroker`: the jars ``scripts/services.sh
  start kafka`` gathered in ``.kafka/jars``, the settings it uses, free ports from 9291 up, data in
  ``<work>/kafka``), which it really stops (SIGTERM: a controlled shutdown; or SIGKILL: the logs are recovered,
  and the new broker waits for the old one's session to expire) and starts again; with ``--kafka HOST:PORT``
  that broker instead, never restarted (no ``kafka-restart`` faults). The run creates the topics
  ``chaos-<seed>-<random>-in`` (3 partitions) and ``-out`` (2), and a :class:`KafkaFeeder` thread writes the input
  from the set-up to the end of the schedule (about 10 keyed records a second with an idempotent producer, every
  10 s a transaction of another producer, every other one aborted). The driver reaches the broker directly (the
  clients connect to the addresses the broker advertises: a proxy would be bypassed).

**The schedule** (:func:`make_schedule`, a pure function of ``--seed``, ``--minutes`` and ``--gap``): faults
spaced ``gap`` seconds apart (drawn from 14-20 s in a schedule of 5 minutes or less, 22-40 s otherwise; ``--gap
9,13`` for a denser one: the CI test's, so that a fault more often meets the recovery from the one before), their
kinds drawn in rounds (each round a shuffled copy of every kind, so that each
kind comes back every ``len(KINDS)`` faults). Kinds (:data:`KINDS`):

* ``driver-kill``: SIGKILL of the driver's process group (Python driver, JVM, workers) at that moment;
* ``driver-kill-in-output``: the driver kills itself at a fault point of ``dstreams.faults``
  (``mid-batch``: an output is running; ``checkpoint-write``: a data checkpoint's parts are written, its
  manifest not; ``after-metadata-commit``; ``redis-sink-chunk``: ``saveToRedisStream`` wrote a chunk of a
  batch, about 3 chunks a batch; ``postgres-sink-commit``: ``saveToPostgres`` is inside its commit
  transaction), armed through the environment of the driver started before it;
* ``driver-term``: SIGTERM (dstreams' graceful stop; exit 0 expected), then a restart;
* ``gateway-down``: the Ceph path down for 5-60 s (5-15 s in a schedule of 5 minutes or less);
* ``redis-restart``: the Redis server stopped (SIGTERM: it writes its AOF; or SIGKILL: the AOF, synced on
  every write, has everything) and started again after 0-8 s;
* ``postgres-restart``: the PostgreSQL server stopped (``pg_ctl stop -m fast``: connections closed, a
  clean shutdown; or ``-m immediate``: every server process killed, crash recovery at the start) and
  started again after 0-8 s: the ``saveToPostgres`` output's stage tasks and commit fail meanwhile (the
  store's retries, Spark's task retries, the batch's retries; past them the driver stops and is restarted);
* ``redis-drop``: every Redis connection reset, and half of the time new ones refused for 0.5-5 s;
* ``executor-kill``: SIGKILL of one executor JVM; the driver running then was started on
  ``local-cluster[2,1,1024]`` (drivers run on ``local[2]`` otherwise: the master is chosen per driver,
  from the faults before the next driver-ending one; ``--master`` forces one);
* ``kafka-restart`` (with ``--kafka own``): the run's broker stopped (SIGTERM or SIGKILL) and started again after
  0-5 s (it answers 4-15 s after its launch): the Kafka source rides it out (a broker that does not answer is an
  unavailable source: the driver waits), the exactly-once sink's tasks wait for it (every blocking call waits up to
  the transaction timeout, 60 s) or fail and are retried (Spark's task retries, the batch's retries);
* ``kafka-kill`` (with ``--kafka``): the driver killed inside the Kafka output: armed through the environment of
  the driver started before it (``DSTREAMS_FAULT_TASK_KILL=<point>:<marker>``, :mod:`dstreams.faults`), when
  the fault is due the orchestrator writes the marker; the next ``saveToKafka`` task to reach the point SIGKILLs its
  Python worker (``kafka-before-commit``: its transaction open, the batch's records and ledger entry in it;
  ``kafka-after-commit``: just committed) and the driver SIGKILLs itself at once (chaos_app.py);
* ``user-fail``: the audit ``foreachRDD`` function raises in the first attempt of the batch 2-5 batches
  after the newest committed one (a marker file; ``detail.fired`` in the JSON says whether it did); the
  engine's batch retry (``spark.dstreams.batch.maxAttempts``) should run it
  again; an engine without it stops the driver with the error, which the supervisor restarts. The two
  exactly-once sinks come before the audit output, so the retried batch writes them again.
* ``poison-record``: a line the pipeline's parser raises on (``POISON <fault index>``) in the first input file of
  batch ``params.batch`` (2 or 3: early, so that the faults that follow meet the batch's dead letter and its output;
  a file written at the fault's time would be read only once the stream caught up with the wall clock, which a
  loaded machine may not do before the end); ``map(parse_line, onError="deadLetter")`` routes it to the dead
  letters, saved exactly once like every output: the check finds each poison line of the files the compared batches
  read in the ``dead`` output exactly once (the reference reads copies of the same files, so it routes them too).

Driver kills, ``redis-restart`` and ``redis-drop`` hit the ``saveToRedisStream`` output too (its key is on
the run's Redis server, through the proxy), ``postgres-restart`` and the kills the ``saveToPostgres`` one, every
fault the Kafka branch (in the same driver) too. The Kafka kinds are added to the rounds only with ``--kafka``:
without it a seed's schedule is the one it was before they existed (:data:`BASE_KINDS`).

Before each fault the orchestrator waits for the stream to be steady again after the previous one (3
batches in a row with a scheduling delay under the interval, at most ``--steady-wait`` seconds, 90 by
default): faults do not pile up, and every recovery is measured on its own. After the schedule, the
stream runs until steady (and until the batch a ``user-fail`` marked has completed, at most 180 s), then gets
SIGTERM.

**Determinism, and the fault-free reference.** Every batch holds the same records in every run (see
chaos_app.py: Redis input written in full before the start, ``maxRatePerPartition``, at most
``files_per_batch`` files per batch with files always waiting, event times in the records, the first
batch run on a manual clock). The reference is the same pipeline, started fresh on a manual clock at the
same zero time, on the real gateway and Redis server, reading copies of the same input files, run batch
after batch as fast as they complete over the ``N`` batches the chaos run committed (``N`` = the newest
batch every output committed). Its cost is its processing time only: about a third of the chaos run's
wall time.

**The check.** For every output and every batch ``1..N``: the chaos run's committed records (folders
with ``_SUCCESS``; the audit files; the Redis stream's entries grouped by the batch time in their id; the
table's rows grouped by their ``batch_ms`` column) equal the reference's (as sorted lines; the reference
writes the key ``sink-ref`` and the table ``ref_events``). Totals: every input record (each Redis entry and
file line has an id) is in exactly one committed batch of the ``events``, ``stream`` and ``table`` outputs
(``lost``, ``duplicated``, ``unexpected``: the sums over the three; ``by_output`` each), and the
running counts of batch ``N`` equal the words counted over the
input of batches ``1..N``. The Kafka branch (``comparison.kafka``, :func:`check_kafka`) is checked against the
fault-free expectation computed from its input instead (its batches depend on when the records arrived): the
offset ranges its batches read (each batch writes them after its Kafka output committed) follow one another from
offset 0, and what a read_committed consumer sees in the output topic is, per key, every committed input record of
those ranges once, in offset order, the i-th with the running count i: nothing lost, nothing duplicated, no aborted
input record, order per key kept.

**Recovery figures**, for every driver kill, stop or crash (``recoveries`` in the JSON): from the kill
(or the observed exit) to the restarted driver's SparkContext (``sc_s``), to its context started (graph
and state restored, ``started_s``), to its first completed batch (``first_commit_s``: "the next
committed batch", a replayed batch counts), to its first batch newer than every batch committed before
the kill (``first_new_s``), and to steady state (``steady_s``: the completion of the first of 3
consecutive batches with a scheduling delay under the interval and a processing start less than two
intervals after the batch time, as in ``benchmarks/catchup.py``); with the load averages at the kill.

Prints a table and writes ``benchmarks/results/chaos-<seed>-<minutes>m.json`` (``--json``): parameters,
the schedule as run, the recoveries, the comparison and totals, the proxies' counters. Exit code 0 only
when nothing was lost, duplicated or different.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import chaos_app
from .chaos_proxy import FaultProxy, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
APP = Path(__file__).resolve().parent / "chaos_app.py"
#: The Ceph gateway (``--rgw``; the tests' ``DSTREAMS_TEST_RGW_ENDPOINT`` or ``DSTREAMS_TEST_RGW_PORT`` when set).
DEFAULT_RGW = (os.environ.get("DSTREAMS_TEST_RGW_ENDPOINT")
               or f"http://127.0.0.1:{os.environ.get('DSTREAMS_TEST_RGW_PORT') or 7480}")
ACCESS_KEY, SECRET_KEY, REGION = "AKTEST", "SKTEST", "us-east-1"
REDIS_PORTS = (6391, 6420)  # the project's range for servers a run owns (6390 is the shared test server)
POSTGRES_PORTS = (5441, 5461)  # the same for PostgreSQL (5440 is the shared test server)
SINK_CHUNK = 16  # entries per saveToRedisStream chunk: about 3 chunks per batch
LOCAL_CLUSTER = "local-cluster[2,1,1024]"
LOCAL = "local[2]"

#: The fault kinds of a run without Kafka (their schedules are the same as before the Kafka kinds existed).
BASE_KINDS = ("driver-kill", "driver-kill-in-output", "driver-term", "gateway-down", "redis-restart", "redis-drop",
              "executor-kill", "user-fail", "postgres-restart")
#: With the Kafka branch (``--kafka``): a restart of the run's own broker, and a driver killed inside a Kafka write.
KAFKA_KINDS = ("kafka-restart", "kafka-kill")
#: The record-level fault (issue 44): after the Kafka kinds, so the schedules of BASE_KINDS stay those of before.
POISON_KINDS = ("poison-record",)
KINDS = BASE_KINDS + KAFKA_KINDS + POISON_KINDS
DRIVER_ENDING = ("driver-kill", "driver-kill-in-output", "driver-term", "kafka-kill")
#: The task-side kill points of ``saveToKafka`` (:mod:`dstreams.kafka.sink`) the ``kafka-kill`` fault uses.
KAFKA_KILL_POINTS = ("kafka-before-commit", "kafka-after-commit")
KILL_POINTS = ("mid-batch", "mid-batch", "checkpoint-write", "after-metadata-commit", "redis-sink-chunk",
               "postgres-sink-commit")
#: How often a driver passes each kill point per batch (to arm it for a moment about ``at_s`` ahead).
PER_BATCH = {"mid-batch": 1.0, "checkpoint-write": 0.8, "after-metadata-commit": 2.0, "redis-sink-chunk": 3.0,
             "postgres-sink-commit": 1.0}
STEADY_RUN = 3
FINAL_MARKED_S = 180.0  # at the end, the longest wait for the batch the last user-fail marked (a few batches ahead)
FILES_AHEAD = 40  # batches of input files kept written ahead of the wall clock
_FAULT_ENV = ("DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER", "DSTREAMS_FAULT_SLOW_EXECUTOR",
              "DSTREAMS_FAULT_SLOW_PARTITION", "DSTREAMS_FAULT_SLOW_SECONDS", "DSTREAMS_FAULT_SLOW_FACTOR",
              "DSTREAMS_FAULT_TASK_KILL", "CHAOS_DIE_WITH")
#: The run's own Kafka broker: ports for it and its controller (the project's shared broker is on 9192/9193).
KAFKA_PORTS = (9291, 9331)
KAFKA_JARS = ROOT / ".kafka" / "jars"  # gathered by `scripts/services.sh start kafka` (Maven, cached)
KAFKA_LOG4J = ROOT / "scripts" / "kafka" / "log4j2.properties"
KAFKA_IN_PARTITIONS, KAFKA_OUT_PARTITIONS = 3, 2
KAFKA_KEYS = 8  # keys of the Kafka input, k0..k7
FEED_EVERY_S = 0.25  # 1-4 input records this often: about 20 records per 2 s batch
TXN_EVERY = 40  # every 40th tick (10 s) a transaction of the input's, every other one aborted
KAFKA_CALL_S = 15.0  # every blocking call of the orchestrator's Kafka clients
KAFKA_START_S = 180.0  # a broker start (a restart after SIGKILL waits ~6 s for its old session; more under load)


def now_ms() -> int:
    return int(time.time() * 1000)


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _stats(xs: list[float]) -> dict[str, float | int | None]:
    return {"n": len(xs), "median": round(statistics.median(xs), 2) if xs else None,
            "max": round(max(xs), 2) if xs else None, "min": round(min(xs), 2) if xs else None}


# --------------------------------------------------------------------------------------------- the schedule
@dataclass
class Fault:
    """One scheduled fault: ``at_s`` seconds after the schedule starts (at the earliest), its kind and
    parameters; what happened is filled in as it runs."""

    index: int
    at_s: float
    kind: str
    params: dict[str, Any]
    injected_ms: int | None = None
    ended_ms: int | None = None
    outcome: str = "pending"
    detail: dict[str, Any] = field(default_factory=dict)


def make_schedule(seed: int, minutes: float, kinds: tuple[str, ...] = KINDS,
                  gap: tuple[float, float] | None = None) -> list[Fault]:
    """The seeded schedule: see the module docstring. A pure function of its arguments (``kinds``: a
    subset of :data:`KINDS`: :data:`BASE_KINDS` without Kafka, which gives the schedules of the runs before the
    Kafka kinds existed; ``gap``: the range of seconds between two faults, by default chosen by ``minutes``)."""
    rng = random.Random(seed)
    span = minutes * 60.0
    short = minutes <= 5
    if gap is None:
        gap = (14.0, 20.0) if short else (22.0, 40.0)
    faults: list[Fault] = []
    at = rng.uniform(*gap) / 2
    pool: list[str] = []
    while at < span or len(faults) < len(kinds):
        if not pool:
            pool = list(kinds)
            rng.shuffle(pool)
        kind = pool.pop()
        params: dict[str, Any] = {}
        if kind == "gateway-down":
            params["seconds"] = round(rng.uniform(5, 15 if short else 60), 1)
        elif kind == "redis-restart":
            params["signal"] = rng.choice(("TERM", "KILL"))
            params["down_s"] = round(rng.uniform(0, 8), 1)
        elif kind == "redis-drop":
            params["refuse_s"] = round(rng.uniform(0.5, 5), 1) if rng.random() < 0.5 else 0.0
        elif kind == "driver-kill-in-output":
            params["point"] = rng.choice(KILL_POINTS)
        elif kind == "driver-kill":
            params["delay_s"] = round(rng.uniform(0, 2), 2)  # a random moment within a batch
        elif kind == "user-fail":
            params["ahead"] = rng.randint(2, 5)
        elif kind == "executor-kill":
            params["executor"] = rng.randint(0, 1)
        elif kind == "postgres-restart":
            params["mode"] = rng.choice(("fast", "immediate"))
            params["down_s"] = round(rng.uniform(0, 8), 1)
        elif kind == "kafka-restart":
            params["signal"] = rng.choice(("TERM", "KILL"))
            params["down_s"] = round(rng.uniform(0, 5), 1)
        elif kind == "kafka-kill":
            params["point"] = rng.choice(KAFKA_KILL_POINTS)
        elif kind == "poison-record":
            params["batch"] = 2 + len(faults) % 2  # no draw: the faults after it keep their times
        faults.append(Fault(len(faults), round(at, 1), kind, params))
        at += rng.uniform(*gap)
    return faults


# ------------------------------------------------------------------------------------------ the services
class RedisServer:
    """The run's own ``redis-server`` (AOF on, fsync on every write), which the schedule restarts."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        folder.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        log_file = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no"],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        log_file.close()
        deadline = time.monotonic() + 20
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start; see {self.folder / 'redis.log'}")
            time.sleep(0.05)

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def client(self) -> Any:
        import redis

        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=30)


class PostgresServer:
    """The run's own PostgreSQL cluster (``initdb`` + ``pg_ctl``, as ``scripts/services.sh`` runs the shared one:
    trust authentication on loopback, user and database ``dstreams``, run as the ``postgres`` system user when
    we are root, since root cannot run postgres), which the schedule stops and starts again.

    Contract: :meth:`start` returns once the server accepts connections (bounded: 60 s) or raises; :meth:`stop`
    is ``pg_ctl stop -m <mode>`` (``fast``: connections closed, a clean shutdown; ``immediate``: every process
    killed, WAL replayed at the next start) and returns once the server is down (bounded) or raises;
    :meth:`destroy` stops it and removes its folder when the folder is not under the run's work folder."""

    def __init__(self, folder: Path, port: int) -> None:
        self.port = port
        self.root = os.geteuid() == 0
        # The postgres user must reach the data folder: a work folder under a 0700 temporary folder of root's
        # is not reachable, so as root the cluster gets a folder of its own in /tmp, owned by postgres.
        self.folder = Path(tempfile.mkdtemp(prefix="chaos-pg-")) if self.root else folder
        self.own_folder = self.root
        self.folder.mkdir(parents=True, exist_ok=True)
        # the server's log (written by the postgres user) and the commands' output (by us)
        self.data, self.log_path = self.folder / "data", self.folder / "server.log"
        self.commands_log = self.folder / "commands.log"
        self.restarts = 0
        self.bin = self._bin()
        if self.root:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run(["initdb", "-D", str(self.data), "-U", "dstreams", "--auth=trust", "-E", "UTF8", "--no-locale"],
                  120)

    @classmethod
    def launch(cls, folder: Path, ports: tuple[int, int] = POSTGRES_PORTS, tries: int = 5) -> PostgresServer:
        """A new cluster, started on a free port of ``ports``; another port when the start fails (a concurrent
        run may take the port between the check and the start), ``tries`` times, then the error."""
        start = ports[0]
        for attempt in range(1, tries + 1):
            server = cls(folder, free_port(start, ports[1]))
            try:
                server.start()
                return server
            except (subprocess.SubprocessError, RuntimeError):
                server.destroy()
                if not server.own_folder:
                    shutil.rmtree(server.folder, ignore_errors=True)
                if attempt == tries:
                    raise
                start = server.port + 1
        raise AssertionError("unreachable")

    @staticmethod
    def _bin() -> Path:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
                       if p.parent.parent.name.isdigit() else 0)
        if found:
            return found[-1].parent
        which = shutil.which("pg_ctl")
        if which is None:
            raise RuntimeError("PostgreSQL is not installed (pg_ctl): run `bash scripts/services.sh start postgres`")
        return Path(which).parent

    def _run(self, cmd: list[str], timeout: float) -> None:
        full = [str(self.bin / cmd[0]), *cmd[1:]]
        if self.root:
            full = ["runuser", "-u", "postgres", "--", *full]
        with open(self.commands_log, "ab") as out:
            subprocess.run(full, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=True,
                           cwd=str(self.folder))

    @property
    def dsn(self) -> str:
        return f"postgresql://dstreams@127.0.0.1:{self.port}/dstreams"

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def start(self) -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "60", "-o",
                   f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1", "start"], 90)
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn.rsplit("/", 1)[0] + "/postgres", connect_timeout=2,
                                     autocommit=True) as conn:
                    if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dstreams'").fetchone() is None:
                        conn.execute("CREATE DATABASE dstreams")
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL on port {self.port} did not start; see {self.log_path}") from None
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop"], 60)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except (subprocess.SubprocessError, OSError) as e:
            log(f"could not stop PostgreSQL on port {self.port}: {e}")
        if self.own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _quiet_kafka_logger() -> logging.Logger:
    """librdkafka's log lines (a broker restart makes every client log each failed connection) go here: nowhere."""
    lg = logging.getLogger("benchmarks.chaos.kafka")
    if not lg.handlers:
        lg.addHandler(logging.NullHandler())
    lg.propagate = False
    return lg


def _kafka_conf(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "logger": _quiet_kafka_logger(), **extra}


class KafkaBroker:
    """The run's own single-node Kafka broker (KRaft: broker and controller in one JVM), set up as
    ``scripts/services.sh`` sets up the project's (the same jars in ``.kafka/jars``, the same settings), on free
    ports and with its data in the run's folder, so that the schedule can restart it without touching the broker
    other tests use.

    Contract: the constructor formats the storage (raises when the jars or Java are missing, saying how to get
    them); :meth:`launch` starts the JVM and returns at once, :meth:`ready` says whether it answers a metadata
    request, :meth:`start` is both (bounded: ``KAFKA_START_S``, then RuntimeError naming the log); :meth:`stop`
    sends ``sig`` (SIGTERM: a controlled shutdown; SIGKILL: the logs are recovered at the next start) and returns
    once the JVM is gone (bounded: 60 s, then SIGKILL). The data is kept across restarts."""

    def __init__(self, folder: Path, ports: tuple[int, int] = KAFKA_PORTS) -> None:
        if not any(KAFKA_JARS.glob(".complete-*")):
            raise RuntimeError(f"the Kafka broker's jars are not in {KAFKA_JARS}: run `bash scripts/services.sh start "
                               "kafka` once (it gathers them with Maven), or pass --kafka HOST:PORT (a broker that "
                               "is never restarted)")
        java_home = os.environ.get("JAVA_HOME")
        self.java = str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.data, self.conf, self.log_path = folder / "data", folder / "server.properties", folder / "kafka.log"
        self.ports = ports
        self.port = self.controller_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.start_s: list[float] = []  # every start: from launch to answering
        self._launched = 0.0
        self._admin: Any = None
        self._pick_ports(ports[0])
        cluster_id = "A" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")[1:]  # no leading '-'
        with open(folder / "format.log", "wb") as out:
            subprocess.run([self.java, "-Xmx256m", f"-Dlog4j2.configurationFile={KAFKA_LOG4J}", "-cp",
                            f"{KAFKA_JARS}/*", "kafka.tools.StorageTool", "format", "--ignore-formatted", "-t",
                            cluster_id, "-c", str(self.conf)], stdout=out, stderr=subprocess.STDOUT, timeout=180,
                           check=True)

    def _pick_ports(self, start: int) -> None:
        self.port = free_port(start, self.ports[1])
        self.controller_port = free_port(self.port + 1, self.ports[1])
        self._admin = None
        self.conf.write_text("\n".join([
            "# The chaos run's own Kafka broker (benchmarks/chaos.py), as scripts/services.sh configures the project's",
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}", "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT", f"log.dirs={self.data}",
            "num.partitions=1", "default.replication.factor=1", "min.insync.replicas=1",
            "auto.create.topics.enable=false", "offsets.topic.replication.factor=1", "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=1", "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1", "share.coordinator.state.topic.num.partitions=1",
            "group.initial.rebalance.delay.ms=0", "transaction.abort.timed.out.transaction.cleanup.interval.ms=5000",
            "log.cleaner.dedupe.buffer.size=33554432", "broker.session.timeout.ms=6000",
            "broker.heartbeat.interval.ms=1000", ""]))

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def launch(self) -> None:
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [self.java, "-Xmx384m", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
             f"-Dlog4j2.configurationFile={KAFKA_LOG4J}", f"-Dkafka.logs.dir={self.folder}", "-cp", f"{KAFKA_JARS}/*",
             "kafka.Kafka", str(self.conf)], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        log_file.close()
        self._launched = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        """The JVM runs and the broker answers a metadata request (within a second); records the start's time."""
        if not self.alive():
            return False
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(_kafka_conf(self.bootstrap))
        try:
            ok = bool(self._admin.list_topics(timeout=1).brokers)
        except KafkaException:
            return False
        if ok and self._launched:
            self.start_s.append(round(time.monotonic() - self._launched, 2))
            self._launched = 0.0
        return ok

    def start(self, tries: int = 3) -> None:
        """Launch and wait until it answers; another pair of ports when the JVM exits at once (a port taken)."""
        for attempt in range(1, tries + 1):
            self.launch()
            deadline = time.monotonic() + KAFKA_START_S
            while not self.ready():
                if not self.alive() or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            else:
                return
            self.stop(signal.SIGKILL)
            if attempt == tries or time.monotonic() > deadline:
                raise RuntimeError(f"the chaos run's Kafka broker on port {self.port} did not answer within "
                                   f"{KAFKA_START_S:.0f} s; see {self.log_path}")
            self._pick_ports(self.port + 2)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create a topic and wait until its metadata shows every partition (bounded)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(_kafka_conf(bootstrap))
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=KAFKA_CALL_S, request_timeout=KAFKA_CALL_S)
    futures[name].result(2 * KAFKA_CALL_S)
    deadline = time.monotonic() + 2 * KAFKA_CALL_S
    while True:
        t = admin.list_topics(name, timeout=5).topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the topic {name} did not show {partitions} partitions on {bootstrap}")
        time.sleep(0.1)


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[tuple[int, int, str, str]]:
    """Everything a ``read_committed`` consumer sees in ``topic`` now, up to each partition's last stable offset:
    ``(partition, offset, key, value)`` in partition and offset order (bounded: ``timeout_s``)."""
    from dstreams.kafka.inspect import read_topic as read_committed

    return [(r.partition, r.offset, (r.key or b"").decode(), (r.value or b"").decode())
            for r in read_committed(bootstrap, topic, timeout_s=timeout_s)]


class KafkaFeeder(threading.Thread):
    """Writes the Kafka input at a steady rate: every ``FEED_EVERY_S`` 1-4 records ``(k<i>, "k<i>:<tick>:<j>")`` (keys
    drawn from ``KAFKA_KEYS`` by a seeded generator) with an idempotent producer (no duplicates from its own retries;
    what it cannot deliver while the broker is down waits in its queue, in order), and every ``TXN_EVERY``-th tick a
    transaction of another producer, aborted every other time (values ``"k<i>:a<n>:<j>"``, which must never reach the
    output; committed ones ``"k<i>:c<n>:<j>"``): so the input has transaction markers and aborted records too, but
    few (each is a gap in the offsets that the source's reader checks with a request to the broker). The
    transactional producer rides out broker restarts: after any error it is dropped and a new one
    (``init_transactions`` under the same ``transactional.id``, which aborts what the old one left open) tries again.
    Every value is unique; which records were committed is read back from the topic, not assumed from here."""

    def __init__(self, bootstrap: str, topic: str, seed: int, transactional_id: str) -> None:
        super().__init__(name="kafka-feeder", daemon=True)
        self.bootstrap, self.topic, self.tid = bootstrap, topic, transactional_id
        self.rng = random.Random(seed * 31 + 5)
        self.stopped = threading.Event()
        self.ticks = self.produced = self.delivered = self.failed = 0
        self.txns = self.committed = self.aborted = self.errors = 0
        self.last_error: str | None = None

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed += 1
            self.last_error = f"delivery: {err}"[:500]

    def _records(self, tag: str) -> list[tuple[bytes, bytes]]:
        out = []
        for j in range(self.rng.randint(1, 4)):
            key = f"k{self.rng.randrange(KAFKA_KEYS)}"
            out.append((key.encode(), f"{key}:{tag}:{j}".encode()))
        return out

    def _transaction(self, txn: Any) -> Any:
        """One transaction (aborted every other time); returns the producer to use next time (None: make one)."""
        from confluent_kafka import KafkaException, Producer

        try:
            if txn is None:
                txn = Producer(_kafka_conf(self.bootstrap, **{"transactional.id": self.tid, "linger.ms": 5,
                                                              "partitioner": "murmur2_random",
                                                              "transaction.timeout.ms": 30000}))
                txn.init_transactions(KAFKA_CALL_S)
            self.txns += 1
            abort = self.txns % 2 == 1
            txn.begin_transaction()
            for key, value in self._records(f"{'a' if abort else 'c'}{self.txns}"):
                txn.produce(self.topic, key=key, value=value)
            if abort:
                txn.flush(KAFKA_CALL_S)  # the records reach the log, then the abort marker
                txn.abort_transaction(KAFKA_CALL_S)
                self.aborted += 1
            else:
                txn.commit_transaction(KAFKA_CALL_S)
                self.committed += 1
            return txn
        except (KafkaException, BufferError) as e:
            self.errors += 1
            self.last_error = f"transaction: {type(e).__name__}: {e}"[:500]
            if txn is not None:
                try:
                    txn.purge()
                except Exception:  # noqa: BLE001 - a fenced or broken producer: nothing to purge
                    pass
            return None  # the next one fences it and aborts its open transaction, if any

    def run(self) -> None:
        from confluent_kafka import KafkaException, Producer

        plain = Producer(_kafka_conf(self.bootstrap, **{"enable.idempotence": True, "linger.ms": 5,
                                                        "partitioner": "murmur2_random",
                                                        "on_delivery": self._on_delivery}))
        txn = None
        while not self.stopped.wait(FEED_EVERY_S):
            self.ticks += 1
            for key, value in self._records(str(self.ticks)):
                try:
                    plain.produce(self.topic, key=key, value=value)
                    self.produced += 1
                except BufferError:  # the queue is full (a long outage): this record is not written
                    plain.poll(0.1)
            plain.poll(0)
            if self.ticks % TXN_EVERY == 0:
                txn = self._transaction(txn)
        left = plain.flush(2 * KAFKA_CALL_S)
        if left:
            self.last_error = f"{left} records not delivered at the stop"
        try:  # after an error a transaction may be open: a new producer's init_transactions aborts it
            if txn is None and self.txns:
                self.txns -= 1  # (the attempt below is not one more transaction of the input)
                self._transaction(None)
        except KafkaException as e:
            self.last_error = f"at the stop: {type(e).__name__}: {e}"[:500]

    def stats(self) -> dict[str, Any]:
        return {"ticks": self.ticks, "records_produced": self.produced, "records_delivered": self.delivered,
                "delivery_failed": self.failed, "transactions": self.txns, "committed": self.committed,
                "aborted_on_purpose": self.aborted, "transaction_errors": self.errors, "last_error": self.last_error}


def s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        region_name=REGION, config=Config(s3={"addressing_style": "path"},
                                                          retries={"max_attempts": 3, "mode": "standard"},
                                                          connect_timeout=3, read_timeout=20))


class FileFeeder(threading.Thread):
    """Writes input file ``i`` (directly to the gateway, not through the proxy) as soon as
    ``files_per_batch * (batches since zero + FILES_AHEAD)`` files are wanted, so that every batch finds
    at least ``files_per_batch`` unread files, whatever the faults."""

    def __init__(self, client: Any, bucket: str, prefix: str, cfg: dict[str, Any]) -> None:
        super().__init__(name="file-feeder", daemon=True)
        self.client, self.bucket, self.prefix, self.cfg = client, bucket, prefix, cfg
        self.written = 0
        #: file index -> a line to append (the poison-record fault); set before the file is written
        self.poison: dict[int, str] = {}
        self.lock = threading.Lock()  # held while a file is written: poison() picks a file not written yet
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def wanted(self) -> int:
        batches = max(0, (now_ms() - self.cfg["zero_ms"]) // self.cfg["batch_ms"])
        return self.cfg["files_per_batch"] * (batches + FILES_AHEAD)

    def write_up_to(self, n: int) -> None:
        c = self.cfg
        while self.written < n:
            with self.lock:
                i = self.written
                lines = chaos_app.file_lines(c["seed"], i, c["lines_per_file"], c["files_per_batch"], c["batch_ms"])
                if i in self.poison:
                    lines = [*lines, self.poison[i]]
                body = "".join(line + "\n" for line in lines)
                self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}{chaos_app.file_name(i)}",
                                       Body=body.encode())
                self.written += 1

    def poison_batch(self, batch: int, line: str) -> int:
        """Append ``line`` to the first input file of batch ``batch`` (batch ``k`` reads files ``(k - 1) *
        files_per_batch`` on: files always wait); returns its index. Before the file is written."""
        i = (batch - 1) * self.cfg["files_per_batch"]
        with self.lock:
            if i < self.written:
                raise RuntimeError(f"input file {i} is written already: poison it before the run starts")
            self.poison[i] = line
        return i

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            try:
                self.write_up_to(self.wanted())
            except Exception as e:  # noqa: BLE001 - retried (a --stop-gateway outage); kept for the report
                self.error = e


# --------------------------------------------------------------------------------------------- the driver
@dataclass
class Incarnation:
    """One driver process: how and when it started, and how it ended."""

    n: int
    master: str
    launch_ms: int
    log_path: str
    armed: dict[str, Any] | None
    pid: int = 0
    exit_ms: int | None = None
    rc: int | None = None
    ended_by: str | None = None  # the fault or event that ended it

    def lines(self) -> list[str]:
        try:
            return Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return []

    def stamp(self, word: str) -> int | None:
        for line in self.lines():
            if line.startswith(word + " "):
                try:
                    return int(line.split()[1])
                except (IndexError, ValueError):
                    return None
        return None

    def app_id(self) -> str | None:
        for line in self.lines():
            if line.startswith("APP "):
                return line.split()[1]
        return None


class ChaosRun:
    """The orchestration of one seeded run (module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed: int = args.seed
        self.run_id = f"chaos-{self.seed}-{uuid.uuid4().hex[:6]}"
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix=f"{self.run_id}-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.batch_ms = int(args.batch_seconds * 1000)
        self.schedule = make_schedule(self.seed, args.minutes, tuple(args.kinds), args.gap)
        self.incarnations: list[Incarnation] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.current: Incarnation | None = None
        self.recoveries: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.metrics_rows: list[dict[str, Any]] = []
        self._metrics_pos = 0
        self.redis: RedisServer | None = None
        self.postgres: PostgresServer | None = None
        self.kafka: dict[str, str] | None = None  # the Kafka branch's broker and topics (--kafka)
        self.kafka_broker: KafkaBroker | None = None  # the run's own broker (--kafka own)
        self.kafka_feeder: KafkaFeeder | None = None
        self._broker_start: threading.Thread | None = None
        self.proxies: dict[str, FaultProxy] = {}
        self.feeder: FileFeeder | None = None
        rgw = urlsplit(args.rgw)
        self.rgw_url, self.rgw_host, self.rgw_port = args.rgw.rstrip("/"), rgw.hostname or "127.0.0.1", rgw.port or 80
        self.client = s3_client(self.rgw_url)
        self.bucket = self.run_id
        self.app_ids: set[str] = set()
        self.unplanned_in_a_row = 0
        self.gateway: Any = None
        self.supervising = False  # only the streaming drivers are restarted, not bootstrap and reference
        self.t0 = time.monotonic()
        self.final_rc: int | None = None

    # ------------------------------------------------------------------------------------------- set-up
    def config(self, reference: bool) -> dict[str, Any]:
        assert self.redis is not None
        local = self.work / ("ref" if reference else "run")
        local.mkdir(parents=True, exist_ok=True)
        (local / "faults").mkdir(exist_ok=True)
        per_key = self.args.per_key
        return {
            "seed": self.seed, "batch_ms": self.batch_ms, "zero_ms": self.zero_ms,
            "base": f"s3://{self.bucket}/{'ref' if reference else 'run'}", "local": str(local),
            "redis_url": (f"redis://127.0.0.1:{self.redis.port}/0" if reference
                          else f"redis://127.0.0.1:{self.proxies['redis'].port}/0"),
            "keys": [f"k{p}" for p in range(self.args.keys)], "per_key": per_key,
            "files_per_batch": 1, "lines_per_file": 4,
            "checkpoint_s": 5 * self.batch_ms / 1000, "window_s": 3 * self.batch_ms / 1000,
            "lateness_s": 4, "ewindow_s": 8, "eslide_s": 4, "gap_s": 3 * self.batch_ms / 1000,
            "metrics": str(local / "metrics.jsonl"), "batches": 0,
            "sink_key": "sink-ref" if reference else "sink-run", "sink_chunk": SINK_CHUNK,
            "postgres_dsn": self.postgres.dsn if self.postgres else "",
            "table": f"{'ref' if reference else 'run'}_events",
            "kafka": None if reference else self.kafka,
        }

    def env(self, endpoint: str, armed: dict[str, Any] | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _FAULT_ENV and not k.startswith("AWS_")}
        tmp = self.work / "tmp"
        tmp.mkdir(exist_ok=True)
        env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, TMPDIR=str(tmp),
                   AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   AWS_DEFAULT_REGION=REGION, PYTHONUNBUFFERED="1")
        if armed and "marker" in armed:  # kafka-kill: a task-side kill point, then the driver (chaos_app)
            env["DSTREAMS_FAULT_TASK_KILL"] = f"{armed['point']}:{armed['marker']}"
            env["CHAOS_DIE_WITH"] = armed["marker"]
        elif armed:
            env["DSTREAMS_FAULT_KILL"] = armed["point"]
            env["DSTREAMS_FAULT_KILL_AFTER"] = str(armed["after"])
        return env

    def setup(self) -> None:
        log(f"run {self.run_id}: work folder {self.work}, {len(self.schedule)} faults over {self.args.minutes} min")
        broker_ready: threading.Thread | None = None
        broker_error: list[BaseException] = []
        if self.args.kafka == "own":  # formatted and started while the rest is set up (a JVM start takes seconds)
            def own_broker() -> None:
                try:
                    self.kafka_broker = KafkaBroker(self.work / "kafka")
                    self.kafka_broker.start()
                except BaseException as e:  # noqa: BLE001 - raised on the main thread below
                    broker_error.append(e)

            broker_ready = self._broker_start = threading.Thread(target=own_broker, name="kafka-broker-start",
                                                                 daemon=True)
            broker_ready.start()
        self.client.create_bucket(Bucket=self.bucket)
        port = free_port(*REDIS_PORTS)
        self.redis = RedisServer(self.work / "redis", port)
        self.redis.start()
        self.proxies["redis"] = FaultProxy("redis", "127.0.0.1", port)
        self.postgres = PostgresServer.launch(self.work / "postgres")
        import psycopg

        with psycopg.connect(self.postgres.dsn, autocommit=True) as conn:
            for table in ("run_events", "ref_events"):
                conn.execute(chaos_app.table_ddl(table))
        log(f"PostgreSQL :{self.postgres.port} ({self.postgres.folder}) with the tables run_events, ref_events")
        self.proxies["s3"] = FaultProxy("s3", self.rgw_host, self.rgw_port)
        if self.args.stop_gateway:
            from .catchup import Gateway

            self.gateway = Gateway(self.client, self.bucket)
        # The zero time: the next whole batch interval; batch k is zero + k * interval in every run.
        self.zero_ms = (now_ms() // self.batch_ms + 1) * self.batch_ms
        self.cfg = self.config(reference=False)
        # Enough for a schedule that waits long for steady states (3x its length) and 15 min more; a run that
        # outlasts it reads fewer entries in its last batches, the reference too: still the same batches.
        total_batches = int((self.args.minutes * 180 + 900) * 1000 // self.batch_ms) + FILES_AHEAD
        self.preload_redis(total_batches)
        if self.args.kafka != "off":
            if broker_ready is not None:
                broker_ready.join(2 * KAFKA_START_S + 240)
                if broker_error or self.kafka_broker is None or not self.kafka_broker.ready():
                    raise RuntimeError(f"the run's own Kafka broker did not start: {broker_error[:1]}")
            self.setup_kafka(self.kafka_broker.bootstrap if self.kafka_broker else self.args.kafka)

    def setup_kafka(self, bootstrap: str) -> None:
        """The Kafka branch's topics (names of the run's own) and its input, written from now on."""
        self.kafka = {"bootstrap": bootstrap, "in_topic": f"{self.run_id}-in", "out_topic": f"{self.run_id}-out",
                      "ledger_topic": "dstreams-ledger"}
        create_topic(bootstrap, self.kafka["in_topic"], KAFKA_IN_PARTITIONS)
        create_topic(bootstrap, self.kafka["out_topic"], KAFKA_OUT_PARTITIONS)
        self.cfg = self.config(reference=False)
        self.kafka_feeder = KafkaFeeder(bootstrap, self.kafka["in_topic"], self.seed, f"{self.run_id}-feeder")
        self.kafka_feeder.start()
        own = self.kafka_broker
        which = (f"the run's own broker, up {own.start_s[-1]} s after its launch" if own and own.start_s
                 else "a broker this run never restarts")
        log(f"Kafka at {bootstrap} ({which}): input {self.kafka['in_topic']} ({KAFKA_IN_PARTITIONS} partitions, "
            f"written from now on), output {self.kafka['out_topic']} ({KAFKA_OUT_PARTITIONS} partitions)")

    def preload_redis(self, batches: int) -> None:
        assert self.redis is not None
        client = self.redis.client()
        per_key, n = self.cfg["per_key"], batches * self.cfg["per_key"]
        for p, key in enumerate(self.cfg["keys"]):
            pipe = client.pipeline(transaction=False)
            for j in range(n):
                pipe.xadd(key, chaos_app.redis_record(self.seed, p, j, per_key, self.batch_ms))
                if j % 2000 == 1999:
                    pipe.execute()
            pipe.execute()
        self.redis_entries = n
        log(f"redis-server :{self.redis.port} (AOF on) holds {n} entries in each of {len(self.cfg['keys'])} keys; "
            f"proxies: redis :{self.proxies['redis'].port}, s3 :{self.proxies['s3'].port}")

    # ------------------------------------------------------------------------------------------ drivers
    def write_config(self, cfg: dict[str, Any], name: str) -> str:
        path = self.work / name
        path.write_text(json.dumps(cfg, indent=1))
        return str(path)

    def launch(self, mode: str, master: str, armed: dict[str, Any] | None = None, cfg_path: str | None = None,
               endpoint: str | None = None) -> Incarnation:
        n = len(self.incarnations)
        inc = Incarnation(n, master, now_ms(), str(self.work / "logs" / f"driver-{n:03d}-{mode}.log"), armed)
        Path(inc.log_path).parent.mkdir(exist_ok=True)
        with open(inc.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(APP), cfg_path or self.cfg_path, "--mode", mode, "--master", master],
                env=self.env(endpoint or f"http://{self.proxies['s3'].address}", armed), cwd=str(ROOT),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        inc.pid = self.proc.pid
        self.incarnations.append(inc)
        self.current = inc
        log(f"driver #{n} ({mode}, {master}{', armed ' + json.dumps(armed) if armed else ''}) pid {inc.pid}")
        return inc

    def plan_next_driver(self, next_fault: int) -> tuple[str, dict[str, Any] | None]:
        """Master and armed fault point for a driver started now, from the faults still to come until the
        next driver-ending one."""
        master = self.args.master
        armed = None
        need_cluster = False
        for f in self.schedule[next_fault:]:
            if f.outcome != "pending":
                continue
            if f.kind == "executor-kill":
                need_cluster = True
            if f.kind in DRIVER_ENDING:
                if f.kind == "driver-kill-in-output":
                    secs = max(self.batch_ms / 1000, self.fault_due_s(f))
                    after = max(2, round(secs * 1000 / self.batch_ms * PER_BATCH[f.params["point"]]))
                    armed = {"point": f.params["point"], "after": after, "fault": f.index}
                elif f.kind == "kafka-kill":  # the marker is written when the fault is due (inject)
                    marker = Path(self.cfg["local"]) / "faults" / f"kafka-kill-{f.index}"
                    armed = {"point": f.params["point"], "fault": f.index, "marker": str(marker)}
                break
        if master == "mixed":
            master = LOCAL_CLUSTER if need_cluster else LOCAL
        return master, armed

    def fault_due_s(self, f: Fault) -> float:
        return max(0.0, self.t0 + f.at_s - time.monotonic())

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self, timeout: float = 60.0) -> int | None:
        """Wait for the driver process; then SIGKILL what is left of its group and of its executors."""
        assert self.proc is not None and self.current is not None
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            rc = self.proc.wait(timeout=30)
        if self.current.exit_ms is None:
            self.current.exit_ms = now_ms()
        self.current.rc = rc
        self.kill_group()
        self.cleanup_executors(self.current)
        return rc

    def cleanup_executors(self, inc: Incarnation) -> None:
        from dstreams.recovery import faults

        app_id = inc.app_id()
        if not app_id:
            return
        self.app_ids.add(app_id)
        for pid in faults.executor_pids(app_id).values():  # its driver is gone: no waiting (restart speed)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def restart(self, reason: str, kill_ms: int, next_fault: int, fault: Fault | None) -> None:
        prev = self.current
        committed_before = max((r["batch_ms"] for r in self.committed_rows()), default=0)
        master, armed = self.plan_next_driver(next_fault)
        inc = self.launch("run", master, armed)
        self.recoveries.append({"reason": reason, "fault": None if fault is None else fault.index,
                                "kill_ms": kill_ms, "prev_pid": prev.pid if prev else None,
                                "prev_rc": prev.rc if prev else None, "pid": inc.pid, "master": master,
                                "launch_ms": inc.launch_ms, "committed_before_ms": committed_before,
                                "load_at_kill": _load()})

    def supervise(self, next_fault: int) -> None:
        """Restart a driver that exited on its own (a crash, a batch error, an armed fault point)."""
        if not self.supervising or self.proc is None or self.proc.poll() is None:
            return
        inc = self.current
        assert inc is not None
        inc.exit_ms = now_ms()
        rc = self.reap()
        text = "\n".join(inc.lines()[-400:])
        fault = None
        if "dstreams fault injection: SIGKILL at" in text and inc.armed is not None:
            fault = self.schedule[inc.armed["fault"]]
            fault.injected_ms = fault.ended_ms = inc.exit_ms
            fault.outcome = "injected"
            after = inc.armed.get("after")
            fault.detail = {"point": inc.armed["point"], "after": after, "pid": inc.pid}
            reason = f"{fault.kind} ({inc.armed['point']}{'' if after is None else f' #{after}'})"
            inc.ended_by = reason
            self.unplanned_in_a_row = 0
        else:
            failed = [line for line in text.splitlines() if line.startswith("DRIVER FAILED")]
            reason = f"driver exited rc={rc}" + (f": {failed[-1][:300]}" if failed else "")
            inc.ended_by = reason
            self.unplanned_in_a_row += 1
            self.events.append({"ms": inc.exit_ms, "event": "unplanned driver exit", "pid": inc.pid, "rc": rc,
                                "detail": failed[-1][:1000] if failed else text[-1500:]})
            if self.unplanned_in_a_row > 6:
                raise RuntimeError(f"the driver exited {self.unplanned_in_a_row} times in a row without a fault "
                                   f"that explains it; last log {inc.log_path}:\n{text[-3000:]}")
        log(f"driver #{inc.n} exited: {reason}; restarting")
        self.restart(reason, inc.exit_ms, next_fault, fault)

    # ------------------------------------------------------------------------------------------ metrics
    def refresh_metrics(self) -> list[dict[str, Any]]:
        path = self.cfg["metrics"]
        try:
            with open(path) as f:
                f.seek(self._metrics_pos)
                data = f.read()
        except OSError:
            return self.metrics_rows
        end = data.rfind("\n") + 1
        self._metrics_pos += len(data[:end].encode())
        for line in data[:end].splitlines():
            try:
                self.metrics_rows.append(json.loads(line))
            except ValueError:
                pass
        return self.metrics_rows

    def committed_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.refresh_metrics() if not r["failed"]]

    def steady_since(self, since_ms: int) -> int | None:
        """Completion time of the first of STEADY_RUN consecutive good batches completed after ``since_ms``
        by the current driver, or None."""
        if self.current is None:
            return None
        rows = [r for r in self.committed_rows() if r["pid"] == self.current.pid and r["logged_ms"] >= since_ms]
        run: list[dict[str, Any]] = []
        for r in rows:
            good = (r["scheduling_delay_ms"] is not None and r["scheduling_delay_ms"] < self.batch_ms
                    and r["start_ms"] is not None and r["start_ms"] - r["batch_ms"] < 2 * self.batch_ms)
            run = run + [r] if good else []
            if len(run) >= STEADY_RUN:
                return int(run[0]["logged_ms"])
        return None

    def wait(self, cond: Callable[[], Any], timeout: float, next_fault: int, what: str) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.supervise(next_fault)
            if cond():
                return True
            if time.monotonic() > deadline:
                log(f"  (not within {timeout:.0f} s: {what})")
                self.events.append({"ms": now_ms(), "event": f"timed out waiting for {what}"})
                return False
            time.sleep(0.1)

    # ------------------------------------------------------------------------------------------ faults
    def inject(self, f: Fault) -> None:
        f.injected_ms = now_ms()
        if f.kind not in ("driver-kill-in-output", "kafka-kill"):  # those count once the driver killed itself
            f.outcome = "injected"
        nxt = f.index + 1
        if f.kind == "driver-kill":
            time.sleep(f.params["delay_s"])
            f.injected_ms = now_ms()
            assert self.current is not None
            self.current.exit_ms = f.injected_ms
            self.current.ended_by = "driver-kill"
            self.kill_group()
            self.reap()
            self.restart("driver-kill", f.injected_ms, nxt, f)
        elif f.kind in ("driver-kill-in-output", "kafka-kill"):
            assert self.current is not None
            inc = self.current
            if inc.armed is None or inc.armed["fault"] != f.index:
                f.outcome = "skipped"
                f.detail = {"why": "the running driver was not armed for it"}
                return
            marker = Path(inc.armed["marker"]) if "marker" in inc.armed else None
            if marker is not None:  # the next task to reach the point kills its worker, then the driver dies
                marker.write_text(f"fault {f.index}\n")
                Path(f"{marker}.set").write_text(f"fault {f.index}\n")
            after = inc.armed.get("after")
            died = self.wait(lambda: bool(f.detail), 240, nxt,
                             f"driver #{inc.n} to reach {inc.armed['point']}{'' if after is None else f' #{after}'}")
            if marker is not None:  # withdrawn (.set first: chaos_app's watcher then lets the driver be)
                for path in (Path(f"{marker}.set"), marker):
                    path.unlink(missing_ok=True)
            if died:  # supervise() saw it kill itself, recorded it and restarted it
                return
            if self.current is not inc:
                f.outcome = "not injected: the armed driver ended otherwise"
            else:
                f.outcome = "point not reached: SIGKILL by the orchestrator"
                inc.exit_ms = f.injected_ms = now_ms()
                self.kill_group()
                self.reap()
                self.restart("driver-kill (armed point not reached)", f.injected_ms, nxt, f)
        elif f.kind == "driver-term":
            assert self.proc is not None and self.current is not None
            inc = self.current
            self.proc.send_signal(signal.SIGTERM)
            rc = self.reap(timeout=120)
            f.detail = {"rc": rc, "stop_s": round((now_ms() - f.injected_ms) / 1000, 2)}
            inc.ended_by = "driver-term"
            if rc != 0:
                self.events.append({"ms": now_ms(), "event": "graceful stop did not exit 0", "rc": rc,
                                    "log": inc.log_path})
            self.restart("driver-term", f.injected_ms, nxt, f)
        elif f.kind == "gateway-down":
            secs = f.params["seconds"]
            if self.gateway is not None:
                self.gateway.stop()
                self._sleep_supervised(secs, nxt)
                self.gateway.start()
            else:
                self.proxies["s3"].down()
                self._sleep_supervised(secs, nxt)
                self.proxies["s3"].up()
        elif f.kind == "redis-restart":
            assert self.redis is not None
            self.redis.stop(signal.SIGTERM if f.params["signal"] == "TERM" else signal.SIGKILL)
            self._sleep_supervised(f.params["down_s"], nxt)
            self.redis.start()
            self.redis.restarts += 1
        elif f.kind == "redis-drop":
            cut = self.proxies["redis"].cut()
            if f.params["refuse_s"] > 0:
                self.proxies["redis"].down()
                self._sleep_supervised(f.params["refuse_s"], nxt)
                self.proxies["redis"].up()
            f.detail = {"connections_cut": cut}
        elif f.kind == "executor-kill":
            self.kill_executor(f, nxt)
        elif f.kind == "postgres-restart":
            assert self.postgres is not None
            self.postgres.stop(f.params["mode"])
            self._sleep_supervised(f.params["down_s"], nxt)
            self.postgres.start()
            self.postgres.restarts += 1
        elif f.kind == "kafka-restart":
            broker = self.kafka_broker
            if broker is None:
                f.outcome = "skipped"
                f.detail = {"why": "the Kafka broker is not the run's own (--kafka own)"}
                return
            t = time.monotonic()
            broker.stop(signal.SIGTERM if f.params["signal"] == "TERM" else signal.SIGKILL)
            stop_s = time.monotonic() - t
            self._sleep_supervised(f.params["down_s"], nxt)
            broker.launch()
            if not self.wait(broker.ready, KAFKA_START_S, nxt, "the Kafka broker's restart"):
                raise RuntimeError(f"the run's Kafka broker did not answer within {KAFKA_START_S:.0f} s of its "
                                   f"restart; see {broker.log_path}")
            broker.restarts += 1
            f.detail = {"stop_s": round(stop_s, 2), "start_s": broker.start_s[-1],
                        "unavailable_s": round(time.monotonic() - t, 2)}
        elif f.kind == "user-fail":
            # ahead of the newest committed batch, not of the wall clock: a stream behind the clock (a loaded
            # machine, a backlog after a restart) would otherwise not reach the marked batch before the end
            last = max((r["batch_ms"] for r in self.committed_rows()), default=self.zero_ms)
            t = last + f.params["ahead"] * self.batch_ms
            marker = Path(self.cfg["local"]) / "faults" / f"fail-{t}"
            marker.write_text(f"fault {f.index}\n")
            f.detail = {"batch_ms": t, "batch": (t - self.zero_ms) // self.batch_ms}
        elif f.kind == "poison-record":  # written with its file before the run (run_schedule): what it became
            assert self.feeder is not None
            line = f"POISON {f.index}"
            i = next(i for i, x in self.feeder.poison.items() if x == line)
            k = f.params["batch"]
            f.detail = {"file": i, "line": line, "batch": k, "batch_ms": self.zero_ms + k * self.batch_ms,
                        "written": i < self.feeder.written}
        f.ended_ms = now_ms()

    def _sleep_supervised(self, seconds: float, nxt: int) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.supervise(nxt)
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    def kill_executor(self, f: Fault, nxt: int) -> None:
        from dstreams.recovery import faults

        inc = self.current
        assert inc is not None
        if not inc.master.startswith("local-cluster"):
            f.outcome = "skipped"
            f.detail = {"why": f"the running driver uses {inc.master}"}
            return
        found: dict[str, int] = {}

        def executors() -> bool:
            nonlocal found
            app = self.current.app_id() if self.current else None
            found = faults.executor_pids(app) if app else {}
            return len(found) >= 2

        if not self.wait(executors, 120, nxt, "two executors") and not found:
            f.outcome = "skipped"
            f.detail = {"why": "no executor registered"}
            return
        ids = sorted(found)
        victim = ids[f.params["executor"] % len(ids)]
        f.injected_ms = now_ms()
        os.kill(found[victim], signal.SIGKILL)
        f.detail = {"executor": victim, "pid": found[victim], "app": self.current.app_id() if self.current else None}

    # ------------------------------------------------------------------------------------------ the run
    def run_schedule(self) -> None:
        assert self.redis is not None
        self.cfg_path = self.write_config(self.cfg, "run.json")
        self.feeder = FileFeeder(self.client, self.bucket, "run/in/", self.cfg)
        for f in self.schedule:
            if f.kind == "poison-record":
                self.feeder.poison_batch(f.params["batch"], f"POISON {f.index}")
        # bootstrap: batch 1 on a manual clock, files written after the source's start
        inc = self.launch("bootstrap", LOCAL)
        self.wait(lambda: inc.stamp("STARTED") is not None or self.proc.poll() is not None, 300, 0, "bootstrap start")
        if self.proc.poll() is not None:
            raise RuntimeError(f"bootstrap driver failed:\n{Path(inc.log_path).read_text()[-3000:]}")
        self.feeder.write_up_to(self.feeder.wanted())
        self.feeder.start()
        (Path(self.cfg["local"]) / "go").write_text("go\n")
        rc = self.proc.wait(timeout=300)
        inc.exit_ms, inc.rc, inc.ended_by = now_ms(), rc, "bootstrap done"
        self.kill_group()
        if rc != 0:
            raise RuntimeError(f"bootstrap driver exited {rc}:\n{Path(inc.log_path).read_text()[-3000:]}")
        master, armed = self.plan_next_driver(0)
        self.supervising = True
        self.launch("run", master, armed)
        self.t0 = time.monotonic()
        steady_wait = float(self.args.steady_wait)
        self.wait(lambda: self.steady_since(0) is not None, 3 * steady_wait, 0, "the first steady state")
        self.t0 = time.monotonic()
        last_end = now_ms()
        for f in self.schedule:
            if f.outcome != "pending":
                continue
            due = self.t0 + f.at_s
            self.wait(lambda d=due: time.monotonic() >= d, f.at_s + 3600, f.index, "the fault's time")
            self.wait(lambda s=last_end: self.steady_since(s) is not None, steady_wait, f.index,
                      "steady state before a fault")
            if f.outcome != "pending":
                continue
            log(f"fault {f.index} {f.kind} {json.dumps(f.params)} (load {_load()})")
            self.inject(f)
            last_end = f.ended_ms or now_ms()
        # the end: the Kafka input stops; steady again, then a graceful stop
        if self.kafka_feeder is not None:
            self.kafka_feeder.stopped.set()
            self.kafka_feeder.join(4 * KAFKA_CALL_S)
        self.wait(lambda s=last_end: self.steady_since(s) is not None, 3 * steady_wait, len(self.schedule),
                  "the final steady state")
        # a user-fail late in the schedule marks a batch a few batches ahead of the stream, a poison-record a file
        # some batches ahead: the stop waits for that batch
        marked = max((f.detail["batch_ms"] for f in self.schedule
                      if f.kind in ("user-fail", "poison-record") and "batch_ms" in f.detail), default=0)
        self.wait(lambda: max((r["batch_ms"] for r in self.committed_rows()), default=0) >= marked, FINAL_MARKED_S,
                  len(self.schedule), "the batch a user-fail or poison-record marked to complete")
        assert self.proc is not None and self.current is not None
        log("schedule done: SIGTERM to the driver")
        self.current.ended_by = "final stop"
        self.supervising = False
        self.proc.send_signal(signal.SIGTERM)
        self.final_rc = self.reap(timeout=180)
        for f in self.schedule:  # did the marked batch's first attempt fail (the marker's .done file)?
            if f.kind == "user-fail" and "batch_ms" in f.detail:
                f.detail["fired"] = (Path(self.cfg["local"]) / "faults" / f"fail-{f.detail['batch_ms']}.done").exists()
        self.feeder.stopped.set()
        self.feeder.join(10)

    def recovery_figures(self) -> None:
        rows = self.committed_rows()
        for rec in self.recoveries:
            inc = next(i for i in self.incarnations if i.pid == rec["pid"])
            mine = [r for r in rows if r["pid"] == rec["pid"]]
            k = rec["kill_ms"]

            def rel(ms: int | None, k: int = k) -> float | None:
                return None if ms is None else round((ms - k) / 1000, 2)

            rec["launch_s"] = rel(rec["launch_ms"])
            rec["sc_s"] = rel(inc.stamp("SC"))
            rec["started_s"] = rel(inc.stamp("STARTED"))
            rec["first_commit_s"] = rel(mine[0]["logged_ms"]) if mine else None
            rec["first_commit_batch"] = (mine[0]["batch_ms"] - self.zero_ms) // self.batch_ms if mine else None
            new = [r for r in mine if r["batch_ms"] > rec["committed_before_ms"]]
            rec["first_new_s"] = rel(new[0]["logged_ms"]) if new else None
            run: list[dict[str, Any]] = []
            rec["steady_s"] = None
            for r in mine:
                good = (r["scheduling_delay_ms"] is not None and r["scheduling_delay_ms"] < self.batch_ms
                        and r["start_ms"] is not None and r["start_ms"] - r["batch_ms"] < 2 * self.batch_ms)
                run = run + [r] if good else []
                if len(run) >= STEADY_RUN:
                    rec["steady_s"] = rel(run[0]["logged_ms"])
                    break
            rec["batches_replayed"] = len([r for r in mine if r["batch_ms"] <= rec["committed_before_ms"]])

    # ------------------------------------------------------------------------------------------ outputs
    def read_outputs(self, cfg: dict[str, Any], complete_ms: int | None = None) -> dict[str, dict[int, list[str]]]:
        """Output name -> batch index -> sorted committed lines (folders with ``_SUCCESS``, audit files, the
        Redis stream's entries by the batch time in their id, the table's rows by their ``batch_ms``); with
        ``complete_ms``, stream entries of batches after it (a write the final stop may have cut) are left out."""
        out: dict[str, dict[int, list[str]]] = {}
        for name, (kind, where) in chaos_app.output_locations(cfg).items():
            got: dict[int, list[str]] = {}
            if kind == "store":
                got = self._read_store(where)
            elif kind == "redis-stream":
                got = self._read_stream(where, complete_ms)
            elif kind == "postgres":
                got = self._read_table(cfg["postgres_dsn"], where)
            elif kind == "local":
                folder, base = os.path.dirname(where), os.path.basename(where)
                for entry in os.listdir(folder) if os.path.isdir(folder) else []:
                    stem, _, t = entry.rpartition("-")
                    path = os.path.join(folder, entry)
                    if stem != base or not os.path.exists(os.path.join(path, "_SUCCESS")):
                        continue
                    lines: list[str] = []
                    for part in os.listdir(path):
                        if part.startswith("part-"):
                            lines += Path(path, part).read_text().splitlines()
                    got[self.index(int(t))] = sorted(lines)
            else:
                for entry in os.listdir(where) if os.path.isdir(where) else []:
                    if entry.isdigit():
                        got[self.index(int(entry))] = [Path(where, entry).read_text().strip() and "ok"]
            out[name] = got
        return out

    def _read_stream(self, key: str, complete_ms: int | None) -> dict[int, list[str]]:
        """The stream's entries (read on the Redis server itself, not through the proxy), grouped by the batch
        time of their id, as ``format_event`` lines."""
        assert self.redis is not None
        got: dict[int, list[str]] = {}
        for entry_id, f in self.redis.client().xrange(key):
            t = int(entry_id.split("-")[0])
            if complete_ms is None or t <= complete_ms:
                got.setdefault(self.index(t), []).append(f"{f['rid']} {f['w']} {f['ts']} {f['u']}")
        return {k: sorted(v) for k, v in got.items()}

    def _read_table(self, dsn: str, table: str) -> dict[int, list[str]]:
        """The table's rows grouped by their ``batch_ms`` column, as ``format_event`` lines."""
        import psycopg

        got: dict[int, list[str]] = {}
        with psycopg.connect(dsn) as conn:
            for batch_ms, rid, word, ts, usr in conn.execute(f"SELECT batch_ms, rid, word, ts, usr FROM {table}"):
                got.setdefault(self.index(int(batch_ms)), []).append(f"{rid} {word} {ts} {usr}")
        return {k: sorted(v) for k, v in got.items()}

    def index(self, t: int) -> int:
        return (t - self.zero_ms) // self.batch_ms

    def _read_store(self, url: str) -> dict[int, list[str]]:
        prefix = url.split("/", 3)[3].rstrip("/") + "/"
        objects: dict[int, list[str]] = {}
        committed: set[int] = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rest = obj["Key"][len(prefix):]
                t, _, name = rest.partition("/")
                if not t.isdigit():
                    continue
                if name == "_SUCCESS":
                    committed.add(int(t))
                elif name.startswith("part-"):
                    objects.setdefault(int(t), []).append(obj["Key"])
        got: dict[int, list[str]] = {}
        for t in committed:
            lines: list[str] = []
            for key in objects.get(t, []):
                lines += self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode().splitlines()
            got[self.index(t)] = sorted(lines)
        return got

    def run_reference(self, batches: int) -> tuple[dict[str, dict[int, list[str]]], float]:
        """The fault-free run over batches ``1..batches`` (module docstring); its outputs and wall time."""
        cfg = self.config(reference=True)
        cfg["batches"] = batches
        path = self.write_config(cfg, "ref.json")
        started = time.monotonic()
        inc = self.launch("reference", LOCAL, cfg_path=path, endpoint=self.rgw_url)
        self.wait(lambda: inc.stamp("STARTED") is not None or self.proc.poll() is not None, 300, len(self.schedule),
                  "the reference's start")
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"reference driver failed:\n{Path(inc.log_path).read_text()[-3000:]}")
        files = batches * cfg["files_per_batch"]
        for i in range(files):  # the same input files, written after the reference's source started
            name = chaos_app.file_name(i)
            self.client.copy_object(Bucket=self.bucket, Key=f"ref/in/{name}",
                                    CopySource={"Bucket": self.bucket, "Key": f"run/in/{name}"})
        (Path(cfg["local"]) / "go").write_text("go\n")
        rc = self.proc.wait(timeout=120 + 10 * batches)
        inc.exit_ms, inc.rc, inc.ended_by = now_ms(), rc, "reference done"
        self.kill_group()
        if rc != 0:
            raise RuntimeError(f"reference driver exited {rc}:\n{Path(inc.log_path).read_text()[-3000:]}")
        return self.read_outputs(cfg), time.monotonic() - started

    def compare(self) -> dict[str, Any]:
        complete = max((r["batch_ms"] for r in self.committed_rows()), default=None)
        chaos = self.read_outputs(self.cfg, complete)
        # N: the newest batch every output committed (a batch cut by the final stop may be partly committed)
        n = min((max(got) if got else 0) for got in chaos.values())
        log(f"chaos run committed batches 1..{n} in every output; running the fault-free reference over them")
        ref, ref_s = self.run_reference(n)
        result: dict[str, Any] = {"batches_compared": n, "reference_wall_s": round(ref_s, 1), "outputs": {}}
        mismatches: list[dict[str, Any]] = []
        for name in chaos_app.OUTPUTS:
            got, want = chaos[name], ref[name]
            missing = [k for k in range(1, n + 1) if k not in got]
            ref_missing = [k for k in range(1, n + 1) if k not in want]
            differ = [k for k in range(1, n + 1) if k in got and k in want and got[k] != want[k]]
            result["outputs"][name] = {"committed": len([k for k in got if 1 <= k <= n]), "missing": missing,
                                       "missing_in_reference": ref_missing, "differ": differ,
                                       "records": sum(len(got[k]) for k in got if 1 <= k <= n)}
            for k in differ[:5]:
                a, b = Counter(got[k]), Counter(want[k])
                mismatches.append({"output": name, "batch": k, "batch_ms": self.zero_ms + k * self.batch_ms,
                                   "only_chaos": sorted((a - b).elements())[:20],
                                   "only_reference": sorted((b - a).elements())[:20]})
        result["mismatches"] = mismatches
        # totals: every input record of batches 1..n in exactly one committed events batch
        per_key, files = self.cfg["per_key"], n * self.cfg["files_per_batch"]
        entries = min(n * per_key, self.redis_entries)
        expected = {f"r{p}-{j}" for p in range(len(self.cfg["keys"])) for j in range(entries)}
        expected |= {f"f{i}-{j}" for i in range(files) for j in range(self.cfg["lines_per_file"])}
        per_output: dict[str, dict[str, Any]] = {}
        for name in ("events", "stream", "table"):
            ids = Counter(line.split(" ", 1)[0] for k, lines in chaos[name].items() if 1 <= k <= n for line in lines)
            per_output[name] = {"records_seen": sum(ids.values()), "lost": len(expected - set(ids)),
                                "duplicated": sum(1 for c in ids.values() if c > 1),
                                "unexpected": len(set(ids) - expected),
                                "lost_examples": sorted(expected - set(ids))[:20],
                                "duplicated_examples": sorted(r for r, c in ids.items() if c > 1)[:20]}
        seen = Counter(line.split(" ", 1)[0] for k, lines in chaos["events"].items() if 1 <= k <= n for line in lines)
        words = Counter(line.split(" ")[1] for k, lines in chaos["events"].items() if 1 <= k <= n for line in lines)
        counts_n = dict(_parse_pair(line) for line in chaos["counts"].get(n, []))
        # records_seen: the events output's; lost, duplicated, unexpected: summed over events, stream and table
        result["totals"] = {"expected_records": len(expected), "records_seen": sum(seen.values()),
                            "lost": sum(o["lost"] for o in per_output.values()),
                            "duplicated": sum(o["duplicated"] for o in per_output.values()),
                            "unexpected": sum(o["unexpected"] for o in per_output.values()),
                            "lost_examples": sorted(expected - set(seen))[:20],
                            "duplicated_examples": sorted(r for r, c in seen.items() if c > 1)[:20],
                            "by_output": per_output,
                            "final_counts_equal_input": counts_n == dict(words)}
        # the poison lines of the files batches 1..n read: each once in the dead letters, with its parse error
        poisoned = {line: i for i, line in (self.feeder.poison.items() if self.feeder is not None else ())
                    if i < files}
        dead = Counter(json.loads(line)[0] for k, lines in chaos["dead"].items() if 1 <= k <= n for line in lines)
        result["dead_letters"] = {"poison_lines": len(poisoned), "seen": sum(dead.values()),
                                  "missing": sorted(set(poisoned) - set(dead)),
                                  "duplicated": sorted(r for r, c in dead.items() if c > 1),
                                  "unexpected": sorted(set(dead) - set(poisoned))}
        dead_ok = not (result["dead_letters"]["missing"] or result["dead_letters"]["duplicated"]
                       or result["dead_letters"]["unexpected"])
        result["ok"] = dead_ok and (not mismatches and all(not o["missing"] and not o["missing_in_reference"]
                                               for o in result["outputs"].values())
                        and result["totals"]["lost"] == 0 and result["totals"]["duplicated"] == 0
                        and result["totals"]["unexpected"] == 0 and result["totals"]["final_counts_equal_input"]
                        and n > 0)
        if self.kafka is not None:
            result["kafka"] = self.compare_kafka()
            result["ok"] = result["ok"] and result["kafka"]["ok"]
        return result

    def compare_kafka(self) -> dict[str, Any]:
        """The Kafka output as a read_committed consumer sees it against its input over the offset ranges the
        batches read (:func:`check_kafka`)."""
        assert self.kafka is not None
        k = self.kafka
        folder = Path(chaos_app.kafka_ranges_folder(self.cfg))
        ranges = {int(e.name): json.loads(e.read_text()) for e in folder.iterdir() if e.name.isdigit()
                  } if folder.is_dir() else {}
        result = check_kafka(read_topic(k["bootstrap"], k["in_topic"], 120),
                             read_topic(k["bootstrap"], k["out_topic"], 120), ranges)
        result["feeder"] = self.kafka_feeder.stats() if self.kafka_feeder else None
        return result

    # ------------------------------------------------------------------------------------------ teardown
    def teardown(self, keep: bool = False) -> None:
        """Stop what the run started; delete its bucket and (without ``--workdir``) its folder unless ``--keep`` or
        ``keep`` (a failed run keeps both: the metadata log's per-batch records say which driver fixed which input)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill_group()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for inc in self.incarnations:
            self.cleanup_executors(inc)
        if self.feeder is not None:
            self.feeder.stopped.set()
        if self.kafka_feeder is not None:
            self.kafka_feeder.stopped.set()
            self.kafka_feeder.join(4 * KAFKA_CALL_S)
        if self._broker_start is not None:  # a set-up that failed early: the broker may still be starting
            self._broker_start.join(2 * KAFKA_START_S + 240)
        if self.kafka_broker is not None:
            self.kafka_broker.stop()
        elif self.kafka is not None and not (self.args.keep or keep):  # a broker of others': the run's topics go
            try:
                from confluent_kafka.admin import AdminClient

                topics = [self.kafka["in_topic"], self.kafka["out_topic"]]
                for future in AdminClient(_kafka_conf(self.kafka["bootstrap"])).delete_topics(
                        topics, operation_timeout=KAFKA_CALL_S, request_timeout=KAFKA_CALL_S).values():
                    future.result(2 * KAFKA_CALL_S)
            except Exception as e:  # noqa: BLE001 - best effort
                log(f"could not delete the topics of the run on {self.kafka['bootstrap']}: {e}")
        if self.gateway is not None and self.gateway.stopped_by_us:
            self.gateway.start()
        for p in self.proxies.values():
            p.close()
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.destroy()
        if self.args.keep or keep:
            log(f"kept the bucket {self.bucket} and the work folder {self.work} for inspection")
        else:
            try:
                for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    for i in range(0, len(keys), 1000):
                        self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i:i + 1000]})
                self.client.delete_bucket(Bucket=self.bucket)
            except Exception as e:  # noqa: BLE001 - best effort
                log(f"could not delete bucket {self.bucket}: {e}")
            if not self.args.workdir:
                shutil.rmtree(self.work, ignore_errors=True)


def check_kafka(inp: list[tuple[int, int, str, str]], out: list[tuple[int, int, str, str]],
                ranges: dict[int, list[list[Any]]] | None = None) -> dict[str, Any]:
    """The Kafka branch's output (``(partition, offset, key, value)`` as :func:`read_topic` returns them) against the
    fault-free expectation computed from its input's committed records: per key, the input's values in offset order,
    the i-th written as ``"<i> <value>"``.

    ``ranges`` (batch ms -> ``[[topic, partition, from, until], ...]``, the batches' ``kafka-ranges`` files; None:
    the whole input is expected) says which input the committed batches read: per partition they must follow one
    another from offset 0 without a gap or an overlap (``range_gaps``), and the input expected is the committed
    records below the last one's end; for a key with output records of input records past that end, up to the last
    of them as well (``beyond_ranges``: the batch the final stop cut after some of its Kafka output committed,
    before its ranges were written; each output partition of a batch commits all of its keys' records or none, so
    such a key has all of its records of that batch). The rest of the input was not read yet (``not_read``: the
    stream was behind).

    ``lost``: expected input records not in the output; ``duplicated``: in it more than once; ``unexpected``: in
    it but not in the input (an aborted input transaction's, say); ``keys_differ``: keys whose output is not exactly
    their expected input, in order; ``bad_counts``: keys whose counts do not go 1, 2, 3, ...; ``malformed``: output
    records that do not parse. ``ok`` when none of these and some input was expected."""
    got: dict[str, list[tuple[int, str]]] = {}
    malformed: list[str] = []
    for _part, _off, key, value in sorted(out):
        count, _, v = value.partition(" ")
        if not count.isdigit() or not v.startswith(key + ":"):
            malformed.append(f"{key}={value}")
            continue
        got.setdefault(key, []).append((int(count), v))
    out_ids = Counter(v for vs in got.values() for _c, v in vs)
    range_gaps: list[dict[str, Any]] = []
    ends: dict[int, int] | None = None
    beyond = 0
    if ranges is not None:
        ends = {}
        for ms in sorted(ranges):
            for _topic, part, start, until in ranges[ms]:
                if start != ends.get(part, 0):
                    range_gaps.append({"batch_ms": ms, "partition": part, "from": start, "after": ends.get(part, 0)})
                ends[part] = max(until, ends.get(part, 0))
    key_ends: dict[str, int] = {}  # per key, past the ranges: the end of its last input record in the output
    for part, off, key, value in inp:
        if ends is not None and value in out_ids and off >= ends.get(part, 0):
            beyond += 1
            key_ends[key] = max(key_ends.get(key, 0), off + 1)
    expected = [r for r in sorted(inp) if ends is None or r[1] < max(ends.get(r[0], 0), key_ends.get(r[2], 0))]
    want: dict[str, list[str]] = {}
    parts: dict[str, set[int]] = {}
    for part, _off, key, value in expected:
        want.setdefault(key, []).append(value)
        parts.setdefault(key, set()).add(part)
    in_ids = Counter(v for vs in want.values() for v in vs)
    all_ids = {r[3] for r in inp}
    lost = sorted(set(in_ids) - set(out_ids))
    duplicated = sorted(v for v, c in out_ids.items() if c > 1)
    unexpected = sorted(set(out_ids) - all_ids)
    keys_differ = sorted(key for key in set(want) | set(got) if [v for _c, v in got.get(key, [])] != want.get(key))
    bad_counts = sorted(key for key, vs in got.items() if [c for c, _v in vs] != list(range(1, len(vs) + 1)))
    result: dict[str, Any] = {
        "input_records": len(inp), "expected_records": len(expected), "not_read": len(inp) - len(expected),
        "output_records": len(out), "keys": len(want), "batches_with_ranges": len(ranges or {}),
        "beyond_ranges": beyond, "range_gaps": range_gaps[:20],
        "keys_in_several_partitions": sorted(key for key, ps in parts.items() if len(ps) > 1),
        "lost": len(lost), "duplicated": len(duplicated), "unexpected": len(unexpected),
        "keys_differ": keys_differ, "bad_counts": bad_counts, "malformed": malformed[:20],
        "aborted_input_seen": sorted(v for v in out_ids if v.split(":")[1].startswith("a"))[:20],
        "lost_examples": lost[:20], "duplicated_examples": duplicated[:20], "unexpected_examples": unexpected[:20]}
    result["ok"] = bool(expected) and not (range_gaps or lost or duplicated or unexpected or keys_differ or bad_counts
                                           or malformed)
    return result


def _parse_gap(text: str) -> tuple[float, float]:
    """``--gap LO,HI``: two numbers of seconds, 0 < LO <= HI."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gap {text!r}: expected two numbers of seconds, LO,HI (e.g. 9,13)"
                                         ) from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"--gap {text!r}: expected 0 < LO <= HI (e.g. 9,13)")
    return lo, hi


def _parse_pair(line: str) -> tuple[str, int]:
    word, _, n = line.strip("()").partition(", ")
    return word.strip("'"), int(n)


def summary(doc: dict[str, Any]) -> str:
    rows = [f"chaos run seed {doc['seed']}, {doc['minutes']} min schedule, {doc['batch_ms']} ms batches: "
            f"{'OK' if doc.get('ok') else 'FAILED'}"]
    kinds = Counter(f["kind"] for f in doc["schedule"] if f["outcome"] == "injected")
    rows.append("faults injected: " + ", ".join(f"{k} {kinds.get(k, 0)}" for k in doc.get("kinds", KINDS)))
    other = [f for f in doc["schedule"] if f["outcome"] not in ("injected",)]
    if other:
        rows.append("not injected as planned: "
                    + "; ".join(f"#{f['index']} {f['kind']}: {f['outcome']}" for f in other))
    cmp_ = doc.get("comparison") or {}
    if cmp_:
        t = cmp_["totals"]
        rows.append(f"batches compared: {cmp_['batches_compared']} x {len(cmp_['outputs'])} outputs; "
                    f"records {t['records_seen']} of {t['expected_records']}: lost {t['lost']}, duplicated "
                    f"{t['duplicated']}, unexpected {t['unexpected']}; final counts equal the input: "
                    f"{t['final_counts_equal_input']}")
        for name, o in (t.get("by_output") or {}).items():
            rows.append(f"  {name:<8} records {o['records_seen']}: lost {o['lost']}, duplicated {o['duplicated']}, "
                        f"unexpected {o['unexpected']}")
        rows.append(f"{'output':<10} {'committed':>9} {'missing':>8} {'differ':>7} {'records':>8}")
        for name, o in cmp_["outputs"].items():
            rows.append(f"{name:<10} {o['committed']:>9} {len(o['missing']):>8} {len(o['differ']):>7} "
                        f"{o['records']:>8}")
        kc = cmp_.get("kafka")
        if kc:
            rows.append(f"kafka: {kc['output_records']} output records for the {kc['expected_records']} committed "
                        f"input records {kc['batches_with_ranges']} batches read ({kc['not_read']} more not read "
                        f"yet), {kc['keys']} keys: lost {kc['lost']}, duplicated {kc['duplicated']}, unexpected "
                        f"{kc['unexpected']}, keys out of order {len(kc['keys_differ'])}, keys with counts not 1, 2, "
                        f"3, ... {len(kc['bad_counts'])}, gaps between ranges {len(kc['range_gaps'])}: "
                        f"{'OK' if kc['ok'] else 'FAILED'}")
    rec = doc.get("recovery") or {}
    for key, label in (("first_commit_s", "kill -> next committed batch"), ("first_new_s", "kill -> first new batch"),
                       ("steady_s", "kill -> steady state"), ("sc_s", "kill -> SparkContext up"),
                       ("started_s", "kill -> context started")):
        for master, st in rec.get(key, {}).items():
            rows.append(f"{label:<30} {master:<24} n={st['n']:<3} median {st['median']} s  max {st['max']} s")
    rows.append(f"load average: start {doc['machine']['load_at_start']}, end {doc['machine'].get('load_at_end')}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=22)
    p.add_argument("--minutes", type=float, default=3.0, help="length of the fault schedule")
    p.add_argument("--batch-seconds", type=float, default=2.0)
    p.add_argument("--gap", type=_parse_gap, metavar="LO,HI",
                   help="seconds between two faults, drawn from LO-HI (default: 14,20 for a schedule of 5 minutes "
                        "or less, 22,40 otherwise)")
    p.add_argument("--steady-wait", type=float, default=90.0,
                   help="longest wait (s) for a steady stream before each fault (3x before the first and after the "
                        "last); a loaded machine may never be steady at this batch interval (default %(default)s)")
    p.add_argument("--keys", type=int, default=4, help="Redis stream keys")
    p.add_argument("--per-key", type=int, default=10, help="Redis entries per key per batch")
    p.add_argument("--master", default="mixed", help=f"'mixed' (default: {LOCAL_CLUSTER} only for drivers that "
                   f"will see an executor kill, {LOCAL} otherwise) or a master for every driver")
    p.add_argument("--stop-gateway", action="store_true",
                   help="stop and start the real radosgw (scripts/services.sh) instead of the proxy: only where "
                        "nobody else uses the gateway")
    p.add_argument("--rgw", default=DEFAULT_RGW, help="the Ceph gateway's endpoint (default %(default)s)")
    p.add_argument("--json", help="results file (default benchmarks/results/chaos-<seed>-<minutes>m.json)")
    p.add_argument("--workdir", help="keep logs and local outputs here (default: a temporary folder, removed)")
    p.add_argument("--keep", action="store_true", help="keep the bucket and the work folder")
    p.add_argument("--kafka", default="off", metavar="own|HOST:PORT|off",
                   help="the Kafka -> stateful -> Kafka branch: 'own' starts a broker of the run's own from the jars "
                        "of scripts/services.sh (`start kafka` gathers them) and restarts it as a fault; HOST:PORT "
                        "uses that broker (topics of the run's own; never restarted); 'off' (default): no Kafka")
    p.add_argument("--kinds", nargs="+", choices=KINDS, help="fault kinds (default: all that apply: the Kafka kinds "
                   "with --kafka, kafka-restart only with --kafka own)")
    args = p.parse_args(argv)
    applicable = BASE_KINDS + (KAFKA_KINDS if args.kafka == "own" else ("kafka-kill",) if args.kafka != "off" else ()) \
        + POISON_KINDS
    if args.kinds is None:
        args.kinds = list(applicable)
    elif set(args.kinds) - set(applicable):
        p.error(f"--kinds {' '.join(sorted(set(args.kinds) - set(applicable)))} need --kafka "
                f"{'own' if 'kafka-restart' in args.kinds else 'own or --kafka HOST:PORT'}")
    out = Path(args.json) if args.json else RESULTS / f"chaos-{args.seed}-{args.minutes:g}m.json"

    def terminated(signum: int, _frame: Any) -> None:  # SIGTERM (a test's timeout): the teardown below still runs
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    run = ChaosRun(args)
    doc: dict[str, Any] = {
        "benchmark": "chaos",
        "command": "python -m benchmarks chaos " + " ".join(sys.argv[1:] if argv is None else argv),
        "seed": args.seed, "minutes": args.minutes, "gap_s": args.gap, "batch_ms": run.batch_ms,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_at_start": _load()},
        "mode": "stop-gateway" if args.stop_gateway else "proxy", "kinds": list(args.kinds), "kafka": args.kafka,
        "ok": False}
    rc = 1
    try:
        run.setup()
        doc["zero_ms"] = run.zero_ms
        doc["bucket"], doc["work"] = run.bucket, str(run.work)
        run.run_schedule()
        run.recovery_figures()
        doc["comparison"] = run.compare()
        doc["ok"] = bool(doc["comparison"]["ok"]) and all(f.outcome == "injected" for f in run.schedule)
        rc = 0 if doc["comparison"]["ok"] else 1
    except BaseException as e:
        doc["error"] = f"{type(e).__name__}: {e}"
        log(f"run failed: {doc['error']}")
        raise
    finally:
        doc["machine"]["load_at_end"] = _load()
        doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        doc["schedule"] = [asdict(f) for f in run.schedule]
        doc["recoveries"] = run.recoveries
        doc["incarnations"] = [asdict(i) for i in run.incarnations]
        doc["events"] = run.events
        doc["proxies"] = [px.stats() for px in run.proxies.values()]
        doc["redis_restarts"] = run.redis.restarts if run.redis else 0
        doc["postgres_restarts"] = run.postgres.restarts if run.postgres else 0
        if run.kafka is not None:
            doc["kafka_run"] = {**run.kafka, "broker_restarts": run.kafka_broker.restarts if run.kafka_broker else 0,
                                "broker_start_s": run.kafka_broker.start_s if run.kafka_broker else [],
                                "feeder": run.kafka_feeder.stats() if run.kafka_feeder else None}
        by_master: dict[str, dict[str, dict[str, Any]]] = {}
        for key in ("launch_s", "sc_s", "started_s", "first_commit_s", "first_new_s", "steady_s"):
            groups: dict[str, list[float]] = {"all": []}
            for r in run.recoveries:
                if r.get(key) is not None:
                    groups["all"].append(r[key])
                    groups.setdefault(r["master"], []).append(r[key])
            by_master[key] = {m: _stats(v) for m, v in groups.items()}
        doc["recovery"] = by_master
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        try:
            print(summary(doc), flush=True)
        except Exception as e:  # noqa: BLE001 - the JSON is written
            print(f"(summary failed: {e})")
        print(f"wrote {out}", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown is not cut short (SIGKILL still is)
        run.teardown(keep=not doc["ok"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
