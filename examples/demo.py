"""The main job: a streaming word count (``python -m dstreams.examples.demo``; ``bash scripts/demo.sh``).

Words come from the deterministic generator source (made in the executors) or from a TCP socket. It keeps
the running count of every word (``runningReduce``) and the count over a short sliding window (3 s by
default, updated incrementally with an inverse function), so the two visibly differ: the running count keeps
growing, the window's stays about the same. Runs on ``local[*]`` with checkpoints in a local folder, for
``--seconds`` seconds (0 = until Ctrl-C). It prints the status page's URL (open it while the job runs).

On a terminal it shows the progress line (one line rewritten after every batch: batch time, records,
processing time, delays) and prints the top words of both counts every few seconds and at the end; otherwise
(a pipe, a log, CI) it prints one line per batch and the top words of both counts after every batch.
"""

from __future__ import annotations

import argparse
import logging
import operator
import os
import sys
import time

from dstreams import StreamingContext, StreamingListener
from dstreams.api.progress import ProgressLine

#: On a terminal, how often the top words are printed (seconds).
TOP_EVERY_S = 5.0

#: The newest top words of each counted stream, by title, oldest title first (written by the outputs, on the
#: driver; module state, so that the outputs of a graph restored from a checkpoint write here too).
_latest: dict[str, tuple[object, list[tuple[str, int]]]] = {}
#: Whether the outputs print their top words after every batch (not on a terminal).
_per_batch = [True]


class _Top:
    """A ``foreachRDD`` output: the top words of its stream into :data:`_latest` (and printed, per batch)."""

    def __init__(self, title: str, n: int) -> None:
        self.title, self.n = title, n

    def __call__(self, t, rdd) -> None:
        _latest[self.title] = (t, rdd.takeOrdered(self.n, key=lambda kv: (-kv[1], kv[0])))
        if _per_batch[0]:
            print(_top_line(self.title, _latest[self.title]), flush=True)


def _top_line(title: str, latest: tuple[object, list[tuple[str, int]]]) -> str:
    t, top = latest
    return f"  {title:<22} at {t:%H:%M:%S}  " + "  ".join(f"{w}={c}" for w, c in top)


class _BatchLines(StreamingListener):
    """One line per batch, for output that is not a terminal."""

    def onBatchCompleted(self, batchCompleted) -> None:
        info = batchCompleted.batchInfo()
        print(
            f"batch {info.batchTime().milliseconds()}: {info.numRecords()} records, "
            f"processing {info.processingDelay().getOrElse(-1)} ms, "
            f"scheduling delay {info.schedulingDelay().getOrElse(-1)} ms, "
            f"total delay {info.totalDelay().getOrElse(-1)} ms",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstreams.examples.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1s", help="batch interval, e.g. 500ms, 1s (default 1s)")
    p.add_argument("--seconds", type=float, default=15, help="how long to run (0: until Ctrl-C; default 15)")
    p.add_argument("--source", choices=["generator", "socket"], default="generator")
    p.add_argument("--rate", type=int, default=10_000, help="generator: records per batch (default 10000)")
    p.add_argument("--host", default="localhost", help="socket source host")
    p.add_argument("--port", type=int, default=9999, help="socket source port")
    p.add_argument("--window", default="3s", help="sliding window length (default 3s)")
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
    # The progress line (stderr) replaces the per-batch lines when it is on and stdout is a terminal too.
    quiet = sys.stdout.isatty() and ProgressLine.settings(ssc.sparkContext.getConf()) is not None
    _per_batch[0] = not quiet
    if not quiet:
        ssc.addStreamingListener(_BatchLines())
    ssc.start()
    url = ssc.uiWebUrl
    print(f"status page: {url} (open it in a browser while the demo runs)" if url else
          "status page: off (spark.dstreams.ui.enabled=false, or no free port)", flush=True)
    printed: dict[str, tuple[object, list[tuple[str, int]]]] = {}
    try:
        started = time.monotonic()
        deadline = started + args.seconds if args.seconds > 0 else None
        next_top = started + TOP_EVERY_S
        while deadline is None or time.monotonic() < deadline:
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if ssc.awaitTerminationOrTimeout(max(0.0, wait)):
                break
            if quiet and time.monotonic() >= next_top:
                next_top += TOP_EVERY_S
                printed = _print_tops(above_progress=True)
    except KeyboardInterrupt:
        pass
    finally:
        ssc.stop(stopSparkContext=True, stopGraceFully=True)
    if quiet and _latest != printed:
        _print_tops(above_progress=False)
    print("done", flush=True)
    return 0


def _print_tops(above_progress: bool) -> dict[str, tuple[object, list[tuple[str, int]]]]:
    """Print the newest top words of both counts and return what was printed; above the progress line, its line
    is wiped first (it is drawn again after the next batch)."""
    shown = dict(_latest)
    if above_progress:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()
    print("\n".join(_top_line(title, latest) for title, latest in shown.items()) or "  (no batch yet)", flush=True)
    return shown


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
    print(f"dstreams demo: word count over the {args.source} source, {args.batch} batches, running count and "
          f"last {args.window} window, checkpoints in {checkpoint}", flush=True)
    counts.foreachRDD(_Top("running count", 5))
    windowed.foreachRDD(_Top(f"last {args.window} window", 5))
    return ssc


if __name__ == "__main__":
    # Run the importable module's main, not this ``__main__`` copy's: the outputs' class and state must be
    # ``dstreams.examples.demo``'s, which a graph restored from a checkpoint refers to.
    from dstreams.examples.demo import main as _main

    sys.exit(_main())
