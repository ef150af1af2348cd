"""Issue 44: dead letters. A record a per-record function raises on goes, with ``onError="deadLetter"`` (or
``spark.dstreams.onRecordError=deadLetter``), to a dead-letter stream that carries the record, the operator, the
error and the batch, while the rest of the batch goes on; a re-run batch routes the same records, and the outputs of
both streams are exactly once through a failed batch and a restart."""

from __future__ import annotations

import json
import os

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.dead_letters import DeadLetter
from dstreams.testing import collect, manual_context, run_batches

from ..recovery_app import read_outputs

TIMEOUT_S = 120.0


def _parse(x):  # noqa: ANN001, ANN202 - a user function that refuses some records
    if x == "poison":
        raise ValueError(f"cannot parse {x!r}")
    return int(x)


@pytest.mark.slow
def test_each_per_record_operator_routes_what_its_function_raises_on(sc):
    with manual_context(1, sc=sc) as ssc:
        batches = [["1", "poison", "2"], ["3"], ["poison", "poison"]]
        lines = ssc.queueStream([sc.parallelize(b, 2) for b in batches])
        numbers = lines.map(_parse, onError="deadLetter")
        evens = numbers.filter(lambda n: 10 // (n - 3) != 0 and n % 2 == 0, onError="deadLetter")  # 3: ZeroDivision
        spread = numbers.flatMap(lambda n: [n] * n if n != 2 else [n, n / 0], onError="deadLetter")  # 2: none of it
        pairs = numbers.map(lambda n: (n % 2, n))
        halves = pairs.mapValues(lambda v: 1 / (v - 1), onError="deadLetter")
        listed = pairs.flatMapValues(lambda v: range(v) if v != 3 else None, onError="deadLetter")
        streams = {"numbers": numbers, "evens": evens, "spread": spread, "halves": halves, "listed": listed}
        got = {name: collect(stream) for name, stream in streams.items()}
        dead = {name: collect(stream.deadLetters()) for name, stream in streams.items()}
        ssc.start()
        run_batches(ssc, 3, timeout=TIMEOUT_S)
    assert got["numbers"] == {1000: [1, 2], 2000: [3], 3000: []}
    assert [(d.record, d.operator, d.batchTime) for d in dead["numbers"][1000]] == [("poison", "map#1", 1000)]
    assert dead["numbers"][1000][0].error == "ValueError: cannot parse 'poison'"
    assert [d.record for d in dead["numbers"][3000]] == ["poison", "poison"]
    assert all(isinstance(d, DeadLetter) for b in dead.values() for ds in b.values() for d in ds)
    assert got["evens"] == {1000: [2], 2000: [], 3000: []}
    assert [(d.record, d.operator, d.error.split(":")[0]) for d in dead["evens"][2000]] == [
        (3, "filter#2", "ZeroDivisionError")]
    assert got["spread"] == {1000: [1], 2000: [3, 3, 3], 3000: []}
    assert [d.record for d in dead["spread"][1000]] == [2]  # none of 2's elements: it raised while they were made
    assert got["halves"] == {1000: [(0, 1.0)], 2000: [(1, 0.5)], 3000: []}
    assert [d.record for d in dead["halves"][1000]] == [(1, 1)]
    assert got["listed"] == {1000: [(1, 0), (0, 0), (0, 1)], 2000: [], 3000: []}
    assert [(d.record, d.error.split(":")[0]) for d in dead["listed"][2000]] == [((1, 3), "TypeError")]


def test_the_setting_routes_every_operator_once_per_record_and_the_context_unites_them(sc, monkeypatch):
    monkeypatch.setenv("DSTREAMS_ON_RECORD_ERROR", "deadLetter")
    calls = sc.accumulator(0)

    def parse(x):  # noqa: ANN001, ANN202
        calls.add(1)
        return _parse(x)

    with manual_context(1, sc=sc) as ssc:
        lines = ssc.queueStream([sc.parallelize(["1", "poison", "x2"], 2)])
        numbers = lines.filter(lambda s: not s.startswith("x")).map(parse)
        strict = lines.map(_parse, onError="fail")  # the operator's own choice wins
        with pytest.raises(ValueError, match="routes no dead letters"):
            strict.deadLetters()
        got = collect(numbers)
        again = collect(numbers.map(lambda n: n))  # a second output: the function still runs once
        every = collect(ssc.deadLetters())
        ssc.start()
        run_batches(ssc, 1, timeout=TIMEOUT_S)
    assert got == {1000: [1]} and again == {1000: [1]}
    assert [(d.record, d.operator) for d in every[1000]] == [("poison", "map#2")]
    assert calls.value == 2, "the guarded function ran more than once per record"


def test_dead_letters_defined_after_the_context_united_them_are_refused_at_start(sc):
    with manual_context(1, sc=sc) as ssc:
        lines = ssc.queueStream([sc.parallelize(["1"])])
        with pytest.raises(ValueError, match="no operator of this context routes dead letters"):
            ssc.deadLetters()
        lines.map(_parse, onError="deadLetter").pprint()
        ssc.deadLetters().pprint()
        lines.filter(bool, onError="deadLetter").pprint()
        with pytest.raises(ValueError, match=r"1 more were defined after it: call ssc.deadLetters\(\) after"):
            ssc.start()
    with manual_context(1, sc=sc) as other:
        with pytest.raises(ValueError, match="onError must be one of 'fail', 'deadLetter'"):
            other.queueStream([]).map(_parse, onError="skip")


class FailsOnce:
    """An output that raises once in batch ``fail_ms`` while the file ``armed`` exists (then removes it)."""

    def __init__(self, armed: str, fail_ms: int) -> None:
        self.armed, self.fail_ms = armed, fail_ms

    def __call__(self, t, rdd) -> None:  # noqa: ANN001
        if round(t.timestamp() * 1000) == self.fail_ms and os.path.exists(self.armed):
            os.remove(self.armed)
            raise RuntimeError(f"the sink is down (batch {self.fail_ms})")


def _write(inputd: str, t_ms: int, lines: list[str]) -> None:
    path = os.path.join(inputd, f"f{t_ms}.txt")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(path + ".tmp", path)


INPUT = {1000: ["1", "poison", "2"], 2000: ["3", "poison", "4"], 3000: ["5", "not a number"]}


def _run(sc, tmp, monkeypatch, fail: bool) -> dict[str, list[str]]:  # noqa: ANN001
    """Run the three batches, with (``fail``) batch 2000 failing for good in its last output and the driver
    stopping, then a restart from the checkpoint; return what the outputs committed."""
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "stop")
    inputd, out, cpd, armed = (os.path.join(tmp, n) for n in ("in", "out", "cp", "armed"))
    os.makedirs(inputd)
    if fail:
        open(armed, "w").close()

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=ManualClock())
        numbers = ssc.textFileStream(inputd).map(_parse, onError="deadLetter")
        totals = numbers.map(lambda n: ("sum", n)).updateStateByKey(lambda vs, s: sum(vs, s or 0))
        totals.map(lambda kv: f"{kv[0]}={kv[1]}").saveAsTextFiles(os.path.join(out, "totals"))
        lines = ssc.textFileStream(inputd)
        strict = lines.map(lambda x: ("n", x)).updateStateByKey(  # a key's whole batch refused by the update
            lambda vs, s: (s or 0) + sum(int(v) for v in vs if v != "poison"), onError="deadLetter")
        strict.map(lambda kv: f"{kv[0]}={kv[1]}").saveAsTextFiles(os.path.join(out, "strict"))
        lengths = lines.map(lambda x: (len(x) > 1, x)).runningReduce(lambda a, b: str(int(a) + int(b)),
                                                                     onError="deadLetter")
        lengths.map(lambda kv: f"{kv[0]}={kv[1]}").saveAsTextFiles(os.path.join(out, "lengths"))
        ssc.deadLetters().map(lambda d: json.dumps([d.record, d.operator, d.error, d.batchTime])).saveAsTextFiles(
            os.path.join(out, "dead"))
        numbers.foreachRDD(FailsOnce(armed, 2000))
        return ssc

    first = StreamingContext.getOrCreate(cpd, setup)
    first.start()
    try:
        for t in (1000, 2000, 3000):
            _write(inputd, t, INPUT[t])
            if fail and t == 2000:
                first.clock.set_time(t)
                with pytest.raises(RuntimeError, match="the sink is down"):
                    first.awaitTermination(TIMEOUT_S)
                break
            run_batches(first, 1, timeout=TIMEOUT_S)
    finally:
        first.stop(stopSparkContext=False, stopGraceFully=not fail)
    if fail:
        second = StreamingContext.getOrCreate(cpd, setup, clock=ManualClock(2000))
        second.start()
        try:
            second.awaitBatch(2000, TIMEOUT_S)
            _write(inputd, 3000, INPUT[3000])
            run_batches(second, 1, timeout=TIMEOUT_S)
        finally:
            second.stop(stopSparkContext=False, stopGraceFully=True)
    return {name: sorted(lines) for name, lines in read_outputs(out).items()}


