"""State at scale (issue 23): per-batch cost of ``updateStateByKey`` against the number of keys of state.

Run from the repository root::

    python -m benchmarks state --quick     # 10K and 1M keys, dstreams and pyspark.streaming, 5 + 10 batches
    python -m benchmarks state             # 10K, 1M, 10M, 30M keys, every engine, 5 + 20 batches
    python -m benchmarks state --sizes 10000000 --engines dstreams pyspark.streaming --merge

(or ``python -m benchmarks.state ...``). Contract:

* **Workload**: 1 s batches (``--interval``); a state of ``keys`` keys (``0 .. keys - 1``, each with the
  count 0) given as ``updateStateByKey``'s initial state; each batch ``--updates`` records ``(key, 1)``
  (100,000 by default, made in the executors in 2 partitions); the update function adds the batch's values to
  the key's count (:func:`add_counts`), one ``count()`` of the state per batch as the output. Two key
  distributions: ``hot`` (every update on one of :data:`HOT_KEYS` keys: the issue's 1,000-key workload) and
  ``uniform`` (keys drawn uniformly from the whole state). The state keeps ``keys`` keys throughout.
* **Engines**, each (engine, keys, distribution) in its own child process with its own SparkContext from
  ``dstreams.spark.sparkconf.create_spark_context("local[2]", ...)`` (the same tuned conf for every engine, the
  JVM's heap set by ``--driver-memory``) and a timeout:

  - ``dstreams``: ``StreamingContext.generatorStream`` with :func:`update_records`,
    ``updateStateByKey(add_counts, initialRDD=sc.range(keys).map(...))``, a checkpoint folder in a temporary
    folder, the state checkpointed every ``--checkpoint-interval`` seconds (10). Processing times from
    ``ssc.batchInfos()``; checkpoint bytes from the manifests (``checkpoints/<stream>/<time>/MANIFEST.json``,
    polled while the stream runs, since old checkpoints are deleted); the seconds of each checkpoint write
    from the checkpointer's ``recent_writes`` (written in the background: not part of a batch's time).
  - ``pyspark.streaming``: ``queueStream`` of lazy RDDs whose partitions run the same
    :func:`update_records` in the executors (as ``benchmarks.engines.run_pyspark``), the same
    ``updateStateByKey(add_counts, initialRDD=...)``, ``ssc.checkpoint`` in a temporary folder, the state
    stream's checkpoint interval the same. Processing times from a ``StreamingListener``. Checkpoint bytes:
    the size of each ``rdd-N`` folder Spark writes (polled); Spark writes a checkpoint inside the batch that
    makes it, so the seconds per checkpoint are estimated as the processing time of the batches that wrote
    one minus the median of the others (``checkpoint_s_estimated``).
  - ``ss-rocksdb``: Structured Streaming, ``groupBy("key").transformWithState`` (a ``ValueState`` count per
    key, ``initialState`` = the same ``keys`` keys) with the RocksDB provider and changelog checkpointing,
    on the ``rate-micro-batch`` source (``--updates`` rows a batch, key = a hash of the row number, hot or
    uniform as above), ``noop`` sink, ``processingTime`` trigger of one interval. Needs ``protobuf`` and
    ``pandas`` next to ``pyarrow`` (``transformWithState``'s Python runner), which the project does not depend
    on: ``--ss-path DIR`` puts a folder where they are installed first on that child's ``PYTHONPATH`` (the
    Python workers inherit it); when they cannot be imported the case is recorded as not run, with that
    reason. Processing time = the progress' ``triggerExecution``; a commit of the state store is a checkpoint
    every batch: bytes = growth of the query's ``state`` folder per batch, seconds = the state operator's
    ``commitTimeMs``.
* **Measure**: ``--warmup`` batches (5) then ``--batches`` batches (20; ``--quick``: 10); the median and p95
  processing time of the measured batches; peak RSS (``benchmarks.memory.PeakMemory``: the Python driver, the
  JVM, which is driver and executor in ``local[2]``, and the Python workers) over the whole run, initial
  load included, and over the measured batches; the time from ``start()`` to the first batch's end.
* **Failures never end the run**: a child that runs past its timeout is killed, one that dies (out of
  memory: the kernel's OOM killer, a Java ``OutOfMemoryError``, a Python ``MemoryError``) or raises is
  recorded as failed with the reason (from its stderr) and how far it got (the child writes its progress to
  a file after every poll). A child stops at a deadline (``--slack`` x the batches' time after its first
  batch, plus a minute): an engine whose batches cannot keep up is recorded as ``behind`` with the batches
  it completed (median over those after the warm-up, or after the first when fewer). Before a size is
  started, its memory is estimated from the engine's smaller sizes in the same run (a line through their
  peaks) and the size is skipped, with the estimate, when it exceeds 85 % of the machine's available memory.
* Writes ``benchmarks/results/state.json`` (``--out``; ``--merge`` keeps the cases of an existing file that
  this run did not repeat) and prints the table. The 1-minute load average is recorded at the start and
  end of the run and of every case (the machine is shared: quote medians, compare within one run).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
OUT = RESULTS / "state.json"
MARKER = "STATE_BENCH_RESULT "

SIZES = [10_000, 1_000_000, 10_000_000, 30_000_000]
QUICK_SIZES = [10_000, 1_000_000]
DISTRIBUTIONS = ["hot", "uniform"]
ENGINES = ["dstreams", "dstreams-rdd", "dstreams-store", "dstreams-auto", "pyspark.streaming", "ss-rocksdb"]
#: The engines running updateStateByKey(..., updateIdleKeys=False) with the count() of changes() as output, by the
#: spark.dstreams.state.store they set.
TOUCHED_ENGINES = {"dstreams-rdd": "rdd", "dstreams-store": "executor", "dstreams-auto": "auto"}
QUICK_ENGINES = ["dstreams", "dstreams-store", "pyspark.streaming"]
#: The hot set: every update of the ``hot`` distribution is on one of these many keys (the issue's workload).
HOT_KEYS = 1000
UPDATES = 100_000
PARTITIONS = 2
SEED = 23
#: A size is skipped when its memory estimate exceeds this share of the machine's available memory.
MEMORY_SHARE = 0.85
#: Estimated peak RSS per key of state (bytes, all processes) when no smaller size of the engine ran yet.
DEFAULT_BYTES_PER_KEY = {"dstreams": 600, "dstreams-rdd": 600, "dstreams-store": 300, "dstreams-auto": 600,
                         "pyspark.streaming": 600, "ss-rocksdb": 400}
ENGINE_LABELS = {
    "dstreams": "dstreams: generatorStream + updateStateByKey(add_counts, initialRDD=...), RDD state",
    "dstreams-rdd": "dstreams: as dstreams-store, with spark.dstreams.state.store=rdd (the RDD state)",
    "dstreams-store": "dstreams: generatorStream + updateStateByKey(add_counts, initialRDD=..., updateIdleKeys=False), "
                      "spark.dstreams.state.store=executor; output: count() of changes() (the keys each batch changed)",
    "dstreams-auto": "dstreams: as dstreams-store, with spark.dstreams.state.store=auto (the default: RDD state, "
                     "moved into the store by size)",
    "pyspark.streaming": "pyspark.streaming: queueStream of lazy RDDs + updateStateByKey(add_counts, initialRDD=...)",
    "ss-rocksdb": "Structured Streaming: rate-micro-batch + groupBy(key).transformWithState (ValueState, "
                  "initialState), RocksDB provider, changelog checkpointing",
}


# ------------------------------------------------------------------------------------------ the workload
def update_records(keys: int, distribution: str) -> Callable[[int, int, int, int], Iterator[tuple[int, int]]]:
    """A ``generatorStream`` record function: ``n`` records ``(key, 1)`` of one partition of one batch.

    ``hot``: keys uniform over ``0 .. min(keys, HOT_KEYS) - 1``; ``uniform``: over ``0 .. keys - 1``. Seeded by
    (seed, batch time, partition): a batch is the same when it is recomputed."""
    span = min(keys, HOT_KEYS) if distribution == "hot" else keys

    def make(seed: int, time_ms: int, partition: int, n: int) -> Iterator[tuple[int, int]]:
        rnd = random.Random(seed * 1_000_003 + time_ms * 131 + partition).random
        return ((int(rnd() * span), 1) for _ in range(n))

    return make


def add_counts(new_values: list[int], last: int | None) -> int:
    """``updateStateByKey``'s function: the key's count plus the batch's values."""
    return (0 if last is None else last) + sum(new_values)


