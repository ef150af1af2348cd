"""The Spark engines of the Kafka benchmark, each a Kafka -> workload -> Kafka pipeline in its own process.

``python -m benchmarks.kafka_apps '<spec as JSON>'`` (started by :mod:`benchmarks.kafka`). Contract:

* The spec names the ``engine`` (:data:`ENGINES`), the ``workload`` (``grep`` or ``wordcount``), the
  ``bootstrap`` servers, the ``input`` and ``output`` topics, the batch ``interval_s`` and, for Structured Streaming,
  the connector's ``jars``. The pipeline reads the input topic from its earliest offset and writes the output
  topic; nothing else.
* Grep: the lines containing ``error``, written with the input record's Kafka timestamp (ms, decimal text) as key
  and the line as value. WordCount: per-word counts over a 30 s window sliding by one batch, written with the word
  as key and ``"<count> <newest input>"`` as value, where the newest input is what
  :func:`benchmarks.kafka_load.parse_reference` reads: dstreams tags each batch's rows with the batch's offset
  ranges (``o:<partition>:<until>,...``, from ``offsetRanges()`` on the driver: no job, no extra pass over the
  records), Structured Streaming writes ``max(timestamp)`` of the row's group (its built-in aggregate).
* Engines: ``dstreams-eo`` / ``dstreams-alo``: ``ssc.kafkaStream`` and ``saveToKafka(guarantee="exactly-once" |
  "at-least-once")``, the workloads written as in :mod:`benchmarks.workloads` (``reduceByKeyAndWindow`` with
  ``operator.add`` / ``operator.sub``); ``ss-sql`` / ``ss-udf``: Structured Streaming's Kafka source and Kafka sink
  (``spark-sql-kafka-0-10``; the sink is at-least-once), the workload with built-in SQL functions or with Python
  UDFs, ``groupBy(window(30 s, 1 s), word)`` in update mode with a 0 s watermark, a processing-time trigger of
  one interval. Every engine gets ``tuned_conf`` (``local[2]``) as in ``python -m benchmarks run``.
* Protocol: the app prints :data:`READY` once its pipeline is started, runs until a line ``stop`` (or the end) on
  its standard input, stops, prints :data:`RESULT` + a JSON summary of the engine's own per-batch metrics and
  exits. dstreams also prints :data:`LAG` + how far its last completed batch is behind every second (batches
  queued after an overload: the harness waits for them before it tries the next rate); Structured Streaming has
  no queue (a late trigger reads everything available).
"""

from __future__ import annotations

import json
import operator
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.kafka_protocol import READY, RESULT, on_stop_line

#: dstreams: every second, how far (ms) the last completed batch's time is behind now (its queue of batches).
LAG = "KAFKA_APP_LAG "
ENGINES = ("dstreams-eo", "dstreams-alo", "ss-sql", "ss-udf")
PATTERN = b"error"
WINDOW_S = 30


def positive(kv: tuple[Any, int]) -> bool:
    """Drop words whose windowed count fell to zero."""
    return kv[1] > 0


def word_pairs(value: bytes) -> list[tuple[bytes, int]]:
    """WordCount's map on a raw line: ``(word, 1)`` per word."""
    return [(w, 1) for w in value.split()]


def ts_and_value(record: Any) -> tuple[int, bytes]:
    """Grep's decoder: the record's Kafka timestamp (the output key) and its line."""
    return (record.timestamp, record.value)


def grep_kv(kv: tuple[int, bytes]) -> bool:
    return PATTERN in kv[1]


def raw_value(record: Any) -> bytes:
    return record.value


def offsets_tag(ranges: Any) -> bytes:
    """A batch's offset ranges as the tag :func:`benchmarks.kafka_load.parse_tag` reads."""
    return ("o:" + ",".join(f"{r.partition}:{r.untilOffset}" for r in ranges)).encode()


