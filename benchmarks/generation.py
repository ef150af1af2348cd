"""Driver time to build each batch of the paper's workloads, and the Py4J round trips it takes.

Contract: in one process (one SparkContext, ``tuned_conf``, ``local[2]``), each workload (grep,
wordcount, topk; per-record and Arrow paths) runs on a tiny generator stream (``--records`` lines per
partition, 2 partitions) at 500 ms batches under a manual clock, one batch at a time, for
``--batches`` batches, the next batch ``--settle`` seconds after the previous one completed (as in a
stream whose tiny batches leave the driver idle until the next interval; 0 = back to back). Each
runs once per JVM construction mode of :mod:`dstreams.spark.jvm`, one after the other: ``compiled`` (the
default: a JVM class compiled at start-up builds each RDD in one round trip) and ``off`` (PySpark's own
calls, ``spark.dstreams.jvm.mode=off`` / ``DSTREAMS_LEAN_JVM=0``). After the 30 s
window has filled, it records per batch:

* ``generation_ms``: the engine building the batch's RDDs and jobs (``BatchInfo.generation_ms``),
* ``py4j_calls``: round trips to the JVM made while building it (counted on the generator thread),
* ``engine_ms``: the engine's own driver time (building + clean-up + processing time outside the
  output operations), the figure the issue's "driver-side overhead per batch <= 10 ms" is about.

Prints medians and p95 per workload and mode, and the ratios of the build medians (off / each mode),
and writes ``benchmarks/results/generation.json``. With
``--sites`` it also prints which call sites (first frame outside PySpark and Py4J) make the round
trips of one batch. Run: ``python -m benchmarks.generation [--batches 90] [--sites]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from . import workloads

RESULTS = Path(__file__).resolve().parent / "results" / "generation.json"
INTERVAL_MS = 500
WINDOW_BATCHES = int(workloads.WINDOW_S * 1000 / INTERVAL_MS)
#: The JVM construction modes compared, PySpark's own calls last (the reference of the ratios).
MODES = ("compiled", "off")


class Py4JCounter:
    """Counts the round trips to the JVM made on threads whose name contains ``thread_part``."""

    def __init__(self, sc: Any, thread_part: str, sites: bool) -> None:
        self.client = sc._gateway._gateway_client
        self.original = self.client.send_command
        self.thread_part = thread_part
        self.calls = 0
        self.sites: collections.Counter[str] | None = collections.Counter() if sites else None
        self.client.send_command = self._send

    def _send(self, *args: Any, **kwargs: Any) -> Any:
        if self.thread_part in threading.current_thread().name:
            self.calls += 1
            if self.sites is not None:
                self.sites[_site()] += 1
        return self.original(*args, **kwargs)

    def close(self) -> None:
        self.client.send_command = self.original


def _site() -> str:
    """``file:line function`` of the innermost frame in this project (not PySpark, Py4J or this file)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace(os.sep, "/")
        if "/pyspark/" in path or "/py4j/" in path or path.endswith("benchmarks/generation.py"):
            continue
        return f"{'/'.join(path.split('/')[-2:])}:{frame.lineno} {frame.name}"
    return "?"


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.95 * len(xs)))] if xs else float("nan")


def measure(sc: Any, name: str, arrow: bool, batches: int, records: int, sites: bool, settle: float,
            mode: str) -> dict[str, Any]:
    from dstreams import ManualClock, StreamingContext
    from dstreams.spark import jvm

    jvm.set_mode(mode)

    workload = workloads.WORKLOADS[name]
    clock = ManualClock()
    ssc = StreamingContext(sc, INTERVAL_MS / 1000.0, clock=clock)
    lines = ssc.generatorStream(records, 2, seed=workloads.SEED)
    (workload.build_arrow if arrow else workload.build)(ssc, lines, INTERVAL_MS / 1000.0, lambda _: None)
    counter = Py4JCounter(sc, "generator", sites)
    calls: list[int] = []
    site_counts: collections.Counter[str] = collections.Counter()
    ssc.start()
    try:
        for k in range(1, batches + 1):
            before = counter.calls
            before_sites = collections.Counter(counter.sites) if counter.sites is not None else None
            clock.set_time(k * INTERVAL_MS)
            ssc.awaitBatch(k * INTERVAL_MS, 120)
            calls.append(counter.calls - before)
            if settle > 0:
                time.sleep(settle)
            if counter.sites is not None and before_sites is not None and k == batches:
                site_counts = counter.sites - before_sites
    finally:
        counter.close()
        ssc.stop(stopSparkContext=False)
        jvm.set_mode("compiled")
    skip = WINDOW_BATCHES + 2 if workload.windowed else 5
    infos = sorted(ssc.batchInfos(), key=lambda i: i.batch_time_ms)[skip:]
    gen = [float(i.generation_ms or 0.0) for i in infos]
    own = []
    for i in infos:
        in_outputs = sum(op.end_time_ms - op.start_time_ms for op in i.output_operations.values()
                         if op.start_time_ms is not None and op.end_time_ms is not None)
        outside = float(i.processing_delay_ms - in_outputs)
        own.append(float(i.generation_ms or 0.0) + outside + float(i.cleanup_ms or 0.0))
    measured_calls = calls[skip:]
    return {
        "workload": name,
        "path": "arrow" if arrow else "per-record",
        "jvm_mode": mode,
        "batches_measured": len(infos),
        "generation_ms_p50": _median(gen),
        "generation_ms_p95": _p95(gen),
        "engine_ms_p50": _median(own),
        "engine_ms_p95": _p95(own),
        "py4j_calls_p50": _median([float(c) for c in measured_calls]),
        "sites": dict(site_counts.most_common()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=WINDOW_BATCHES + 32)
    parser.add_argument("--records", type=int, default=100, help="lines per partition per batch")
    parser.add_argument("--workloads", default="grep,wordcount,topk")
    parser.add_argument("--settle", type=float, default=0.3, help="idle seconds between batches (0: back to back)")
    parser.add_argument("--sites", action="store_true", help="print the call sites of one batch's round trips")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", "dstreams-generation-benchmark")
    rows = []
    try:
        for name in args.workloads.split(","):
            for arrow in (False, True):
                by_mode = {}
                for mode in MODES:
                    row = measure(sc, name, arrow, args.batches, args.records, args.sites, args.settle, mode)
                    rows.append(row)
                    by_mode[mode] = row
                    print(f"{name:10s} {row['path']:10s} {mode:8s} "
                          f"build {row['generation_ms_p50']:6.1f} ms "
                          f"(p95 {row['generation_ms_p95']:6.1f})  engine {row['engine_ms_p50']:6.1f} ms "
                          f"(p95 {row['engine_ms_p95']:6.1f})  py4j calls {row['py4j_calls_p50']:5.0f}", flush=True)
                    if args.sites:
                        for site, n in list(row["sites"].items())[:25]:
                            print(f"    {n:4d}  {site}")
                off_ms = by_mode["off"]["generation_ms_p50"]
                for mode in MODES[:-1]:
                    ms = by_mode[mode]["generation_ms_p50"]
                    if ms > 0.5:
                        print(f"{'':10s} {'':10s} build time, off / {mode}: {off_ms / ms:.2f}x")
    finally:
        sc.stop()
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({
            "command": "python -m benchmarks.generation",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "interval_ms": INTERVAL_MS,
            "records_per_partition": args.records,
            "settle_s": args.settle,
            "rows": rows,
        }, indent=2, sort_keys=True))
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
