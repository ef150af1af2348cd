"""One trial = one engine running one workload at one input rate for a fixed number of batches.

Contract: ``ENGINES[name](sc, workload, rate, interval_s, plan)`` runs the trial on the running
SparkContext ``sc`` and returns the per-batch samples of every batch that completed, oldest first,
as :class:`Sample` (batch index, scheduling delay, processing time in ms). A trial stops when
its measured batches completed (:func:`measured_start`: after ``plan.warmup`` batches and, when
``plan.settle`` is set, once the start-up backlog has drained), when a post-warm-up batch waited more
than ``plan.abort_sched_ms`` to start (clearly not keeping up), or at a deadline; it always stops its
streaming context (the SparkContext survives for the next trial).

Engines:

* ``dstreams``: ``ssc.generatorStream`` (records made in the executors) and the workload's ``build``;
  metrics from ``ssc.batchInfos()``. ``dstreams-user``: the same on a SparkContext built as a
  ``pyspark.streaming`` script builds it (``SparkContext(master, app)``, then ``StreamingContext(sc, n)``,
  which applies what it can of dstreams' tuning: see ``dstreams.spark.sparkconf.tune_running_context``).
  ``dstreams-arrow``: the same lines made as Arrow record batches
  (``recordFunc=text_record_batches``) and the workload's ``build_arrow`` (``mapArrowBatches``).
* ``pyspark.streaming``: ``queueStream`` of lazily generated RDDs (the same record function runs in the
  executors when a batch is computed), the same ``build``; metrics from a ``StreamingListener``.
* ``ss-udf`` / ``ss-sql``: Structured Streaming on the ``rate-micro-batch`` source (a fixed number of
  rows per batch, so a slow query falls behind instead of growing its batches), 100-byte lines picked
  from the generator's line pool by a hash of the row number; the workload's logic as Python UDFs, or
  as built-in SQL functions. Metrics from the query's progress: scheduling delay = trigger start minus
  its slot on the trigger grid anchored at the first measured batch.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark import SparkContext

from dstreams.nodes.generator import text_record_batches

from .workloads import PATTERN, SEED, TOP_K, WINDOW_S, Workload, grep_match, line_pool, partition_records

#: Seconds a trial waits for its first batch.
FIRST_BATCH_S = 90.0
#: Warm-up batches that may start late without ending the trial (worker start-up, code generation).
WARMUP_GRACE = 5


@dataclass
class Sample:
    index: int
    scheduling_ms: float
    processing_ms: float
    #: Engine-specific breakdown (Structured Streaming: the progress' ``durationMs`` and state rows).
    detail: dict[str, Any] | None = None


#: A batch has caught up when it started less than this fraction of the interval late.
CAUGHT_UP = 0.5


@dataclass
class Plan:
    warmup: int
    measure: int
    target_ms: float
    abort_sched_ms: float
    slack_s: float
    #: Extra warm-up batches, at most, to wait for the backlog of the start-up transient to drain
    #: (see :func:`measured_start`); 0 measures right after ``warmup``.
    settle: int = 0


def measured_start(samples: list[Sample], plan: Plan, interval_ms: float) -> int | None:
    """Index of the first measured batch, or ``None`` while it is not known yet.

    Steady state, not the start-up transient, is what a trial measures. The first batches of a trial
    run on a JVM that is still compiling hot code and on Python workers that are still starting; a
    windowed workload also fills its window then. A rate the engine sustains in steady state can
    leave a backlog from that transient which drains only slowly (a batch just under the interval
    drains a few ms per batch), and latencies measured while it drains are not the steady state.
    So with ``plan.settle > 0`` measurement starts at the first batch at or after ``plan.warmup``
    that started less than :data:`CAUGHT_UP` of an interval late, and at ``plan.warmup +
    plan.settle`` at the latest (a backlog that has not drained by then is measured as it is, and
    fails the latency or growth test). With ``plan.settle == 0`` it starts at ``plan.warmup``.
    """
    if plan.settle <= 0:
        return plan.warmup
    last = plan.warmup + plan.settle
    for i in range(plan.warmup, min(len(samples), last)):
        if samples[i].scheduling_ms < CAUGHT_UP * interval_ms:
            return i
    return last if len(samples) >= last else None


def _num(value: Any) -> float:
    """A Py4J number, or a Scala ``Option`` of one (PySpark's listener hands plain longs)."""
    return float(value.get() if hasattr(value, "get") else value)


def _wait(samples_fn: Callable[[], list[Sample]], plan: Plan, interval_s: float,
          stop: Callable[[], bool] | None = None) -> list[Sample]:
    """Poll ``samples_fn`` until the trial is over (module contract), or until ``stop()`` says so."""
    longest = plan.warmup + plan.settle + plan.measure
    # The first batch may take long (code generation, worker start-up, a loaded machine): the trial's
    # clock starts when it completes, within FIRST_BATCH_S.
    deadline = time.monotonic() + FIRST_BATCH_S
    started = False
    samples: list[Sample] = []
    while time.monotonic() < deadline:
        time.sleep(min(0.25, interval_s / 2))
        samples = samples_fn()
        if samples and not started:
            started = True
            deadline = time.monotonic() + longest * interval_s + plan.slack_s
        start = measured_start(samples, plan, interval_s * 1000.0)
        if start is not None and len(samples) >= start + plan.measure:
            break
        if any(s.scheduling_ms > plan.abort_sched_ms for s in samples[plan.warmup:]):
            break
        # Hopelessly behind already during a long warm-up (a window filling): no need to wait it out.
        if any(s.scheduling_ms > 2 * plan.abort_sched_ms for s in samples[WARMUP_GRACE:plan.warmup]):
            break
        if stop is not None and stop():
            break
    return samples_fn()


# ----------------------------------------------------------------------------------------- dstreams
def run_dstreams(sc: SparkContext, wl: Workload, rate: int, interval_s: float, plan: Plan,
                 arrow: bool = False) -> list[Sample]:
    from dstreams import StreamingContext

    parts = sc.defaultParallelism
    per_part = round(rate * interval_s / parts)
    ssc = StreamingContext(sc, interval_s)
    # The Arrow path reads the very same lines, made as Arrow record batches (no Python object per line).
    lines = ssc.generatorStream(per_part, parts, seed=SEED, recordFunc=text_record_batches if arrow else None)
    (wl.build_arrow if arrow else wl.build)(ssc, lines, interval_s, lambda _: None)

    def samples() -> list[Sample]:
        infos = sorted((i for i in ssc.batchInfos() if i.processing_end_time_ms is not None),
                       key=lambda i: i.batch_time_ms)
        return [Sample(k, float(i.scheduling_delay_ms), float(i.processing_delay_ms)) for k, i in enumerate(infos)]

    ssc.start()
    try:
        return _wait(samples, plan, interval_s)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)