@pytest.mark.slow
def test_dead_letters_and_outputs_are_exactly_once_through_a_failed_batch_and_a_restart(sc, tmp_path, monkeypatch):
    expected = _run(sc, str(tmp_path / "clean"), monkeypatch, fail=False)
    assert expected["totals-3000"] == ["sum=15"]
    by_operator = lambda lines: sorted((json.loads(x) for x in lines), key=lambda d: d[1])  # noqa: E731
    assert [d[:2] for d in by_operator(expected["dead-2000"])] == [
        ["poison", "map#1"], [[True, "poison"], "runningReduce#3"]]
    dead_3000 = by_operator(expected["dead-3000"])
    assert dead_3000[0] == [
        "not a number", "map#1", "ValueError: invalid literal for int() with base 10: 'not a number'", 3000]
    assert [d[:2] for d in dead_3000[1:]] == [[[True, "not a number"], "runningReduce#3"],
                                              [["n", ["5", "not a number"]], "updateStateByKey#2"]]
    assert expected["strict-3000"] == ["n=10"]  # batch 2000's "poison": its key's values went to the dead letters
    assert expected["lengths-3000"] == ["False=15"]
    got = _run(sc, str(tmp_path / "failed"), monkeypatch, fail=True)
    assert got == expected


def _add(a, b):  # noqa: ANN001, ANN202 - a reduce that refuses what is not a number
    return a + b


