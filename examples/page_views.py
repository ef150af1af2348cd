"""Page views per URL, counted for ever: the D-Streams paper's first example, with dstreams' fluent API.

    pageViews = ssc.generatorStream(...)                                 # PageView(url, user, ts) events
    counts = pageViews.map(lambda e: (e.url, 1)).runningReduce(operator.add)

``runningReduce`` keeps, per key, the reduce of every value so far: a state stream, hash-partitioned once
and merged with each batch without shuffling the state again, checkpointed periodically so that its lineage
stays short. The events come from ``generatorStream``: made inside the executors, deterministic in (seed,
batch time, partition), so any batch can be recomputed exactly; swap in ``ssc.kafkaStream(...)`` or
``ssc.redisStream(...)`` for real traffic.

Run it::

    python -m dstreams.examples.page_views                 # 10 s of 1 s batches, 1000 views per batch
    python -m dstreams.examples.page_views --seconds 0     # until Ctrl-C

After every batch it prints the batch time and the views of every URL so far, most viewed first::

    batch 1735732803000 (12:00:03): 3000 views so far: /=901 /products=598 /blog=305 ...
"""

from __future__ import annotations

import argparse
import operator
import random
import tempfile
from collections import namedtuple
from datetime import datetime

from dstreams import StreamingContext

#: One page view: the URL, who viewed it, when (seconds since the epoch).
PageView = namedtuple("PageView", "url user ts")

URLS = ("/", "/products", "/products/42", "/cart", "/checkout", "/about", "/blog", "/search")
WEIGHTS = (30, 20, 15, 10, 5, 5, 10, 5)  # how often each URL is viewed, relatively
PARTITIONS = 2


def page_views(seed: int, batch_ms: int, partition: int, n: int) -> list[PageView]:
    """The ``n`` page views of one partition of the batch at ``batch_ms``: a pure function of its arguments
    (a ``generatorStream`` record function, run in the executors)."""
    rng = random.Random(f"{seed}:{batch_ms}:{partition}")
    urls = rng.choices(URLS, WEIGHTS, k=n)
    return [PageView(url, f"user{rng.randrange(1000)}", batch_ms / 1000 - rng.random()) for url in urls]


def show(time: datetime, rdd) -> None:  # noqa: ANN001 (an RDD)
    """A ``foreachRDD`` output: the running counts of this batch (a handful of URLs: collected on the driver)."""
    counts = sorted(rdd.collect(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(n for _, n in counts)
    ms = round(time.timestamp() * 1000)
    print(f"batch {ms} ({time.astimezone():%H:%M:%S}): {total} views so far: "
          + " ".join(f"{url}={n}" for url, n in counts), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Running page view counts (the D-Streams paper's runningReduce).")
    p.add_argument("--batch", default="1s", help="batch interval, e.g. 500ms, 1s (default 1s)")
    p.add_argument("--rate", type=int, default=1000, help="page views per batch (default 1000)")
    p.add_argument("--seconds", type=float, default=10, help="how long to run; 0: until Ctrl-C (default 10)")
    p.add_argument("--seed", type=int, default=7, help="the generator's seed (default 7)")
    p.add_argument("--checkpoint", help="checkpoint folder or s3:// URL (default: a temporary folder)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dstreams-page-views-") as tmp:
        ssc = StreamingContext.local(args.batch, master=args.master, appName="page-views")
        ssc.checkpoint(args.checkpoint or tmp)  # the state's checkpoints (they cut its lineage)

        pageViews = ssc.generatorStream(max(1, args.rate // PARTITIONS), PARTITIONS, seed=args.seed,
                                        recordFunc=page_views)
        counts = pageViews.map(lambda e: (e.url, 1)).runningReduce(operator.add)
        counts.foreachRDD(show)

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