# -------------------------------------------------------------------------------- pyspark.streaming
def _lazy_batch(sc: SparkContext, parts: int, per_part: int, time_ms: int) -> Any:
    def gen(partition: int, _: Any) -> Any:
        return partition_records(SEED, time_ms, partition, per_part)

    return sc.parallelize(range(parts), parts).mapPartitionsWithIndex(gen)


def run_pyspark(sc: SparkContext, wl: Workload, rate: int, interval_s: float, plan: Plan) -> list[Sample]:
    from pyspark.streaming import StreamingContext, StreamingListener

    parts = sc.defaultParallelism
    per_part = round(rate * interval_s / parts)
    interval_ms = round(interval_s * 1000)
    # Queued batches for every batch the trial may measure (settling included), and spare: a queue that
    # ran dry would hand the engine empty batches, which it processes fast (a false pass).
    count = plan.warmup + plan.settle + plan.measure + 20
    rdds = [_lazy_batch(sc, parts, per_part, (i + 1) * interval_ms) for i in range(count)]
    ssc = StreamingContext(sc, interval_s)
    tmp = tempfile.mkdtemp(prefix="bench-pyspark-ckpt-")
    if wl.windowed:
        ssc.checkpoint(tmp)
    got: list[tuple[int, float, float]] = []
    lock = threading.Lock()

    class Collect(StreamingListener):
        def onBatchCompleted(self, batchCompleted: Any) -> None:
            info = batchCompleted.batchInfo()
            start = _num(info.processingStartTime())
            end = _num(info.processingEndTime())
            with lock:
                got.append((info.batchTime().milliseconds(), float(start - info.submissionTime()),
                            float(end - start)))

    ssc.addStreamingListener(Collect())
    lines = ssc.queueStream(rdds, oneAtATime=True)
    wl.build(ssc, lines, interval_s, lambda _: None)

    def samples() -> list[Sample]:
        with lock:
            rows = sorted(got)[:count]  # batches past the queue are empty: never measured
        return [Sample(k, s, p) for k, (_, s, p) in enumerate(rows)]

    ssc.start()
    try:
        return _wait(samples, plan, interval_s)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------ Structured Streaming
