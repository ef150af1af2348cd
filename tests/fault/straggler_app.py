"""The straggler pipeline, and (run as a script) a driver that measures it on a standalone cluster.

Pipeline (:func:`build`, kept cheap: one job of two stages per batch): deterministic generator source
(2 partitions of 8 words per 1 s batch) -> ``(word, 1)`` -> ``runningReduce`` (state, 2 partitions) ->
optionally ``mapPartitions(slowed_partition)`` (the fault-injection hook: a task sleeps when the installed fault
plan's slowdown, :mod:`dstreams.faults`, names the executor it runs on) -> ``saveAsTextFiles``. The slowed tasks are
the ones that write the text files, so their speculative copies show whether two attempts of one task
both commit output.

As a script (``python straggler_app.py OUT_DIR --master spark://...``) it runs, one after the other,
two applications on the given master, each on a ManualClock started at 0, one batch at a time:

1. ``speculation`` (dstreams' defaults: speculation on): phase ``baseline`` (no slowed stage, ``--batches``
   batches) then phase ``straggler`` (slowed stage: every task of it on executor ``--slow-executor``
   sleeps ``--slow-seconds``);
2. ``no-speculation`` (``spark.speculation=false``): phase ``straggler``.

Each phase is its own StreamingContext on the application's SparkContext. The driver writes the text
folders under ``OUT_DIR/<app>/<phase>/text`` and ``OUT_DIR/status.json``: per phase, the engine's batch
metrics (``BatchInfo.processing_delay_ms`` of every batch) and the task attempts (speculative, killed)
Spark's status store recorded for the phase's jobs. Exit 0 only if every batch completed without a
failed output operation.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from dstreams import ManualClock, StreamingContext
from dstreams.clock import Clock

EXECUTORS = 2


def records(seed: int, t: int, partition: int, n: int) -> list[str]:
    """Deterministic words of one generator partition of the batch at ``t`` ms."""
    return [f"w{(seed + t // 1000 * 7 + partition * 5 + i * i) % 11}" for i in range(n)]


def _slow_stage(rdd: Any) -> Any:
    from dstreams.faults import slowed_partition

    return rdd.mapPartitions(slowed_partition, preservesPartitioning=True)


def build(sc: Any, clock: Clock, checkpoint: str, text_prefix: str, slow: bool) -> StreamingContext:
    """The pipeline (module doc); ``slow`` inserts the fault-injection stage before the text output."""
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    words = ssc.generatorStream(8, 2, seed=3, recordFunc=records)
    counts = words.map(lambda w: (w, 1)).runningReduce(operator.add, numPartitions=2)
    if slow:
        counts = counts.transform(_slow_stage)
    counts.saveAsTextFiles(text_prefix)
    return ssc


def read_text_outputs(prefix: str) -> dict[int, list[str]]:
    """Batch ms -> sorted lines of every committed ``saveAsTextFiles`` folder ``prefix-<ms>``."""
    parent, base = os.path.split(prefix)
    out: dict[int, list[str]] = {}
    for entry in os.listdir(parent):
        if not entry.startswith(base + "-"):
            continue
        folder = os.path.join(parent, entry)
        if not os.path.exists(os.path.join(folder, "_SUCCESS")):
            continue
        lines: list[str] = []
        for part in sorted(os.listdir(folder)):
            if part.startswith("part-"):
                with open(os.path.join(folder, part)) as f:
                    lines.extend(line.rstrip("\n") for line in f)
        out[int(entry[len(base) + 1:])] = sorted(lines)
    return out


# ------------------------------------------------------------------------------------------ driver script
def executor_ids(sc: Any) -> list[str]:
    ids = sc._jsc.sc().getExecutorIds().mkString(",")
    return sorted(x for x in ids.split(",") if x)


def task_attempts(sc: Any, job_groups: list[str]) -> dict[str, int]:
    """Task attempts of the jobs of ``job_groups`` (one per batch), from Spark's status store.

    ``tasks``: all attempts; ``speculative``: speculative copies; ``killed``: attempts killed (the loser of
    a speculative race is killed once the other attempt succeeds).
    """
    tracker = sc.statusTracker()
    store = sc._jsc.sc().statusStore()
    counts = {"tasks": 0, "speculative": 0, "killed": 0}
    for group in job_groups:
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is None:
                    continue
                tasks = store.taskList(stage_id, stage.currentAttemptId, 1_000_000)
                for j in range(tasks.size()):
                    task = tasks.apply(j)
                    counts["tasks"] += 1
                    counts["speculative"] += int(bool(task.speculative()))
                    counts["killed"] += int(task.status() == "KILLED")
    return counts


def _poll(cond: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def run_phase(sc: Any, out: str, name: str, slow: bool, batches: int, timeout: float) -> dict[str, Any]:
    """Run ``batches`` batches of :func:`build` on a fresh StreamingContext; return the phase's metrics."""
    os.makedirs(out, exist_ok=True)
    phase: dict[str, Any] = {"name": name, "slow": slow, "batches": []}
    clock = ManualClock(0)
    ssc = build(sc, clock, os.path.join(out, "checkpoint"), os.path.join(out, "text", "counts"), slow)
    ssc.start()
    try:
        for i in range(1, batches + 1):
            t = i * 1000
            clock.set_time(t)
            info = ssc.awaitBatch(t, timeout)
            failures = {str(k): op.failure_reason for k, op in info.output_operations.items() if op.failure_reason}
            phase["batches"].append({"t": t, "processing_ms": info.processing_delay_ms, "failures": failures})
            print(f"BATCH {name} {t} {info.processing_delay_ms} ms failures={len(failures)}", flush=True)
            if failures:
                raise RuntimeError(f"batch {t} of phase {name} had failed output operations: {failures}")
        # The engine's own metrics, as a user reads them: the context's record of completed batches.
        infos = {b.batch_time_ms: b.processing_delay_ms for b in ssc.batchInfos()}
        groups = [b.job_group for b in ssc.batchInfos()]
        phase["batch_infos_ms"] = {str(t): ms for t, ms in sorted(infos.items())}
        ssc.awaitTerminationOrTimeout(0.01)  # raises a batch's error, if any
    finally:
        ssc.stop(stopSparkContext=False)
    phase["attempts"] = task_attempts(sc, groups)
    phase["median_ms"] = statistics.median(b["processing_ms"] for b in phase["batches"])
    return phase


