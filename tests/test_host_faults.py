"""A whole host lost, and a host frozen, on a standalone cluster of three hosts (issue 42).

Each test starts a Spark standalone master and three workers on 127.0.0.2-.4 (:mod:`tests.standalone_cluster`),
each worker a host with its own disk folder (Spark's local dirs, worker dir, temp, the executor state stores),
and runs a driver process (:mod:`tests.host_fault_app`) against it: word counts since the start
(``runningReduce``) and over the last 5 s (``reduceByKeyAndWindow`` with an inverse function), both in the
executor state store, checkpointed every 3 s to a local folder, 1 s batches on a ManualClock, one at a time.
After batch ``FAULT_AFTER`` one host is

* killed: its worker, executor and Python workers SIGKILLed and its disk folder (state stores, shuffle files,
  cached blocks) removed; or
* frozen: the same processes SIGSTOPped, and left so until the test ends (what a long GC pause, a hung disk or a
  network partition looks like to Spark).

Every batch must complete, every output equal that of a failure-free run of the same pipeline on the session's
``local[2]`` context, and the batch that met the frozen host must end within the bound that dstreams' Spark
settings give (:data:`dstreams.spark.sparkconf.FROZEN_HOST_DEFAULTS`; docs/guide/cluster.md). Each prints the
extra time of the batch that met the fault over the median batch before it.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dstreams import ManualClock
from dstreams.recovery import faults

from .executor_loss_app import normalise
from .host_fault_app import NAMES, build
from .standalone_cluster import MASTER_HOST, ClusterUnavailableError, StandaloneCluster, free_port, hosts, port_open
from .support import service_unavailable
from .test_executor_loss import _read_batches, _read_status, _tail

APP = os.path.join(os.path.dirname(__file__), "host_fault_app.py")
FAULT_AFTER, AFTER = 4, 3
LAST_MS = (FAULT_AFTER + AFTER) * 1000
HOST = 1
CLUSTER_TIMEOUT_S = 90
DRIVER_TIMEOUT_S = 170
#: The batch that meets a frozen host ends within this many seconds more than the usual batch: the executor is
#: declared lost 30-35 s after its last heartbeat (FROZEN_HOST_DEFAULTS), a fetch from it gives up after 32 s,
#: then the lost partitions are recomputed; slack for a loaded machine.
FROZEN_BOUND_S = 75
_FAULT_ENV = (faults.SLOW_EXECUTOR_ENV, faults.SLOW_PARTITION_ENV, faults.SLOW_SECONDS_ENV, faults.SLOW_FACTOR_ENV,
              "DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER", "DSTREAMS_STATE_LOCAL_DIR", "SPARK_LOCAL_DIRS")


def _reference(sc: Any, folder: Path) -> dict[tuple[int, str], list[Any]]:
    """Failure-free outputs of the pipeline on the session's ``local[2]`` context (the RDD state)."""
    got: dict[tuple[int, str], list[Any]] = {}

    def sink(name: str, t: int, rows: list[Any]) -> None:
        got[(t, name)] = normalise(rows)

    clock = ManualClock(0)
    ssc = build(sc, clock, sink, str(folder / "ref-checkpoint"))
    ssc.start()
    try:
        for t in range(1000, LAST_MS + 1, 1000):
            clock.set_time(t)
            ssc.awaitBatch(t, 120)
    finally:
        ssc.stop(stopSparkContext=False)
    return got


