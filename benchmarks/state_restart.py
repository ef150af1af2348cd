"""Driver restart with a large executor state store (issue 23): time from the restart to steady state.

Run from the repository root::

    python -m benchmarks.state_restart --keys 10000000            # the issue's size; about 4 min
    python -m benchmarks.state_restart --keys 1000000 --lose-stores

Contract:

* **Workload**: ``benchmarks.state``'s (1 s batches, ``updateStateByKey(add_counts, initialRDD=<keys keys>,
  updateIdleKeys=False)`` with ``spark.dstreams.state.store=executor``, 100,000 updates a batch on the hot set
  of 1,000 keys, the count of ``changes()`` as the output), checkpoints every 10 s to a local folder.
* **First driver** (a child process, ``local[2]``): runs until ``--batches-before`` batches after its first
  checkpoint after the zero time committed, then is killed with SIGKILL by this process (no clean stop: the
  stores keep the versions it applied after that checkpoint).
* ``--lose-stores`` removes the executors' store folder before the restart (a new machine): every store is read
  back from the checkpoint chain; otherwise the stores are rolled back to the checkpoint through their logs.
* **Second driver**: ``StreamingContext.getOrCreate`` on the same checkpoint; its first batches catch up the
  batches missed meanwhile. Measured: seconds from its process start to ``getOrCreate`` returning, to
  ``start()`` returning, to the end of its first batch; then the processing time of each batch after that.
  **Steady** is the first batch from which the processing time stays under the median of the first driver's
  batches x 1.5 + 100 ms and the scheduling delay under one interval; reported as how many batch intervals after
  the second driver's first batch that is (the issue's target: within 3).
* Prints a summary and writes ``benchmarks/results/state_restart.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "state_restart.json"
MARK = "RESTART_BENCH "


def _driver(args: argparse.Namespace) -> int:
    """One driver (a child process): prints ``MARK`` lines with its timings and batches."""
    t0 = time.monotonic()
    os.environ["DSTREAMS_STATE_STORE"] = "executor"
    os.environ["DSTREAMS_STATE_LOCAL_DIR"] = args.local_dir
    from dstreams import StreamingContext
    from dstreams.spark.sparkconf import create_spark_context

    from .state import PARTITIONS, SEED, UPDATES, _initial_rdd, add_counts, update_records

    sc = create_spark_context("local[2]", "bench-state-restart",
                              {"spark.driver.memory": "4g", "spark.ui.enabled": "false"})
    sc.setLogLevel("ERROR")
    counts: list[int] = []

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1)
        ssc.checkpoint(args.checkpoint)
        updates = ssc.generatorStream(UPDATES // PARTITIONS, PARTITIONS, seed=SEED,
                                      recordFunc=update_records(args.keys, "hot"))
        state = updates.updateStateByKey(add_counts, numPartitions=PARTITIONS, initialRDD=_initial_rdd(sc, args.keys),
                                         updateIdleKeys=False)
        state.checkpoint(10)
        state.changes().foreachRDD(lambda rdd: counts.append(rdd.count()))
        return ssc

    ssc = StreamingContext.getOrCreate(args.checkpoint, setup)
    t_created = time.monotonic() - t0
    ssc.start()
    t_started = time.monotonic() - t0
    print(MARK + json.dumps({"role": args.role, "created_s": round(t_created, 2), "started_s": round(t_started, 2)}),
          flush=True)
    seen: set[int] = set()
    deadline = time.monotonic() + args.run_s
    while time.monotonic() < deadline:
        for info in ssc.batchInfos():
            if info.processing_end_time_ms is None or info.batch_time_ms in seen:
                continue
            seen.add(info.batch_time_ms)
            print(MARK + json.dumps({"role": args.role, "batch_ms": info.batch_time_ms,
                                     "processing_ms": info.processing_delay_ms,
                                     "scheduling_ms": info.scheduling_delay_ms,
                                     "end_s": round(time.monotonic() - t0, 2)}), flush=True)
        time.sleep(0.2)
    ssc.stop(stopSparkContext=True, stopGraceFully=False)
    return 0


def _checkpoints(checkpoint: str) -> list[int]:
    times = set()
    for root, _, files in os.walk(os.path.join(checkpoint, "checkpoints")):
        if "MANIFEST.json" in files and "StoreUpdateStateNode" in root:
            times.add(int(os.path.basename(root)))
    return sorted(times)


def _run_child(args: argparse.Namespace, role: str, run_s: float, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "benchmarks.state_restart", "--child", role, "--keys", str(args.keys),
           "--checkpoint", args.checkpoint, "--local-dir", args.local_dir, "--run-s", str(run_s)]
    env = dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "wb"), env=env,  # noqa: SIM115
                            cwd=str(ROOT.parent), text=True, start_new_session=True)


def _read(proc: subprocess.Popen, until: Any, timeout: float) -> list[dict[str, Any]]:
    """The child's ``MARK`` rows, read by a thread, until ``until(rows)``, the child's exit or ``timeout``."""
    rows: list[dict[str, Any]] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(MARK):
                rows.append(json.loads(line[len(MARK):]))

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if until(list(rows)) or proc.poll() is not None:
            break
        time.sleep(0.2)
    return list(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.state_restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--batches-before", type=int, default=5, help="batches after the first checkpoint before the kill")
    p.add_argument("--after", type=float, default=40.0, help="seconds the second driver runs after its first batch")
    p.add_argument("--lose-stores", action="store_true", help="remove the executors' stores before the restart")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--child")
    p.add_argument("--checkpoint")
    p.add_argument("--local-dir")
    p.add_argument("--run-s", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.child:
        args.role = args.child
        return _driver(args)
    tmp = Path(tempfile.mkdtemp(prefix="bench-state-restart-"))
    args.checkpoint, args.local_dir = str(tmp / "checkpoint"), str(tmp / "stores")
    try:
        first = _run_child(args, "first", 900, tmp / "first.log")
        rows = _read(first, lambda rs: len(_checkpoints(args.checkpoint)) >= 2 and sum(
            1 for r in rs if "batch_ms" in r and r["batch_ms"] > _checkpoints(args.checkpoint)[1])
            >= args.batches_before, 900)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
        before = [r for r in rows if "batch_ms" in r]
        if len(_checkpoints(args.checkpoint)) < 2:
            raise SystemExit(f"the first driver committed no checkpoint after the zero time; log: {tmp / 'first.log'}")
        if args.lose_stores:
            shutil.rmtree(args.local_dir, ignore_errors=True)
        steady_before = statistics.median(r["processing_ms"] for r in before[5:]) if len(before) > 5 else None
        second = _run_child(args, "second", 900, tmp / "second.log")

        def done(rs: list[dict[str, Any]]) -> bool:
            ends = [x["end_s"] for x in rs if "batch_ms" in x]
            return bool(ends) and max(ends) > min(ends) + args.after

        second_rows = _read(second, done, args.after + 600)
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(60)
        timing = next((r for r in second_rows if "started_s" in r), {})
        if not any("batch_ms" in r for r in second_rows):
            raise SystemExit("the restarted driver completed no batch; its log ends with:\n"
                             + (tmp / "second.log").read_text(errors="replace")[-3000:])
        after = sorted((r for r in second_rows if "batch_ms" in r), key=lambda r: r["batch_ms"])
        bound = (steady_before or 0) * 1.5 + 100
        steady_at = None
        for i in range(len(after)):
            if all(r["processing_ms"] <= bound and r["scheduling_ms"] <= 1000 for r in after[i:]):
                steady_at = i
                break
        doc = {
            "benchmark": "state_restart",
            "command": " ".join(["python -m benchmarks.state_restart", *(argv or sys.argv[1:])]),
            "keys": args.keys, "lose_stores": args.lose_stores, "load_average": list(os.getloadavg()),
            "checkpoints_before_kill": _checkpoints(args.checkpoint)[:6],
            "first_driver_median_processing_ms": steady_before,
            "second_driver": timing,
            "first_batch_end_s": after[0]["end_s"] if after else None,
            "batches_after_restart": [{k: r[k] for k in ("batch_ms", "processing_ms", "scheduling_ms", "end_s")}
                                      for r in after],
            "steady_bound_ms": bound,
            "steady_after_batches": steady_at,
            "steady_after_s": (round(after[steady_at]["end_s"] - after[0]["end_s"], 2)
                               if steady_at is not None else None),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"keys {args.keys:,}, stores {'removed' if args.lose_stores else 'kept'}: getOrCreate "
              f"{timing.get('created_s')} s, start() {timing.get('started_s')} s, first batch done "
              f"{doc['first_batch_end_s']} s after the process started; steady (<= {bound:.0f} ms) from batch "
              f"{steady_at} after the first ({doc['steady_after_s']} s after it: the batches queued before the kill "
              f"and during the downtime caught up); processing ms: {[r['processing_ms'] for r in after[:12]]}")
        print(f"wrote {args.out}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
