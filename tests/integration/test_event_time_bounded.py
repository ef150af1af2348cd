"""Event-time state is bounded: an unbounded key space with advancing event time keeps state flat.

A generator source (records made in the executors) brings ``NEW_KEYS`` keys never seen before in every batch
(each key has records in two consecutive batches, so sessions span batches), event times up to ``DISORDER``
behind the batch time and one record per batch later than the allowed lateness. Through ``withEventTime``:

* ``reduceByKeyAndEventWindow(add, WINDOW, SLIDE, invFunc=sub, emit="final")`` of ``(key, 1)``;
* ``sessionWindow(GAP)``;
* ``track(init, update, "1h", timers=on_timer)`` whose keys are dropped only by their event-time timer (set
  ``TIMER`` after the key's last event; the timeout is far away), so that a timer that does not fire, or a
  dropped key that stays, shows up as growth.

Batches run on a ManualClock (1 s each). At batch ``EARLY`` (after every operator reached steady state) and
at the last batch the test counts the state entries of each operator from its state RDD (keys, panes and
carried windows; keys and open sessions; keys and armed timers) and checks that they did not grow and stay
under what the watermark and the allowed lateness keep, although ``BATCHES * NEW_KEYS`` keys went through.
It also checks the driver-side bookkeeping (the watermark records and task statistics of ``withEventTime``,
``generated`` of every node, the JVM's persistent RDDs) and the driver's Python heap (tracemalloc), and that
the operators emitted every window, session and timer (they kept working while dropping state).
"""

from __future__ import annotations

import gc
import operator
import time
import tracemalloc
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

from dstreams import ManualClock, StreamingContext, Timer, TrackUpdate

from .test_long_run import graph_nodes

BATCHES = 80
EARLY = 25
NEW_KEYS = 20  # new keys per batch
PARTS = 2
DISORDER_MS = 900  # event times up to this much behind the batch time
LATENESS_S = 2
WINDOW_S, SLIDE_S = 4, 2
GAP_S = 3
TIMER_S = 3


def records(seed: int, time_ms: int, partition: int, n: int) -> Iterator[tuple[str, int]]:
    """Batch ``b``'s records in partition ``p``: keys ``b-i`` and ``(b-1)-i`` for ``i`` of ``p``'s share of
    ``NEW_KEYS``, event times (ms) behind the batch time by up to ``DISORDER_MS``; partition 0 adds one record
    10 s late (later than the allowed lateness)."""
    b = time_ms // 1000
    for i in range(partition, NEW_KEYS, PARTS):
        for batch in (b, b - 1):
            yield f"{batch}-{i}", time_ms - (batch * 7 + i * 131) % DISORDER_MS
    if partition == 0:
        yield f"late-{b}", time_ms - 10_000


def event_seconds(record: tuple[str, int]) -> float:
    return record[1] / 1000


def on_init(key: str, ts: float) -> TrackUpdate:
    return TrackUpdate(1, eventTime=ts + TIMER_S)


def on_update(key: str, state: int, ts: float) -> TrackUpdate:
    return TrackUpdate(state + 1, eventTime=ts + TIMER_S)


def on_timer(key: str, state: int, timer: Timer) -> TrackUpdate:
    return TrackUpdate(None, emit=[(key, state)])


def window_entries(it: Iterator[Any]) -> Iterator[tuple[int, int]]:
    """Per state record of ``reduceByKeyAndEventWindow``: (1 key, panes kept + carried window)."""
    for _, (panes, carry, _emitted) in it:
        yield 1, len(panes) + (carry is not None)


def session_entries(it: Iterator[Any]) -> Iterator[tuple[int, int]]:
    """Per state record of ``sessionWindow``: (1 key, open sessions)."""
    for _, st in it:  # (open sessions, emitted, late records)
        yield 1, len(st[0])


def track_entries(it: Iterator[Any]) -> Iterator[tuple[int, int]]:
    """Per state record of ``track``: (1 key, armed timers)."""
    for _, (_s, _last, timers, _emitted, _alive, _touched) in it:
        yield 1, len(timers)


def _state_of(node: Any) -> Any:
    """The node holding a state stream's state (behind its view when picked by size, the default)."""
    from dstreams.nodes.store_state import StateViewNode

    return node.state if isinstance(node, StateViewNode) else node


