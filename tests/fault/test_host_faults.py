"""A whole host lost and replaced, and a host frozen, on a standalone cluster of three hosts (issue 42).

The tests share one Spark standalone master and three workers on 127.0.0.2-.4 (:mod:`tests.standalone_cluster`,
started once for the module: the ``host_cluster`` fixture of ``conftest.py``,
:class:`~tests.fault.cluster_support.SharedCluster`; a host a test left killed or frozen is started again with an
empty disk before the next), each worker a host with its own disk folder (Spark's local dirs, worker dir, temp, the
executor state stores). Each test runs a driver process (:mod:`tests.fault.host_fault_app`) against it: word
counts since the start (``updateStateByKey`` with an ``initialRDD``) and over the last 5 s (``reduceByKeyAndWindow``
with an inverse function), each twice side by side, on the RDD state and in the executor state store, checkpointed
every 3 s, 1 s batches on a ManualClock, one at a time. One host is

* killed after batch ``KILL_AFTER`` (2: before the first regular state checkpoint, so the stores' partitions it held
  are caught up from the state loaded at the zero time, the ``initialRDD``): its worker, executor and Python workers
  SIGKILLed and its disk folder (state stores, shuffle files, cached blocks) removed, checkpoints and the stores'
  changelog on the Ceph gateway; after the next batch the host starts again with an empty disk (a replacement), and
  two more batches run once its executor registered; no task may fail with a ``StateStoreError``; or
* frozen after batch ``FREEZE_AFTER``: the same processes SIGSTOPped, and left so until the test ends (what a long
  GC pause, a hung disk or a network partition looks like to Spark); checkpoints in a local folder.

Every batch must complete, every output equal that of a failure-free run of the same pipeline on the session's
``local[2]`` context (computed once, while the cluster starts). The killed host's replacement must
take tasks without a reload storm (the stores' catch-ups after it joined are bounded); the batch that met the
frozen host must end within the bound that dstreams' Spark settings give
(:data:`dstreams.spark.sparkconf.FROZEN_HOST_DEFAULTS`; docs/guide/cluster.md). Each prints the extra time of the
batch that met the fault over the usual batch, and the batches until the usual time returned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dstreams import ManualClock
from dstreams import faults as fault_points
from dstreams.recovery import faults

from ..process_support import s3_client, with_gateway
from ..support import RGW_ENDPOINT, service_unavailable
from .cluster_support import CLUSTER_TIMEOUT_S, SharedCluster
from .executor_loss_app import normalise
from .host_fault_app import PARTITIONS, build, names, recovery_figures
from .test_executor_loss import _read_batches, _read_status, _tail

APP = os.path.join(os.path.dirname(__file__), "host_fault_app.py")
#: The kill: after batch 2 (the first regular checkpoint is at 3 s), 3 batches, the replacement waited for, 2 more.
KILL_AFTER, KILL_BATCHES_AFTER, AFTER_JOIN = 2, 3, 2
#: The freeze: after batch 4, 3 batches more.
FREEZE_AFTER, FREEZE_BATCHES_AFTER = 4, 3
#: The failure-free reference is computed once, for the test with the most batches, and shared.
LAST_MS = max(KILL_AFTER + KILL_BATCHES_AFTER + AFTER_JOIN, FREEZE_AFTER + FREEZE_BATCHES_AFTER) * 1000
NAMES = names()
HOST = 1
#: Bounds that catch a hang, not timing targets. Measured at a load average of 30-75 (other suites beside): the
#: master and workers up after more than 90 s, a first batch of 42-73 s, the others 10-28 s, the replacement's
#: executor registered 90-154 s after its worker started; the kill test took 649 s, the freeze test 470 s (the
#: kill test 383 s at a load of 18-30). On the shared cluster, kill before the first checkpoint: both 311 s at a load
#: of 5-17, 666 s at 15-34 (the freeze first, then the frozen host started again for the kill).
DRIVER_TIMEOUT_S = 420
#: The batch that meets a frozen host ends within this many seconds more than the usual batch: the executor is
#: declared lost 30-35 s after its last heartbeat (FROZEN_HOST_DEFAULTS), a fetch from it gives up after 32 s,
#: then the lost partitions are recomputed; slack for a loaded machine.
FROZEN_BOUND_S = 75
#: Catch-ups of the executor stores (a partition's store brought up to date from the newest checkpoint and the
#: changelog on a host without it) in the AFTER_JOIN batches after the replacement host joined, at most: every
#: partition of the two store streams moving once (to the new host, or by speculation) is 2 x PARTITIONS = 6; a
#: storm (every partition reloaded every batch) is 2 x PARTITIONS x AFTER_JOIN = 12 and more. Measured: 1, 2, 2, 3.
JOIN_CATCH_UPS_BOUND = 2 * PARTITIONS
_FAULT_ENV = (*fault_points.VARIABLES, "DSTREAMS_STATE_LOCAL_DIR", "SPARK_LOCAL_DIRS", "DSTREAMS_STATE_STORE")
#: The failure-free outputs, batch 1 .. LAST_MS (each batch's output depends on the batch times only).
_REFERENCE: dict[tuple[int, str], list[Any]] = {}


def _reference(sc: Any, folder: Path) -> dict[tuple[int, str], list[Any]]:
    """Failure-free outputs of the pipeline on the session's ``local[2]`` context (every state on the RDD state),
    computed once per session."""
    if _REFERENCE:
        return _REFERENCE
    got: dict[tuple[int, str], list[Any]] = {}

    def sink(name: str, t: int, rows: list[Any]) -> None:
        got[(t, name)] = normalise(rows)

    clock = ManualClock(0)
    ssc = build(sc, clock, sink, str(folder / "ref-checkpoint"), reference=True)
    ssc.start()
    try:
        for t in range(1000, LAST_MS + 1, 1000):
            clock.set_time(t)
            ssc.awaitBatch(t, 120)
    finally:
        ssc.stop(stopSparkContext=False)
    _REFERENCE.update(got)
    return got


def _ceph_checkpoint() -> str:
    """A checkpoint location in a new bucket of the project's Ceph gateway (skipped, or failed under ``CI=true``,
    when the gateway is not reachable)."""
    bucket = f"host-faults-{uuid.uuid4().hex[:8]}"
    try:
        s3_client().create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"Ceph RGW at {RGW_ENDPOINT} is not reachable ({e}); run `bash scripts/services.sh start`")
    return f"s3://{bucket}/host-kill"


def _object_keys(url: str) -> list[str]:
    """Every object key under the ``s3://bucket/prefix`` URL (relative to the prefix)."""
    bucket, _, prefix = url[len("s3://"):].partition("/")
    keys: list[str] = []
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys += [o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])]
    return keys


