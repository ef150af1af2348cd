"""Executor loss for tests and benchmarks: find, and SIGKILL, the executor JVMs of an application running on this
machine (``local-cluster`` or a standalone cluster), and start every executor's Python workers before a measurement.

The fault points a test injects (driver kills and pauses, task kills, stragglers) are :mod:`dstreams.faults`'.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from dstreams.faults import EXECUTOR_BACKEND, arg_after, current_executor_id, proc_cmdline

if TYPE_CHECKING:
    from pyspark import SparkContext


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
        argv = proc_cmdline(pid)
        if EXECUTOR_BACKEND not in argv or arg_after(argv, "--app-id") != app_id:
            continue
        executor = arg_after(argv, "--executor-id")
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
