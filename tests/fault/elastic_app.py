"""A driver on the standalone test cluster (:mod:`tests.standalone_cluster`) whose executors race, come and go.

Pipeline (:func:`build`): a generator source of ``word@batch_ms`` records over 3 partitions -> ``(word, batch_ms)``
-> ``updateStateByKey(count_slowly, 3, updateIdleKeys=False)`` in the executor state store (changelog ``auto``: on
under a cluster master), checkpointed every 4 s; each batch's whole state goes to the sink as
``(partition, word, count)`` rows (the view's partition is the store partition), so a comparison with a local run
also checks where every key lives. Run on a ManualClock, one 1 s batch at a time.

Faults, each off unless asked for:

* ``--slow-batches``: the *first* attempt of state partition ``--slow-partition``'s task in those batches sleeps
  ``--slow-seconds`` inside the update function (so inside the store's transaction, before its changelog write and
  commit; :func:`count_slowly`, keyed on ``TaskContext`` partition and attempt number), so that Spark's speculation
  runs a copy on another host, which catches up from the changelog and wins. With ``spark.python.task.killTimeout``
  above the sleep the losing original is not killed before it wakes up: it writes the changelog and commits its
  store too, after the winner (the zombie case).
* ``--join-after N --join-address A``: after batch N a worker on the new address A starts (a host added to the
  cluster: :meth:`StandaloneCluster.restart_host` of a host appended to the handle's ``worker_hosts``, saved in the
  cluster's folder so that the test stops it) and its executor joins.
* ``--kill-after N --kill-host I``: after batch N the application's executor JVM on host I (not its host: the worker
  and its disk stay) is SIGKILLed and its worker starts a replacement.

Each fault waits (bounded) for the executors it changes.

Every task attempt that applies a batch to a state partition appends one JSON line to ``--attempts-file``
(``t``, ``partition``, ``attempt``, ``host``, ``slept``). Writes ``OUT_DIR/batches.jsonl`` (one ``{"t", "name",
"rows"}`` line per batch) and ``OUT_DIR/status.json`` (per batch: processing time, tries, executors, the store's
catch-up count so far; the state stream's node key, store id and run token; task attempts); ``"ok": true`` once every
batch completed without a failed output operation.

    python tests/fault/elastic_app.py OUT --master spark://127.0.0.1:PORT --cluster-dir DIR --slow-batches 3000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root first, for the package ``tests``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from dstreams import StreamingContext  # noqa: E402
from dstreams.clock import Clock  # noqa: E402

PARTITIONS = 3
#: Spark settings of the runs: the slow original must outlive its speculative copy (see the module doc).
CONF = {
    "spark.executor.memory": "512m",
    "spark.default.parallelism": "3",
    "spark.ui.enabled": "false",
    "spark.dstreams.checkpoint.graph": "off",  # the sink appends to a driver-local file
    "spark.dstreams.state.store": "executor",
    # The workers run this interpreter, where dstreams is installed (dstreams sets it for local masters only).
    "spark.python.daemon.module": "dstreams.spark.worker_daemon",
    "spark.python.task.killTimeout": "60s",
}
SLOW_ENV = "ELASTIC_APP_SLOW"  # "<partition>:<seconds>:<batch ms>,<batch ms>..." in the executors' environment
ATTEMPTS_ENV = "ELASTIC_APP_ATTEMPTS"  # the attempts file, in the executors' environment

_seen_attempts: set[int] = set()


def records(seed: int, t: int, partition: int, n: int) -> list[str]:
    """Deterministic ``word@t`` records of one generator partition of the batch at ``t`` ms."""
    return [f"w{(seed + t // 1000 * 5 + partition * 3 + i * i) % 17}@{t}" for i in range(n)]


def word_batch(record: str) -> tuple[str, int]:
    word, _, t = record.partition("@")
    return word, int(t)


def count_slowly(values: list[int], state: int | None) -> int:
    """The running count of a word. In a Spark task it records the attempt (once per attempt) and, in the first
    attempt of the slowed partition's task of a slowed batch (:data:`SLOW_ENV`), sleeps before it goes on."""
    if values:
        _attempt(values[0])
    return (state or 0) + len(values)


