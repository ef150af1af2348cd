"""Timers in ``track``: event-time timers fire when the watermark reaches them, processing-time timers at the
first batch time at or after them; fired timers emit records and update or drop the state; ``emit="updated"``
emits only the keys touched in the batch. (Exactly once
across a driver failover: ``tests/test_event_time.py``, whose resumed pipeline carries these functions.)

Batch ``i`` runs at ``i * 1000`` ms on a ManualClock; event times are seconds; lateness 0, so the watermark
of batch ``i`` is the largest event time of the batches before it.
"""

from __future__ import annotations

from typing import Any

from dstreams import ManualClock, StreamingContext, Timer, TrackUpdate
from dstreams.time import from_user_time


def on_init(key: str, ts: int) -> TrackUpdate:
    """One event so far; close the key 5 s of event time after its last event; a tick at 4 s (batch 4)."""
    return TrackUpdate(1, eventTime=ts + 5, processingTime=4)


def on_update(key: str, state: int, ts: int) -> TrackUpdate:
    return TrackUpdate(state + 1, eventTime=ts + 5)


def on_timer(key: str, state: int, timer: Timer) -> TrackUpdate:
    if timer.kind == "event":
        return TrackUpdate(None, emit=[("closed", key, state, timer.time)])
    return TrackUpdate(state, emit=[("tick", key, state, timer.time)])


def test_event_and_processing_time_timers_fire_once_and_emit(sc):
    batches = [[(1, "a"), (2, "b")], [(3, "a")], [(9, "b")], [(10, "c")], [], [(20, "d")], []]
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    timed = ssc.queueStream([sc.parallelize(b, 2) for b in batches]).withEventTime(lambda r: r[0])
    tracked = timed.map(lambda r: (r[1], r[0])).track(on_init, on_update, "1min", numPartitions=2, timers=on_timer)
    got: dict[str, dict[int, Any]] = {"states": {}, "emitted": {}}

    def keep(name: str):
        def run(time, rdd) -> None:
            got[name][from_user_time(time).ms // 1000] = sorted(rdd.collect())
        return run

    got["updated"] = {}
    updated = timed.map(lambda r: (r[1], r[0])).track(on_init, on_update, "1min", 2, on_timer, emit="updated")
    tracked.foreachRDD(keep("states"))
    tracked.emitted().foreachRDD(keep("emitted"))
    updated.foreachRDD(keep("updated"))
    ssc.start()
    try:
        for i in range(1, len(batches) + 1):
            clock.set_time(i * 1000)
            ssc.awaitBatch(i * 1000, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    # Watermarks: -, 2, 3, 9, 10, 10, 20. Batch 4: a's timer (8) fires and drops it (its tick at 4 s never
    # fires), b and c tick (c was created in batch 4 with a tick already due). Batch 7: b (14) and c (15) close.
    assert got["emitted"] == {
        1: [], 2: [], 3: [],
        4: [("closed", "a", 2, 8), ("tick", "b", 2, 4), ("tick", "c", 1, 4)],
        5: [], 6: [("tick", "d", 1, 4)],
        7: [("closed", "b", 2, 14), ("closed", "c", 1, 15)],
    }
    assert got["states"][3] == [("a", 2), ("b", 2)]
    assert got["states"][4] == [("b", 2), ("c", 1)]
    assert got["states"][7] == [("d", 1)]
    # emit="updated" (mapWithState-style): only the keys with events or fired timers in the batch, if alive.
    assert got["updated"] == {1: [("a", 1), ("b", 1)], 2: [("a", 2)], 3: [("b", 2)], 4: [("b", 2), ("c", 1)],
                              5: [], 6: [("d", 1)], 7: []}


def test_track_without_timers_keeps_its_contract(sc):
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    pairs = ssc.queueStream([[("a", 1)], [("a", 2)], [], [], []])
    got: dict[int, Any] = {}
    pairs.track(lambda k, e: e, lambda k, s, e: s + e, "2s").foreachRDD(
        lambda time, rdd: got.__setitem__(from_user_time(time).ms // 1000, sorted(rdd.collect())))
    ssc.start()
    try:
        for i in range(1, 6):
            clock.set_time(i * 1000)
            ssc.awaitBatch(i * 1000, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    assert got == {1: [("a", 1)], 2: [("a", 3)], 3: [("a", 3)], 4: [], 5: []}
