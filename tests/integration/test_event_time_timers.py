"""Timers in ``track``: event-time timers fire when the watermark reaches them, processing-time timers at the
first batch time at or after them; fired timers emit records and update or drop the state; ``emit="updated"``
emits only the keys touched in the batch. (Exactly once
across a driver failover: ``tests/integration/test_event_time.py``, whose resumed pipeline carries these functions.)

Batch ``i`` runs at ``i * 1000`` ms on a ManualClock; event times are seconds; lateness 0, so the watermark
of batch ``i`` is the largest event time of the batches before it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from dstreams import Timer, TrackUpdate
from dstreams.testing import collect, manual_context, run_batches


def _by_second(got: dict[int, Any]) -> dict[int, Any]:
    """A :func:`~dstreams.testing.collect` dict keyed by batch number (batch time in s) instead of ms."""
    return {t // 1000: rows for t, rows in got.items()}


def on_init(key: str, ts: int) -> TrackUpdate:
    """One event so far; close the key 5 s of event time after its last event; a tick at 4 s (batch 4)."""
    return TrackUpdate(1, eventTime=ts + 5, processingTime=4)


def on_update(key: str, state: int, ts: int) -> TrackUpdate:
    return TrackUpdate(state + 1, eventTime=ts + 5)


def on_timer(key: str, state: int, timer: Timer) -> TrackUpdate:
    if timer.kind == "event":
        return TrackUpdate(None, emit=[("closed", key, state, timer.time)])
    return TrackUpdate(state, emit=[("tick", key, state, timer.time)])


@pytest.mark.slow
def test_event_and_processing_time_timers_fire_once_and_emit(sc):
    batches = [[(1, "a"), (2, "b")], [(3, "a")], [(9, "b")], [(10, "c")], [], [(20, "d")], []]
    with manual_context(1, sc=sc) as ssc:
        timed = ssc.queueStream([sc.parallelize(b, 2) for b in batches]).withEventTime(lambda r: r[0])
        tracked = timed.map(lambda r: (r[1], r[0])).track(on_init, on_update, "1min", numPartitions=2,
                                                          timers=on_timer)
        updated = timed.map(lambda r: (r[1], r[0])).track(on_init, on_update, "1min", 2, on_timer, emit="updated")
        seen = {"states": collect(tracked, sort=True), "emitted": collect(tracked.emitted(), sort=True),
                "updated": collect(updated, sort=True)}
        ssc.start()
        run_batches(ssc, len(batches))
    got = {name: _by_second(rows) for name, rows in seen.items()}
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
    with manual_context(1, sc=sc) as ssc:
        pairs = ssc.queueStream([[("a", 1)], [("a", 2)], [], [], []])
        got = collect(pairs.track(lambda k, e: e, lambda k, s, e: s + e, "2s"), sort=True)
        ssc.start()
        run_batches(ssc, 5)
    assert _by_second(got) == {1: [("a", 1)], 2: [("a", 3)], 3: [("a", 3)], 4: [], 5: []}


# ---------------------------------------------------------------------- many timers per key (issue 24)
T = Timer

#: What ``scripted_on_timer`` does when the timer of a tag fires (besides emitting it and counting).
REACT: dict[str, dict[str, Timer | None]] = {
    "early": {"again": T("event", 1)},  # already due: fires in the next batch, not this one
    "a": {"c": None},  # c is due in the same batch: deleted before its turn, it never fires
    "b": {"p": T("processing", 5)},  # p is due in the same batch: moved to 5 s, it fires then
}


def scripted_update(key: str, seq: int, ev: tuple[int, dict[str, Any] | None]) -> Any:
    """The event carries the ``TrackUpdate`` keyword arguments (None: return the plain state)."""
    return seq if ev[1] is None else TrackUpdate(seq, **ev[1])


def scripted_init(key: str, ev: tuple[int, dict[str, Any] | None]) -> Any:
    return scripted_update(key, 0, ev)


def scripted_on_timer(key: str, seq: int, timer: Timer) -> TrackUpdate:
    """The state counts the key's fired timers: the emitted ``seq`` is the firing order."""
    out = [(key, seq, timer.kind, timer.tag, timer.time)]
    if timer.tag == "close":
        return TrackUpdate(None, emit=out)
    return TrackUpdate(seq + 1, emit=out, timers=REACT.get(timer.tag))


