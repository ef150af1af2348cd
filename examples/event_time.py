"""Clicks per page in two-second event-time windows, with a watermark and the clicks that came too late.

Clicks are counted by when they happened (their event time), not by when they arrived. Most clicks reach the
stream within a second; a few (a phone that was offline) arrive seconds late. The pipeline:

    timed = clicks.withEventTime(lambda c: c.ts, allowedLateness="1s")      # event time + a low watermark
    counts = timed.map(lambda c: (c.page, 1)).reduceByKeyAndEventWindow(operator.add, "2s")   # tumbling
    counts.lateRecords()                                                    # what arrived too late

The watermark of a batch is the largest event time seen in the batches before it, minus the allowed
lateness: "no click older than this is still expected". A window ``[start, end)`` is emitted once, with its
final counts, in the first batch whose watermark reaches its end (``emit="final"``); a click arriving after
its window was emitted is late: left out of that window and listed by ``lateRecords()``. Watermarks are
recorded in the metadata log, so a restarted driver replays every batch with the same watermark and emits the
same windows. The clicks come from ``generatorStream`` (made in the executors, deterministic).

Run it::

    python -m dstreams.examples.event_time                  # 12 s of 1 s batches
    python -m dstreams.examples.event_time --window 5s --lateness 2s --seconds 0        # until Ctrl-C

After every batch it prints its watermark, the windows it closed (their final counts) and the late clicks
(the page and the window each missed)::

    batch 1735732806000 (12:00:06): watermark 12:00:04.012
      window 12:00:02-12:00:04 /=61 /products=38 /cart=25 /help=12
      late: 2 clicks (/products 12:00:00-12:00:02 x1, / 11:59:58-12:00:00 x1)
"""

from __future__ import annotations

import argparse
import operator
import random
import tempfile
from collections import Counter, defaultdict, namedtuple
from datetime import datetime

from dstreams import StreamingContext

#: A click on a page at event time ``ts`` (seconds since the epoch).
Click = namedtuple("Click", "page ts")

PAGES = ("/", "/products", "/cart", "/help")
WEIGHTS = (50, 30, 15, 5)
PARTITIONS = 2
#: The share of clicks that arrive late, and by how much (seconds).
STRAGGLERS, STRAGGLER_DELAY = 0.02, (3.0, 8.0)


def clicks(seed: int, batch_ms: int, partition: int, n: int) -> list[Click]:
    """The ``n`` clicks arriving in one partition of the batch at ``batch_ms`` (deterministic): most happened
    up to a second before, a few (``STRAGGLERS``) several seconds before."""
    rng = random.Random(f"{seed}:{batch_ms}:{partition}")
    out = []
    for page in rng.choices(PAGES, WEIGHTS, k=n):
        delay = rng.uniform(*STRAGGLER_DELAY) if rng.random() < STRAGGLERS else rng.random()
        out.append(Click(page, round(batch_ms / 1000 - delay, 3)))
    return out


def hms(seconds: float) -> str:
    """A time of day (local), as the output shows it."""
    return datetime.fromtimestamp(seconds).strftime("%H:%M:%S")


def show_watermark(time: datetime, rdd) -> None:  # noqa: ANN001 (an RDD)
    """The batch's header: its time and watermark (one record per batch, None before the first click)."""
    (watermark,) = rdd.collect()
    ms = round(time.timestamp() * 1000)
    shown = "none yet" if watermark is None else datetime.fromtimestamp(watermark).strftime("%H:%M:%S.%f")[:-3]
    print(f"batch {ms} ({time.astimezone():%H:%M:%S}): watermark {shown}", flush=True)


def show_windows(rdd) -> None:  # noqa: ANN001 (an RDD)
    """The windows this batch closed: ``((page, (start, end)), count)`` records, one line per window."""
    windows: dict[tuple[float, float], list[tuple[str, int]]] = defaultdict(list)
    for (page, bounds), n in rdd.collect():
        windows[bounds].append((page, n))
    for (start, end), counts in sorted(windows.items()):
        print(f"  window {hms(start)}-{hms(end)} "
              + " ".join(f"{page}={n}" for page, n in sorted(counts, key=lambda kv: (-kv[1], kv[0]))), flush=True)


def show_late(rdd) -> None:  # noqa: ANN001 (an RDD)
    """The clicks that missed their window: ``((page, 1), eventTime, [(start, end)])`` records."""
    late = Counter((record[0], start, end) for record, _, missed in rdd.collect() for start, end in missed)
    if late:
        print(f"  late: {sum(late.values())} clicks ("
              + ", ".join(f"{page} {hms(start)}-{hms(end)} x{n}" for (page, start, end), n in sorted(late.items()))
              + ")", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Event-time windows with a watermark and late records.")
    p.add_argument("--batch", default="1s", help="batch interval (default 1s)")
    p.add_argument("--window", default="2s", help="tumbling event-time window (default 2s)")
    p.add_argument("--lateness", default="1s", help="allowed lateness: how far the watermark trails (default 1s)")
    p.add_argument("--rate", type=int, default=200, help="clicks per batch (default 200)")
    p.add_argument("--seconds", type=float, default=12, help="how long to run; 0: until Ctrl-C (default 12)")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--checkpoint", help="checkpoint folder or s3:// URL (default: a temporary folder)")
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dstreams-event-time-") as tmp:
        ssc = StreamingContext.local(args.batch, master=args.master, appName="event-time")
        ssc.checkpoint(args.checkpoint or tmp)

        events = ssc.generatorStream(max(1, args.rate // PARTITIONS), PARTITIONS, seed=args.seed,
                                     recordFunc=clicks)
        timed = events.withEventTime(lambda c: c.ts, allowedLateness=args.lateness)
        counts = timed.map(lambda c: (c.page, 1)).reduceByKeyAndEventWindow(operator.add, args.window)

        # Outputs run in this order in every batch.
        timed.watermarks().foreachRDD(show_watermark)
        counts.foreachRDD(show_windows)
        counts.lateRecords().foreachRDD(show_late)

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
