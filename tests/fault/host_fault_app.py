"""A driver on a standalone cluster of hosts (:mod:`tests.standalone_cluster`) that loses or freezes one host.

Runs :func:`build` on a ManualClock, one 1 s batch at a time: a generator source of words over 3 partitions, and for
each state backend of ``--stores`` (default ``rdd,executor``: the RDD state and the executor state store side by
side in one driver) the word counts since the start (``updateStateByKey`` with an ``initialRDD``) and over the last
5 s (``reduceByKeyAndWindow`` with an inverse function), checkpointed every ``--checkpoint-interval`` seconds (3),
so each batch has a shuffle into each state. After batch ``--fault-after`` it applies ``--fault`` to host ``--host``
of the cluster in ``--cluster-dir``: ``kill`` SIGKILLs its worker, executors and Python workers and removes its disk
folder; ``freeze`` SIGSTOPs them (never resumed here). Then it runs ``--after`` more batches. With ``--replace``
(after ``kill``) it starts the host's worker again after batch ``--replace-at`` (default: the last of those;
:meth:`StandaloneCluster.restart_host`: the same address, an empty disk folder; the batches go on meanwhile), waits
after the last of the ``--after`` batches until its executor registered with the driver and runs ``--after-join``
more batches. The executor stores are the executors' own (the driver's environment must not name
``DSTREAMS_STATE_LOCAL_DIR``: each host's executors then use their host's folder). With an ``s3://`` checkpoint
location the driver passes its ``AWS_*`` variables to the executors (``spark.executorEnv.*``), which write the
changelog and the checkpoints' parts there.

Writes ``OUT_DIR/batches.jsonl`` (one ``{"t", "name", "rows"}`` line per output per batch) and
``OUT_DIR/status.json``: per batch its processing time, tries, phase (``before``/``after``/``joined``) and the
executor stores' catch-ups so far (``caught_up``, per stream: how many times a task brought a partition's store up
to date from the changelog, reloading it from the newest checkpoint where it was missing), the executors' timeline,
when the driver dropped the faulty host's executor, the replacement's executor and how many tasks each executor ran,
the Spark settings in force, the task attempts that failed with a ``StateStoreError`` (``store_task_errors``: a
store that could not be brought up to date, retried by Spark); ``"ok": true`` once every batch completed without a
failed output operation. It does not wait for its SparkContext to stop cleanly when a host is frozen (the stop asks
the frozen executor): ``status.json`` is complete before the stop starts.

    python tests/fault/host_fault_app.py OUT --master spark://127.0.0.1:PORT --cluster-dir DIR --fault kill --replace
"""

from __future__ import annotations

import argparse
import contextlib
import json
import operator
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root first, for the package ``tests``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pyspark import cloudpickle  # noqa: E402

import tests.fault.executor_loss_app  # noqa: E402
from dstreams import StreamingContext  # noqa: E402
from dstreams.clock import Clock  # noqa: E402
from tests.fault.executor_loss_app import (  # noqa: E402
    ExecutorMonitor,
    Sink,
    _executor_ids,
    _output,
    _poll,
    add_up,
    records,
    state_replicas,
)
from tests.standalone_cluster import StandaloneCluster  # noqa: E402

STORES = ("rdd", "executor")
PARTITIONS = 3
#: The initial state of the running counts (``initialRDD``): some of the source's words w0..w12, with a head start.
INITIAL = tuple((f"w{i}", 100 + i) for i in range(0, 13, 2))
_STORE_ENV = "DSTREAMS_STATE_STORE"
#: A batch is back to its usual time (:func:`recovery_figures`) when it takes at most this many times the usual
#: time and USUAL_MARGIN_MS more: the batch-to-batch noise of a loaded machine.
USUAL_SLACK, USUAL_MARGIN_MS = 1.5, 500


def names(stores: Sequence[str] = STORES) -> tuple[str, ...]:
    """The outputs of :func:`build` for ``stores``: ``counts_<store>`` and ``window_<store>`` per store."""
    return tuple(f"{kind}_{store}" for store in stores for kind in ("counts", "window"))


def positive(kv: tuple[str, int]) -> bool:
    return kv[1] > 0


