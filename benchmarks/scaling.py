"""What one batch costs the driver and the checkpoint store as the cluster grows (issue 42, item 7).

Run from the repository root::

    python -m benchmarks.scaling                 # both parts below, the full grid (about 30-60 min on 2 cores)
    python -m benchmarks.scaling --quick         # a small grid (a few minutes)
    python -m benchmarks.scaling --part driver   # part A only (minutes)

One process, one SparkContext (``tuned_conf``, ``local[2]``, the executor state store with its changelog on,
checkpoints in a local folder). A configuration ``(P partitions, S streams)`` runs ``S`` streams, each a generator
source of ``P`` partitions with ``--records`` tiny records per partition and batch, a ``runningReduce`` into ``P``
state partitions and one output of the batch's changes, on a manual clock, one batch at a time (the next once the
previous completed), 1 s batches. The data is tiny on purpose: what is measured is what a batch costs the driver
and the store as the partitions and streams it schedules grow, not records.

**Part A, the driver alone** (grid ``P`` in 8, 64, 512, 2048 x ``S`` in 1, 5, 20): the output does not run a Spark
job (``changes().foreachRDD`` with a function that does nothing with the RDD) and the state checkpoint interval is
longer than the run, so a batch is exactly the driver's per-batch work: generating the batch (every stream's RDDs
built through Py4J, the job closures, the metadata log record written), running the outputs (here no job), and
clearing old metadata (unpersisting RDDs that left the remember window). No task runs, so 2,048 partitions x 20
streams costs what the driver's work costs. Per batch (medians over ``--batches`` after ``--warmup``):

* ``generation_ms``: the engine building the batch (``BatchInfo.generation_ms``);
* ``engine_ms``: generation + processing + clean-up, the driver's whole per-batch time;
* ``driver_cpu_ms``: CPU time of the driver's Python process over the batch (all its threads; no Python worker
  runs, and they are separate processes anyway);
* ``py4j_calls``: round trips to the JVM over the batch, on all threads;
* ``objects_per_batch``: files the batch created or rewrote in the checkpoint folder (the metadata log), i.e. the
  PUT requests it would make on S3.

Then, per stream count, a least-squares slope of ``log(engine_ms)`` (and of the CPU and the Py4J calls) against
``log(P)`` (1 = linear; the check is "no per-batch driver step grows faster than the partitions it schedules":
slope <= 1.1, :data:`LINEAR_TOLERANCE`) and the ratio ``engine_ms(2048) / engine_ms(512)`` next to the
partitions' ratio 4; and the same against ``S`` at each ``P``.

**Part B, whole batches** (default ``P`` in 8, 64, 512 x 1 and ``P`` 8 x ``S`` in 5, 20; ``--run-configs`` adds
e.g. ``2048:1``): the output counts the batch's changes (one Spark job of ``P x S`` tasks after the shuffle of
``P x S`` map tasks), state checkpoints every ``--checkpoint-every`` batches. Per batch: the same figures as part A
plus ``processing_ms`` (its tasks all run on this machine's 2 cores: this grows with ``P x S``, and would not on a
cluster whose cores grow with the partitions), ``driver_jvm_cpu_ms`` (CPU of the driver JVM's scheduling threads:
the DAG scheduler, the RPC dispatchers, which in ``local`` mode also launch the tasks, the task-result getters, the
listener bus and the Py4J gateway threads; read from ``/proc``, Linux only; the executor threads of ``local`` mode
and the JVM's GC threads are left out), both also per task, and ``objects_per_batch`` split into metadata log,
checkpoint data and state changelog, on average over whole checkpoint cycles (a checkpoint's files are written
after its batch completes). Over the configurations, the driver's CPU per batch is fitted as a fixed part plus a
part per task (least squares), with the log-log slope against the tasks per batch as the linearity check.

Then the PUT requests per second that the objects per batch make at 1 s batches and their cost per day on S3
(``--put-price`` dollars per 1,000 PUTs, default S3 Standard's 0.005), measured for part B and, for every part A
configuration, from the per-object counts part B measured (metadata: what part A measured; changelog: one object
per state partition and batch; checkpoint: one data file per state partition plus one manifest per stream every
``--checkpoint-every`` batches). Prints tables and writes ``benchmarks/results/scaling.json`` (with ``--part run``:
``scaling_runs.json``, so that a long part B run keeps part A's results).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .generation import Py4JCounter

RESULTS = Path(__file__).resolve().parent / "results" / "scaling.json"
#: Where ``--part run`` writes (part B alone takes long: it keeps part A's file).
RESULTS_RUNS = RESULTS.with_name("scaling_runs.json")
INTERVAL_MS = 1000
DRIVER_GRID = [(p, s) for s in (1, 5, 20) for p in (8, 64, 512, 2048)]
DRIVER_QUICK = [(8, 1), (64, 1), (512, 1), (2048, 1), (8, 5), (8, 20)]
RUN_GRID = [(8, 1), (64, 1), (512, 1), (8, 5), (8, 20)]
RUN_QUICK = [(8, 1), (64, 1), (8, 5)]
#: A log-log slope above this is reported as growing faster than linearly: 1 plus room for timing noise (the
#: Py4J counts are exact, but a per-stream count with a small fixed part fits a slope of 1.00-1.05).
LINEAR_TOLERANCE = 1.1
#: A checkpoint interval longer than any part A run: no state checkpoint (a Spark job) happens.
NO_CHECKPOINT_S = 100_000
#: Native thread names (``/proc/<pid>/task/<tid>/comm``, 15 characters) of the driver JVM's scheduling threads.
DRIVER_THREADS = ("dag-scheduler-e", "dispatcher-even", "dispatcher-Bloc", "dispatcher-Heal", "task-result-get",
                  "spark-listener-", "Thread-")


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: its modification time (ns) and size."""
    out: dict[str, tuple[int, int]] = {}
    for p in root.rglob("*"):
        try:
            st = p.stat()
        except OSError:
            continue  # deleted meanwhile
        if p.is_file():
            out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return out


