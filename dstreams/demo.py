"""The main job: a streaming word count (``python -m dstreams.demo``).

Words come from the deterministic generator source (made in the executors) or from a TCP socket;
per batch it prints the top words of the running count (``runningReduce``) and of a 30 s sliding
window updated incrementally with an inverse function. Runs on ``local[*]`` with checkpoints in a
local folder, for ``--seconds`` seconds (0 = until Ctrl-C).
"""

from __future__ import annotations

import argparse
import logging
import operator
import os
import sys
import time

from dstreams import StreamingContext, StreamingListener


def _top(n: int):
    def show(t, rdd) -> None:
        top = rdd.takeOrdered(n, key=lambda kv: (-kv[1], kv[0]))
        print(f"  {t:%H:%M:%S} " + "  ".join(f"{w}={c}" for w, c in top), flush=True)

    return show


class _Progress(StreamingListener):
    def onBatchCompleted(self, batchCompleted) -> None:
        info = batchCompleted.batchInfo()
        print(
            f"batch {info.batchTime().milliseconds()}: {info.numRecords()} records, "
            f"processing {info.processingDelay().getOrElse(-1)} ms, "
            f"scheduling delay {info.schedulingDelay().getOrElse(-1)} ms",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstreams.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1s", help="batch interval, e.g. 500ms, 1s (default 1s)")
    p.add_argument("--seconds", type=float, default=12, help="how long to run (0: until Ctrl-C; default 12)")
    p.add_argument("--source", choices=["generator", "socket"], default="generator")
    p.add_argument("--rate", type=int, default=10_000, help="generator: records per batch (default 10000)")
    p.add_argument("--host", default="localhost", help="socket source host")
    p.add_argument("--port", type=int, default=9999, help="socket source port")
    p.add_argument("--window", default="30s", help="sliding window length (default 30s)")
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint folder or s3:// URL (default: a new folder under .dstreams-checkpoints/); "
                        "an existing one is resumed")
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    checkpoint = args.checkpoint or os.path.join(".dstreams-checkpoints", f"demo-{int(time.time())}")

    def setup() -> StreamingContext:
        return _build(args, checkpoint)

    ssc = StreamingContext.getOrCreate(checkpoint, setup)
    ssc.addStreamingListener(_Progress())
    ssc.start()
    try:
        if args.seconds > 0:
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                ssc.awaitTerminationOrTimeout(min(1.0, deadline - time.monotonic()))
        else:
            ssc.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        ssc.stop(stopSparkContext=True, stopGraceFully=True)
    print("done", flush=True)
    return 0


def _build(args: argparse.Namespace, checkpoint: str) -> StreamingContext:
    ssc = StreamingContext.local(args.batch, master=args.master, appName="dstreams-demo")
    ssc.checkpoint(checkpoint)
    if args.source == "generator":
        parts = ssc.sparkContext.defaultParallelism
        lines = ssc.generatorStream(max(1, args.rate // parts), parts, seed=42)
    else:
        lines = ssc.socketTextStream(args.host, args.port)
    words = lines.flatMap(str.split).map(lambda w: (w, 1))
    counts = words.runningReduce(operator.add)
    windowed = words.reduceByKeyAndWindow(operator.add, operator.sub, args.window, args.batch,
                                          filterFunc=lambda kv: kv[1] > 0)
    print(f"dstreams demo: word count over the {args.source} source, {args.batch} batches, "
          f"checkpoints in {checkpoint}", flush=True)
    counts.foreachRDD(lambda t, rdd: print(f"running counts at {t:%H:%M:%S}", flush=True))
    counts.foreachRDD(_top(5))
    windowed.foreachRDD(lambda t, rdd: print(f"last {args.window} at {t:%H:%M:%S}", flush=True))
    windowed.foreachRDD(_top(5))
    return ssc


if __name__ == "__main__":
    sys.exit(main())
