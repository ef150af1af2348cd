"""What one batch costs the driver and the checkpoint store as the cluster grows (issue 42, item 7).

Run from the repository root::

    python -m benchmarks.scaling                       # 8, 64, 512, 2048 partitions x 1 stream; 1, 5, 20 streams x 8
    python -m benchmarks.scaling --quick               # 8 and 64 partitions, 1 and 5 streams

Contract: one process, one SparkContext (``tuned_conf``, ``local[2]``, the executor state store with its changelog
on, checkpoints in a local folder). Each configuration ``(partitions P, streams S)`` runs ``S`` streams, each a
generator source of ``P`` partitions with ``--records`` tiny records per partition and batch, a
``runningReduce`` into ``P`` state partitions and one output reading the batch's changes, on a manual clock, one
batch at a time (the next once the previous completed), with a state checkpoint every ``--checkpoint-every``
batches. The data is tiny on purpose: what is measured is what a batch costs the driver and the store, which
grows with the partitions and streams it schedules, not with records. Per configuration, over the batches between
two checkpoints (after a warm-up) and over the checkpoint batches:

* ``generation_ms``: the engine building the batch's RDDs and jobs (``BatchInfo.generation_ms``), median;
* ``engine_ms``: the engine's driver time per batch outside the output's Spark jobs (building, clean-up, metadata
  log), median;
* ``py4j_calls``: round trips to the JVM made while building a batch (counted on the generator thread), median;
* ``processing_ms``: the whole batch (its tasks run on 2 cores: this grows with ``P x S`` here, and would not on
  a cluster whose cores grow with the partitions);
* ``objects_per_batch``: files created in the checkpoint folder per batch, on average over whole checkpoint
  cycles (a checkpoint's files are written after its batch completes, so they are counted over the cycle, not
  per batch), split into metadata log, checkpoint data and state changelog.

Then, from the objects per batch, the PUT requests per second and their cost per day on S3 at 1 s batches
(``--put-price`` dollars per 1,000 PUTs, default S3 Standard's 0.005). Prints a table and writes
``benchmarks/results/scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .generation import Py4JCounter

RESULTS = Path(__file__).resolve().parent / "results" / "scaling.json"
INTERVAL_MS = 1000
FULL = [(8, 1), (64, 1), (512, 1), (2048, 1), (8, 5), (8, 20)]
QUICK = [(8, 1), (64, 1), (8, 5)]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _kind(name: str) -> str:
    if name.startswith("changelogs/"):
        return "changelog"
    if name.startswith("meta/"):
        return "metadata"
    return "checkpoint"


def _split(names: set[str]) -> dict[str, int]:
    out = {"metadata": 0, "checkpoint": 0, "changelog": 0}
    for n in names:
        out[_kind(n)] += 1
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _count_changes(rdd: Any) -> None:
    rdd.count()


def measure(sc: Any, partitions: int, streams: int, records: int, batches: int, every: int) -> dict[str, Any]:
    """One configuration (module docstring)."""
    from dstreams import ManualClock, StreamingContext

    folder = Path(tempfile.mkdtemp(prefix="dstreams-scaling-"))
    clock = ManualClock()
    ssc = StreamingContext(sc, INTERVAL_MS / 1000.0, clock=clock)
    ssc.checkpoint(str(folder / "ckpt"))
    for s in range(streams):
        lines = ssc.generatorStream(records, partitions, seed=s)
        state = lines.map(lambda line: (hash(line) % 1000, 1)).runningReduce(lambda a, b: a + b, partitions)
        state.checkpoint(every * INTERVAL_MS / 1000.0)
        state.changes().foreachRDD(_count_changes)
    root = folder / "ckpt"
    counter = Py4JCounter(sc, "generator", False)
    calls: dict[int, int] = {}
    created: dict[int, set[str]] = {}
    wall: dict[int, float] = {}
    ssc.start()
    try:
        seen = _files(root)
        for k in range(1, batches + 1):
            before = counter.calls
            started = time.perf_counter()
            clock.set_time(k * INTERVAL_MS)
            ssc.awaitBatch(k * INTERVAL_MS, 600)
            wall[k] = time.perf_counter() - started
            calls[k] = counter.calls - before
            time.sleep(0.2)  # the checkpoint of a batch is written after it completes
            now = _files(root)
            created[k] = now - seen
            seen = now
    finally:
        counter.close()
        ssc.stop(stopSparkContext=False)
        shutil.rmtree(folder, ignore_errors=True)
    infos = {i.batch_time_ms // INTERVAL_MS: i for i in ssc.batchInfos()}
    # Whole checkpoint cycles after the first checkpoint (batch ``every``), shifted by one batch: a checkpoint's
    # files land while the batch after it runs.
    first = every + 2
    cycles = max(1, (batches - first + 1) // every)
    window = [k for k in range(first, first + cycles * every) if k in created]
    plain = [k for k in window if k % every != 0 and k in infos]

    def own(k: int) -> float:
        i = infos[k]
        in_outputs = sum(op.end_time_ms - op.start_time_ms for op in i.output_operations.values()
                         if op.start_time_ms is not None and op.end_time_ms is not None)
        return float(i.generation_ms or 0.0) + float((i.processing_delay_ms or 0) - in_outputs) + \
            float(i.cleanup_ms or 0.0)

    totals = _split(set().union(*(created[k] for k in window)))
    per_batch = {kind: n / len(window) for kind, n in totals.items()}
    return {
        "partitions": partitions,
        "streams": streams,
        "batches_measured": len(plain),
        "cycle_batches": len(window),
        "generation_ms_p50": _median([float(infos[k].generation_ms or 0.0) for k in plain]),
        "engine_ms_p50": _median([own(k) for k in plain]),
        "py4j_calls_p50": _median([float(calls[k]) for k in plain]),
        "processing_ms_p50": _median([float(infos[k].processing_delay_ms or 0) for k in plain]),
        "wall_s_p50": _median([wall[k] for k in plain]),
        "objects_per_batch": per_batch,
    }


def cost(row: dict[str, Any], put_price: float) -> dict[str, float]:
    """PUTs per second at 1 s batches and their cost per day."""
    puts_per_s = sum(row["objects_per_batch"].values())
    return {"puts_per_s": puts_per_s, "dollars_per_day": puts_per_s * 86400 / 1000 * put_price}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 and 64 partitions, 1 and 5 streams")
    parser.add_argument("--configs", help="P:S,P:S,... (default: the full or quick set)")
    parser.add_argument("--records", type=int, default=2, help="records per partition and batch")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="batches between state checkpoints")
    parser.add_argument("--batches", type=int, default=17, help="batches per configuration (warm-up included)")
    parser.add_argument("--put-price", type=float, default=0.005, help="dollars per 1,000 PUT requests")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",")] if args.configs else \
        (QUICK if args.quick else FULL)

    from dstreams.spark.sparkconf import create_spark_context

    local_dir = tempfile.mkdtemp(prefix="dstreams-scaling-stores-")
    sc = create_spark_context("local[2]", "dstreams-scaling-benchmark", {
        "spark.dstreams.state.store": "executor", "spark.dstreams.state.changelog": "on",
        "spark.dstreams.state.localDir": local_dir, "spark.ui.enabled": "false"})
    rows = []
    try:
        print(f"{'P':>5} {'S':>3} {'build ms':>9} {'engine ms':>10} {'py4j':>6} {'batch ms':>9} "
              f"{'objects/batch (meta, ckpt, changelog)':>40} {'PUT/s':>8} {'$/day':>8}", flush=True)
        for p, s in configs:
            row = measure(sc, p, s, args.records, args.batches, args.checkpoint_every)
            row.update(cost(row, args.put_price))
            rows.append(row)
            ob = row["objects_per_batch"]
            print(f"{p:5d} {s:3d} {row['generation_ms_p50']:9.1f} {row['engine_ms_p50']:10.1f} "
                  f"{row['py4j_calls_p50']:6.0f} {row['processing_ms_p50']:9.0f} "
                  f"{sum(ob.values()):14.1f} ({ob['metadata']:.1f}, {ob['checkpoint']:.1f}, {ob['changelog']:.1f})"
                  f"{'':8s} {row['puts_per_s']:8.1f} {row['dollars_per_day']:8.2f}", flush=True)
    finally:
        sc.stop()
        shutil.rmtree(local_dir, ignore_errors=True)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({
            "command": "python -m benchmarks.scaling" + (" --quick" if args.quick else ""),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "interval_ms": INTERVAL_MS, "records_per_partition": args.records,
            "checkpoint_every": args.checkpoint_every, "put_price_per_1000": args.put_price,
            "rows": rows,
        }, indent=2, sort_keys=True))
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
