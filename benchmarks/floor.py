"""The per-batch floor: the smallest batch interval at which an empty stream keeps up, and driver overhead.

Contract: for each engine (dstreams, pyspark.streaming), in one subprocess with one SparkContext
(``tuned_conf``, ``local[2]``), an empty stream (generator with 0 records per partition, 2 partitions,
one ``count()`` per batch: two Python tasks per batch) runs at decreasing intervals. An interval
**keeps up** when, over the measured batches after the warm-up, the median processing time is under
the interval and the scheduling delay does not grow by more than half an interval. The floor is the
smallest interval that keeps up.

**Driver-side overhead per batch** (dstreams) = time building the batch (``BatchInfo.generation_ms``)
+ processing time not covered by a Spark job of that batch + clean-up after it (``cleanup_ms``); the
Spark jobs' submission and completion times come from Spark's status store. It includes what PySpark
itself spends on the driver for the output's action (``rdd.count()``: wrapping the Python function,
Py4J calls, serving the result over a socket). **The engine's own overhead** leaves that out: building
+ clean-up + processing time outside the output operations (scheduling, listener events, job group).
For pyspark.streaming only the processing time not covered by its Spark jobs is known (its batches
are built in the JVM).
Results go to ``benchmarks/results/floor.json`` and the README's table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .engines import Plan, Sample, _num, _wait
from .run import _slope

RESULTS = Path(__file__).resolve().parent / "results"
MARKER = "FLOOR_RESULT "
PARTITIONS = 2


def _spark_jobs(sc: Any) -> list[tuple[float, float]]:
    """(submission, completion) epoch ms of every finished Spark job the status store still holds."""
    seq = sc._jsc.sc().statusStore().jobsList(None)
    out = []
    for i in range(seq.size()):
        job = seq.apply(i)
        sub, done = job.submissionTime(), job.completionTime()
        if sub.isDefined() and done.isDefined():
            out.append((float(sub.get().getTime()), float(done.get().getTime())))
    return out


def _covered(start: float, end: float, jobs: list[tuple[float, float]]) -> float:
    """Milliseconds of ``[start, end]`` covered by the union of the job intervals."""
    spans = sorted((max(a, start), min(b, end)) for a, b in jobs if b > start and a < end)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in spans:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def _dstreams_trial(sc: Any, interval_ms: int, plan: Plan) -> tuple[list[Sample], list[float], list[float]]:
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, interval_ms / 1000.0)
    ssc.generatorStream(0, PARTITIONS).foreachRDD(lambda rdd: rdd.count())

    def infos() -> list[Any]:
        return sorted((i for i in ssc.batchInfos() if i.processing_end_time_ms is not None),
                      key=lambda i: i.batch_time_ms)

    def samples() -> list[Sample]:
        return [Sample(k, float(i.scheduling_delay_ms), float(i.processing_delay_ms)) for k, i in enumerate(infos())]

    ssc.start()
    try:
        got = _wait(samples, plan, interval_ms / 1000.0)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    jobs = _spark_jobs(sc)
    overhead, own = [], []
    for i in infos()[plan.warmup: plan.warmup + plan.measure]:
        outside = i.processing_delay_ms - _covered(i.processing_start_time_ms, i.processing_end_time_ms, jobs)
        in_outputs = sum(op.end_time_ms - op.start_time_ms for op in i.output_operations.values()
                         if op.start_time_ms is not None and op.end_time_ms is not None)
        engine_only = (i.generation_ms or 0.0) + (i.processing_delay_ms - in_outputs) + (i.cleanup_ms or 0.0)
        overhead.append((i.generation_ms or 0.0) + outside + (i.cleanup_ms or 0.0))
        own.append(engine_only)
    return got, overhead, own


def _pyspark_trial(sc: Any, interval_ms: int, plan: Plan) -> tuple[list[Sample], list[float], list[float]]:
    from pyspark.streaming import StreamingContext, StreamingListener

    got: list[tuple[int, float, float, float, float]] = []

    class Collect(StreamingListener):
        def onBatchCompleted(self, batchCompleted: Any) -> None:
            info = batchCompleted.batchInfo()
            start = _num(info.processingStartTime())
            end = _num(info.processingEndTime())
            got.append((info.batchTime().milliseconds(), float(start - info.submissionTime()), float(end - start),
                        float(start), float(end)))

    ssc = StreamingContext(sc, interval_ms / 1000.0)
    ssc.addStreamingListener(Collect())
    empty = sc.parallelize(range(PARTITIONS), PARTITIONS).mapPartitions(lambda _: iter(()))
    ssc.queueStream([], oneAtATime=True, default=empty).foreachRDD(lambda rdd: rdd.count())

    def samples() -> list[Sample]:
        return [Sample(k, s, p) for k, (_, s, p, _a, _b) in enumerate(sorted(got))]

    ssc.start()
    try:
        out = _wait(samples, plan, interval_ms / 1000.0)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    jobs = _spark_jobs(sc)
    rows = sorted(got)[plan.warmup: plan.warmup + plan.measure]
    overhead = [p - _covered(a, b, jobs) for _, _, p, a, b in rows]
    return out, overhead, []


def child(engine: str, intervals: list[int], warmup: int, measure: int) -> dict[str, Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", f"bench-floor-{engine}")
    sc.setLogLevel("ERROR")
    trial = _dstreams_trial if engine == "dstreams" else _pyspark_trial
    result: dict[str, Any] = {"intervals": {}}
    try:
        for interval in intervals:
            plan = Plan(warmup=warmup, measure=measure, target_ms=2 * interval, abort_sched_ms=4000.0, slack_s=10.0)
            samples, overhead, own = trial(sc, interval, plan)
            measured = samples[warmup: warmup + measure]
            proc = [s.processing_ms for s in measured]
            growth = _slope([s.scheduling_ms for s in measured]) * len(measured)
            keeps = len(measured) == measure and statistics.median(proc) < interval and growth < interval / 2
            result["intervals"][str(interval)] = {
                "keeps_up": keeps,
                "median_processing_ms": statistics.median(proc) if proc else None,
                "median_scheduling_ms": statistics.median(s.scheduling_ms for s in measured) if measured else None,
                "scheduling_growth_ms": growth,
                "driver_overhead_ms_median": statistics.median(overhead) if overhead else None,
                "driver_overhead_ms": overhead,
                "engine_overhead_ms_median": statistics.median(own) if own else None,
            }
            print(f"[floor {engine}] {interval} ms: keeps up={keeps} median processing="
                  f"{result['intervals'][str(interval)]['median_processing_ms']} ms overhead="
                  f"{result['intervals'][str(interval)]['driver_overhead_ms_median']}", file=sys.stderr, flush=True)
    finally:
        sc.stop()
    ok = [i for i in intervals if result["intervals"][str(i)]["keeps_up"]]
    result["floor_ms"] = min(ok) if ok else None
    per = [v["driver_overhead_ms_median"] for v in result["intervals"].values() if v["driver_overhead_ms_median"]]
    result["driver_overhead_ms"] = statistics.median(per) if per else None
    own = [v["engine_overhead_ms_median"] for v in result["intervals"].values()
           if v["engine_overhead_ms_median"] is not None]
    result["engine_overhead_ms"] = statistics.median(own) if own else None
    return result


def main(quick: bool, command: str) -> int:
    from . import report

    intervals = [500, 200, 100, 50] if quick else [1000, 500, 200, 100, 50]
    warmup, measure = (5, 20) if quick else (10, 40)
    doc: dict[str, Any] = {"benchmark": "floor", "command": command, "partitions": PARTITIONS,
                           "warmup": warmup, "measure": measure,
                           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "engines": {}}
    for engine in ("dstreams", "pyspark.streaming"):
        cmd = [sys.executable, "-m", "benchmarks.floor", engine, str(warmup), str(measure), *map(str, intervals)]
        proc = subprocess.run(cmd, cwd=RESULTS.parent.parent, stdout=subprocess.PIPE, text=True, timeout=1200)
        line = next((x for x in proc.stdout.splitlines() if x.startswith(MARKER)), None)
        doc["engines"][engine] = json.loads(line[len(MARKER):]) if line else {
            "failed": f"exit {proc.returncode}", "intervals": {}, "floor_ms": None}
        r = doc["engines"][engine]
        print(f"{engine}: floor {r['floor_ms']} ms, driver overhead {r.get('driver_overhead_ms')} ms/batch")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "floor.json").write_text(json.dumps(doc, indent=1) + "\n")
    report.write_readme()
    return 0


if __name__ == "__main__":
    engine_arg, w, m, *ivals = sys.argv[1:]
    print(MARKER + json.dumps(child(engine_arg, [int(i) for i in ivals], int(w), int(m))), flush=True)
