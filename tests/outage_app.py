"""A driver process whose checkpoint, input and output all live on one S3 store (for the outage test).

``python outage_app.py s3://<bucket>/<prefix> METRICS.jsonl [BATCH_SECONDS]``: 1 s batches (by default) over
``textFileStream(<prefix>/in/)``; the raw lines are saved with ``saveAsTextFiles(<prefix>/out/lines)`` and a
running word count (``runningReduce``, checkpointed every 2 s) with ``saveAsTextFiles(<prefix>/out/counts)``;
checkpoints under ``<prefix>/ckpt``. Endpoint and credentials come from the environment (boto3's chain:
``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``...). A listener appends one JSON line per completed batch
to METRICS.jsonl (batch time, submission/processing times, delays, records, wall time). SIGTERM or SIGINT
stops the context and exits 0; a driver that stops on its own (a fatal error) exits 1.
"""

from __future__ import annotations

import json
import logging
import operator
import signal
import sys
import threading
import time

from dstreams import StreamingContext


def build(sc, base: str, batch_s: float = 1.0) -> StreamingContext:
    ssc = StreamingContext(sc, batch_s)
    ssc.checkpoint(f"{base}/ckpt")
    lines = ssc.textFileStream(f"{base}/in/")
    lines.saveAsTextFiles(f"{base}/out/lines")
    counts = lines.flatMap(str.split).map(lambda w: (w, 1)).runningReduce(operator.add).checkpoint("2s")
    counts.saveAsTextFiles(f"{base}/out/counts")
    return ssc


class MetricsWriter:
    """Appends each completed batch's metrics as a JSON line (flushed at once)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed at exit
        self._lock = threading.Lock()

    def onBatchCompleted(self, event) -> None:  # noqa: ANN001
        info = event.batchInfo()
        record = {
            "batch_ms": info.batch_time_ms,
            "submission_ms": info.submission_time_ms,
            "start_ms": info.processing_start_time_ms,
            "end_ms": info.processing_end_time_ms,
            "scheduling_delay_ms": info.scheduling_delay_ms,
            "processing_delay_ms": info.processing_delay_ms,
            "total_delay_ms": info.total_delay_ms,
            "records": info.num_records,
            "failed": bool(info.failed),
            "ops_ms": {f"{op.output_id}:{op.output_name}": op.duration_ms for op in info.output_operations.values()},
            "generation_ms": None if info.generation_ms is None else round(info.generation_ms),
            "wall_ms": int(time.time() * 1000),
        }
        with self._lock:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def main(base: str, metrics_path: str, batch_s: float = 1.0) -> int:
    from dstreams.sparkconf import create_spark_context

    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ANN001, ARG001
        print(f"SIGNAL {signum}: stopping", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # One partition per stream: fewer tasks (and S3 part objects) per batch, so that 1 s batches keep up on
    # two shared cores.
    sc = create_spark_context("local[2]", "dstreams-outage", {"spark.default.parallelism": "1"})
    ssc = StreamingContext.getOrCreate(f"{base}/ckpt", lambda: build(sc, base, batch_s))
    metrics = MetricsWriter(metrics_path)
    ssc.addStreamingListener(metrics)
    ssc.start()
    print("STARTED", flush=True)
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
        metrics.close()
    print(f"EXIT {rc}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1.0))