@contextlib.contextmanager
def _state_store(value: str) -> Iterator[None]:
    """``spark.dstreams.state.store`` is read when an operator is defined: the operators defined inside this block
    keep their state in ``value`` (through ``DSTREAMS_STATE_STORE``, restored after it)."""
    before = os.environ.get(_STORE_ENV)
    os.environ[_STORE_ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_STORE_ENV, None)
        else:
            os.environ[_STORE_ENV] = before


def build(sc: Any, clock: Clock, sink: Sink, checkpoint: str, stores: Sequence[str] = STORES,
          interval_s: int = 3, reference: bool = False) -> StreamingContext:
    """The pipeline, outputs :func:`names` of ``stores`` sent to ``sink``; each store's two states in that backend
    (``rdd`` or ``executor``), or all on the RDD state with ``reference`` (the failure-free run to compare with).
    Raises ``ValueError`` when the SparkConf sets ``spark.dstreams.state.store`` (it would win over ``stores``)."""
    if sc.getConf().get("spark.dstreams.state.store", None) is not None:
        raise ValueError("the SparkConf sets spark.dstreams.state.store, which would put every state in one backend: "
                         "leave it unset and name the backends with stores=")
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    words = ssc.generatorStream(8, PARTITIONS, seed=7, recordFunc=records).map(lambda w: (w, 1))
    for store in stores:
        with _state_store("rdd" if reference else store):
            initial = sc.parallelize(list(INITIAL), PARTITIONS)
            counts = words.updateStateByKey(add_up, PARTITIONS, initial, updateIdleKeys=False)
            counts.checkpoint(f"{interval_s}s")
            window = words.reduceByKeyAndWindow(operator.add, operator.sub, "5s", "1s", PARTITIONS,
                                                filterFunc=positive)
            window.checkpoint(f"{interval_s}s")
        _output(counts, f"counts_{store}", sink)
        _output(window, f"window_{store}", sink)
    return ssc


def store_streams(ssc: StreamingContext) -> dict[str, Any]:
    """Label -> node of every stream of ``ssc`` whose state is in the executor state store."""
    from dstreams.nodes.auto_state import AutoPolicy
    from dstreams.nodes.store_state import ExecutorStore

    return {n.label: n for n in ssc._graph.nodes
            if isinstance(getattr(n, "backend", None), (ExecutorStore, AutoPolicy))}


def catch_ups(ssc: StreamingContext) -> dict[str, int]:
    """Per executor-store stream: how many times a task brought a partition's store up to date from the changelog
    (and the newest checkpoint) so far; 0 before a report."""
    out = {}
    for label, node in store_streams(ssc).items():
        metrics = node.store_metrics()
        out[label] = int(metrics["caught_up"]) if metrics else 0
    return out


def executor_tasks(sc: Any) -> dict[str, int]:
    """Executor id -> tasks it ran (finished, failed or running) in this application, per the driver's status store
    (executors already dropped included)."""
    summaries = sc._jsc.sc().statusStore().executorList(False)
    out = {}
    for i in range(summaries.size()):
        s = summaries.apply(i)
        if s.id() != "driver":
            out[s.id()] = int(s.totalTasks())
    return out


def task_errors(sc: Any, needle: str) -> list[str]:
    """``executor id: last line`` of the error of every task attempt of this application whose error message holds
    ``needle`` (retried attempts included), per the driver's status store (every stage it keeps: 1,000 by default)."""
    store = sc._jsc.sc().statusStore()
    stages = store.stageList(None, False, False, getattr(store, "stageList$default$4")(),
                             getattr(store, "stageList$default$5")())
    out = []
    for i in range(stages.size()):
        stage = stages.apply(i)
        tasks = store.taskList(stage.stageId(), stage.attemptId(), 1_000_000)
        for k in range(tasks.size()):
            error = tasks.apply(k).errorMessage()
            if error.isDefined() and needle in error.get():
                lines = [x for x in str(error.get()).splitlines() if needle in x] or [""]
                out.append(f"{tasks.apply(k).executorId()}: {lines[-1].strip()[:300]}")
    return out


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


