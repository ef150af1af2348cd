"""The executor-loss pipeline, and (run as a script) a driver on ``local-cluster`` that loses an executor.

Pipeline (:func:`build`): deterministic generator source (4 partitions, 6 words each per 1 s batch) ->
``runningReduce`` (checkpointed every 3 s), ``reduceByKeyAndWindow`` with an inverse function over 5 s,
and stateless ``countByValue`` of word lengths and ``count``; and a second generator source of words with
an event time (out of order by up to 3 s, some 6-9 s late) -> ``withEventTime(allowedLateness=2s)`` ->
``reduceByKeyAndEventWindow`` (4 s windows sliding every 2 s, inverse function, ``emit="final"``) and the
count of ``lateRecords()``; with ``--redis``, the same word outputs over Redis Streams too (``redis_counts``, ...).
Each batch's output goes to ``sink(name, batch_ms, sorted rows)``.

As a script (``python executor_loss_app.py OUT_DIR``) it starts ``local-cluster[2,1,1024]``, waits for
both executors, runs the pipeline on a ManualClock started at 0 (batch times 1000, 2000, ...) one batch
at a time, SIGKILLs one executor JVM after batch ``--kill-after``, runs ``--after-kill`` more batches,
waits for the standalone master's replacement executor and runs ``--after-recovery`` more. It writes
``OUT_DIR/batches.jsonl`` (one ``{"t", "name", "rows"}`` line per output per batch) and
``OUT_DIR/status.json`` (what it observed: executors, the killed pid, per-batch times), and exits 0
only if every batch completed without a failed output operation.
"""

from __future__ import annotations

import argparse
import functools
import json
import operator
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from dstreams import ManualClock, StreamingContext
from dstreams.clock import Clock

Sink = Callable[[str, int, list[Any]], None]

MASTER = "local-cluster[2,1,1024]"
EXECUTORS = 2


def records(seed: int, t: int, partition: int, n: int) -> list[str]:
    """Deterministic words of one generator partition of the batch at ``t`` ms."""
    return [f"w{(seed + t // 1000 * 5 + partition * 3 + i * i) % 13}" for i in range(n)]


def timed_records(seed: int, t: int, partition: int, n: int) -> list[str]:
    """Deterministic ``word@event_ms`` records of one partition of the batch at ``t`` ms: event times up to
    3 s before the batch time, and every fifth record 6-9 s before it (late once the watermark has moved)."""
    out = []
    for i in range(n):
        k = seed + t // 1000 * 7 + partition * 5 + i * i
        back = 6000 + (k % 4) * 1000 if i % 5 == 4 else (k % 4) * 1000
        out.append(f"e{k % 5}@{max(0, t - back - 250 * partition)}")
    return out


def event_seconds(record: str) -> float:
    return int(record.rsplit("@", 1)[1]) / 1000.0


def state_updates(seed: int, t: int, partition: int, n: int, keys: int) -> list[tuple[str, int]]:
    """``(key, 1)`` for ``n`` keys of the large state spread over all ``keys`` of it (deterministic)."""
    step = keys // (n * 4) or 1
    return [(f"k{(t // 1000 * 31 + (partition * n + i) * step) % keys}", 1) for i in range(n)]


def add_up(values: list[int], last: int | None) -> int:
    return sum(values, last or 0)


def event_word(record: str) -> tuple[str, int]:
    return record.rsplit("@", 1)[0], 1


def batch_ms(t: datetime) -> int:
    return round(t.timestamp() * 1000)


def _output(stream: Any, name: str, sink: Sink) -> None:
    def emit(t: datetime, rdd: Any) -> None:
        sink(name, batch_ms(t), sorted(rdd.collect()))

    emit.__name__ = f"emit_{name}"
    stream.foreachRDD(emit)


#: Entries per key per batch when the source is Redis Streams (``maxRatePerPartition`` at 1 s batches).
REDIS_RATE = 6


def write_redis_words(client: Any, keys: list[str], batches: int) -> None:
    """The Redis variant's input, written beforehand: per key, ``REDIS_RATE`` words per batch to come."""
    for p, key in enumerate(keys):
        for b in range(1, batches + 1):
            for w in records(7, b * 1000, p, REDIS_RATE):
                client.xadd(key, {"w": w})


#: A large state (issue 23): with ``STATE_KEYS_ENV=N`` in the driver's environment the pipeline adds an
#: ``updateStateByKey`` over an initial state of N keys, a few of them updated each batch, output ``big`` (its
#: ``changes()``); ``DSTREAMS_STATE_STORE=executor`` puts it and the running counts in the executor state store, the
#: default ``auto`` moves it there after its first batch when ``DSTREAMS_STATE_AUTO_KEYS`` is at most N.
STATE_KEYS_ENV = "EXECUTOR_LOSS_STATE_KEYS"


