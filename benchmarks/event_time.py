"""Event-time windows next to Structured Streaming's ``withWatermark`` + ``window`` + ``groupBy().count()``.

Run from the repository root::

    python -m benchmarks.event_time [--quick]    # quick: QUICK trials; default: FULL trials

Contract:

* **Data** (the same for both engines): record ``v`` (an integer row number) of a batch whose time is
  ``T`` (ms) is ``(key, event time)`` with ``key = v % KEYS`` and event time ``T - delay(v)``, where
  ``delay(v) = (v * 7919) % DISORDER_MS`` (bounded disorder: 0 to 4 s behind the batch time) plus
  ``LATE_BY_MS`` (2 min) for every ``LATE_EVERY``-th row (about 1 %: later than the allowed lateness
  ``LATENESS_MS`` and than every window that contains them, so both engines drop them whole). Batch ``b``
  (from 0) holds the rows ``[b * rows, (b + 1) * rows)``. dstreams makes them in the executors with
  ``ssc.generatorStream`` (:func:`event_records`, Python); Structured Streaming with the ``rate-micro-batch``
  source (``rowsPerBatch = rows``; ``value`` is ``v``, ``timestamp`` is ``T``) and the same function as
  built-in SQL expressions (:func:`ss_events`). What differs: in the rate searches dstreams' row numbers
  start at ``batch time / interval * rows`` (the generator does not know its first batch), Structured
  Streaming's at 0 (the same key and delay distribution per batch, not the same rows); in the
  cross-check they are the same rows.
* **Pipelines.** dstreams: ``withEventTime(event, allowedLateness=LATENESS_MS)``, ``(key, 1)``,
  ``reduceByKeyAndEventWindow(add, window, slide, invFunc=sub, emit="final")``, one ``count()`` action per
  batch. Structured Streaming: ``withWatermark("event_time", LATENESS_MS)``, ``groupBy(window(event_time,
  window, slide), key).count()`` in **append** mode to the ``noop`` sink: append emits each window once,
  when the watermark passes its end, with its final count, which is what ``emit="final"`` does (update
  mode would emit every changed window every batch, as ``emit="updates"``); both watermarks are the
  largest event time of the batches before minus the lateness.
* **The late-data row** (``LATE_DATA``): the same, but a tenth of the rows are late by up to twice the
  allowed lateness beyond the disorder (``late_spread_ms``), so many rows are behind the watermark while
  some of their windows are still open: both engines count such a row in those windows (per-window
  lateness).
* **Correctness cross-check** (:func:`cross_check`, before the searches, in its own process): both engines
  run the very same rows of each configuration at a small rate, batch times ``T0 + (b + 1) * interval``
  (dstreams on a ManualClock started at ``T0``; the rate source's ``startTimestamp``), and every window
  each emits, per batch, with its count, must be equal up to the one documented difference
  (:func:`ss_extra`): Structured Streaming filters late rows with the watermark of the batch *before* (its
  ``eventTimeWatermarkForLateEvents``; it evicts with the current one), so a window that closes in batch
  ``b`` also counts batch ``b``'s rows in it, which dstreams (Flink's rule: the watermark in force for a
  batch closes its windows first) counts as late for it. The searches run only if the check passes.
* **Rate search** (``benchmarks.run.search``, the rule of ``benchmarks.run.judge``): 1 s latency target
  (500 ms batches), one search per engine and window configuration, warm-up until a window's state is
  full (``window + lateness + disorder`` of event time). Each engine runs in its own process on
  ``create_spark_context("local[2]", ...)`` (``dstreams.spark.sparkconf.tuned_conf``); Structured Streaming with
  ``spark.sql.shuffle.partitions = 2`` as in the other benchmarks.

Writes ``benchmarks/results/event_time.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import operator
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .engines import Plan, Sample, _iso_ms, _progress_dicts, _wait
from .memory import PeakMemory
from .run import FULL, QUICK, Mode, search
from .workloads import Workload

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
OUT = RESULTS / "event_time.json"
MARKER = "EVENT_TIME_RESULT "

KEYS = 1000
DISORDER_MS = 4001
LATE_EVERY = 97
LATE_BY_MS = 120_000
LATENESS_MS = 5000
TARGET_MS = 1000.0
#: Cross-check: batch time origin (a multiple of every slide), rows per batch, batches.
T0_MS = 1_700_000_000_000
CHECK_ROWS = 2000
CHECK_INTERVAL_MS = 500


@dataclasses.dataclass(frozen=True)
class EventData:
    """How far behind its batch time each row's event time is, and the allowed lateness (module contract).

    ``delay(v) = (v * 7919) % disorder_ms`` plus, for every ``late_every``-th row, ``late_by_ms +
    (v * 104729) % late_spread_ms`` (``late_spread_ms`` 0: no spread)."""

    disorder_ms: int = DISORDER_MS
    late_every: int = LATE_EVERY
    late_by_ms: int = LATE_BY_MS
    late_spread_ms: int = 0
    lateness_ms: int = LATENESS_MS

    def delay_ms(self, v: int) -> int:
        extra = self.late_by_ms + ((v * 104729) % self.late_spread_ms if self.late_spread_ms else 0)
        return (v * 7919) % self.disorder_ms + (extra if v % self.late_every == 0 else 0)


#: The searches' data: bounded disorder, 1 % of the rows 2 min late (later than every window they fall in).
BENCH_DATA = EventData()
#: The late-data row: a tenth of the rows late by up to twice the allowed lateness (beyond the disorder), so
#: that many are behind the watermark while some of their windows are still open.
LATE_DATA = EventData(late_every=10, late_by_ms=0, late_spread_ms=2 * LATENESS_MS)


#: (window ms, slide ms, data) per configuration.
CONFIGS: dict[str, tuple[int, int, EventData]] = {
    "window 1 min, slide 10 s": (60_000, 10_000, BENCH_DATA),
    "window 30 s, slide 1 s": (30_000, 1_000, BENCH_DATA),
    "window 30 s, slide 1 s, late data": (30_000, 1_000, LATE_DATA),
}
#: First rate of each search (near earlier measurements; any start works, it changes the trial count).
START_RATES: dict[tuple[str, str], int] = {
    ("dstreams", "window 1 min, slide 10 s"): 160_000, ("dstreams", "window 30 s, slide 1 s"): 160_000,
    ("dstreams", "window 30 s, slide 1 s, late data"): 160_000,
    ("ss", "window 1 min, slide 10 s"): 200_000, ("ss", "window 30 s, slide 1 s"): 40_000,
    ("ss", "window 30 s, slide 1 s, late data"): 40_000,
}


def delay_ms(v: int) -> int:
    """How far behind its batch time row ``v``'s event time is in the searches' data (``BENCH_DATA``)."""
    return BENCH_DATA.delay_ms(v)


def event_records(interval_ms: int, rows: int, origin_ms: int = 0, data: EventData = BENCH_DATA
                  ) -> Callable[[int, int, int, int], Iterator[tuple[int, int]]]:
    """A ``generatorStream`` record function: ``(key, event ms)`` of the rows of each batch.

    Batch time ``T`` is batch ``b = (T - origin_ms) // interval_ms - 1``; partition ``p`` of ``n`` rows holds
    the rows ``b * rows + p * n + i``."""

    def make(seed: int, time_ms: int, partition: int, n: int) -> Iterator[tuple[int, int]]:
        first = ((time_ms - origin_ms) // interval_ms - 1) * rows + partition * n
        return ((v % KEYS, time_ms - data.delay_ms(v)) for v in range(first, first + n))

    return make


def event_seconds(record: tuple[int, int]) -> float:
    """``withEventTime``'s function: the record's event time in seconds."""
    return record[1] / 1000


def key_one(record: tuple[int, int]) -> tuple[int, int]:
    return (record[0], 1)


def ss_events(spark: Any, rows: int, parts: int, interval_ms: int, start_ms: int, data: EventData = BENCH_DATA
              ) -> Any:
    """The rate source's rows as ``(key, event_time)``: the function of :meth:`EventData.delay_ms` in SQL."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual alias

    src = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
           .option("numPartitions", parts).option("advanceMillisPerBatch", interval_ms)
           .option("startTimestamp", start_ms).load())
    v = F.col("value")
    extra = F.lit(data.late_by_ms)
    if data.late_spread_ms:
        extra = extra + F.pmod(v * 104729, F.lit(data.late_spread_ms))
    delay = F.pmod(v * 7919, F.lit(data.disorder_ms)) + F.when(F.pmod(v, F.lit(data.late_every)) == 0,
                                                               extra).otherwise(0)
    event = F.timestamp_millis(F.unix_millis("timestamp") - delay)
    return src.select(F.pmod(v, F.lit(KEYS)).alias("key"), event.alias("event_time"))


