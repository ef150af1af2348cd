r"""A running word count over lines read from a TCP socket, kept as state with ``updateStateByKey``.

pyspark's ``stateful_network_wordcount.py`` with the StreamingContext imported from dstreams instead of
``pyspark.streaming``; nothing else changes. The state starts from two words (``hello`` and ``world``, one
each) and every batch adds the words received in it. State needs a checkpoint location: the example uses
the folder ``checkpoint`` in the current directory, as pyspark's does.

Run it (two terminals)::

    nc -lk 9999
    python examples/stateful_network_wordcount.py localhost 9999

Every second it prints the running counts (all words so far, not only this second's)::

    -------------------------------------------
    Time: 2025-01-01 12:00:03
    -------------------------------------------
    ('hello', 3)
    ('world', 1)
    ('spark', 2)

Stop it with Ctrl-C or SIGTERM; ``DSTREAMS_EXAMPLE_SECONDS=N`` stops it after N seconds.
"""

import os
import sys

# ruff: noqa: N816 (pyspark's example keeps its camelCase names)
from pyspark import SparkContext

from dstreams import StreamingContext  # was: from pyspark.streaming import StreamingContext

if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("Usage: stateful_network_wordcount.py <hostname> <port>", file=sys.stderr)
        sys.exit(-1)

    sc = SparkContext(appName="PythonStreamingStatefulNetworkWordCount")
    ssc = StreamingContext(sc, 1)
    ssc.checkpoint("checkpoint")  # stateful streams are checkpointed here (a local folder or an s3:// URL)

    # The state before the first batch: (word, count) pairs.
    initialStateRDD = sc.parallelize([("hello", 1), ("world", 1)])

    def updateFunc(new_values, last_sum):
        # new_values: this batch's 1s for the word ([] when it did not occur); last_sum: None for a new word.
        return sum(new_values) + (last_sum or 0)

    lines = ssc.socketTextStream(sys.argv[1], int(sys.argv[2]))
    running_counts = lines.flatMap(lambda line: line.split(" ")) \
        .map(lambda word: (word, 1)) \
        .updateStateByKey(updateFunc, initialRDD=initialStateRDD)
    running_counts.pprint()

    ssc.start()
    seconds = float(os.environ.get("DSTREAMS_EXAMPLE_SECONDS") or 0)
    if seconds > 0:
        ssc.awaitTerminationOrTimeout(seconds)
        ssc.stop(stopSparkContext=True, stopGraceFully=True)
    else:
        ssc.awaitTermination()
