"""The driver that ``python -m benchmarks chaos`` starts, kills, stops and restarts (``benchmarks/chaos.py``).

``python benchmarks/chaos_app.py CONFIG.json [--mode run|bootstrap|reference] [--master M]``

The pipeline (:func:`build`), on batches of ``batch_ms``:

* ``redisStream`` of the run's own Redis server (through the fault proxy), ``maxRatePerPartition`` so
  that a batch holds at most ``per_key`` entries of each key, each entry decoded to a record
  ``(rid, word, ts_ms, user)``; ``textFileStream`` of an ``s3://`` prefix on the Ceph gateway (through
  the fault proxy), at most ``files_per_batch`` files per batch, lines parsed to the same record shape;
  the union of both is *the events*.
* outputs, in this order: the raw events (``saveToStore`` text, Ceph); a running count per word
  (``updateStateByKey``, ``saveAsTextFiles`` to a local folder); a sliding word count with an inverse
  function (``reduceByKeyAndWindow``, ``saveToStore`` JSON lines, Ceph); an event-time window count
  (``withEventTime`` + ``reduceByKeyAndEventWindow`` with ``invFunc``, ``emit="final"``,
  ``saveAsTextFiles``); per-user sessions (``sessionWindow``, ``saveToStore`` JSON lines, Ceph); the raw
  events again, exactly once into a Redis stream (``saveToRedisStream`` to ``sink_key`` on the run's own
  Redis server, through the fault proxy like the source, in chunks of ``sink_chunk`` entries: a batch takes
  several chunks, so a kill at ``redis-sink-chunk`` can cut one half-way) and into a PostgreSQL table
  (``saveToPostgres`` into ``table`` on the PostgreSQL server the run owns, ``postgres_dsn``; rows
  ``(batch_ms, rid, word, ts, usr)``: the batch time is a column so that the check can group the rows by
  batch; the table has no key, so a duplicate would show); the dead letters (``ssc.deadLetters()``: the file
  lines ``parse_line`` raises on, which only the ``poison-record`` fault writes; ``saveToStore`` text, Ceph, one
  JSON line per dead letter); an *audit* ``foreachRDD`` that writes
  ``audit/<batch ms>`` on the driver and is the user function the schedule makes fail:
  when ``faults/fail-<batch ms>`` exists and ``faults/fail-<batch ms>.done`` does
  not, it creates the latter and raises (so the batch's first attempt fails and a retry succeeds).
  Stateful streams checkpoint every ``checkpoint_s``.
* with ``kafka`` in the configuration (``python -m benchmarks chaos --kafka ...``), a Kafka -> stateful -> Kafka
  branch as well: ``kafkaStream`` of ``kafka.in_topic`` (several partitions, keyed records ``<key>:<tag>:<i>``
  written by the orchestrator, a few of them in transactions, half of those aborted; from the earliest offset,
  offsets recorded per batch), a running count per key (``updateStateByKey``: each record of the key, in offset
  order, gets the next count), written exactly once with ``saveToKafka`` to ``kafka.out_topic`` as
  ``(key, "<count> <input value>")``, then a ``foreachRDD`` that writes the batch's input offset ranges
  (``rdd.offsetRanges()``) to ``<local>/out/kafka-ranges/<batch ms>`` (so a batch with that file has its Kafka
  output committed), before the audit output. Its batches are not the same in every run (the records arrive in
  real time), so it is not compared with the reference batch by batch: the orchestrator checks that a
  ``read_committed`` consumer of the output sees, per key, every committed input record of the ranges read once,
  in input order, with the counts 1, 2, 3, ...
  A driver started with ``CHAOS_DIE_WITH=<marker>`` (and ``DSTREAMS_FAULT_TASK_KILL=<point>:<marker>``, the
  task-side kill of :mod:`dstreams.faults`, which the driver installs) SIGKILLs itself as soon as a task took that
  kill: the
  ``kafka-kill`` fault (a driver killed while a partition's Kafka transaction is open, or just committed).

Why every batch is the same in every run (the Kafka branch's aside): the Redis input is written in full
before the first start and read ``per_key`` entries per key per batch (backpressure off), the orchestrator keeps
at least ``files_per_batch`` unread files ahead of every batch time, and event times are in the records. So batch
``k`` (``(t - zero) / batch_ms``) holds the same records whatever the timing, and every output of batch
``k`` is a function of batches ``1..k``.

Modes:

* ``bootstrap``: the first start of a run. The context is built on a ``ManualClock`` at ``zero_ms``
  (a file source ignores the files present when it starts, so the files can only be written after
  ``start()``); prints ``STARTED``, waits for the file ``<local>/go``, runs batch 1, stops gracefully and
  exits 0. Every later start (``run``) resumes it with ``getOrCreate`` on the system clock, whose
  missed batches 2, 3, ... then run back to back: batch 1 is thus deterministic too.
* ``run``: ``getOrCreate`` on the checkpoint (it must exist), system clock; blocks in
  ``awaitTermination()``: SIGTERM is dstreams' graceful stop (exit 0), a batch error exits 1, SIGKILL
  is SIGKILL. ``--master`` picks the SparkContext's master for this driver (``local[2]`` or
  ``local-cluster[2,1,1024]`` for the executor-kill fault); the graph does not depend on it.
* ``reference``: the fault-free run. A fresh context (own checkpoint and outputs) on a ``ManualClock``
  at ``zero_ms``, on the real gateway and Redis server; after ``go`` it runs batches ``1..batches``
  one after the other, as fast as they complete, then stops.

Every mode prints ``APP <spark application id>``, ``SC <epoch ms>`` (SparkContext up), ``STARTED <epoch ms>``
(context started: graph and state restored) and appends one JSON line per completed batch to
``metrics`` (pid, batch time, submission/start/end, delays, failed), flushed at once.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import signal
import sys
import threading
import time
from typing import Any

#: Spark settings of every driver (both masters). Two partitions everywhere: the same tasks on both masters.
BASE_CONF = {
    "spark.default.parallelism": "2",
    "spark.dstreams.ui.enabled": "false",
    "spark.locality.wait": "0",
    "spark.executor.memory": "512m",
    # the Python worker daemon of dstreams works with local-cluster executors too (same interpreter)
    "spark.python.daemon.module": "dstreams.spark.worker_daemon",
    "spark.python.unix.domain.socket.enabled": "true",
}
#: Batches the reference's manual clock moves at a time.
REFERENCE_STEP = 4
#: The word list of the input (shared with the orchestrator, which generates the input and the totals).
WORDS = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lam", "mu")
#: Event time of the first input record: a fixed epoch, independent of the run's wall clock.
EVENT_T0_MS = 1_700_000_000_000


# ------------------------------------------------------------------------------------------------ the input
def redis_record(seed: int, key_index: int, j: int, per_key: int, batch_ms: int) -> dict[str, str]:
    """Fields of entry ``j`` (0-based) of stream key ``key_index``: id, word, event time, user.

    The event time follows the batch the entry lands in (``j // per_key``), up to 3 s out of order, and
    every 9th entry is 8-15 s old (late once the watermark has passed it, or not: it depends on the batch,
    which is the same in every run)."""
    k = seed * 7919 + key_index * 104729 + j * j
    base = EVENT_T0_MS + (j * batch_ms) // per_key
    back = 8000 + (k % 8) * 1000 if j % 9 == 4 else (k % 4) * 1000
    user = f"u{key_index}-{(j // (per_key * 3)) % 3}"  # each user busy for 3 batches, then quiet for 6
    return {"id": f"r{key_index}-{j}", "w": WORDS[k % len(WORDS)], "ts": str(max(0, base - back)), "u": user}


def file_lines(seed: int, i: int, lines_per_file: int, files_per_batch: int, batch_ms: int) -> list[str]:
    """Lines of input file ``i`` (0-based): ``<id> <word> <event ms> <user>``."""
    out = []
    for j in range(lines_per_file):
        k = seed * 31 + i * 17 + j * 5
        ts = EVENT_T0_MS + (i * batch_ms) // files_per_batch - (k % 3) * 1000
        out.append(f"f{i}-{j} {WORDS[k % len(WORDS)]} {ts} v{(i // 4) % 4}")
    return out


def file_name(i: int) -> str:
    """Object name of input file ``i``: listing order is file order."""
    return f"in-{i:07d}.txt"


def decode_entry(key: str, entry_id: str, fields: dict[str, str]) -> tuple[str, str, int, str]:  # noqa: ARG001
    return fields["id"], fields["w"], int(fields["ts"]), fields["u"]


def parse_line(line: str) -> tuple[str, str, int, str]:
    rid, word, ts, user = line.split(" ")
    return rid, word, int(ts), user


def format_dead_letter(d: Any) -> str:
    """A dead letter as one line of the ``dead`` output: ``[record, operator, error, batch ms]`` in JSON."""
    return json.dumps([d.record, d.operator, d.error, d.batchTime])


def format_event(e: tuple[str, str, int, str]) -> str:
    return f"{e[0]} {e[1]} {e[2]} {e[3]}"


def event_seconds(e: tuple[str, str, int, str]) -> float:
    return e[2] / 1000.0


def update_count(new: list[int], old: int | None) -> int:
    return sum(new) + (old or 0)


def positive(kv: tuple[Any, int]) -> bool:
    return kv[1] > 0


def decode_kafka(r: Any) -> tuple[str, tuple[int, int, str]]:
    """A record of the Kafka input: ``(key, (partition, offset, value))``."""
    return r.key.decode(), (r.partition, r.offset, r.value.decode())


def update_running(new: list[tuple[int, int, str]], old: tuple[int, list[tuple[int, str]]] | None
                   ) -> tuple[int, list[tuple[int, str]]]:
    """The Kafka branch's state of a key: ``(count, [(count, value) of this batch's records])``; the batch's
    records (all of a key's records are in one partition) count on in offset order."""
    count = old[0] if old else 0
    emitted = []
    for _p, _o, value in sorted(new):
        count += 1
        emitted.append((count, value))
    return count, emitted


def make_kafka_ranges(folder: str) -> Any:
    """The Kafka branch's second output (driver side, no Spark job): the batch's offset ranges as JSON,
    ``[[topic, partition, from, until], ...]``, in ``folder/<batch ms>``."""

    def save(t: Any, rdd: Any) -> None:
        ms = round(t.timestamp() * 1000)
        ranges = [[r.topic, r.partition, r.fromOffset, r.untilOffset] for r in rdd.offsetRanges()]
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{ms}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(ranges, f)
        os.replace(tmp, os.path.join(folder, str(ms)))

    return save


def running_records(kv: tuple[str, tuple[int, list[tuple[int, str]]]]) -> list[tuple[str, str]]:
    """The Kafka output's records of a key in this batch: ``(key, "<count> <input value>")``."""
    key, (_count, emitted) = kv
    return [(key, f"{c} {v}") for c, v in emitted]


# -------------------------------------------------------------------------------------------- the pipeline
#: Output names, in the order of the graph's output operations; the orchestrator compares all of them.
OUTPUTS = ("events", "counts", "window", "ewindow", "sessions", "stream", "table", "dead", "audit")
#: The columns of the ``table`` output (:func:`table_ddl`).
TABLE_COLUMNS = ("batch_ms", "rid", "word", "ts", "usr")


def output_locations(cfg: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Output name -> (``store``|``local``|``audit``, location) for the configuration ``cfg``."""
    base, local = cfg["base"], cfg["local"]
    return {
        "events": ("store", f"{base}/out/events"),
        "counts": ("local", os.path.join(local, "out", "counts")),
        "window": ("store", f"{base}/out/window"),
        "ewindow": ("local", os.path.join(local, "out", "ewindow")),
        "sessions": ("store", f"{base}/out/sessions"),
        "stream": ("redis-stream", cfg["sink_key"]),
        "table": ("postgres", cfg["table"]),
        "dead": ("store", f"{base}/out/dead"),
        "audit": ("audit", os.path.join(local, "out", "audit")),
    }


def kafka_ranges_folder(cfg: dict[str, Any]) -> str:
    """Where the Kafka branch writes each batch's input offset ranges (:func:`make_kafka_ranges`)."""
    return os.path.join(cfg["local"], "out", "kafka-ranges")


def table_ddl(table: str) -> str:
    """The ``table`` output's table (created by the orchestrator before the first driver starts)."""
    return (f"CREATE TABLE {table} (batch_ms bigint NOT NULL, rid text NOT NULL, word text NOT NULL, "
            "ts bigint NOT NULL, usr text NOT NULL)")


def event_fields(e: tuple[str, str, int, str]) -> dict[str, str]:
    """The fields of the ``stream`` output's entry for event ``e``."""
    return {"rid": e[0], "w": e[1], "ts": str(e[2]), "u": e[3]}


def with_batch_ms(t: Any, rdd: Any) -> Any:
    """The ``table`` output's rows of batch ``t``: ``(batch_ms, rid, word, ts, usr)``."""
    ms = round(t.timestamp() * 1000)
    return rdd.map(lambda e: (ms, e[0], e[1], e[2], e[3]))


def make_audit(audit_dir: str, fault_dir: str) -> Any:
    """The audit output's function (driver side): see the module docstring."""

    def audit(t: Any, rdd: Any) -> None:  # noqa: ARG001 - the RDD is not read: no Spark job
        ms = round(t.timestamp() * 1000)
        marker = os.path.join(fault_dir, f"fail-{ms}")
        if os.path.exists(marker):
            try:
                fd = os.open(marker + ".done", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, f"{os.getpid()} {int(time.time() * 1000)}\n".encode())
                os.close(fd)
                raise RuntimeError(f"chaos: injected failure of the audit function in batch {ms} (first attempt)")
        os.makedirs(audit_dir, exist_ok=True)
        tmp = os.path.join(audit_dir, f".{ms}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            f.write(f"{ms}\n")
        os.replace(tmp, os.path.join(audit_dir, str(ms)))

    return audit


def build(sc: Any, cfg: dict[str, Any], clock: Any = None) -> Any:
    """The chaos pipeline (module docstring) on ``sc``; ``clock`` None is the system clock."""
    from dstreams import StreamingContext

    batch_s = cfg["batch_ms"] / 1000.0
    ssc = StreamingContext(sc, batch_s, clock=clock)
    ssc.checkpoint(f"{cfg['base']}/ckpt")
    entries = ssc.redisStream(cfg["keys"], url=cfg["redis_url"], decoder=decode_entry,
                              maxRatePerPartition=cfg["per_key"] / batch_s)
    lines = ssc.textFileStream(f"{cfg['base']}/in/", maxFilesPerBatch=cfg["files_per_batch"]).map(
        parse_line, onError="deadLetter")  # a poison line (the poison-record fault) goes to the dead letters
    events = entries.union(lines)
    where = output_locations(cfg)
    events.map(format_event).saveToStore(where["events"][1], format="text")
    words = events.map(lambda e: (e[1], 1))
    counts = words.updateStateByKey(update_count, numPartitions=2).checkpoint(cfg["checkpoint_s"])
    counts.saveAsTextFiles(where["counts"][1])
    window = words.reduceByKeyAndWindow(operator.add, operator.sub, cfg["window_s"], batch_s, numPartitions=2,
                                        filterFunc=positive).checkpoint(cfg["checkpoint_s"])
    window.saveToStore(where["window"][1], format="json")
    timed = events.withEventTime(event_seconds, allowedLateness=cfg["lateness_s"])
    ewindow = timed.map(lambda e: (e[1], 1)).reduceByKeyAndEventWindow(
        operator.add, cfg["ewindow_s"], cfg["eslide_s"], invFunc=operator.sub, emit="final", numPartitions=2)
    ewindow.checkpoint(cfg["checkpoint_s"]).saveAsTextFiles(where["ewindow"][1])
    sessions = timed.map(lambda e: (e[3], 1)).sessionWindow(cfg["gap_s"], aggregate=len, numPartitions=2)
    sessions.checkpoint(cfg["checkpoint_s"]).saveToStore(where["sessions"][1], format="json")
    events.map(event_fields).saveToRedisStream(cfg["redis_url"], cfg["sink_key"], chunkSize=cfg["sink_chunk"])
    events.transform(with_batch_ms).saveToPostgres(cfg["postgres_dsn"], cfg["table"], columns=list(TABLE_COLUMNS))
    ssc.deadLetters().map(format_dead_letter).saveToStore(where["dead"][1], format="text")
    kafka = cfg.get("kafka")
    if kafka:
        params = {"bootstrap.servers": kafka["bootstrap"]}
        records = ssc.kafkaStream([kafka["in_topic"]], params, startingOffsets="earliest", decoder=decode_kafka)
        running = records.updateStateByKey(update_running, numPartitions=2).checkpoint(cfg["checkpoint_s"])
        running.flatMap(running_records).saveToKafka(kafka["out_topic"], params, ledgerTopic=kafka["ledger_topic"])
        records.foreachRDD(make_kafka_ranges(kafka_ranges_folder(cfg)))
    events.foreachRDD(make_audit(where["audit"][1], os.path.join(cfg["local"], "faults")))
    return ssc


# ------------------------------------------------------------------------------------------------ the driver
def _wait_for_file(path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {path}")
        time.sleep(0.05)


def spark_conf(cfg: dict[str, Any]) -> dict[str, str]:
    """The SparkContext's settings: :data:`BASE_CONF`, scratch space in the run's folder (killed executors
    leave files behind)."""
    local_dir = os.path.join(cfg["local"], "spark-local")
    os.makedirs(local_dir, exist_ok=True)
    tmp = f"-Djava.io.tmpdir={local_dir}"
    return {**BASE_CONF, "spark.local.dir": local_dir, "spark.driver.extraJavaOptions": tmp,
            "spark.executor.extraJavaOptions": tmp}


def _die_with_marker(marker: str, point: str) -> None:
    """The ``kafka-kill`` fault: once the orchestrator has written ``<marker>`` and then ``<marker>.set``, the first
    task to reach ``point`` removes the marker and SIGKILLs its Python worker (:mod:`dstreams.faults`); this
    driver then SIGKILLs itself at once, the partition's transaction open (``kafka-before-commit``) or just committed
    (``kafka-after-commit``), the rest of the batch wherever it is."""

    def watch() -> None:
        while not os.path.exists(marker + ".set"):
            time.sleep(0.02)
        while os.path.exists(marker):
            time.sleep(0.005)
        if not os.path.exists(marker + ".set"):  # withdrawn by the orchestrator (it kills the driver itself)
            return
        print(f"dstreams fault injection: SIGKILL at {point} (a task of this driver reached it)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="chaos-die-with-marker").start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="the run's configuration (JSON, written by benchmarks/chaos.py)")
    p.add_argument("--mode", choices=("run", "bootstrap", "reference"), default="run")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    with open(args.config) as f:
        cfg = json.load(f)
    from dstreams import faults

    # The orchestrator's fault points for this driver: its own, and its tasks' (carried with the batches' jobs to
    # the executors, local-cluster's too).
    plan = faults.FaultPlan.from_mapping(os.environ)
    faults.install(plan)
    marker = os.environ.get("CHAOS_DIE_WITH")
    if marker:
        _die_with_marker(marker, plan.tasks[0].point if plan.tasks else "")

    from dstreams import ManualClock, StreamingContext
    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context(args.master, "dstreams-chaos", spark_conf(cfg))
    print(f"APP {sc.applicationId}", flush=True)
    print(f"SC {int(time.time() * 1000)}", flush=True)
    ckpt = f"{cfg['base']}/ckpt"
    clock = None if args.mode == "run" else ManualClock(cfg["zero_ms"])
    if args.mode == "run":
        ssc = StreamingContext.getOrCreate(ckpt, lambda: _no_checkpoint(ckpt))
    else:
        ssc = StreamingContext.getOrCreate(ckpt, lambda: build(sc, cfg, clock))
    from catchup_app import BatchLog  # this script's folder: one JSON line per completed batch

    batches = BatchLog(cfg["metrics"])
    ssc.addStreamingListener(batches)
    ssc.start()
    print(f"STARTED {int(time.time() * 1000)}", flush=True)
    rc = 0
    try:
        if clock is None:
            ssc.awaitTermination()  # returns after a signal's graceful stop; raises a batch's error
        else:
            _wait_for_file(os.path.join(cfg["local"], "go"), 600)
            last = 1 if args.mode == "bootstrap" else int(cfg["batches"])
            k = 0
            while k < last:
                # A few batches at a time: generated ahead, run in order (as a backlog after a restart is); the
                # batches' contents and results do not depend on it (module docstring).
                k = min(last, k + REFERENCE_STEP)
                t = cfg["zero_ms"] + k * cfg["batch_ms"]
                clock.set_time(t)
                ssc.awaitBatch(t, 600)
                print(f"BATCH {k}/{last}", flush=True)
            ssc.stop(stopSparkContext=True, stopGraceFully=True)
    except BaseException as e:  # the error that stopped the stream: the supervisor restarts the driver
        print(f"DRIVER FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
        rc = 1
        ssc.stop(stopSparkContext=True, stopGraceFully=False)
    finally:
        batches.close()
    print(f"EXIT {rc}", flush=True)
    return rc


def _no_checkpoint(path: str) -> Any:
    raise RuntimeError(f"no checkpoint at {path}: a chaos run starts with --mode bootstrap")


if __name__ == "__main__":
    sys.exit(main())