def _run_with_fault(sc: Any, tmp_path: Path, monkeypatch: Any, fault: str) -> tuple[dict[str, Any], float]:
    """Start the cluster, run the driver with ``fault`` on host :data:`HOST`, compare its outputs with the
    reference; returns the driver's status and the extra seconds of the batch that met the fault."""
    # A short folder: the executors' java.io.tmpdir holds PySpark's Unix sockets (a path of at most 107 bytes).
    base = Path(tempfile.mkdtemp(prefix="dsh-"))
    # The master's port is known before it starts, so that the driver starts while the workers do.
    cluster = StandaloneCluster(base, hosts(3), master_port=free_port(MASTER_HOST))
    errors: list[BaseException] = []

    def start() -> None:
        try:
            cluster.start(CLUSTER_TIMEOUT_S)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    starter = threading.Thread(target=start, name="host-cluster-start", daemon=True)
    starter.start()
    proc: subprocess.Popen | None = None
    out, log_path = tmp_path / "driver", tmp_path / "driver.log"
    status_path = out / "status.json"
    try:
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not errors and not port_open(MASTER_HOST, cluster.master_port):
            if time.monotonic() > deadline:
                raise AssertionError(f"master not listening after {CLUSTER_TIMEOUT_S} s\n{cluster.logs()}")
            time.sleep(0.2)
        if errors and isinstance(errors[0], ClusterUnavailableError):
            service_unavailable(f"no standalone Spark cluster here: {errors[0]}")
        if errors:
            raise errors[0]
        env = {k: v for k, v in os.environ.items() if k not in _FAULT_ENV}
        env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, DSTREAMS_STATE_STORE="executor")
        args = [sys.executable, APP, str(out), "--master", cluster.master_url, "--cluster-dir", str(base),
                "--fault", fault, "--host", str(HOST), "--fault-after", str(FAULT_AFTER), "--after", str(AFTER),
                "--timeout", "120"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                                    start_new_session=True)
        monkeypatch.setenv("DSTREAMS_STATE_STORE", "rdd")  # the reference, while the cluster and the driver start
        expected = _reference(sc, tmp_path)
        starter.join(CLUSTER_TIMEOUT_S + 30)
        if errors:
            raise errors[0]
        assert not starter.is_alive(), "cluster start did not return"
        # status.json says "ok" before the driver stops its SparkContext, which may wait on a frozen executor.
        deadline = time.monotonic() + DRIVER_TIMEOUT_S
        while not _read_status(str(status_path)).get("ok") and proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"driver not done after {DRIVER_TIMEOUT_S} s\n{_tail(str(log_path))}")
            time.sleep(0.2)
        status = _read_status(str(status_path))
        assert status.get("ok"), f"driver failed (rc={proc.poll()})\n{_tail(str(log_path))}"
    finally:
        starter.join(CLUSTER_TIMEOUT_S + 30)
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
                proc.wait(timeout=30)
        cluster.stop(grace_s=5)
        shutil.rmtree(base, ignore_errors=True)

    times = list(range(1000, LAST_MS + 1, 1000))
    assert [b["t"] for b in status["batches"]] == times
    assert all(not b["failures"] for b in status["batches"]), status["batches"]
    assert status["fault_executor"] is not None and status["fault_pids"], status
    assert len(status["task_executor_ids"]) == 3, status["task_executor_ids"]  # tasks ran on all three hosts

    got = _read_batches(out / "batches.jsonl")
    assert sorted(got) == sorted(expected) == sorted((t, n) for t in times for n in NAMES)
    for key in sorted(expected):
        assert got[key] == expected[key], f"batch {key[0]} output {key[1]} differs"

    ms = {b["t"]: b["processing_ms"] for b in status["batches"]}
    usual = statistics.median(ms[t] for t in times[1:FAULT_AFTER])  # the first batch starts the Python workers
    met = ms[(FAULT_AFTER + 1) * 1000]
    extra_s = (met - usual) / 1000
    print(f"host {fault}: batch that met it {met} ms, usual {usual:.0f} ms, extra {extra_s:.1f} s; executor dropped "
          f"{status.get('executor_dropped_after_s')} s after the fault; batches (ms) {[ms[t] for t in times]}; "
          f"tries {[b['attempts'] for b in status['batches']]}")
    return status, extra_s


#: The marks of the two tests: slow fault tests of real processes, bounded.
HOST_FAULT_MARKS = (pytest.mark.slow, pytest.mark.fault,
                    pytest.mark.timeout(CLUSTER_TIMEOUT_S + DRIVER_TIMEOUT_S + 120),
                    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="loopback hosts and /proc"))


@pytest.mark.parametrize("fault", [pytest.param("kill", marks=HOST_FAULT_MARKS)])
def test_a_whole_host_killed_with_its_disk_mid_stream_every_batch_matches_a_failure_free_run(
        sc, tmp_path, monkeypatch, record_property, fault):
    status, extra_s = _run_with_fault(sc, tmp_path, monkeypatch, fault)
    record_property("fault_batch_extra_s", extra_s)
    assert status["disk_removed"], "the host's disk folder is still there"
    assert not any(faults.pid_alive(p) for p in status["fault_pids"])


@pytest.mark.parametrize("fault", [pytest.param("freeze", marks=HOST_FAULT_MARKS)])
def test_a_frozen_host_is_declared_lost_within_the_bound_and_every_batch_matches(
        sc, tmp_path, monkeypatch, record_property, fault):
    status, extra_s = _run_with_fault(sc, tmp_path, monkeypatch, fault)
    record_property("fault_batch_extra_s", extra_s)
    assert status["conf"]["spark.network.timeoutInterval"] == "5s", status["conf"]  # dstreams' defaults in force
    dropped = status["executor_dropped_after_s"]
    assert dropped is not None and dropped <= 45, f"the frozen host's executor was dropped after {dropped} s"
    assert extra_s <= FROZEN_BOUND_S, f"the batch that met the frozen host took {extra_s:.0f} s more"