@pytest.mark.slow
def test_many_timers_per_key_set_replaced_and_deleted_by_tag(sc):
    batches = [
        [("x", (1, {"timers": {"early": T("event", 3), "close": T("event", 6), "tick": T("processing", 2),
                               "old": T("event", 3), "late": T("processing", 7)}})),
         ("y", (1, {"timers": {"b": T("event", 3), "a": T("event", 3), "c": T("event", 3),
                               "p": T("processing", 3)}}))],
        [("x", (3, {"timers": {"close": T("event", 5), "old": None, "later": T("processing", 4)}}))],
        [("z", (4, {"eventTime": 4, "processingTime": 5}))],  # the default tags "event" and "processing"
        [], [("z", (7, None))], [], [],
    ]
    with manual_context(1, sc=sc) as ssc:
        timed = ssc.queueStream([sc.parallelize(b, 2) for b in batches]).withEventTime(lambda r: r[1][0])
        tracked = timed.track(scripted_init, scripted_update, "1min", numPartitions=2, timers=scripted_on_timer)
        seen = {"states": collect(tracked, sort=True), "emitted": collect(tracked.emitted(), sort=True)}
        ssc.start()
        run_batches(ssc, len(batches))
    got = {name: _by_second(rows) for name, rows in seen.items()}
    # Watermarks: -, 1, 3, 4, 4, 7, 7; batch i runs at i s. x: "old" deleted and "close" moved to 5 by the
    # update of batch 2; "again" (set by early's callback in batch 3, already due) fires in batch 4, event-time
    # timers before processing-time ones; "close" drops x in batch 6, and its "late" (7 s) with it. y: a and b
    # (same time: tag order); a's callback deletes c and b's moves p, both due in batch 3: neither fires there.
    assert got["emitted"] == {
        1: [],
        2: [("x", 0, "processing", "tick", 2)],
        3: [("x", 1, "event", "early", 3), ("y", 0, "event", "a", 3), ("y", 1, "event", "b", 3)],
        4: [("x", 2, "event", "again", 1), ("x", 3, "processing", "later", 4), ("z", 0, "event", "event", 4)],
        5: [("y", 2, "processing", "p", 5), ("z", 1, "processing", "processing", 5)],
        6: [("x", 4, "event", "close", 5)],
        7: [],
    }
    assert got["states"][5] == [("x", 4), ("y", 3), ("z", 2)]
    assert got["states"][7] == [("y", 3), ("z", 2)]


# The rule, batch by batch, on the node's pure merge (no Spark): ``track_batch``.
def fired_by(key: str, state: list[str], timer: Timer) -> Any:
    """Records the firing order in the state and emits the timer; reacts as ``RULES[tag]`` says."""
    react = RULES.get(timer.tag)
    state = [*state, timer.tag]
    if react == "drop":
        return TrackUpdate(None, emit=[timer])
    return TrackUpdate(state, emit=[timer], timers=react)


RULES: dict[str, Any] = {}


def run_batch(previous: list[Any], events: dict[str, list[Any]], now: int, watermark: int | None,
              rules: dict[str, Any] | None = None) -> tuple[list[Any], dict[str, list[Timer]]]:
    """One batch of ``track_batch``: events are ``TrackUpdate`` keyword arguments; returns the new entries and
    the timers each key fired, in order."""
    from dstreams.nodes.timers import emitted_records, track_batch

    RULES.clear()
    RULES.update(rules or {})
    out = track_batch(previous, list(events.items()),
                      init=lambda k, ev: TrackUpdate([], **ev), update=lambda k, s, ev: TrackUpdate(s, **ev),
                      on_timer=fired_by, now_ms=now * 1000, timeout_ms=60_000,
                      watermark_ms=None if watermark is None else watermark * 1000)
    fired = {k: list(emitted_records(iter([(k, entry)]))) for k, entry in out}
    return out, {k: timers for k, timers in fired.items() if timers}


def tags(fired: dict[str, list[Timer]], key: str = "k") -> list[str | None]:
    return [t.tag for t in fired.get(key, [])]


def test_due_timers_fire_event_time_first_each_kind_in_time_then_tag_order():
    _, fired = run_batch([], {"k": [{"timers": {
        "z": T("event", 5), "a": T("event", 5), "m": T("event", 2), "p": T("processing", 1),
        "o": T("processing", 1), "q": T("processing", 3), "future": T("event", 6)}}]}, now=3, watermark=5)
    assert tags(fired) == ["m", "a", "z", "o", "p", "q"]
    assert fired["k"][0] == Timer("event", 2, "m")


def test_a_due_timer_deleted_or_replaced_by_an_earlier_callback_does_not_fire():
    rules = {"first": {"gone": None, "moved": T("event", 9), "same": T("event", 4)}}
    timers = {"first": T("event", 1), "gone": T("event", 2), "moved": T("event", 3), "same": T("event", 4)}
    out, fired = run_batch([], {"k": [{"timers": timers}]}, now=1, watermark=5, rules=rules)
    assert tags(fired) == ["first"]
    # Replaced by a callback (even to the time it had): a later batch; deleted: never.
    _, fired = run_batch(out, {}, now=2, watermark=5, rules=rules)
    assert tags(fired) == ["same"]
    _, fired = run_batch(out, {}, now=2, watermark=9, rules=rules)
    assert tags(fired) == ["same", "moved"]