@pytest.mark.slow
def test_reduces_route_the_record_being_added_and_a_first_value_that_cannot_combine(sc):
    """Kafka Streams' rule for a reduce: the record being added is the dead letter; a ``None`` first value (it cannot
    be combined with itself, the next value can) is the dead letter itself. The results equal a reduce of the
    records that are not dead letters."""
    with manual_context(1, sc=sc) as ssc:
        batches = [[("a", 1), ("a", "x"), ("b", None), ("b", 2), ("a", 3), "not a pair"], [("a", 4), ("c", [1])]]
        pairs = ssc.queueStream([sc.parallelize(b, 1) for b in batches])
        by_key = pairs.reduceByKey(_add, 2, onError="deadLetter")
        running = pairs.runningReduce(_add, 2, onError="deadLetter")
        values = pairs.map(lambda kv: kv[1] if isinstance(kv, tuple) else kv, onError="fail")
        total = values.reduce(_add, onError="deadLetter")
        streams = {"by_key": by_key, "running": running, "total": total}
        got = {name: collect(stream) for name, stream in streams.items()}
        dead = {name: collect(stream.deadLetters()) for name, stream in streams.items()}
        ssc.start()
        run_batches(ssc, 2, timeout=TIMEOUT_S)
    assert sorted(got["by_key"][1000]) == [("a", 4), ("b", 2)]
    assert sorted(got["by_key"][2000]) == [("a", 4), ("c", [1])]
    assert [(d.record, d.operator, d.batchTime) for d in dead["by_key"][1000]] == [
        (("a", "x"), "reduceByKey#1", 1000), (("b", None), "reduceByKey#1", 1000),
        ("not a pair", "reduceByKey#1", 1000)]
    assert dead["by_key"][1000][0].error.startswith("TypeError: unsupported operand")
    assert dead["by_key"][1000][2].error.startswith("TypeError: reduceByKey#1 needs (key, value) pairs")
    assert dead["by_key"][2000] == []
    assert sorted(got["running"][2000]) == [("a", 8), ("b", 2), ("c", [1])]
    assert [d.record for d in dead["running"][1000]] == [("a", "x"), ("b", None), "not a pair"]
    # the values 1, "x", None, 2, 3, "not a pair": 1 + "x" raises ("x" out), 1 + None ... (None out), 3 + 2 + 3
    assert got["total"] == {1000: [6], 2000: [4]}
    assert [d.record for d in dead["total"][1000]] == ["x", None, "not a pair"]
    assert [d.record for d in dead["total"][2000]] == [[1]]


