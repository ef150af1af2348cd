"""The rate search: the highest input rate an engine sustains for a workload at a latency target.

Contract:

* A rate is **sustainable** at target ``T`` (batch interval ``T/2``) when, over the measured batches
  (after the warm-up and, within a bound, after the start-up backlog has drained:
  :func:`benchmarks.engines.measured_start`), the median end-to-end latency
  ``interval + scheduling delay + processing time`` is under ``T`` and the scheduling delay does not
  grow: the least-squares slope of the scheduling delay over the measured batches, times their
  number, stays under half an interval.
* The search starts at the engine's start rate, doubles while sustainable and divides by 4 while not
  (down to :data:`MIN_RATE`), then bisects geometrically between the best sustainable and the lowest
  failing rate until they are within ``plan.precision`` or the trial budget is spent.
* :func:`child_main` runs every target of one (engine, workload) pair in one process with one
  SparkContext (``dstreams.spark.sparkconf.tuned_conf``, the same for every engine; for the engines of
  ``UNTUNED_ENGINES`` a plain ``SparkContext("local[2]", app)``, as a ``pyspark.streaming`` script makes
  it) and prints one JSON line.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .engines import ENGINES, UNTUNED_ENGINES, Plan, Sample, measured_start
from .memory import PeakMemory
from .workloads import WORKLOADS, Workload

MARKER = "BENCH_RESULT "
MIN_RATE = 1_000

#: First rate per (engine, workload): near what was measured before, so the search spends its
#: trials around the answer. Any start works; it only changes how many trials the search needs.
START_RATES: dict[tuple[str, str], int] = {
    ("dstreams", "grep"): 2_800_000,
    ("pyspark.streaming", "grep"): 2_800_000,
    ("pyspark.streaming-defaults", "grep"): 1_000_000,
    ("ss-udf", "grep"): 400_000,
    ("ss-sql", "grep"): 2_000_000,
    ("dstreams", "wordcount"): 100_000,
    ("dstreams", "topk"): 100_000,
    ("dstreams-user", "grep"): 2_800_000,
    ("dstreams-user", "wordcount"): 100_000,
    ("dstreams-user", "topk"): 100_000,
    ("dstreams-arrow", "grep"): 2_800_000,
    ("dstreams-arrow", "wordcount"): 400_000,
    ("dstreams-arrow", "topk"): 400_000,
}
PEER_WINDOWED_START = 8_000


@dataclass
class Mode:
    warmup: int
    measure: int
    max_trials: int
    precision: float
    #: Extra warm-up batches, at most, for the start-up backlog to drain (``Plan.settle``).
    settle: int
    #: Windowed workloads warm up until the window is full (``window / interval`` batches) when set.
    fill_window: bool


QUICK = Mode(warmup=4, measure=10, max_trials=6, precision=1.3, settle=40, fill_window=True)
FULL = Mode(warmup=10, measure=20, max_trials=8, precision=1.25, settle=60, fill_window=True)


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2
    my = sum(ys) / n
    den = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / den


def judge(samples: list[Sample], plan: Plan, interval_ms: float) -> dict[str, Any]:
    """Whether the measured batches of a trial meet the target (see the module contract)."""
    start = measured_start(samples, plan, interval_ms)
    drained = start is not None
    if start is None:  # the trial ended while the start-up backlog was still draining
        start = plan.warmup + plan.settle
    measured = samples[start: start + plan.measure]
    out: dict[str, Any] = {"batches_completed": len(samples), "batches_measured": len(measured),
                           "measured_from_batch": start}
    if len(measured) < plan.measure:
        reason = f"only {len(measured)} of {plan.measure} measured batches completed"
        if not drained:
            reason += " (batches still started over half an interval late when the trial stopped)"
        out.update(sustainable=False, reason=reason)
        if measured:
            lat = [interval_ms + s.scheduling_ms + s.processing_ms for s in measured]
            out.update(p50_latency_ms=_percentile(lat, 0.5), p95_latency_ms=_percentile(lat, 0.95),
                       median_processing_ms=statistics.median(s.processing_ms for s in measured))
        return out
    lat = [interval_ms + s.scheduling_ms + s.processing_ms for s in measured]
    sched = [s.scheduling_ms for s in measured]
    growth = _slope(sched) * len(sched)
    p50 = _percentile(lat, 0.5)
    out.update(
        p50_latency_ms=p50,
        p95_latency_ms=_percentile(lat, 0.95),
        median_processing_ms=statistics.median(s.processing_ms for s in measured),
        median_scheduling_ms=statistics.median(sched),
        scheduling_growth_ms=growth,
    )
    if p50 >= plan.target_ms:
        out.update(sustainable=False, reason=f"median latency {p50:.0f} ms >= target {plan.target_ms:.0f} ms")
    elif growth >= interval_ms / 2:
        out.update(sustainable=False, reason=f"scheduling delay grows ({growth:.0f} ms over the measured batches)")
    else:
        out.update(sustainable=True, reason="ok")
    return out


def _round_rate(r: float) -> int:
    if r <= 0:
        return 0
    digits = max(0, int(math.floor(math.log10(r))) - 1)
    return int(round(r / 10**digits) * 10**digits)


def _drain(sc: Any, timeout_s: float = 30.0) -> None:
    """Wait until the previous trial's Spark jobs are gone (a stopped stream may leave cancelled tasks)."""
    deadline = time.monotonic() + timeout_s
    while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)


