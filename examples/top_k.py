"""The top K search terms of the last few seconds, over a sliding window updated incrementally.

    counts = queries.map(lambda q: (q, 1)).reduceByKeyAndWindow(operator.add, operator.sub, "6s", "2s")

``reduceByKeyAndWindow`` with an inverse function (``operator.sub``) is the D-Streams paper's incremental
window: every slide, the new window is the previous one plus the batches that entered minus the batches that
left, so its cost does not grow with the window's length. ``filterFunc`` drops the terms whose count fell to 0.
The window's state is checkpointed (an inverse window needs a checkpoint location). The queries come from
``generatorStream`` (made in the executors, deterministic in seed and batch time) with a few popular terms and
a long tail.

Run it::

    python -m dstreams.examples.top_k                        # 15 s; window 6s sliding every 2s; top 5
    python -m dstreams.examples.top_k --window 10s --slide 1s --k 3 --seconds 0    # until Ctrl-C

Every slide it prints the window's end (batch time), its number of queries and the top K terms::

    window to 1735732806000 (12:00:06): 6000 queries; top 5: spark=1411 kafka=702 redis=469 flink=352 sql=282
"""

from __future__ import annotations

import argparse
import operator
import random
import tempfile
from datetime import datetime

from dstreams import StreamingContext

#: The search terms, most popular first: term i is searched with weight 1 / (i + 1) (a Zipf law).
TERMS = ("spark kafka redis flink sql python postgres streaming window state checkpoint lineage batch "
         "watermark session join shuffle partition executor driver cluster yarn kubernetes s3 ceph arrow "
         "parquet json avro schema").split()
WEIGHTS = [1 / (i + 1) for i in range(len(TERMS))]
PARTITIONS = 2


def queries(seed: int, batch_ms: int, partition: int, n: int) -> list[str]:
    """The ``n`` search terms of one partition of the batch at ``batch_ms`` (deterministic)."""
    return random.Random(f"{seed}:{batch_ms}:{partition}").choices(TERMS, WEIGHTS, k=n)


def top(k: int):
    """A ``foreachRDD`` output printing the top ``k`` terms of each window (ties by term)."""

    def show(time: datetime, rdd) -> None:  # noqa: ANN001 (an RDD)
        counts = rdd.collect()  # one entry per term: small, so the top K is taken on the driver
        best = sorted(counts, key=lambda kv: (-kv[1], kv[0]))[:k]
        total = sum(n for _, n in counts)
        ms = round(time.timestamp() * 1000)
        print(f"window to {ms} ({time.astimezone():%H:%M:%S}): {total} queries; top {k}: "
              + " ".join(f"{term}={n}" for term, n in best), flush=True)

    return show


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Top K terms over a sliding window (incremental, with an inverse).")
    p.add_argument("--batch", default="1s", help="batch interval (default 1s)")
    p.add_argument("--window", default="6s", help="window length, a multiple of the slide (default 6s)")
    p.add_argument("--slide", default="2s", help="how often the window moves, a multiple of the batch (default 2s)")
    p.add_argument("--k", type=int, default=5, help="how many terms to show (default 5)")
    p.add_argument("--rate", type=int, default=1000, help="queries per batch (default 1000)")
    p.add_argument("--seconds", type=float, default=15, help="how long to run; 0: until Ctrl-C (default 15)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--checkpoint", help="checkpoint folder or s3:// URL (default: a temporary folder)")
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dstreams-top-k-") as tmp:
        ssc = StreamingContext.local(args.batch, master=args.master, appName="top-k")
        ssc.checkpoint(args.checkpoint or tmp)

        terms = ssc.generatorStream(max(1, args.rate // PARTITIONS), PARTITIONS, seed=args.seed,
                                    recordFunc=queries)
        counts = terms.map(lambda q: (q, 1)).reduceByKeyAndWindow(
            operator.add, operator.sub, args.window, args.slide, filterFunc=lambda kv: kv[1] > 0)
        counts.foreachRDD(top(args.k))

        ssc.start()
        try:
            if args.seconds > 0:
                ssc.awaitTerminationOrTimeout(args.seconds)
            else:
                ssc.awaitTermination()
        finally:
            ssc.stop(stopSparkContext=True, stopGraceFully=True)


if __name__ == "__main__":
    main()