def _run_with_fault(sc: Any, shared: SharedCluster, tmp_path: Path, fault: str, fault_after: int, after: int,
                    extra: list[str], last: int, checkpoint: str | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the driver on the shared cluster with ``fault`` on host :data:`HOST` after batch ``fault_after``, then
    ``after`` batches (and the ``extra`` arguments), ``last`` batches in all, and compare its outputs with the
    reference; returns the driver's status and :func:`recovery_figures`."""
    proc: subprocess.Popen | None = None
    out, log_path = tmp_path / "driver", tmp_path / "driver.log"
    status_path = out / "status.json"
    try:
        master = shared.master_listening()
        env = {k: v for k, v in os.environ.items() if k not in _FAULT_ENV}
        env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        args = [sys.executable, APP, str(out), "--master", master, "--cluster-dir", str(shared.base),
                "--fault", fault, "--host", str(HOST), "--fault-after", str(fault_after), "--after", str(after),
                "--timeout", "120", *extra]
        if checkpoint is not None:
            args += ["--checkpoint", checkpoint]
            if checkpoint.startswith("s3://"):
                with_gateway(env)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                                    start_new_session=True)
        expected = _reference(sc, tmp_path)  # while the cluster and the driver start
        shared.ready()
        # status.json says "ok" before the driver stops its SparkContext, which may wait on a frozen executor.
        deadline = time.monotonic() + DRIVER_TIMEOUT_S
        while not _read_status(str(status_path)).get("ok") and proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"driver not done after {DRIVER_TIMEOUT_S} s\n{_tail(str(log_path))}")
            time.sleep(0.2)
        status = _read_status(str(status_path))
        assert status.get("ok"), f"driver failed (rc={proc.poll()})\n{_tail(str(log_path))}"
    finally:
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
                proc.wait(timeout=30)

    times = list(range(1000, last * 1000 + 1, 1000))
    assert [b["t"] for b in status["batches"]] == times
    assert all(not b["failures"] for b in status["batches"]), status["batches"]
    assert status["fault_executor"] is not None and status["fault_pids"], status
    # spark.dstreams.state.replicas=auto: every state chain (RDD state, window, store handles) on two executors.
    replicas = status["state_replicas"]
    assert len(replicas) == 4 and all(r == [2] for r in replicas.values()), replicas
    assert len(status["task_executor_ids"]) == 3, status["task_executor_ids"]  # tasks ran on all three hosts
    # Both backends ran side by side: the executor-store streams are the store's, the others the RDD state's.
    assert status["store_streams"] == ["reduceByKeyAndWindow", "updateStateByKey"], status["store_streams"]

    got = _read_batches(str(out / "batches.jsonl"))
    assert sorted(got) == sorted((t, n) for t in times for n in NAMES)
    for key in sorted(got):
        assert got[key] == expected[key], f"batch {key[0]} output {key[1]} differs"

    figures = recovery_figures(status["batches"], fault_after)
    print(f"host {fault}: batch that met it {figures['met_ms']} ms, usual {figures['usual_ms']:.0f} ms, extra "
          f"{figures['extra_ms'] / 1000:.1f} s, batches until the usual time returned {figures['batches_to_usual']}; "
          f"executor dropped {status.get('executor_dropped_after_s')} s after the fault; batches (ms) "
          f"{[b['processing_ms'] for b in status['batches']]}; tries {[b['attempts'] for b in status['batches']]}; "
          f"store catch-ups so far {[b['caught_up'] for b in status['batches']]}")
    return status, figures


