"""``python -m benchmarks``: the paper's workloads side by side with the peers, the per-batch floor, the table.

Commands (run from the repository root)::

    python -m benchmarks run --quick          # a few minutes: 1 s target, short trials, few rates
    python -m benchmarks run                  # full method: 1 s and 2 s targets, 20 measured batches
    python -m benchmarks run --quick --user-context   # dstreams and pyspark.streaming on SparkContexts built
                                              # as a pyspark.streaming script builds them
    python -m benchmarks floor                # per-batch floor and driver overhead (dstreams vs pyspark.streaming)
    python -m benchmarks table                # regenerate the table in benchmarks/README.md from the JSON
    python -m benchmarks catchup [--quick]    # time to steady state after a store outage and a driver kill
    python -m benchmarks redis [--quick]      # Grep and WordCount from Redis Streams next to the generator source
    python -m benchmarks chaos --seed N --minutes M   # randomized fault schedule, checked batch by batch
    python -m benchmarks state [--quick]      # updateStateByKey against the keys of state (issue 23)
    python -m benchmarks kafka                # Kafka -> Grep / WordCount -> Kafka, next to Structured Streaming, Quix

``run`` starts one subprocess per (engine, workload) (each with its own SparkContext, the same tuned
conf for every engine; with ``--user-context`` each engine runs as its variant of
``engines.USER_CONTEXT_VARIANTS`` instead, on a plain ``SparkContext("local[2]", app)``), writes
``benchmarks/results/<workload>.json`` (every trial with its per-batch
samples), PNG plots when matplotlib is installed, and regenerates ``benchmarks/README.md``'s table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .engines import ENGINES, USER_CONTEXT_VARIANTS
from .run import MARKER, child_main
from .workloads import WORKLOADS

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"


def _machine() -> dict[str, object]:
    import platform

    import pyspark

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_gb": mem_gb, "python": platform.python_version(),
            "pyspark": pyspark.__version__, "os": platform.platform(terse=True),
            "load_average_at_start": list(os.getloadavg())}


def _run_child(engine: str, workload: str, targets: list[float], mode: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks", "--child", engine, workload, mode, *[str(t) for t in targets]]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT.parent, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"engine": engine, "workload": workload, "failed": f"timed out after {timeout:.0f} s", "searches": []}
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            doc = json.loads(line[len(MARKER):])
            doc["wall_s"] = round(time.monotonic() - t0, 1)
            return doc
    return {"engine": engine, "workload": workload, "failed": f"child exited {proc.returncode}", "searches": []}


def _merge(old: dict, new: dict) -> dict:
    """``new`` plus every search of ``old`` that ``new`` did not repeat (``--merge``).

    A search is repeated when ``new`` ran its engine at its latency target: searches for other targets,
    and every search of an engine ``new`` did not run (a run of a subset of the engines), are kept. Each
    search keeps the command and start time of the run that made it, so a table mixing runs says so.
    """
    for doc in (old, new):
        for run in doc["runs"]:
            for search in run.get("searches", []):
                search.setdefault("command", doc["command"])
                search.setdefault("started", doc["started"])
    targets = sorted(set(old["targets_ms"]) | set(new["targets_ms"]))
    runs = {r["engine"]: r for r in new["runs"]}
    for run in old["runs"]:
        rerun = run["engine"] in runs
        kept = [s for s in run.get("searches", []) if not rerun or s["target_ms"] not in new["targets_ms"]]
        if not kept:
            continue
        if rerun:
            runs[run["engine"]]["searches"] = sorted(kept + runs[run["engine"]]["searches"],
                                                    key=lambda s: s["target_ms"])
        else:
            runs[run["engine"]] = {**run, "searches": kept}
    commands = [c for doc in (old, new) for c in doc["command"].split(" and ") if c]
    return {**new, "command": " and ".join(dict.fromkeys(commands)), "targets_ms": targets,
            "runs": list(runs.values())}


def engines_to_run(asked: list[str] | None, user_context: bool) -> list[str]:
    """The engines ``run`` measures: those asked for (default: all); with ``user_context``, each one's
    variant on a user-made SparkContext (:data:`USER_CONTEXT_VARIANTS`; default: those variants)."""
    if not user_context:
        return list(asked or ENGINES)
    return list(dict.fromkeys(USER_CONTEXT_VARIANTS.get(e, e) for e in (asked or USER_CONTEXT_VARIANTS)))


def cmd_run(args: argparse.Namespace) -> int:
    from . import report

    targets = args.targets or ([1000.0] if args.quick else [1000.0, 2000.0])
    args.engines = engines_to_run(args.engines, args.user_context)
    mode = "quick" if args.quick else "full"
    machine = _machine()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    command = "python -m benchmarks " + " ".join(sys.argv[1:] if args.argv is None else args.argv)
    for workload in args.workloads:
        runs = []
        for engine in args.engines:
            print(f"== {workload} on {engine}", flush=True)
            runs.append(_run_child(engine, workload, targets, mode, args.timeout))
        doc = {"benchmark": workload, "command": command, "mode": mode, "started": started,
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine, "targets_ms": targets,
               "runs": runs}
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"{workload}.json"
        if args.merge and out.exists():
            doc = _merge(json.loads(out.read_text()), doc)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, out)
        print(report.summary_lines(doc), flush=True)
        print(f"wrote {out}")
        report.plot(doc, RESULTS / f"{workload}.png")
    report.write_readme()
    return 0


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "--child":
        engine, workload, mode, *targets = raw[1:]
        return child_main(engine, workload, [float(t) for t in targets], mode)
    if raw and raw[0] == "catchup":  # its own options: python -m benchmarks catchup --help
        from .catchup import main as catchup_main

        return catchup_main(raw[1:])
    if raw and raw[0] == "chaos":  # its own options: python -m benchmarks chaos --help
        from .chaos import main as chaos_main

        return chaos_main(raw[1:])
    if raw and raw[0] == "state":  # its own options: python -m benchmarks state --help
        from .state import main as state_main

        return state_main(raw[1:])
    if raw and raw[0] == "kafka":  # its own options: python -m benchmarks kafka --help
        from .kafka import main as kafka_main

        return kafka_main(raw[1:])
    if raw and raw[0] == "redis":  # its own options: python -m benchmarks redis --help
        from .redis_source import main as redis_main

        return redis_main(raw[1:])
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="rate search for each workload and engine")
    r.add_argument("--quick", action="store_true", help="short trials, 1 s target only (a few minutes)")
    r.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    r.add_argument("--engines", nargs="+", choices=list(ENGINES), help="default: every engine")
    r.add_argument("--user-context", action="store_true",
                   help="build each SparkContext as a pyspark.streaming script does (SparkContext(master, app), "
                        "then StreamingContext(sc, n)): runs dstreams-user and pyspark.streaming-defaults, or "
                        "the user-context variant of each engine given with --engines")
    r.add_argument("--targets", nargs="+", type=float, help="latency targets in ms (interval = target / 2)")
    r.add_argument("--timeout", type=float, default=1800.0, help="seconds per (engine, workload) subprocess")
    r.add_argument("--merge", action="store_true",
                   help="keep the existing results for the latency targets this run does not measure")
    f = sub.add_parser("floor", help="per-batch floor and driver-side overhead")
    f.add_argument("--quick", action="store_true")
    sub.add_parser("table", help="regenerate benchmarks/README.md's table from benchmarks/results/*.json")
    sub.add_parser("catchup", help="time to steady state after a store outage and a driver kill "
                                   "(python -m benchmarks catchup --help)")
    sub.add_parser("chaos", help="a seeded schedule of driver kills, stops, store and Redis outages, executor "
                                 "kills and failing user functions; outputs checked against a fault-free run "
                                 "(python -m benchmarks chaos --help)")
    sub.add_parser("state", help="updateStateByKey at 10K-30M keys of state, next to pyspark.streaming and "
                                 "Structured Streaming (python -m benchmarks state --help)")
    sub.add_parser("redis", help="Grep and windowed WordCount read from Redis Streams, next to the generator "
                                 "source (python -m benchmarks redis --help)")
    sub.add_parser("kafka", help="Kafka -> Grep / windowed WordCount -> Kafka: dstreams' exactly-once and "
                                 "at-least-once sinks next to Structured Streaming and Quix Streams "
                                 "(python -m benchmarks kafka --help)")
    args = p.parse_args(raw)
    args.argv = raw
    if args.cmd == "run":
        return cmd_run(args)
    if args.cmd == "floor":
        from .floor import main as floor_main

        return floor_main(quick=args.quick, command="python -m benchmarks " + " ".join(raw))
    from . import report

    report.write_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
