"""A test-only fault point inside Spark tasks: a task that kills (or pauses) its own Python worker at a named point.

Off unless :data:`TASK_KILL_ENV` is set to ``<point>:<marker file>``: then the first task to reach ``<point>``
while the marker file exists removes it and SIGKILLs its own process (one kill, whichever task wins the
removal). The variable is read at each call: a test sets it in ``sc.environment``, which reaches the Python workers
of the jobs submitted after it (a worker daemon of their own). :data:`TASK_PAUSE_ENV`, set the same way, pauses
instead: the task that removes the marker writes its process id into ``<marker>.paused`` and stops its process
(SIGSTOP) until a SIGCONT (a zombie driver's task in the making; the marker may be created while the driver runs).
With both unset, :func:`task_reached` is two environment lookups.

Points: ``state-export`` (a snapshot of a partition's state store is written beside the store and not yet read,
:mod:`dstreams.nodes.store_state`); ``state-reload`` (a store being reloaded from a checkpoint: the snapshot's file
written beside it, inside the store's transaction, :meth:`dstreams.statestore.PartitionStore.reload`). The
driver-side points are :mod:`dstreams.recovery.faults`'.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

TASK_KILL_ENV = "DSTREAMS_FAULT_TASK_KILL"
TASK_PAUSE_ENV = "DSTREAMS_FAULT_TASK_PAUSE"


def task_reached(point: str) -> None:
    """SIGKILL this process if :data:`TASK_KILL_ENV` names ``point`` and its marker file is still there; SIGSTOP it
    (after writing its pid into ``<marker>.paused``) if :data:`TASK_PAUSE_ENV` does."""
    if _took(os.environ.get(TASK_KILL_ENV), point) is not None:
        sys.stderr.write(f"dstreams fault injection: SIGKILL of task process {os.getpid()} at {point}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    marker = _took(os.environ.get(TASK_PAUSE_ENV), point)
    if marker is not None:
        sys.stderr.write(f"dstreams fault injection: SIGSTOP of task process {os.getpid()} at {point}\n")
        sys.stderr.flush()
        with open(marker + ".paused.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(marker + ".paused.tmp", marker + ".paused")
        # Aimed at this thread (dstreams.recovery.faults does the same): it halts before it returns.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def _took(spec: str | None, point: str) -> str | None:
    """The marker of ``spec`` (``<point>:<marker>``) if it names ``point`` and this call removed the marker."""
    if not spec:
        return None
    name, _, marker = spec.partition(":")
    if name != point or not marker:
        return None
    try:
        os.remove(marker)
    except FileNotFoundError:
        return None  # another task took it (or it is not armed yet)
    return marker
