"""What the sink benchmarks (``redis_sink``, ``postgres_sink``) share: their options, the timing of one strategy
(a warm-up, then the median of ``--repeat`` writes of the same batch) and the results file."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any


def parse_args(prog: str, description: str, endpoint: str, default: str, argv: list[str] | None) -> argparse.Namespace:
    """The common options, plus ``--<endpoint>`` (the server) defaulting to ``default``."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument(f"--{endpoint}", default=default)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-save", action="store_true", help="print only, do not write the results file")
    return ap.parse_args(argv)


def time_strategy(name: str, records: int, repeat: int, write_once: Callable[[int], float], unit: str) -> dict:
    """Run ``write_once(rep)`` (returns the seconds its write took) 1 + ``repeat`` times; prints and returns the
    median of all but the first (a warm-up)."""
    times = [write_once(rep) for rep in range(repeat + 1)][1:]
    median = statistics.median(times)
    print(f"{name:50s} {median * 1000:8.1f} ms  {records / median:10,.0f} {unit}/s", flush=True)
    return {"median_s": round(median, 4), f"{unit}_per_s": round(records / median),
            "times_s": [round(t, 4) for t in times]}


def save(path: Path, benchmark: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Write the results with the run's settings and the machine's, unless ``--no-save``."""
    if args.no_save:
        return
    doc = {"benchmark": benchmark, "records": args.records, "partitions": args.partitions, "repeat": args.repeat,
           "cpus": os.cpu_count(), "python": platform.python_version(),
           "load_average_at_end": list(os.getloadavg()), "results": results}
    path.write_text(json.dumps(doc, indent=1) + "\n")
