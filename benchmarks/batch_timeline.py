"""Where the fixed cost of a small windowed batch goes: a timeline from Spark's status store.

Run from the repository root::

    python -m benchmarks.batch_timeline                 # WordCount, 200 lines/s, 5 s window, 60 batches
    python -m benchmarks.batch_timeline --workload grep

Contract: one process, one SparkContext (``tuned_conf``, ``local[2]``), the workload of
:mod:`benchmarks.workloads` on dstreams' generator at a tiny rate (so what is measured is the cost of a
batch, not of its records) with 500 ms batches and a 5 s window (the cost per batch does not depend on
the window's length: ``benchmarks/README.md``). After ``--skip`` batches, for each batch, relative to
the start of its processing (``BatchInfo``): when its Spark job's first stage was submitted, each
stage's span, the launch of the stage's first task after the stage was submitted, the tasks' executor
run time and deserialization time, and the time from the last stage's end to the batch's end. Prints
the medians over the measured batches and writes ``benchmarks/results/batch_timeline.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from . import workloads

RESULTS = Path(__file__).resolve().parent / "results" / "batch_timeline.json"
INTERVAL_S = 0.5


def _stages(sc: Any) -> list[dict[str, Any]]:
    gw = sc._gateway
    store = sc._jsc.sc().statusStore()
    # stageList(statuses, details, withSummaries, unsortedQuantiles, taskStatus): no Scala defaults in Py4J.
    seq = store.stageList(None, False, False, gw.new_array(gw.jvm.double, 0), None)
    out = []
    for i in range(seq.size()):
        st = seq.apply(i)
        if not (st.submissionTime().isDefined() and st.completionTime().isDefined()):
            continue
        tasks = store.taskList(st.stageId(), st.attemptId(), 100)
        launches, runs, desers = [], [], []
        for k in range(tasks.size()):
            t = tasks.apply(k)
            launches.append(t.launchTime().getTime())
            if t.taskMetrics().isDefined():
                m = t.taskMetrics().get()
                runs.append(m.executorRunTime())
                desers.append(m.executorDeserializeTime())
        out.append({"submitted": st.submissionTime().get().getTime(), "completed": st.completionTime().get().getTime(),
                    "tasks": st.numTasks(), "first_launch": min(launches) if launches else None,
                    "run_ms": runs, "deserialize_ms": desers})
    return sorted(out, key=lambda s: s["submitted"])


def measure(workload: str, rate: int, batches: int, skip: int) -> dict[str, Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dstreams import StreamingContext
    from dstreams.spark.sparkconf import create_spark_context

    workloads.WINDOW_S = 5.0
    sc = create_spark_context("local[2]", "bench-batch-timeline")
    sc.setLogLevel("ERROR")
    sc._jsc.sc().conf().set("spark.ui.retainedStages", "100000")
    try:
        parts = sc.defaultParallelism
        ssc = StreamingContext(sc, INTERVAL_S)
        lines = ssc.generatorStream(max(1, round(rate * INTERVAL_S / parts)), parts, seed=workloads.SEED)
        workloads.WORKLOADS[workload].build(ssc, lines, INTERVAL_S, lambda _: None)
        ssc.start()
        deadline = time.monotonic() + batches * INTERVAL_S + 60.0
        try:
            while time.monotonic() < deadline:
                done = [i for i in ssc.batchInfos() if i.processing_end_time_ms is not None]
                if len(done) >= batches:
                    break
                time.sleep(0.2)
        finally:
            ssc.stop(stopSparkContext=False, stopGraceFully=False)
        infos = sorted(done, key=lambda i: i.batch_time_ms)[skip:]
        stages = _stages(sc)
    finally:
        sc.stop()
    rows = []
    for b in infos:
        t0, t1 = b.processing_start_time_ms, b.processing_end_time_ms
        mine = [s for s in stages if s["submitted"] >= t0 - 1 and s["completed"] <= t1 + 1]
        if not mine:
            continue
        rows.append({
            "processing_ms": b.processing_delay_ms,
            "stages": len(mine),
            "before_first_stage_ms": mine[0]["submitted"] - t0,
            "stage_ms": [s["completed"] - s["submitted"] for s in mine],
            "submit_to_first_task_ms": [s["first_launch"] - s["submitted"] for s in mine if s["first_launch"]],
            "task_run_ms": [max(s["run_ms"] or [0]) for s in mine],
            "task_deserialize_ms": [max(s["deserialize_ms"] or [0]) for s in mine],
            "between_stages_ms": [b2["submitted"] - a["completed"] for a, b2 in zip(mine, mine[1:], strict=False)],
            "after_last_stage_ms": t1 - mine[-1]["completed"],
        })
    return {"workload": workload, "rate": rate, "interval_ms": INTERVAL_S * 1000, "window_s": 5.0, "batches": rows}


def _med(rows: list[dict[str, Any]], key: str, index: int | None = None) -> float | None:
    vals = [r[key] if index is None else r[key][index] for r in rows
            if index is None or len(r[key]) > index]
    return statistics.median(vals) if vals else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.batch_timeline", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="wordcount", choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--rate", type=int, default=200, help="records/s (tiny: the batch's fixed cost is measured)")
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--skip", type=int, default=20, help="batches left out at the start (warm-up, window fill)")
    args = ap.parse_args(argv)
    res = measure(args.workload, args.rate, args.batches, args.skip)
    rows = res["batches"]
    stages = max((r["stages"] for r in rows), default=0)
    summary: dict[str, Any] = {"processing_ms": _med(rows, "processing_ms"),
                               "before_first_stage_ms": _med(rows, "before_first_stage_ms"),
                               "after_last_stage_ms": _med(rows, "after_last_stage_ms")}
    print(f"{args.workload}, {args.rate} records/s, {len(rows)} batches measured (medians, ms):")
    print(f"  processing time of a batch          {summary['processing_ms']}")
    print(f"  batch start -> first stage submitted {summary['before_first_stage_ms']}")
    for i in range(stages):
        s = {k: _med(rows, k, i) for k in ("stage_ms", "submit_to_first_task_ms", "task_run_ms", "task_deserialize_ms")}
        summary[f"stage_{i + 1}"] = s
        print(f"  stage {i + 1}: span {s['stage_ms']}, "
              f"submitted -> first task launched {s['submit_to_first_task_ms']}, "
              f"slowest task's run time {s['task_run_ms']} (deserialization {s['task_deserialize_ms']})")
        if i + 1 < stages:
            gap = _med(rows, "between_stages_ms", i)
            summary[f"between_stage_{i + 1}_and_{i + 2}_ms"] = gap
            print(f"  stage {i + 1} end -> stage {i + 2} submitted  {gap}")
    print(f"  last stage end -> batch end          {summary['after_last_stage_ms']}")
    command = "python -m benchmarks.batch_timeline " + " ".join(sys.argv[1:] if argv is None else argv)
    doc = {"benchmark": "batch_timeline", "command": command.strip(),
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary, **res}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
