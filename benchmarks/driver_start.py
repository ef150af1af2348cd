"""How long a dstreams driver takes from process start to its first completed batch, with and without the
driver JVM's class-data-sharing archive (``python -m dstreams.spark.jvm_cds``).

``python -m benchmarks.driver_start [--rounds 5]``: builds the archive if missing, then runs ``rounds``
pairs of fresh driver processes, alternating (archive off, archive on) so both see the same machine load.
Each driver: ``create_spark_context("local[2]")``, a ``StreamingContext`` with a 500 ms batch, a small
windowed word count, until the first batch completed. Prints the per-phase medians (context started,
first batch done) and their ratio; writes ``benchmarks/results/driver_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "driver_start.json"

DRIVER = """
import json, operator, time
t0 = time.monotonic()
from dstreams import StreamingContext
from dstreams.spark.sparkconf import create_spark_context
sc = create_spark_context("local[2]", "driver-start")
t1 = time.monotonic()
ssc = StreamingContext(sc, 0.5)
words = ssc.generatorStream(200, 2).flatMap(lambda line: [(w, 1) for w in line.split()])
words.reduceByKeyAndWindow(operator.add, operator.sub, 5, 0.5).foreachRDD(lambda rdd: rdd.count())
ssc.start()
first = ssc.startTime.ms + 500
ssc.awaitBatch(first, 120)
t2 = time.monotonic()
options = sc.getConf().get("spark.driver.extraJavaOptions") or ""
ssc.stop()
print("RESULT " + json.dumps({"context_s": t1 - t0, "first_batch_s": t2 - t0,
                              "archive": "SharedArchiveFile" in options}))
"""


def _one(sharing: str) -> dict[str, float]:
    env = dict(os.environ, DSTREAMS_CLASS_DATA_SHARING=sharing, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=300)
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the driver failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["process_s"] = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    from dstreams.spark import jvm_cds

    archive = jvm_cds.build()
    rows: dict[str, list[dict[str, float]]] = {"off": [], "auto": []}
    loads = []
    for i in range(args.rounds):
        for sharing in ("off", "auto"):
            loads.append(os.getloadavg()[0])
            r = _one(sharing)
            assert r["archive"] == (sharing == "auto"), r
            rows[sharing].append(r)
            print(f"round {i + 1} {sharing:>4}: context {r['context_s']:.2f} s, first batch {r['first_batch_s']:.2f} s",
                  flush=True)
    summary = {}
    for phase in ("context_s", "first_batch_s"):
        off = statistics.median(r[phase] for r in rows["off"])
        on = statistics.median(r[phase] for r in rows["auto"])
        summary[phase] = {"off": round(off, 3), "archive": round(on, 3), "ratio": round(on / off, 3)}
        print(f"{phase}: median {off:.2f} s without the archive, {on:.2f} s with it ({on / off:.2f}x)")
    load = (round(min(loads), 2), round(max(loads), 2))
    print(f"1-minute load average during the run: {load[0]}-{load[1]}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"archive": str(archive.name), "rounds": rows, "summary": summary,
                                   "load_average": load}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
