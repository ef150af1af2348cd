"""A Spark standalone cluster on this machine: a master and workers on distinct loopback addresses.

Spark launches a speculative copy of a task only on a host other than the original's, so speculation
needs workers with distinct host addresses: this module starts the master on ``127.0.0.1`` (a free port)
and one worker per address of ``worker_hosts`` (default ``127.0.0.2`` and ``127.0.0.3``, 1 core, 1 GiB
each), with the pip pyspark install's own ``bin/spark-class`` (the pip package has no ``sbin/start-*.sh``).

Contract of :class:`StandaloneCluster`:

* :meth:`~StandaloneCluster.start` returns once every worker has registered with the master, or raises
  :class:`ClusterUnavailableError` (environmental: a worker address cannot be bound, no Java) /
  :class:`ClusterStartError` (anything else, with the daemons' log tails) after stopping whatever it
  started. Every wait is bounded by ``timeout``.
* :meth:`~StandaloneCluster.stop` ends every process it started (each daemon runs in its own process
  group, and a worker's executors are in the worker's group): SIGTERM, then SIGKILL after a grace period.
  Idempotent. Pid files under ``base_dir`` let another process stop the cluster (:func:`stop_from_dir`).
* All scratch space (logs, worker and executor directories, ``java.io.tmpdir``) is under ``base_dir``.

As a script (``scripts/cluster.sh`` calls it)::

    python -m tests.standalone_cluster start --dir DIR   # prints MASTER spark://127.0.0.1:PORT
    python -m tests.standalone_cluster stop --dir DIR
    python -m tests.standalone_cluster status --dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
MASTER_HOST = "127.0.0.1"
_REGISTERED = "Successfully registered with master"
_STATE_FILE = "cluster.json"


class ClusterUnavailableError(RuntimeError):
    """The environment cannot host the cluster (e.g. loopback addresses not bindable, no Java)."""


class ClusterStartError(RuntimeError):
    """The cluster's daemons did not come up; the message carries their log tails."""


def spark_home() -> str:
    """``SPARK_HOME`` if set, else the folder of the installed ``pyspark`` package (it has ``bin/``)."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return env
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def unbindable_hosts(hosts: Sequence[str]) -> list[str]:
    """The addresses of ``hosts`` that a TCP socket cannot bind here (e.g. 127.0.0.2 on macOS)."""
    bad = []
    for host in hosts:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
        except OSError:
            bad.append(host)
    return bad


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now (the usual small race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_groups(pgids: Sequence[int], grace_s: float = 15.0) -> None:
    """SIGTERM each process group, wait up to ``grace_s`` for all to go, then SIGKILL what is left."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in pgids):
        time.sleep(0.1)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_group_alive(g) for g in pgids):
        time.sleep(0.05)


