"""Stragglers on a real multi-host Spark: speculation keeps batches fast, and outputs stay exactly once.

Spark launches a speculative copy only on a host other than the slow task's, so this test starts a
Spark standalone cluster whose two workers bind distinct loopback addresses (127.0.0.2, 127.0.0.3;
:mod:`tests.standalone_cluster`) and runs a driver process (tests/fault/straggler_app.py) against it. Every
task of the slowed stage that lands on executor 0 sleeps ``SLOW_S`` (the driver installs a
``dstreams.faults.FaultPlan`` whose slowdown its batch runner carries to the tasks as a Spark local property,
standalone executors included). The driver runs a
stateful pipeline (``runningReduce``, then the slowed stage, then ``saveAsTextFiles``), one batch at a time
on a ManualClock:

* application 1, dstreams' defaults (speculation on): ``BATCHES`` batches without the straggler, then
  ``BATCHES`` with it;
* application 2, ``spark.speculation=false``: ``BATCHES`` batches with the straggler.

From the engine's own metrics (``BatchInfo.processing_delay_ms`` of each batch): with speculation the
median batch processing time stays within 2x of the no-straggler median; without it the median is at least a
quarter of the straggler's sleep above both (not "above 2x": with both cores busy the baseline itself doubles while
the sleep's share of a batch does not, and a loaded run measured 1.8x). And
every batch's committed ``saveAsTextFiles`` folder (written by the very tasks that are speculated) equals
that of a failure-free run on ``local[2]``: a speculative copy and its killed original never both commit.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
from typing import Any

import pytest

from dstreams import ManualClock, faults

from ..standalone_cluster import ClusterUnavailableError, StandaloneCluster
from ..support import service_unavailable
from .straggler_app import build, read_text_outputs

APP = os.path.join(os.path.dirname(__file__), "straggler_app.py")
BATCHES = 6
SLOW_S = 2.0
CLUSTER_TIMEOUT_S = 180  # a master and its workers: 60-80 s at a load average of 15-30 (60 s failed twice so)
DRIVER_TIMEOUT_S = 300  # ~60-80 s when the machine is quiet; 150 s was too short with both cores busy (the
# driver was still running its batches, 2-6 s each, when a loaded run gave up on it)
_FAULT_ENV = tuple(faults.VARIABLES)


def _reference(sc: Any, tmp_path: Any) -> dict[int, list[str]]:
    """Failure-free text outputs of the pipeline (no slowed stage) on the session's ``local[2]`` context."""
    clock = ManualClock(0)
    prefix = str(tmp_path / "ref" / "text" / "counts")
    ssc = build(sc, clock, str(tmp_path / "ref" / "checkpoint"), prefix, slow=False)
    ssc.start()
    try:
        for t in range(1000, BATCHES * 1000 + 1, 1000):
            clock.set_time(t)
            ssc.awaitBatch(t, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    return read_text_outputs(prefix)


def _tail(path: str, n: int = 6000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def _start_cluster(cluster: StandaloneCluster) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``cluster`` in a thread (it takes seconds); errors are appended to the returned list."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            cluster.start(CLUSTER_TIMEOUT_S)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            errors.append(e)

    thread = threading.Thread(target=run, name="standalone-cluster-start", daemon=True)
    thread.start()
    return thread, errors


def _stop_driver(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.serial  # compares batch times with and without speculation
@pytest.mark.timeout(CLUSTER_TIMEOUT_S + DRIVER_TIMEOUT_S + 60)
def test_speculation_keeps_batches_fast_with_a_straggler_and_outputs_exactly_once(sc, tmp_path):
    cluster = StandaloneCluster(tmp_path / "cluster")
    thread, errors = _start_cluster(cluster)
    try:
        expected = _reference(sc, tmp_path)  # while the cluster starts
        thread.join(CLUSTER_TIMEOUT_S + 30)
        if errors and isinstance(errors[0], ClusterUnavailableError):
            service_unavailable(f"no standalone Spark cluster here: {errors[0]}")
        if errors:
            raise errors[0]
        assert not thread.is_alive(), "cluster start did not return"

        out = tmp_path / "driver"
        out.mkdir()
        log_path = str(tmp_path / "driver.log")
        env = {k: v for k, v in os.environ.items() if k not in _FAULT_ENV}
        env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        args = [sys.executable, APP, str(out), "--master", cluster.master_url, "--batches", str(BATCHES),
                "--slow-executor", "0", "--slow-seconds", str(SLOW_S), "--timeout", "60"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                                    start_new_session=True)
        try:
            rc = proc.wait(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"driver still running after {DRIVER_TIMEOUT_S} s\n{_tail(log_path)}") from None
        finally:
            _stop_driver(proc)
    finally:
        thread.join(CLUSTER_TIMEOUT_S + 30)
        cluster.stop()
    with open(out / "status.json") as f:
        status = json.load(f)
    assert rc == 0 and status.get("ok"), f"driver failed (rc={rc})\n{_tail(log_path)}"

    spec_app, plain_app = status["apps"]["speculation"], status["apps"]["no-speculation"]
    # dstreams turned speculation on by itself off local masters; the user's override turned it off.
    assert spec_app["speculation_conf"]["spark.speculation"] == "true"
    assert spec_app["speculation_conf"]["spark.speculation.multiplier"] == "1.4"
    assert plain_app["speculation_conf"]["spark.speculation"] == "false"
    # Tasks report the executor they run on, so the slowdown reaches executor 0's tasks.
    assert spec_app["task_executor_ids"] == plain_app["task_executor_ids"] == ["0", "1"]

    phases = {(app, p["name"]): p for app, a in status["apps"].items() for p in a["phases"]}
    times = list(range(1000, BATCHES * 1000 + 1, 1000))
    for key, phase in phases.items():
        assert [b["t"] for b in phase["batches"]] == times, key
        assert all(not b["failures"] for b in phase["batches"]), (key, phase["batches"])
        # The engine's record of completed batches (ssc.batchInfos()) says the same as awaitBatch did.
        assert phase["batch_infos_ms"] == {str(b["t"]): b["processing_ms"] for b in phase["batches"]}, key

    def median(key: tuple[str, str]) -> float:
        return statistics.median(b["processing_ms"] for b in phases[key]["batches"])

    baseline, speculated = median(("speculation", "baseline")), median(("speculation", "straggler"))
    unspeculated = median(("no-speculation", "straggler"))
    report = (f"median batch processing time: no straggler {baseline:.0f} ms, straggler with speculation "
              f"{speculated:.0f} ms ({speculated / baseline:.2f}x), without {unspeculated:.0f} ms "
              f"({unspeculated / baseline:.2f}x); attempts {[(k, p['attempts']) for k, p in phases.items()]}")
    print(report)
    assert phases[("speculation", "straggler")]["attempts"]["speculative"] > 0, report
    assert phases[("no-speculation", "straggler")]["attempts"]["speculative"] == 0, report
    assert speculated <= 2 * baseline, report
    extra = SLOW_S * 1000 / 4  # the straggler's sleep shows in the batches nothing speculates
    assert unspeculated >= baseline + extra and unspeculated >= speculated + extra, report

    # Every batch's committed output equals the failure-free run's, in every phase: no batch lost, and
    # each record once although two attempts of the writing tasks ran.
    assert sorted(expected) == times and all(expected[t] for t in times)
    for app, name in phases:
        text = read_text_outputs(str(out / app / name / "text" / "counts"))
        assert sorted(text) == times, f"{app}/{name}: committed text folders {sorted(text)}"
        for t in times:
            assert text[t] == expected[t], f"{app}/{name}: text output of batch {t} differs"
