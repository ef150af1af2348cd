"""An existing pyspark.streaming script runs unchanged after swapping one import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pyspark.streaming
import pytest

import dstreams

SCRIPT = textwrap.dedent(
    """
    import time
    from pyspark import SparkContext
    from pyspark.streaming import StreamingContext

    if __name__ == "__main__":
        sc = SparkContext(master="local[2]", appName="PythonStreamingQueueStream")
        sc.setLogLevel("ERROR")
        ssc = StreamingContext(sc, 1)
        rddQueue = []
        for i in range(3):
            rddQueue += [ssc.sparkContext.parallelize([j for j in range(1, 1001)], 10)]
        inputStream = ssc.queueStream(rddQueue)
        mappedStream = inputStream.map(lambda x: (x % 10, 1))
        reducedStream = mappedStream.reduceByKey(lambda a, b: a + b)
        reducedStream.pprint()
        results = []
        reducedStream.foreachRDD(lambda rdd: results.append(sorted(rdd.collect())))
        ssc.start()
        deadline = time.time() + 180
        while len(results) < 3 and time.time() < deadline:
            time.sleep(0.1)
        ssc.stop(stopSparkContext=True, stopGraceFully=False)
        print("RESULTS", results[:3])
    """
)


def test_dstreams_exports_what_pyspark_streaming_exports():
    for name in pyspark.streaming.__all__:
        assert hasattr(dstreams, name), name


@pytest.mark.slow
def test_pyspark_example_runs_after_changing_the_import(tmp_path):
    script = SCRIPT.replace("from pyspark.streaming import StreamingContext", "from dstreams import StreamingContext")
    path = tmp_path / "queue_stream.py"
    path.write_text(script)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = [[(k, 100) for k in range(10)]] * 3
    assert f"RESULTS {expected}" in proc.stdout, proc.stdout[-3000:]
    batches = proc.stdout.split("-------------------------------------------\nTime:")[1:]
    assert batches and all(f"({k}, 100)" in batches[0] for k in range(10)), proc.stdout[-3000:]
