"""Engine pieces the benchmarks rely on: the fast generator's contract and the per-batch driver timings."""

from __future__ import annotations

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.nodes.generator import text_record_batches, text_records


def test_text_records_deterministic_sized_and_100_bytes():
    for n in (0, 1, 7, 255, 256, 5000):
        a = list(text_records(3, 1000, 1, n))
        assert a == list(text_records(3, 1000, 1, n))
        assert len(a) == n
        assert all(isinstance(x, str) and len(x) == 100 for x in a)
    big = list(text_records(3, 1000, 1, 5000))
    assert len(set(big)) > 100  # many distinct lines, not one repeated
    assert big != list(text_records(3, 1000, 2, 5000))  # another partition, other lines
    assert big != list(text_records(3, 2000, 1, 5000))  # another batch, other lines


def test_text_record_batches_are_the_same_lines_as_arrow_batches():
    for n, size in ((0, 10), (1, 10), (255, 10), (256, 100), (5000, 1024), (5000, 5000)):
        batches = list(text_record_batches(3, 1000, 1, n, batch_size=size))
        assert all(b.schema.names == ["value"] and b.num_rows <= size for b in batches)
        assert [x for b in batches for x in b.column(0).to_pylist()] == list(text_records(3, 1000, 1, n))


def test_batch_info_reports_generation_and_cleanup_time(sc):
    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    ssc.generatorStream(10, 2).foreachRDD(lambda rdd: rdd.count())
    ssc.start()
    try:
        first = ssc.startTime
        for k in range(2):
            clock.advance(1000)
            ssc.awaitBatch(first.ms + 1000 * k, timeout=120)
        infos = ssc.batchInfos()
        assert infos
        for info in infos:
            assert info.generation_ms is not None and info.generation_ms >= 0
            assert info.cleanup_ms is not None and info.cleanup_ms >= 0
    finally:
        ssc.stop(stopSparkContext=False)


def test_map_arrow_batches_chunks_in_order_and_converts_back(sc):
    import pyarrow as pa
    import pyarrow.compute as pc

    from dstreams.spark.arrow import arrow_batches_func

    seen: list[int] = []

    def double(batch):
        seen.append(batch.num_rows)
        assert batch.schema.names == ["value"]
        return pa.RecordBatch.from_arrays([pc.multiply(batch.column(0), 2)], names=["value"])

    assert list(arrow_batches_func(double, 3)(iter(range(7)))) == [0, 2, 4, 6, 8, 10, 12]
    assert seen == [3, 3, 1]
    assert list(arrow_batches_func(double, 3)(iter([]))) == []
    pairs = arrow_batches_func(lambda b: pa.table({"k": b.column(0), "v": pc.add(b.column(0), 1)}))
    assert list(pairs(iter([1, 2]))) == [(1, 2), (2, 3)]
    assert list(arrow_batches_func(lambda b: [b.num_rows])(iter("abcde"))) == [5]

    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    got: list[list[int]] = []
    counts = ssc.queueStream([["x error", "y", "error z"], ["none"]]).mapArrowBatches(
        lambda b: [pc.sum(pc.match_substring(b.column(0), "error")).as_py() or 0]
    )
    counts.foreachRDD(lambda rdd: got.append(sum(rdd.collect())))
    ssc.start()
    try:
        first = ssc.startTime
        for k in range(2):
            clock.advance(1000)
            ssc.awaitBatch(first.ms + 1000 * k, timeout=120)
    finally:
        ssc.stop(stopSparkContext=False)
    assert got == [2, 0]


def test_map_arrow_batches_takes_arrow_records_as_they_are(sc):
    import pyarrow as pa
    import pyarrow.compute as pc

    from dstreams.spark.arrow import arrow_batches_func

    b1 = pa.RecordBatch.from_arrays([pa.array([1, 2, 3])], names=["value"])
    t2 = pa.table({"value": [4, 5]})
    seen: list[object] = []

    def keep(batch):
        seen.append(batch)
        return batch

    # Arrow records pass through untouched (the same object); stray plain records are chunked in order.
    assert list(arrow_batches_func(keep, 2)(iter([b1, 10, 11, 12, t2]))) == [1, 2, 3, 10, 11, 12, 4, 5]
    assert seen[0] is b1 and [b.num_rows for b in seen] == [3, 2, 1, 2]

    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    got: list[int] = []
    ssc.generatorStream(3000, 2, seed=5, recordFunc=text_record_batches).mapArrowBatches(
        lambda b: [pc.sum(pc.match_substring(b.column(0), "error")).as_py() or 0]
    ).foreachRDD(lambda rdd: got.append(sum(rdd.collect())))
    ssc.start()
    try:
        first = ssc.startTime
        clock.advance(1000)
        ssc.awaitBatch(first.ms, timeout=120)
    finally:
        ssc.stop(stopSparkContext=False)
    expected = sum("error" in line for p in range(2) for line in text_records(5, first.ms, p, 3000))
    assert got == [expected] and expected > 0