def test_windowed_reduces_route_each_batch_s_records_once_as_they_enter(sc):
    with manual_context(1, sc=sc) as ssc:
        batches = [[("a", 1), ("a", "x")], [("a", 2)], [("a", None), ("b", 5)]]
        pairs = ssc.queueStream([sc.parallelize(b, 1) for b in batches])
        windowed = pairs.reduceByKeyAndWindow(_add, lambda a, b: a - b, 2, 1, 1, onError="deadLetter")
        totals = pairs.map(lambda kv: kv[1], onError="fail").reduceByWindow(_add, None, 2, 1, onError="deadLetter")
        streams = {"windowed": windowed, "totals": totals}
        got = {name: collect(stream) for name, stream in streams.items()}
        dead = {name: collect(stream.deadLetters()) for name, stream in streams.items()}
        ssc.start()
        run_batches(ssc, 3, timeout=TIMEOUT_S)
    assert {t: sorted(v) for t, v in got["windowed"].items()} == {
        1000: [("a", 1)], 2000: [("a", 3)], 3000: [("a", 2), ("b", 5)]}
    assert {t: [d.record for d in ds] for t, ds in dead["windowed"].items()} == {
        1000: [("a", "x")], 2000: [], 3000: [("a", None)]}  # None alone in its partition: None + None raises
    assert got["totals"] == {1000: [1], 2000: [3], 3000: [7]}
    assert {t: [d.record for d in ds] for t, ds in dead["totals"].items()} == {1000: ["x"], 2000: [], 3000: [None]}


