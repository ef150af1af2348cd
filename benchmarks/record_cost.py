"""Where a per-record WordCount line's time goes on the map side, and the rate that caps.

Run from the repository root::

    python -m benchmarks.record_cost            # 20,000 lines, 25 repetitions per step: ~30 s

Contract: in this process (no Spark), the map side of the per-record WordCount of
:mod:`benchmarks.workloads` runs on one partition's lines from the benchmark's generator, in growing
prefixes of the pipeline a map task runs, each prefix streamed to the end without keeping its output:

1. ``generate``: :func:`dstreams.nodes.generator.text_records` alone;
2. ``+ flatMap(word_pairs)``: the user's function through :func:`dstreams.records.flat_map_records`;
3. ``+ map-side combine``: the engine's per-batch reduce by key (:func:`dstreams.spark.partitioned.combiner`,
   as ``pre_reduce`` runs it, with ``operator.add``);
4. ``+ shuffle bucketing``: the combined pairs bucketed and pickled per target partition
   (:func:`dstreams.spark.jvm._bucket_pairs`, 2 partitions);

and, next to them, step 3 with the combine the engine had before issue 16's fold
(:func:`benchmarks.combine_cost.before_add`). The repetitions run the steps round-robin.

Each figure is microseconds per line, the low quartile of the repetitions (the machine is shared: the
low quartile is the cost without other processes' interference). The difference between two steps is
that step's own cost. From the whole map side and a fixed cost per batch, it prints the highest rate two
cores can process in a 500 ms batch (``--fixed-ms``, what a tiny windowed batch costs: see
``benchmarks/README.md``), an upper bound for the 1 s latency target. Writes
``benchmarks/results/record_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "record_cost.json"
#: The combine before issue 16's fold, measured next to the steps (not one of them).
BEFORE = "(before: + map-side combine with dict.get + operator.add call)"
CORES = 2
INTERVAL_MS = 500.0


def measure(lines: int, repeat: int) -> dict[str, Any]:
    os.environ.setdefault("PYTHONHASHSEED", "0")  # portable_hash refuses to run without it
    from pyspark.rdd import portable_hash
    from pyspark.serializers import CPickleSerializer

    from dstreams.nodes.generator import text_records
    from dstreams.records import flat_map_records
    from dstreams.spark.jvm import _bucket_pairs
    from dstreams.spark.partitioned import combiner

    from .combine_cost import before_add
    from .workloads import SEED, word_pairs

    flat = flat_map_records(word_pairs)
    combine = combiner(operator.add, "record_cost")
    bucket = _bucket_pairs(CORES, portable_hash, CPickleSerializer().dumps)

    def drain(it: Iterable[Any]) -> None:
        for _ in it:
            pass

    steps: dict[str, Callable[[], None]] = {
        "generate": lambda: drain(text_records(SEED, 0, 0, lines)),
        "+ flatMap(word_pairs)": lambda: drain(flat(0, text_records(SEED, 0, 0, lines))),
        "+ map-side combine": lambda: drain(combine(flat(0, text_records(SEED, 0, 0, lines)))),
        "+ shuffle bucketing": lambda: drain(bucket(0, combine(flat(0, text_records(SEED, 0, 0, lines))))),
        # Not a step: the map-side combine as it was before issue 16's fold, for a side-by-side figure.
        BEFORE: lambda: drain(before_add(flat(0, text_records(SEED, 0, 0, lines)))),
    }
    out: dict[str, Any] = {}
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeat):  # round-robin: every step shares the machine's load alike
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            runs[name].append(time.perf_counter() - t0)
    for name, times in runs.items():
        times.sort()
        out[name] = {"us_per_line_q1": times[len(times) // 4] / lines * 1e6,
                     "us_per_line_median": times[len(times) // 2] / lines * 1e6}
    pairs = sum(1 for _ in flat(0, text_records(SEED, 0, 0, 1000))) / 1000
    return {"steps": out, "pairs_per_line": pairs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.record_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=25)
    ap.add_argument("--fixed-ms", type=float, default=160.0,
                    help="fixed cost of one windowed batch (ms) for the rate bound")
    args = ap.parse_args(argv)
    res = measure(args.lines, args.repeat)
    prev = 0.0
    load = os.getloadavg()[0]
    print(f"{'step':28s} {'us/line (q1)':>13s} {'own us/line':>12s}  (median)   load average {load:.1f}")
    flat_q1 = 0.0
    for name, r in res["steps"].items():
        q1 = r["us_per_line_q1"]
        if name == BEFORE:
            continue
        if name == "+ flatMap(word_pairs)":
            flat_q1 = q1
        print(f"{name:28s} {q1:13.2f} {q1 - prev:12.2f}  ({r['us_per_line_median']:.2f})")
        prev = q1
    whole = prev
    before = res["steps"][BEFORE]["us_per_line_q1"]
    now = res["steps"]["+ map-side combine"]["us_per_line_q1"]
    print(f"map-side combine before issue 16's fold: {before - flat_q1:.2f} us/line "
          f"(now {now - flat_q1:.2f}: {(now - flat_q1) / (before - flat_q1):.2f}x)")
    budget_ms = INTERVAL_MS - args.fixed_ms
    bound = budget_ms * 1e3 * CORES / whole / (INTERVAL_MS / 1000.0) if whole > 0 else float("inf")
    print(f"{res['pairs_per_line']:.1f} (word, 1) pairs per line; whole map side {whole:.2f} us/line")
    print(f"bound at 500 ms batches with {args.fixed_ms:.0f} ms fixed cost per batch on {CORES} cores: "
          f"{bound:,.0f} lines/s (map side only; the merge stage and the driver come on top)")
    command = "python -m benchmarks.record_cost " + " ".join(sys.argv[1:] if argv is None else argv)
    doc = {"benchmark": "record_cost", "command": command.strip(),
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
           "lines": args.lines, "repeat": args.repeat, "fixed_ms": args.fixed_ms,
           "map_side_us_per_line": whole, "rate_bound_lines_per_s": bound, **res}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