def test_benchmark_merge_keeps_other_targets_and_replaces_the_rerun_ones():
    from benchmarks.__main__ import _merge

    def search(target, rate):
        return {"target_ms": target, "max_sustainable_rate": rate}

    old = {"command": "run --quick", "started": "t0", "targets_ms": [1000.0],
           "runs": [{"engine": "a", "searches": [search(1000.0, 5)]},
                    {"engine": "b", "searches": [search(1000.0, 7)]}]}
    new = {"command": "run --targets 2000 --merge", "started": "t1", "targets_ms": [2000.0],
           "runs": [{"engine": "a", "searches": [search(2000.0, 9)]}]}
    merged = _merge(old, new)
    assert merged["targets_ms"] == [1000.0, 2000.0]
    by_engine = {r["engine"]: r["searches"] for r in merged["runs"]}
    assert [(s["target_ms"], s["max_sustainable_rate"], s["started"]) for s in by_engine["a"]] == [
        (1000.0, 5, "t0"), (2000.0, 9, "t1")]
    assert [s["max_sustainable_rate"] for s in by_engine["b"]] == [7]
    rerun = _merge(merged, {**new, "runs": [{"engine": "a", "searches": [search(2000.0, 11)]}]})
    assert [s["max_sustainable_rate"] for r in rerun["runs"] if r["engine"] == "a" for s in r["searches"]] == [5, 11]


def _samples(sched: list[float], processing: float = 400.0):
    from benchmarks.engines import Sample

    return [Sample(i, s, processing) for i, s in enumerate(sched)]


def test_measurement_starts_once_the_start_up_backlog_has_drained():
    from benchmarks.engines import Plan, measured_start
    from benchmarks.run import judge

    plan = Plan(warmup=3, measure=4, target_ms=1000.0, abort_sched_ms=4000.0, slack_s=1.0, settle=5)
    # A backlog from the start-up transient (batches just under the interval drain it slowly).
    draining = [900, 800, 700, 600, 400, 240, 20, 10, 12, 9, 11, 10]
    assert measured_start(_samples(draining[:5]), plan, 500.0) is None  # not known yet
    assert measured_start(_samples(draining), plan, 500.0) == 5
    verdict = judge(_samples(draining), plan, 500.0)
    assert verdict["sustainable"] and verdict["measured_from_batch"] == 5
    # Without settling, the same trial is judged on the draining batches and fails.
    assert not judge(_samples(draining), Plan(3, 4, 1000.0, 4000.0, 1.0), 500.0)["sustainable"]


def test_a_backlog_that_never_drains_is_measured_at_the_bound_and_fails():
    from benchmarks.engines import Plan, measured_start
    from benchmarks.run import judge

    plan = Plan(warmup=2, measure=3, target_ms=1000.0, abort_sched_ms=4000.0, slack_s=1.0, settle=3)
    growing = [100.0 * i for i in range(1, 10)]
    assert measured_start(_samples(growing), plan, 500.0) == 5
    verdict = judge(_samples(growing), plan, 500.0)
    assert not verdict["sustainable"] and verdict["measured_from_batch"] == 5
    stopped = judge(_samples(growing[:4]), plan, 500.0)  # the trial ended before the bound
    assert not stopped["sustainable"] and "late when the trial stopped" in stopped["reason"]


def test_profile_tables_render_from_their_benchmarks_json(monkeypatch):
    import benchmarks.report as report

    docs = {
        "record_cost": {"command": "python -m benchmarks.record_cost", "lines": 100, "repeat": 5,
                        "pairs_per_line": 17.0, "fixed_ms": 160.0, "rate_bound_lines_per_s": 150_000.0,
                        "steps": {"generate": {"us_per_line_q1": 0.2}, "+ flatMap": {"us_per_line_q1": 4.0},
                                  "+ combine": {"us_per_line_q1": 9.0}}},
        "batch_timeline": {"command": "python -m benchmarks.batch_timeline", "workload": "wordcount", "rate": 200,
                           "interval_ms": 500.0, "window_s": 5.0, "batches": [{}] * 3,
                           "summary": {"processing_ms": 170.0, "before_first_stage_ms": 17.5,
                                       "after_last_stage_ms": 17.0, "between_stage_1_and_2_ms": 4.0,
                                       "stage_1": {"stage_ms": 51.0, "submit_to_first_task_ms": 5.0,
                                                   "task_run_ms": 32.0, "task_deserialize_ms": 2.0},
                                       "stage_2": {"stage_ms": 74.0, "submit_to_first_task_ms": None,
                                                   "task_run_ms": 45.0, "task_deserialize_ms": 6.5}}},
    }
    monkeypatch.setattr(report, "_load", lambda name: docs.get(name))
    cost = "\n".join(report.record_cost_table())
    assert "| + combine | 9.00 | 5.00 |" in cost and "150,000 lines/s" in cost
    timeline = "\n".join(report.batch_timeline_table())
    assert "| stage 1 end -> stage 2 submitted | 4.0 |" in timeline
    assert "submitted -> first task launched -;" in timeline and "| 74.0 |" in timeline
    monkeypatch.setattr(report, "_load", lambda name: None)
    assert report.record_cost_table() == [] and report.batch_timeline_table() == []