def initial_pair(key: int) -> tuple[int, int]:
    return (key, 0)


def _initial_rdd(sc: Any, keys: int) -> Any:
    return sc.range(0, keys, numSlices=PARTITIONS).map(initial_pair)


# ------------------------------------------------------------------------------------------ measuring
def _p95(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


class Progress:
    """What a child has measured so far, written to a file after every poll (the parent reads it when the child
    dies or is killed: how far it got)."""

    def __init__(self, path: str | None, case: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {**case, "phase": "starting", "samples": []}

    def update(self, **kw: Any) -> None:
        self.doc.update(kw)
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f)
            os.replace(tmp, self.path)


def _loop(case: dict[str, Any], progress: Progress, memory: Any, samples: Callable[[], list[dict[str, Any]]],
          poll: Callable[[], None], first_batch_s: float) -> dict[str, Any]:
    """Poll until the warm-up and the measured batches completed, or the deadline (module contract)."""
    interval = case["interval_s"]
    total = case["warmup"] + case["batches"]
    started = time.monotonic()
    deadline = started + first_batch_s
    first_done: float | None = None
    reset_at_measure = False
    rows: list[dict[str, Any]] = []
    stop_reason = "deadline before the first batch completed"
    while time.monotonic() < deadline:
        time.sleep(0.25)
        poll()
        rows = samples()
        if rows and first_done is None:
            first_done = time.monotonic()
            deadline = first_done + (total - 1) * interval * case["slack"] + 60.0
            progress.update(phase="running", first_batch_end_s=round(first_done - started, 2))
            stop_reason = "deadline: the batches did not keep up"
        if len(rows) >= case["warmup"] and not reset_at_measure:
            memory.reset()  # the steady-state peak: over the measured batches only
            reset_at_measure = True
        progress.update(samples=rows, memory_so_far=memory.peaks())
        if len(rows) >= total:
            stop_reason = "done"
            break
    poll()
    rows = samples()[:total]
    return {"rows": rows, "stop_reason": stop_reason, "first_batch_end_s":
            None if first_done is None else round(first_done - started, 2)}


def _summarize(case: dict[str, Any], got: dict[str, Any], peaks_all: dict[str, Any],
               peaks_steady: dict[str, Any], ckpt: dict[str, Any]) -> dict[str, Any]:
    rows = got["rows"]
    interval_ms = case["interval_s"] * 1000.0
    warm = case["warmup"]
    if len(rows) > warm + 2:
        measured, note = rows[warm:], None
    elif len(rows) > 1:
        measured, note = rows[1:], f"only {len(rows)} batches completed: measured from the second one"
    else:
        measured, note = rows, (f"only {len(rows)} batch completed" if rows else "no batch completed")
    proc = [r["processing_ms"] / 1000.0 for r in measured]
    sched = [r["scheduling_ms"] / 1000.0 for r in measured]
    med = _median(proc)
    holds = (got["stop_reason"] == "done" and med is not None and med * 1000.0 <= interval_ms
             and sched[-1] * 1000.0 < interval_ms)
    status = "holds" if holds else ("behind" if rows else "failed")
    return {"status": status, "stop_reason": got["stop_reason"], "note": note,
            "batches_completed": len(rows), "batches_measured": len(measured),
            "median_processing_s": None if med is None else round(med, 3),
            "p95_processing_s": None if not proc else round(_p95(proc), 3),
            "last_scheduling_delay_s": None if not sched else round(sched[-1], 3),
            "first_batch_end_s": got["first_batch_end_s"], "memory_peak_mb": peaks_all,
            "memory_steady_peak_mb": peaks_steady, "checkpoints": ckpt, "samples": rows}


# ------------------------------------------------------------------------------------------ dstreams
def run_dstreams(sc: Any, case: dict[str, Any], progress: Progress, memory: Any) -> dict[str, Any]:
    from dstreams import StreamingContext

    keys, interval = case["keys"], case["interval_s"]
    tmp = tempfile.mkdtemp(prefix="bench-state-dstreams-")
    mode = TOUCHED_ENGINES.get(case["engine"])
    store = mode is not None  # updateIdleKeys=False, output: count() of changes()
    if store:  # read when the operator is defined; the stores' folder is removed with the checkpoints
        os.environ["DSTREAMS_STATE_STORE"] = mode
        os.environ["DSTREAMS_STATE_LOCAL_DIR"] = os.path.join(tmp, "local-state")
    ssc = StreamingContext(sc, interval)
    ssc.checkpoint(tmp)
    updates = ssc.generatorStream(case["updates"] // PARTITIONS, PARTITIONS, seed=SEED,
                                  recordFunc=update_records(keys, case["distribution"]))
    counts: list[int] = []
    if store:
        state = updates.updateStateByKey(add_counts, numPartitions=PARTITIONS, initialRDD=_initial_rdd(sc, keys),
                                         updateIdleKeys=False)
        state.checkpoint(case["checkpoint_interval_s"])
        state.changes().foreachRDD(lambda rdd: counts.append(rdd.count()))
    else:
        state = updates.updateStateByKey(add_counts, numPartitions=PARTITIONS, initialRDD=_initial_rdd(sc, keys))
        state.checkpoint(case["checkpoint_interval_s"])
        state.foreachRDD(lambda rdd: counts.append(rdd.count()))
    manifests: dict[str, dict[str, Any]] = {}

    def poll() -> None:
        for path in glob.glob(os.path.join(tmp, "checkpoints", "*", "*", "MANIFEST.json")):
            if path in manifests:
                continue
            try:
                m = json.loads(Path(path).read_text())
            except (OSError, ValueError):
                continue
            manifests[path] = {"time_ms": m["time_ms"], "bytes": sum(p["bytes"] for p in m["parts"]),
                               "records": sum(p["records"] for p in m["parts"])}

    def samples() -> list[dict[str, Any]]:
        infos = sorted((i for i in ssc.batchInfos() if i.processing_end_time_ms is not None),
                       key=lambda i: i.batch_time_ms)
        return [{"batch_time_ms": i.batch_time_ms, "scheduling_ms": float(i.scheduling_delay_ms),
                 "processing_ms": float(i.processing_delay_ms)} for i in infos]

    t0 = time.monotonic()
    progress.update(phase="start()")
    ssc.start()
    start_s = time.monotonic() - t0
    progress.update(phase="started", start_s=round(start_s, 2))
    try:
        got = _loop(case, progress, memory, samples, poll, case["first_batch_s"])
        steady = memory.peaks()
        writes = list(getattr(getattr(ssc, "_checkpointer", None), "recent_writes", []) or [])
        # dstreams-auto: the batch the state moved into the executor store at (ms after the first batch), if it did
        moved = [s for n in ssc._graph.nodes
                 if (s := getattr(getattr(n, "backend", None), "switched_at", None)) is not None]
        moved_after_ms = (moved[0] - ssc.startTime.ms) if moved and ssc.startTime is not None else None
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
        shutil.rmtree(tmp, ignore_errors=True)
    by_time = {m["time_ms"]: m for m in manifests.values()}
    seconds = [w.seconds for w in writes if w.error is None]
    ordered = sorted(by_time.values(), key=lambda m: m["time_ms"])
    ckpt = {"written": len(by_time), "bytes": [m["bytes"] for m in ordered],
            "records": [m["records"] for m in ordered],
            "median_mb": None if not by_time else round(_median([m["bytes"] for m in by_time.values()]) / 2**20, 3),
            "seconds": [round(s, 2) for s in seconds], "median_s": None if not seconds else round(_median(seconds), 2),
            "errors": [w.error for w in writes if w.error is not None][:3],
            "how": "manifests' part bytes; write seconds from the checkpointer (asynchronous, after the batch)"}
    return {**_summarize(case, got, memory.peaks_all, steady, ckpt), "start_s": round(start_s, 2),
            "moved_to_store_after_ms": moved_after_ms,
            ("keys_changed_last_batch" if store else "state_keys_last_batch"): counts[-1] if counts else None}


# ------------------------------------------------------------------------------------------ pyspark.streaming
def _lazy_batch(sc: Any, keys: int, distribution: str, per_part: int, time_ms: int) -> Any:
    make = update_records(keys, distribution)

    def gen(partition: int, _: Any) -> Iterator[tuple[int, int]]:
        return make(SEED, time_ms, partition, per_part)

    return sc.parallelize(range(PARTITIONS), PARTITIONS).mapPartitionsWithIndex(gen)


def run_pyspark(sc: Any, case: dict[str, Any], progress: Progress, memory: Any) -> dict[str, Any]:
    from pyspark.streaming import StreamingContext, StreamingListener

    from .engines import _num

    keys, interval = case["keys"], case["interval_s"]
    interval_ms = round(interval * 1000)
    total = case["warmup"] + case["batches"]
    count = total + 20  # spare: an exhausted queue would hand out empty batches (a false pass)
    rdds = [_lazy_batch(sc, keys, case["distribution"], case["updates"] // PARTITIONS, (i + 1) * interval_ms)
            for i in range(count)]
    tmp = tempfile.mkdtemp(prefix="bench-state-pyspark-")
    ssc = StreamingContext(sc, interval)
    ssc.checkpoint(tmp)
    got_rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Collect(StreamingListener):
        def onBatchCompleted(self, batchCompleted: Any) -> None:
            info = batchCompleted.batchInfo()
            start = _num(info.processingStartTime())
            end = _num(info.processingEndTime())
            with lock:
                got_rows.append({"batch_time_ms": info.batchTime().milliseconds(),
                                 "scheduling_ms": float(start - info.submissionTime()),
                                 "processing_ms": float(end - start), "start_epoch_ms": start,
                                 "end_epoch_ms": end})

    ssc.addStreamingListener(Collect())
    updates = ssc.queueStream(rdds, oneAtATime=True)
    state = updates.updateStateByKey(add_counts, numPartitions=PARTITIONS, initialRDD=_initial_rdd(sc, keys))
    state.checkpoint(case["checkpoint_interval_s"])
    counts: list[int] = []
    state.foreachRDD(lambda rdd: counts.append(rdd.count()))
    rdd_dirs: dict[str, dict[str, Any]] = {}

    def poll() -> None:
        for d in glob.glob(os.path.join(tmp, "*", "rdd-*")):
            parts = glob.glob(os.path.join(d, "part-*"))
            if not parts:
                continue
            size = _dir_bytes(d)
            try:
                mtime = max(os.path.getmtime(p) for p in parts) * 1000.0
            except OSError:
                continue
            seen = rdd_dirs.setdefault(d, {"bytes": 0, "last_part_epoch_ms": mtime})
            seen["bytes"] = max(seen["bytes"], size)
            seen["last_part_epoch_ms"] = max(seen["last_part_epoch_ms"], mtime)

    def samples() -> list[dict[str, Any]]:
        with lock:
            return sorted(got_rows, key=lambda r: r["batch_time_ms"])[:count]

    t0 = time.monotonic()
    progress.update(phase="start()")
    ssc.start()
    start_s = time.monotonic() - t0
    progress.update(phase="started", start_s=round(start_s, 2))
    try:
        got = _loop(case, progress, memory, samples, poll, case["first_batch_s"])
        steady = memory.peaks()
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    # The batches that wrote a checkpoint: a part file of an rdd-N folder was written while they ran.
    rows = got["rows"]
    ckpt_batches = set()
    for seen in rdd_dirs.values():
        for r in rows:
            if r["start_epoch_ms"] - 50 <= seen["last_part_epoch_ms"] <= r["end_epoch_ms"] + 50:
                ckpt_batches.add(r["batch_time_ms"])
    measured = rows[case["warmup"]:] if len(rows) > case["warmup"] + 2 else rows[1:]
    with_ck = [r["processing_ms"] / 1000.0 for r in measured if r["batch_time_ms"] in ckpt_batches]
    without = [r["processing_ms"] / 1000.0 for r in measured if r["batch_time_ms"] not in ckpt_batches]
    for r in rows:
        r["wrote_checkpoint"] = r["batch_time_ms"] in ckpt_batches
    est = (round(_median(with_ck) - _median(without), 2) if with_ck and without else None)
    sizes = [s["bytes"] for s in sorted(rdd_dirs.values(), key=lambda s: s["last_part_epoch_ms"])]
    ckpt = {"written": len(rdd_dirs), "bytes": sizes,
            "median_mb": None if not sizes else round(_median(sizes) / 2**20, 3),
            "median_s": est, "checkpoint_s_estimated": True,
            "how": "size of each rdd-N folder; seconds = median processing time of the measured batches that wrote "
                   "a checkpoint minus that of the others (Spark writes it inside the batch)"}
    shutil.rmtree(tmp, ignore_errors=True)
    return {**_summarize(case, got, memory.peaks_all, steady, ckpt), "start_s": round(start_s, 2),
            "state_keys_last_batch": counts[-1] if counts else None}


# ------------------------------------------------------------------------------------------ Structured Streaming
def _ss_missing() -> str | None:
    missing = []
    for mod in ("pandas", "google.protobuf", "pyarrow"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod.replace("google.", ""))
    if missing:
        return (f"transformWithState's Python runner needs {', '.join(missing)}, not installed in this "
                "environment")
    return None


def run_ss(sc: Any, case: dict[str, Any], progress: Progress, memory: Any) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812 - the usual alias
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    from .engines import _iso_ms, _progress_dicts

    keys, interval = case["keys"], case["interval_s"]
    interval_ms = round(interval * 1000)
    spark = SparkSession(sc)
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    count_schema = StructType([StructField("n", LongType())])

    class CountProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", count_schema)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            n = self.count.get()[0] if self.count.exists() else 0
            for r in rows:
                n += r["v"]
            self.count.update((n,))
            return iter([])

        def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
            self.count.update((initialState["n"],))

        def close(self) -> None:
            pass

    span = min(keys, HOT_KEYS) if case["distribution"] == "hot" else keys
    src = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", case["updates"])
           .option("numPartitions", PARTITIONS).option("advanceMillisPerBatch", interval_ms).load())
    updates = src.select(F.pmod(F.xxhash64("value", F.lit(SEED)), F.lit(span)).alias("key"), F.lit(1).cast("long")
                         .alias("v"))
    initial = spark.range(0, keys, numPartitions=PARTITIONS).select(F.col("id").alias("key"),
                                                                     F.lit(0).cast("long").alias("n"))
    out = updates.groupBy("key").transformWithState(CountProcessor(), "key long, n long", "Update", "None",
                                                    initialState=initial.groupBy("key"))
    tmp = tempfile.mkdtemp(prefix="bench-state-ss-")
    state_dir = os.path.join(tmp, "state")
    sizes: dict[int, int] = {}
    query = (out.writeStream.format("noop").outputMode("update").option("checkpointLocation", tmp)
             .trigger(processingTime=f"{interval_ms} milliseconds").start())
    progress.update(phase="started")

    def poll() -> None:
        n = len(query.recentProgress)
        sizes[n] = _dir_bytes(state_dir)

    def samples() -> list[dict[str, Any]]:
        progress_ = sorted(_progress_dicts(query), key=lambda p: p["batchId"])
        if not progress_:
            return []
        starts = [_iso_ms(p["timestamp"]) for p in progress_]
        rows = []
        for k, p in enumerate(progress_):
            slot = starts[0] + k * interval_ms
            ops = p.get("stateOperators", [])
            rows.append({"batch_id": p["batchId"], "scheduling_ms": max(0.0, starts[k] - slot),
                         "processing_ms": float(p["durationMs"].get("triggerExecution", 0)),
                         "commit_ms": sum(op.get("commitTimeMs", 0) or 0 for op in ops),
                         "state_rows": [op.get("numRowsTotal") for op in ops],
                         "state_memory_bytes": [op.get("memoryUsedBytes") for op in ops]})
        return rows

    try:
        got = _loop(case, progress, memory, samples, poll, case["first_batch_s"])
        steady = memory.peaks()
    finally:
        query.stop()
    growth = sorted(sizes.items())
    per_batch = [b - a for (_, a), (_, b) in zip(growth, growth[1:], strict=False) if b > a]
    commits = [r["commit_ms"] / 1000.0 for r in got["rows"][case["warmup"]:]]
    ckpt = {"written": len(got["rows"]), "bytes": per_batch,
            "state_folder_bytes_end": growth[-1][1] if growth else None,
            "median_mb": None if not per_batch else round(_median(per_batch) / 2**20, 3),
            "median_s": None if not commits else round(_median(commits), 3),
            "how": "every batch commits the state store: bytes = growth of the state folder between polls, seconds = "
                   "the state operator's commitTimeMs"}
    shutil.rmtree(tmp, ignore_errors=True)
    return {**_summarize(case, got, memory.peaks_all, steady, ckpt), "start_s": None}


RUNNERS = {"dstreams": run_dstreams, "dstreams-rdd": run_dstreams, "dstreams-store": run_dstreams,
           "dstreams-auto": run_dstreams, "pyspark.streaming": run_pyspark, "ss-rocksdb": run_ss}


# ------------------------------------------------------------------------------------------ the child
class RunPeaks:
    """A :class:`benchmarks.memory.PeakMemory` whose :meth:`reset` starts the steady-state peak (``peaks()``)
    while ``peaks_all`` keeps the whole run's (initial load included)."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.whole: dict[str, float] = {}

    def reset(self) -> None:
        for k, v in self.memory.peaks().items():
            self.whole[k] = max(self.whole.get(k, 0.0), v or 0.0)
        self.memory.reset()

    def peaks(self) -> dict[str, Any]:
        return self.memory.peaks()

    @property
    def peaks_all(self) -> dict[str, Any]:
        now = self.memory.peaks()
        return {k: round(max(self.whole.get(k, 0.0), now.get(k) or 0.0), 1) for k in now}

    def stop(self) -> None:
        self.memory.stop()


def child(case: dict[str, Any], progress_path: str | None) -> int:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dstreams.spark.sparkconf import create_spark_context

    from .memory import PeakMemory

    progress = Progress(progress_path, case)
    if case["engine"] == "ss-rocksdb":
        missing = _ss_missing()
        if missing:
            print(MARKER + json.dumps({**case, "status": "not run", "reason": missing}), flush=True)
            return 0
    conf = {"spark.driver.memory": case["driver_memory"], "spark.ui.enabled": "false"}
    sc = create_spark_context("local[2]", f"bench-state-{case['engine']}-{case['keys']}-{case['distribution']}",
                              conf)
    sc.setLogLevel("ERROR")
    memory = RunPeaks(PeakMemory(getattr(getattr(sc._gateway, "proc", None), "pid", None)).start())
    try:
        doc = {**case, **RUNNERS[case["engine"]](sc, case, progress, memory)}
    finally:
        memory.stop()
        sc.stop()
    doc["load_average_end"] = list(os.getloadavg())
    print(MARKER + json.dumps(doc), flush=True)
    return 0


# ------------------------------------------------------------------------------------------ the parent
def _available_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


def _total_peak(result: dict[str, Any]) -> float | None:
    peaks = result.get("memory_peak_mb") or {}
    vals = [v for v in peaks.values() if v is not None]
    return sum(vals) if vals else None


def estimate_mb(engine: str, keys: int, done: list[dict[str, Any]]) -> tuple[float, str]:
    """Peak RSS (MiB, every process) expected for ``engine`` at ``keys`` keys: a line through the two largest
    sizes of the engine measured so far (either distribution, the larger peak), or one size and the default
    slope, or the default bytes per key."""
    pts: dict[int, float] = {}
    for r in done:
        peak = _total_peak(r)
        if r.get("engine") == engine and peak is not None:
            pts[r["keys"]] = max(pts.get(r["keys"], 0.0), peak)
    default = DEFAULT_BYTES_PER_KEY.get(engine, 600) / 2**20
    if len(pts) >= 2:
        (k1, m1), (k2, m2) = sorted(pts.items())[-2:]
        slope = max((m2 - m1) / (k2 - k1), default / 4)
        return m2 + slope * (keys - k2), f"line through the peaks at {k1:,} and {k2:,} keys"
    if pts:
        (k1, m1), = pts.items()
        return m1 + default * (keys - k1), f"peak at {k1:,} keys + {DEFAULT_BYTES_PER_KEY.get(engine, 600)} B/key"
    return 1000.0 + default * keys, f"1 GB + {DEFAULT_BYTES_PER_KEY.get(engine, 600)} B/key"


def _reason_from_log(log_path: str) -> str | None:
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    for needle, reason in (("java.lang.OutOfMemoryError", "JVM out of memory (java.lang.OutOfMemoryError)"),
                           ("MemoryError", "Python out of memory (MemoryError)"),
                           ("Killed", "killed (out of memory?)")):
        if needle in text:
            return reason
    lines = [ln for ln in text.splitlines() if "Error" in ln or "Exception" in ln]
    return lines[-1][:400] if lines else None


def _timeout_for(case: dict[str, Any]) -> float:
    total = case["warmup"] + case["batches"]
    return case["first_batch_s"] + total * case["interval_s"] * case["slack"] + 180.0


def run_case(case: dict[str, Any], log_dir: str, extra_path: str | None = None) -> dict[str, Any]:
    name = f"{case['engine']}-{case['keys']}-{case['distribution']}"
    progress_path = os.path.join(log_dir, name + ".progress.json")
    log_path = os.path.join(log_dir, name + ".log")
    cmd = [sys.executable, "-m", "benchmarks.state", "--child", json.dumps(case), progress_path]
    timeout = _timeout_for(case)
    t0 = time.monotonic()
    load = list(os.getloadavg())
    failed: str | None = None
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT.parent, stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True, env=env)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The child's whole process group: its JVM and Python workers too.
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
            failed = f"timed out after {timeout:.0f} s"
    wall = round(time.monotonic() - t0, 1)
    for line in (out or "").splitlines():
        if line.startswith(MARKER):
            doc = json.loads(line[len(MARKER):])
            doc.update(wall_s=wall, load_average_start=load)
            return doc
    if failed is None:
        rc = proc.returncode
        failed = (f"killed by signal {-rc}" + (" (SIGKILL: the kernel's OOM killer?)" if rc == -9 else "")
                  if rc < 0 else f"child exited {rc}")
    reason = _reason_from_log(log_path)
    got: dict[str, Any] = {}
    try:
        got = json.loads(Path(progress_path).read_text())
    except (OSError, ValueError):
        pass
    samples = got.get("samples", [])
    proc_s = [r["processing_ms"] / 1000.0 for r in samples[1:]]
    return {**case, "status": "failed", "failed": failed, "reason": reason, "phase_reached": got.get("phase"),
            "batches_completed": len(samples), "first_batch_end_s": got.get("first_batch_end_s"),
            "median_processing_s": None if not proc_s else round(_median(proc_s), 3),
            "memory_peak_mb": got.get("memory_so_far"), "samples": samples, "wall_s": wall,
            "load_average_start": load, "log": log_path}


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec)


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| keys | distribution | engine | status | median processing s | p95 s | driver MB | executor MB "
             "| checkpoint MB | checkpoint s |",
             "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(results, key=lambda r: (r["keys"], r["distribution"], ENGINES.index(r["engine"])
                                            if r["engine"] in ENGINES else 9)):
        peaks = r.get("memory_peak_mb") or {}
        driver = peaks.get("driver_python_mb")
        jvm, workers = peaks.get("jvm_mb"), peaks.get("python_workers_mb")
        executor = None if jvm is None and workers is None else round((jvm or 0) + (workers or 0))
        ck = r.get("checkpoints") or {}
        status = r.get("status", "?")
        if status == "behind":
            n = r.get("batches_completed")
            status = f"behind ({n} batch{'' if n == 1 else 'es'})"
        elif status == "failed":
            status = f"failed: {r.get('failed') or r.get('stop_reason')} ({r.get('batches_completed', 0)} batches)"
        elif status in ("skipped", "not run"):
            status = f"{status}: {r.get('reason')}"
        ck_s = ck.get("median_s")
        if ck_s is None:
            ck_s_txt = "-"
        elif ck.get("checkpoint_s_estimated"):
            ck_s_txt = f"~{ck_s:.2f}" if ck_s > 0 else "~0 (within noise)"
        else:
            ck_s_txt = f"{ck_s:.2f}"
        lines.append(f"| {r['keys']:,} | {r['distribution']} | {r['engine']} | {status} "
                     f"| {_fmt(r.get('median_processing_s'), '.3f')} | {_fmt(r.get('p95_processing_s'), '.3f')} "
                     f"| {_fmt(None if driver is None else round(driver))} | {_fmt(executor)} "
                     f"| {_fmt(ck.get('median_mb'))} | {ck_s_txt} |")
    return "\n".join(lines)


def _write(doc: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "--child":
        return child(json.loads(raw[1]), raw[2] if len(raw) > 2 else None)
    p = argparse.ArgumentParser(prog="python -m benchmarks state", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="10K and 1M keys, dstreams and pyspark.streaming, 5 + 10 batches (a few minutes)")
    p.add_argument("--sizes", nargs="+", type=int, help=f"keys of state (default {SIZES})")
    p.add_argument("--engines", nargs="+", choices=ENGINES, help="default: every engine (--quick: dstreams, "
                                                                  "pyspark.streaming)")
    p.add_argument("--distributions", nargs="+", choices=DISTRIBUTIONS, default=DISTRIBUTIONS)
    p.add_argument("--batches", type=int, help="measured batches after the warm-up (default 20; --quick 10)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--updates", type=int, default=UPDATES, help="updates per batch")
    p.add_argument("--interval", type=float, default=1.0, help="batch interval, seconds")
    p.add_argument("--checkpoint-interval", type=float, default=10.0, help="state checkpoint interval, seconds")
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (the JVM's heap in local[2])")
    p.add_argument("--slack", type=float, default=3.0,
                   help="a case stops at slack x its batches' time after its first batch (+ 1 min)")
    p.add_argument("--first-batch-timeout", type=float,
                   help="seconds from start() to the first batch's end (default: 120 + 60 per million keys)")
    p.add_argument("--ss-path", help="a folder put first on ss-rocksdb's PYTHONPATH (its driver and Python workers): "
                                     "where pandas and protobuf are installed when the environment lacks them "
                                     "(pip install --target DIR pandas protobuf)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--merge", action="store_true", help="keep the cases of --out this run does not repeat")
    p.add_argument("--table", action="store_true", help="print the table of --out and exit")
    args = p.parse_args(raw)
    if args.table:
        print(table(json.loads(args.out.read_text())["results"]))
        return 0
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    engines = args.engines or (QUICK_ENGINES if args.quick else ENGINES)
    batches = args.batches or (10 if args.quick else 20)
    from .__main__ import _machine

    command = "python -m benchmarks state " + " ".join(raw)
    doc: dict[str, Any] = {
        "benchmark": "state", "command": command, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": _machine(), "load_average_start": list(os.getloadavg()),
        "workload": {"interval_s": args.interval, "updates_per_batch": args.updates, "hot_keys": HOT_KEYS,
                     "partitions": PARTITIONS, "warmup": args.warmup, "batches": batches,
                     "checkpoint_interval_s": args.checkpoint_interval, "driver_memory": args.driver_memory,
                     "update_function": "add_counts: (last or 0) + sum(newValues); output: count() of the state"},
        "engines": {e: ENGINE_LABELS[e] for e in engines}, "results": []}
    log_dir = tempfile.mkdtemp(prefix="bench-state-logs-")
    print(f"logs in {log_dir}", flush=True)
    results: list[dict[str, Any]] = doc["results"]
    for keys in sorted(sizes):
        for dist in args.distributions:
            for engine in engines:
                case = {"engine": engine, "keys": keys, "distribution": dist, "updates": args.updates,
                        "interval_s": args.interval, "warmup": args.warmup, "batches": batches,
                        "checkpoint_interval_s": args.checkpoint_interval, "driver_memory": args.driver_memory,
                        "slack": args.slack,
                        "first_batch_s": args.first_batch_timeout or 120.0 + 60.0 * keys / 1e6}
                need, how = estimate_mb(engine, keys, results)
                avail = _available_mb()
                print(f"== {engine}, {keys:,} keys, {dist} (memory estimate {need / 1024:.1f} GB, {how}; "
                      f"available {_fmt(None if avail is None else round(avail / 1024, 1))} GB; "
                      f"load {os.getloadavg()[0]:.1f})", flush=True)
                if avail is not None and need > MEMORY_SHARE * avail:
                    results.append({**case, "status": "skipped", "reason": f"memory estimate {need / 1024:.1f} GB "
                                    f"({how}) > {MEMORY_SHARE:.0%} of the {avail / 1024:.1f} GB available"})
                else:
                    results.append(run_case(case, log_dir, args.ss_path if engine == "ss-rocksdb" else None))
                r = results[-1]
                print(f"   {r.get('status')}: median {r.get('median_processing_s')} s, "
                      f"{r.get('batches_completed', 0)} batches, {r.get('failed') or r.get('reason') or ''}",
                      flush=True)
                doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                doc["load_average_end"] = list(os.getloadavg())
                _write(_merged(doc, args.out) if args.merge else doc, args.out)
    final = _merged(doc, args.out) if args.merge else doc
    _write(final, args.out)
    print(table(final["results"]))
    print(f"\nload average at start {doc['load_average_start'][0]:.1f}, at end {doc['load_average_end'][0]:.1f}; "
          f"wrote {args.out}")
    return 0


def _merged(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    """``doc`` plus every case of the file at ``out`` that ``doc`` did not run (``--merge``)."""
    try:
        old = json.loads(out.read_text())
    except (OSError, ValueError):
        return doc
    mine = {(r["engine"], r["keys"], r["distribution"]) for r in doc["results"]}
    kept = [{**r, "command": r.get("command", old.get("command"))} for r in old.get("results", [])
            if (r["engine"], r["keys"], r["distribution"]) not in mine]
    runs = [{"command": doc["command"], "started": doc["started"], "load_average_start": doc["load_average_start"]},
            *old.get("runs", [{"command": old.get("command"), "started": old.get("started"),
                               "load_average_start": old.get("load_average_start")}])]
    return {**doc, "runs": runs, "results": [*kept, *[{**r, "command": doc["command"]} for r in doc["results"]]]}


if __name__ == "__main__":
    sys.exit(main())