def trial_plan(wl: Workload, target_ms: float, mode: Mode) -> Plan:
    """The plan of every measured trial of a search at ``target_ms`` (batch interval ``target_ms / 2``)."""
    interval_ms = target_ms / 2.0
    warmup = mode.warmup
    if mode.fill_window and wl.windowed:
        warmup = max(warmup, int(round(30_000 / interval_ms)))
    return Plan(warmup=warmup, measure=mode.measure, target_ms=target_ms,
                abort_sched_ms=max(4 * target_ms, 4000.0), slack_s=max(15.0, 3 * target_ms / 1000.0),
                settle=mode.settle)


def search(engine: str, wl: Workload, target_ms: float, mode: Mode, sc: Any, memory: PeakMemory, *,
           run: Callable[[Any, Workload, int, float, Plan], list[Sample]] | None = None,
           start: int | None = None, max_rate: int | None = None, down: float = 4.0) -> dict[str, Any]:
    """The rate search of the module contract for ``engine`` (trials by ``ENGINES[engine]`` unless ``run``).

    ``start`` overrides the first rate (:data:`START_RATES`); with ``max_rate`` no trial runs above that rate
    (a step past it tries ``max_rate`` itself, then the search stops): a source whose input was written
    beforehand holds that much. ``down`` is the factor the rate is divided by while nothing was sustainable
    (a smaller step when the start is an estimate close to the answer).
    """
    interval_s = target_ms / 2000.0
    interval_ms = target_ms / 2.0
    plan = trial_plan(wl, target_ms, mode)
    if start is None:
        start = START_RATES.get((engine, wl.name), PEER_WINDOWED_START if wl.windowed else 400_000)
    if max_rate is not None:
        start = min(start, max_rate)
    trials: list[dict[str, Any]] = []
    best: int | None = None
    lowest_fail: int | None = None
    rate = start
    if run is None:
        run = ENGINES[engine]
    # A discarded short trial first: Python workers start, the JVM warms up, caches fill.
    run(sc, wl, max(MIN_RATE, start // 8), interval_s,
        Plan(warmup=0, measure=4, target_ms=target_ms, abort_sched_ms=plan.abort_sched_ms, slack_s=plan.slack_s))
    _drain(sc)
    while len(trials) < mode.max_trials:
        memory.reset()
        t0 = time.monotonic()
        try:
            samples = run(sc, wl, rate, interval_s, plan)
            verdict = judge(samples, plan, interval_ms)
        except Exception as e:  # the engine cannot run this workload: say so
            verdict = {"sustainable": False, "reason": f"error: {type(e).__name__}: {str(e)[:300]}", "error": True}
            samples = []
            traceback.print_exc(file=sys.stderr)
        trial = {"rate": rate, "interval_ms": interval_ms, "wall_s": round(time.monotonic() - t0, 1),
                 "load_average_1min": round(os.getloadavg()[0], 2),
                 **verdict, "memory": memory.peaks(), "samples": [asdict(s) for s in samples]}
        trials.append(trial)
        _drain(sc)
        print(f"[{engine} {wl.name} {target_ms:.0f}ms] rate={rate:,} -> {verdict.get('reason')} "
              f"p50={verdict.get('p50_latency_ms', math.nan):.0f}ms", file=sys.stderr, flush=True)
        if verdict.get("error"):
            break
        if verdict["sustainable"]:
            best = rate if best is None else max(best, rate)
        else:
            lowest_fail = rate if lowest_fail is None else min(lowest_fail, rate)
        if best is None:
            nxt = _round_rate(rate / down)
            if nxt < MIN_RATE:
                break
        elif lowest_fail is None:
            nxt = _round_rate(rate * 2)
            if max_rate is not None and nxt > max_rate:
                if rate >= max_rate:
                    break
                nxt = max_rate
        else:
            if lowest_fail / best <= mode.precision:
                break
            nxt = _round_rate(math.sqrt(best * lowest_fail))
            if nxt in (best, lowest_fail):
                break
        rate = nxt
    best_trial = next((t for t in trials if t["rate"] == best and t["sustainable"]), None)
    return {
        "engine": engine,
        "workload": wl.name,
        "target_ms": target_ms,
        "interval_ms": interval_ms,
        "warmup_batches": plan.warmup,
        "measured_batches": plan.measure,
        "max_sustainable_rate": best or 0,
        **({} if max_rate is None else {"max_rate": max_rate}),
        "lowest_failing_rate": lowest_fail,
        "error": next((t["reason"] for t in trials if t.get("error")), None),
        "at_best": None if best_trial is None else {
            k: best_trial.get(k) for k in ("p50_latency_ms", "p95_latency_ms", "median_processing_ms", "memory")
        },
        "trials": trials,
    }


def child_main(engine: str, workload: str, targets: list[float], mode_name: str) -> int:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dstreams.spark.sparkconf import create_spark_context

    mode = QUICK if mode_name == "quick" else FULL
    if engine in UNTUNED_ENGINES:
        # As a pyspark.streaming script builds its context: Spark's defaults (workers run this interpreter).
        from pyspark import SparkContext

        os.environ["PYSPARK_PYTHON"] = sys.executable
        sc = SparkContext("local[2]", f"bench-{engine}-{workload}")
    else:
        sc = create_spark_context("local[2]", f"bench-{engine}-{workload}")
    sc.setLogLevel("ERROR")
    jvm_pid = getattr(getattr(sc._gateway, "proc", None), "pid", None)
    memory = PeakMemory(jvm_pid).start()
    results = []
    try:
        for target in targets:
            results.append(search(engine, WORKLOADS[workload], target, mode, sc, memory))
    finally:
        memory.stop()
        sc.stop()
    print(MARKER + json.dumps({"engine": engine, "workload": workload, "searches": results}), flush=True)
    return 0