#: The marks of the two tests: slow fault tests of real processes, bounded.
HOST_FAULT_MARKS = (pytest.mark.slow, pytest.mark.fault,
                    pytest.mark.timeout(CLUSTER_TIMEOUT_S + DRIVER_TIMEOUT_S + 120),
                    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="loopback hosts and /proc"))


@pytest.mark.parametrize("fault", [pytest.param("kill", marks=(*HOST_FAULT_MARKS, pytest.mark.s3, pytest.mark.ceph))])
def test_a_whole_host_killed_with_its_disk_then_replaced_every_batch_matches_a_failure_free_run(
        sc, host_cluster, tmp_path, record_property, fault):
    """Item 2 of issue 42, in one driver: the RDD state and the executor state store side by side, each with the
    running counts (``initialRDD``) and an invertible window, checkpoints and the store's changelog on the Ceph
    gateway. Host 1 is SIGKILLed with its disk folder removed after batch 2, before the first regular checkpoint;
    after the next batch its worker starts again with an empty disk; once its executor registered (waited for after
    batch 5) 2 more batches run. Every output equals the failure-free run's, every batch runs in one try, no task
    fails with a ``StateStoreError`` (the catch-up from the zero time's state with an ``initialRDD``, issue 42), the
    replacement takes tasks, and its joining costs the stores at most :data:`JOIN_CATCH_UPS_BOUND` catch-ups (no
    reload storm)."""
    checkpoint = _ceph_checkpoint()
    # The replacement's worker starts right after the batch that met the loss (its JVMs start while the batches
    # go on: the test's minutes), its executor is waited for after KILL_BATCHES_AFTER batches.
    extra = ["--replace", "--replace-at", str(KILL_AFTER + 1), "--after-join", str(AFTER_JOIN)]
    status, figures = _run_with_fault(sc, host_cluster, tmp_path, fault, KILL_AFTER, KILL_BATCHES_AFTER, extra,
                                      KILL_AFTER + KILL_BATCHES_AFTER + AFTER_JOIN, checkpoint)
    record_property("fault_batch_extra_s", figures["extra_ms"] / 1000)
    record_property("batches_to_usual", figures["batches_to_usual"])
    assert status["disk_removed"], "the host's disk folder is still there"
    assert not any(faults.pid_alive(p) for p in status["fault_pids"])
    assert [b["attempts"] for b in status["batches"]] == [1] * len(status["batches"]), status["batches"]
    # Not even a task try failed bringing a store up to date (Spark would have retried it elsewhere).
    assert status["store_task_errors"] == [], status["store_task_errors"]

    # The replacement host joined, and took work without reloading the stores batch after batch.
    replacement = status["replacement_executor"]
    assert replacement not in status["executors_before"], status
    assert not set(status["replacement_pids"]) & set(status["fault_pids"])
    assert status["executor_tasks"].get(replacement, 0) > 0, status["executor_tasks"]
    joined = [b for b in status["batches"] if b["phase"] == "joined"]
    assert len(joined) == AFTER_JOIN, status["batches"]
    at_join = status["batches"][-AFTER_JOIN - 1]["caught_up"]
    after_join = sum(joined[-1]["caught_up"][k] - at_join.get(k, 0) for k in joined[-1]["caught_up"])
    print(f"replacement executor {replacement} joined {status['replacement_join_s']} s after its worker started; "
          f"tasks per executor {status['executor_tasks']}; store catch-ups after it joined: {after_join}")
    assert after_join <= JOIN_CATCH_UPS_BOUND, f"{after_join} store catch-ups after the replacement joined"

    written = _object_keys(checkpoint)  # the checkpoints and the executors' changelog objects went to Ceph
    assert any(k.startswith("checkpoints/") for k in written), sorted(written)[:20]
    assert any(k.startswith("changelogs/") for k in written), sorted(written)[:20]


