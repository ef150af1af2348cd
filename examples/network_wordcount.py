r"""Word count over lines of text read from a TCP socket, one count per one-second batch.

This is pyspark's streaming example ``network_wordcount.py`` with one line changed: the StreamingContext
comes from dstreams (``from dstreams import StreamingContext``) instead of ``pyspark.streaming``. Every
other line is what a pyspark.streaming user already knows.

Run it (two terminals)::

    nc -lk 9999                                        # a text server: type lines into it
    python examples/network_wordcount.py localhost 9999   # or: python -m dstreams.examples.network_wordcount ...

Every second it prints the counts of the words typed during that second, in pprint's format::

    -------------------------------------------
    Time: 2025-01-01 12:00:03
    -------------------------------------------
    ('hello', 2)
    ('world', 1)

It runs until Ctrl-C or SIGTERM (a graceful stop). Set ``DSTREAMS_EXAMPLE_SECONDS=N`` to stop it after N
seconds (what the tests do; not part of pyspark's example).
"""

import os
import sys

from pyspark import SparkContext

from dstreams import StreamingContext  # was: from pyspark.streaming import StreamingContext

if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("Usage: network_wordcount.py <hostname> <port>", file=sys.stderr)
        sys.exit(-1)

    sc = SparkContext(appName="PythonStreamingNetworkWordCount")
    ssc = StreamingContext(sc, 1)  # one batch per second

    # One record per line received from the server; dstreams reads the socket in the driver.
    lines = ssc.socketTextStream(sys.argv[1], int(sys.argv[2]))
    counts = lines.flatMap(lambda line: line.split(" ")) \
        .map(lambda word: (word, 1)) \
        .reduceByKey(lambda a, b: a + b)
    counts.pprint()  # the first 10 (word, count) pairs of every batch

    ssc.start()
    seconds = float(os.environ.get("DSTREAMS_EXAMPLE_SECONDS") or 0)
    if seconds > 0:
        ssc.awaitTerminationOrTimeout(seconds)
        ssc.stop(stopSparkContext=True, stopGraceFully=True)
    else:
        ssc.awaitTermination()
