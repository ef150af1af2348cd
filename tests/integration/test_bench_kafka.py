"""Smoke test of the Kafka benchmark's harness (``python -m benchmarks kafka``) on a very small configuration.

One engine (dstreams with the at-least-once sink), Grep, one fixed rate of 1,000 records/s for a few seconds, against
the project's broker: the harness must start and stop its producer, measurer and engine processes, delete its
topics, and write its JSON with the fields the README's table is made from. Whether the rate is held is not
checked: that is the benchmark's answer on a loaded machine, not the harness' correctness.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..kafka_support import admin

REPO = Path(__file__).resolve().parents[2]


def test_kafka_benchmark_harness_writes_its_results(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "kafka.json"
    cmd = [sys.executable, "-m", "benchmarks", "kafka", "--bootstrap", kafka_bootstrap, "--workloads", "grep",
           "--engines", "dstreams-alo", "--rates", "1000", "--warmup-s", "3", "--settle-s", "1", "--measure-s", "4",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "kafka" and doc["partitions"] == 2 and doc["record_bytes"] == 100
    assert {"target_ms", "measure_s", "settle_s", "steps"} <= set(doc["settings"])
    (row,) = doc["table"]
    assert row["workload"] == "grep" and row["engine"] == "dstreams-alo" and row["guarantee"] == "at-least-once"
    assert {"median_held_rate", "median_p50_ms", "median_p99_ms", "median_kept_up_rate", "held_rates"} <= set(row)
    (run,) = doc["runs"]
    assert "failed" not in run, run.get("failed")
    assert {"max_held_rate", "lowest_failing_rate", "at_best", "max_kept_up_rate", "start_s", "wall_s"} <= set(run)
    (step,) = run["steps"]
    assert step["rate"] == 1000 and step["achieved_rate"] > 500
    assert step["records_out"] > 0 and step["p50_ms"] is not None and step["p99_ms"] >= step["p50_ms"]
    assert isinstance(step["held"], bool) and isinstance(step["kept_up"], bool) and step["reason"]
    assert step["engine"]["batches"] > 0 and step["engine"]["median_processing_ms"] is not None
    # Every topic of the run is gone.
    assert set(run["deleted_topics"]) == set(run["topics"])
    assert not set(run["topics"]) & set(admin(kafka_bootstrap).list_topics(timeout=10).topics)
    assert "Highest input rate held" in proc.stdout
