"""Recovery from faults: per-batch processing time around an executor loss, and with a straggler.

Run from the repository root::

    python -m benchmarks.recovery            # full run (a few minutes)
    python -m benchmarks.recovery --quick    # short run (about 2-3 minutes on 2 cores)
    python -m benchmarks.recovery --skip-straggler --intervals 2,10
    python -m benchmarks.recovery --hosts 3  # a whole host lost (3 repeats of 4 runs: about an hour, loaded)

1. **Executor loss** (``local-cluster[2,1,1024]``, one application): for each checkpoint interval of
   ``--intervals`` (default 2 s, 10 s, 30 s) a fresh StreamingContext runs a stateful windowed pipeline
   over the generator source (``runningReduce`` and an invertible ``reduceByKeyAndWindow`` over 5 s, both
   checkpointed every interval) on a ManualClock, one 1 s batch at a time. After batch ``--kill-after``
   one executor JVM is SIGKILLed (``dstreams.recovery.faults.kill_executor``); the run goes on to ``--batches``.
   Each batch is labelled ``before`` (up to the kill), ``during`` (the application has fewer executors
   than it started with: Spark recomputes the lost state partitions from lineage since the last
   checkpoint, on the surviving executor) or ``after`` (the replacement executor registered).
2. **Straggler** (a Spark standalone cluster on 127.0.0.1 with workers on 127.0.0.2 and 127.0.0.3, as
   started by ``tests/standalone_cluster.py``): the driver of ``tests/fault/straggler_app.py`` runs a stateful
   windowed pipeline without a straggler, with one (every task of the slowed stage on executor 0 sleeps
   ``--slow-seconds``) and speculation on (dstreams' default), and with one and ``spark.speculation=false``.

3. **Host loss** (``--hosts N``, instead of 1 and 2): a standalone cluster of N hosts (``tests/standalone_cluster.py``,
   each worker on its own loopback address with its own disk folder), started once for the run. For each repeat,
   checkpoint interval of ``--intervals`` (default 10 s, 30 s) and state of ``--stores`` (the RDD state, the
   executor state store), one driver of ``tests/fault/host_fault_app.py`` runs ``updateStateByKey`` with an
   ``initialRDD`` and an invertible 5 s window in that state, 1 s batches on a ManualClock one at a time; after
   batch ``interval // 2 + 1`` (half an interval of lineage since the initial state; ``--after-first-checkpoint``:
   since the first regular checkpoint, an interval of batches more) host 1 is SIGKILLed
   (worker, executor, Python workers) and its disk folder removed; ``--host-after`` batches later its worker starts
   again with an empty disk and ``--host-after-join`` batches run once its executor registered. Per run: the usual
   batch (median of the batches before the loss but the first), the batch that met the loss and its extra time,
   how many batches were slower than 1.5x the usual + 0.5 s before one was not
   (``tests.fault.host_fault_app.recovery_figures``), and the executor stores' catch-ups after the replacement joined.
   The summary gives medians over the repeats against the paper's figures (at most 1 s extra with 10 s
   checkpoints, 3.5 s with 30 s), reported, not asserted. Writes ``benchmarks/results/recovery_hosts.json``
   (after every run, so an interrupted run keeps what it measured).

Every processing time is the engine's own metric (``BatchInfo.processing_delay_ms``). Prints a short
table, writes everything to ``benchmarks/results/recovery.json`` and, when matplotlib is installed, the
figure ``benchmarks/results/recovery.png`` (per-batch processing time vs batch, one line per checkpoint
interval, the failure marked; a second panel for the straggler runs).
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
LOSS_MASTER = "local-cluster[2,1,1024]"
EXECUTORS = 2


# ---------------------------------------------------------------------------------------------- helpers
def _poll(cond: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def _executor_ids(sc: Any) -> list[str]:
    ids = sc._jsc.sc().getExecutorIds().mkString(",")
    return sorted(x for x in ids.split(",") if x)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------- executor loss
def _build_loss_pipeline(sc: Any, clock: Any, checkpoint: str, interval_s: int, records: int) -> Any:
    """Generator lines -> words -> runningReduce + invertible 5 s window, both checkpointed every interval."""
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint)
    words = ssc.generatorStream(records, 4, seed=5).flatMap(lambda line: line.split()).map(lambda w: (w, 1))
    counts = words.runningReduce(operator.add, numPartitions=4).checkpoint(f"{interval_s}s")
    window = words.reduceByKeyAndWindow(operator.add, operator.sub, "5s", "1s", numPartitions=4,
                                        filterFunc=lambda kv: kv[1] > 0).checkpoint(f"{interval_s}s")
    counts.foreachRDD(lambda rdd: rdd.count())
    window.foreachRDD(lambda rdd: rdd.count())
    return ssc


def run_executor_loss(sc: Any, interval_s: int, batches: int, kill_after: int, records: int, work: str,
                      timeout: float) -> dict[str, Any]:
    """One run of the loss pipeline with checkpoint interval ``interval_s``; an executor dies after ``kill_after``."""
    from dstreams import ManualClock
    from dstreams.recovery import faults

    _poll(lambda: len(_executor_ids(sc)) >= EXECUTORS, timeout, f"{EXECUTORS} executors")
    sc.parallelize(range(16), 16).map(lambda x: x).collect()  # warm every executor's Python workers
    clock = ManualClock(0)
    ssc = _build_loss_pipeline(sc, clock, os.path.join(work, f"checkpoint-{interval_s}s"), interval_s, records)
    run: dict[str, Any] = {"checkpoint_interval_s": interval_s, "kill_after_batch": kill_after, "batches": []}
    killed: str | None = None
    recovered = False
    ssc.start()
    try:
        for i in range(1, batches + 1):
            t = i * 1000
            if killed is not None and not recovered:
                ids = _executor_ids(sc)
                recovered = len(ids) >= EXECUTORS and killed not in ids
            phase = "before" if i <= kill_after else ("after" if recovered else "during")
            clock.set_time(t)
            info = ssc.awaitBatch(t, timeout)
            if info.failed:
                raise RuntimeError(f"batch {t} failed: {info.output_operations}")
            run["batches"].append({"batch": i, "t": t, "processing_ms": info.processing_delay_ms, "phase": phase})
            print(f"  interval {interval_s:>2} s  batch {i:>3}  {info.processing_delay_ms:>6} ms  {phase}", flush=True)
            if i == kill_after:
                pids = faults.executor_pids(sc.applicationId)
                pid = faults.kill_executor(sc)
                killed = next(k for k, v in pids.items() if v == pid)
                _poll(lambda p=pid: not faults.pid_alive(p), timeout, f"executor pid {pid} to die")
                run.update(killed_executor=killed, killed_pid=pid)
    finally:
        ssc.stop(stopSparkContext=False)
    by_phase = {p: [b["processing_ms"] for b in run["batches"] if b["phase"] == p]
                for p in ("before", "during", "after")}
    before = _median(by_phase["before"][2:] or by_phase["before"])  # the first batches warm up
    after_kill = [b["processing_ms"] for b in run["batches"] if b["batch"] > kill_after]
    run["summary"] = {
        "median_before_ms": before,
        "first_after_kill_ms": after_kill[0] if after_kill else None,
        "median_during_ms": _median(by_phase["during"]),
        "median_after_ms": _median(by_phase["after"]),
        "batches_during": len(by_phase["during"]),
        "lineage_batches_at_kill": kill_after % interval_s,
        "extra_ms_after_kill": (sum(max(x - before, 0) for x in after_kill) if before is not None else None),
    }
    # Let the replacement executor come before the next run (bounded).
    try:
        _poll(lambda: len(_executor_ids(sc)) >= EXECUTORS and killed not in _executor_ids(sc), timeout,
              "the replacement executor")
    except TimeoutError as e:
        run["summary"]["warning"] = str(e)
    return run


def executor_loss(args: argparse.Namespace, work: str) -> list[dict[str, Any]]:
    from dstreams.spark.sparkconf import create_spark_context

    local_dir = os.path.join(work, "spark-local")
    os.makedirs(local_dir, exist_ok=True)
    tmp_opt = f"-Djava.io.tmpdir={local_dir}"
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": tmp_opt,
        "spark.executor.extraJavaOptions": tmp_opt,
        "spark.executor.memory": "512m",
        "spark.default.parallelism": "4",
    }
    sc = create_spark_context(LOSS_MASTER, "dstreams-recovery-benchmark", conf)
    runs = []
    try:
        for interval in args.intervals:
            print(f"executor loss, checkpoint interval {interval} s ({LOSS_MASTER})", flush=True)
            runs.append(run_executor_loss(sc, interval, args.batches, args.kill_after, args.records,
                                          work, args.timeout))
    finally:
        sc.stop()
    return runs


# -------------------------------------------------------------------------------------------- straggler
def straggler(args: argparse.Namespace, work: str) -> dict[str, Any]:
    """Run tests/fault/straggler_app.py's driver against a fresh standalone cluster; its per-batch metrics."""
    sys.path.insert(0, str(ROOT))
    from tests.standalone_cluster import ClusterStartError, ClusterUnavailableError, StandaloneCluster

    cluster = StandaloneCluster(Path(work) / "cluster")
    try:
        cluster.start(args.timeout)
    except ClusterUnavailableError as e:
        print(f"straggler case skipped: {e}")
        return {"skipped": str(e)}
    except ClusterStartError as e:
        print(f"straggler case failed: the standalone cluster did not start\n{e}")
        return {"error": str(e)}
    out = os.path.join(work, "straggler")
    os.makedirs(out, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTREAMS_FAULT_")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, str(ROOT / "tests" / "fault" / "straggler_app.py"), out, "--master", cluster.master_url,
           "--batches", str(args.straggler_batches), "--slow-seconds", str(args.slow_seconds),
           "--timeout", str(args.timeout)]
    print(f"straggler: {cluster.master_url}, {args.straggler_batches} batches per phase, executor 0's tasks "
          f"sleep {args.slow_seconds} s", flush=True)
    try:
        proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True,
                              timeout=args.timeout * 6, start_new_session=True)
    finally:
        cluster.stop()
    try:
        with open(os.path.join(out, "status.json")) as f:
            status = json.load(f)
    except (OSError, ValueError):
        status = {}
    if proc.returncode != 0 or not status.get("ok"):
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return {"error": f"straggler driver failed (exit {proc.returncode})"}
    series = {}
    for app, key in (("speculation", "baseline"), ("speculation", "straggler"), ("no-speculation", "straggler")):
        phase = next(p for p in status["apps"][app]["phases"] if p["name"] == key)
        label = "no straggler" if key == "baseline" else f"straggler, {app.replace('-', ' ')}"
        series[label] = {"processing_ms": [b["processing_ms"] for b in phase["batches"]],
                         "median_ms": phase["median_ms"], "task_attempts": phase["attempts"]}
    base = series["no straggler"]["median_ms"]
    return {
        "slow_seconds": args.slow_seconds,
        "speculation_conf": status["apps"]["speculation"]["speculation_conf"],
        "series": series,
        "ratio_speculation": series["straggler, speculation"]["median_ms"] / base,
        "ratio_no_speculation": series["straggler, no speculation"]["median_ms"] / base,
    }


