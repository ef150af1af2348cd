r"""A word count that survives a restart of the driver: ``StreamingContext.getOrCreate`` and a checkpoint.

pyspark's ``recoverable_network_wordcount.py`` with the StreamingContext imported from dstreams. The first
run builds the stream (``createContext``, which prints "Creating new context") and checkpoints it, with
the lines it received, to <checkpoint-directory>. Kill it (Ctrl-C, SIGTERM, even ``kill -9``) and start it
again with the same arguments: the stream is restored from the checkpoint *without* calling
``createContext``, and the batches that were pending or missed while it was down run first.

Each batch's word counts are printed and appended to <output-file>; the words "a", "b" and "c" are left
out, counted by an accumulator (the drop list is a broadcast variable). Broadcasts and accumulators are not
restored from a checkpoint, so they are made lazily on first use, from the running SparkContext (the
``getWordExcludeList`` / ``getDroppedWordsCounter`` singletons): that is pyspark's pattern and it works
unchanged here.

Run it (two terminals)::

    nc -lk 9999
    python examples/recoverable_network_wordcount.py localhost 9999 ~/checkpoint/ ~/out.txt

It prints, every second::

    Counts at time 2025-01-01 12:00:03+00:00 [('hello', 2), ('world', 1)]
    Dropped 1 word(s) totally
    Appending to /home/you/out.txt

Stop it with Ctrl-C or SIGTERM (a graceful stop); ``DSTREAMS_EXAMPLE_SECONDS=N`` stops it after N seconds.
"""

import os
import sys

from pyspark import SparkContext

from dstreams import StreamingContext  # was: from pyspark.streaming import StreamingContext


def getWordExcludeList(sparkContext):
    """The broadcast list of words to leave out, made once per driver process."""
    if "wordExcludeList" not in globals():
        globals()["wordExcludeList"] = sparkContext.broadcast(["a", "b", "c"])
    return globals()["wordExcludeList"]


def getDroppedWordsCounter(sparkContext):
    """The accumulator counting the words left out, made once per driver process."""
    if "droppedWordsCounter" not in globals():
        globals()["droppedWordsCounter"] = sparkContext.accumulator(0)
    return globals()["droppedWordsCounter"]


def createContext(host, port, outputPath):
    # Only called when there is no checkpoint yet: a restarted driver does not print this.
    print("Creating new context")
    if os.path.exists(outputPath):
        os.remove(outputPath)
    sc = SparkContext(appName="PythonStreamingRecoverableNetworkWordCount")
    ssc = StreamingContext(sc, 1)

    lines = ssc.socketTextStream(host, port)
    words = lines.flatMap(lambda line: line.split(" "))
    wordCounts = words.map(lambda x: (x, 1)).reduceByKey(lambda x, y: x + y)

    def echo(time, rdd):
        excludeList = getWordExcludeList(rdd.context)
        droppedWordsCounter = getDroppedWordsCounter(rdd.context)

        def filterFunc(wordCount):
            if wordCount[0] in excludeList.value:
                droppedWordsCounter.add(wordCount[1])
                return False
            return True

        counts = f"Counts at time {time} {rdd.filter(filterFunc).collect()}"
        print(counts)
        print(f"Dropped {droppedWordsCounter.value} word(s) totally")
        print("Appending to " + os.path.abspath(outputPath))
        with open(outputPath, "a") as f:
            f.write(counts + "\n")

    wordCounts.foreachRDD(echo)
    return ssc


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print("Usage: recoverable_network_wordcount.py <hostname> <port> <checkpoint-directory> <output-file>",
              file=sys.stderr)
        sys.exit(-1)
    host, port, checkpoint, output = sys.argv[1:]
    ssc = StreamingContext.getOrCreate(checkpoint, lambda: createContext(host, int(port), output))
    ssc.start()
    seconds = float(os.environ.get("DSTREAMS_EXAMPLE_SECONDS") or 0)
    if seconds > 0:
        ssc.awaitTerminationOrTimeout(seconds)
        ssc.stop(stopSparkContext=True, stopGraceFully=True)
    else:
        ssc.awaitTermination()