def main(argv: list[str] | None = None) -> int:

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--master", required=True, help="a standalone master URL, spark://host:port")
    p.add_argument("--batches", type=int, default=8, help="batches per phase")
    p.add_argument("--slow-executor", default="0", help="executor id whose tasks are slowed")
    p.add_argument("--slow-seconds", type=float, default=2.0)
    p.add_argument("--apps", default="speculation,no-speculation", help="which applications to run, in order")
    p.add_argument("--timeout", type=float, default=60.0, help="bound of every wait, seconds")
    args = p.parse_args(argv)

    out = os.path.abspath(args.out_dir)
    status: dict[str, Any] = {"ok": False, "apps": {}, "master": args.master}
    status_path = os.path.join(out, "status.json")

    def save_status() -> None:
        with open(status_path + ".tmp", "w") as f:
            json.dump(status, f, indent=1)
        os.replace(status_path + ".tmp", status_path)

    t_start = time.monotonic()
    # JVM temp files include Unix socket files, whose paths must stay short (108 bytes): a short folder,
    # one for the whole process (the driver JVM, launched with the first application, outlives it).
    short_tmp = tempfile.mkdtemp(prefix="dss-")
    try:
        _run_apps(args, out, short_tmp, status, save_status)
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)
    status["ok"] = True
    status["elapsed_s"] = round(time.monotonic() - t_start, 2)
    save_status()
    print("DONE", flush=True)
    return 0


def _run_apps(args: argparse.Namespace, out: str, short_tmp: str, status: dict[str, Any],
              save_status: Callable[[], None]) -> None:
    """Run the applications of ``args.apps`` one after the other (module doc), recording into ``status``."""
    from dstreams import faults
    from dstreams.recovery.faults import warm_up_executors
    from dstreams.spark.sparkconf import create_spark_context

    # The straggler: carried to the tasks of every batch (a Spark local property), on the standalone executors too.
    faults.install(faults.FaultPlan(slow=faults.SlowSpec(frozenset({args.slow_executor}), None, args.slow_seconds,
                                                         1.0)))
    for app in [a for a in args.apps.split(",") if a]:
        speculation = app == "speculation"
        app_dir = os.path.join(out, app)
        local_dir = os.path.join(app_dir, "spark-local")
        os.makedirs(local_dir, exist_ok=True)
        tmp_opt = f"-Djava.io.tmpdir={short_tmp}"
        conf = {
            "spark.local.dir": local_dir,
            "spark.python.unix.domain.socket.dir": short_tmp,
            "spark.driver.extraJavaOptions": tmp_opt,
            "spark.executor.extraJavaOptions": tmp_opt,
            "spark.executor.memory": "512m",
            "spark.default.parallelism": "2",
            # The executors run this very interpreter (one machine): its lean worker daemon saves 60-80 ms
            # per task (dstreams applies it by itself on local masters only).
            "spark.python.daemon.module": "dstreams.spark.worker_daemon",
        }
        if not speculation:
            conf["spark.speculation"] = "false"  # the user's override of dstreams' default
        app_status: dict[str, Any] = {"phases": []}
        status["apps"][app] = app_status
        t_app = time.monotonic()
        sc = create_spark_context(args.master, f"dstreams-straggler-{app}", conf)
        try:
            app_status["app_id"] = sc.applicationId
            app_status["speculation_conf"] = {k: v for k, v in sc.getConf().getAll() if k.startswith("spark.specul")}
            save_status()
            print(f"APP {app} {sc.applicationId}", flush=True)
            app_status["executors_wait_s"] = _poll(lambda sc=sc: len(executor_ids(sc)) >= EXECUTORS, args.timeout,
                                                   f"{EXECUTORS} executors to register")
            # Start the Python workers of both executors and check which executor each task reports.
            app_status["task_executor_ids"] = warm_up_executors(sc, EXECUTORS, args.timeout)
            app_status["startup_s"] = round(time.monotonic() - t_app, 2)
            phases = [("baseline", False), ("straggler", True)] if speculation else [("straggler", True)]
            for name, slow in phases:
                phase = run_phase(sc, os.path.join(app_dir, name), name, slow, args.batches, args.timeout)
                app_status["phases"].append(phase)
                save_status()
        finally:
            sc.stop()
        app_status["elapsed_s"] = round(time.monotonic() - t_app, 2)
        save_status()


if __name__ == "__main__":
    sys.exit(main())
