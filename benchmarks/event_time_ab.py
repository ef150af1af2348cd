"""Event-time windows, this checkout against an older one, interleaved on the same machine in one run.

Run from the repository root::

    git worktree add /tmp/dstreams-old <commit>          # the code to compare with
    python -m benchmarks.event_time_ab --old /tmp/dstreams-old [--rounds 3] [--batches 40]

Contract: each round runs one child process per checkout, alternating (old, new, new, old, ...), so that the load
of a shared machine falls on both alike. A child runs ``benchmarks.event_time``'s dstreams pipeline
(``withEventTime`` + ``reduceByKeyAndEventWindow(add, 30 s, 1 s, invFunc=sub, emit="final")``) on a ManualClock:
``--batches`` batches of ``--rows`` rows, each batch generated when the previous one completed (no scheduling
delay: processing time only), on the configuration's data (``--data bench`` or ``late``), and reports the median
processing time of the batches after the window state filled. The older checkout is imported through a
``sitecustomize`` shim that maps the ``dstreams`` packages to its folders. Prints the per-round medians and the
ratio new / old of their medians, and writes ``benchmarks/results/event_time_ab.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "event_time_ab.json"
MARKER = "EVENT_TIME_AB "
SHIM = '''import importlib.abc, importlib.util, os, sys
ROOT = os.environ["DSTREAMS_AB_ROOT"]
MAP = {"dstreams": f"{ROOT}/dstreams", "dstreams.api": f"{ROOT}/api", "dstreams.recovery": f"{ROOT}/recovery"}
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        base = MAP.get(fullname)
        if base is None:
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.join(base, "__init__.py"),
                                                      submodule_search_locations=[base])
sys.meta_path.insert(0, _Finder())
'''


def child(rows: int, batches: int, data_name: str) -> int:
    """One measurement (module contract), in this process, with whatever ``dstreams`` imports as."""
    import dstreams
    from dstreams import ManualClock, StreamingContext
    from dstreams.spark.sparkconf import create_spark_context

    from .event_time import BENCH_DATA, LATE_DATA, T0_MS, dstreams_counts

    data = {"bench": BENCH_DATA, "late": LATE_DATA}[data_name]
    interval_ms, window_ms, slide_ms = 500, 30_000, 1_000
    sc = create_spark_context("local[2]", "bench-event-time-ab", {"spark.dstreams.ui.enabled": "false"})
    sc.setLogLevel("ERROR")
    parts = sc.defaultParallelism
    clock = ManualClock(T0_MS)
    ssc = StreamingContext(sc, interval_ms / 1000, clock=clock)
    dstreams_counts(ssc, rows // parts, parts, interval_ms, window_ms, slide_ms, T0_MS, data).foreachRDD(
        lambda rdd: rdd.count())
    ssc.start()
    processing = []
    try:
        for b in range(batches):
            clock.advance(interval_ms)
            info = ssc.awaitBatch(T0_MS + (b + 1) * interval_ms, 300.0)
            processing.append(info.processing_delay_ms)
    finally:
        ssc.stop(stopSparkContext=True)
    fill = (window_ms + data.lateness_ms + data.disorder_ms) // interval_ms
    measured = processing[fill:] or processing
    print(MARKER + json.dumps({"code": str(Path(dstreams.__file__).resolve().parent.parent),
                               "median_processing_ms": statistics.median(measured), "batches": len(measured),
                               "processing_ms": measured}), flush=True)
    return 0


def _run(root: str | None, args: argparse.Namespace, shim_dir: str) -> dict[str, Any]:
    env = dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    if root is not None:
        env["DSTREAMS_AB_ROOT"] = root
        env["PYTHONPATH"] = os.pathsep.join([shim_dir, str(ROOT.parent)])
    cmd = [sys.executable, "-m", "benchmarks.event_time_ab", "--child", str(args.rows), str(args.batches), args.data]
    proc = subprocess.run(cmd, cwd=ROOT.parent, env=env, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise RuntimeError(f"the child for {root or 'this checkout'} exited {proc.returncode} without a result")


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "--child":
        return child(int(raw[1]), int(raw[2]), raw[3])
    p = argparse.ArgumentParser(prog="python -m benchmarks.event_time_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="a checkout (git worktree) of the older code")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=100_000, help="rows per batch")
    p.add_argument("--batches", type=int, default=120, help="batches per child (the first ~70 fill the window)")
    p.add_argument("--data", choices=("bench", "late"), default="bench")
    p.add_argument("--timeout", type=float, default=1800.0)
    args = p.parse_args(raw)
    old = str(Path(args.old).resolve())
    with tempfile.TemporaryDirectory(prefix="dstreams-ab-shim-") as shim_dir:
        Path(shim_dir, "sitecustomize.py").write_text(SHIM)
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        order = [("old", "new") if r % 2 == 0 else ("new", "old") for r in range(args.rounds)]
        for r, pair in enumerate(order):
            for which in pair:
                res = _run(old if which == "old" else None, args, shim_dir)
                runs[which].append(res)
                print(f"round {r + 1} {which}: median processing {res['median_processing_ms']:.0f} ms "
                      f"({res['code']}), load {os.getloadavg()[0]:.1f}", flush=True)
    med = {k: statistics.median(r["median_processing_ms"] for r in v) for k, v in runs.items()}
    ratio = med["new"] / med["old"] if med["old"] else float("nan")
    print(f"median of the rounds' medians: old {med['old']:.0f} ms, new {med['new']:.0f} ms: new / old = {ratio:.2f}")
    doc = {"benchmark": "event_time_ab", "command": "python -m benchmarks.event_time_ab " + " ".join(raw),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows_per_batch": args.rows, "data": args.data,
           "old": old, "runs": runs, "median_ms": med, "ratio_new_over_old": ratio,
           "load_average_at_end": list(os.getloadavg())}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
