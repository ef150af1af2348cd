"""A Spark standalone cluster on this machine: a master and workers on distinct loopback addresses, as hosts.

Spark launches a speculative copy of a task only on a host other than the original's, so speculation
needs workers with distinct host addresses: this module starts the master on ``127.0.0.1`` (a free port)
and one worker per address of ``worker_hosts`` (default ``127.0.0.2`` and ``127.0.0.3``; :func:`hosts`
gives ``127.0.0.2`` .. ``127.0.0.(n+1)``, ``scripts/cluster.sh`` starts three; 1 core, 1 GiB each), with the
pip pyspark install's own ``bin/spark-class`` (the pip package has no ``sbin/start-*.sh``).

Each worker is a *host* with its own disk folder, :meth:`StandaloneCluster.host_dir` (``base_dir/workerN``),
holding everything its processes write: Spark's local dirs (``SPARK_LOCAL_DIRS``: shuffle files, cached
blocks), the worker dir (``SPARK_WORKER_DIR``: the executors' working folders and logs), ``java.io.tmpdir``
of the worker and of its executors (``JAVA_TOOL_OPTIONS`` in the worker's environment, which the executor
JVMs inherit; an application's own ``-Djava.io.tmpdir`` in ``spark.executor.extraJavaOptions`` wins),
``TMPDIR`` of its Python workers, and the executor state store's folder (``DSTREAMS_STATE_LOCAL_DIR``).
Executors inherit the worker's environment, so every executor of a host uses that host's folders, *unless
the driver names a folder itself*: a driver whose environment or conf sets ``DSTREAMS_STATE_LOCAL_DIR`` /
``spark.dstreams.state.localDir`` passes that path to every task (an absolute path is then shared by all
hosts; a relative one is relative to each executor's working folder, which is on its host), and
``spark.executorEnv.*`` overrides the worker's variables. Leave them unset on the driver to get one store
folder per host.

Faults, by host index ``i`` (0-based, the order of ``worker_hosts``): :meth:`~StandaloneCluster.kill_host`
SIGKILLs the host's processes (the worker JVM, its executor JVMs and their Python daemons and workers, which
PySpark puts in process groups of their own) and removes its disk folder; :meth:`~StandaloneCluster.freeze_host`
/ :meth:`~StandaloneCluster.thaw_host` send SIGSTOP / SIGCONT to the same processes (a long GC pause, a hung
disk or a network partition, as the rest of the cluster sees it). :meth:`StandaloneCluster.attach` gives
another process (a driver) the same handle on a running cluster, from ``base_dir``.

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

    python -m tests.standalone_cluster start --dir DIR [--hosts 3]   # prints MASTER spark://127.0.0.1:PORT
    python -m tests.standalone_cluster stop --dir DIR
    python -m tests.standalone_cluster status|heal --dir DIR   # heal: a killed or frozen host started again
    python -m tests.standalone_cluster kill-host|freeze-host|thaw-host|restart-host I --dir DIR
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
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
MASTER_HOST = "127.0.0.1"
_REGISTERED = "Successfully registered with master"
_STATE_FILE = "cluster.json"
#: Longest ``java.io.tmpdir`` in which PySpark's Unix socket names (``/.<uuid4>.sock``) still fit a socket path
#: (107 bytes on Linux); a longer host tmp folder is given to the JVMs through a short symbolic link.
_MAX_SOCKET_DIR = 107 - len("/.00000000-0000-0000-0000-000000000000.sock")


def hosts(n: int) -> tuple[str, ...]:
    """The addresses of ``n`` worker hosts: ``127.0.0.2`` .. ``127.0.0.(n+1)``."""
    if not 1 <= n <= 250:
        raise ValueError(f"between 1 and 250 hosts, not {n}")
    return tuple(f"127.0.0.{i + 2}" for i in range(n))


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


def port_open(host: str, port: int) -> bool:
    """Whether a TCP connection to ``host:port`` opens (within 0.5 s)."""
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


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a live process. A zombie (exited, not yet reaped) does not count: a daemon
    this process started stays one until :meth:`StandaloneCluster.stop` reaps it, and ``killpg(pgid, 0)`` still
    succeeds on it, so counting it made every stop wait out its whole grace period."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    return any(fields[2] == str(pgid) and fields[0] not in ("Z", "X") for _, fields in _proc_stats())


def _proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of ``/proc/<pid>/stat`` after the command: state, parent pid, process group, ...) of every
    process (Linux ``/proc``)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2:
            yield int(entry), fields


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process (Linux ``/proc``)."""
    return {pid: (int(fields[1]), int(fields[2])) for pid, fields in _proc_stats()}


