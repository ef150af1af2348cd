"""A dstreams application written as a user writes one for ``spark-submit`` (tests/integration/test_submit_packed.py).

Usage (the test and docs/guide/deploying.md run it so)::

    spark-submit --master spark://HOST:7077 [--archives env.tar.gz#environment | --py-files dstreams.zip] \\
        submit_app.py OUT_DIR [--batches 3] [--timeout 240]

It imports nothing but dstreams, pyspark and the standard library (the driver runs it from a folder outside the
checkout, with the interpreter ``spark-submit`` was given). The pipeline: a queue of three small batches of text
lines -> words -> ``runningReduce(operator.add)`` over 2 state partitions, with a checkpoint folder
(``OUT_DIR/checkpoint``) and a state checkpoint every 2 s, on the real clock at 1 s batches. For every batch one
output, running inside the tasks that read the state, records:

* the state (every key's running count), and
* from inside each task: where ``dstreams`` and its dependency ``tenacity`` were imported from (``__file__``),
  the task's working folder,
  ``sys.executable`` and ``sys.prefix`` of the Python worker, and the executor's host address (``SPARK_LOCAL_IP``).

Each batch appends one JSON line to ``OUT_DIR/batches.jsonl`` (driver side). Once ``--batches`` batches are
recorded, the driver stops the context (not gracefully: the queue is drained by then) and writes
``OUT_DIR/driver.json``: the driver's own ``dstreams.__file__`` and the number of batches. Exit code 0 then; 1 if
``--timeout`` seconds pass first, with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

#: The queue: one list of lines per batch; later batches are empty.
BATCHES = [["a b", "a c"], ["b", "a"], ["c c"]]


def expected_states(batches: int) -> list[dict[str, int]]:
    """The running counts after each of the first ``batches`` batches (the queue, then empty batches)."""
    out: list[dict[str, int]] = []
    counts: dict[str, int] = {}
    for i in range(batches):
        for line in BATCHES[i] if i < len(BATCHES) else []:
            for word in line.split():
                counts[word] = counts.get(word, 0) + 1
        out.append(dict(sorted(counts.items())))
    return out


def where_am_i() -> dict[str, str]:
    """Inside a task: which ``dstreams`` this Python worker imports, and where the worker runs."""
    import tenacity  # one of dstreams' dependencies: from the shipped environment too

    import dstreams

    return {
        "dstreams": os.path.realpath(dstreams.__file__),
        "tenacity": os.path.realpath(tenacity.__file__),
        "cwd": os.path.realpath(os.getcwd()),
        "python": sys.executable,
        "prefix": os.path.realpath(sys.prefix),
        "host": os.environ.get("SPARK_LOCAL_IP", ""),  # the worker's address (inherited by its executors)
    }


def tag_partition(records: Iterable[Any]) -> Iterator[Any]:
    """The partition's records, preceded by the task's :func:`where_am_i` (tagged ``"__where__"``)."""
    yield ("__where__", where_am_i())
    yield from records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a dstreams application for spark-submit (module doc)")
    parser.add_argument("out", help="output folder (created)")
    parser.add_argument("--batches", type=int, default=3, help="batches to record before stopping")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for them")
    args = parser.parse_args(argv)

    from pyspark import SparkContext

    import dstreams
    from dstreams import StreamingContext
    from dstreams.spark.sparkconf import tuned_conf

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "batches.jsonl")
    # tuned_conf reads spark-submit's --master and --conf; "local[2]" is only the default outside spark-submit.
    sc = SparkContext(conf=tuned_conf("local[2]", "dstreams-submitted"))
    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(os.path.join(out, "checkpoint"))
    lines = ssc.queueStream([sc.parallelize(b, 2) for b in BATCHES], default=[])
    counts = lines.flatMap(str.split).map(lambda w: (w, 1)).runningReduce(operator.add, numPartitions=2)
    counts.checkpoint(2)

    def record(t: Any, rdd: Any) -> None:
        rows = rdd.mapPartitions(tag_partition).collect()
        entry = {
            "time_ms": int(t.timestamp() * 1000) if hasattr(t, "timestamp") else int(t),
            "state": dict(sorted((k, v) for k, v in rows if k != "__where__")),
            "tasks": [v for k, v in rows if k == "__where__"],
        }
        with open(log, "a") as f:
            f.write(json.dumps(entry) + "\n")

    counts.foreachRDD(record)
    ssc.start()
    deadline = time.monotonic() + args.timeout
    done = 0
    try:
        while time.monotonic() < deadline:
            if os.path.exists(log):
                with open(log) as f:
                    done = sum(1 for line in f if line.strip())
                if done >= args.batches:
                    break
            time.sleep(0.2)
    finally:
        ssc.stop(stopSparkContext=True, stopGraceFully=False)
    with open(os.path.join(out, "driver.json"), "w") as f:
        json.dump({"dstreams": os.path.realpath(dstreams.__file__), "python": sys.executable,
                   "batches": done}, f)
    if done < args.batches:
        print(f"submit_app: only {done} of {args.batches} batches recorded in {args.timeout:.0f} s; the cluster's "
              "executors may not have started (see the master's and workers' logs)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