@dataclass
class StandaloneCluster:
    """A standalone master on ``127.0.0.1`` and one worker per address of ``worker_hosts``."""

    base_dir: Path
    worker_hosts: tuple[str, ...] = DEFAULT_WORKER_HOSTS
    cores: int = 1
    memory: str = "1g"
    daemon_memory: str = "256m"
    master_port: int = 0
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _pgids: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).resolve()

    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    def _env(self, host: str, name: str) -> dict[str, str]:
        tmp = self.base_dir / name / "tmp"
        local = self.base_dir / name / "local"
        tmp.mkdir(parents=True, exist_ok=True)
        local.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            SPARK_HOME=spark_home(),
            SPARK_LOCAL_IP=host,
            SPARK_LOCAL_DIRS=str(local),  # the worker's and its executors' scratch space
            SPARK_LOG_DIR=str(self.base_dir / "logs"),
            SPARK_PID_DIR=str(self.base_dir),
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_DAEMON_JAVA_OPTS=f"-Djava.io.tmpdir={tmp}",
            PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
        )
        env.pop("SPARK_CONF_DIR", None)
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = self.base_dir / f"{name}.log"
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        with open(log, "wb") as out:
            proc = subprocess.Popen([spark_class, *argv], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(self.base_dir), start_new_session=True)
        self._procs[name] = proc
        self._pgids[name] = proc.pid  # a new session: its pid is its process group id
        self._save_state()

    def _save_state(self) -> None:
        state = {"master_url": self.master_url, "pgids": self._pgids}
        tmp = self.base_dir / (_STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.base_dir / _STATE_FILE)

    def logs(self) -> str:
        """The tail of every daemon's log, for error messages."""
        return "\n".join(f"--- {name}.log\n{_tail(self.base_dir / f'{name}.log')}" for name in self._pgids)

    def _check_running(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise ClusterStartError(f"{name} exited with code {proc.returncode}\n{self.logs()}")

    def start(self, timeout: float = 60.0) -> StandaloneCluster:
        """Start the master and the workers; return when every worker is registered (see module doc)."""
        if not sys.platform.startswith("linux"):
            raise ClusterUnavailableError(f"the standalone test cluster needs Linux (loopback 127.0.0.0/8), not "
                                     f"{sys.platform}")
        bad = unbindable_hosts((MASTER_HOST, *self.worker_hosts))
        if bad:
            raise ClusterUnavailableError(f"cannot bind loopback address(es) {', '.join(bad)} here: the workers need "
                                     "distinct host addresses (Linux routes all of 127.0.0.0/8 to lo)")
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise ClusterUnavailableError("no Java runtime (java not on PATH, JAVA_HOME unset)")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "logs").mkdir(exist_ok=True)
        deadline = time.monotonic() + timeout
        try:
            if not self.master_port:
                self.master_port = free_port(MASTER_HOST)
            self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", MASTER_HOST,
                                   "--port", str(self.master_port), "--webui-port", "0"],
                        self._env(MASTER_HOST, "master"))
            while not _port_open(MASTER_HOST, self.master_port):
                self._check_running()
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"master not listening after {timeout} s\n{self.logs()}")
                time.sleep(0.1)
            for i, host in enumerate(self.worker_hosts):
                name = f"worker{i + 1}"
                work = self.base_dir / name / "work"
                work.mkdir(parents=True, exist_ok=True)
                env = self._env(host, name)
                env["SPARK_WORKER_DIR"] = str(work)
                self._spawn(name, ["org.apache.spark.deploy.worker.Worker", "--host", host, "--port", "0",
                                   "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
                                   "--work-dir", str(work), self.master_url], env)
            workers = [f"worker{i + 1}" for i in range(len(self.worker_hosts))]
            while not all(_REGISTERED in _tail(self.base_dir / f"{w}.log", 200_000) for w in workers):
                self._check_running()
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"workers not registered after {timeout} s\n{self.logs()}")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop every daemon this object started, and their executors (process groups). Idempotent."""
        pgids = [self._pgids[n] for n in reversed(list(self._pgids))]  # workers first, then the master
        _stop_groups(pgids, grace_s)
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()
        self._pgids.clear()
        with contextlib.suppress(OSError):
            (self.base_dir / _STATE_FILE).unlink()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_from_dir(base_dir: str | Path, grace_s: float = 15.0) -> list[int]:
    """Stop a cluster started by another process with ``base_dir``; returns the process groups signalled."""
    path = Path(base_dir) / _STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    pgids = [int(p) for p in reversed(list(state.get("pgids", {}).values()))]
    _stop_groups(pgids, grace_s)
    with contextlib.suppress(OSError):
        path.unlink()
    return pgids


def _status(base_dir: Path) -> int:
    try:
        state = json.loads((base_dir / _STATE_FILE).read_text())
    except (OSError, ValueError):
        print("no cluster state in", base_dir)
        return 1
    alive = {n: _group_alive(p) for n, p in state["pgids"].items()}
    print(f"MASTER {state['master_url']}")
    for name, ok in alive.items():
        print(f"{name}: {'running' if ok else 'gone'}")
    return 0 if all(alive.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Start/stop a Spark standalone cluster on loopback addresses.")
    p.add_argument("command", choices=["start", "stop", "status"])
    p.add_argument("--dir", default=".standalone", help="state, logs and scratch space (default: .standalone)")
    p.add_argument("--workers", default=",".join(DEFAULT_WORKER_HOSTS), help="worker addresses, comma-separated")
    p.add_argument("--port", type=int, default=7077, help="master port (0: any free port)")
    p.add_argument("--cores", type=int, default=1)
    p.add_argument("--memory", default="1g", help="memory each worker offers to executors")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    base = Path(args.dir).resolve()
    if args.command == "stop":
        stopped = stop_from_dir(base)
        print(f"stopped {len(stopped)} process group(s)" if stopped else f"no cluster state in {base}")
        return 0
    if args.command == "status":
        return _status(base)
    if (base / _STATE_FILE).exists():
        print(f"a cluster state exists in {base}; stop it first", file=sys.stderr)
        return 1
    hosts = tuple(h.strip() for h in args.workers.split(",") if h.strip())
    cluster = StandaloneCluster(base, hosts, args.cores, args.memory, master_port=args.port)
    t0 = time.monotonic()
    try:
        cluster.start(args.timeout)
    except (ClusterUnavailableError, ClusterStartError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print(f"MASTER {cluster.master_url}")
    print(f"{len(hosts)} workers registered in {time.monotonic() - t0:.1f} s; logs in {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