# -------------------------------------------------------------------------------------------- host loss
#: The paper's figures for the extra time of the batch that meets a node loss, by checkpoint interval (seconds).
PAPER_TARGET_MS = {10: 1000, 30: 3500}
HOST_TARGET = 1  # the host (0-based) killed in every run


def _kill_after(interval: int, after_first_checkpoint: bool) -> int:
    """The batch after which the host dies: half an interval of lineage (``interval // 2 + 1`` batches) since the
    initial state (the executor store checkpoints it at the zero time; the RDD state recomputes it from the
    ``initialRDD``), or with ``after_first_checkpoint`` since the first regular checkpoint (``interval`` batches
    more to run)."""
    return interval // 2 + 1 + (interval if after_first_checkpoint else 0)


def _host_loss_run(args: argparse.Namespace, cluster_dir: Path, master_url: str, store: str, interval: int,
                   repeat: int, work: str, replicas: int | None = None) -> dict[str, Any]:
    """One driver of ``tests/fault/host_fault_app.py`` on the running cluster: ``store`` state, checkpoints every
    ``interval`` s, host :data:`HOST_TARGET` killed with its disk half a checkpoint interval after a checkpoint
    (:func:`_kill_after`), ``--host-after`` batches, then the host started again and ``--host-after-join`` batches
    once its executor registered; ``replicas``: ``spark.dstreams.state.replicas`` (None: the default, ``auto``).
    Returns its per-batch metrics and :func:`recovery_figures`."""
    from tests.fault.host_fault_app import recovery_figures

    kill_after = _kill_after(interval, args.after_first_checkpoint)
    out = os.path.join(work, f"hosts-{store}-{interval}s-{replicas or 'auto'}-{repeat}")
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "tests" / "fault" / "host_fault_app.py"), out, "--master", master_url,
           "--cluster-dir", str(cluster_dir), "--stores", store, "--checkpoint-interval", str(interval),
           "--fault", "kill", "--host", str(HOST_TARGET), "--fault-after", str(kill_after),
           "--after", str(args.host_after), "--replace", "--after-join", str(args.host_after_join),
           "--timeout", str(args.timeout)]
    if args.checkpoint_url:
        cmd += ["--checkpoint", f"{args.checkpoint_url.rstrip('/')}/{store}-{interval}s-{repeat}-{os.getpid()}"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DSTREAMS_FAULT_") and k not in ("DSTREAMS_STATE_LOCAL_DIR", "DSTREAMS_STATE_STORE")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.pop("DSTREAMS_STATE_REPLICAS", None)
    if replicas is not None:
        env["DSTREAMS_STATE_REPLICAS"] = str(replicas)
    batches = kill_after + args.host_after + args.host_after_join
    run: dict[str, Any] = {"state": store, "checkpoint_interval_s": interval, "repeat": repeat,
                           "replicas_setting": replicas or "auto",
                           "kill_after_batch": kill_after, "lineage_batches_at_kill": kill_after % interval,
                           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    log_path = os.path.join(out, "driver.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=out, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout * 3 + batches * args.timeout / 4)
        except subprocess.TimeoutExpired:
            rc = -9
        finally:  # timed out, or this process is stopping: the driver and its JVM go too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    try:
        with open(os.path.join(out, "status.json")) as f:
            status = json.load(f)
    except (OSError, ValueError):
        status = {}
    if rc != 0 or not status.get("ok"):
        with open(log_path, errors="replace") as f:
            run["error"] = f"driver exit {rc}: " + f.read()[-3000:]
        return run
    figures = recovery_figures(status["batches"], kill_after)
    joined = [b for b in status["batches"] if b["phase"] == "joined"]
    at_join = next((b["caught_up"] for b in reversed(status["batches"]) if b["phase"] != "joined"), {})
    run.update(
        batches=[{k: b[k] for k in ("t", "processing_ms", "attempts", "phase", "caught_up")}
                 for b in status["batches"]],
        usual_ms=figures["usual_ms"], met_ms=figures["met_ms"], extra_ms=figures["extra_ms"],
        batches_to_usual=figures["batches_to_usual"],
        # on how many executors each state chain was cached (the setting as the driver applied it)
        replicas=max((max(r) for r in status.get("state_replicas", {}).values() if r), default=None),
        median_joined_ms=_median([b["processing_ms"] for b in joined]),
        catch_ups_after_join=(sum(joined[-1]["caught_up"][k] - at_join.get(k, 0) for k in joined[-1]["caught_up"])
                              if joined else None),
        executor_dropped_after_s=status.get("executor_dropped_after_s"),
        replacement_join_s=status.get("replacement_join_s"),
        replacement_tasks=status.get("executor_tasks", {}).get(status.get("replacement_executor", ""), 0),
        load_average_at_end=[round(x, 2) for x in os.getloadavg()],
    )
    return run


def _host_loss_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (checkpoint interval, state, replicas setting): medians over the repeats that completed, against the
    paper's target."""
    rows = []
    settings = sorted({str(r.get("replicas_setting", "auto")) for r in runs})
    for interval in sorted({r["checkpoint_interval_s"] for r in runs}):
        for store, setting in ((store, setting) for store in ("rdd", "executor") for setting in settings):
            same = [r for r in runs if r["checkpoint_interval_s"] == interval and r["state"] == store
                    and str(r.get("replicas_setting", "auto")) == setting]
            done = [r for r in same if "error" not in r]
            failed = len(same) - len(done)
            if not done and not failed:
                continue
            back = [r["batches_to_usual"] for r in done]
            extra = _median([r["extra_ms"] for r in done])
            target = PAPER_TARGET_MS.get(interval)
            rows.append({
                "checkpoint_interval_s": interval, "state": store, "replicas_setting": setting,
                "replicas": sorted({r.get("replicas") for r in done if r.get("replicas") is not None}),
                "runs": len(done), "failed_runs": failed,
                "lineage_batches_at_kill": done[0]["lineage_batches_at_kill"] if done else None,
                "median_usual_ms": _median([r["usual_ms"] for r in done]),
                "median_met_ms": _median([r["met_ms"] for r in done]),
                "median_extra_ms": extra, "extra_ms": [r["extra_ms"] for r in done],
                "batches_to_usual": back,
                "median_batches_to_usual": (_median([float(b) for b in back]) if back and None not in back
                                            else None),
                "median_joined_ms": _median([r["median_joined_ms"] for r in done if r["median_joined_ms"] is not None]),
                "catch_ups_after_join": [r["catch_ups_after_join"] for r in done],
                "paper_target_ms": target,
                "within_paper_target": (extra <= target) if extra is not None and target is not None else None,
            })
    return rows


def host_loss(args: argparse.Namespace, work: str, doc: dict[str, Any]) -> None:
    """Every (repeat, checkpoint interval, state) on one standalone cluster of ``--hosts`` hosts started for the run;
    fills ``doc["host_loss"]`` and writes the JSON after every run (an interrupted run keeps what it measured)."""
    sys.path.insert(0, str(ROOT))
    from tests.standalone_cluster import (
        ClusterStartError,
        ClusterUnavailableError,
        StandaloneCluster,
        hosts,
        stop_from_dir,
    )

    # SIGTERM (a timeout, a stop) ends the run through the finally below, which stops the cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = Path(tempfile.mkdtemp(prefix="dsb-"))  # short: the executors' Unix sockets live under it
    cluster = StandaloneCluster(base, hosts(args.hosts))
    section: dict[str, Any] = {"hosts": args.hosts, "runs": [], "summary": []}
    doc["host_loss"] = section
    try:
        cluster.start(args.timeout)
    except (ClusterUnavailableError, ClusterStartError) as e:
        section["error"] = f"the standalone cluster did not start: {e}"
        print(section["error"])
        return
    print(f"host loss: {args.hosts} hosts, master {cluster.master_url}, disks under {base}", flush=True)
    try:
        for repeat in range(args.repeats):
            for interval, store, replicas in ((i, s, r) for i in args.intervals for s in args.stores
                                              for r in args.replicas):
                attached = StandaloneCluster.attach(base)  # the last driver may have started a worker again
                if not attached.host_pids(HOST_TARGET):
                    attached.restart_host(HOST_TARGET, args.timeout)
                print(f"  repeat {repeat + 1}/{args.repeats}: {store} state, {interval} s checkpoints, replicas "
                      f"{replicas or 'auto'}", flush=True)
                run = _host_loss_run(args, base, cluster.master_url, store, interval, repeat, work, replicas)
                section["runs"].append(run)
                if "error" in run:
                    print(f"    failed: {run['error'][-500:]}", flush=True)
                else:
                    print(f"    usual {run['usual_ms']:.0f} ms, batch that met the loss {run['met_ms']} ms "
                          f"({run['extra_ms'] / 1000:+.1f} s), slow batches {run['batches_to_usual']}, "
                          f"catch-ups after the replacement joined {run['catch_ups_after_join']}", flush=True)
                section["summary"] = _host_loss_summary(section["runs"])
                _write(doc, args.output)
    finally:
        stop_from_dir(base, grace_s=5)
        cluster.stop(grace_s=5)
        shutil.rmtree(base, ignore_errors=True)


def _print_host_table(section: dict[str, Any]) -> None:
    print()
    print(f"host loss on {section['hosts']} hosts (one killed with its disk, half a checkpoint interval of lineage); "
          "ms, medians over runs")
    print(f"{'checkpoint':>10} {'state':>8} {'copies':>6} {'runs':>4} {'lineage':>7} {'usual':>7} {'met':>7} "
          f"{'extra':>7} {'target':>7} {'slow batches':>12} {'joined':>7} {'catch-ups':>9}")
    for row in section["summary"]:
        target = row["paper_target_ms"]
        verdict = "" if row["within_paper_target"] is None else (" ok" if row["within_paper_target"] else " over")
        copies = ",".join(str(r) for r in row.get("replicas", [])) or "?"
        print(f"{row['checkpoint_interval_s']:>9}s {row['state']:>8} {copies:>6} {row['runs']:>4} "
              f"{_fmt(row['lineage_batches_at_kill']):>7} {_fmt(row['median_usual_ms']):>7} "
              f"{_fmt(row['median_met_ms']):>7} {_fmt(row['median_extra_ms']):>7} "
              f"{_fmt(target):>7}{verdict:<5} {str(row['batches_to_usual']):>12} {_fmt(row['median_joined_ms']):>7} "
              f"{str(row['catch_ups_after_join']):>9}")
    if section.get("error"):
        print(section["error"])


def _write(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ output
def _plot(doc: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]): no figure, JSON only")
        return False
    strag = doc.get("straggler") or {}
    panels = 2 if strag.get("series") else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    kill = None
    for run in doc["executor_loss"]:
        xs = [b["batch"] for b in run["batches"]]
        ys = [b["processing_ms"] / 1000 for b in run["batches"]]
        ax.plot(xs, ys, marker=".", label=f"{run['checkpoint_interval_s']} s checkpoints")
        kill = run["kill_after_batch"]
    if kill is not None:
        ax.axvline(kill + 0.5, color="red", linestyle="--", linewidth=1)
        ax.annotate("executor killed", xy=(kill + 0.5, ax.get_ylim()[1] * 0.95), color="red", fontsize=8,
                    ha="left")
    ax.set_xlabel("batch (1 s interval)")
    ax.set_ylabel("processing time (s)")
    ax.set_title(f"Executor loss, {LOSS_MASTER}")
    ax.legend(fontsize=8)
    if panels == 2:
        ax2 = axes[0][1]
        for label, s in strag["series"].items():
            ax2.plot(range(1, len(s["processing_ms"]) + 1), [x / 1000 for x in s["processing_ms"]], marker=".",
                     label=f"{label} (median {s['median_ms'] / 1000:.2f} s)")
        ax2.set_xlabel("batch")
        ax2.set_ylabel("processing time (s)")
        ax2.set_title(f"Straggler (executor 0 tasks +{strag['slow_seconds']:g} s), standalone")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _print_table(doc: dict[str, Any]) -> None:
    print()
    print(f"{'checkpoint':>10} {'lineage':>7} {'before':>8} {'1st after':>9} {'during':>8} {'#during':>7} "
          f"{'after':>8} {'extra':>8}   (ms; medians unless noted)")
    for run in doc["executor_loss"]:
        s = run["summary"]
        print(f"{run['checkpoint_interval_s']:>9}s {s['lineage_batches_at_kill']:>7} {_fmt(s['median_before_ms']):>8} "
              f"{_fmt(s['first_after_kill_ms']):>9} {_fmt(s['median_during_ms']):>8} {s['batches_during']:>7} "
              f"{_fmt(s['median_after_ms']):>8} {_fmt(s['extra_ms_after_kill']):>8}")
    strag = doc.get("straggler") or {}
    if strag.get("series"):
        print()
        base = strag["series"]["no straggler"]["median_ms"]
        for label, s in strag["series"].items():
            print(f"{label:<28} median {s['median_ms']:>7.0f} ms  {s['median_ms'] / base:5.2f}x  "
                  f"speculative attempts {s['task_attempts']['speculative']}")
    elif strag:
        print(f"straggler: {strag.get('skipped') or strag.get('error')}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _stores(text: str) -> list[str]:
    stores = [x.strip() for x in text.split(",") if x.strip()]
    if not stores or any(x not in ("rdd", "executor") for x in stores):
        raise argparse.ArgumentTypeError(f"rdd, executor or both, comma-separated, not {text!r}")
    return stores


def _replicas(text: str) -> list[int | None]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in ("1", "2", "auto") for v in values):
        raise argparse.ArgumentTypeError(f"1, 2 or auto, comma-separated, not {text!r}")
    return [None if v == "auto" else int(v) for v in values]


def _host_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--hosts N``: the host-loss case only (see the module doc)."""
    import pyspark

    args.intervals = args.intervals or [10, 30]
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.output = args.output or RESULTS / "recovery_hosts.json"
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="dstreams-recovery-hosts-")
    doc: dict[str, Any] = {
        "benchmark": "recovery --hosts",
        "command": " ".join(["python -m benchmarks.recovery", *(sys.argv[1:] if argv is None else argv)]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "params": {"hosts": args.hosts, "intervals_s": args.intervals, "states": args.stores,
                   "state_replicas": [r or "auto" for r in args.replicas],
                   "repeats": args.repeats, "batches_after_loss": args.host_after,
                   "batches_after_join": args.host_after_join, "batch_interval_s": 1, "partitions": 3,
                   "pipeline": "tests/fault/host_fault_app.py: updateStateByKey with an initialRDD and an invertible "
                               "5 s reduceByKeyAndWindow over 8 words x 3 partitions a batch",
                   "kill": ("host 1, its disk folder removed, after batch "
                            + ("interval + interval // 2 + 1" if args.after_first_checkpoint else "interval // 2 + 1")),
                   "checkpoint": args.checkpoint_url or "a local folder shared by the hosts of this machine",
                   "paper_target_ms": PAPER_TARGET_MS},
    }
    try:
        host_loss(args, work, doc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    _print_host_table(doc["host_loss"])
    _write(doc, args.output)
    print(f"wrote {args.output}")
    print(f"elapsed {doc['elapsed_s']} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run: fewer batches and records (--hosts: 1 repeat)")
    p.add_argument("--intervals", type=_ints, help="checkpoint intervals, seconds (default 2,10,30; --hosts: 10,30)")
    p.add_argument("--batches", type=int, help="batches per executor-loss run (default 40, quick 18)")
    p.add_argument("--kill-after", type=int, help="kill an executor after this batch (default 29, quick 13)")
    p.add_argument("--records", type=int, help="generator lines per partition per batch (default 3000, quick 1000)")
    p.add_argument("--straggler-batches", type=int, help="batches per straggler phase (default 10, quick 5)")
    p.add_argument("--slow-seconds", type=float, default=2.0, help="sleep of each straggler task")
    p.add_argument("--skip-straggler", action="store_true")
    p.add_argument("--skip-loss", action="store_true")
    p.add_argument("--hosts", type=int, default=0,
                   help="run the host-loss case instead, on a standalone cluster of this many hosts (3)")
    p.add_argument("--stores", type=_stores, default=["rdd", "executor"],
                   help="--hosts: the state backends, comma-separated (default rdd,executor)")
    p.add_argument("--replicas", type=_replicas, default=[None],
                   help="--hosts: spark.dstreams.state.replicas values to run side by side, comma-separated (1, 2; "
                        "default: the setting's default, auto: 2 on the cluster)")
    p.add_argument("--repeats", type=int, help="--hosts: runs of each (interval, state) (default 3, quick 1)")
    p.add_argument("--host-after", type=int, default=4, help="--hosts: batches after the loss (default 4)")
    p.add_argument("--host-after-join", type=int, default=1,
                   help="--hosts: batches once the replacement host's executor registered (default 1)")
    p.add_argument("--after-first-checkpoint", action="store_true",
                   help="--hosts: kill half an interval after the first regular checkpoint, not half an interval "
                        "after the start (an interval more of batches to run)")
    p.add_argument("--checkpoint-url", help="--hosts: checkpoint under this s3://bucket/prefix (the AWS_* variables "
                   "give the endpoint and credentials) instead of a local folder")
    p.add_argument("--timeout", type=float, help="bound of every wait, seconds (default 90; --hosts: 180)")
    p.add_argument("--output", type=Path,
                   help="the JSON written (default results/recovery.json; --hosts: results/recovery_hosts.json)")
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    args.timeout = args.timeout or (180.0 if args.hosts else 90.0)
    if args.hosts:
        if args.hosts < 2:
            raise SystemExit("--hosts needs at least 2 hosts (one is killed)")
        return _host_main(args, argv)
    args.intervals = args.intervals or [2, 10, 30]
    args.output = args.output or RESULTS / "recovery.json"
    defaults = (18, 13, 1000, 5) if args.quick else (40, 29, 3000, 10)
    args.batches = args.batches or defaults[0]
    args.kill_after = args.kill_after or defaults[1]
    args.records = args.records or defaults[2]
    args.straggler_batches = args.straggler_batches or defaults[3]
    if not 0 < args.kill_after < args.batches:
        raise SystemExit("--kill-after must be between 1 and --batches - 1")

    import pyspark

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="dstreams-recovery-bench-")
    doc: dict[str, Any] = {
        "benchmark": "recovery",
        "command": " ".join(["python -m benchmarks.recovery", *(sys.argv[1:] if argv is None else argv)]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "params": {"intervals_s": args.intervals, "batches": args.batches, "kill_after": args.kill_after,
                   "records_per_partition": args.records, "partitions": 4, "batch_interval_s": 1,
                   "straggler_batches": args.straggler_batches, "slow_seconds": args.slow_seconds},
        "executor_loss": [],
        "straggler": None,
    }
    try:
        if not args.skip_loss:
            doc["executor_loss"] = executor_loss(args, work)
        if not args.skip_straggler:
            doc["straggler"] = straggler(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    _print_table(doc)
    _write(doc, args.output)
    print(f"wrote {args.output}")
    if doc["executor_loss"] or (doc["straggler"] or {}).get("series"):
        png = args.output.with_suffix(".png")
        if _plot(doc, png):
            print(f"wrote {png}")
    print(f"elapsed {doc['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