def recovery_figures(batches: Sequence[dict[str, Any]], fault_after: int) -> dict[str, Any]:
    """What a fault cost, from the per-batch ``processing_ms`` of ``batches`` (batch 1 first) with the fault after
    batch ``fault_after``: ``usual_ms``, the median of the batches before it but the first (which starts the Python
    workers; all of them when there are fewer than two); ``met_ms`` and ``extra_ms``, the batch that met the fault and
    what it took beyond the usual; ``batches_to_usual``, how many batches from that one on took more than
    :data:`USUAL_SLACK` times the usual and ``USUAL_MARGIN_MS`` more before one did not (0: the batch that met the
    fault took its usual time; 1: only that one was slow; None: the usual time never returned in the batches run)."""
    ms = [int(b["processing_ms"]) for b in batches]
    if not 0 < fault_after < len(ms):
        raise ValueError(f"the fault after batch {fault_after} is not inside the {len(ms)} batches run")
    before = ms[1:fault_after] or ms[:fault_after]
    usual = float(statistics.median(before))
    after = ms[fault_after:]
    slow = [x > usual * USUAL_SLACK + USUAL_MARGIN_MS for x in after]
    back = next((k for k, s in enumerate(slow) if not s), None)
    return {"usual_ms": usual, "met_ms": after[0], "extra_ms": after[0] - usual,
            "batches_to_usual": back, "after_ms": after}


def _phase(i: int, fault_after: int, joined_at: int | None) -> str:
    if i <= fault_after:
        return "before"
    return "joined" if joined_at is not None and i > joined_at else "after"