def process_tree(pgid: int) -> list[int]:
    """Every live process of group ``pgid`` and all their descendants, whatever group those are in (PySpark's
    worker daemon makes a group of its own)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {pid for pid, (_, group) in table.items() if group == pgid}
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _stop_groups(pgids: Sequence[int], grace_s: float = 15.0) -> None:
    """SIGTERM each process group, wait up to ``grace_s`` for all to go, then SIGKILL what is left, and the
    groups' descendants in other groups (Python daemons). Frozen processes are sent SIGCONT first."""
    trees = [pid for pgid in pgids for pid in process_tree(pgid)]
    _signal_all(trees, signal.SIGCONT)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in pgids):
        time.sleep(0.1)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    _signal_all(trees, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_group_alive(g) for g in pgids):
        time.sleep(0.05)


@dataclass
class StandaloneCluster:
    """A standalone master on ``127.0.0.1`` and one worker (a host, see the module doc) per address of
    ``worker_hosts``."""

    base_dir: Path
    worker_hosts: tuple[str, ...] = DEFAULT_WORKER_HOSTS
    cores: int = 1
    memory: str = "1g"
    daemon_memory: str = "256m"
    master_port: int = 0
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _pgids: dict[str, int] = field(default_factory=dict, repr=False)
    #: When each group's leader started: a group id whose leader is a later process is another group (pids are
    #: reused, and a killed host's id stays here until it is healed), never signalled.
    _starts: dict[str, int] = field(default_factory=dict, repr=False)
    _links: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).resolve()
        self.worker_hosts = tuple(self.worker_hosts)

    @classmethod
    def attach(cls, base_dir: str | Path) -> StandaloneCluster:
        """A handle on the cluster another process started in ``base_dir`` (for :meth:`kill_host` and the
        like, and :meth:`stop`). Raises ``FileNotFoundError`` when no cluster state is there."""
        base = Path(base_dir).resolve()
        state = json.loads((base / _STATE_FILE).read_text())
        port = int(state["master_url"].rsplit(":", 1)[1])
        cluster = cls(base, tuple(state.get("worker_hosts", ())), master_port=port)
        cluster._pgids = {k: int(v) for k, v in state["pgids"].items()}
        cluster._starts = {k: int(v) for k, v in state.get("starts", {}).items()}
        cluster._links = list(state.get("links", []))
        return cluster

    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    @staticmethod
    def _name(i: int) -> str:
        return f"worker{i + 1}"

    def host_dir(self, i: int) -> Path:
        """The disk folder of host ``i`` (0-based): ``local/`` (Spark's local dirs), ``work/`` (the worker dir),
        ``tmp/`` (``java.io.tmpdir``, ``TMPDIR``), ``state/`` (the executor state stores)."""
        if not 0 <= i < len(self.worker_hosts):
            raise IndexError(f"no host {i}: the cluster has hosts 0..{len(self.worker_hosts) - 1}")
        return self.base_dir / self._name(i)

    def _short_tmp(self, tmp: Path) -> str:
        """``tmp``, or a short symbolic link to it when it is too long for Unix socket paths."""
        if len(str(tmp)) <= _MAX_SOCKET_DIR:
            return str(tmp)
        holder = tempfile.mkdtemp(prefix="dsc-")
        link = os.path.join(holder, "t")
        os.symlink(tmp, link)
        self._links.append(holder)
        return link

    def _env(self, host: str, folder: Path, executors: bool) -> dict[str, str]:
        tmp, local = folder / "tmp", folder / "local"
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
        if executors:  # inherited by the worker's executor JVMs and their Python workers
            state = folder / "state"
            state.mkdir(exist_ok=True)
            env.update(JAVA_TOOL_OPTIONS=f"-Djava.io.tmpdir={self._short_tmp(tmp)}", TMPDIR=str(tmp),
                       DSTREAMS_STATE_LOCAL_DIR=str(state))
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = self.base_dir / f"{name}.log"
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        with open(log, "ab") as out:
            proc = subprocess.Popen([spark_class, *argv], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(self.base_dir), start_new_session=True)
        self._procs[name] = proc
        self._pgids[name] = proc.pid  # a new session: its pid is its process group id
        start = _start_time(proc.pid)
        if start is not None:
            self._starts[name] = start
        self._save_state()

    def _save_state(self) -> None:
        state = {"master_url": self.master_url, "pgids": self._pgids, "starts": self._starts,
                 "worker_hosts": list(self.worker_hosts),
                 "links": self._links}
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

    def _start_worker(self, i: int) -> None:
        name, folder = self._name(i), self.host_dir(i)
        work = folder / "work"
        work.mkdir(parents=True, exist_ok=True)
        env = self._env(self.worker_hosts[i], folder, executors=True)
        env["SPARK_WORKER_DIR"] = str(work)
        self._spawn(name, ["org.apache.spark.deploy.worker.Worker", "--host", self.worker_hosts[i], "--port", "0",
                           "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
                           "--work-dir", str(work), self.master_url], env)

    def _registrations(self, i: int) -> int:
        return _tail(self.base_dir / f"{self._name(i)}.log", 1_000_000).count(_REGISTERED)

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
                        self._env(MASTER_HOST, self.base_dir / "master", executors=False))
            while not port_open(MASTER_HOST, self.master_port):
                self._check_running()
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"master not listening after {timeout} s\n{self.logs()}")
                time.sleep(0.1)
            for i in range(len(self.worker_hosts)):
                self._start_worker(i)
            while not all(self._registrations(i) for i in range(len(self.worker_hosts))):
                self._check_running()
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"workers not registered after {timeout} s\n{self.logs()}")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def host_pids(self, i: int) -> list[int]:
        """The live processes of host ``i``: its worker JVM, executor JVMs, their Python daemons and workers."""
        pgid = self._group(self._name(i))
        return process_tree(pgid) if pgid is not None else []

    def _group(self, name: str) -> int | None:
        """The process group of daemon ``name``, None when there is none or its id now belongs to another group (its
        leader a process started later than the one this cluster started)."""
        pgid = self._pgids.get(name)
        if pgid is None:
            return None
        start, recorded = _start_time(pgid), self._starts.get(name)
        return None if start is not None and recorded is not None and start != recorded else pgid

    def host_state(self, i: int) -> str:
        """``"running"``, ``"frozen"`` (every process of host ``i`` stopped, :meth:`freeze_host`) or ``"gone"`` (no
        process: :meth:`kill_host`, or never started)."""
        pids = self.host_pids(i)
        return "gone" if not pids else "frozen" if all(_frozen(p) for p in pids) else "running"

    def heal(self, timeout: float = 60.0) -> list[int]:
        """Bring every host back to running, for the next user of a shared cluster: a frozen host is killed with its
        disk (a frozen worker may have been dropped by the master meanwhile), then it and every gone host start
        again with an empty disk folder (:meth:`restart_host`). Returns the hosts started again."""
        healed = []
        for i in range(len(self.worker_hosts)):
            state = self.host_state(i)
            if state == "running":
                continue
            if state == "frozen":
                self.kill_host(i, remove_disk=True)
            self._pgids.pop(self._name(i), None)  # a gone host's stale group
            self._starts.pop(self._name(i), None)
            self.restart_host(i, timeout)
            healed.append(i)
        return healed

    def kill_host(self, i: int, remove_disk: bool = True, timeout: float = 10.0) -> list[int]:
        """SIGKILL every process of host ``i`` (see :meth:`host_pids`), wait (at most ``timeout``) until they are
        gone, then (``remove_disk``) delete its disk folder. Returns the pids killed."""
        folder = self.host_dir(i)
        pids = self.host_pids(i)
        _signal_all(pids, signal.SIGKILL)
        proc = self._procs.pop(self._name(i), None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while any(_pid_alive(p) for p in pids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"host {i}: processes {[p for p in pids if _pid_alive(p)]} alive {timeout} s "
                                   "after SIGKILL")
            time.sleep(0.05)
        self._pgids.pop(self._name(i), None)
        self._save_state()
        if remove_disk:
            shutil.rmtree(folder, ignore_errors=True)
        return pids

    def freeze_host(self, i: int) -> list[int]:
        """SIGSTOP every process of host ``i``; returns the pids stopped. :meth:`thaw_host` resumes them."""
        pids = self.host_pids(i)
        _signal_all(pids, signal.SIGSTOP)
        return pids

    def thaw_host(self, i: int) -> list[int]:
        """SIGCONT every process of host ``i``; returns the pids resumed."""
        pids = self.host_pids(i)
        _signal_all(pids, signal.SIGCONT)
        return pids

    def restart_host(self, i: int, timeout: float = 60.0) -> None:
        """Start host ``i``'s worker again (after :meth:`kill_host`), with a fresh disk folder where it was
        removed; returns once it registered with the master (else :class:`ClusterStartError` after ``timeout``).
        Raises ``RuntimeError`` when the host is running. From a handle of :meth:`attach` too: the new worker's
        process group goes into ``base_dir``'s state, so :func:`stop_from_dir` stops it."""
        if self._name(i) in self._pgids:
            raise RuntimeError(f"host {i} is running")
        before = self._registrations(i)
        self._start_worker(i)
        deadline = time.monotonic() + timeout
        while self._registrations(i) <= before:
            self._check_running()
            if time.monotonic() > deadline:
                raise ClusterStartError(f"host {i} not registered after {timeout} s\n{self.logs()}")
            time.sleep(0.1)

    def stop(self, grace_s: float = 15.0) -> list[int]:
        """Stop every daemon of the cluster, their executors and Python workers (frozen ones too). Idempotent.
        Returns the process groups signalled."""
        # workers first, then the master; a group id reused by another process group is left alone
        pgids = [g for n in reversed(list(self._pgids)) if (g := self._group(n)) is not None]
        _stop_groups(pgids, grace_s)
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()
        self._pgids.clear()
        for holder in self._links:
            shutil.rmtree(holder, ignore_errors=True)
        self._links.clear()
        with contextlib.suppress(OSError):
            (self.base_dir / _STATE_FILE).unlink()
        return pgids

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_from_dir(base_dir: str | Path, grace_s: float = 15.0) -> list[int]:
    """Stop a cluster started by another process with ``base_dir``; returns the process groups signalled."""
    try:
        cluster = StandaloneCluster.attach(base_dir)
    except (OSError, ValueError, KeyError):
        return []
    return cluster.stop(grace_s)


def _frozen(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _status(base_dir: Path) -> int:
    try:
        cluster = StandaloneCluster.attach(base_dir)
    except (OSError, ValueError, KeyError):
        print("no cluster state in", base_dir)
        return 1
    print(f"MASTER {cluster.master_url}")
    ok = _group_alive(cluster._pgids.get("master", -1))
    print(f"master: {'running' if ok else 'gone'}")
    for i, host in enumerate(cluster.worker_hosts):
        pids = cluster.host_pids(i)
        state = cluster.host_state(i)
        ok = ok and state == "running"
        print(f"host {i} ({cluster._name(i)}, {host}): {state}, {len(pids)} processes, disk {cluster.host_dir(i)}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Start/stop a Spark standalone cluster on loopback addresses.")
    p.add_argument("command", choices=["start", "stop", "status", "heal", "kill-host", "freeze-host", "thaw-host",
                                       "restart-host"])
    p.add_argument("host", nargs="?", type=int,
                   help="the host's index (0-based) for kill-host/freeze-host/thaw-host/restart-host")
    p.add_argument("--dir", default=".standalone", help="state, logs and scratch space (default: .standalone)")
    p.add_argument("--hosts", type=int, default=3, help="number of worker hosts, 127.0.0.2 .. (default: 3)")
    p.add_argument("--workers", help="worker addresses, comma-separated (instead of --hosts)")
    p.add_argument("--keep-disk", action="store_true", help="kill-host: keep the host's disk folder")
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
    if args.command == "heal":
        try:
            cluster = StandaloneCluster.attach(base)
        except (OSError, ValueError, KeyError):
            print(f"no cluster state in {base}", file=sys.stderr)
            return 1
        try:
            healed = cluster.heal(args.timeout)
        except (ClusterStartError, TimeoutError) as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return 2
        print(f"started again: hosts {healed}" if healed else "every host running")
        return 0
    if args.command != "start":
        if args.host is None:
            p.error(f"{args.command} needs the host's index")
        try:
            cluster = StandaloneCluster.attach(base)
        except (OSError, ValueError, KeyError):
            print(f"no cluster state in {base}", file=sys.stderr)
            return 1
        if args.command == "kill-host":
            pids = cluster.kill_host(args.host, remove_disk=not args.keep_disk)
        elif args.command == "restart-host":
            try:
                cluster.restart_host(args.host, args.timeout)
            except (RuntimeError, IndexError) as e:
                print(f"ERROR: {e}", file=sys.stderr)
                return 1
            pids = cluster.host_pids(args.host)
        else:
            pids = (cluster.freeze_host if args.command == "freeze-host" else cluster.thaw_host)(args.host)
        print(f"{args.command} {args.host}: {len(pids)} processes {pids}")
        return 0
    if (base / _STATE_FILE).exists():
        print(f"a cluster state exists in {base}; stop it first", file=sys.stderr)
        return 1
    workers = (tuple(h.strip() for h in args.workers.split(",") if h.strip()) if args.workers
               else hosts(args.hosts))
    cluster = StandaloneCluster(base, workers, args.cores, args.memory, master_port=args.port)
    t0 = time.monotonic()
    try:
        cluster.start(args.timeout)
    except (ClusterUnavailableError, ClusterStartError) as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print(f"MASTER {cluster.master_url}")
    print(f"{len(workers)} workers registered in {time.monotonic() - t0:.1f} s; logs in {base}")
    for i, host in enumerate(workers):
        print(f"host {i}: {host}, disk {cluster.host_dir(i)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
