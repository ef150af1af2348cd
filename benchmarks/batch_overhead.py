"""Per-batch overhead of a trivial PySpark job: Spark defaults vs ``dstreams.spark.sparkconf.tuned_conf``.

Run from the repository root::

    python3 -m benchmarks.batch_overhead                      # local[2], 60 timed jobs after 10 warm-up
    python3 -m benchmarks.batch_overhead --master 'local-cluster[2,1,1024]' --rounds 2

Each configuration runs in its own subprocess with its own SparkContext, times
``sc.parallelize(range(2), 2).map(lambda x: x).collect()`` (two Python tasks) ``--iterations`` times after
``--warmup`` untimed runs, and also times a JVM-only two-task job (``sc._jsc.sc().range(0, 2, 1, 2).count()``,
no Python worker involved) as a floor. With ``--rounds N`` the configurations alternate (ABBA...) so that
machine drift hits both alike. Prints median/p10/p90 per configuration and the defaults/tuned ratio of the
medians; writes everything (raw samples included) to ``benchmarks/results/batch_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "batch_overhead.json"
_MARKER = "BATCH_OVERHEAD_RESULT "


def _conf_for(config: str, master: str, also: dict[str, str]):
    from pyspark import SparkConf

    if config == "defaults":
        # Spark's defaults; only the worker interpreter is pinned (as tuned_conf does): same Python in both.
        return (
            SparkConf()
            .setMaster(master)
            .setAppName("batch_overhead-defaults")
            .set("spark.pyspark.python", sys.executable)
        )
    from dstreams.spark.sparkconf import tuned_conf

    conf = tuned_conf(master, f"batch_overhead-{config}")
    if config == "tuned+":
        for k, v in also.items():
            conf.set(k, v)
    return conf


def _time_ms(fn, iterations: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def _child(config: str, master: str, iterations: int, warmup: int, also: dict[str, str]) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkContext

    conf = _conf_for(config, master, also)
    t0 = time.perf_counter()
    sc = SparkContext(conf=conf)
    startup_ms = (time.perf_counter() - t0) * 1000.0
    sc.setLogLevel("ERROR")
    try:

        def python_job():
            assert sc.parallelize(range(2), 2).map(lambda x: x).collect() == [0, 1]

        jsc = sc._jsc.sc()

        def jvm_job():
            assert jsc.range(0, 2, 1, 2).count() == 2

        python_ms = _time_ms(python_job, iterations, warmup)
        jvm_ms = _time_ms(jvm_job, iterations, warmup)
        result = {
            "config": config,
            "conf": dict(sorted(sc.getConf().getAll())),
            "startup_ms": startup_ms,
            "python_job_ms": python_ms,
            "jvm_job_ms": jvm_ms,
        }
    finally:
        sc.stop()
    print(_MARKER + json.dumps(result), flush=True)


def _run_child(config: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable, "-m", "benchmarks.batch_overhead", "--child", config,
        "--master", args.master, "--iterations", str(args.iterations), "--warmup", str(args.warmup),
    ]  # fmt: skip
    for kv in args.also:
        cmd += ["--also", kv]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(_MARKER):
            return json.loads(line[len(_MARKER) :])
    sys.stderr.write(proc.stderr[-4000:])
    raise RuntimeError(f"benchmark child {config!r} failed (exit {proc.returncode})")


def _stats(samples: list[float]) -> dict[str, float]:
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return {
        "median": statistics.median(samples),
        "p10": deciles[0],
        "p90": deciles[8],
        "min": min(samples),
        "n": len(samples),
    }


def _parse_also(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--also expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", default="local[2]", help="local[2] (default) or e.g. local-cluster[2,1,1024]")
    p.add_argument("--iterations", type=int, default=60, help="timed jobs per configuration and round")
    p.add_argument("--warmup", type=int, default=10, help="untimed jobs first")
    p.add_argument("--rounds", type=int, default=1, help="subprocesses per configuration, alternating order")
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="adds a third configuration 'tuned+' = tuned_conf plus these settings (to measure a candidate)",
    )
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per subprocess")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    also = _parse_also(args.also)

    if args.child:
        _child(args.child, args.master, args.iterations, args.warmup, also)
        return 0

    configs = ["defaults", "tuned"] + (["tuned+"] if also else [])
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for config in order:
            runs[config].append(_run_child(config, args))

    summary: dict[str, dict] = {}
    print(f"master={args.master} iterations={args.iterations}x{args.rounds} warmup={args.warmup}")
    print(f"{'config':<10} {'job':<7} {'median':>8} {'p10':>8} {'p90':>8}  (ms)")
    for config in configs:
        py = [x for run in runs[config] for x in run["python_job_ms"]]
        jvm = [x for run in runs[config] for x in run["jvm_job_ms"]]
        summary[config] = {
            "conf": runs[config][0]["conf"],
            "startup_ms": [run["startup_ms"] for run in runs[config]],
            "python_job_ms": _stats(py),
            "jvm_job_ms": _stats(jvm),
            "samples": {"python_job_ms": py, "jvm_job_ms": jvm},
        }
        for job in ("python", "jvm"):
            s = summary[config][f"{job}_job_ms"]
            print(f"{config:<10} {job:<7} {s['median']:8.1f} {s['p10']:8.1f} {s['p90']:8.1f}")
    ratio = summary["defaults"]["python_job_ms"]["median"] / summary["tuned"]["python_job_ms"]["median"]
    print(f"python job median ratio defaults/tuned: {ratio:.2f}x")

    import pyspark

    cli_args = sys.argv[1:] if argv is None else argv
    doc = {
        "benchmark": "batch_overhead",
        "command": " ".join(["python3 -m benchmarks.batch_overhead", *cli_args]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "master": args.master,
        "iterations": args.iterations,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "also": also,
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "cpus": os.cpu_count(),
        "ratio_median_defaults_over_tuned": ratio,
        "configs": summary,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
