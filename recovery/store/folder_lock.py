"""The local-folder store's folder lock: an exclusive ``flock`` on a folder, waited for within a bound.

Contract of :func:`folder_lock`:

* It holds an exclusive ``flock`` on the folder (its own open file description: threads of one process exclude
  each other as processes do) for the ``with`` block; the kernel releases it when the holder exits or dies.
* It never waits without a bound: it polls (``LOCK_NB``, backing off from 1 ms to 50 ms) for up to ``timeout_s``,
  then raises :class:`TransientStoreError` (the store's retry policy may try again) naming the folder, the
  holder as the kernel reports it (``/proc/locks``: its pid, command line and whether it is stopped, on this
  host) and what to do. A lock held by a live process is never broken: a holder frozen after its check
  (SIGSTOP, a long pause) replaces the key as soon as it runs again, and a writer that had taken the lock
  from it would have its newer write clobbered. Resuming or killing the holder is the way out.
* :func:`folder_locks_held` counts the locks this process holds now; it is registered with
  :func:`dstreams.faults.hold_pauses_while` (a test-only pause waits for none to be held before it freezes a driver).

Where ``/proc/locks`` is missing (not Linux) or does not list the holder (a process in another pid namespace,
another host over NFS), the error says so instead of naming it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from dstreams.faults import hold_pauses_while
from dstreams.file_lock import describe_holder, flock_within

from .errors import TransientStoreError

_count_lock = threading.Lock()
_locks_held = 0


def folder_locks_held() -> int:
    """How many folder locks this process holds at the moment."""
    return _locks_held


hold_pauses_while(folder_locks_held)


@contextlib.contextmanager
def folder_lock(folder: str, timeout_s: float) -> Iterator[None]:
    """Hold the exclusive lock on ``folder`` for the block, waiting at most ``timeout_s`` for it (module contract)."""
    global _locks_held
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _acquire(fd, folder, timeout_s)
        with _count_lock:
            _locks_held += 1
        try:
            yield
        finally:
            with _count_lock:
                _locks_held -= 1
    finally:
        os.close(fd)  # releases the lock


def _acquire(fd: int, folder: str, timeout_s: float) -> None:
    started = time.monotonic()
    if not flock_within(fd, timeout_s):
        raise TransientStoreError(_timeout_message(fd, folder, time.monotonic() - started))


def _timeout_message(fd: int, folder: str, waited: float) -> str:
    holder = describe_holder(fd)
    return (f"the folder {folder} stayed locked for {waited:.1f} s by {holder}: a writer of the local checkpoint "
            "store that does not release its lock looks frozen or stuck (a zombie driver stopped mid-write?). "
            "Resume it (kill -CONT) or kill it; a new driver then proceeds. The lock is not broken while its "
            "holder lives: resumed, it would overwrite newer writes")