def _attempt(t: int) -> None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or ctx.taskAttemptId() in _seen_attempts:
        return
    _seen_attempts.add(ctx.taskAttemptId())
    slow, slept = os.environ.get(SLOW_ENV, ""), 0.0
    if slow:
        partition, seconds, batches = slow.split(":")
        if (ctx.partitionId() == int(partition) and ctx.attemptNumber() == 0
                and str(t) in batches.split(",")):
            slept = float(seconds)
            time.sleep(slept)
    path = os.environ.get(ATTEMPTS_ENV)
    if path:
        line = json.dumps({"t": t, "partition": ctx.partitionId(), "attempt": ctx.attemptNumber(),
                           "host": os.environ.get("SPARK_LOCAL_IP", "?"), "slept": slept, "pid": os.getpid()})
        with open(path, "a") as f:
            f.write(line + "\n")


def _rows(i: int, it: Any) -> list[tuple[int, str, int]]:
    return [(i, k, v) for k, v in it]


def build(sc: Any, clock: Clock, sink: Any, checkpoint: str) -> StreamingContext:
    """The pipeline of the module doc; each batch's ``(partition, word, count)`` rows go to
    ``sink("state", t, rows)``."""
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    pairs = ssc.generatorStream(8, PARTITIONS, seed=7, recordFunc=records).map(word_batch)
    state = pairs.updateStateByKey(count_slowly, PARTITIONS, updateIdleKeys=False).checkpoint("4s")

    def emit(t: Any, rdd: Any) -> None:
        sink("state", round(t.timestamp() * 1000), sorted(rdd.mapPartitionsWithIndex(_rows).collect()))

    state.foreachRDD(emit)
    return ssc


def executor_tasks(sc: Any) -> dict[str, dict[str, Any]]:
    """Per active executor: its host and port and how many tasks it ran (Spark's status store)."""
    summaries = sc._jsc.sc().statusStore().executorList(True)
    out = {}
    for i in range(summaries.size()):
        s = summaries.apply(i)
        if s.id() != "driver":
            out[str(s.id())] = {"host": str(s.hostPort()), "tasks": int(s.totalTasks())}
    return out


def state_node(ssc: StreamingContext) -> Any:
    from dstreams.nodes.store_state import ExecutorStore

    (node,) = [n for n in ssc._graph.nodes if isinstance(getattr(n, "backend", None), ExecutorStore)]
    return node


def _join(sc: Any, cluster: Any, address: str, timeout: float, status: dict[str, Any]) -> None:
    """Start a worker on ``address`` (a new host of the cluster) and wait (bounded) until the application has one
    more executor."""
    from tests.fault.executor_loss_app import _executor_ids, _poll

    before_ids = _executor_ids(sc)
    before = len(before_ids)
    t0 = time.monotonic()
    cluster.worker_hosts = (*cluster.worker_hosts, address)
    host = len(cluster.worker_hosts) - 1
    cluster.restart_host(host, timeout=timeout)
    _poll(lambda: len(_executor_ids(sc)) > before, timeout, "the joining host's executor")
    status["join_s"] = round(time.monotonic() - t0, 2)
    status["joined_executors"] = _executor_ids(sc)
    status["joined_executor"] = max(set(status["joined_executors"]) - set(before_ids), key=int)
    status["joined_host"] = host
    print(f"JOINED host {host} ({address}): {status['joined_executors']}", flush=True)