# ------------------------------------------------------------------------------------------------ dstreams
def run_dstreams(spec: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
    from dstreams import StreamingContext
    from dstreams.spark.sparkconf import create_spark_context

    guarantee = "exactly-once" if spec["engine"] == "dstreams-eo" else "at-least-once"
    sc = create_spark_context("local[2]", f"bench-kafka-{spec['engine']}-{spec['workload']}")
    sc.setLogLevel("ERROR")
    params = {"bootstrap.servers": spec["bootstrap"]}
    ssc = StreamingContext(sc, spec["interval_s"])
    if spec["workload"] == "grep":
        lines = ssc.kafkaStream([spec["input"]], params, startingOffsets="earliest", decoder=ts_and_value)
        lines.filter(grep_kv).saveToKafka(spec["output"], params, guarantee=guarantee)
    else:
        lines = ssc.kafkaStream([spec["input"]], params, startingOffsets="earliest", decoder=raw_value)
        counts = lines.flatMap(word_pairs).reduceByKeyAndWindow(
            operator.add, operator.sub, WINDOW_S, spec["interval_s"], sc.defaultParallelism, positive)

        def tag(rdds: list[Any]) -> Any:
            counted, read = rdds
            t = offsets_tag(read.offsetRanges())
            return counted.map(lambda kv: (kv[0], b"%d %s" % (kv[1], t)))

        ssc.transform([counts, lines], tag).saveToKafka(spec["output"], params, guarantee=guarantee)
    ssc.start()
    print(READY, flush=True)
    try:
        while not stop.wait(1.0):
            done = ssc.lastCompletedBatchTime()
            behind = time.time() * 1000.0 - (done.ms if done is not None else ssc.startTime.ms)
            print(f"{LAG}{behind:.0f}", flush=True)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    batches = []
    for info in sorted(ssc.batchInfos(), key=lambda i: i.batch_time_ms):
        if info.processing_end_time_ms is None:
            continue
        outputs = [o.duration_ms for o in info.output_operations.values() if o.duration_ms is not None]
        batches.append({"batch_ms": info.batch_time_ms, "records": info.num_records,
                        "scheduling_ms": info.scheduling_delay_ms, "processing_ms": info.processing_delay_ms,
                        "output_ms": sum(outputs) if outputs else None, "generation_ms": info.generation_ms})
    sc.stop()
    return {"batches": batches}


# ------------------------------------------------------------------------------------ Structured Streaming
def _ss_query(spark: Any, spec: dict[str, Any], ckpt: str) -> Any:
    from pyspark.sql import functions as F  # noqa: N812 - the usual alias
    from pyspark.sql.types import ArrayType, BooleanType, StringType

    udf = spec["engine"] == "ss-udf"
    src = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", spec["bootstrap"])
           .option("subscribe", spec["input"]).option("startingOffsets", "earliest").load())
    if spec["workload"] == "grep":
        if udf:
            matched = src.where(F.udf(lambda v: PATTERN in v, BooleanType())("value"))
        else:
            matched = src.where(F.col("value").cast("string").contains(PATTERN.decode()))
        out = matched.select(F.expr("CAST(unix_millis(timestamp) AS STRING)").alias("key"), "value")
        mode = "append"
    else:
        if udf:
            split = F.udf(lambda v: v.decode().split(), ArrayType(StringType()))
            words = src.select(F.explode(split("value")).alias("word"), "timestamp")
        else:
            words = (src.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"), "timestamp")
                     .where("word != ''"))
        counts = (words.withWatermark("timestamp", "0 seconds")
                  .groupBy(F.window("timestamp", f"{WINDOW_S} seconds", f"{round(spec['interval_s'] * 1000)} "
                                    "milliseconds"), "word")
                  .agg(F.count("*").alias("n"), F.max("timestamp").alias("newest")))
        out = counts.select(F.col("word").alias("key"),
                            F.concat_ws(" ", F.col("n").cast("string"),
                                        F.expr("CAST(unix_millis(newest) AS STRING)")).alias("value"))
        mode = "update"
    return (out.writeStream.format("kafka").option("kafka.bootstrap.servers", spec["bootstrap"])
            .option("topic", spec["output"]).option("checkpointLocation", ckpt).outputMode(mode)
            .trigger(processingTime=f"{round(spec['interval_s'] * 1000)} milliseconds").start())


def run_ss(spec: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", f"bench-kafka-{spec['engine']}-{spec['workload']}",
                              {"spark.jars": ",".join(spec["jars"])})
    sc.setLogLevel("ERROR")
    spark = SparkSession(sc)
    spark.conf.set("spark.sql.shuffle.partitions", str(sc.defaultParallelism))
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    ckpt = tempfile.mkdtemp(prefix="bench-kafka-ss-")
    query = _ss_query(spark, spec, ckpt)
    print(READY, flush=True)
    progress: dict[int, dict[str, Any]] = {}
    try:
        while not stop.wait(5.0):
            for p in query.recentProgress:
                d = json.loads(p.json) if hasattr(p, "json") else dict(p)
                progress[d["batchId"]] = d
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
    finally:
        for p in query.recentProgress:
            d = json.loads(p.json) if hasattr(p, "json") else dict(p)
            progress[d["batchId"]] = d
        query.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    batches = [{"batch_id": d["batchId"], "timestamp": d["timestamp"], "records": d.get("numInputRows"),
                "duration_ms": d.get("durationMs")} for _, d in sorted(progress.items())]
    sc.stop()
    return {"batches": batches}


RUNNERS: dict[str, Callable[[dict[str, Any], threading.Event], dict[str, Any]]] = {
    "dstreams-eo": run_dstreams, "dstreams-alo": run_dstreams, "ss-sql": run_ss, "ss-udf": run_ss}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    stop = threading.Event()

    on_stop_line(stop.set)
    t0 = time.monotonic()
    result = RUNNERS[spec["engine"]](spec, stop)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
