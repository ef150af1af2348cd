"""The worker daemon (``dstreams.spark.worker_daemon``): a forked worker whose JVM closed the socket exits.

Regression: the daemon's wrapper once turned a ``BrokenPipeError`` into exit code 0, which
pyspark.daemon's forked worker reads as "serve the next task on this socket"; on a closed socket that
failed again at once, so every such worker spun forever at full CPU (a dozen of them slowed a whole
test run). Here the real ``pyspark.daemon.manager`` forks a worker whose task always hits a broken
pipe; the worker process must be gone shortly after the client closes its end.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from dstreams.spark.worker_daemon import PEER_CLOSED, quiet_broken_pipe

DAEMON = """
import pyspark.daemon
from dstreams.spark.worker_daemon import quiet_broken_pipe

def broken(sock, authenticated):
    raise BrokenPipeError("the JVM closed the socket")

pyspark.daemon.worker = quiet_broken_pipe(broken)
pyspark.daemon.manager()
"""


def test_broken_pipe_is_a_non_zero_quiet_exit_code():
    def broken(sock, authenticated):
        raise BrokenPipeError

    assert quiet_broken_pipe(broken)(None, True) == PEER_CLOSED != 0
    assert quiet_broken_pipe(lambda sock, authenticated: 0)(None, True) == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _read_exactly(sock_or_pipe, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock_or_pipe(n - len(data))
        if not chunk:
            raise AssertionError(f"stream closed after {len(data)} of {n} bytes")
        data += chunk
    return data


@pytest.mark.timeout(60)
def test_forked_worker_exits_when_its_socket_is_broken_instead_of_spinning():
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_UNIX_DOMAIN_ENABLED"}
    env.update(SPARK_REUSE_WORKER="1", PYTHON_WORKER_FACTORY_SECRET="unused")
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env)
    try:
        (port,) = struct.unpack("!i", _read_exactly(daemon.stdout.read, 4))
        with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
            (pid,) = struct.unpack("!i", _read_exactly(conn.recv, 4))
            assert pid > 0
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), f"forked worker {pid} still running 20 s after its socket closed (spinning)"
    finally:
        try:
            os.killpg(daemon.pid, signal.SIGKILL)  # the daemon made its own process group
        except ProcessLookupError:
            pass
        daemon.wait(timeout=20)


def test_preload_imports_and_warms_the_named_modules(tmp_path, monkeypatch, capsys):
    (tmp_path / "warm_me.py").write_text("warmed = []\ndef warm_worker():\n    warmed.append(1)\n")
    (tmp_path / "plain_mod.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from dstreams.spark.worker_daemon import preload

    preload("warm_me, plain_mod,,no_such_module_here")
    import plain_mod
    import warm_me

    assert warm_me.warmed == [1] and plain_mod.x == 1
    assert "could not preload no_such_module_here: ModuleNotFoundError" in capsys.readouterr().err


class _Context:
    """What ``request_preload`` uses of a SparkContext: its conf and its Python workers' environment."""

    def __init__(self, daemon_module: str | None) -> None:
        self._conf = {} if daemon_module is None else {"spark.python.daemon.module": daemon_module}
        self.environment: dict[str, str] = {}

    def getConf(self) -> dict[str, str]:  # SparkContext's name
        return self._conf


def test_request_preload_adds_the_module_once_for_dstreams_worker_daemons():
    from dstreams.spark.worker_daemon import DAEMON_MODULE, PRELOAD_ENV, request_preload

    sc = _Context(DAEMON_MODULE)
    assert request_preload(sc, "dstreams.recovery.store.s3") is True
    assert request_preload(sc, "dstreams.recovery.store.s3") is True  # not added twice
    assert request_preload(sc, "json") is True
    assert sc.environment == {PRELOAD_ENV: "dstreams.recovery.store.s3,json"}


@pytest.mark.parametrize("daemon_module", [None, "pyspark.daemon"])
def test_request_preload_leaves_other_worker_daemons_alone(daemon_module):
    from dstreams.spark.worker_daemon import request_preload

    sc = _Context(daemon_module)
    assert request_preload(sc, "dstreams.recovery.store.s3") is False
    assert sc.environment == {}


def test_the_s3_store_warms_a_worker_without_touching_the_network():
    from dstreams.recovery.store import s3

    s3.warm_worker()  # no endpoint is contacted: a client is made, no request sent
    assert s3._data_loader() is s3._data_loader()
