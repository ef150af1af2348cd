"""The three-host standalone cluster that the cluster fault tests share (issue 42): :class:`SharedCluster`.

One Spark standalone master and three workers on 127.0.0.2-.4 (:mod:`tests.standalone_cluster`), each worker a host
with its own disk folder, started lazily in the background by the first test of a module that asks
(:meth:`SharedCluster.master_listening`) and stopped when that module ends: the ``host_cluster`` fixture of
``tests/fault/conftest.py`` (module scope, so no JVM stays idle through modules that do not use it). Used by
``test_host_faults.py`` (a host killed or frozen) and ``test_zombie_sink.py`` (a zombie driver on the cluster).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

from ..standalone_cluster import (
    MASTER_HOST,
    ClusterUnavailableError,
    StandaloneCluster,
    free_port,
    hosts,
    port_open,
    stop_from_dir,
)
from ..support import service_unavailable

#: The bound of the cluster's start (and of a host's restart). Measured at a load average of 30-75: the master and
#: workers up after more than 90 s.
CLUSTER_TIMEOUT_S = 180


class SharedCluster:
    """A module's three-host cluster (hosts 127.0.0.2-.4, a master on a port known before it starts), started once
    in the background by the first test that asks (:meth:`master_listening`) so that its driver starts while the
    workers do, stopped by :meth:`close`. Each test finds every host running (:meth:`ready`): a host a test
    left killed or frozen is started again with an empty disk (:meth:`StandaloneCluster.heal`)."""

    def __init__(self) -> None:
        # A short folder: the executors' java.io.tmpdir holds PySpark's Unix sockets (a path of at most 107 bytes).
        self.base = Path(tempfile.mkdtemp(prefix="dsh-"))
        self.cluster = StandaloneCluster(self.base, hosts(3), master_port=free_port(MASTER_HOST))
        self.errors: list[BaseException] = []
        self._starter: threading.Thread | None = None

    def _start(self) -> None:
        try:
            self.cluster.start(CLUSTER_TIMEOUT_S)
        except BaseException as e:  # noqa: BLE001 - re-raised by master_listening / ready
            self.errors.append(e)

    def _raise(self) -> None:
        if self.errors and isinstance(self.errors[0], ClusterUnavailableError):
            service_unavailable(f"no standalone Spark cluster here: {self.errors[0]}")
        if self.errors:
            raise self.errors[0]

    def master_listening(self) -> str:
        """Start the cluster (the first call), wait until its master listens; its URL. A cluster a test already
        had is healed first (:meth:`StandaloneCluster.heal`)."""
        if self._starter is None:
            self._starter = threading.Thread(target=self._start, name="host-cluster-start", daemon=True)
            self._starter.start()
        elif not self._starter.is_alive() and not self.errors:
            StandaloneCluster.attach(self.base).heal(CLUSTER_TIMEOUT_S)
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not self.errors and not port_open(MASTER_HOST, self.cluster.master_port):
            if time.monotonic() > deadline:
                raise AssertionError(f"master not listening after {CLUSTER_TIMEOUT_S} s\n{self.cluster.logs()}")
            time.sleep(0.2)
        self._raise()
        return self.cluster.master_url

    def ready(self) -> None:
        """Wait until every worker registered (the first start)."""
        assert self._starter is not None, "master_listening first"
        self._starter.join(CLUSTER_TIMEOUT_S + 30)
        self._raise()
        assert not self._starter.is_alive(), "cluster start did not return"

    def close(self) -> None:
        if self._starter is not None:
            self._starter.join(CLUSTER_TIMEOUT_S + 30)
        stop_from_dir(self.base, grace_s=5)  # as the drivers left it: a worker a driver started again is there
        self.cluster.stop(grace_s=5)
        shutil.rmtree(self.base, ignore_errors=True)