def _kill_executor(sc: Any, cluster: Any, host: int, timeout: float, status: dict[str, Any]) -> None:
    """SIGKILL the executor JVM of the application on host ``host`` (its worker stays) and wait (bounded) until the
    driver dropped it and a replacement on the same host registered."""
    from dstreams.recovery import faults
    from tests.fault.executor_loss_app import _executor_ids, _poll

    pids = faults.executor_pids(sc.applicationId)
    host_pids = set(cluster.host_pids(host))
    victim = next(e for e, pid in pids.items() if pid in host_pids)
    status["killed_executor"] = victim
    status["killed_pid"] = faults.kill_executor(sc, victim)
    t0 = time.monotonic()
    _poll(lambda: victim not in _executor_ids(sc), timeout, f"executor {victim} to be dropped")

    def replaced() -> bool:
        on_host = set(cluster.host_pids(host))
        fresh = [e for e, pid in faults.executor_pids(sc.applicationId).items() if pid in on_host and e != victim]
        return bool(fresh) and len(_executor_ids(sc)) >= len(pids)

    _poll(replaced, timeout, f"a replacement executor on host {host}")
    status["replacement_s"] = round(time.monotonic() - t0, 2)
    status["executors_after_kill"] = _executor_ids(sc)
    on_host = set(cluster.host_pids(host))
    status["replacement_executor"] = next(e for e, pid in faults.executor_pids(sc.applicationId).items()
                                          if pid in on_host and e != victim)
    print(f"KILLED executor {victim}; now {status['executors_after_kill']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    from dstreams import ManualClock
    from dstreams.recovery import faults
    from dstreams.spark.sparkconf import create_spark_context
    from tests.fault.executor_loss_app import ExecutorMonitor, _executor_ids, _poll
    from tests.fault.straggler_app import task_attempts
    from tests.standalone_cluster import StandaloneCluster

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--master", required=True)
    p.add_argument("--cluster-dir", required=True, help="the cluster's base_dir (its cluster.json)")
    p.add_argument("--executors", type=int, default=3, help="executors to wait for before the first batch")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--attempts-file", required=True)
    p.add_argument("--slow-partition", type=int, default=1)
    p.add_argument("--slow-seconds", type=float, default=4.0)
    p.add_argument("--slow-batches", default="", help="batch times (ms), comma-separated; empty: none")
    p.add_argument("--join-after", type=int, default=0, help="0: no host joins")
    p.add_argument("--join-address", default="127.0.0.8")
    p.add_argument("--kill-after", type=int, default=0, help="0: no executor is killed")
    p.add_argument("--kill-host", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="bound of every wait, seconds")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark settings (e.g. spark.dynamicAllocation.enabled=true)")
    args = p.parse_args(argv)

    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    local_dir = os.path.join(out, "driver-local")
    os.makedirs(local_dir, exist_ok=True)
    conf = dict(CONF, **{"spark.local.dir": local_dir, "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={local_dir}",
                         f"spark.executorEnv.{ATTEMPTS_ENV}": os.path.abspath(args.attempts_file)})
    for kv in args.conf:
        key, _, value = kv.partition("=")
        conf[key] = value
    if args.slow_batches:
        conf[f"spark.executorEnv.{SLOW_ENV}"] = f"{args.slow_partition}:{args.slow_seconds}:{args.slow_batches}"
    cluster = StandaloneCluster.attach(args.cluster_dir)
    status: dict[str, Any] = {"ok": False, "batches": []}
    status_path = os.path.join(out, "status.json")

    def save_status() -> None:
        with open(status_path + ".tmp", "w") as f:
            json.dump(status, f, indent=1)
        os.replace(status_path + ".tmp", status_path)

    t_start = time.monotonic()
    sc = create_spark_context(args.master, "dstreams-elastic", conf)
    status["app_id"] = sc.applicationId
    status["conf"] = {k: sc.getConf().get(k, None) for k in ("spark.speculation", "spark.speculation.multiplier",
                                                              "spark.speculation.quantile", "spark.locality.wait",
                                                              "spark.python.task.killTimeout")}
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
        monitor = ExecutorMonitor(sc)
        monitor.start()
        clock = ManualClock(0)
        ssc = build(sc, clock, sink, os.path.join(out, "checkpoint"))
        node = state_node(ssc)
        ssc.start()
        groups: list[str] = []
        for i in range(1, args.batches + 1):
            t = i * 1000
            clock.set_time(t)
            info = ssc.awaitBatch(t, args.timeout)
            groups.append(info.job_group)
            failures = {str(k): op.failure_reason for k, op in info.output_operations.items() if op.failure_reason}
            metrics = node.store_metrics() or {}
            status["batches"].append({"t": t, "processing_ms": info.processing_delay_ms, "failures": failures,
                                      "attempts": info.attempts, "executors": _executor_ids(sc),
                                      "caught_up": metrics.get("caught_up", 0)})
            save_status()
            print(f"BATCH {t} {info.processing_delay_ms} ms tries={info.attempts} caught_up={metrics.get('caught_up')}"
                  f" executors={_executor_ids(sc)}", flush=True)
            if failures:
                raise RuntimeError(f"batch {t} had failed output operations: {failures}")
            if i == args.join_after:
                _join(sc, cluster, args.join_address, args.timeout, status)
            if i == args.kill_after:
                _kill_executor(sc, cluster, args.kill_host, args.timeout, status)
        status["node_key"], status["store_id"], status["run"] = node.key, node.backend.store_id(), node.backend._run
        status["store_metrics"] = node.store_metrics()
        status["task_attempts"] = task_attempts(sc, groups)
        status["executor_tasks"] = executor_tasks(sc)
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
