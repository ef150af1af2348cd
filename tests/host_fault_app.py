"""A driver on a standalone cluster of hosts (:mod:`tests.standalone_cluster`) that loses or freezes one host.

Runs :func:`build` (a generator source of words over 3 partitions, their ``runningReduce`` and an invertible
5 s ``reduceByKeyAndWindow``, both in the executor state store and checkpointed every 3 s, so each batch has a
shuffle into each state) on a ManualClock, one 1 s batch at a time. After batch ``--fault-after`` it applies
``--fault`` to host ``--host`` of the cluster in ``--cluster-dir``: ``kill`` SIGKILLs its worker, executors and
Python workers and removes its disk folder; ``freeze`` SIGSTOPs them (never resumed here). Then it runs
``--after`` more batches. The state stores are the executors' (the driver's environment must not name
``DSTREAMS_STATE_LOCAL_DIR``: each host's executors then use their host's folder).

Writes ``OUT_DIR/batches.jsonl`` (one ``{"t", "name", "rows"}`` line per output per batch) and
``OUT_DIR/status.json`` (per-batch processing times and tries, the executors' timeline, when the driver dropped
the faulty host's executor, the Spark settings in force); ``"ok": true`` once every batch completed without a
failed output operation. It does not wait for its SparkContext to stop cleanly when a host is frozen (the
stop asks the frozen executor): ``status.json`` is complete before the stop starts.

    python tests/host_fault_app.py OUT --master spark://127.0.0.1:PORT --cluster-dir DIR --fault freeze
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sys
import threading
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: import the sibling modules as the package ``tests``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark import cloudpickle  # noqa: E402

import tests.executor_loss_app  # noqa: E402
from dstreams import StreamingContext  # noqa: E402
from dstreams.clock import Clock  # noqa: E402
from tests.executor_loss_app import ExecutorMonitor, Sink, _executor_ids, _output, _poll, records  # noqa: E402
from tests.standalone_cluster import StandaloneCluster  # noqa: E402

NAMES = ("counts", "window")
PARTITIONS = 3


def positive(kv: tuple[str, int]) -> bool:
    return kv[1] > 0


def build(sc: Any, clock: Clock, sink: Sink, checkpoint: str) -> StreamingContext:
    """Word counts since the start and over the last 5 s, outputs :data:`NAMES` sent to ``sink``."""
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    words = ssc.generatorStream(8, PARTITIONS, seed=7, recordFunc=records).map(lambda w: (w, 1))
    counts = words.runningReduce(operator.add, PARTITIONS).checkpoint("3s")
    window = words.reduceByKeyAndWindow(operator.add, operator.sub, "5s", "1s", PARTITIONS, filterFunc=positive)
    window.checkpoint("3s")
    _output(counts, "counts", sink)
    _output(window, "window", sink)
    return ssc

#: Spark's own values of the settings dstreams passes to bound a frozen host (``--spark-defaults``: measure
#: without dstreams' values).
SPARK_DEFAULTS = {
    "spark.network.timeout": "120s",
    "spark.network.timeoutInterval": "60s",
    "spark.executor.heartbeatInterval": "10s",
    "spark.shuffle.io.connectionTimeout": "120s",
    "spark.shuffle.io.maxRetries": "3",
    "spark.shuffle.io.retryWait": "5s",
    "spark.rpc.askTimeout": "120s",
}

REPORTED_KEYS = (*SPARK_DEFAULTS, "spark.storage.blockManagerHeartbeatTimeoutMs",
                 "spark.shuffle.io.connectionCreationTimeout", "spark.speculation", "spark.locality.wait")


def main(argv: list[str] | None = None) -> int:
    from dstreams import ManualClock
    from dstreams.recovery import faults
    from dstreams.spark.sparkconf import create_spark_context

    # The executors of the cluster cannot import ``tests``: its functions travel by value.
    cloudpickle.register_pickle_by_value(tests.executor_loss_app)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--master", required=True)
    p.add_argument("--cluster-dir", required=True, help="the cluster's base_dir (its cluster.json)")
    p.add_argument("--executors", type=int, default=3)
    p.add_argument("--fault", choices=["none", "kill", "freeze"], default="none")
    p.add_argument("--host", type=int, default=1, help="the host (0-based) to kill or freeze")
    p.add_argument("--fault-after", type=int, default=5, help="apply the fault after this batch")
    p.add_argument("--after", type=int, default=6, help="batches run after the fault")
    p.add_argument("--timeout", type=float, default=120.0, help="bound of every wait, seconds")
    p.add_argument("--checkpoint", help="the checkpoint location (default OUT_DIR/checkpoint)")
    p.add_argument("--spark-defaults", action="store_true",
                   help="pass Spark's own values of the timeouts dstreams sets (to measure without them)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark settings")
    args = p.parse_args(argv)

    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    local_dir = os.path.join(out, "driver-local")
    os.makedirs(local_dir, exist_ok=True)
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={local_dir}",
        "spark.executor.memory": "512m",
        "spark.default.parallelism": "3",
        "spark.ui.enabled": "false",
        "spark.dstreams.checkpoint.graph": "off",  # the sink appends to a driver-local file
        # The workers run this interpreter, where dstreams is installed (dstreams sets it for local masters only)
        "spark.python.daemon.module": "dstreams.spark.worker_daemon",
    }
    if args.spark_defaults:
        conf.update(SPARK_DEFAULTS)
    for kv in args.conf:
        k, _, v = kv.partition("=")
        conf[k] = v
    cluster = StandaloneCluster.attach(args.cluster_dir)
    status: dict[str, Any] = {"ok": False, "batches": [], "fault": args.fault, "host": args.host,
                              "fault_after": args.fault_after}
    status_path = os.path.join(out, "status.json")

    def save_status() -> None:
        with open(status_path + ".tmp", "w") as f:
            json.dump(status, f, indent=1)
        os.replace(status_path + ".tmp", status_path)

    t_start = time.monotonic()
    sc = create_spark_context(args.master, f"dstreams-host-{args.fault}", conf)
    status["app_id"] = sc.applicationId
    status["conf"] = {k: sc.getConf().get(k, None) for k in REPORTED_KEYS}
    save_status()
    print(f"APP {sc.applicationId}", flush=True)
    lines = open(os.path.join(out, "batches.jsonl"), "w")  # noqa: SIM115 - closed in finally
    lock = threading.Lock()

    def sink(name: str, t: int, rows: list[Any]) -> None:
        with lock:
            lines.write(json.dumps({"t": t, "name": name, "rows": rows}) + "\n")
            lines.flush()

    monitor: ExecutorMonitor | None = None
    ssc = None
    try:
        status["executors_wait_s"] = _poll(lambda: len(_executor_ids(sc)) >= args.executors, args.timeout,
                                           f"{args.executors} executors to register")
        status["task_executor_ids"] = faults.warm_up_executors(sc, args.executors, args.timeout)
        status["executors_before"] = faults.executor_pids(sc.applicationId)
        monitor = ExecutorMonitor(sc)
        monitor.start()
        clock = ManualClock(0)
        ssc = build(sc, clock, sink, args.checkpoint or os.path.join(out, "checkpoint"))
        ssc.start()
        last = args.fault_after + args.after
        for i in range(1, last + 1):
            t = i * 1000
            clock.set_time(t)
            info = ssc.awaitBatch(t, args.timeout)
            failures = {str(k): op.failure_reason for k, op in info.output_operations.items() if op.failure_reason}
            status["batches"].append({"t": t, "processing_ms": info.processing_delay_ms, "failures": failures,
                                      "attempts": info.attempts})
            save_status()
            print(f"BATCH {t} {info.processing_delay_ms} ms tries={info.attempts} failures={len(failures)}",
                  flush=True)
            if failures:
                raise RuntimeError(f"batch {t} had failed output operations: {failures}")
            if i == args.fault_after and args.fault != "none":
                pids = faults.executor_pids(sc.applicationId)
                host_pids = set(cluster.host_pids(args.host))
                status["fault_executor"] = next((e for e, pid in pids.items() if pid in host_pids), None)
                status["fault_s"] = round(time.monotonic() - monitor.t0, 2)
                if args.fault == "kill":
                    status["fault_pids"] = cluster.kill_host(args.host, remove_disk=True)
                    status["disk_removed"] = not cluster.host_dir(args.host).exists()
                else:
                    status["fault_pids"] = cluster.freeze_host(args.host)
                save_status()
                print(f"FAULT {args.fault} host {args.host} executor {status['fault_executor']}", flush=True)
        lost = status.get("fault_executor")
        if lost is not None:  # when the driver dropped the faulty host's executor (seconds after the fault)
            gone = [at for at, ids in monitor.timeline if at >= status["fault_s"] and lost not in ids]
            status["executor_dropped_after_s"] = round(gone[0] - status["fault_s"], 2) if gone else None
        status["ok"] = True
    finally:
        if monitor is not None:
            monitor.stop_event.set()
            monitor.join(5)
            status["executor_timeline"] = monitor.timeline
        status["elapsed_s"] = round(time.monotonic() - t_start, 2)
        save_status()
        lines.close()
        print("DONE" if status["ok"] else "FAILED", flush=True)
        if ssc is not None:
            ssc.stop(stopSparkContext=False)
        sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