def _written(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> set[str]:
    """Files created or rewritten (an overwrite is a PUT on S3 too) between two :func:`_files`."""
    return {name for name, stamp in after.items() if before.get(name) != stamp}


def _kind(name: str) -> str:
    if name.startswith("changelogs/"):
        return "changelog"
    if name.startswith("meta/"):
        return "metadata"
    return "checkpoint"


def _split(names: set[str]) -> dict[str, int]:
    out = {"metadata": 0, "checkpoint": 0, "changelog": 0}
    for n in names:
        out[_kind(n)] += 1
    return out


def _split_sum(batches: list[set[str]]) -> dict[str, int]:
    """:func:`_split` summed over batches (a file rewritten by several batches counts once per batch)."""
    out = {"metadata": 0, "checkpoint": 0, "changelog": 0}
    for names in batches:
        for kind, n in _split(names).items():
            out[kind] += n
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _count_changes(rdd: Any) -> None:
    rdd.count()


def _no_job(rdd: Any) -> None:
    """An output that runs no Spark job: the batch is the driver's work alone (part A)."""


class JvmThreadsCpu:
    """CPU time (ms) of the driver JVM's scheduling threads (:data:`DRIVER_THREADS`), from ``/proc``; None where
    the JVM's process is not known or ``/proc`` is not there."""

    def __init__(self, sc: Any) -> None:
        proc = getattr(sc._gateway, "proc", None)
        pid = getattr(proc, "pid", None)
        self.pid: int | None = pid if pid is not None and os.path.isdir(f"/proc/{pid}/task") else None
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def sample(self) -> dict[int, float] | None:
        if self.pid is None:
            return None
        out: dict[int, float] = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                if not name.startswith(DRIVER_THREADS):
                    continue
                with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(fields[11]) + int(fields[12])) * 1000.0 / self.tick  # utime + stime
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended meanwhile
        return out

    @staticmethod
    def delta(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
        if before is None or after is None:
            return None
        return sum(v - before.get(tid, 0.0) for tid, v in after.items())


def _build(sc: Any, clock: Any, folder: Path, partitions: int, streams: int, records: int, every_s: float,
           output: Any) -> Any:
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, INTERVAL_MS / 1000.0, clock=clock)
    ssc.checkpoint(str(folder / "ckpt"))
    for s in range(streams):
        lines = ssc.generatorStream(records, partitions, seed=s)
        state = lines.map(lambda line: (hash(line) % 1000, 1)).runningReduce(lambda a, b: a + b, partitions)
        state.checkpoint(every_s)
        state.changes().foreachRDD(output)
    return ssc


