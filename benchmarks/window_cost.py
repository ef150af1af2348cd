"""Cost per batch of a windowed WordCount against the window's length, dstreams vs ``pyspark.streaming``.

Run from the repository root::

    python -m benchmarks.window_cost              # windows 5 s, 15 s, 30 s; 500 ms batches; 20,000 records/s

Contract: for each engine (own subprocess, ``tuned_conf``, ``local[2]``) and window length, the
WordCount of :mod:`benchmarks.workloads` (``reduceByKeyAndWindow(add, sub, window, interval)``) runs
until the window has filled and ``--measure`` more batches completed; the figures are the median
processing time of those batches and the median number of Spark stages that ran inside each of them
(from Spark's status store). A batch backlog does not stop the run: processing time per batch is
what is compared. Writes ``benchmarks/results/window_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .engines import Plan, run_dstreams, run_pyspark
from .workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results"
MARKER = "WINDOW_COST_RESULT "


def _stage_spans(sc: Any) -> list[tuple[float, float]]:
    gw = sc._gateway
    # AppStatusStore.stageList(statuses, details, withSummaries, unsortedQuantiles, taskStatus): Py4J
    # does not see Scala's default arguments.
    seq = sc._jsc.sc().statusStore().stageList(None, False, False, gw.new_array(gw.jvm.double, 0), None)
    out = []
    for i in range(seq.size()):
        st = seq.apply(i)
        sub, done = st.submissionTime(), st.completionTime()
        if sub.isDefined() and done.isDefined():
            out.append((float(sub.get().getTime()), float(done.get().getTime())))
    return out


def child(engine: str, windows: list[float], interval_s: float, rate: int, measure: int) -> dict[str, Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import benchmarks.workloads as wl_mod
    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", f"bench-window-cost-{engine}")
    sc.setLogLevel("ERROR")
    sc._jsc.sc().conf().set("spark.ui.retainedStages", "100000")
    out: dict[str, Any] = {}
    try:
        for window in windows:
            wl_mod.WINDOW_S = window
            fill = int(round(window / interval_s))
            # A peer may take several intervals per batch: give it time to complete the measured batches.
            plan = Plan(warmup=fill, measure=measure, target_ms=1e9, abort_sched_ms=1e12,
                        slack_s=30.0 + 6 * (fill + measure) * interval_s)
            wall0 = time.time() * 1000.0
            if engine == "dstreams":
                samples = run_dstreams(sc, WORKLOADS["wordcount"], rate, interval_s, plan)
            else:
                samples = run_pyspark(sc, WORKLOADS["wordcount"], rate, interval_s, plan)
            measured = samples[fill: fill + measure]
            stages = [s for s in _stage_spans(sc) if s[0] >= wall0]  # every stage this trial ran
            out[str(window)] = {
                "batches_completed": len(samples),
                "median_processing_ms": statistics.median(s.processing_ms for s in measured) if measured else None,
                "processing_ms": [s.processing_ms for s in measured],
                "stages_per_batch": round(len(stages) / max(1, len(samples)), 2),
            }
            print(f"[window_cost {engine}] window {window:g} s: {out[str(window)]['median_processing_ms']} ms/batch, "
                  f"{out[str(window)]['stages_per_batch']} stages/batch", file=sys.stderr, flush=True)
    finally:
        sc.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", nargs="+", type=float, default=[5.0, 15.0, 30.0])
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--rate", type=int, default=20_000)
    p.add_argument("--measure", type=int, default=10)
    p.add_argument("--engines", nargs="+", default=["dstreams", "pyspark.streaming"])
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(MARKER + json.dumps(child(args.child, args.windows, args.interval, args.rate, args.measure)), flush=True)
        return 0
    doc: dict[str, Any] = {"benchmark": "window_cost", "command": "python -m benchmarks.window_cost "
                           + " ".join(sys.argv[1:] if argv is None else argv), "interval_s": args.interval,
                           "rate": args.rate, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "engines": {}}
    for engine in args.engines:
        cmd = [sys.executable, "-m", "benchmarks.window_cost", "--child", engine, "--interval", str(args.interval),
               "--rate", str(args.rate), "--measure", str(args.measure), "--windows", *map(str, args.windows)]
        proc = subprocess.run(cmd, cwd=RESULTS.parent.parent, stdout=subprocess.PIPE, text=True, timeout=3600)
        line = next((x for x in proc.stdout.splitlines() if x.startswith(MARKER)), None)
        doc["engines"][engine] = json.loads(line[len(MARKER):]) if line else {"failed": f"exit {proc.returncode}"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "window_cost.json").write_text(json.dumps(doc, indent=1) + "\n")
    for engine, r in doc["engines"].items():
        print(engine, {w: (v.get("median_processing_ms"), v.get("stages_per_batch")) for w, v in r.items()
                       if isinstance(v, dict)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