def count(rdd: Any, entries: Any) -> tuple[int, int]:
    """(keys, entries) of a state RDD."""
    return rdd.mapPartitions(entries).fold((0, 0), lambda a, b: (a[0] + b[0], a[1] + b[1]))


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~60 s on a quiet machine; 80 batches on a loaded 2-core one take minutes
def test_event_time_state_stays_flat_on_an_unbounded_key_space(sc, monkeypatch) -> None:
    started = time.monotonic()
    monkeypatch.setenv("DSTREAMS_UI_ENABLED", "false")  # the status page's own (bounded) history is not measured
    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    timed = ssc.generatorStream(1, PARTS, recordFunc=records).withEventTime(event_seconds, f"{LATENESS_S}s")
    pairs = timed.map(lambda r: (r[0], r[1] / 1000))
    windows = pairs.map(lambda kv: (kv[0], 1)).reduceByKeyAndEventWindow(
        operator.add, f"{WINDOW_S}s", f"{SLIDE_S}s", invFunc=operator.sub, emit="final", numPartitions=PARTS)
    sessions = pairs.sessionWindow(f"{GAP_S}s", aggregate=len, numPartitions=PARTS)
    tracked = pairs.track(on_init, on_update, "1h", PARTS, timers=on_timer)
    out = {"windows": 0, "window_records": 0, "sessions": 0, "session_records": 0, "timers": 0}

    def tally(rdd: Any) -> None:
        for kind, value in rdd.collect():
            out[kind] += 1
            if kind in ("windows", "sessions"):
                out[kind.removesuffix("s") + "_records"] += value

    (windows.map(lambda w: ("windows", w[1])).union(sessions.map(lambda s: ("sessions", s[1])))
     .union(tracked.emitted().map(lambda e: ("timers", e[1]))).foreachRDD(tally))
    state_nodes = {"window": (_state_of(windows._state), window_entries),
                   "session": (_state_of(sessions._state), session_entries),
                   "track": (_state_of(tracked._state), track_entries)}
    event_node = timed._event
    nodes = graph_nodes(ssc)
    at: dict[int, dict[str, Any]] = {}
    cached_before = len(sc._jsc.getPersistentRDDs())
    ssc.start()
    # The scheduler keeps the metrics of the last 1,000 batches: bounded, but growing over this run (as in
    # tests/integration/test_long_run.py; 20 here, full before EARLY, so that growth measured below would go on for
    # ever).
    ssc._scheduler.tracker.infos = deque(maxlen=20)
    try:
        for i in range(1, BATCHES + 1):
            clock.advance(1000)
            ssc.awaitBatch(i * 1000, 60.0)
            if i == EARLY // 2:
                gc.collect()
                tracemalloc.start()
            if i in (EARLY, BATCHES):
                gc.collect()
                at[i] = {
                    "state": {name: count(node.generated[i * 1000], entries)
                              for name, (node, entries) in state_nodes.items()},
                    "records": len(event_node._records),
                    "stats": len(event_node._acc.value) if event_node._acc is not None else 0,
                    "generated": {n.name: len(n.generated) for n in nodes},
                    "persistent": len(sc._jsc.getPersistentRDDs()) - cached_before,
                    "memory": tracemalloc.get_traced_memory()[0],
                }
    finally:
        tracemalloc.stop()
        ssc.stop(stopSparkContext=False)
    early, late = at[EARLY], at[BATCHES]
    print(f"\nbounded event-time state: early={early} late={late} outputs={out} "
          f"{time.monotonic() - started:.1f} s")

    # Steady state, bounded by the watermark: a key stays while an event of it can still be in an open window,
    # session or timer: (its two batches of events + that event-time horizon + lateness + disorder and the
    # watermark's one batch of lag) batches of new keys.
    horizon = {"window": WINDOW_S + SLIDE_S, "session": GAP_S + 1, "track": TIMER_S}
    for name, (keys, entries) in late["state"].items():
        bound = (2 + horizon[name] + LATENESS_S + 2) * NEW_KEYS
        early_keys, early_entries = early["state"][name]
        assert keys <= bound, (name, keys, bound, "keys kept although the watermark passed them")
        assert keys <= early_keys * 1.1 + NEW_KEYS, (name, early["state"][name], late["state"][name])
        assert entries <= early_entries * 1.1 + 2 * NEW_KEYS, (name, early["state"][name], late["state"][name])
    # The key space was not bounded: every key went through every operator and was emitted (so the operators
    # kept working while they dropped state).
    closed = (BATCHES - 10) * NEW_KEYS
    assert out["sessions"] >= closed and out["timers"] >= closed, out
    assert out["window_records"] >= closed * 2 * WINDOW_S // SLIDE_S, out
    # The driver's bookkeeping forgets old batches.
    remembered = event_node.remember_duration.ms // 1000 + 2
    for what in ("records", "stats"):
        assert late[what] <= early[what] + 1 and late[what] <= remembered, (what, early[what], late[what], remembered)
    for node in nodes:
        n, bound = late["generated"][node.name], node.remember_duration.ms // node.slide_duration.ms + 2
        assert n <= early["generated"][node.name] + 1 and n <= bound, (node.name, n, bound, early["generated"])
    assert late["persistent"] <= early["persistent"] + 3, (early["persistent"], late["persistent"])
    # Driver memory (the state itself lives in the executors): what was alive at batch EARLY and still is at the
    # end, plus what accumulated in between; a leak of 10 KB per batch (an RDD object with its JVM handles is a
    # few KB) would exceed this.
    growth = late["memory"] - early["memory"]
    assert growth < 512 * 1024, f"driver memory grew by {growth} bytes between batch {EARLY} and {BATCHES}"