def _use_state_backend(monkeypatch, tmp_path, store: str) -> None:  # noqa: ANN001
    """Make the state operators defined next use ``store`` (rdd, executor, auto: auto moves at once)."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", store)
    monkeypatch.setenv("DSTREAMS_STATE_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("DSTREAMS_STATE_AUTO_KEYS", "1")


def _sum_or_refuse(values, state):  # noqa: ANN001, ANN202 - an update function that refuses a key's bad values
    if "poison" in values:
        raise ValueError("poison among the values")
    return (state or 0) + sum(values)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["rdd", "executor", "auto"])
@pytest.mark.parametrize("idle", [True, False])
def test_update_state_by_key_keeps_a_failed_key_s_state_and_routes_its_values(sc, tmp_path, monkeypatch, store, idle):
    """A key whose update function raises keeps its state (a new key gets none), its values are the dead letter,
    other keys go on; the state stream, ``changes()`` and the dead letters agree on every state backend."""
    _use_state_backend(monkeypatch, tmp_path, store)
    with manual_context(1, sc=sc) as ssc:
        batches = [[("a", 1), ("b", 2)], [("a", "poison"), ("a", 5), ("c", "poison"), ("b", 1)], [("a", 2), ("c", 3)],
                   []]
        pairs = ssc.queueStream([sc.parallelize(b, 2) for b in batches])
        state = pairs.updateStateByKey(_sum_or_refuse, 2, updateIdleKeys=idle, onError="deadLetter")
        got, changes, dead = collect(state), collect(state.changes()), collect(state.deadLetters())
        ssc.start()
        run_batches(ssc, 4, timeout=TIMEOUT_S)
    assert {t: sorted(v) for t, v in got.items()} == {
        1000: [("a", 1), ("b", 2)], 2000: [("a", 1), ("b", 3)], 3000: [("a", 3), ("b", 3), ("c", 3)],
        4000: [("a", 3), ("b", 3), ("c", 3)]}
    assert {t: sorted((d.record, d.operator, d.batchTime) for d in ds) for t, ds in dead.items()} == {
        1000: [], 2000: [(("a", ["poison", 5]), "updateStateByKey#1", 2000),
                         (("c", ["poison"]), "updateStateByKey#1", 2000)], 3000: [], 4000: []}
    assert all(d.error == "ValueError: poison among the values" for d in dead[2000])
    # changes: what the user would upsert; a failed key's state is as it was (a failed new key: no state)
    assert dict(changes[2000])["b"] == 3 and dict(changes[2000]).get("a", 1) == 1
    assert dict(changes[2000]).get("c") is None
    assert sorted(changes[3000]) == [("a", 3), ("c", 3)]


def _track_init(k, ev):  # noqa: ANN001, ANN202 - refuses a negative first event
    if ev < 0:
        raise ValueError(f"negative start {ev}")
    return ev


def _track_update(k, s, ev):  # noqa: ANN001, ANN202 - refuses a zero
    from dstreams import TrackUpdate

    return TrackUpdate(s + 10 // ev, emit=[(k, "seen", ev)])


@pytest.mark.slow
@pytest.mark.parametrize("store", ["rdd", "executor", "auto"])
def test_track_keeps_the_state_before_a_failed_event_and_routes_it(sc, tmp_path, monkeypatch, store):
    """``track(..., onError="deadLetter")``: an ``init``/``update`` that raises leaves the key's state as before that
    event and ``(key, event)`` is the dead letter; the key's later events go on; ``emitted()`` holds only the
    user's records; on every state backend."""
    _use_state_backend(monkeypatch, tmp_path, store)
    with manual_context(1, sc=sc) as ssc:
        batches = [[("a", 5), ("b", -1), ("b", 2)], [("a", 0), ("a", 2), ("c", -3)], [("b", 1)]]
        events = ssc.queueStream([sc.parallelize(b, 1) for b in batches])
        tracked = events.track(_track_init, _track_update, 60, 2, onError="deadLetter")
        got, emitted, dead = collect(tracked), collect(tracked.emitted()), collect(tracked.deadLetters())
        ssc.start()
        run_batches(ssc, 3, timeout=TIMEOUT_S)
    # b: init(-1) raised (no state), then init(2); a: update(0) raised (state 5 kept), then update(2): 5 + 5
    assert {t: sorted(v) for t, v in got.items()} == {
        1000: [("a", 5), ("b", 2)], 2000: [("a", 10), ("b", 2)], 3000: [("a", 10), ("b", 12)]}
    assert {t: sorted(v) for t, v in emitted.items()} == {1000: [], 2000: [("a", "seen", 2)],
                                                          3000: [("b", "seen", 1)]}
    assert {t: sorted((d.record, d.operator, d.batchTime) for d in ds) for t, ds in dead.items()} == {
        1000: [(("b", -1), "track#1", 1000)], 2000: [(("a", 0), "track#1", 2000), (("c", -3), "track#1", 2000)],
        3000: []}
    assert sorted(d.error for d in dead[2000]) == ["ValueError: negative start -3",
                                                   "ZeroDivisionError: integer division or modulo by zero"]