def _word_outputs(source: Any, prefix: str) -> list[tuple[str, Any]]:
    """The stateful, windowed and stateless outputs over a stream of words, named ``prefix + name``."""
    words = source.map(lambda w: (w, 1))
    counts = words.runningReduce(operator.add).checkpoint("3s")
    window = words.reduceByKeyAndWindow(operator.add, operator.sub, "5s", "1s", filterFunc=lambda kv: kv[1] > 0)
    window.checkpoint("3s")
    lengths = words.map(lambda kv: len(kv[0])).countByValue()
    total = words.count()
    return [(f"{prefix}counts", counts), (f"{prefix}window", window), (f"{prefix}lengths", lengths),
            (f"{prefix}total", total)]


def build(sc: Any, clock: Clock, sink: Sink, checkpoint: str,
          redis: tuple[str, list[str]] | None = None, state_keys: int = 0) -> StreamingContext:
    """The stateful + windowed + stateless pipeline, outputs sent to ``sink``.

    ``redis=(url, keys)`` adds the same word outputs over those Redis stream keys (written by
    :func:`write_redis_words`, ``REDIS_RATE`` per key per batch), named ``redis_counts`` and so on;
    ``state_keys=N`` adds the large state (:data:`STATE_KEYS_ENV`).
    """
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    outputs = _word_outputs(ssc.generatorStream(6, 4, seed=7, recordFunc=records), "")
    if redis is not None:
        source = ssc.redisStream(redis[1], url=redis[0], maxRatePerPartition=REDIS_RATE).map(lambda r: r[2]["w"])
        outputs += _word_outputs(source, "redis_")
    timed = ssc.generatorStream(6, 4, seed=11, recordFunc=timed_records).withEventTime(event_seconds,
                                                                                       allowedLateness="2s")
    event_window = timed.map(event_word).reduceByKeyAndEventWindow(operator.add, "4s", "2s", invFunc=operator.sub)
    event_window.checkpoint("3s")
    late = timed.lateRecords().count()
    outputs += [("event_window", event_window), ("late", late)]
    if state_keys:
        initial = sc.range(0, state_keys, numSlices=4).map(lambda i: (f"k{i}", 0))
        big = ssc.generatorStream(8, 4, seed=2, recordFunc=functools.partial(state_updates, keys=state_keys))
        state = big.updateStateByKey(add_up, 4, initial, updateIdleKeys=False).checkpoint("3s")
        outputs.append(("big", state.changes()))
    for name, stream in outputs:
        _output(stream, name, sink)
    return ssc


def normalise(rows: list[Any]) -> list[Any]:
    """Rows as they read back from JSON (tuples become lists)."""
    return json.loads(json.dumps(rows))


# ------------------------------------------------------------------------------------------ driver script
def _executor_ids(sc: Any) -> list[str]:
    ids = sc._jsc.sc().getExecutorIds().mkString(",")
    return sorted(x for x in ids.split(",") if x)


def _rdd_blocks(sc: Any) -> dict[str, int]:
    """Active executor id -> number of cached RDD blocks it holds (the driver's status store)."""
    summaries = sc._jsc.sc().statusStore().executorList(True)
    return {s.id(): int(s.rddBlocks()) for s in (summaries.apply(i) for i in range(summaries.size()))}


def state_replicas(ssc: Any) -> dict[str, list[int]]:
    """Per state chain (an RDD state, a store's handles, an incremental window): on how many executors its cached
    RDDs are kept (``spark.dstreams.state.replicas``), as Spark reports the RDDs the node remembers."""
    return {n.name: sorted({rdd.getStorageLevel().replication for rdd in n.generated.values() if rdd is not None})
            for n in ssc._graph.nodes if getattr(n, "must_checkpoint", False)}


def _poll(cond: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


class ExecutorMonitor(threading.Thread):
    """Polls the driver's executor list; keeps every change as ``(seconds since start, ids)``."""

    def __init__(self, sc: Any) -> None:
        super().__init__(name="executor-monitor", daemon=True)
        self.sc = sc
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, list[str]]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                ids = _executor_ids(self.sc)
            except Exception:  # noqa: BLE001 - the context may be stopping
                return
            if not self.timeline or self.timeline[-1][1] != ids:
                self.timeline.append((round(time.monotonic() - self.t0, 2), ids))
            self.stop_event.wait(0.1)


