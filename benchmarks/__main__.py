"""``python -m benchmarks``: the benchmarks a user runs, listed and run by name.

Run from the repository root::

    python -m benchmarks                      # the list below, by group, with what each writes
    python -m benchmarks <name> --help        # a benchmark's options
    python -m benchmarks <name> [options]     # run it; results under benchmarks/results/

The list (:data:`BENCHMARKS`) holds the paper's workloads (Grep, WordCount, TopK) side by side with
``pyspark.streaming`` and Structured Streaming, the other comparisons with peers (the per-batch floor, event
time, Kafka), state at scale, recovery, and the connectors. One-off studies (cost breakdowns of one step, A/B runs
against an older checkout) are not in it: those still cited by the documentation or used by a test stay runnable
as modules (``python -m benchmarks.record_cost``), listed in ``benchmarks/README.md`` ("Studies").

``run`` starts one subprocess per (engine, workload) (each with its own SparkContext, the same tuned
conf for every engine; with ``--user-context`` each engine runs as its variant of
``engines.USER_CONTEXT_VARIANTS`` instead, on a plain ``SparkContext("local[2]", app)``), writes
``benchmarks/results/<workload>.json`` (every trial with its per-batch
samples), PNG plots when matplotlib is installed, and regenerates ``benchmarks/README.md``'s table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the CLI: ``python -m benchmarks <name> [options]`` runs ``main(options)`` of
    ``benchmarks.<module>`` (None: a command of this module), which writes ``writes`` under ``benchmarks/results/``."""

    name: str
    group: str
    summary: str
    module: str | None
    writes: str


PEERS, STATE, RECOVERY, CONNECTORS, REPORT = (
    "The paper's workloads and the peers", "State", "Recovery", "Connectors", "Report")

#: Every benchmark ``python -m benchmarks`` lists and runs, by group (order kept in the listing).
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("run", PEERS, "Grep, WordCount and TopK (the paper's workloads): the highest rate each engine sustains "
              "under a latency target, dstreams next to pyspark.streaming and Structured Streaming", None,
              "grep.json, wordcount.json, topk.json (+ PNG plots); the README's table"),
    Benchmark("floor", PEERS, "the smallest batch interval that keeps up and the driver's overhead per batch, next "
              "to pyspark.streaming", None, "floor.json"),
    Benchmark("event-time", PEERS, "event-time windows next to Structured Streaming's withWatermark + window",
              "event_time", "event_time.json"),
    Benchmark("kafka", PEERS, "Kafka -> Grep / windowed WordCount -> Kafka, exactly-once and at-least-once, next to "
              "Structured Streaming and Quix Streams (needs the Kafka broker)", "kafka", "kafka.json"),
    Benchmark("state", STATE, "updateStateByKey at 10K-30M keys of state: the RDD state, the executor state store "
              "and auto, next to pyspark.streaming and Structured Streaming", "state", "state.json"),
    Benchmark("track-state", STATE, "track with timers at 100K-3M keys: the RDD state next to the executor state "
              "store", "track_state", "track_state.json"),
    Benchmark("state-restart", STATE, "a driver restart with millions of keys in the executor state store: the time "
              "back to steady state", "state_restart", "state_restart.json"),
    Benchmark("recovery", RECOVERY, "per-batch processing time around an executor loss, with a straggler, and "
              "around a host loss (a cluster on this machine)", "recovery", "recovery.json, recovery.png"),
    Benchmark("catchup", RECOVERY, "time to steady state after a store outage and after a driver kill", "catchup",
              "catchup.json"),
    Benchmark("chaos", RECOVERY, "a seeded schedule of driver kills, stops, store and Redis outages, executor kills "
              "and failing functions; every output checked against a fault-free run", "chaos",
              "chaos-<seed>-<minutes>m.json"),
    Benchmark("scaling", RECOVERY, "what one batch costs the driver and the checkpoint store as partitions and "
              "streams grow", "scaling", "scaling.json"),
    Benchmark("redis", CONNECTORS, "Grep and windowed WordCount read from Redis Streams, next to the generator "
              "source (needs Redis)", "redis_source", "redis_source.json"),
    Benchmark("redis-sink", CONNECTORS, "rows per second into a Redis stream: saveToRedisStream next to a "
              "hand-written foreachRDD (needs Redis)", "redis_sink", "redis_sink.json"),
    Benchmark("postgres-sink", CONNECTORS, "rows per second into a PostgreSQL table: saveToPostgres next to INSERT "
              "and a hand-written foreachRDD (needs PostgreSQL)", "postgres_sink", "postgres_sink.json"),
    Benchmark("table", REPORT, "regenerate benchmarks/README.md's results from benchmarks/results/*.json", None,
              "benchmarks/README.md"),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


def listing() -> str:
    """The text ``python -m benchmarks`` prints: every benchmark by group, with what it writes."""
    width = max(len(b.name) for b in BENCHMARKS)
    indent = " " * (width + 4)
    lines = ["python -m benchmarks <name> [options]   (run from the repository root; <name> --help: its options)"]
    for group in dict.fromkeys(b.group for b in BENCHMARKS):
        lines += ["", f"{group}:"]
        for b in (b for b in BENCHMARKS if b.group == group):
            lines += textwrap.wrap(b.summary, 110, initial_indent=f"  {b.name:<{width}}  ", subsequent_indent=indent)
            lines.append(f"{indent}-> {b.writes}")
    lines += ["", "Results go to benchmarks/results/; benchmarks/README.md has the method and the current figures."]
    return "\n".join(lines)


def _own_commands(raw: list[str]) -> int:
    """``run``, ``floor`` and ``table``: the commands this module implements."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help=BY_NAME["run"].summary)
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
    f = sub.add_parser("floor", help=BY_NAME["floor"].summary)
    f.add_argument("--quick", action="store_true")
    sub.add_parser("table", help=BY_NAME["table"].summary)
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


def main(argv: list[str] | None = None) -> int:
    """List the benchmarks (no arguments, ``list``, ``-h``/``--help``) or run the one named first with the rest of
    ``argv`` as its options. An unknown name exits 2 with the list."""
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "--child":  # one (engine, workload) of ``run``, in its own process
        engine, workload, mode, *targets = raw[1:]
        return child_main(engine, workload, [float(t) for t in targets], mode)
    if not raw or raw[0] in ("list", "-h", "--help"):
        print(listing())
        return 0
    bench = BY_NAME.get(raw[0])
    if bench is None:
        print(f"python -m benchmarks: no benchmark named {raw[0]!r}: choose one of the list below "
              "(a one-off study runs as its module, e.g. python -m benchmarks.record_cost)\n", file=sys.stderr)
        print(listing(), file=sys.stderr)
        return 2
    if bench.module is None:
        return _own_commands(raw)
    module = importlib.import_module(f"{__package__ or 'benchmarks'}.{bench.module}")
    return int(module.main(raw[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