def _run_batches(sc: Any, ssc: Any, clock: Any, root: Path, batches: int, settle_s: float) -> dict[str, dict[int, Any]]:
    """Run ``batches`` batches one at a time; per batch: Py4J calls, Python CPU ms, driver JVM threads' CPU ms,
    wall s, the files it created or rewrote."""
    counter = Py4JCounter(sc, "", False)  # every thread of this process
    jvm = JvmThreadsCpu(sc)
    out: dict[str, dict[int, Any]] = {"calls": {}, "cpu": {}, "jvm": {}, "wall": {}, "created": {}}
    ssc.start()
    try:
        seen = _files(root)
        for k in range(1, batches + 1):
            before_calls = counter.calls
            before_cpu = time.process_time()
            before_jvm = jvm.sample()
            started = time.perf_counter()
            clock.set_time(k * INTERVAL_MS)
            ssc.awaitBatch(k * INTERVAL_MS, 1800)
            out["wall"][k] = time.perf_counter() - started
            out["cpu"][k] = (time.process_time() - before_cpu) * 1000.0
            out["jvm"][k] = JvmThreadsCpu.delta(before_jvm, jvm.sample())
            out["calls"][k] = counter.calls - before_calls
            if settle_s:
                time.sleep(settle_s)  # a checkpoint's files are written after its batch completes
            now = _files(root)
            out["created"][k] = _written(seen, now)
            seen = now
    finally:
        counter.close()
        ssc.stop(stopSparkContext=False)
        _await_no_jobs(sc, 120.0)
    return out