def test_a_timer_set_by_on_timer_fires_in_a_later_batch_one_set_by_an_event_in_the_same():
    rules = {"loop": {"loop": T("processing", 1)}}  # re-arms itself, already due
    out, fired = run_batch([], {"k": [{"timers": {"loop": T("processing", 1)}}]}, now=5, watermark=None,
                           rules=rules)
    assert tags(fired) == ["loop"]
    for _ in range(2):
        out, fired = run_batch(out, {}, now=6, watermark=None, rules=rules)
        assert tags(fired) == ["loop"]
    # An update of a later batch sets a due event-time timer: it fires in that batch, after the event.
    out, fired = run_batch(out, {"k": [{"timers": {"now": T("event", 2), "loop": None}}]}, now=7, watermark=2)
    assert tags(fired) == ["now"]


def test_a_dropped_key_loses_all_its_timers():
    rules = {"stop": "drop"}
    timers = {"stop": T("event", 1), "next": T("event", 2), "tick": T("processing", 1), "later": T("event", 8)}
    out, fired = run_batch([], {"k": [{"timers": timers}]}, now=5, watermark=5, rules=rules)
    assert tags(fired) == ["stop"]
    assert out == [("k", out[0][1])] and not out[0][1][-2]  # emitted, not alive
    _, fired = run_batch(out, {}, now=9, watermark=9, rules=rules)
    assert fired == {}
    # Dropped by update (state None), re-created by the next event of the batch: none of the old timers.
    out, _ = run_batch([], {"k": [{"timers": {"later": T("event", 8)}}]}, now=1, watermark=None)
    out = track_batch_drop_then_init(out)
    _, fired = run_batch(out, {}, now=9, watermark=9)
    assert tags(fired) == ["fresh"]


def track_batch_drop_then_init(previous: list[Any]) -> list[Any]:
    from dstreams.nodes.timers import track_batch

    def update(k: str, s: Any, ev: str) -> Any:
        return None if ev == "drop" else TrackUpdate(s, timers={"fresh": T("event", 9)})

    return track_batch(previous, [("k", ["drop", "init"])], init=lambda k, ev: update(k, [], ev), update=update,
                       on_timer=fired_by, now_ms=2000, timeout_ms=60_000, watermark_ms=1000)


def test_eventTime_and_processingTime_are_the_timers_of_the_default_tags():
    out, fired = run_batch([], {"k": [{"eventTime": 3, "processingTime": 4, "timers": {"x": T("event", 3)}}]},
                           now=1, watermark=None)
    assert fired == {}
    out, fired = run_batch(out, {"k": [{"eventTime": 4}]}, now=4, watermark=3)  # replaces the event timer
    assert fired["k"] == [Timer("event", 3, "x"), Timer("processing", 4, "processing")]
    out, fired = run_batch(out, {"k": [{"timers": {"event": None}}]}, now=9, watermark=9)  # deletes it
    assert fired == {}


def test_bad_timers_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"kind must be 'event' or 'processing', got 'evnt'"):
        Timer("evnt", 1)
    with pytest.raises(TypeError, match=r"seconds since the epoch .* or a datetime, got 'soon'"):
        Timer("event", "soon")
    with pytest.raises(TypeError, match=r"got True"):
        Timer("processing", True)
    with pytest.raises(ValueError, match=r"finite.*nan"):
        Timer("event", float("nan"))
    with pytest.raises(TypeError, match=r"a timer's tag must be a str, got 3 \(int\)"):
        Timer("event", 1, tag=3)
    with pytest.raises(TypeError, match=r"timers= must be a dict tag -> Timer\(kind, time\).* or None \(delete\), "
                                        r"got list"):
        TrackUpdate(1, timers=[T("event", 1)])
    with pytest.raises(TypeError, match=r"a timer's tag must be a str, got \('a',\) \(tuple\)"):
        TrackUpdate(1, timers={("a",): T("event", 1)})
    with pytest.raises(TypeError, match=r"timers\['a'\] must be a Timer\(kind, time\).*or None.*, got 5"):
        TrackUpdate(1, timers={"a": 5})
    with pytest.raises(ValueError, match=r"timers\['a'\] has tag 'b'"):
        TrackUpdate(1, timers={"a": T("event", 1, tag="b")})
    with pytest.raises(ValueError, match=r"eventTime= .* timers\['event'\]"):
        TrackUpdate(1, eventTime=3, timers={"event": None})
    with pytest.raises(TypeError, match=r"processingTime= .* got 'x'"):
        TrackUpdate(1, processingTime="x")
    # What is accepted: a tag equal to the key, a datetime (naive: UTC), a float.
    TrackUpdate(1, timers={"a": T("event", dt.datetime(2024, 1, 1), tag="a"), "b": T("processing", 1.5)})