def ss_counts(events: Any, window_ms: int, slide_ms: int, lateness_ms: int = LATENESS_MS) -> Any:
    """``withWatermark`` + ``groupBy(window, key).count()``."""
    from pyspark.sql import functions as F  # noqa: N812

    return (events.withWatermark("event_time", f"{lateness_ms} milliseconds")
            .groupBy(F.window("event_time", f"{window_ms} milliseconds", f"{slide_ms} milliseconds"), "key")
            .count())


def dstreams_counts(ssc: Any, rows_per_part: int, parts: int, interval_ms: int, window_ms: int, slide_ms: int,
                    origin_ms: int = 0, data: EventData = BENCH_DATA) -> Any:
    """dstreams' pipeline: ``((key, (start, end)), count)`` of each window, emitted once (``emit="final"``)."""
    lines = ssc.generatorStream(rows_per_part, parts, recordFunc=event_records(interval_ms, rows_per_part * parts,
                                                                              origin_ms, data))
    return (lines.withEventTime(event_seconds, allowedLateness=f"{data.lateness_ms}ms").map(key_one)
            .reduceByKeyAndEventWindow(operator.add, f"{window_ms}ms", f"{slide_ms}ms", invFunc=operator.sub,
                                       emit="final", numPartitions=parts))


# ------------------------------------------------------------------------------------------ the trials
def run_dstreams(window_ms: int, slide_ms: int, data: EventData = BENCH_DATA
                 ) -> Callable[[Any, Workload, int, float, Plan], list[Sample]]:
    """A trial runner for :func:`benchmarks.run.search` (contract of ``benchmarks.engines``)."""

    def run(sc: Any, wl: Workload, rate: int, interval_s: float, plan: Plan) -> list[Sample]:
        from dstreams import StreamingContext

        parts = sc.defaultParallelism
        per_part = round(rate * interval_s / parts)
        interval_ms = round(interval_s * 1000)
        ssc = StreamingContext(sc, interval_s)
        dstreams_counts(ssc, per_part, parts, interval_ms, window_ms, slide_ms, data=data).foreachRDD(
            lambda rdd: rdd.count())

        def samples() -> list[Sample]:
            infos = sorted((i for i in ssc.batchInfos() if i.processing_end_time_ms is not None),
                           key=lambda i: i.batch_time_ms)
            return [Sample(k, float(i.scheduling_delay_ms), float(i.processing_delay_ms))
                    for k, i in enumerate(infos)]

        ssc.start()
        try:
            return _wait(samples, plan, interval_s)
        finally:
            ssc.stop(stopSparkContext=False, stopGraceFully=False)

    return run


