"""What the status server and its metrics cost the driver per batch (issue 15: less than 1 ms).

Contract: in one process (one SparkContext, ``tuned_conf``, ``local[2]``), the windowed WordCount on a tiny
generator stream (``--records`` lines per partition, 2 partitions) runs at 500 ms batches under a manual
clock, one batch at a time (the next batch once the previous completed), in three settings, interleaved
round after round (``--rounds``) so that drift in the machine's load hits them alike:

* ``off``: ``spark.dstreams.ui.enabled=false`` (no status server, no listener of its own);
* ``on``: the status server running (its listener on the context's bus), nobody looking;
* ``on+page``: the same with a client polling what the page polls (``/api/status`` and ``/api/batches?after=``
  every 2 s of wall time) and ``/metrics`` every 5 s, as an open page and a Prometheus scraper would.

Per run it records the driver process's CPU time (``time.process_time``: every Python thread of the driver,
the JVM excluded) and wall time per batch, after ``--warmup`` batches. Prints the medians per setting and the
differences to ``off``, and writes ``benchmarks/results/status_cost.json``.
Run: ``python -m benchmarks.status_cost [--rounds 5] [--batches 60]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import workloads

RESULTS = Path(__file__).resolve().parent / "results" / "status_cost.json"
INTERVAL_MS = 500
SETTINGS = ("off", "on", "on+page")


class PagePoller(threading.Thread):
    """Polls the status server as an open page (every 2 s) and a Prometheus scraper (every 5 s) do."""

    def __init__(self, url: str) -> None:
        super().__init__(name="status-poller", daemon=True)
        self.url = url.rstrip("/")
        self.stop_event = threading.Event()
        self.requests = 0
        self.errors = 0

    def _get(self, path: str) -> None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                response.read()
            self.requests += 1
        except OSError:
            self.errors += 1

    def run(self) -> None:
        after, last_scrape = 0, 0.0
        while not self.stop_event.wait(2.0):
            self._get("/api/status")
            self._get(f"/api/batches?after={after}")
            after = int(time.time() * 1000) - 10_000
            if time.monotonic() - last_scrape >= 5.0:
                self._get("/metrics")
                last_scrape = time.monotonic()


def run_once(sc: Any, setting: str, batches: int, warmup: int, records: int) -> dict[str, Any]:
    """One run of the WordCount in ``setting``; CPU and wall time per batch after the warm-up."""
    from dstreams import ManualClock, StreamingContext

    os.environ["DSTREAMS_UI_ENABLED"] = "false" if setting == "off" else "true"
    os.environ["DSTREAMS_UI_PORT"] = "0"
    os.environ["DSTREAMS_UI_SHOW_PROGRESS"] = "false"
    workload = workloads.WORKLOADS["wordcount"]
    clock = ManualClock()
    ssc = StreamingContext(sc, INTERVAL_MS / 1000.0, clock=clock)
    lines = ssc.generatorStream(records, 2, seed=workloads.SEED)
    workload.build(ssc, lines, INTERVAL_MS / 1000.0, lambda _: None)
    poller: PagePoller | None = None
    ssc.start()
    try:
        if setting == "on+page":
            assert ssc.uiWebUrl is not None, "the status server did not start"
            poller = PagePoller(ssc.uiWebUrl)
            poller.start()
        cpu0 = wall0 = 0.0
        for k in range(1, batches + 1):
            if k == warmup + 1:
                cpu0, wall0 = time.process_time(), time.perf_counter()
            clock.set_time(k * INTERVAL_MS)
            ssc.awaitBatch(k * INTERVAL_MS, 120)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        if poller is not None:
            poller.stop_event.set()
            poller.join(15)
        ssc.stop(stopSparkContext=False)
    measured = batches - warmup
    return {"setting": setting, "batches": measured, "cpu_ms_per_batch": cpu * 1000 / measured,
            "wall_ms_per_batch": wall * 1000 / measured,
            "page_requests": poller.requests if poller else 0, "page_errors": poller.errors if poller else 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=60, help="batches per run (warm-up included)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--records", type=int, default=100, help="lines per partition per batch")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.batches <= args.warmup:
        parser.error("--batches must be larger than --warmup")

    from dstreams.spark.sparkconf import create_spark_context

    sc = create_spark_context("local[2]", "dstreams-status-cost")
    runs: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for setting in SETTINGS:
                row = run_once(sc, setting, args.batches, args.warmup, args.records)
                row["round"] = r
                runs.append(row)
                print(f"round {r} {setting:8s} driver CPU {row['cpu_ms_per_batch']:6.2f} ms/batch, "
                      f"wall {row['wall_ms_per_batch']:6.1f} ms/batch", flush=True)
    finally:
        sc.stop()
    summary: dict[str, Any] = {}
    for setting in SETTINGS:
        rows = [x for x in runs if x["setting"] == setting]
        summary[setting] = {"cpu_ms_per_batch_p50": statistics.median(x["cpu_ms_per_batch"] for x in rows),
                            "wall_ms_per_batch_p50": statistics.median(x["wall_ms_per_batch"] for x in rows)}
    # The cost per round (each setting against the off run of the same round), then its median.
    for setting in SETTINGS[1:]:
        deltas = [on["cpu_ms_per_batch"] - off["cpu_ms_per_batch"]
                  for on, off in zip([x for x in runs if x["setting"] == setting],
                                     [x for x in runs if x["setting"] == "off"], strict=True)]
        summary[setting]["cpu_ms_per_batch_over_off_p50"] = statistics.median(deltas)
        summary[setting]["cpu_ms_per_batch_over_off_all"] = deltas
    print()
    for setting in SETTINGS:
        s = summary[setting]
        extra = (f", over off: {s['cpu_ms_per_batch_over_off_p50']:+.2f} ms (per round: "
                 + ", ".join(f"{d:+.2f}" for d in s["cpu_ms_per_batch_over_off_all"]) + ")") if setting != "off" else ""
        print(f"{setting:8s} driver CPU median {s['cpu_ms_per_batch_p50']:6.2f} ms/batch, wall "
              f"{s['wall_ms_per_batch_p50']:6.1f} ms/batch{extra}")
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        load = os.getloadavg()
        RESULTS.write_text(json.dumps({
            "command": "python -m benchmarks.status_cost",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average_at_end": [round(x, 2) for x in load]},
            "interval_ms": INTERVAL_MS, "records_per_partition": args.records, "rounds": args.rounds,
            "batches": args.batches, "warmup": args.warmup, "summary": summary, "runs": runs,
        }, indent=2, sort_keys=True))
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