def test_event_time_per_record_operators_route_what_they_raise_on_and_keep_the_event_time(sc):
    """``TimedDStream.map/filter/...(onError="deadLetter")``: the good records keep their event time (an event
    window downstream counts them in their windows); the records the function raised on are dead letters."""
    import operator

    with manual_context(1, sc=sc) as ssc:
        raw = [[(1, "a", "1"), (2, "a", "x"), (11, "b", "2")], [(3, "a", "5")]]  # (event second, key, text)
        timed = ssc.queueStream([sc.parallelize(b, 1) for b in raw]).withEventTime(lambda r: r[0], allowedLateness=30)
        parsed = timed.map(lambda r: (r[1], int(r[2])), onError="deadLetter")
        kept = parsed.filter(lambda kv: 10 // (kv[1] - 2) != 99, onError="deadLetter")  # 2: ZeroDivisionError
        windows = kept.reduceByKeyAndEventWindow(operator.add, 10, emit="updates")
        got, dead_parsed, dead_kept = collect(windows), collect(parsed.deadLetters()), collect(kept.deadLetters())
        ssc.start()
        run_batches(ssc, 2, timeout=TIMEOUT_S)
    assert {t: sorted(v) for t, v in got.items()} == {1000: [(("a", (0, 10)), 1)], 2000: [(("a", (0, 10)), 6)]}
    assert {t: [(d.record, d.operator) for d in ds] for t, ds in dead_parsed.items()} == {
        1000: [((2, "a", "x"), "map#1")], 2000: []}
    assert [(d.record, d.error.split(":")[0]) for d in dead_kept[1000]] == [(("b", 2), "ZeroDivisionError")]


def test_with_event_time_routes_the_records_whose_event_time_cannot_be_extracted(sc):
    """``withEventTime(extract, onError="deadLetter")``: a record whose ``extract`` raises or returns no event time is
    a dead letter and counts nowhere (not in the watermark); the others go on with their event time."""
    with manual_context(1, sc=sc) as ssc:
        raw = [[{"t": 1, "k": "a"}, {"k": "a"}, {"t": "soon", "k": "b"}, {"t": 5, "k": "b"}], [{"t": 2, "k": "a"}]]
        timed = ssc.queueStream([sc.parallelize(b, 2) for b in raw]).withEventTime(lambda r: r["t"],
                                                                                   onError="deadLetter")
        got, marks, dead = collect(timed), collect(timed.watermarks()), collect(timed.deadLetters())
        everything = collect(ssc.deadLetters())
        ssc.start()
        run_batches(ssc, 2, timeout=TIMEOUT_S)
    assert got == {1000: [{"t": 1, "k": "a"}, {"t": 5, "k": "b"}], 2000: [{"t": 2, "k": "a"}]}
    assert marks == {1000: [None], 2000: [5]}  # "soon" is not an event time: it did not move the watermark
    assert {t: [(d.record, d.operator, d.error.split(":")[0]) for d in ds] for t, ds in dead.items()} == {
        1000: [({"k": "a"}, "withEventTime#1", "KeyError"), ({"t": "soon", "k": "b"}, "withEventTime#1", "TypeError")],
        2000: []}
    assert "make withEventTime's function return one" in dead[1000][1].error
    assert everything == dead


def _add_numbers(a, b):  # noqa: ANN001, ANN202 - None + anything raises TypeError
    return a + b


@pytest.mark.slow
@pytest.mark.parametrize("store", ["rdd", "executor", "auto"])
def test_event_window_reduces_route_what_func_raises_on_and_leave_late_records_late(sc, tmp_path, monkeypatch, store):
    """``reduceByKeyAndEventWindow`` / ``reduceByEventWindow(..., onError="deadLetter")``: the reduce's records are
    folded per key and pane in a guard first (the reduces' blame rule); the windows hold the other records; a
    record late for all its windows is not given to ``func`` (it stays a late record, not a dead letter)."""
    _use_state_backend(monkeypatch, tmp_path, store)
    with manual_context(1, sc=sc) as ssc:
        raw = [[(1, "a", 1), (2, "a", None), (11, "b", 2)],
               [(3, "a", 5), (4, "a", None), (12, "b", None), (15, "b", 3)],
               [(25, "c", 1)], []]  # (event second, key, value); W(2) = 11 closes [0, 10): batch 2's 3 and 4 are late
        timed = ssc.queueStream([sc.parallelize(b, 1) for b in raw]).withEventTime(lambda r: r[0])
        keyed = timed.map(lambda r: (r[1], r[2])).reduceByKeyAndEventWindow(_add_numbers, 10, onError="deadLetter")
        total = timed.map(lambda r: r[2]).reduceByEventWindow(_add_numbers, 10, onError="deadLetter")
        got, dead, late = collect(keyed), collect(keyed.deadLetters()), collect(keyed.lateRecords())
        got_total, dead_total = collect(total), collect(total.deadLetters())
        ssc.start()
        run_batches(ssc, 4, timeout=TIMEOUT_S)
    assert got == {1000: [], 2000: [(("a", (0, 10)), 1)], 3000: [], 4000: [(("b", (10, 20)), 5)]}
    assert {t: [(d.record, d.operator, d.batchTime) for d in ds] for t, ds in dead.items()} == {
        1000: [(("a", None), "reduceByKeyAndEventWindow#1", 1000)],
        2000: [(("b", None), "reduceByKeyAndEventWindow#1", 2000)], 3000: [], 4000: []}
    assert dead[1000][0].error.startswith("TypeError: unsupported operand")
    assert sorted(late[2000], key=lambda r: r[1]) == [(("a", 5), 3, [(0, 10)]), (("a", None), 4, [(0, 10)])]
    assert got_total == {1000: [], 2000: [((0, 10), 1)], 3000: [], 4000: [((10, 20), 5)]}
    assert {t: [(d.record, d.operator) for d in ds] for t, ds in dead_total.items()} == {
        1000: [(None, "reduceByEventWindow#2")], 2000: [(None, "reduceByEventWindow#2")], 3000: [], 4000: []}


def _sum_session(values):  # noqa: ANN001, ANN202 - refuses a session holding a None
    return sum(values)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["rdd", "executor", "auto"])