def _spark(sc: Any) -> Any:
    from pyspark.sql import SparkSession

    spark = SparkSession(sc)
    spark.conf.set("spark.sql.shuffle.partitions", str(sc.defaultParallelism))
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
    return spark


def run_ss(window_ms: int, slide_ms: int, data: EventData = BENCH_DATA
           ) -> Callable[[Any, Workload, int, float, Plan], list[Sample]]:
    """A Structured Streaming trial runner; samples as ``benchmarks.engines``' Structured Streaming ones
    (scheduling delay = trigger start minus its slot on the grid anchored at the first measured batch)."""

    def run(sc: Any, wl: Workload, rate: int, interval_s: float, plan: Plan) -> list[Sample]:
        spark = _spark(sc)
        parts = sc.defaultParallelism
        interval_ms = round(interval_s * 1000)
        rows = max(1, round(rate * interval_s / parts)) * parts  # as dstreams: a whole number per partition
        tmp = tempfile.mkdtemp(prefix="bench-ss-event-ckpt-")
        events = ss_events(spark, rows, parts, interval_ms, int(time.time() * 1000), data)
        query = (ss_counts(events, window_ms, slide_ms, data.lateness_ms).writeStream.outputMode("append")
                 .format("noop").option("checkpointLocation", tmp)
                 .trigger(processingTime=f"{interval_ms} milliseconds").start())

        def samples() -> list[Sample]:
            progress = sorted(_progress_dicts(query), key=lambda p: p["batchId"])
            if not progress:
                return []
            starts = [_iso_ms(p["timestamp"]) for p in progress]
            anchor_i = min(plan.warmup, len(progress) - 1)
            out = []
            for k, p in enumerate(progress):
                slot = starts[anchor_i] + (k - anchor_i) * interval_ms
                sched = max(0.0, starts[k] - slot) if k >= anchor_i else 0.0
                detail = {"durationMs": p.get("durationMs"), "numInputRows": p.get("numInputRows"),
                          "stateRows": [op.get("numRowsTotal") for op in p.get("stateOperators", [])],
                          "droppedByWatermark": [op.get("numRowsDroppedByWatermark")
                                                 for op in p.get("stateOperators", [])]}
                out.append(Sample(k, sched, float(p["durationMs"].get("triggerExecution", 0)), detail))
            return out

        try:
            return _wait(samples, plan, interval_s)
        finally:
            query.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    return run


