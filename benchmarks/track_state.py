"""``track`` at scale (issue 23): per-batch cost of ``track`` on the RDD state and on the executor state store.

Run from the repository root::

    python -m benchmarks.track_state                       # 100K, 1M and 3M keys, each engine
    python -m benchmarks.track_state --sizes 10000000 --batches 10

Contract:

* **Workload**: ``track(init, update, "1h", timers=on_timer, emit="updated")`` over ``(key, 1)`` events: the
  first batch creates ``keys`` keys (each with a processing-time timer one hour ahead, so that the state holds
  ``keys`` timers too), each later batch brings ``--updates`` events (100,000) on a hot set of 1,000 keys (the
  issue's workload) and re-arms their timers; nothing times out or fires during the run. The output is a
  ``count()`` of the updated keys of each batch. Batches are driven one at a time on a ``ManualClock`` (1 s
  apart), so each batch's processing time is its own, with no queue in front of it; the state is checkpointed
  every 10 batches (deltas on the store).
* **Engines**, each (engine, keys) in its own child process with its own ``SparkContext("local[2]")`` from
  ``create_spark_context``: ``rdd`` (``spark.dstreams.state.store=rdd``: a batch merges every key), ``store``
  (``executor``: a batch reads the keys with events and the keys due) and ``auto`` (the default: the RDD state
  until the state is large next to what a batch touches, then the store).
* **Measure**: the median and p95 processing time of the ``--batches`` batches after ``--warmup`` (3) update
  batches, the first (loading) batch's time, peak RSS of every process. Writes
  ``benchmarks/results/track_state.json`` (``--out``) and prints the table; the load average is recorded per
  case (the machine is shared: compare within one run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .state import _median, _p95

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "track_state.json"
MARKER = "TRACK_BENCH_RESULT "
SIZES = [100_000, 1_000_000, 3_000_000]
ENGINES = ["rdd", "store", "auto"]
#: ``spark.dstreams.state.store`` of each engine.
STORE_SETTING = {"rdd": "rdd", "store": "executor", "auto": "auto"}
HOT_KEYS = 1000
PARTITIONS = 2
HOUR_S = 3600


def init_key(key: int, event: int) -> Any:
    from dstreams import TrackUpdate

    return TrackUpdate(event, processingTime=HOUR_S)  # batch times run from 1 s: never due in the run


def update_key(key: int, state: int, event: int) -> Any:
    from dstreams import TrackUpdate

    return TrackUpdate(state + event, processingTime=HOUR_S)


def on_timer(key: int, state: int, timer: Any) -> int:
    return state


def _load(keys: int):
    def gen(partition: int, _: Any) -> Any:
        return ((k, 1) for k in range(partition, keys, PARTITIONS))

    return gen


def _hot(updates: int, batch: int):
    def gen(partition: int, _: Any) -> Any:
        rnd = random.Random(batch * 1_000_003 + partition).random
        return ((int(rnd() * HOT_KEYS), 1) for _ in range(updates // PARTITIONS))

    return gen


def child(case: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dstreams import ManualClock, StreamingContext
    from dstreams.spark.sparkconf import create_spark_context

    from .memory import PeakMemory

    tmp = tempfile.mkdtemp(prefix="bench-track-")
    os.environ["DSTREAMS_STATE_STORE"] = STORE_SETTING[case["engine"]]
    os.environ["DSTREAMS_STATE_LOCAL_DIR"] = os.path.join(tmp, "local")
    sc = create_spark_context("local[2]", "bench-track", {"spark.driver.memory": case["driver_memory"],
                                                          "spark.dstreams.ui.enabled": "false"})
    sc.setLogLevel("ERROR")
    memory = PeakMemory(getattr(getattr(sc._gateway, "proc", None), "pid", None)).start()
    total = 1 + case["warmup"] + case["batches"]
    seeds = sc.range(0, PARTITIONS, numSlices=PARTITIONS)
    rdds = [seeds.mapPartitionsWithIndex(_load(case["keys"]))]
    rdds += [seeds.mapPartitionsWithIndex(_hot(case["updates"], b)) for b in range(1, total)]
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(os.path.join(tmp, "ckpt"))
    updated = ssc.queueStream(rdds).track(init_key, update_key, "1h", PARTITIONS, timers=on_timer,
                                          emit="updated")
    updated.checkpoint(10)
    counts: list[int] = []
    updated.foreachRDD(lambda rdd: counts.append(rdd.count()))
    ssc.start()
    try:
        for b in range(1, total + 1):
            clock.set_time(b * 1000)
            ssc.awaitBatch(b * 1000, 3600)
        infos = sorted((i for i in ssc.batchInfos() if i.processing_end_time_ms is not None),
                       key=lambda i: i.batch_time_ms)
        moved = [n.backend.switched_at for n in ssc._graph.nodes if hasattr(getattr(n, "backend", None), "switched_at")]
    finally:
        ssc.stop(stopSparkContext=False)
        peaks = memory.peaks()
        memory.stop()
        sc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    proc = [i.processing_delay_ms / 1000.0 for i in infos]
    measured = proc[1 + case["warmup"]:]
    return {**case, "first_batch_s": round(proc[0], 3) if proc else None,
            "median_processing_s": round(_median(measured), 3) if measured else None,
            "p95_processing_s": round(_p95(measured), 3) if measured else None,
            "updated_keys_last_batch": counts[-1] if counts else None, "memory_peak_mb": peaks,
            "batches_measured": len(measured),
            "moved_to_store_at_batch": (moved[0] // 1000 if moved and moved[0] is not None else None)}


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.track_state", "--child", json.dumps(case)],
                          cwd=ROOT.parent, capture_output=True, text=True, timeout=case["timeout_s"])
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return {**json.loads(line[len(MARKER):]), "load_average_start": round(load, 2)}
    tail = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "Exception" in ln][-1:]
    return {**case, "failed": f"child exited {proc.returncode}", "reason": tail[0][:300] if tail else None,
            "load_average_start": round(load, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    ap.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    ap.add_argument("--updates", type=int, default=100_000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(MARKER + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    results = []
    for keys in args.sizes:
        for engine in args.engines:  # side by side, size by size
            case = {"engine": engine, "keys": keys, "updates": args.updates, "warmup": args.warmup,
                    "batches": args.batches, "driver_memory": args.driver_memory,
                    "timeout_s": 600 + keys / 2000}
            r = run_case(case)
            results.append(r)
            print(f"{keys:>12,} {engine:>6}: first batch {r.get('first_batch_s')} s, median "
                  f"{r.get('median_processing_s')} s, p95 {r.get('p95_processing_s')} s"
                  + (f"  FAILED {r.get('failed')}: {r.get('reason')}" if r.get("failed") else ""), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.track_state " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.out).write_text(json.dumps({"command": command, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
