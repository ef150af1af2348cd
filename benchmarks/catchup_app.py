"""The driver that ``python -m benchmarks.catchup`` runs, stops, kills and restarts.

``python -m benchmarks.catchup_app s3://<bucket>/<prefix> METRICS.jsonl [--batch-seconds 1]
[--checkpoint-seconds 2]``

Everything lives on one S3 store: the input (``textFileStream(<prefix>/in/)``), the outputs (exactly-once
``saveAsTextFiles`` of the raw lines under ``<prefix>/out/lines`` and of a running word count, a
``runningReduce`` checkpointed every ``--checkpoint-seconds``, under ``<prefix>/out/counts``) and the
checkpoint (``<prefix>/ckpt``). The context comes from ``StreamingContext.getOrCreate``, so a second driver
started on the same prefix resumes from the checkpoint the first one left. The store's endpoint and
credentials come from boto3's chain (``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``...).

A listener appends one JSON line per completed batch to METRICS.jsonl, tagged with this process's id.
The driver prints ``STARTED pid <its process id>`` once its context runs; SIGTERM or SIGINT stops the
context and exits 0; a context that stops on its own (a fatal error) exits 1. With ``--engine-signals``
the app installs no handler and blocks in ``ssc.awaitTermination()``, as a plain pyspark.streaming script
does: the signals are dstreams' own (``spark.dstreams.stopOnSignal``, a graceful stop), and it prints
``TERMINATED`` when ``awaitTermination()`` returns.
"""

from __future__ import annotations

import argparse
import json
import logging
import operator
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any


def word_pairs(line: str) -> list[tuple[str, int]]:
    """``(word, 1)`` for every word of ``line``."""
    return [(w, 1) for w in line.split()]


def build_context(sc: Any, base: str, batch_s: float, checkpoint_s: float) -> Any:
    """The stream graph (only called when ``<base>/ckpt`` holds no checkpoint yet)."""
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, batch_s)
    ssc.checkpoint(f"{base}/ckpt")
    lines = ssc.textFileStream(f"{base}/in/")
    lines.saveAsTextFiles(f"{base}/out/lines")
    counts = lines.flatMap(word_pairs).runningReduce(operator.add).checkpoint(f"{checkpoint_s:g}s")
    counts.saveAsTextFiles(f"{base}/out/counts")
    return ssc


class BatchLog:
    """A streaming listener that writes each completed batch's metrics as one JSON line, flushed at once."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def onBatchCompleted(self, event: Any) -> None:
        info = event.batchInfo()
        row = {
            "pid": self._pid,
            "batch_ms": info.batch_time_ms,
            "submission_ms": info.submission_time_ms,
            "start_ms": info.processing_start_time_ms,
            "end_ms": info.processing_end_time_ms,
            "scheduling_delay_ms": info.scheduling_delay_ms,
            "processing_ms": info.processing_delay_ms,
            "total_delay_ms": info.total_delay_ms,
            "failed": bool(info.failed),
            "ops_ms": {f"{op.output_id}:{op.output_name}": op.duration_ms for op in info.output_operations.values()},
            "logged_ms": int(time.time() * 1000),
        }
        with self._lock:
            if not self._file.closed:
                self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="s3://bucket/prefix holding the input, the outputs and the checkpoint")
    p.add_argument("metrics", help="JSON-lines file the listener appends to")
    p.add_argument("--batch-seconds", type=float, default=1.0)
    p.add_argument("--checkpoint-seconds", type=float, default=2.0)
    p.add_argument("--engine-signals", action="store_true",
                   help="no signal handler of the app's own: dstreams' graceful stop on SIGTERM/SIGINT")
    args = p.parse_args(argv)

    from dstreams import StreamingContext, faults
    from dstreams.spark.sparkconf import create_spark_context

    faults.install(faults.FaultPlan.from_mapping(os.environ))  # the test's DSTREAMS_FAULT_*
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s")
    for noisy in ("py4j", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001
        print(f"SIGNAL {signum}: stopping", flush=True)
        stop.set()

    if not args.engine_signals:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    # One partition per stream: few tasks and few S3 part objects per batch, so that 1 s batches keep up
    # on two shared cores.
    sc = create_spark_context("local[2]", "dstreams-catchup-benchmark", {"spark.default.parallelism": "1"})
    ssc = StreamingContext.getOrCreate(
        f"{args.base}/ckpt", lambda: build_context(sc, args.base, args.batch_seconds, args.checkpoint_seconds))
    batches = BatchLog(args.metrics)
    ssc.addStreamingListener(batches)
    ssc.start()
    print(f"STARTED pid {os.getpid()}", flush=True)
    if args.engine_signals:
        try:
            ssc.awaitTermination()  # returns once a signal's graceful stop is done
        finally:
            batches.close()
        print("TERMINATED", flush=True)
        return 0
    rc = 0
    try:
        while not stop.is_set():
            if ssc.awaitTerminationOrTimeout(0.5):
                print("DRIVER STOPPED ON ITS OWN", flush=True)
                rc = 1
                break
    except BaseException as e:  # the error that stopped the stream
        logging.exception("the streaming context stopped with an error")
        print(f"DRIVER FAILED: {type(e).__name__}: {e}", flush=True)
        rc = 1
    finally:
        ssc.stop(stopSparkContext=True, stopGraceFully=False)
        batches.close()
    print(f"EXIT {rc}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
