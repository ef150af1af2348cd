"""Event time: per-batch low watermarks (monotone, the minimum across streams), late records dropped and
counted, and the watermark recorded in the metadata log so that a resumed driver replays it.

Batches run on a ManualClock: batch ``i`` (1-based) at ``i * 1000`` ms, zero time 0. Event times are
seconds since the epoch (small numbers here). The watermark of batch ``i`` reflects the batches before it.
"""

from __future__ import annotations

import json
import operator
import os
from typing import Any

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.metadata import MetadataLog
from dstreams.recovery.store import open_store
from dstreams.testing import collect, manual_context, run_batches
from dstreams.time import from_user_time

from .test_event_time_timers import on_init, on_timer, on_update


def ts_of(r: tuple[float, Any]) -> float:
    return r[0]


A = [[(10, "a1"), (12, "a2")], [(20, "a3")], [(15, "late?"), (8, "late")], [], [(40, "a4")], [(25, "late2")]]
B = [[(5, "b1")], [(6, "b2")], [(30, "b3")], [(31, "b4")], [], []]


@pytest.mark.slow
@pytest.mark.parametrize("drop_late", [False, True], ids=["default", "dropLate"])
def test_watermark_is_monotone_from_earlier_batches_and_late_records_are_counted(sc, drop_late):
    """Records behind the watermark are counted and listed by lateRecords(); they stay in the timed stream (for
    the windows still open, tests/property/test_event_time_windows.py) unless withEventTime(..., dropLate=True)."""
    with manual_context(1, sc=sc) as ssc:
        timed = ssc.queueStream([sc.parallelize(b, 2) for b in A]).withEventTime(ts_of, allowedLateness="5s",
                                                                                dropLate=drop_late)
        marks = collect(timed.watermarks(), sort=True)
        kept = collect(timed.map(lambda r: r[1]), sort=True)
        late = collect(timed.lateRecords(), sort=True)
        ssc.start()
        infos = run_batches(ssc, 6)
    # max event time before batch i, minus 5 s: -, 7, 15, 15 (20 is the max), 15, 35
    assert [marks[i * 1000] for i in range(1, 7)] == [[None], [7], [15], [15], [15], [35]]
    assert late[3000] == [(8, "late")] and late[6000] == [(25, "late2")]
    assert kept[3000] == (["late?"] if drop_late else ["late", "late?"])
    assert kept[6000] == ([] if drop_late else ["late2"])
    metrics = [next(iter(i.event_time.values())) for i in infos]
    assert [m["lateRecords"] for m in metrics] == [0, 0, 1, 0, 0, 1]
    assert [m["watermarkMs"] for m in metrics] == [None, 7000, 15000, 15000, 15000, 35000]
    assert metrics[2]["records"] == 2 and metrics[2]["stream"].startswith("withEventTime#")


@pytest.mark.slow
def test_watermark_of_a_union_and_a_join_is_the_minimum_and_a_backlog_gives_the_same(sc):
    def build(ssc) -> dict[str, dict[int, Any]]:
        a = ssc.queueStream([sc.parallelize(b, 2) for b in A]).withEventTime(ts_of, "5s")
        b = ssc.queueStream([sc.parallelize(x, 1) for x in B]).withEventTime(ts_of, "1s")
        joined = a.map(lambda r: (1, r[1])).join(b.map(lambda r: (1, r[1])))
        return {"a": collect(a.watermarks(), sort=True), "b": collect(b.watermarks(), sort=True),
                "union": collect(a.union(b).watermarks(), sort=True), "join": collect(joined.watermarks(), sort=True)}

    results = []
    for backlog in (False, True):
        with manual_context(1, sc=sc) as ssc:
            out = build(ssc)
            ssc.start()
            run_batches(ssc, 6, backlog=backlog)
        results.append(out)
    out = results[0]
    a = [out["a"][i * 1000][0] for i in range(1, 7)]
    b = [out["b"][i * 1000][0] for i in range(1, 7)]
    assert a == [None, 7, 15, 15, 15, 35]
    assert b == [None, 4, 5, 29, 30, 30]
    expected = [None if x is None or y is None else min(x, y) for x, y in zip(a, b, strict=True)]
    assert [out["union"][i * 1000][0] for i in range(1, 7)] == expected
    assert [out["join"][i * 1000][0] for i in range(1, 7)] == expected
    assert all(x is None or y is None or x <= y for x, y in zip(expected, expected[1:], strict=False))
    assert results[1] == results[0]  # batches generated before the earlier ones ran: the same watermarks


def test_a_source_declared_watermark_caps_the_stream_watermark(sc):
    with manual_context(1, sc=sc) as ssc:
        source = ssc.queueStream([sc.parallelize(b, 1) for b in A])
        source._node.event_time_watermark = lambda time: 11_000 if time.ms < 5000 else None  # MillWheel's injector
        marks = collect(source.withEventTime(ts_of, "5s").watermarks(), sort=True)
        ssc.start()
        run_batches(ssc, 6)
    # Without the cap: None, 7, 15, 15, 15, 35; capped at 11 s before batch 5 (never going back).
    assert [marks[i * 1000] for i in range(1, 7)] == [[None], [7], [11], [11], [15], [35]]