@pytest.mark.parametrize("fault", [pytest.param("freeze", marks=HOST_FAULT_MARKS)])
def test_a_frozen_host_is_declared_lost_within_the_bound_and_every_batch_matches(
        sc, host_cluster, tmp_path, record_property, fault):
    status, figures = _run_with_fault(sc, host_cluster, tmp_path, fault, FREEZE_AFTER, FREEZE_BATCHES_AFTER, [],
                                      FREEZE_AFTER + FREEZE_BATCHES_AFTER)
    extra_s = figures["extra_ms"] / 1000
    record_property("fault_batch_extra_s", extra_s)
    assert status["conf"]["spark.network.timeoutInterval"] == "5s", status["conf"]  # dstreams' defaults in force
    dropped = status["executor_dropped_after_s"]
    assert dropped is not None and dropped <= 45, f"the frozen host's executor was dropped after {dropped} s"
    assert extra_s <= FROZEN_BOUND_S, f"the batch that met the frozen host took {extra_s:.0f} s more"


def test_recovery_figures_measure_the_batch_that_met_the_fault_and_the_slow_batches_after_it():
    def run(*ms: int) -> list[dict[str, Any]]:
        return [{"processing_ms": x} for x in ms]

    f = recovery_figures(run(9000, 1000, 1200, 1100, 5000, 2500, 1100, 1000), 4)
    assert (f["usual_ms"], f["met_ms"], f["extra_ms"]) == (1100, 5000, 3900)  # the first batch is left out
    assert f["batches_to_usual"] == 2  # 5000 and 2500 are above 1.5 x 1100 + 500 = 2150; 1100 is not
    assert recovery_figures(run(9000, 1000, 1900, 1000), 2)["batches_to_usual"] == 0  # within the noise
    assert recovery_figures(run(9000, 1000, 4000, 3000), 2)["batches_to_usual"] is None  # never back
    assert recovery_figures(run(3000, 5000), 1)["usual_ms"] == 3000  # one batch before: that one
    for fault_after in (0, 2):
        with pytest.raises(ValueError, match="not inside"):
            recovery_figures(run(1000, 1000), fault_after)
