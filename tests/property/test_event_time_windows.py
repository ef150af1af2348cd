"""Event-time windows against a pure-Python model of their contract, and late records in the metrics.

The model (``model_run``) applies the documented rules to the batches: the watermark of batch ``i`` is the
maximum event time of the batches before it minus the lateness (monotone); records below it are late;
``emit="final"`` emits each window with data once, in the batch whose watermark passes its end, with the
sum of its accepted records; ``emit="updates"`` emits, in each batch, every window that received records in
that batch with its sum so far. One pipeline per example carries every variant at once (keyed final with
and without ``invFunc``, keyed updates, unkeyed final), so the incremental inverse window is checked
against the recomputed one and both against the model.

Batch ``i`` (1-based) runs at ``i * 1000`` ms on a ManualClock; event times are seconds.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstreams.nodes.store_state import StateViewNode
from dstreams.testing import collect, manual_context, run_batches

Batch = list[tuple[int, str, int]]  # (event time s, key, value)
GAP = 3  # the session gap (s)


def ts_of(r: tuple[int, str, int]) -> int:
    return r[0]


def model_run(batches: list[Batch], lateness: int, window: int, slide: int, drop_late: bool = False
              ) -> dict[str, Any]:
    """What every variant must emit per batch (batch index 1-based), by the documented rules."""
    n = window // slide
    wm: int | None = None
    top: int | None = None
    sums: dict[tuple[str, int], int] = defaultdict(int)  # (key, j) -> sum of the values counted in window j
    out: dict[str, dict[int, list]] = {name: {} for name in
                                       ("final", "updates", "all", "late", "sessions", "window_late", "all_late",
                                        "session_late")}
    closed_prev: int | None = None
    sessions: dict[str, list[list[tuple[int, int]]]] = {}  # the open sessions' (ts, value) per key
    for i, batch in enumerate(batches, start=1):
        if top is not None:
            cand = top - lateness
            wm = cand if wm is None else max(wm, cand)
        closed = None if wm is None else (wm - window) // slide  # windows j <= closed have closed
        behind = [r for r in batch if wm is not None and r[0] < wm]
        out["late"][i] = sorted(behind)
        accepted = [r for r in batch if not (drop_late and r in behind)]
        # Windows: a record counts in each of its windows still open, and is late for the others.
        changed, missed_by = set(), []
        for ts, k, v in accepted:
            p = ts // slide
            missed = [j for j in range(p - n + 1, p + 1) if closed is not None and j <= closed]
            for j in range(p - n + 1, p + 1):
                if j not in missed:
                    sums[(k, j)] += v
                    changed.add((k, j))
            if missed:
                missed_by.append(((k, v), ts, [(j * slide, j * slide + window) for j in missed]))
        out["window_late"][i] = sorted(missed_by)
        out["all_late"][i] = sorted((kv[1], ts, m) for kv, ts, m in missed_by)
        out["updates"][i] = sorted(((k, (j * slide, j * slide + window)), sums[(k, j)]) for k, j in changed)
        final = sorted(((k, (j * slide, j * slide + window)), v) for (k, j), v in sums.items()
                       if closed is not None and j <= closed and (closed_prev is None or j > closed_prev))
        out["final"][i] = final
        totals: dict[tuple[int, int], int] = defaultdict(int)
        for (_, bounds), v in final:
            totals[bounds] += v
        out["all"][i] = sorted(totals.items())
        closed_prev = closed
        # Sessions: first close those the watermark reached, then the batch's records join the open ones.
        emitted, late = [], []
        for k in list(sessions):
            still = []
            for sess in sessions[k]:
                if wm is not None and sess[-1][0] + GAP <= wm:
                    emitted.append(((k, (sess[0][0], sess[-1][0] + GAP)), sum(v for _, v in sess)))
                else:
                    still.append(sess)
            sessions[k] = still
        for k in sorted({r[1] for r in accepted}):
            events = [e for sess in sessions.get(k, []) for e in sess] + [(ts, v) for ts, kk, v in accepted if kk == k]
            sessions[k] = []
            for sess in _cut(events):
                if wm is not None and sess[-1][0] + GAP <= wm:
                    late.extend(((k, v), ts, [(ts, ts + GAP)]) for ts, v in sess)
                else:
                    sessions[k].append(sess)
        out["sessions"][i] = sorted(emitted)
        out["session_late"][i] = sorted(late)
        for ts, _, _ in batch:
            top = ts if top is None else max(top, ts)
    return out


def _cut(events: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """``events`` sorted by event time (stable), cut where two neighbours are GAP or more apart."""
    out: list[list[tuple[int, int]]] = []
    for e in sorted(events, key=lambda e: e[0]):
        if out and e[0] - out[-1][-1][0] < GAP:
            out[-1].append(e)
        else:
            out.append([e])
    return out


def total(values: list[int]) -> int:
    return sum(values)


def run_pipeline(sc, batches: list[Batch], lateness: int, window: int, slide: int, drop_late: bool = False
                 ) -> dict[str, Any]:
    with manual_context(1, sc=sc) as ssc:
        timed = ssc.queueStream([sc.parallelize(b, 2) for b in batches]).withEventTime(ts_of, lateness,
                                                                                      dropLate=drop_late)
        pairs = timed.map(lambda r: (r[1], r[2]))
        final = pairs.reduceByKeyAndEventWindow(operator.add, window, slide, numPartitions=2)
        unkeyed = timed.map(lambda r: r[2]).reduceByEventWindow(operator.add, window, slide, operator.sub)
        sessions = pairs.sessionWindow(GAP, aggregate=total, numPartitions=2)
        streams = {
            "final": final,
            "final_inv": pairs.reduceByKeyAndEventWindow(operator.add, window, slide, invFunc=operator.sub,
                                                         numPartitions=2),
            "updates": pairs.reduceByKeyAndEventWindow(operator.add, window, slide, emit="updates",
                                                       numPartitions=2),
            "all": unkeyed,
            "sessions": sessions,
            "window_late": final.lateRecords(),
            "all_late": unkeyed.lateRecords(),
            "session_late": sessions.lateRecords(),
        }
        tagged = None
        for name, s in streams.items():
            t = s.map(lambda r, name=name: (name, r))
            tagged = t if tagged is None else tagged.union(t)
        seen = collect(tagged.union(timed.lateRecords().map(lambda r: ("late", r))))
        ssc.start()
        infos = run_batches(ssc, len(batches))
    got: dict[str, Any] = {name: {t // 1000: sorted(r for tag, r in rows if tag == name) for t, rows in seen.items()}
                           for name in [*streams, "late"]}
    got["lateCounts"] = [sum(m["lateRecords"] for m in info.event_time.values()) for info in infos]
    return got


def _check(sc, batches: list[Batch], lateness: int, window: int, slide: int, drop_late: bool = False
           ) -> dict[str, Any]:
    got = run_pipeline(sc, batches, lateness, window, slide, drop_late)
    want = model_run(batches, lateness, window, slide, drop_late)
    for name in ("final", "updates", "all", "late", "sessions", "window_late", "all_late", "session_late"):
        assert got[name] == want[name], name
    assert got["final_inv"] == got["final"]  # the incremental inverse window equals the recomputed one
    assert got["lateCounts"] == [len(want["late"][i]) for i in range(1, len(batches) + 1)]
    return got


@pytest.mark.slow
def test_final_and_updates_windows_with_late_records(sc):
    batches: list[Batch] = [
        [(1, "a", 1), (3, "b", 1), (5, "a", 2)],
        [(9, "a", 1), (2, "b", 4)],                # W=2: 2 is on time, a correction of b's [0, 4) and [-2, 2)
        [(14, "a", 1), (4, "a", 5), (6, "b", 1), (10, "c", 1), (14, "c", 1)],  # W=6: 4 is late, 6 on time;
        #                                            [-2, 2), [0, 4), [2, 6) close; c: two sessions
        [(7, "b", 1), (12, "c", 1)],               # W=11: 7 is late; 12 bridges c's two sessions
        [(20, "a", 1)],                            # W=11
        [],                                        # W=17
        [(12, "b", 3), (16, "a", 1)],              # W=17: both late
        [],
    ]
    got = _check(sc, batches, lateness=3, window=4, slide=2)
    # Spot checks of the model's reading (windows [2j, 2j + 4)): key a's [0, 4) holds the record at 1 s.
    assert (("a", (0, 4)), 1) in got["final"][3]
    assert got["late"][3] == [(4, "a", 5)] and got["late"][7] == [(12, "b", 3), (16, "a", 1)]
    # updates: [0, 4) of key b first 1, then corrected to 5 by the record at 2 s in batch 2.
    assert (("b", (0, 4)), 1) in got["updates"][1] and (("b", (0, 4)), 5) in got["updates"][2]
    # Sessions (gap 3 s): a's records at 1 and 5 s are two sessions until nothing bridges them; b's at 2 and 3 s
    # make one [2, 6) (the record at 2 s arrived a batch late and joined it), closed by W=6 in batch 3.
    assert (("b", (2, 6)), 5) in got["sessions"][3] and (("a", (1, 4)), 1) in got["sessions"][3]
    assert got["sessions"][6] == [(("a", (9, 12)), 1), (("a", (14, 17)), 1), (("c", (10, 17)), 3)]  # c merged


@pytest.mark.slow
def test_a_record_behind_the_watermark_counts_in_its_windows_still_open(sc):
    """Issue 24's example: windows of 1.5 s sliding by 0.5 s, a record at 11.375 s in a batch whose watermark is
    11.5 s. Its windows are [10, 11.5), [10.5, 12) and [11, 12.5); the first has closed (end <= 11.5), the
    other two are open: it counts in them and is late for [10, 11.5) only. With dropLate=True the whole record
    is dropped (the old rule)."""
    batches = [[(11.0, "a", 1)], [(12.0, "a", 10)], [(11.375, "a", 100)], [], [(20.0, "a", 1000)], []]
    got = run_pipeline(sc, batches, 0.5, 1.5, 0.5)  # W: -, 10.5, 11.5, 11.5, 11.5, 19.5
    assert got["late"][3] == [(11.375, "a", 100)]
    assert got["window_late"][3] == [(("a", 100), 11.375, [(10, 11.5)])]
    final = {bounds: v for i in got["final"] for (_, bounds), v in got["final"][i]}
    assert final[(10, 11.5)] == 1 and final[(10.5, 12)] == 101 and final[(11, 12.5)] == 111
    assert final[(11.5, 13)] == 10 and final[(12, 13.5)] == 10
    dropped = run_pipeline(sc, batches, 0.5, 1.5, 0.5, drop_late=True)
    final = {bounds: v for i in dropped["final"] for (_, bounds), v in dropped["final"][i]}
    assert final[(10.5, 12)] == 1 and final[(11, 12.5)] == 11 and dropped["window_late"][3] == []


@pytest.mark.slow
def test_a_record_late_for_a_closed_session_merges_into_an_open_one(sc):
    """Gap 3 s, lateness 0. Batch 2's watermark is 9 s: key a's session [1, 4) closes in batch 2 (emitted with
    its one record); a's open session starts at 9 s. In batch 3 (watermark 10 s) a record at 6.5 s arrives,
    behind the watermark but within 3 s of the open session: it merges into it ([6.5, 12)). A record at 3 s is
    within the gap of the closed session only: late, dropped, listed with [3, 6) by the sessions'
    lateRecords()."""
    batches = [[(1, "a", 1), (9, "a", 2)], [(10, "b", 1)], [(6.5, "a", 4), (3, "a", 8)], [(30, "b", 1)], []]
    got = run_pipeline(sc, batches, 0, 4, 2)
    emitted = sorted(r for i in got["sessions"] for r in got["sessions"][i])
    assert emitted == [(("a", (1, 4)), 1), (("a", (6.5, 12)), 6), (("b", (10, 13)), 1)]
    assert got["session_late"][3] == [(("a", 8), 3, [(3, 6)])]
    assert got["late"][3] == [(3, "a", 8), (6.5, "a", 4)]  # both behind the watermark (10 s)


_records = st.tuples(st.integers(0, 30), st.sampled_from("ab"), st.integers(1, 3))


@pytest.mark.slow
@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batches=st.lists(st.lists(_records, max_size=5), min_size=5, max_size=7),
       shape=st.sampled_from([(6, 2), (4, 4), (9, 3)]), lateness=st.integers(0, 5), drop_late=st.booleans())
def test_random_out_of_order_streams_match_the_model(sc, batches, shape, lateness, drop_late):
    window, slide = shape
    # Bounded disorder: each batch's event times drift forward with the batch index.
    shifted = [[(ts + 4 * i, k, v) for ts, k, v in b] for i, b in enumerate(batches)]
    _check(sc, shifted, lateness, window, slide, drop_late)


@pytest.mark.slow
def test_window_state_is_not_shuffled_each_batch(sc):
    """As for the other state streams (tests/integration/test_stages.py): each batch's job executes 2 stages, the map
    side of the batch's shuffle into the state's partitioner (one task per input partition, 3) and the result stage
    merging it with the cached previous state (one task per state partition, 2), and the previous state is a
    narrow dependency."""
    from ..integration.test_stages import _jobs_of_group, _previous_reached, _stage_counts

    with manual_context(1, sc=sc) as ssc:
        batches = [[(i * 2 + j % 5, f"k{j}", 1) for j in range(6 * i)] for i in range(1, 6)]
        timed = ssc.queueStream([sc.parallelize(b, 3) for b in batches]).withEventTime(ts_of, 2)
        windows = timed.map(lambda r: (r[1], r[2])).reduceByKeyAndEventWindow(
            operator.add, 6, 2, invFunc=operator.sub, numPartitions=2)
        windows.foreachRDD(lambda rdd: rdd.collect())
        node = windows._state
        # picked by size (the default): behind its view
        node = node.state if isinstance(node, StateViewNode) else node
        ssc.start()
        info = run_batches(ssc, 5)[-1]
        (job,) = _jobs_of_group(sc, info.job_group, 1)
        counts = _stage_counts(sc, job)
        narrow, shuffled = _previous_reached(sc, node.generated[5000], node.generated[4000])
    assert [n for _, _, n in counts.ran] == [3, 2], counts.ran
    assert narrow and not shuffled