# ---------------------------------------------------------------------- failover
def clicks(seed: int, t: int, partition: int, n: int) -> list[tuple[float, str]]:
    """Out-of-order clicks: batch t carries event times around t - 2 s, some up to 6 s older."""
    base = t / 1000 - 2
    return [(base - ((t // 1000 + partition + i) % 4) * 2, f"u{(t // 1000 + i) % 3}") for i in range(n)]


def build_timed(sc, ckpt: str, clock: ManualClock, out: str) -> StreamingContext:
    """The graph is restored from the checkpoint on resume: outputs go to files, not to test objects."""
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(ckpt)
    timed = ssc.generatorStream(3, 2, seed=7, recordFunc=clicks).withEventTime(ts_of, allowedLateness="3s")

    def keep(name: str):
        def run(time, rdd) -> None:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, f"{name}-{from_user_time(time).ms}.json"), "w") as f:
                json.dump(sorted(rdd.collect(), key=repr), f)
        return run

    timed.watermarks().foreachRDD(keep("marks"))
    timed.lateRecords().foreachRDD(keep("late"))
    windows = timed.map(lambda r: (r[1], 1)).reduceByKeyAndEventWindow(
        operator.add, "4s", "2s", invFunc=operator.sub, numPartitions=2)
    windows.checkpoint("2s").foreachRDD(keep("windows"))  # the window state, checkpointed every 2 batches
    timed.map(lambda r: (r[1], r[0])).sessionWindow("1500ms", aggregate=len).foreachRDD(keep("sessions"))
    by_bucket = timed.map(lambda r: (int(r[0]) // 2, r[0]))  # keys that stop receiving events: they close
    tracked = by_bucket.track(on_init, on_update, "30s", 2, timers=on_timer).checkpoint("2s")  # timers too
    tracked.emitted().foreachRDD(keep("timers"))
    return ssc


def _read(out: str) -> dict[str, dict[int, Any]]:
    seen: dict[str, dict[int, Any]] = {}
    for name in os.listdir(out):
        kind, _, ms = name[:-len(".json")].partition("-")
        with open(os.path.join(out, name)) as f:
            seen.setdefault(kind, {})[int(ms)] = f.read()
    return seen


def _resume(sc, ckpt: str, out: str, now_ms: int, batches: range) -> None:
    """A new driver (getOrCreate, the graph restored from the checkpoint) started at ``now_ms`` runs ``batches``."""
    clock = ManualClock(now_ms)
    ssc = StreamingContext.getOrCreate(ckpt, lambda: build_timed(sc, ckpt, clock, out), clock=clock)
    try:
        ssc.start()
        for i in batches:
            clock.set_time(max(clock.time_ms(), i * 1000))
            ssc.awaitBatch(i * 1000, 60)
    finally:
        ssc.stop(stopSparkContext=False)


@pytest.mark.slow
def test_resumed_driver_replays_the_recorded_watermarks_and_continues_the_same(sc, tmp_path):
    clock = ManualClock()
    ssc = build_timed(sc, str(tmp_path / "ref"), clock, str(tmp_path / "ref-out"))
    try:
        ssc.start()
        run_batches(ssc, 10)
    finally:
        ssc.stop(stopSparkContext=False)
    ref = _read(str(tmp_path / "ref-out"))
    assert any(v != "[]" for v in ref["late"].values()) and ref["marks"][10_000] != "[null]"
    assert sum(len(json.loads(v)) for v in ref["windows"].values()) >= 10
    assert sum(len(json.loads(v)) for v in ref["sessions"].values()) >= 3
    fired = [r for v in ref["timers"].values() for r in json.loads(v)]
    assert {r[0] for r in fired} == {"closed", "tick"}

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    clock = ManualClock()
    first = StreamingContext.getOrCreate(ckpt, lambda: build_timed(sc, ckpt, clock, out))
    try:
        first.start()
        run_batches(first, 5)
    finally:
        first.stop(stopSparkContext=False)  # the driver "dies" after batch 5
    head = MetadataLog.read(open_store(ckpt))
    assert head is not None
    recorded = {int(t): o for t, o in head["offsets"].items()}
    wm_key = next(k for k in recorded[5000] if "EventTime" in k)
    assert recorded[5000][wm_key]["wm"] == json.loads(ref["marks"][5000])[0] * 1000
    assert [k for k in head["checkpoints"] if "EventWindowNode" in k]  # the window state was checkpointed
    audit = json.loads(open(os.path.join(ckpt, "meta", "batches", f"{5000:015d}.json")).read())
    assert audit["offsets"][wm_key] == recorded[5000][wm_key]  # the batch's audit record holds it too

    _resume(sc, ckpt, out, 8000, range(6, 11))  # down for batches 6..8: caught up at once
    assert _read(out) == ref


@pytest.mark.slow
def test_a_replayed_batch_sees_exactly_the_watermark_recorded_for_it(sc, tmp_path):
    """Batches 4 and 5 were recorded (generated) but not completed when the driver died: the resumed driver
    rebuilds them with their recorded watermarks, even one that recomputing would not give."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    clock = ManualClock()
    first = StreamingContext.getOrCreate(ckpt, lambda: build_timed(sc, ckpt, clock, out))
    try:
        first.start()
        run_batches(first, 5)
    finally:
        first.stop(stopSparkContext=False)
    ref = _read(out)
    path = os.path.join(ckpt, "meta", "head.json")
    with open(path) as f:
        head = json.load(f)
    key = next(k for k in head["offsets"]["4000"] if "EventTime" in k)
    recorded = head["offsets"]["4000"][key]["wm"]
    head["offsets"]["4000"][key]["wm"] = recorded - 500  # what the old driver fixed, say
    head["completed_through"] = 3000  # 4 and 5 were pending
    with open(path, "w") as f:
        json.dump(head, f)
    _resume(sc, ckpt, out, 5000, range(4, 7))
    got = _read(out)
    assert json.loads(got["marks"][4000]) == [(recorded - 500) / 1000]
    assert got["marks"][5000] == ref["marks"][5000]  # recorded too: replayed as it was
    assert json.loads(got["marks"][6000])[0] >= json.loads(got["marks"][5000])[0]
