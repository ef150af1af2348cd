"""A test-only fault point inside Spark tasks: a task that kills its own Python worker at a named point.

Off unless :data:`TASK_KILL_ENV` is set to ``<point>:<marker file>``: then the first task to reach ``<point>``
while the marker file exists removes it and SIGKILLs its own process (one kill, whichever task wins the
removal). The variable is read at each call: a test sets it in ``sc.environment``, which reaches the Python workers
of the jobs submitted after it (a worker daemon of their own). With it unset, :func:`task_reached` is one
environment lookup.

Points: ``state-export`` (a snapshot of a partition's state store is written beside the store and not yet read,
:mod:`dstreams.nodes.store_state`); ``state-reload`` (a store being reloaded from a checkpoint: the snapshot's file
written beside it, inside the store's transaction, :meth:`dstreams.statestore.PartitionStore.reload`). The
driver-side points are :mod:`dstreams.recovery.faults`'.
"""

from __future__ import annotations

import os
import signal
import sys

TASK_KILL_ENV = "DSTREAMS_FAULT_TASK_KILL"


def task_reached(point: str) -> None:
    """SIGKILL this process if :data:`TASK_KILL_ENV` names ``point`` and its marker file is still there."""
    spec = os.environ.get(TASK_KILL_ENV)
    if not spec:
        return
    name, _, marker = spec.partition(":")
    if name != point or not marker:
        return
    try:
        os.remove(marker)
    except FileNotFoundError:
        return  # another task took the kill
    sys.stderr.write(f"dstreams fault injection: SIGKILL of task process {os.getpid()} at {point}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