def _ss_lines(spark: Any, rows: int, parts: int, interval_ms: int) -> Any:
    from pyspark.sql import functions as F  # noqa: N812 - the usual alias

    pool = line_pool()
    src = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", parts)
        .option("advanceMillisPerBatch", interval_ms)
        .load()
    )
    index = (F.pmod(F.xxhash64("value"), F.lit(len(pool))) + 1).cast("int")
    pick = F.element_at(F.array(*[F.lit(s) for s in pool]), index)
    return src.select(pick.alias("line"), "timestamp")


def _ss_query(spark: Any, wl: Workload, lines: Any, interval_ms: int, use_udf: bool, ckpt: str) -> Any:
    from pyspark.sql import functions as F  # noqa: N812 - the usual alias
    from pyspark.sql.types import ArrayType, BooleanType, StringType

    trigger = {"processingTime": f"{interval_ms} milliseconds"}
    if wl.name == "grep":
        if use_udf:
            matched = lines.filter(F.udf(grep_match, BooleanType())("line"))
        else:
            matched = lines.filter(F.col("line").contains(F.lit(PATTERN)))
        return matched.writeStream.format("noop").option("checkpointLocation", ckpt).trigger(**trigger).start()
    if use_udf:
        words = lines.select(F.explode(F.udf(lambda s: s.split(), ArrayType(StringType()))("line")).alias("word"),
                             "timestamp")
    else:
        words = lines.select(F.explode(F.split("line", " ")).alias("word"), "timestamp").where("word != ''")
    counts = (
        words.withWatermark("timestamp", "0 seconds")
        .groupBy(F.window("timestamp", f"{int(WINDOW_S)} seconds", f"{interval_ms} milliseconds"), "word")
        .count()
    )
    writer = counts.writeStream.outputMode("update").option("checkpointLocation", ckpt).trigger(**trigger)
    if wl.name == "wordcount":
        return writer.format("noop").start()

    def top(df: Any, _batch_id: int) -> None:
        rows = df.collect()
        if rows:
            newest = max(r["window"]["end"] for r in rows)
            sorted(((r["word"], r["count"]) for r in rows if r["window"]["end"] == newest),
                   key=lambda kv: (-kv[1], kv[0]))[:TOP_K]

    return writer.foreachBatch(top).start()


def _progress_dicts(query: Any) -> list[dict[str, Any]]:
    out = []
    for p in query.recentProgress:
        out.append(json.loads(p.json) if hasattr(p, "json") else dict(p))
    return out


