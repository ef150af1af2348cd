"""pyspark 2.4's ``examples/src/main/python/streaming/direct_kafka_wordcount.py`` with its two streaming imports
changed to dstreams' (``from dstreams import StreamingContext``, ``from dstreams.kafka import KafkaUtils``); nothing
else differs. Counts words in UTF-8 encoded, '\\n' delimited text read from Kafka every 2 seconds.

Usage: ``python -m dstreams.examples.direct_kafka_wordcount <broker_list> <topic>``, e.g. with the tests' broker
(``bash scripts/services.sh start kafka``): ``... 127.0.0.1:9192 words``, then write lines to the topic. Stop it
with Ctrl-C or SIGTERM (a graceful stop).
"""

import sys

from pyspark import SparkContext

from dstreams import StreamingContext
from dstreams.kafka import KafkaUtils

if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("Usage: direct_kafka_wordcount.py <broker_list> <topic>", file=sys.stderr)
        sys.exit(-1)

    sc = SparkContext(appName="PythonStreamingDirectKafkaWordCount")
    ssc = StreamingContext(sc, 2)

    brokers, topic = sys.argv[1:]
    kvs = KafkaUtils.createDirectStream(ssc, [topic], {"metadata.broker.list": brokers})
    lines = kvs.map(lambda x: x[1])
    counts = lines.flatMap(lambda line: line.split(" ")) \
        .map(lambda word: (word, 1)) \
        .reduceByKey(lambda a, b: a + b)
    counts.pprint()

    ssc.start()
    ssc.awaitTermination()
