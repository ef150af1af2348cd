"""A driver process with the event-time operators (for tests/test_event_time_process.py).

``python event_time_app.py INBOX CHECKPOINT OUT``: 2 s batches over ``textFileStream(INBOX)`` of lines
``id,ts,key,value`` (``ts`` the event time in whole seconds since the epoch), timed with
``withEventTime(allowedLateness=LATENESS)``. Four exactly-once ``saveAsTextFiles`` outputs under ``OUT``:

* ``input-<ms>``: the raw lines of each batch (what the batch read: the test's model replays it);
* ``windows-<ms>``: ``reduceByKeyAndEventWindow(add, WINDOW, SLIDE, invFunc=sub, emit="final")`` of
  ``(key, value)``, its state checkpointed every 2 batches;
* ``sessions-<ms>``: ``sessionWindow(GAP, aggregate=sum)`` of ``(key, value)``, checkpointed every 2 batches;
* ``late-<ms>``: ``lateRecords()``, the parsed ``(ts, key, value)`` records behind the watermark;
* ``windowlate-<ms>`` and ``sessionlate-<ms>``: the windows' and the sessions' ``lateRecords()``, what each
  dropped (a record late for some of its windows counts in the others).

Checkpoints in the local folder ``CHECKPOINT``; resumes with ``StreamingContext.getOrCreate``.
"""

from __future__ import annotations

import operator
import os
import sys

#: The batch interval and the event-time settings, in seconds (the test's model uses the same).
BATCH, LATENESS, WINDOW, SLIDE, GAP = 2, 4, 6, 2, 3
OUTPUTS = ("input", "windows", "sessions", "late", "windowlate", "sessionlate")


def parse(line: str) -> tuple[int, str, int]:
    """``id,ts,key,value`` -> ``(ts, key, value)``."""
    _, ts, key, value = line.split(",")
    return int(ts), key, int(value)


def build(sc, inbox: str, checkpoint: str, out: str):
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, BATCH)
    ssc.checkpoint(checkpoint)
    # A local folder's files are one partition each: the backlog of a restart (the files that arrived while
    # the driver was down) would be as many tasks in every stage. Two partitions whatever the files.
    lines = ssc.textFileStream(inbox).transform(lambda rdd: rdd.coalesce(2))
    lines.saveAsTextFiles(os.path.join(out, "input"))
    timed = lines.map(parse).withEventTime(lambda r: r[0], allowedLateness=LATENESS)
    pairs = timed.map(lambda r: (r[1], r[2]))
    windows = pairs.reduceByKeyAndEventWindow(operator.add, WINDOW, SLIDE, invFunc=operator.sub, emit="final",
                                              numPartitions=2)
    windows.checkpoint(2 * BATCH).saveAsTextFiles(os.path.join(out, "windows"))
    sessions = pairs.sessionWindow(GAP, aggregate=sum, numPartitions=2)
    sessions.checkpoint(2 * BATCH).saveAsTextFiles(os.path.join(out, "sessions"))
    timed.lateRecords().saveAsTextFiles(os.path.join(out, "late"))
    windows.lateRecords().saveAsTextFiles(os.path.join(out, "windowlate"))
    sessions.lateRecords().saveAsTextFiles(os.path.join(out, "sessionlate"))
    return ssc


def main(inbox: str, checkpoint: str, out: str) -> None:
    from dstreams import StreamingContext
    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", "dstreams-event-time-app",
                              {"spark.default.parallelism": "2", "spark.dstreams.ui.enabled": "false"})
    ssc = StreamingContext.getOrCreate(checkpoint, lambda: build(sc, inbox, checkpoint, out))
    ssc.start()
    print("STARTED", flush=True)
    ssc.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
