"""A stream made from a queue of RDDs, one RDD per batch: handy to try operators without any server.

pyspark's ``queue_stream.py`` with the StreamingContext imported from dstreams. Five RDDs, each holding the
numbers 1 to 1000, are queued; every one-second batch takes one and counts its numbers by their last digit.

Run it::

    python examples/queue_stream.py        # or: python -m dstreams.examples.queue_stream

It prints five batches like this one, then stops by itself after six seconds::

    -------------------------------------------
    Time: 2025-01-01 12:00:01
    -------------------------------------------
    (0, 100)
    (1, 100)
    ...
    (9, 100)
"""

# ruff: noqa: N816 (pyspark's example keeps its camelCase names)
from pyspark import SparkContext

from dstreams import StreamingContext  # was: from pyspark.streaming import StreamingContext

if __name__ == "__main__":
    sc = SparkContext(appName="PythonStreamingQueueStream")
    ssc = StreamingContext(sc, 1)

    # The queue: five RDDs of 1..1000 in ten partitions each.
    rddQueue = []
    for _ in range(5):
        rddQueue += [ssc.sparkContext.parallelize([j for j in range(1, 1001)], 10)]

    inputStream = ssc.queueStream(rddQueue)
    mappedStream = inputStream.map(lambda x: (x % 10, 1))
    reducedStream = mappedStream.reduceByKey(lambda a, b: a + b)
    reducedStream.pprint()

    ssc.start()
    # pyspark's example sleeps 6 s; waiting on the context does the same and raises a failed batch's error.
    ssc.awaitTerminationOrTimeout(6)
    ssc.stop(stopSparkContext=True, stopGraceFully=True)