def main(argv: list[str] | None = None) -> int:
    from dstreams.recovery import faults
    from dstreams.spark.sparkconf import create_spark_context

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--kill-after", type=int, default=5, help="kill an executor after this batch")
    p.add_argument("--after-kill", type=int, default=8, help="batches run after the kill")
    p.add_argument("--after-recovery", type=int, default=2, help="batches run once the replacement registered")
    p.add_argument("--timeout", type=float, default=60.0, help="bound of every wait, seconds")
    p.add_argument("--checkpoint", help="the checkpoint location (default OUT_DIR/checkpoint; an s3:// URL takes the "
                   "endpoint and credentials from the AWS_* variables, which the executors inherit)")
    p.add_argument("--redis", nargs=2, metavar=("URL", "KEYS"),
                   help="also read these Redis stream keys (comma-separated)")
    args = p.parse_args(argv)

    out = os.path.abspath(args.out_dir)
    local_dir = os.path.join(out, "spark-local")
    os.makedirs(local_dir, exist_ok=True)
    tmp_opt = f"-Djava.io.tmpdir={local_dir}"
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": tmp_opt,
        "spark.executor.extraJavaOptions": tmp_opt,
        "spark.executor.memory": "512m",
        "spark.locality.wait": "0",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        # The sink below appends to a driver-local file (not serializable): this app never restarts with
        # getOrCreate, so the graph is not stored in the checkpoint.
        "spark.dstreams.checkpoint.graph": "off",
    }
    status: dict[str, Any] = {"ok": False, "batches": []}
    status_path = os.path.join(out, "status.json")

    def save_status() -> None:
        with open(status_path + ".tmp", "w") as f:
            json.dump(status, f, indent=1)
        os.replace(status_path + ".tmp", status_path)

    t_start = time.monotonic()
    sc = create_spark_context(MASTER, "dstreams-executor-loss", conf)
    status["app_id"] = sc.applicationId
    save_status()
    print(f"APP {sc.applicationId}", flush=True)
    monitor: ExecutorMonitor | None = None
    ssc: StreamingContext | None = None
    lines = open(os.path.join(out, "batches.jsonl"), "w")  # noqa: SIM115 - closed in finally
    lock = threading.Lock()

    def sink(name: str, t: int, rows: list[Any]) -> None:
        with lock:
            lines.write(json.dumps({"t": t, "name": name, "rows": rows}) + "\n")
            lines.flush()

    try:
        status["executors_wait_s"] = _poll(lambda: len(_executor_ids(sc)) >= EXECUTORS, args.timeout,
                                           f"{EXECUTORS} executors to register")
        status["executors_before"] = faults.executor_pids(sc.applicationId)
        # Which executor each task says it ran on (also starts the Python workers of both executors).
        status["task_executor_ids"] = faults.warm_up_executors(sc, EXECUTORS, args.timeout)
        monitor = ExecutorMonitor(sc)
        monitor.start()
        clock = ManualClock(0)
        redis = (args.redis[0], args.redis[1].split(",")) if args.redis else None
        ssc = build(sc, clock, sink, args.checkpoint or os.path.join(out, "checkpoint"), redis,
                    int(os.environ.get(STATE_KEYS_ENV) or 0))
        ssc.start()
        kill_at = args.kill_after
        recover_at = kill_at + args.after_kill
        last = recover_at + args.after_recovery
        for i in range(1, last + 1):
            t = i * 1000
            clock.set_time(t)
            info = ssc.awaitBatch(t, args.timeout)
            failures = {str(k): op.failure_reason for k, op in info.output_operations.items() if op.failure_reason}
            status["batches"].append({"t": t, "processing_ms": info.processing_delay_ms, "failures": failures,
                                      "attempts": info.attempts})
            save_status()
            print(f"BATCH {t} {info.processing_delay_ms} ms failures={len(failures)}", flush=True)
            if failures:
                raise RuntimeError(f"batch {t} had failed output operations: {failures}")
            if i == kill_at:
                status["rdd_blocks_before_kill"] = _rdd_blocks(sc)
                status["kill_s"] = round(time.monotonic() - monitor.t0, 2)  # just before: the monitor may be quick
                pid = faults.kill_executor(sc)
                status["killed_pid"] = pid
                status["killed_executor"] = next(k for k, v in status["executors_before"].items() if v == pid)
                status["pid_gone_s"] = _poll(lambda p=pid: not faults.pid_alive(p), args.timeout, f"pid {pid} to die")
                save_status()
                print(f"KILLED executor {status['killed_executor']} pid {pid}", flush=True)
            if i == recover_at:
                status["replacement_wait_s"] = _poll(
                    lambda: len(_executor_ids(sc)) >= EXECUTORS and status["killed_executor"] not in _executor_ids(sc),
                    args.timeout, "a replacement executor")
                status["executors_after"] = faults.executor_pids(sc.applicationId)
            if i == last:
                status["rdd_blocks_at_end"] = _rdd_blocks(sc)
        from dstreams.nodes.auto_state import AutoPolicy

        status["state_moves"] = {n.label: n.backend.switched_at for n in ssc._graph.nodes
                                  if isinstance(getattr(n, "backend", None), AutoPolicy)}
        status["state_stores"] = {n.label: n.store_metrics() for n in ssc._graph.nodes
                                   if isinstance(getattr(n, "backend", None), AutoPolicy)}
        status["state_replicas"] = state_replicas(ssc)
        err = ssc.awaitTerminationOrTimeout(0.01)  # raises a batch's error, if any
        status["terminated"] = err
        status["ok"] = True
    finally:
        if monitor is not None:
            monitor.stop_event.set()
            monitor.join(5)
            status["executor_timeline"] = monitor.timeline
        status["elapsed_s"] = round(time.monotonic() - t_start, 2)
        save_status()
        lines.close()
        if ssc is not None:
            ssc.stop(stopSparkContext=False)
        sc.stop()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