RUNNERS = {"dstreams": run_dstreams, "ss": run_ss}
ENGINE_LABELS = {"dstreams": "dstreams: withEventTime + reduceByKeyAndEventWindow(add, invFunc=sub, emit=final)",
                 "ss": "Structured Streaming: withWatermark + groupBy(window, key).count(), append mode"}


def _unused_build(*_: Any) -> None:
    raise AssertionError("the event-time trials build their own pipelines")


def mode_for(base: Mode, window_ms: int, data: EventData = BENCH_DATA) -> Mode:
    """``base`` with a warm-up long enough for a window's state to fill (window + lateness + disorder)."""
    fill = math.ceil((window_ms + data.lateness_ms + data.disorder_ms + data.late_spread_ms) / (TARGET_MS / 2))
    return dataclasses.replace(base, warmup=max(base.warmup, fill))


# ------------------------------------------------------------------------------------------ cross-check
#: A window as compared: (key, start ms, end ms, count).
Window = tuple[int, int, int, int]


def dstreams_windows(sc: Any, window_ms: int, slide_ms: int, batches: int, rows: int = CHECK_ROWS,
                     interval_ms: int = CHECK_INTERVAL_MS, data: EventData = BENCH_DATA) -> dict[int, list[Window]]:
    """dstreams' windows, per batch ``b`` (from 0; batch time ``T0_MS + (b + 1) * interval_ms``), on a
    ManualClock: ``rows`` rows a batch (module contract)."""
    from dstreams import ManualClock, StreamingContext

    parts = sc.defaultParallelism
    clock = ManualClock(T0_MS)
    ssc = StreamingContext(sc, interval_ms / 1000, clock=clock)
    got: dict[int, list[Any]] = {}

    def keep(t: Any, rdd: Any) -> None:
        b = (round(t.timestamp() * 1000) - T0_MS) // interval_ms - 1
        got[b] = sorted((k, round(s * 1000), round(e * 1000), c) for (k, (s, e)), c in rdd.collect())

    dstreams_counts(ssc, rows // parts, parts, interval_ms, window_ms, slide_ms, T0_MS, data).foreachRDD(keep)
    ssc.start()
    try:
        for b in range(batches):
            clock.advance(interval_ms)
            ssc.awaitBatch(T0_MS + (b + 1) * interval_ms, 120.0)
    finally:
        ssc.stop(stopSparkContext=False)
    return got


def ss_windows(sc: Any, window_ms: int, slide_ms: int, batches: int, rows: int = CHECK_ROWS,
               interval_ms: int = CHECK_INTERVAL_MS, data: EventData = BENCH_DATA,
               timeout_s: float = 600.0) -> dict[int, list[Window]]:
    """Structured Streaming's windows (append mode) per batch id, on the same rows as :func:`dstreams_windows`."""
    from pyspark.sql import functions as F  # noqa: N812

    spark = _spark(sc)
    got: dict[int, list[Any]] = {}
    done = threading.Event()

    def keep(df: Any, batch_id: int) -> None:
        rows_ = df.select("key", F.unix_millis("window.start").alias("s"), F.unix_millis("window.end").alias("e"),
                          "count").collect()
        if batch_id < batches:
            got[batch_id] = sorted((r["key"], r["s"], r["e"], r["count"]) for r in rows_)
        if len(got) >= batches:
            done.set()

    tmp = tempfile.mkdtemp(prefix="bench-ss-event-check-")
    events = ss_events(spark, rows, sc.defaultParallelism, interval_ms, T0_MS + interval_ms, data)
    query = (ss_counts(events, window_ms, slide_ms, data.lateness_ms).writeStream.outputMode("append")
             .foreachBatch(keep).option("checkpointLocation", tmp).start())
    try:
        if not done.wait(timeout_s):
            raise TimeoutError(f"Structured Streaming ran {len(got)} of {batches} batches in {timeout_s:.0f} s")
    finally:
        query.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return got


def ss_extra(window_ms: int, slide_ms: int, batches: int, rows: int = CHECK_ROWS,
             interval_ms: int = CHECK_INTERVAL_MS, data: EventData = BENCH_DATA
             ) -> tuple[dict[int, Counter[tuple[int, int, int]]], dict[str, int]]:
    """What Structured Streaming counts beyond dstreams, per batch and window ``(key, start, end)``, by the one
    documented difference (docs/concepts/event-time.md, "One difference from Structured Streaming"): with ``W(b)``
    the watermark of batch ``b`` (the largest event time of the batches before, minus the lateness), a window whose
    end is in ``(W(b - 1), W(b)]`` closes in batch ``b``; dstreams emits it with the rows of the batches before,
    Structured Streaming (late rows filtered with the previous batch's watermark) with batch ``b``'s rows in it too.
    Also returns counts of the rows behind the watermark: ``behind`` (all), ``partly_counted`` (in some windows
    still open: counted by per-window lateness, dropped whole by a per-record rule) and ``dropped_whole``."""
    n = window_ms // slide_ms
    extra: dict[int, Counter[tuple[int, int, int]]] = {}
    stats = {"rows": 0, "behind": 0, "partly_counted": 0, "dropped_whole": 0}
    wm: int | None = None
    prev: int | None = None
    top: int | None = None
    for b in range(batches):
        t = T0_MS + (b + 1) * interval_ms
        prev = wm
        if top is not None:
            wm = top - data.lateness_ms if wm is None else max(wm, top - data.lateness_ms)
        events = [(v % KEYS, t - data.delay_ms(v)) for v in range(b * rows, (b + 1) * rows)]
        extra[b] = Counter()
        for key, ts in events:
            stats["rows"] += 1
            windows = [j for j in range(ts // slide_ms - n + 1, ts // slide_ms + 1)]
            ends = [j * slide_ms + window_ms for j in windows]
            if wm is not None and ts < wm:
                stats["behind"] += 1
                open_ = [e for e in ends if e > wm]
                stats["partly_counted" if open_ else "dropped_whole"] += 1
            for j, end in zip(windows, ends, strict=True):
                if wm is not None and end <= wm and (prev is None or end > prev):
                    extra[b][(key, j * slide_ms, end)] += 1
        top = max([ts for _, ts in events] + ([] if top is None else [top]))
    return extra, stats


def compare(ds: dict[int, list[Window]], ss: dict[int, list[Window]],
            extra: dict[int, Counter[tuple[int, int, int]]], batches: int) -> list[int]:
    """The batches where Structured Streaming's counts are not dstreams' plus :func:`ss_extra`'s."""
    differ = []
    for b in range(batches):
        mine = {(k, s_, e): c for k, s_, e, c in ds.get(b, [])}
        theirs = {(k, s_, e): c for k, s_, e, c in ss.get(b, [])}
        want = Counter(mine)
        want.update(extra.get(b, Counter()))
        if dict(+want) != theirs:
            differ.append(b)
    return differ


def cross_check(sc: Any) -> dict[str, Any]:
    """Both engines on the same rows (module contract): per configuration, whether every batch emitted the
    same windows with the same counts (up to :func:`ss_extra`), and how many windows and records that covers."""
    out: dict[str, Any] = {}
    for name, (window_ms, slide_ms, data) in CONFIGS.items():
        batches = math.ceil((window_ms + data.lateness_ms + data.disorder_ms + 3 * slide_ms) / CHECK_INTERVAL_MS) + 10
        ds = dstreams_windows(sc, window_ms, slide_ms, batches, data=data)
        ss = ss_windows(sc, window_ms, slide_ms, batches, data=data)
        extra, stats = ss_extra(window_ms, slide_ms, batches, data=data)
        differ = compare(ds, ss, extra, batches)
        rows = [w for b in range(batches) for w in ds.get(b, [])]
        out[name] = {"batches": batches, "rows_per_batch": CHECK_ROWS, "interval_ms": CHECK_INTERVAL_MS,
                     "windows_emitted": len(rows), "records_counted": sum(w[3] for w in rows),
                     "same": not differ, "batches_that_differ": differ[:20],
                     "rows_behind_watermark": stats["behind"], "rows_partly_counted": stats["partly_counted"],
                     "ss_extra_counts": sum(sum(c.values()) for c in extra.values()),
                     **({"first_difference": {"batch": differ[0], "dstreams": ds.get(differ[0], [])[:10],
                                              "ss": ss.get(differ[0], [])[:10]}} if differ else {})}
        print(f"[cross-check {name}] {len(rows)} windows over {batches} batches: "
              f"{'same' if not differ else f'DIFFERENT in batches {differ[:10]}'}", file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------------------------------------ processes
def child(role: str, mode_name: str) -> int:
    """One process: ``check`` (the cross-check) or an engine's searches over every configuration."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", f"bench-event-time-{role}")
    sc.setLogLevel("ERROR")
    try:
        if role == "check":
            doc: dict[str, Any] = {"cross_check": cross_check(sc)}
        else:
            base = QUICK if mode_name == "quick" else FULL
            memory = PeakMemory(getattr(getattr(sc._gateway, "proc", None), "pid", None)).start()
            searches = []
            try:
                only = os.environ.get("DSTREAMS_BENCH_CONFIGS")
                for name, (window_ms, slide_ms, data) in CONFIGS.items():
                    if only and name not in only.split(";"):
                        continue
                    wl = Workload(name, _unused_build, _unused_build, True)
                    found = search(role, wl, TARGET_MS, mode_for(base, window_ms, data), sc, memory,
                                   run=RUNNERS[role](window_ms, slide_ms, data), start=START_RATES[(role, name)],
                                   down=2.0)
                    searches.append({"config": name, "window_ms": window_ms, "slide_ms": slide_ms, **found})
            finally:
                memory.stop()
            doc = {"engine": role, "searches": searches}
    finally:
        sc.stop()
    print(MARKER + json.dumps(doc), flush=True)
    return 0


def _run_child(role: str, mode: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.event_time", "--child", role, mode]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT.parent, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"role": role, "failed": f"timed out after {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return {**json.loads(line[len(MARKER):]), "wall_s": round(time.monotonic() - t0, 1)}
    return {"role": role, "failed": f"child exited {proc.returncode}"}


def _trial_loads(doc: dict[str, Any]) -> list[float]:
    """The 1-minute load average at the end of every trial of a results document."""
    return [t["load_average_1min"] for run in doc.get("runs", []) for s in run.get("searches", [])
            for t in s.get("trials", [])]


def summary_lines(doc: dict[str, Any]) -> str:
    """The table of a results document (markdown)."""
    runs = {r.get("engine"): r for r in doc.get("runs", [])}
    lines = ["| window | dstreams (records/s) | Structured Streaming (records/s) | dstreams / SS |",
             "| --- | ---: | ---: | ---: |"]
    for name in CONFIGS:
        best: dict[str, int | None] = {}
        for engine in RUNNERS:
            found = next((s for s in runs.get(engine, {}).get("searches", []) if s["config"] == name), None)
            best[engine] = None if found is None else found["max_sustainable_rate"]
        ds, ss = best["dstreams"], best["ss"]
        ratio = f"{ds / ss:.2f}x" if ds and ss else "-"
        lines.append(f"| {name} | {ds if ds is None else f'{ds:,}'} | {ss if ss is None else f'{ss:,}'} | {ratio} |")
    loads = _trial_loads(doc)
    if loads:
        lines.append(f"\nload average (1 min) during the trials: {min(loads):.2f}-{max(loads):.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "--child":
        return child(raw[1], raw[2])
    p = argparse.ArgumentParser(prog="python -m benchmarks.event_time", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="QUICK trials (fewer measured batches and trials)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per subprocess")
    p.add_argument("--skip-check", action="store_true", help="run the searches without the cross-check")
    p.add_argument("--configs", help="only these configurations (names separated by ';'), e.g. "
                   "'window 30 s, slide 1 s, late data'")
    p.add_argument("--engines", help="only these engines (dstreams, ss; separated by ',')")
    p.add_argument("--out", help="write the results here instead of benchmarks/results/event_time.json")
    args = p.parse_args(raw)
    mode = "quick" if args.quick else "full"
    from .__main__ import _machine

    if args.configs:
        unknown = [c for c in args.configs.split(";") if c not in CONFIGS]
        if unknown:
            p.error(f"unknown configuration(s) {unknown}: choose among {list(CONFIGS)}")
        os.environ["DSTREAMS_BENCH_CONFIGS"] = args.configs  # read by the children
    engines = [e for e in RUNNERS if not args.engines or e in args.engines.split(",")]
    out = Path(args.out) if args.out else OUT

    doc: dict[str, Any] = {"benchmark": "event_time", "command": "python -m benchmarks.event_time " + " ".join(raw),
                           "mode": mode, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": _machine(),
                           "target_ms": TARGET_MS, "configs": {k: {"window_ms": w, "slide_ms": s}
                                                               for k, (w, s, _) in CONFIGS.items()},
                           "data": {k: {"keys": KEYS, **dataclasses.asdict(d)} for k, (_, _, d) in CONFIGS.items()},
                           "engines": ENGINE_LABELS, "runs": []}
    if not args.skip_check:
        print("== cross-check", flush=True)
        check = _run_child("check", mode, args.timeout)
        doc["cross_check"] = check.get("cross_check", check)
        if not all(c.get("same") for c in doc["cross_check"].values() if isinstance(c, dict)):
            print(json.dumps(doc["cross_check"], indent=1))
            print("the engines' window counts differ: no rate search", file=sys.stderr)
            _write(doc, out)
            return 1
    for engine in engines:
        print(f"== {engine}", flush=True)
        doc["runs"].append(_run_child(engine, mode, args.timeout))
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    doc["load_average_at_end"] = list(os.getloadavg())
    _write(doc, out)
    print(summary_lines(doc))
    return 0


def _write(doc: dict[str, Any], out: Path = OUT) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