def _iso_ms(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000.0


def _run_ss(sc: SparkContext, wl: Workload, rate: int, interval_s: float, plan: Plan, use_udf: bool) -> list[Sample]:
    from pyspark.sql import SparkSession

    spark = SparkSession(sc)
    parts = sc.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(parts))
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
    interval_ms = round(interval_s * 1000)
    rows = max(1, round(rate * interval_s))
    tmp = tempfile.mkdtemp(prefix="bench-ss-ckpt-")
    query = _ss_query(spark, wl, _ss_lines(spark, rows, parts, interval_ms), interval_ms, use_udf, tmp)

    def samples() -> list[Sample]:
        progress = sorted(_progress_dicts(query), key=lambda p: p["batchId"])
        starts = [_iso_ms(p["timestamp"]) for p in progress]
        procs = [float(p["durationMs"].get("triggerExecution", 0)) for p in progress]
        if not progress:
            return []
        anchor_i = min(plan.warmup, len(progress) - 1)
        anchor = starts[anchor_i]
        out = []
        for k, (s, d) in enumerate(zip(starts, procs, strict=True)):
            sched = max(0.0, s - (anchor + (k - anchor_i) * interval_ms)) if k >= anchor_i else 0.0
            detail = {"durationMs": progress[k].get("durationMs"), "numInputRows": progress[k].get("numInputRows"),
                      "stateRows": [op.get("numRowsTotal") for op in progress[k].get("stateOperators", [])]}
            out.append(Sample(k, sched, d, detail))
        return out

    try:
        return _wait(samples, plan, interval_s)
    finally:
        query.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run_ss_udf(sc: SparkContext, wl: Workload, rate: int, interval_s: float, plan: Plan) -> list[Sample]:
    return _run_ss(sc, wl, rate, interval_s, plan, use_udf=True)


def run_ss_sql(sc: SparkContext, wl: Workload, rate: int, interval_s: float, plan: Plan) -> list[Sample]:
    return _run_ss(sc, wl, rate, interval_s, plan, use_udf=False)


def run_dstreams_arrow(sc: SparkContext, wl: Workload, rate: int, interval_s: float, plan: Plan) -> list[Sample]:
    return run_dstreams(sc, wl, rate, interval_s, plan, arrow=True)


ENGINES: dict[str, Callable[[SparkContext, Workload, int, float, Plan], list[Sample]]] = {
    "dstreams": run_dstreams,
    "dstreams-user": run_dstreams,
    "dstreams-arrow": run_dstreams_arrow,
    "pyspark.streaming": run_pyspark,
    "pyspark.streaming-defaults": run_pyspark,
    "ss-udf": run_ss_udf,
    "ss-sql": run_ss_sql,
}

#: Engines whose SparkContext is built as a ``pyspark.streaming`` script builds it: ``SparkContext(master,
#: app)`` with Spark's defaults, instead of ``tuned_conf`` (every other engine gets the same tuning as
#: dstreams, so that those comparisons are between designs).
UNTUNED_ENGINES = frozenset({"pyspark.streaming-defaults", "dstreams-user"})

#: ``python -m benchmarks run --user-context``: each engine's variant on a user-made SparkContext.
USER_CONTEXT_VARIANTS = {"dstreams": "dstreams-user", "pyspark.streaming": "pyspark.streaming-defaults"}

ENGINE_LABELS = {
    "dstreams": "dstreams (same Python functions)",
    "dstreams-user": "dstreams on a user-made SparkContext (SparkContext(master, app) + StreamingContext(sc, n))",
    "dstreams-arrow": "dstreams, Arrow generator + mapArrowBatches + pyarrow.compute",
    "pyspark.streaming": "pyspark.streaming (same Python functions)",
    "pyspark.streaming-defaults": "pyspark.streaming on a user-made SparkContext (Spark's default conf: what its "
                                  "users get)",
    "ss-udf": "Structured Streaming, Python UDFs",
    "ss-sql": "Structured Streaming, built-in SQL functions",
}