def test_benchmark_merge_of_an_engine_subset_keeps_the_other_engines():
    from benchmarks.__main__ import _merge

    old = {"command": "run a and run b", "started": "t0", "targets_ms": [1000.0, 2000.0],
           "runs": [{"engine": "a", "searches": [{"target_ms": 2000.0, "max_sustainable_rate": 5}]},
                    {"engine": "b", "searches": [{"target_ms": 2000.0, "max_sustainable_rate": 7}]}]}
    new = {"command": "run b", "started": "t1", "targets_ms": [2000.0],
           "runs": [{"engine": "b", "searches": [{"target_ms": 2000.0, "max_sustainable_rate": 3}]}]}
    merged = _merge(old, new)
    by_engine = {r["engine"]: [s["max_sustainable_rate"] for s in r["searches"]] for r in merged["runs"]}
    assert by_engine == {"a": [5], "b": [3]}
    assert merged["command"] == "run a and run b"


class _IdleSparkContext:
    """Just what the rate search asks of a SparkContext between trials: no active jobs."""

    def statusTracker(self):
        return self

    def getActiveJobsIds(self):
        return []


def _fake_trials(limit: int, tried: list[int]):
    """A trial function whose engine sustains exactly the rates up to ``limit``."""
    from benchmarks.engines import Sample

    def run(sc, wl, rate, interval_s, plan):
        tried.append(rate)
        processing = 100.0 if rate <= limit else 10 * interval_s * 1000
        return [Sample(i, 0.0 if rate <= limit else 3000.0, processing)
                for i in range(plan.warmup + plan.settle + plan.measure)]

    return run


@pytest.mark.slow
def test_a_search_never_tries_a_rate_above_max_rate_and_steps_down_by_down():
    from benchmarks.memory import PeakMemory
    from benchmarks.run import Mode, search
    from benchmarks.workloads import WORKLOADS

    mode = Mode(warmup=1, measure=2, max_trials=6, precision=1.3, settle=0, fill_window=False)
    tried: list[int] = []
    up = search("fake", WORKLOADS["grep"], 1000.0, mode, _IdleSparkContext(), PeakMemory(None),
                run=_fake_trials(10**9, tried), start=40_000, max_rate=100_000)
    assert tried[1:] == [40_000, 80_000, 100_000]  # after the discarded warm-up trial: doubling, then the cap
    assert up["max_sustainable_rate"] == 100_000 and up["lowest_failing_rate"] is None
    assert up["max_rate"] == 100_000
    tried.clear()
    down = search("fake", WORKLOADS["grep"], 1000.0, mode, _IdleSparkContext(), PeakMemory(None),
                  run=_fake_trials(25_000, tried), start=40_000, down=2.0)
    assert tried[1:3] == [40_000, 20_000]  # halved, not quartered
    assert down["max_sustainable_rate"] >= 20_000 and down["lowest_failing_rate"] <= 40_000


def test_redis_benchmark_sizes_its_input_for_the_longest_trial_within_the_memory_budget():
    from benchmarks.redis_source import CORES, KEYS, QUICK_SETTINGS, data_plan, mode_for, model_rate, ratio
    from benchmarks.run import trial_plan
    from benchmarks.workloads import WORKLOADS

    wl = WORKLOADS["wordcount"]
    mode = mode_for(QUICK_SETTINGS, "wordcount")
    plan = trial_plan(wl, 1000.0, mode)
    assert plan.warmup == 60  # windowed: the 30 s window fills first
    roomy = data_plan(wl, 1000.0, mode, 6, 50_000, 115.0, 2**40)
    assert roomy["max_rate"] == 100_000 and not roomy["budget_limited"]
    assert roomy["entries_per_key"] == 100_000 // KEYS // 2 * (60 + mode.measure + 6)
    tight = data_plan(wl, 1000.0, mode, 6, 50_000, 115.0, 200 * 2**20)
    assert tight["budget_limited"] and tight["max_rate"] < 100_000
    assert tight["estimated_bytes"] <= 200 * 2**20
    # The model: the generator pipeline's cost per record plus the source's CPU per entry on the cores.
    assert abs(model_rate(100_000, 10.0) - 1 / (1e-5 + 10e-6 / CORES)) < 1e-6
    r = ratio({"max_sustainable_rate": 1000, "lowest_failing_rate": 2000},
              {"max_sustainable_rate": 100, "lowest_failing_rate": 125})
    assert r == {"ratio": 10.0, "low": 8.0, "high": 20.0}