def test_session_window_routes_a_session_whose_aggregate_raises(sc, tmp_path, monkeypatch, store):
    """``sessionWindow(gap, aggregate, onError="deadLetter")``: a session whose aggregate raises is not emitted;
    ``((key, (start, end)), values)`` is the dead letter, in the batch that closed it; other sessions go on."""
    _use_state_backend(monkeypatch, tmp_path, store)
    with manual_context(1, sc=sc) as ssc:
        raw = [[(1, "a", 1), (2, "a", None), (11, "b", 2)], [(15, "b", 3)], [(25, "c", 1)], []]
        timed = ssc.queueStream([sc.parallelize(b, 1) for b in raw]).withEventTime(lambda r: r[0])
        sessions = timed.map(lambda r: (r[1], r[2])).sessionWindow(5, _sum_session, onError="deadLetter")
        got, dead = collect(sessions), collect(sessions.deadLetters())
        ssc.start()
        run_batches(ssc, 4, timeout=TIMEOUT_S)
    assert got == {1000: [], 2000: [], 3000: [], 4000: [(("b", (11, 20)), 5)]}
    assert {t: [(d.record, d.operator, d.error.split(":")[0]) for d in ds] for t, ds in dead.items()} == {
        1000: [], 2000: [((("a", (1, 7)), [1, None]), "sessionWindow#1", "TypeError")], 3000: [], 4000: []}
