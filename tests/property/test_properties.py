"""Property tests: stateful operators against pure-Python models of their contracts.

Every example runs ONE pipeline on a ManualClock (a pipeline costs ~0.3-1 s per batch on Spark),
which carries all the operators under test at once:

* ``reduceByKeyAndWindow(add, sub, w, s, filterFunc=nonzero)`` (incremental when ``w >= 5 s``)
  and ``reduceByKeyAndWindow(add, None, w, s, filterFunc=nonzero)``, both checked against a
  reduce of the raw window recomputed here from the input;
* ``runningReduce(add)`` against a prefix reduce per key;
* ``track(init, update, timeout)`` against a model that creates, updates, drops (``None``) and
  times out keys;
* ``updateStateByKey`` against a model with order-sensitive state, explicit drops and idle drops;
* the reduces the engine recognises and inlines (``dstreams.spark.partitioned.fold``) and its C counting:
  per-batch ``reduceByKey(min)`` and ``countByValue()``, ``reduceByKeyAndWindow(max, None, w, s)`` and
  ``countByValueAndWindow(w, s)``, against plain per-key ``min``/``max``/counts of the batch or window.

The state streams share one output (a tagged union, one Spark job per batch) and the two windows
another (one job per slide), to keep the Spark job count per batch low.

Batch ``i`` (1-based) of the input runs at time ``i * 1000`` ms; the streams' zero time is 0.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from dstreams import ManualClock, StreamingContext

BATCH_MS = 1000
KEYS = "abcd"

# ---------------------------------------------------------------------------------------------
# User functions (module level: they are pickled to the executors). Values are small ints >= 0:
# with non-negative values a window sum of 0 means "no non-zero value in the window", which is
# exactly what filterFunc=nonzero may drop in the incremental path (as in Spark, a key dropped by
# filterFunc is not un-reduced later, so negative values would make the filter unsound).


def nonzero(kv: tuple[Any, int]) -> bool:
    return kv[1] != 0


def track_init(key: str, ev: int) -> tuple[int, ...] | None:
    """A key's state starts as the tuple of its events; an event 0 creates nothing."""
    return None if ev == 0 else (ev,)


def track_update(key: str, state: tuple[int, ...], ev: int) -> tuple[int, ...] | None:
    """Append the event (order-sensitive); an event 4 drops the key's state."""
    return None if ev == 4 else state + (ev,)


def usbk_update(values: list[int], last: tuple[tuple[int, ...], int] | None):
    """State ``(last 4 values, idle batches)``: 4 drops the key, 3 idle batches drop it too."""
    if 4 in values:
        return None
    if not values:
        idle = last[1] + 1
        return None if idle >= 3 else (last[0], idle)
    kept = last[0] if last is not None else ()
    return ((kept + tuple(values))[-4:], 0)


# ---------------------------------------------------------------------------------------------
# Pure-Python models


def model_window(inputs: list[list[tuple[str, int]]], window_s: int, slide_s: int) -> dict[int, list]:
    """Per slide time, the sorted non-zero per-key sums over batches in ``(t - w, t]``."""
    out: dict[int, list] = {}
    n = len(inputs)
    for t in range(slide_s, n + 1, slide_s):
        acc: dict[str, int] = defaultdict(int)
        for i in range(max(1, t - window_s + 1), t + 1):
            for k, v in inputs[i - 1]:
                acc[k] += v
        out[t * BATCH_MS] = sorted((k, v) for k, v in acc.items() if v != 0)
    return out


def model_window_by(inputs: list[list[tuple[str, int]]], window_s: int, slide_s: int,
                    value: Any, func: Any) -> dict[int, list]:
    """Per slide time, the sorted per-key reduce with ``func`` of ``value(k, v)`` over batches in
    ``(t - w, t]`` (keys with no record in the window absent)."""
    out: dict[int, list] = {}
    n = len(inputs)
    for t in range(slide_s, n + 1, slide_s):
        acc: dict[Any, Any] = {}
        for i in range(max(1, t - window_s + 1), t + 1):
            for k, v in inputs[i - 1]:
                x = value(k, v)
                acc[k] = func(acc[k], x) if k in acc else x
        out[t * BATCH_MS] = sorted(acc.items())
    return out


