"""Recovery from faults: per-batch processing time around an executor loss, and with a straggler.

Run from the repository root::

    python -m benchmarks.recovery            # full run (a few minutes)
    python -m benchmarks.recovery --quick    # short run (about 2-3 minutes on 2 cores)
    python -m benchmarks.recovery --skip-straggler --intervals 2,10

1. **Executor loss** (``local-cluster[2,1,1024]``, one application): for each checkpoint interval of
   ``--intervals`` (default 2 s, 10 s, 30 s) a fresh StreamingContext runs a stateful windowed pipeline
   over the generator source (``runningReduce`` and an invertible ``reduceByKeyAndWindow`` over 5 s, both
   checkpointed every interval) on a ManualClock, one 1 s batch at a time. After batch ``--kill-after``
   one executor JVM is SIGKILLed (``recovery.faults.kill_executor``); the run goes on to ``--batches``.
   Each batch is labelled ``before`` (up to the kill), ``during`` (the application has fewer executors
   than it started with: Spark recomputes the lost state partitions from lineage since the last
   checkpoint, on the surviving executor) or ``after`` (the replacement executor registered).
2. **Straggler** (a Spark standalone cluster on 127.0.0.1 with workers on 127.0.0.2 and 127.0.0.3, as
   started by ``tests/standalone_cluster.py``): the driver of ``tests/straggler_app.py`` runs a stateful
   windowed pipeline without a straggler, with one (every task of the slowed stage on executor 0 sleeps
   ``--slow-seconds``) and speculation on (dstreams' default), and with one and ``spark.speculation=false``.

Every processing time is the engine's own metric (``BatchInfo.processing_delay_ms``). Prints a short
table, writes everything to ``benchmarks/results/recovery.json`` and, when matplotlib is installed, the
figure ``benchmarks/results/recovery.png`` (per-batch processing time vs batch, one line per checkpoint
interval, the failure marked; a second panel for the straggler runs).
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
LOSS_MASTER = "local-cluster[2,1,1024]"
EXECUTORS = 2


# ---------------------------------------------------------------------------------------------- helpers
def _poll(cond: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def _executor_ids(sc: Any) -> list[str]:
    ids = sc._jsc.sc().getExecutorIds().mkString(",")
    return sorted(x for x in ids.split(",") if x)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------- executor loss
def _build_loss_pipeline(sc: Any, clock: Any, checkpoint: str, interval_s: int, records: int) -> Any:
    """Generator lines -> words -> runningReduce + invertible 5 s window, both checkpointed every interval."""
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    words = ssc.generatorStream(records, 4, seed=5).flatMap(lambda line: line.split()).map(lambda w: (w, 1))
    counts = words.runningReduce(operator.add, numPartitions=4).checkpoint(f"{interval_s}s")
    window = words.reduceByKeyAndWindow(operator.add, operator.sub, "5s", "1s", numPartitions=4,
                                        filterFunc=lambda kv: kv[1] > 0).checkpoint(f"{interval_s}s")
    counts.foreachRDD(lambda rdd: rdd.count())
    window.foreachRDD(lambda rdd: rdd.count())
    return ssc


def run_executor_loss(sc: Any, interval_s: int, batches: int, kill_after: int, records: int, work: str,
                      timeout: float) -> dict[str, Any]:
    """One run of the loss pipeline with checkpoint interval ``interval_s``; an executor dies after ``kill_after``."""
    from dstreams import ManualClock
    from dstreams.recovery import faults

    _poll(lambda: len(_executor_ids(sc)) >= EXECUTORS, timeout, f"{EXECUTORS} executors")
    sc.parallelize(range(16), 16).map(lambda x: x).collect()  # warm every executor's Python workers
    clock = ManualClock(0)
    ssc = _build_loss_pipeline(sc, clock, os.path.join(work, f"checkpoint-{interval_s}s"), interval_s, records)
    run: dict[str, Any] = {"checkpoint_interval_s": interval_s, "kill_after_batch": kill_after, "batches": []}
    killed: str | None = None
    recovered = False
    ssc.start()
    try:
        for i in range(1, batches + 1):
            t = i * 1000
            if killed is not None and not recovered:
                ids = _executor_ids(sc)
                recovered = len(ids) >= EXECUTORS and killed not in ids
            phase = "before" if i <= kill_after else ("after" if recovered else "during")
            clock.set_time(t)
            info = ssc.awaitBatch(t, timeout)
            if info.failed:
                raise RuntimeError(f"batch {t} failed: {info.output_operations}")
            run["batches"].append({"batch": i, "t": t, "processing_ms": info.processing_delay_ms, "phase": phase})
            print(f"  interval {interval_s:>2} s  batch {i:>3}  {info.processing_delay_ms:>6} ms  {phase}", flush=True)
            if i == kill_after:
                pids = faults.executor_pids(sc.applicationId)
                pid = faults.kill_executor(sc)
                killed = next(k for k, v in pids.items() if v == pid)
                _poll(lambda p=pid: not faults.pid_alive(p), timeout, f"executor pid {pid} to die")
                run.update(killed_executor=killed, killed_pid=pid)
    finally:
        ssc.stop(stopSparkContext=False)
    by_phase = {p: [b["processing_ms"] for b in run["batches"] if b["phase"] == p]
                for p in ("before", "during", "after")}
    before = _median(by_phase["before"][2:] or by_phase["before"])  # the first batches warm up
    after_kill = [b["processing_ms"] for b in run["batches"] if b["batch"] > kill_after]
    run["summary"] = {
        "median_before_ms": before,
        "first_after_kill_ms": after_kill[0] if after_kill else None,
        "median_during_ms": _median(by_phase["during"]),
        "median_after_ms": _median(by_phase["after"]),
        "batches_during": len(by_phase["during"]),
        "lineage_batches_at_kill": kill_after % interval_s,
        "extra_ms_after_kill": (sum(max(x - before, 0) for x in after_kill) if before is not None else None),
    }
    # Let the replacement executor come before the next run (bounded).
    try:
        _poll(lambda: len(_executor_ids(sc)) >= EXECUTORS and killed not in _executor_ids(sc), timeout,
              "the replacement executor")
    except TimeoutError as e:
        run["summary"]["warning"] = str(e)
    return run


def executor_loss(args: argparse.Namespace, work: str) -> list[dict[str, Any]]:
    from dstreams.spark.sparkconf import create_spark_context

    local_dir = os.path.join(work, "spark-local")
    os.makedirs(local_dir, exist_ok=True)
    tmp_opt = f"-Djava.io.tmpdir={local_dir}"
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": tmp_opt,
        "spark.executor.extraJavaOptions": tmp_opt,
        "spark.executor.memory": "512m",
        "spark.default.parallelism": "4",
    }
    sc = create_spark_context(LOSS_MASTER, "dstreams-recovery-benchmark", conf)
    runs = []
    try:
        for interval in args.intervals:
            print(f"executor loss, checkpoint interval {interval} s ({LOSS_MASTER})", flush=True)
            runs.append(run_executor_loss(sc, interval, args.batches, args.kill_after, args.records,
                                          work, args.timeout))
    finally:
        sc.stop()
    return runs


# -------------------------------------------------------------------------------------------- straggler
def straggler(args: argparse.Namespace, work: str) -> dict[str, Any]:
    """Run tests/straggler_app.py's driver against a fresh standalone cluster; its per-batch metrics."""
    sys.path.insert(0, str(ROOT))
    from tests.standalone_cluster import ClusterStartError, ClusterUnavailableError, StandaloneCluster

    cluster = StandaloneCluster(Path(work) / "cluster")
    try:
        cluster.start(args.timeout)
    except ClusterUnavailableError as e:
        print(f"straggler case skipped: {e}")
        return {"skipped": str(e)}
    except ClusterStartError as e:
        print(f"straggler case failed: the standalone cluster did not start\n{e}")
        return {"error": str(e)}
    out = os.path.join(work, "straggler")
    os.makedirs(out, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTREAMS_FAULT_")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, str(ROOT / "tests" / "straggler_app.py"), out, "--master", cluster.master_url,
           "--batches", str(args.straggler_batches), "--slow-seconds", str(args.slow_seconds),
           "--timeout", str(args.timeout)]
    print(f"straggler: {cluster.master_url}, {args.straggler_batches} batches per phase, executor 0's tasks "
          f"sleep {args.slow_seconds} s", flush=True)
    try:
        proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True,
                              timeout=args.timeout * 6, start_new_session=True)
    finally:
        cluster.stop()
    try:
        with open(os.path.join(out, "status.json")) as f:
            status = json.load(f)
    except (OSError, ValueError):
        status = {}
    if proc.returncode != 0 or not status.get("ok"):
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return {"error": f"straggler driver failed (exit {proc.returncode})"}
    series = {}
    for app, key in (("speculation", "baseline"), ("speculation", "straggler"), ("no-speculation", "straggler")):
        phase = next(p for p in status["apps"][app]["phases"] if p["name"] == key)
        label = "no straggler" if key == "baseline" else f"straggler, {app.replace('-', ' ')}"
        series[label] = {"processing_ms": [b["processing_ms"] for b in phase["batches"]],
                         "median_ms": phase["median_ms"], "task_attempts": phase["attempts"]}
    base = series["no straggler"]["median_ms"]
    return {
        "slow_seconds": args.slow_seconds,
        "speculation_conf": status["apps"]["speculation"]["speculation_conf"],
        "series": series,
        "ratio_speculation": series["straggler, speculation"]["median_ms"] / base,
        "ratio_no_speculation": series["straggler, no speculation"]["median_ms"] / base,
    }