def _await_no_jobs(sc: Any, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until no Spark job runs."""
    deadline = time.monotonic() + timeout
    while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)


def _remove_when_quiet(folder: Path, timeout: float = 60.0) -> None:
    """Remove ``folder`` once nothing has been written in it for 2 s (at most ``timeout`` s): the tasks of a
    checkpoint that the stop cancelled still write their part files, which would recreate a folder removed
    before they finish."""
    deadline = time.monotonic() + timeout
    last = _files(folder) if folder.exists() else {}
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 2.0:
        time.sleep(0.5)
        now = _files(folder) if folder.exists() else {}
        if now != last:
            last, quiet_since = now, time.monotonic()
    shutil.rmtree(folder, ignore_errors=True)


def _engine_ms(info: Any) -> float:
    return float(info.generation_ms or 0.0) + float(info.processing_delay_ms or 0) + float(info.cleanup_ms or 0.0)


def measure_driver(sc: Any, partitions: int, streams: int, records: int, warmup: int,
                   batches: int) -> dict[str, Any]:
    """Part A: one configuration, the driver's per-batch work alone (module doc)."""
    from dstreams import ManualClock

    folder = Path(tempfile.mkdtemp(prefix="dstreams-scaling-"))
    clock = ManualClock()
    try:
        ssc = _build(sc, clock, folder, partitions, streams, records, NO_CHECKPOINT_S, _no_job)
        runs = _run_batches(sc, ssc, clock, folder / "ckpt", warmup + batches, 0.0)
    finally:
        _remove_when_quiet(folder)
    infos = {i.batch_time_ms // INTERVAL_MS: i for i in ssc.batchInfos()}
    ks = [k for k in range(warmup + 1, warmup + batches + 1) if k in infos]
    kinds = _split_sum([runs["created"][k] for k in ks])
    return {
        "partitions": partitions,
        "streams": streams,
        "batches_measured": len(ks),
        "generation_ms_p50": _median([float(infos[k].generation_ms or 0.0) for k in ks]),
        "engine_ms_p50": _median([_engine_ms(infos[k]) for k in ks]),
        "driver_cpu_ms_p50": _median([runs["cpu"][k] for k in ks]),
        "py4j_calls_p50": _median([float(runs["calls"][k]) for k in ks]),
        "objects_per_batch": {kind: n / len(ks) for kind, n in kinds.items()},
    }


def measure_run(sc: Any, partitions: int, streams: int, records: int, batches: int, every: int) -> dict[str, Any]:
    """Part B: one configuration, whole batches (module doc)."""
    from dstreams import ManualClock

    folder = Path(tempfile.mkdtemp(prefix="dstreams-scaling-"))
    clock = ManualClock()
    try:
        ssc = _build(sc, clock, folder, partitions, streams, records, every * INTERVAL_MS / 1000.0, _count_changes)
        runs = _run_batches(sc, ssc, clock, folder / "ckpt", batches, 0.2)
    finally:
        _remove_when_quiet(folder)
    infos = {i.batch_time_ms // INTERVAL_MS: i for i in ssc.batchInfos()}
    created = runs["created"]
    # Whole checkpoint cycles after the first checkpoint (batch ``every``), shifted by one batch: a checkpoint's
    # files land while the batch after it runs.
    first = every + 2
    cycles = max(1, (batches - first + 1) // every)
    window = [k for k in range(first, first + cycles * every) if k in created]
    plain = [k for k in window if k % every != 0 and k in infos]
    tasks = 2 * partitions * streams  # per stream: P shuffle-map tasks, P result tasks of the output's job
    totals = _split_sum([created[k] for k in window])
    jvm = [runs["jvm"][k] for k in plain if runs["jvm"][k] is not None]
    cpu = _median([runs["cpu"][k] for k in plain])
    jvm_cpu = _median(jvm) if jvm else None
    row: dict[str, Any] = {
        "partitions": partitions,
        "streams": streams,
        "tasks_per_batch": tasks,
        "batches_measured": len(plain),
        "cycle_batches": len(window),
        "generation_ms_p50": _median([float(infos[k].generation_ms or 0.0) for k in plain]),
        "engine_ms_p50": _median([_engine_ms(infos[k]) - _outputs_ms(infos[k]) for k in plain]),
        "py4j_calls_p50": _median([float(runs["calls"][k]) for k in plain]),
        "processing_ms_p50": _median([float(infos[k].processing_delay_ms or 0) for k in plain]),
        "driver_cpu_ms_p50": cpu,
        "driver_jvm_cpu_ms_p50": jvm_cpu,
        "wall_s_p50": _median([runs["wall"][k] for k in plain]),
        "objects_per_batch": {kind: n / len(window) for kind, n in totals.items()},
    }
    row["driver_cpu_ms_per_task"] = cpu / tasks
    if jvm_cpu is not None:
        row["driver_jvm_cpu_ms_per_task"] = jvm_cpu / tasks
    return row


def _outputs_ms(info: Any) -> float:
    return float(sum(op.end_time_ms - op.start_time_ms for op in info.output_operations.values()
                     if op.start_time_ms is not None and op.end_time_ms is not None))


def cost(objects_per_batch: float, put_price: float, interval_s: float = 1.0) -> dict[str, float]:
    """PUTs per second at ``interval_s`` batches and their cost per day."""
    puts_per_s = objects_per_batch / interval_s
    return {"puts_per_s": puts_per_s, "dollars_per_day": puts_per_s * 86400 / 1000 * put_price}


def modelled_objects(partitions: int, streams: int, metadata: float, every: int) -> dict[str, float]:
    """Objects per batch of a whole run (module doc): the metadata part A measured, one changelog object per state
    partition and batch, and every ``every`` batches one data file per state partition plus a manifest per stream."""
    return {"metadata": metadata, "changelog": float(partitions * streams),
            "checkpoint": streams * (partitions + 1) / every}


def fit_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``log(y)`` against ``log(x)`` (1: proportional); None with fewer than 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else None


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares ``y = a + b x``: ``(a, b)``; None with fewer than 2 distinct ``x``."""
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def per_task(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Part B: the driver's CPU per batch against the tasks per batch, as a fixed part plus a part per task
    (:func:`linear_fit`), and the log-log slope (:func:`fit_slope`)."""
    out: dict[str, Any] = {}
    for key in ("driver_cpu_ms_p50", "driver_jvm_cpu_ms_p50"):
        pts = [(float(r["tasks_per_batch"]), float(r[key])) for r in rows if r.get(key) is not None]
        fit = linear_fit([p[0] for p in pts], [p[1] for p in pts])
        slope = fit_slope([p[0] for p in pts], [p[1] for p in pts])
        out[key] = {"ms_per_batch": fit[0] if fit else None, "ms_per_task": fit[1] if fit else None,
                    "loglog_slope": slope, "faster_than_linear": slope is not None and slope > LINEAR_TOLERANCE}
    return out


def growth(rows: list[dict[str, Any]], key: str = "engine_ms_p50") -> list[dict[str, Any]]:
    """Per stream count, how ``key`` grows with the partitions; per partition count, with the streams."""
    out: list[dict[str, Any]] = []
    for by, other in (("partitions", "streams"), ("streams", "partitions")):
        for fixed in sorted({r[other] for r in rows}):
            pts = sorted((r[by], r[key]) for r in rows if r[other] == fixed)
            if len(pts) < 2:
                continue
            slope = fit_slope([p[0] for p in pts], [p[1] for p in pts])
            (x0, y0), (x1, y1) = pts[-2], pts[-1]
            out.append({"grows_with": by, other: fixed, "points": len(pts), "slope": slope,
                        "last_ratio": y1 / y0 if y0 else None, "last_size_ratio": x1 / x0,
                        "faster_than_linear": slope is not None and slope > LINEAR_TOLERANCE})
    return out


def _print_driver(row: dict[str, Any]) -> None:
    print(f"{row['partitions']:5d} {row['streams']:3d} {row['generation_ms_p50']:9.1f} {row['engine_ms_p50']:10.1f} "
          f"{row['driver_cpu_ms_p50']:9.1f} {row['py4j_calls_p50']:6.0f} {sum(row['objects_per_batch'].values()):8.1f}",
          flush=True)


def _print_run(row: dict[str, Any]) -> None:
    ob = row["objects_per_batch"]
    jvm = row["driver_jvm_cpu_ms_p50"]
    print(f"{row['partitions']:5d} {row['streams']:3d} {row['tasks_per_batch']:6d} {row['generation_ms_p50']:9.1f} "
          f"{row['engine_ms_p50']:10.1f} {row['driver_cpu_ms_p50']:9.1f} "
          f"{(f'{jvm:9.1f}' if jvm is not None else '      n/a')} {row['py4j_calls_p50']:6.0f} "
          f"{row['processing_ms_p50']:9.0f} {sum(ob.values()):9.1f} ({ob['metadata']:.1f}, {ob['checkpoint']:.1f}, "
          f"{ob['changelog']:.1f}) {row['puts_per_s']:8.1f} {row['dollars_per_day']:8.2f}", flush=True)


def _configs(text: str | None, default: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if not text:
        return default
    out = []
    for c in text.split(","):
        p, _, s = c.partition(":")
        out.append((int(p), int(s or 1)))
    return out


def _without_out(args: list[str]) -> list[str]:
    """The command's arguments without ``--out FILE`` (a path of the machine it ran on)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small grid for both parts")
    parser.add_argument("--part", choices=["driver", "run", "both"], default="both")
    parser.add_argument("--driver-configs", help="part A: P:S,P:S,... (default: the grid)")
    parser.add_argument("--run-configs", help="part B: P:S,P:S,... (default: 8, 64, 512 x 1 and 8 x 5, 20)")
    parser.add_argument("--records", type=int, default=2, help="records per partition and batch")
    parser.add_argument("--warmup", type=int, default=3, help="part A: batches before the measured ones")
    parser.add_argument("--batches", type=int, default=10, help="part A: measured batches per configuration")
    parser.add_argument("--run-batches", type=int, default=17, help="part B: batches per configuration (warm-up "
                        "and the first checkpoint included)")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="part B: batches between state checkpoints")
    parser.add_argument("--put-price", type=float, default=0.005, help="dollars per 1,000 PUT requests")
    parser.add_argument("--out", help=f"results file (default: {RESULTS.name} in benchmarks/results, "
                        f"{RESULTS_RUNS.name} with --part run)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    driver_configs = _configs(args.driver_configs, DRIVER_QUICK if args.quick else DRIVER_GRID)
    run_configs = _configs(args.run_configs, RUN_QUICK if args.quick else RUN_GRID)

    from dstreams.spark.sparkconf import create_spark_context

    local_dir = tempfile.mkdtemp(prefix="dstreams-scaling-stores-")
    sc = create_spark_context("local[2]", "dstreams-scaling-benchmark", {
        "spark.dstreams.state.store": "executor", "spark.dstreams.state.changelog": "on",
        "spark.dstreams.state.localDir": local_dir, "spark.ui.enabled": "false",
        "spark.dstreams.ui.enabled": "false"})
    driver_rows: list[dict[str, Any]] = []
    run_rows: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        if args.part in ("driver", "both"):
            print("Part A, the driver alone (no Spark job per batch): medians per batch", flush=True)
            print(f"{'P':>5} {'S':>3} {'build ms':>9} {'engine ms':>10} {'cpu ms':>9} {'py4j':>6} {'objects':>8}")
            for p, s in driver_configs:
                row = measure_driver(sc, p, s, args.records, args.warmup, args.batches)
                driver_rows.append(row)
                _print_driver(row)
        if args.part in ("run", "both"):
            print("Part B, whole batches (tasks on this machine's cores): medians per batch", flush=True)
            print(f"{'P':>5} {'S':>3} {'tasks':>6} {'build ms':>9} {'engine ms':>10} {'cpu ms':>9} {'jvm ms':>9} "
                  f"{'py4j':>6} {'batch ms':>9} {'objects (meta, ckpt, changelog)':>32} {'PUT/s':>8} {'$/day':>8}")
            for p, s in run_configs:
                row = measure_run(sc, p, s, args.records, args.run_batches, args.checkpoint_every)
                row.update(cost(sum(row["objects_per_batch"].values()), args.put_price))
                run_rows.append(row)
                _print_run(row)
    finally:
        sc.stop()
        shutil.rmtree(local_dir, ignore_errors=True)

    checks = {key: growth(driver_rows, key) for key in ("engine_ms_p50", "driver_cpu_ms_p50", "py4j_calls_p50")}
    if driver_rows:
        print("Growth of the driver's per-batch work (part A): log-log slope (1 = linear) and the last step's ratio")
        for key, rows in checks.items():
            for g in rows:
                fixed = "streams" if g["grows_with"] == "partitions" else "partitions"
                slope = "n/a" if g["slope"] is None else f"{g['slope']:.2f}"
                ratio = "n/a" if g["last_ratio"] is None else f"{g['last_ratio']:.2f}"
                print(f"  {key:18s} vs {g['grows_with']:10s} at {fixed} = {g[fixed]:<5d} slope {slope:>5s}, "
                      f"x{ratio} for x{g['last_size_ratio']:.0f} {g['grows_with']}"
                      f"{'  FASTER THAN LINEAR' if g['faster_than_linear'] else ''}")
        worst = [g for rows in checks.values() for g in rows if g["faster_than_linear"]]
        if not any(checks.values()):
            print("  (not checked: no two configurations share a stream count or a partition count)")
        elif worst:
            print(f"{len(worst)} series grow faster than linearly (above)")
        else:
            print("no per-batch driver step grows faster than the partitions or streams it schedules")
    tasks_fit = per_task(run_rows) if run_rows else {}
    for key, fit in tasks_fit.items():
        if fit["ms_per_task"] is not None:
            print(f"Part B, {key} against the tasks per batch: {fit['ms_per_batch']:.1f} ms per batch + "
                  f"{fit['ms_per_task']:.2f} ms per task, log-log slope {fit['loglog_slope']:.2f}"
                  f"{'  FASTER THAN LINEAR' if fit['faster_than_linear'] else ''}")
    modelled = []
    for row in driver_rows:
        objects = modelled_objects(row["partitions"], row["streams"], row["objects_per_batch"]["metadata"],
                                   args.checkpoint_every)
        modelled.append({"partitions": row["partitions"], "streams": row["streams"], "objects_per_batch": objects,
                         **cost(sum(objects.values()), args.put_price)})
    if modelled:
        print(f"Modelled store writes at 1 s batches, checkpoints every {args.checkpoint_every} batches "
              f"(S3 PUT ${args.put_price}/1,000)")
        for m in modelled:
            ob = m["objects_per_batch"]
            print(f"  P {m['partitions']:5d} S {m['streams']:3d}: {sum(ob.values()):9.1f} objects/batch "
                  f"(meta {ob['metadata']:.1f}, changelog {ob['changelog']:.0f}, checkpoint {ob['checkpoint']:.1f}) "
                  f"-> {m['puts_per_s']:9.1f} PUT/s, ${m['dollars_per_day']:,.0f}/day")
    print(f"took {time.monotonic() - started:.0f} s")
    if not args.no_write:
        out = Path(args.out) if args.out else RESULTS_RUNS if args.part == "run" else RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "command": " ".join(["python -m benchmarks.scaling", *_without_out(argv if argv is not None
                                                                              else sys.argv[1:])]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
            "interval_ms": INTERVAL_MS, "records_per_partition": args.records,
            "checkpoint_every": args.checkpoint_every, "put_price_per_1000": args.put_price,
            "driver_only": driver_rows, "growth": checks, "runs": run_rows, "runs_per_task": tasks_fit,
            "modelled_store_writes": modelled,
        }, indent=2, sort_keys=True))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