def main(argv: list[str] | None = None) -> int:
    from dstreams import ManualClock
    from dstreams.recovery import faults
    from dstreams.spark.sparkconf import create_spark_context

    # The executors of the cluster cannot import ``tests``: its functions travel by value.
    cloudpickle.register_pickle_by_value(tests.fault.executor_loss_app)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--master", required=True)
    p.add_argument("--cluster-dir", required=True, help="the cluster's base_dir (its cluster.json)")
    p.add_argument("--executors", type=int, default=3)
    p.add_argument("--stores", default=",".join(STORES),
                   help="the state backends, comma-separated: rdd, executor or both (default: both, side by side)")
    p.add_argument("--checkpoint-interval", type=int, default=3, help="seconds between state checkpoints")
    p.add_argument("--fault", choices=["none", "kill", "freeze"], default="none")
    p.add_argument("--host", type=int, default=1, help="the host (0-based) to kill or freeze")
    p.add_argument("--fault-after", type=int, default=5, help="apply the fault after this batch")
    p.add_argument("--after", type=int, default=6, help="batches run after the fault")
    p.add_argument("--replace", action="store_true",
                   help="start the killed host again (after batch --replace-at), wait for its executor once --after "
                        "batches ran after the fault, then run --after-join batches")
    p.add_argument("--replace-at", type=int,
                   help="start the replacement's worker after this batch (default: fault-after + after, the last "
                        "batch before the wait)")
    p.add_argument("--after-join", type=int, default=3, help="batches run once the replacement executor registered")
    p.add_argument("--timeout", type=float, default=120.0, help="bound of every wait, seconds")
    p.add_argument("--checkpoint", help="the checkpoint location (default OUT_DIR/checkpoint; s3://bucket/prefix "
                   "takes the endpoint and credentials from the AWS_* variables, passed on to the executors)")
    p.add_argument("--spark-defaults", action="store_true",
                   help="pass Spark's own values of the timeouts dstreams sets (to measure without them)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark settings")
    args = p.parse_args(argv)
    stores = tuple(x.strip() for x in args.stores.split(",") if x.strip())
    if not stores or any(x not in STORES for x in stores) or len(set(stores)) != len(stores):
        p.error(f"--stores takes rdd, executor or both, comma-separated, not {args.stores!r}")
    if args.replace and args.fault != "kill":
        p.error("--replace starts a killed host again: it needs --fault kill")
    replace_at = args.replace_at if args.replace_at is not None else args.fault_after + args.after
    if args.replace and not args.fault_after < replace_at <= args.fault_after + args.after:
        p.error(f"--replace-at must be after the fault (batch {args.fault_after}) and at most batch "
                f"{args.fault_after + args.after}")
    if os.environ.get("DSTREAMS_STATE_LOCAL_DIR"):
        p.error("unset DSTREAMS_STATE_LOCAL_DIR: the executors must keep their stores in their own host's folder")

    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    local_dir = os.path.join(out, "driver-local")
    os.makedirs(local_dir, exist_ok=True)
    checkpoint = args.checkpoint or os.path.join(out, "checkpoint")
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={local_dir}",
        "spark.executor.memory": "512m",
        "spark.default.parallelism": str(PARTITIONS),
        "spark.ui.enabled": "false",
        "spark.dstreams.checkpoint.graph": "off",  # the sink appends to a driver-local file
        # The workers run this interpreter, where dstreams is installed (dstreams sets it for local masters only)
        "spark.python.daemon.module": "dstreams.spark.worker_daemon",
    }
    if checkpoint.startswith("s3://"):  # the executors write the changelog and the checkpoints' parts
        for key in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                    "AWS_DEFAULT_REGION"):
            if os.environ.get(key):
                conf[f"spark.executorEnv.{key}"] = os.environ[key]
    if args.spark_defaults:
        conf.update(SPARK_DEFAULTS)
    for kv in args.conf:
        k, _, v = kv.partition("=")
        conf[k] = v
    cluster = StandaloneCluster.attach(args.cluster_dir)
    status: dict[str, Any] = {"ok": False, "batches": [], "fault": args.fault, "host": args.host,
                              "fault_after": args.fault_after, "stores": list(stores),
                              "checkpoint_interval_s": args.checkpoint_interval, "names": list(names(stores))}
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
        ssc = build(sc, clock, sink, checkpoint, stores, args.checkpoint_interval)
        status["store_streams"] = sorted(store_streams(ssc))
        ssc.start()
        joined_at: int | None = None
        replacement: threading.Thread | None = None
        replace_started, known = 0.0, set[str]()
        errors: list[BaseException] = []

        def restart() -> None:
            started = time.monotonic()
            try:
                cluster.restart_host(args.host, args.timeout)
            except BaseException as e:  # noqa: BLE001 - raised on the main thread
                errors.append(e)
            status["replacement_worker_s"] = round(time.monotonic() - started, 2)

        last = args.fault_after + args.after + (args.after_join if args.replace else 0)
        for i in range(1, last + 1):
            t = i * 1000
            clock.set_time(t)
            info = ssc.awaitBatch(t, args.timeout)
            failures = {str(k): op.failure_reason for k, op in info.output_operations.items() if op.failure_reason}
            status["batches"].append({"t": t, "processing_ms": info.processing_delay_ms, "failures": failures,
                                      "attempts": info.attempts, "phase": _phase(i, args.fault_after, joined_at),
                                      "caught_up": catch_ups(ssc)})
            save_status()
            print(f"BATCH {t} {info.processing_delay_ms} ms tries={info.attempts} failures={len(failures)} "
                  f"caught_up={status['batches'][-1]['caught_up']}", flush=True)
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
            if args.replace and i == replace_at:  # the worker starts while the batches go on
                known = set(_executor_ids(sc))
                replacement = threading.Thread(target=restart, name="restart-host", daemon=True)
                replace_started = time.monotonic()
                replacement.start()
            if args.replace and i == args.fault_after + args.after:
                assert replacement is not None
                replacement.join(args.timeout)
                if errors:
                    raise errors[0]
                if replacement.is_alive():
                    raise TimeoutError(f"host {args.host}'s worker did not start within {args.timeout} s")
                _poll(lambda k=known: bool(set(_executor_ids(sc)) - k), args.timeout,
                      "the replacement host's executor")
                status["replacement_join_s"] = round(time.monotonic() - replace_started, 2)
                status["replacement_executor"] = sorted(set(_executor_ids(sc)) - known)[0]
                status["replacement_pids"] = cluster.host_pids(args.host)
                joined_at = i
                save_status()
                print(f"JOINED host {args.host} executor {status['replacement_executor']} "
                      f"{status['replacement_join_s']} s after its worker started", flush=True)
        lost = status.get("fault_executor")
        if lost is not None:  # when the driver dropped the faulty host's executor (seconds after the fault)
            gone = [at for at, ids in monitor.timeline if at >= status["fault_s"] and lost not in ids]
            status["executor_dropped_after_s"] = round(gone[0] - status["fault_s"], 2) if gone else None
        status["state_replicas"] = state_replicas(ssc)
        status["executor_tasks"] = executor_tasks(sc)
        status["store_task_errors"] = task_errors(sc, "StateStoreError")
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
