"""Fault injection for tests and benchmarks; off unless asked for through the environment.

``DSTREAMS_FAULT_KILL=<point>`` with ``DSTREAMS_FAULT_KILL_AFTER=<n>`` (default 1) makes the driver
kill itself with SIGKILL the n-th time it reaches ``<point>``:

* ``mid-batch`` – a batch's first output operation has started (its Spark jobs may be running);
* ``checkpoint-write`` – a data checkpoint's parts are written but its manifest is not;
* ``after-metadata-commit`` – right after a conditional write of the metadata head.

With the variable unset, :func:`reached` is a dictionary lookup and a comparison.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_POINT = os.environ.get("DSTREAMS_FAULT_KILL")
_AFTER = int(os.environ.get("DSTREAMS_FAULT_KILL_AFTER", "1"))
_counts: dict[str, int] = {}
_lock = threading.Lock()


def reached(point: str) -> None:
    """Count a pass through ``point``; SIGKILL this process when the configured one is due."""
    if _POINT != point:
        return
    with _lock:
        n = _counts[point] = _counts.get(point, 0) + 1
    if n >= _AFTER:
        sys.stderr.write(f"dstreams fault injection: SIGKILL at {point} #{n}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