# ------------------------------------------------------------------------------------------------ output
def _plot(doc: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]): no figure, JSON only")
        return False
    strag = doc.get("straggler") or {}
    panels = 2 if strag.get("series") else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    kill = None
    for run in doc["executor_loss"]:
        xs = [b["batch"] for b in run["batches"]]
        ys = [b["processing_ms"] / 1000 for b in run["batches"]]
        ax.plot(xs, ys, marker=".", label=f"{run['checkpoint_interval_s']} s checkpoints")
        kill = run["kill_after_batch"]
    if kill is not None:
        ax.axvline(kill + 0.5, color="red", linestyle="--", linewidth=1)
        ax.annotate("executor killed", xy=(kill + 0.5, ax.get_ylim()[1] * 0.95), color="red", fontsize=8,
                    ha="left")
    ax.set_xlabel("batch (1 s interval)")
    ax.set_ylabel("processing time (s)")
    ax.set_title(f"Executor loss, {LOSS_MASTER}")
    ax.legend(fontsize=8)
    if panels == 2:
        ax2 = axes[0][1]
        for label, s in strag["series"].items():
            ax2.plot(range(1, len(s["processing_ms"]) + 1), [x / 1000 for x in s["processing_ms"]], marker=".",
                     label=f"{label} (median {s['median_ms'] / 1000:.2f} s)")
        ax2.set_xlabel("batch")
        ax2.set_ylabel("processing time (s)")
        ax2.set_title(f"Straggler (executor 0 tasks +{strag['slow_seconds']:g} s), standalone")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _print_table(doc: dict[str, Any]) -> None:
    print()
    print(f"{'checkpoint':>10} {'lineage':>7} {'before':>8} {'1st after':>9} {'during':>8} {'#during':>7} "
          f"{'after':>8} {'extra':>8}   (ms; medians unless noted)")
    for run in doc["executor_loss"]:
        s = run["summary"]
        print(f"{run['checkpoint_interval_s']:>9}s {s['lineage_batches_at_kill']:>7} {_fmt(s['median_before_ms']):>8} "
              f"{_fmt(s['first_after_kill_ms']):>9} {_fmt(s['median_during_ms']):>8} {s['batches_during']:>7} "
              f"{_fmt(s['median_after_ms']):>8} {_fmt(s['extra_ms_after_kill']):>8}")
    strag = doc.get("straggler") or {}
    if strag.get("series"):
        print()
        base = strag["series"]["no straggler"]["median_ms"]
        for label, s in strag["series"].items():
            print(f"{label:<28} median {s['median_ms']:>7.0f} ms  {s['median_ms'] / base:5.2f}x  "
                  f"speculative attempts {s['task_attempts']['speculative']}")
    elif strag:
        print(f"straggler: {strag.get('skipped') or strag.get('error')}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run: fewer batches and records")
    p.add_argument("--intervals", type=_ints, default=[2, 10, 30], help="checkpoint intervals, seconds")
    p.add_argument("--batches", type=int, help="batches per executor-loss run (default 40, quick 18)")
    p.add_argument("--kill-after", type=int, help="kill an executor after this batch (default 29, quick 13)")
    p.add_argument("--records", type=int, help="generator lines per partition per batch (default 3000, quick 1000)")
    p.add_argument("--straggler-batches", type=int, help="batches per straggler phase (default 10, quick 5)")
    p.add_argument("--slow-seconds", type=float, default=2.0, help="sleep of each straggler task")
    p.add_argument("--skip-straggler", action="store_true")
    p.add_argument("--skip-loss", action="store_true")
    p.add_argument("--timeout", type=float, default=90.0, help="bound of every wait, seconds")
    p.add_argument("--output", type=Path, default=RESULTS / "recovery.json")
    args = p.parse_args(argv)
    defaults = (18, 13, 1000, 5) if args.quick else (40, 29, 3000, 10)
    args.batches = args.batches or defaults[0]
    args.kill_after = args.kill_after or defaults[1]
    args.records = args.records or defaults[2]
    args.straggler_batches = args.straggler_batches or defaults[3]
    if not 0 < args.kill_after < args.batches:
        raise SystemExit("--kill-after must be between 1 and --batches - 1")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    import pyspark

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="dstreams-recovery-bench-")
    doc: dict[str, Any] = {
        "benchmark": "recovery",
        "command": " ".join(["python -m benchmarks.recovery", *(sys.argv[1:] if argv is None else argv)]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "params": {"intervals_s": args.intervals, "batches": args.batches, "kill_after": args.kill_after,
                   "records_per_partition": args.records, "partitions": 4, "batch_interval_s": 1,
                   "straggler_batches": args.straggler_batches, "slow_seconds": args.slow_seconds},
        "executor_loss": [],
        "straggler": None,
    }
    try:
        if not args.skip_loss:
            doc["executor_loss"] = executor_loss(args, work)
        if not args.skip_straggler:
            doc["straggler"] = straggler(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    _print_table(doc)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, args.output)
    print(f"wrote {args.output}")
    if doc["executor_loss"] or (doc["straggler"] or {}).get("series"):
        png = args.output.with_suffix(".png")
        if _plot(doc, png):
            print(f"wrote {png}")
    print(f"elapsed {doc['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
