r"""SQL on every batch: words from a TCP socket turned into a DataFrame and counted with a SQL query.

pyspark's ``sql_network_wordcount.py`` with the StreamingContext imported from dstreams. Inside
``foreachRDD`` each batch's RDD becomes a DataFrame; the SparkSession is made once, lazily, from the
batch's SparkContext (a singleton, so that it is also there after a restart from a checkpoint).

Run it (two terminals)::

    nc -lk 9999
    python examples/sql_network_wordcount.py localhost 9999

Every second it prints the batch time and a table of the words typed in that second::

    ========= 2025-01-01 12:00:03+00:00 =========
    +-----+-----+
    | word|total|
    +-----+-----+
    |hello|    2|
    |world|    1|
    +-----+-----+

An empty second prints the time only. Stop it with Ctrl-C or SIGTERM; ``DSTREAMS_EXAMPLE_SECONDS=N`` stops it
after N seconds.
"""

import os
import sys

from pyspark import SparkContext
from pyspark.sql import Row, SparkSession

from dstreams import StreamingContext  # was: from pyspark.streaming import StreamingContext


def getSparkSessionInstance(sparkConf):
    """The driver's one SparkSession, made on first use."""
    if "sparkSessionSingletonInstance" not in globals():
        globals()["sparkSessionSingletonInstance"] = SparkSession.builder.config(conf=sparkConf).getOrCreate()
    return globals()["sparkSessionSingletonInstance"]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("Usage: sql_network_wordcount.py <hostname> <port>", file=sys.stderr)
        sys.exit(-1)
    host, port = sys.argv[1:]
    sc = SparkContext(appName="PythonSqlNetworkWordCount")
    ssc = StreamingContext(sc, 1)

    lines = ssc.socketTextStream(host, int(port))
    words = lines.flatMap(lambda line: line.split(" "))

    def process(time, rdd):
        """Runs on the driver for every batch: the batch's words as a table, counted by SQL."""
        print(f"========= {time} =========")
        if rdd.isEmpty():  # pyspark's example hides the error an empty batch raises; skip it instead
            return
        spark = getSparkSessionInstance(rdd.context.getConf())
        wordsDataFrame = spark.createDataFrame(rdd.map(lambda w: Row(word=w)))
        wordsDataFrame.createOrReplaceTempView("words")
        wordCountsDataFrame = spark.sql(
            "select word, count(*) as total from words group by word order by total desc, word")
        wordCountsDataFrame.show()

    words.foreachRDD(process)

    ssc.start()
    seconds = float(os.environ.get("DSTREAMS_EXAMPLE_SECONDS") or 0)
    if seconds > 0:
        ssc.awaitTerminationOrTimeout(seconds)
        ssc.stop(stopSparkContext=True, stopGraceFully=True)
    else:
        ssc.awaitTermination()