def model_per_batch(inputs: list[list[tuple[str, int]]], value: Any, func: Any) -> dict[int, list]:
    """Per batch time, the sorted per-key reduce with ``func`` of ``value(k, v)`` over the batch."""
    return {i * BATCH_MS: model_window_by([batch], 1, 1, value, func)[BATCH_MS] for i, batch in
            enumerate(inputs, start=1)}


def model_running(inputs: list[list[tuple[str, int]]]) -> dict[int, list]:
    acc: dict[str, int] = {}
    out: dict[int, list] = {}
    for i, batch in enumerate(inputs, start=1):
        for k, v in batch:
            acc[k] = acc[k] + v if k in acc else v
        out[i * BATCH_MS] = sorted(acc.items())
    return out


def grouped(batch: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each key's values in input order."""
    g: dict[str, list[int]] = {}
    for k, v in batch:
        g.setdefault(k, []).append(v)
    return g


def model_track(inputs: list[list[tuple[str, int]]], timeout_ms: int) -> dict[int, list]:
    state: dict[str, tuple[Any, int]] = {}  # key -> (state, time of its last event)
    out: dict[int, list] = {}
    for i, batch in enumerate(inputs, start=1):
        now = i * BATCH_MS
        new: dict[str, tuple[Any, int]] = {}
        events = grouped(batch)
        for k, evs in events.items():
            s = state[k][0] if k in state else None
            for ev in evs:
                s = track_init(k, ev) if s is None else track_update(k, s, ev)
            if s is not None:
                new[k] = (s, now)
        for k, (s, last) in state.items():
            if k not in events and now - last < timeout_ms:
                new[k] = (s, last)
        state = new
        out[now] = sorted((k, s) for k, (s, _) in state.items())
    return out


def model_usbk(inputs: list[list[tuple[str, int]]]) -> dict[int, list]:
    state: dict[str, Any] = {}
    out: dict[int, list] = {}
    for i, batch in enumerate(inputs, start=1):
        events = grouped(batch)
        new: dict[str, Any] = {}
        for k in set(state) | set(events):
            r = usbk_update(events.get(k, []), state.get(k))
            if r is not None:
                new[k] = r
        state = new
        out[i * BATCH_MS] = sorted(state.items())
    return out


# ---------------------------------------------------------------------------------------------
# The pipeline


@dataclass(frozen=True)
class Scenario:
    inputs: list[list[tuple[str, int]]]
    window_s: int
    slide_s: int
    timeout_ms: int
    input_partitions: int = 2  # 2 checks that values keep input order across input partitions

    @property
    def incremental(self) -> bool:
        return self.window_s >= 5 * self.slide_s


@st.composite
def scenarios(draw) -> Scenario:
    n = draw(st.integers(3, 9))
    pair = st.tuples(st.sampled_from(KEYS), st.integers(0, 4))
    inputs = draw(st.lists(st.lists(pair, max_size=6), min_size=n, max_size=n))
    # At least two slides in the run, so an incremental window has a previous window to update.
    slide = draw(st.integers(1, min(3, n // 2)))
    incremental = draw(st.booleans())
    multiple = draw(st.integers(5, 7) if incremental else st.integers(1, 4))
    timeout_ms = draw(st.sampled_from([1000, 1500, 2000, 3000, 4000]))
    partitions = draw(st.sampled_from([1, 2]))  # 1 is cheaper (fewer tasks per batch)
    return Scenario(inputs, slide * multiple, slide, timeout_ms, partitions)


def _first(kv: tuple[str, int]) -> str:
    return kv[0]


def _one(k: str, v: int) -> int:
    return 1


def _value(k: str, v: int) -> int:
    return v


def _tag(name: str):
    return lambda kv: (name, kv)


def collector(out: dict[str, dict[int, list]], names: tuple[str, ...]):
    """A ``foreachRDD`` function that files each batch's ``(name, record)`` pairs under ``out[name][batch ms]``,
    sorted, once per batch."""

    def run(time, rdd) -> None:
        t = round(time.timestamp() * 1000)
        by_name: dict[str, list] = {name: [] for name in names}
        for name, kv in rdd.collect():
            by_name[name].append(kv)
        for name, records in by_name.items():
            assert t not in out[name], f"{name}: two outputs at {t}"
            out[name][t] = sorted(records)

    return run


def run_pipeline(sc, sn: Scenario) -> dict[str, dict[int, list]]:
    """Run every operator under test on the scenario; ``{output: {batch time ms: sorted records}}``."""
    clock = ManualClock()
    ssc = StreamingContext(sc, BATCH_MS / 1000.0, clock=clock)
    pairs = ssc.queueStream([sc.parallelize(b, sn.input_partitions) for b in sn.inputs])
    running = pairs.runningReduce(operator.add)
    tracked = pairs.track(track_init, track_update, sn.timeout_ms / 1000.0)
    updated = pairs.updateStateByKey(usbk_update)
    inv = pairs.reduceByKeyAndWindow(operator.add, operator.sub, sn.window_s, sn.slide_s, filterFunc=nonzero)
    plain = pairs.reduceByKeyAndWindow(operator.add, None, sn.window_s, sn.slide_s, filterFunc=nonzero)
    keys = pairs.map(_first)
    batch_min = pairs.reduceByKey(min)
    batch_counts = keys.countByValue()
    window_max = pairs.reduceByKeyAndWindow(max, None, sn.window_s, sn.slide_s)
    window_counts = keys.countByValueAndWindow(sn.window_s, sn.slide_s)
    states = (running.map(_tag("running")).union(tracked.map(_tag("track"))).union(updated.map(_tag("usbk")))
              .union(batch_min.map(_tag("min"))).union(batch_counts.map(_tag("counts"))))
    windows = (inv.map(_tag("inv")).union(plain.map(_tag("plain"))).union(window_max.map(_tag("wmax")))
               .union(window_counts.map(_tag("wcounts"))))

    out: dict[str, dict[int, list]] = {"running": {}, "track": {}, "usbk": {}, "inv": {}, "plain": {},
                                       "min": {}, "counts": {}, "wmax": {}, "wcounts": {}}
    states.foreachRDD(collector(out, ("running", "track", "usbk", "min", "counts")))
    windows.foreachRDD(collector(out, ("inv", "plain", "wmax", "wcounts")))
    ssc.start()
    try:
        for i in range(1, len(sn.inputs) + 1):
            clock.advance(BATCH_MS)
            ssc.awaitBatch(i * BATCH_MS, 120.0)
    finally:
        ssc.stop(stopSparkContext=False)
    return out


def _diff(name: str, got: dict[int, list], want: dict[int, list], sn: Scenario) -> str | None:
    if got == want:
        return None
    for t in sorted(set(got) | set(want)):
        if got.get(t) != want.get(t):
            return (f"{name} differs first at batch time {t} ms: got {got.get(t)!r}, expected {want.get(t)!r} "
                    f"(times got {sorted(got)}, expected {sorted(want)}; scenario {sn!r})")
    return f"{name} differs (scenario {sn!r})"


PROPERTY_SETTINGS = settings(
    max_examples=5,
    deadline=None,
    # No shrinking: each run costs seconds; the failure message names the first differing batch.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)


@pytest.mark.slow
@pytest.mark.timeout(900)
@PROPERTY_SETTINGS
@given(sn=scenarios())
# Explicit cases: the incremental path over 2+ slides (keys falling back to 0 and leaving), a short
# non-incremental window with slide 2, track/updateStateByKey drops by None, by timeout and re-creation.
@example(sn=Scenario([[("a", 1), ("b", 2)], [("a", 0)], [("b", 4), ("a", 3)], [], [("c", 1), ("c", 4)],
                      [("a", 4), ("a", 2)], [], [("b", 1)], [], [], [("a", 1)]], 5, 1, 2000))
@example(sn=Scenario([[("a", 2)], [("b", 0), ("b", 3)], [("a", 1), ("a", 4), ("a", 2)], [], [("b", 2)],
                      [("c", 3)], [("a", 0)]], 4, 2, 1500))
def test_stateful_operators_match_pure_python_models(sc, sn: Scenario) -> None:
    out = run_pipeline(sc, sn)
    want_window = model_window(sn.inputs, sn.window_s, sn.slide_s)
    problems = [
        _diff("reduceByKeyAndWindow(add, sub, filterFunc)", out["inv"], want_window, sn),
        _diff("reduceByKeyAndWindow(add, None, filterFunc)", out["plain"], want_window, sn),
        _diff("runningReduce(add)", out["running"], model_running(sn.inputs), sn),
        _diff("track(init, update, timeout)", out["track"], model_track(sn.inputs, sn.timeout_ms), sn),
        _diff("updateStateByKey", out["usbk"], model_usbk(sn.inputs), sn),
        _diff("reduceByKey(min)", out["min"], model_per_batch(sn.inputs, _value, min), sn),
        _diff("countByValue()", out["counts"], model_per_batch(sn.inputs, _one, operator.add), sn),
        _diff("reduceByKeyAndWindow(max, None)", out["wmax"],
              model_window_by(sn.inputs, sn.window_s, sn.slide_s, _value, max), sn),
        _diff("countByValueAndWindow", out["wcounts"],
              model_window_by(sn.inputs, sn.window_s, sn.slide_s, _one, operator.add), sn),
    ]
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)


def test_models_cover_their_edge_cases() -> None:
    """The models themselves (cheap, no Spark): timeouts, None drops and window edges."""
    inputs = [[("a", 1)], [("a", 0)], [], [("a", 4)], [("b", 2), ("b", 4), ("b", 1)]]
    assert model_track(inputs, 2000) == {
        1000: [("a", (1,))],
        2000: [("a", (1, 0))],
        3000: [("a", (1, 0))],  # no event for 1 s < 2 s
        4000: [],  # update returned None
        5000: [("b", (1,))],  # dropped by the 4, re-created by the 1
    }
    assert model_track([[("a", 1)], [], []], 1500)[3000] == []  # 2 s without an event >= 1.5 s
    assert model_usbk([[("a", 1), ("a", 2)], [], [], [], [("a", 3)]]) == {
        1000: [("a", ((1, 2), 0))],
        2000: [("a", ((1, 2), 1))],
        3000: [("a", ((1, 2), 2))],
        4000: [],
        5000: [("a", ((3,), 0))],
    }
    assert model_window([[("a", 1)], [("a", 2)], [("a", 3)], [("b", 0)]], 2, 2) == {
        2000: [("a", 3)],
        4000: [("a", 3)],
    }
    assert model_running([[("a", 1)], [], [("a", 2)]]) == {1000: [("a", 1)], 2000: [("a", 1)], 3000: [("a", 3)]}


def model_usbk_touched(inputs: list[list[tuple[str, int]]]) -> dict[int, list]:
    """``updateStateByKey(f, updateIdleKeys=False)``: only keys with new values are updated."""
    state: dict[str, Any] = {}
    out: dict[int, list] = {}
    for i, batch in enumerate(inputs, start=1):
        for k, values in grouped(batch).items():
            r = usbk_update(values, state.get(k))
            if r is None:
                state.pop(k, None)
            else:
                state[k] = r
        out[i * BATCH_MS] = sorted(state.items())
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
@PROPERTY_SETTINGS
@given(sn=scenarios())
@example(sn=Scenario([[("a", 1), ("b", 2)], [("a", 0)], [("b", 4), ("a", 3)], [], [("c", 1), ("c", 4)],
                      [("a", 4), ("a", 2)], [], [("b", 1)], [], [], [("a", 1)]], 5, 1, 2000))
def test_executor_state_store_matches_the_models(sc, sn: Scenario, tmp_path_factory) -> None:
    """Issue 23: ``runningReduce``, ``updateStateByKey`` (every key each batch, as PySpark, and only the keys
    with new values), ``track`` and the incremental windows on the executor state store, with a checkpoint every
    2 batches (or slides; deltas on a chain), against the same models."""
    import os

    env = {"DSTREAMS_STATE_STORE": "executor", "DSTREAMS_STATE_SNAPSHOT_EVERY": "2",
           "DSTREAMS_STATE_LOCAL_DIR": str(tmp_path_factory.mktemp("stores"))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        clock = ManualClock()
        ssc = StreamingContext(sc, BATCH_MS / 1000.0, clock=clock)
        ssc.checkpoint(str(tmp_path_factory.mktemp("ckpt")))
        pairs = ssc.queueStream([sc.parallelize(b, sn.input_partitions) for b in sn.inputs])
        running = pairs.runningReduce(operator.add).checkpoint(2 * BATCH_MS / 1000.0)
        updated = pairs.updateStateByKey(usbk_update).checkpoint(2 * BATCH_MS / 1000.0)
        touched = pairs.updateStateByKey(usbk_update, updateIdleKeys=False).checkpoint(2 * BATCH_MS / 1000.0)
        tracked = pairs.track(track_init, track_update, sn.timeout_ms / 1000.0).checkpoint(2 * BATCH_MS / 1000.0)
        interval = 2 * sn.slide_s * BATCH_MS / 1000.0
        inv = pairs.reduceByKeyAndWindow(operator.add, operator.sub, sn.window_s, sn.slide_s,
                                         filterFunc=nonzero).checkpoint(interval)
        window_counts = pairs.map(_first).countByValueAndWindow(sn.window_s, sn.slide_s).checkpoint(interval)
        out: dict[str, dict[int, list]] = {"running": {}, "usbk": {}, "touched": {}, "track": {}, "inv": {},
                                           "wcounts": {}}
        states = (running.map(_tag("running")).union(updated.map(_tag("usbk")))
                  .union(touched.map(_tag("touched"))).union(tracked.map(_tag("track"))))
        windows = inv.map(_tag("inv")).union(window_counts.map(_tag("wcounts")))

        states.foreachRDD(collector(out, ("running", "usbk", "touched", "track")))
        windows.foreachRDD(collector(out, ("inv", "wcounts")))
        ssc.start()
        try:
            for i in range(1, len(sn.inputs) + 1):
                clock.advance(BATCH_MS)
                ssc.awaitBatch(i * BATCH_MS, 120.0)
        finally:
            ssc.stop(stopSparkContext=False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert type(running._node).__name__ == "StateViewNode"  # the store was used
    assert tracked._state.state.key_name == "StoreTrackNode"
    incremental = sn.window_s >= 5 * sn.slide_s  # a shorter window keeps no state (recomputed every slide)
    assert type(inv._node).__name__ == ("StateViewNode" if incremental else "ReducedWindowNode")
    want_window = model_window(sn.inputs, sn.window_s, sn.slide_s)
    problems = [
        _diff("track(init, update, timeout) on the store", out["track"], model_track(sn.inputs, sn.timeout_ms), sn),
        _diff("reduceByKeyAndWindow(add, sub, filterFunc) on the store", out["inv"], want_window, sn),
        _diff("countByValueAndWindow on the store", out["wcounts"],
              model_window_by(sn.inputs, sn.window_s, sn.slide_s, _one, operator.add), sn),
        _diff("runningReduce(add) on the store", out["running"], model_running(sn.inputs), sn),
        _diff("updateStateByKey on the store", out["usbk"], model_usbk(sn.inputs), sn),
        _diff("updateStateByKey(updateIdleKeys=False) on the store", out["touched"], model_usbk_touched(sn.inputs),
              sn),
    ]
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)
