"""Test side of :mod:`tests.fault.elastic_app`: start the cluster, run the driver, and read what it left.

:func:`run_on_cluster` starts a standalone cluster on the given worker addresses (:mod:`tests.standalone_cluster`; a
short folder, for PySpark's Unix socket paths), computes the failure-free reference on the session's ``local[2]``
context meanwhile, runs the driver with a bounded wait, and before it removes the cluster's folder reads every
host's state stores (:class:`HostStore`), the newest checkpoint's state and the changelog objects. Everything it
starts it stops, also when an assertion fails.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstreams import ManualClock

from ..standalone_cluster import (
    MASTER_HOST,
    ClusterUnavailableError,
    StandaloneCluster,
    free_port,
    port_open,
    stop_from_dir,
)
from ..support import service_unavailable
from .elastic_app import build

APP = os.path.join(os.path.dirname(__file__), "elastic_app.py")
CLUSTER_TIMEOUT_S = 180  # a master and 3-4 workers: 60-80 s at a load average of 15-30
DRIVER_TIMEOUT_S = 600  # at a load average of 55-78 the driver was still on batch 6 after 300 s
#: Variables of the test's environment that must not reach the driver (its executors get the hosts' folders).
_DRIVER_ENV_DROP = ("DSTREAMS_STATE_LOCAL_DIR", "SPARK_LOCAL_DIRS", "DSTREAMS_STATE_STORE", "DSTREAMS_STATE_CHANGELOG",
                    "DSTREAMS_FAULT_SLOW_EXECUTOR", "DSTREAMS_FAULT_KILL")

#: batch ms -> partition -> word -> count: the state after each batch, as the sink got it.
States = dict[int, dict[int, dict[str, int]]]


@dataclass
class HostStore:
    """One state store file on one host after the run: its version, run token and state."""

    host: int
    partition: int
    version: int | None
    run: str | None
    state: dict[str, int]


@dataclass
class ClusterRun:
    """What a driver run left: its status, its outputs, the reference, and the state as the hosts, the newest
    checkpoint and the changelog hold it."""

    status: dict[str, Any]
    outputs: States
    reference: States
    attempts: list[dict[str, Any]]
    stores: list[HostStore] = field(default_factory=list)
    checkpoint_ms: int | None = None
    checkpoint_state: dict[int, dict[str, int]] = field(default_factory=dict)
    #: (version, partition) -> (run token of the object, its entries)
    changelog: dict[tuple[int, int], tuple[str, dict[str, int | None]]] = field(default_factory=dict)
    changelog_runs: set[str] = field(default_factory=set)


def states_of(batches: list[tuple[int, list[Any]]]) -> States:
    """Per batch, the ``(partition, word, count)`` rows as partition -> word -> count."""
    out: States = {}
    for t, rows in batches:
        parts: dict[int, dict[str, int]] = {}
        for p, w, c in rows:
            parts.setdefault(int(p), {})[w] = c
        out[t] = parts
    return out


def reference(sc: Any, folder: Path, batches: int) -> States:
    """Failure-free outputs of :func:`tests.fault.elastic_app.build` on the session's ``local[2]`` context (RDD
    state)."""
    got: list[tuple[int, list[Any]]] = []
    lock = threading.Lock()

    def sink(name: str, t: int, rows: list[Any]) -> None:
        with lock:
            got.append((t, json.loads(json.dumps(rows))))

    clock = ManualClock(0)
    saved = os.environ.get("DSTREAMS_CHECKPOINT_GRAPH")
    os.environ["DSTREAMS_CHECKPOINT_GRAPH"] = "off"  # the sink holds a lock: the graph is not stored (as the driver's)
    try:
        ssc = build(sc, clock, sink, str(folder / "ref-checkpoint"))
        ssc.start()
    finally:
        if saved is None:
            os.environ.pop("DSTREAMS_CHECKPOINT_GRAPH", None)
        else:
            os.environ["DSTREAMS_CHECKPOINT_GRAPH"] = saved
    try:
        for t in range(1000, batches * 1000 + 1, 1000):
            clock.set_time(t)
            ssc.awaitBatch(t, 120)
    finally:
        ssc.stop(stopSparkContext=False)
    return states_of(got)


def _tail(path: Path, n: int = 6000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _host_stores(base: Path, store_id: str) -> list[HostStore]:
    """Every state store file on every host folder (``workerN``: host N-1) of the cluster in ``base``, also of a host
    the driver added."""
    from dstreams.statestore import PartitionStore

    found = []
    for worker in sorted(base.glob("worker*")):
        folder = worker / "state" / store_id
        if not worker.name[6:].isdigit() or not folder.is_dir():
            continue
        for name in sorted(os.listdir(folder)):
            if not (name.startswith("p-") and name.endswith(".sqlite")):
                continue
            store = PartitionStore(str(folder / name))
            try:
                state = {pickle.loads(k): pickle.loads(v) for k, v in store.items()}
                found.append(HostStore(int(worker.name[6:]) - 1, int(name[2:7]), store.version, store.run, state))
            finally:
                store.close()
    return found


def _read_checkpoint_and_changelog(run: ClusterRun, checkpoint: Path) -> None:
    from dstreams.recovery.changelog import StoreChangelog
    from dstreams.recovery.checkpoint_files import list_checkpoints, load_manifest, read_state_partition, state_layers
    from dstreams.recovery.storespec import StoreSpec

    key = run.status["node_key"]
    spec = StoreSpec(str(checkpoint))
    store = spec.open()
    times = sorted(list_checkpoints(store, key))
    if times:
        run.checkpoint_ms = times[-1]
        layers = state_layers(store, load_manifest(store, key, times[-1]))
        for p in range(len(layers[-1][1])):
            run.checkpoint_state[p] = {pickle.loads(k): pickle.loads(v)
                                       for k, v in read_state_partition(spec, layers, p)}
    changelog = StoreChangelog(spec, key)
    root = f"changelogs/{key}/"
    for name in store.list(root):
        version, _, obj = name[len(root):].partition("/")
        token, _, part = obj.rpartition("-p")
        run.changelog_runs.add(token)
        entries = changelog.read(token, int(version), int(part))
        run.changelog[(int(version), int(part))] = (
            token, {pickle.loads(k): None if v is None else pickle.loads(v) for k, v in entries})


def run_on_cluster(sc: Any, tmp_path: Path, worker_hosts: tuple[str, ...], args: list[str],
                   batches: int) -> ClusterRun:
    """Start a cluster on ``worker_hosts``, run :mod:`tests.fault.elastic_app` with ``args`` for ``batches`` batches
    (the driver starts as soon as the master listens), read what it left (module doc) and stop everything, also a
    worker the driver started."""
    base = Path(tempfile.mkdtemp(prefix="dse-"))  # short: PySpark's Unix socket paths live in the hosts' tmp
    cluster = StandaloneCluster(base, worker_hosts, master_port=free_port(MASTER_HOST))
    errors: list[BaseException] = []
    ready = threading.Event()

    def start() -> None:
        try:
            cluster.start(CLUSTER_TIMEOUT_S)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
        finally:
            ready.set()

    starter = threading.Thread(target=start, name="elastic-cluster-start", daemon=True)
    starter.start()
    proc: subprocess.Popen[bytes] | None = None
    out, log_path = tmp_path / "driver", tmp_path / "driver.log"
    attempts_path = tmp_path / "attempts.jsonl"
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

        def start_driver() -> subprocess.Popen[bytes]:
            env = {k: v for k, v in os.environ.items() if k not in _DRIVER_ENV_DROP}
            env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
            argv = [sys.executable, APP, str(out), "--master", cluster.master_url, "--cluster-dir", str(base),
                    "--batches", str(batches), "--attempts-file", str(attempts_path), "--timeout", "120", *args]
            with open(log_path, "wb") as log:
                return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                                        start_new_session=True)

        proc = start_driver()
        expected = reference(sc, tmp_path, batches)  # while the cluster and the driver start
        assert ready.wait(CLUSTER_TIMEOUT_S + 30), "cluster start did not return"
        if errors:
            raise errors[0]
        try:
            rc = proc.wait(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"driver not done after {DRIVER_TIMEOUT_S} s\n{_tail(log_path)}") from None
        status = _read_json(out / "status.json")
        assert rc == 0 and status.get("ok"), f"driver failed (rc={rc})\n{_tail(log_path)}"
        batches_got = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines() if line]
        attempts = [json.loads(line) for line in attempts_path.read_text().splitlines() if line] \
            if attempts_path.exists() else []
        run = ClusterRun(status, states_of([(b["t"], b["rows"]) for b in batches_got]), expected, attempts)
        run.stores = _host_stores(base, status["store_id"])
        _read_checkpoint_and_changelog(run, out / "checkpoint")
        return run
    finally:
        starter.join(CLUSTER_TIMEOUT_S + 30)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
            proc.wait(timeout=30)
        stop_from_dir(base, grace_s=5)  # as the driver left it: a worker it started again is there
        cluster.stop(grace_s=5)
        shutil.rmtree(base, ignore_errors=True)


def assert_one_history(run: ClusterRun) -> None:
    """The outputs equal the reference batch by batch (keys in the same partitions); every host's store of every
    partition is at a batch of this run and holds the reference's state at it (or, opened by an attempt that never
    committed, holds no version and nothing); the newest checkpoint's state is the
    reference's at its time; every changelog object is this run's and holds exactly the reference's change of its
    batch and partition (a losing attempt wrote nothing else), and every batch after the newest checkpoint has
    one per partition."""
    times = sorted(run.reference)
    assert sorted(run.outputs) == times, sorted(run.outputs)
    for t in times:
        assert run.outputs[t] == run.reference[t], f"batch {t}: the state output differs"
    assert any(s.version is not None for s in run.stores), "no state store on any host"
    for s in run.stores:
        if s.version is None:  # opened by an attempt that never committed (killed or lost the race in a catch-up)
            assert s.state == {} and s.run is None, (s.host, s.partition, s.run)
            continue
        assert s.run == run.status["run"] and s.version in run.reference, (s.host, s.partition, s.version, s.run)
        assert s.state == run.reference[s.version].get(s.partition, {}), (s.host, s.partition, s.version)
    assert run.checkpoint_ms is not None, "no committed checkpoint"
    assert run.checkpoint_state == {p: run.reference[run.checkpoint_ms].get(p, {})
                                    for p in run.checkpoint_state}, run.checkpoint_ms
    assert run.changelog_runs == {run.status["run"]}, run.changelog_runs
    for (v, p), (_, entries) in run.changelog.items():
        before = run.reference.get(v - 1000, {}).get(p, {})
        after = run.reference[v].get(p, {})
        assert entries == {k: c for k, c in after.items() if before.get(k) != c}, (v, p)
    parts = {p for t in times for p in run.reference[t]}
    for v in range(run.checkpoint_ms + 1000, times[-1] + 1000, 1000):
        assert all((v, p) in run.changelog for p in parts), (v, sorted(run.changelog))
