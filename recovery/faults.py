"""Fault injection for tests and benchmarks; off unless asked for through the environment.

``DSTREAMS_FAULT_KILL=<point>`` with ``DSTREAMS_FAULT_KILL_AFTER=<n>`` (default 1) makes the driver
kill itself with SIGKILL the n-th time it reaches ``<point>``:

* ``mid-batch`` – a batch's first output operation has started (its Spark jobs may be running);
* ``checkpoint-write`` – a data checkpoint's parts are written but its manifest is not;
* ``after-metadata-commit`` – right after a conditional write of the metadata head;
* ``sink-write`` – an exactly-once sink found its batch not committed and is about to write it (its fence
  check passed: the next step may overwrite or delete; :mod:`dstreams.files.sink`);
* ``redis-sink-chunk`` – ``saveToRedisStream`` added a chunk of a batch's entries (:mod:`dstreams.redis.sink`): with
  ``_AFTER=n``, a kill with the batch's first n chunks in the stream and the rest not;
* ``postgres-sink-commit`` – ``saveToPostgres`` staged a batch and is inside its commit transaction, before the
  rows are moved (:mod:`dstreams.postgres.sink`).

``DSTREAMS_FAULT_PAUSE=<point>`` with ``DSTREAMS_FAULT_PAUSE_AFTER=<n>`` (default 1) makes the driver stop
itself with SIGSTOP the n-th time (only that time) it reaches ``<point>``, after writing
``dstreams fault injection: SIGSTOP at <point> #<n>`` to stderr: every thread of the driver halts (its
Spark JVM, another process, goes on) until a SIGCONT. A zombie in the making: the tests start another driver
meanwhile, then resume this one.

With the variables unset, :func:`reached` is two dictionary lookups and comparisons.

Task slowdown (stragglers): :func:`maybe_slow_task` / :func:`slowed_partition`, called inside Spark
tasks, sleep when ``DSTREAMS_FAULT_SLOW_EXECUTOR`` and/or ``DSTREAMS_FAULT_SLOW_PARTITION`` select the
task (see :func:`slow_spec`). Executor loss: :func:`kill_executor` SIGKILLs one executor JVM of a
``local-cluster`` or standalone application running on this machine.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pyspark import SparkContext

T = TypeVar("T")

_POINT = os.environ.get("DSTREAMS_FAULT_KILL")
_AFTER = int(os.environ.get("DSTREAMS_FAULT_KILL_AFTER", "1"))
_PAUSE_POINT = os.environ.get("DSTREAMS_FAULT_PAUSE")
_PAUSE_AFTER = int(os.environ.get("DSTREAMS_FAULT_PAUSE_AFTER", "1"))
_counts: dict[str, int] = {}
_lock = threading.Lock()


def reached(point: str) -> None:
    """Count a pass through ``point``; SIGKILL this process when the configured kill is due, SIGSTOP it when
    the configured pause is due (once)."""
    if _POINT != point and _PAUSE_POINT != point:
        return
    with _lock:
        n = _counts[point] = _counts.get(point, 0) + 1
    if _POINT == point and n >= _AFTER:
        _signal_self(signal.SIGKILL, point, n)
    if _PAUSE_POINT == point and n == _PAUSE_AFTER:
        _signal_self(signal.SIGSTOP, point, n)


def _signal_self(sig: signal.Signals, point: str, n: int) -> None:
    sys.stderr.write(f"dstreams fault injection: {sig.name} at {point} #{n}\n")
    sys.stderr.flush()
    if sig == signal.SIGSTOP:
        # A stop while another thread holds a local store's folder lock (its journal or checkpointer writing)
        # would make the driver the test starts next on the same folder wait for that lock, then fail its start
        # (the lock's bound, recovery/store/folder_lock.py; a frozen holder is never overridden): wait (bounded)
        # for a moment when none is held. A zombie frozen holding a lock is tests/fault/test_frozen_lock_holder.py's
        # case, not what the zombie-sink tests are about.
        from .store.folder_lock import folder_locks_held

        deadline = time.monotonic() + 10.0
        while folder_locks_held() and time.monotonic() < deadline:
            time.sleep(0.001)
        # Aimed at this thread: it stops before it returns. Sent to the process, the stop is taken by whichever
        # thread the kernel wakes, and this one may go on for milliseconds (past the point) before it halts.
        signal.pthread_kill(threading.get_ident(), sig)
    else:
        os.kill(os.getpid(), sig)


# ---------------------------------------------------------------------------------------------------
# Task-side slowdown (stragglers), for tests and benchmarks; off unless asked for.
# ---------------------------------------------------------------------------------------------------

SLOW_EXECUTOR_ENV = "DSTREAMS_FAULT_SLOW_EXECUTOR"
SLOW_PARTITION_ENV = "DSTREAMS_FAULT_SLOW_PARTITION"
SLOW_SECONDS_ENV = "DSTREAMS_FAULT_SLOW_SECONDS"
SLOW_FACTOR_ENV = "DSTREAMS_FAULT_SLOW_FACTOR"
#: Explicit executor id of this process, honoured first by :func:`current_executor_id`.
EXECUTOR_ID_ENV = "SPARK_EXECUTOR_ID"

_EXECUTOR_BACKEND = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_LOG_URL_EXECUTOR_RE = re.compile(r"[?&]executorId=([^&]+)")
_DEFAULT_SLOW_SECONDS = 1.0


@dataclass(frozen=True)
class SlowSpec:
    """Which tasks to slow down and by how much (parsed from the environment by :func:`slow_spec`).

    A task is slowed when it runs on one of ``executors`` (``None``: any executor) *and* computes one
    of ``partitions`` (``None``: any partition). Its extra delay is ``seconds + (factor - 1) * elapsed``,
    ``elapsed`` being the time the task already spent, as measured by the caller.
    """

    executors: frozenset[str] | None
    partitions: frozenset[int] | None
    seconds: float
    factor: float

    def matches(self, executor_id: str | None, partition: int | None) -> bool:
        if self.executors is not None and executor_id not in self.executors:
            return False
        return self.partitions is None or partition in self.partitions

    def delay(self, elapsed_s: float = 0.0) -> float:
        return self.seconds + max(self.factor - 1.0, 0.0) * max(elapsed_s, 0.0)


def _csv(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _non_negative(name: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not x >= 0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return x


def slow_spec(environ: Mapping[str, str] | None = None) -> SlowSpec | None:
    """The slowdown asked for by ``environ`` (default ``os.environ``), or None when it is off.

    * ``DSTREAMS_FAULT_SLOW_EXECUTOR``: comma-separated executor ids (``"0"``, ``"1,2"``; ``"driver"``
      in ``local[N]``), compared with :func:`current_executor_id`;
    * ``DSTREAMS_FAULT_SLOW_PARTITION``: comma-separated partition indexes (``TaskContext.partitionId()``);
    * ``DSTREAMS_FAULT_SLOW_SECONDS``: fixed extra seconds per matching task;
    * ``DSTREAMS_FAULT_SLOW_FACTOR``: a matching task takes ``factor`` times as long (``>= 1``; needs the
      caller's elapsed time, see :func:`slowed_partition`).

    Off (None) unless EXECUTOR or PARTITION is set to something non-empty; both set means both must
    match. With neither SECONDS nor FACTOR the delay is 1 s. Malformed values raise ValueError.
    """
    env = os.environ if environ is None else environ
    executors_raw = env.get(SLOW_EXECUTOR_ENV, "")
    partitions_raw = env.get(SLOW_PARTITION_ENV, "")
    if not executors_raw and not partitions_raw:
        return None
    executors = frozenset(_csv(executors_raw)) or None
    partition_list = _csv(partitions_raw)
    if executors is None and not partition_list:
        return None
    try:
        partitions = frozenset(int(p) for p in partition_list) or None
    except ValueError:
        raise ValueError(f"{SLOW_PARTITION_ENV} must be comma-separated integers, got {partitions_raw!r}") from None
    seconds_raw, factor_raw = env.get(SLOW_SECONDS_ENV, ""), env.get(SLOW_FACTOR_ENV, "")
    seconds = _non_negative(SLOW_SECONDS_ENV, seconds_raw) if seconds_raw else 0.0
    factor = _non_negative(SLOW_FACTOR_ENV, factor_raw) if factor_raw else 1.0
    if factor_raw and factor < 1.0:
        raise ValueError(f"{SLOW_FACTOR_ENV} must be >= 1, got {factor_raw!r}")
    if not seconds_raw and not factor_raw:
        seconds = _DEFAULT_SLOW_SECONDS
    return SlowSpec(executors, partitions, seconds, factor)


def _proc_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _arg_after(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a == flag:
            return argv[i + 1]
    return None


def _executor_of_task(_: object) -> str:
    time.sleep(0.2)  # long enough that one executor cannot take every task before another is offered any
    return current_executor_id()


def warm_up_executors(sc: SparkContext, expected: int, timeout_s: float, tasks: int = 8) -> list[str]:
    """Run small jobs until tasks have run on ``expected`` executors, or ``timeout_s`` passes.

    Starts the Python workers of every executor before a measurement, and checks that the fault
    injection can tell them apart. An executor that has just registered may get no task of the first
    job on a loaded machine, hence the retries. Returns the executor ids the tasks reported.
    """
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while True:
        seen |= set(sc.parallelize(range(tasks), tasks).map(_executor_of_task).collect())
        if len(seen) >= expected or time.monotonic() > deadline:
            return sorted(seen)
        time.sleep(0.5)


_executor_id_cache: dict[int, str] = {}


def current_executor_id() -> str:
    """The Spark executor id of the executor this Python worker serves (``"driver"`` in ``local[N]``).

    PySpark gives Python tasks no executor id, so it is found, in order: the ``SPARK_EXECUTOR_ID``
    environment variable; the ``--executor-id`` argument of the nearest ancestor process that is an
    executor JVM (``CoarseGrainedExecutorBackend``: standalone, ``local-cluster``, YARN, Kubernetes; the
    Python worker is a child of the worker daemon, itself a child of the executor JVM; Linux ``/proc``);
    the ``executorId=`` of ``SPARK_LOG_URL_STDERR`` (standalone workers set it). Otherwise ``"driver"``.
    Cached per process.
    """
    pid = os.getpid()
    cached = _executor_id_cache.get(pid)
    if cached is not None:
        return cached
    found = os.environ.get(EXECUTOR_ID_ENV) or None
    ancestor: int | None = pid
    for _ in range(8):
        if found is not None or ancestor is None or ancestor <= 1:
            break
        argv = _proc_cmdline(ancestor)
        if _EXECUTOR_BACKEND in argv:
            found = _arg_after(argv, "--executor-id")
            break
        ancestor = _proc_ppid(ancestor)
    if found is None:
        for key in ("SPARK_LOG_URL_STDERR", "SPARK_LOG_URL_STDOUT"):
            m = _LOG_URL_EXECUTOR_RE.search(os.environ.get(key, ""))
            if m:
                found = m.group(1)
                break
    result = found or "driver"
    _executor_id_cache[pid] = result
    return result


def maybe_slow_task(elapsed_s: float = 0.0, environ: Mapping[str, str] | None = None) -> float:
    """Inside a Spark task: sleep when the configured slowdown (:func:`slow_spec`) matches this task.

    Returns the seconds slept (0.0 when off, outside a task, or not matching). The environment is read
    on every call, in the Python worker: for ``local``/``local-cluster`` masters, variables set in the
    driver's environment before the SparkContext starts reach the workers; on a real cluster pass them
    with ``spark.executorEnv.DSTREAMS_FAULT_SLOW_...``. With no slowdown configured the cost is two
    dictionary lookups. Data is never changed, so outputs stay those of an unslowed run.
    """
    spec = slow_spec(environ)
    if spec is None:
        return 0.0
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return 0.0
    partition = tc.partitionId()
    executor = current_executor_id() if spec.executors is not None else None
    if not spec.matches(executor, partition):
        return 0.0
    delay = spec.delay(elapsed_s)
    if delay > 0:
        sys.stderr.write(f"dstreams fault injection: slowing partition {partition} on executor {executor} "
                         f"by {delay:.3f} s\n")
        sys.stderr.flush()
        time.sleep(delay)
    return delay


def slowed_partition(iterator: Iterable[T]) -> Iterator[T]:
    """``rdd.mapPartitions(slowed_partition)``: passes records through, then :func:`maybe_slow_task`.

    The elapsed time given to the slowdown is the time spent pulling the partition from upstream, so
    ``DSTREAMS_FAULT_SLOW_FACTOR`` scales the real work of the task.
    """
    start = time.monotonic()
    yield from iterator
    maybe_slow_task(time.monotonic() - start)


# ---------------------------------------------------------------------------------------------------
# Executor loss
# ---------------------------------------------------------------------------------------------------


def executor_pids(app_id: str) -> dict[str, int]:
    """Executor id -> pid of the executor JVMs of application ``app_id`` running on this machine.

    An executor JVM is a process whose command line has ``CoarseGrainedExecutorBackend``,
    ``--app-id <app_id>`` and ``--executor-id <id>`` (how standalone workers, including the ones
    ``local-cluster`` embeds, start executors). Zombies (killed, not yet reaped) are left out. Linux only.
    """
    found: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        argv = _proc_cmdline(pid)
        if _EXECUTOR_BACKEND not in argv or _arg_after(argv, "--app-id") != app_id:
            continue
        executor = _arg_after(argv, "--executor-id")
        if executor is not None and pid_alive(pid):
            found[executor] = pid
    return found


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _executor_sort_key(executor_id: str) -> tuple[int, int | str]:
    return (0, int(executor_id)) if executor_id.isdigit() else (1, executor_id)


def kill_executor(sc: SparkContext, executor_id: str | int | None = None) -> int:
    """SIGKILL one executor JVM of ``sc``'s application; returns the killed pid.

    For ``local-cluster`` and standalone applications whose executors run on this machine: the process
    is found by :func:`executor_pids` (``sc.applicationId`` in its command line). ``executor_id`` picks
    the executor; None picks the live executor with the smallest id. Raises LookupError when no such
    executor process exists (e.g. in ``local[N]``, where tasks run inside the driver JVM). Only sends
    the signal: Spark notices the loss on its own (its cached blocks and shuffle outputs are gone and
    are recomputed from lineage; a standalone master starts a replacement executor).
    """
    app_id = sc.applicationId
    pids = executor_pids(app_id)
    if not pids:
        raise LookupError(f"no executor process of application {app_id} on this machine")
    if executor_id is None:
        executor = min(pids, key=_executor_sort_key)
    else:
        executor = str(executor_id)
        if executor not in pids:
            raise LookupError(f"executor {executor} of application {app_id} is not running here "
                              f"(running: {sorted(pids, key=_executor_sort_key)})")
    pid = pids[executor]
    sys.stderr.write(f"dstreams fault injection: SIGKILL executor {executor} (pid {pid}) of {app_id}\n")
    sys.stderr.flush()
    os.kill(pid, signal.SIGKILL)
    return pid
