"""A driver process with the event-time operators (for tests/fault/test_event_time_process.py).

``python event_time_app.py INBOX CHECKPOINT OUT``: 2 s batches over ``textFileStream(INBOX)`` of lines
``id,ts,key,value`` (``ts`` the event time in whole seconds since the epoch), timed with
``withEventTime(allowedLateness=LATENESS)``. Exactly-once ``saveAsTextFiles`` outputs under ``OUT``:

* ``input-<ms>``: the raw lines of each batch (what the batch read: the test's model replays it);
* ``windows-<ms>``: ``reduceByKeyAndEventWindow(add, WINDOW, SLIDE, invFunc=sub, emit="final")`` of
  ``(key, value)``, its state checkpointed every 2 batches;
* ``sessions-<ms>``: ``sessionWindow(GAP, aggregate=sum)`` of ``(key, value)``, checkpointed every 2 batches;
* ``late-<ms>``: ``lateRecords()``, the parsed ``(ts, key, value)`` records behind the watermark;
* ``windowlate-<ms>`` and ``sessionlate-<ms>``: the windows' and the sessions' ``lateRecords()``, what each
  dropped (a record late for some of its windows counts in the others);
* ``timers-<ms>``: ``track(..., timers=...)`` with many timers per key (:func:`timers_init`,
  :func:`timers_update`, :func:`timers_fired`), its state checkpointed every 2 batches: the records its timers
  emit, ``(key, seq, kind, tag, time, value)``.

Checkpoints in the local folder ``CHECKPOINT``; resumes with ``StreamingContext.getOrCreate``.
"""

from __future__ import annotations

import operator
import os
import sys
from typing import Any

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
    build_timers(timed, out)
    windows = pairs.reduceByKeyAndEventWindow(operator.add, WINDOW, SLIDE, invFunc=operator.sub, emit="final",
                                              numPartitions=2)
    windows.checkpoint(2 * BATCH).saveAsTextFiles(os.path.join(out, "windows"))
    sessions = pairs.sessionWindow(GAP, aggregate=sum, numPartitions=2)
    sessions.checkpoint(2 * BATCH).saveAsTextFiles(os.path.join(out, "sessions"))
    timed.lateRecords().saveAsTextFiles(os.path.join(out, "late"))
    windows.lateRecords().saveAsTextFiles(os.path.join(out, "windowlate"))
    sessions.lateRecords().saveAsTextFiles(os.path.join(out, "sessionlate"))
    return ssc


# ---------------------------------------------------------------------- the timers output
#: Event seconds per bucket; the idle timer's delay after a key's last event.
BUCKET, IDLE = 2, 3


def timers_events(key: str, state: tuple[int, dict[int, int], int], ev: tuple[int, int], first: bool) -> Any:
    """An event ``(ts, value)`` of a key: its value adds to the sum of its bucket (``ts // BUCKET``), whose
    event-time timer ``b<bucket>`` is set (again) to the bucket's end; the event-time timer ``idle`` moves to the
    key's last event time + ``IDLE``; the key's first event sets the processing-time timer ``seen`` (already due:
    it fires in this batch), any other event deletes it. The state ``(seq, sums per open bucket, last event
    time)`` does not depend on the order of the batch's events."""
    from dstreams import Timer, TrackUpdate

    seq, sums, top = state
    ts, value = ev
    b, top = ts // BUCKET, max(top, ts)
    timers = {f"b{b}": Timer("event", (b + 1) * BUCKET), "idle": Timer("event", top + IDLE),
              "seen": Timer("processing", ts) if first else None}
    return TrackUpdate((seq, {**sums, b: sums.get(b, 0) + value}, top), timers=timers)


def timers_init(key: str, ev: tuple[int, int]) -> Any:
    return timers_events(key, (0, {}, ev[0]), ev, True)


def timers_update(key: str, state: tuple[int, dict[int, int], int], ev: tuple[int, int]) -> Any:
    return timers_events(key, state, ev, False)


def timers_fired(key: str, state: tuple[int, dict[int, int], int], timer: Any) -> Any:
    """Emits ``(key, seq, kind, tag, time, value)`` (``seq``: the key's firing order). ``b<bucket>`` emits the
    bucket's sum and sets the processing-time timer ``p<bucket>`` (due: it fires in the next batch), and an odd
    bucket deletes ``p<bucket - 1>`` (due if set in an earlier batch: it does not fire then); ``idle`` drops the
    key with its timers."""
    from dstreams import Timer, TrackUpdate

    seq, sums, top = state
    record = (key, seq, timer.kind, timer.tag, timer.time)
    if timer.tag == "idle":
        return TrackUpdate(None, emit=[(*record, sum(sums.values()))])
    if timer.tag.startswith("b"):
        b = int(timer.tag[1:])
        rest = dict(sums)
        value = rest.pop(b, 0)
        changes: dict[str, Any] = {f"p{b}": Timer("processing", (b + 1) * BUCKET)}
        if b % 2:
            changes[f"p{b - 1}"] = None
        return TrackUpdate((seq + 1, rest, top), emit=[(*record, value)], timers=changes)
    return TrackUpdate((seq + 1, sums, top), emit=[(*record, 0)])


def timer_keys(r: tuple[int, str, int]) -> bool:
    """The records of the timers output: keys ``k<n>`` (in order: never behind the watermark)."""
    return r[1].startswith("k")


def build_timers(timed: Any, out: str) -> None:
    tracked = timed.filter(timer_keys).map(lambda r: (r[1], (r[0], r[2]))).track(
        timers_init, timers_update, "1h", numPartitions=2, timers=timers_fired)
    tracked.checkpoint(2 * BATCH).emitted().saveAsTextFiles(os.path.join(out, "timers"))


def main(inbox: str, checkpoint: str, out: str) -> None:
    from dstreams import StreamingContext, faults
    from dstreams.spark.sparkconf import create_spark_context

    faults.install(faults.FaultPlan.from_mapping(os.environ))  # the test's DSTREAMS_FAULT_*
    sc = create_spark_context("local[2]", "dstreams-event-time-app",
                              {"spark.default.parallelism": "2", "spark.dstreams.ui.enabled": "false"})
    ssc = StreamingContext.getOrCreate(checkpoint, lambda: build(sc, inbox, checkpoint, out))
    ssc.start()
    print("STARTED", flush=True)
    ssc.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
