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
* :func:`folder_locks_held` counts the locks this process holds now (the test-only pause of
  :mod:`dstreams.recovery.faults` waits for none to be held before it freezes a driver).

Where ``/proc/locks`` is missing (not Linux) or does not list the holder (a process in another pid namespace,
another host over NFS), the error says so instead of naming it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator

from .errors import TransientStoreError

_count_lock = threading.Lock()
_locks_held = 0
_FIRST_POLL_S = 0.001
_MAX_POLL_S = 0.05
#: ``/proc/<pid>/stat`` states of a process that runs no code until something else acts.
_FROZEN_STATES = {"T": "stopped (SIGSTOP or a terminal stop)", "t": "stopped by a debugger",
                  "D": "in uninterruptible sleep (stuck in the kernel, e.g. on I/O)"}


def folder_locks_held() -> int:
    """How many folder locks this process holds at the moment."""
    return _locks_held


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
    delay = _FIRST_POLL_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited = time.monotonic() - started
        if waited >= timeout_s:
            raise TransientStoreError(_timeout_message(fd, folder, waited))
        time.sleep(min(delay, timeout_s - waited))
        delay = min(delay * 2, _MAX_POLL_S)


def _timeout_message(fd: int, folder: str, waited: float) -> str:
    holder = describe_holder(fd)
    return (f"the folder {folder} stayed locked for {waited:.1f} s by {holder}: a writer of the local checkpoint "
            "store that does not release its lock looks frozen or stuck (a zombie driver stopped mid-write?). "
            "Resume it (kill -CONT) or kill it; a new driver then proceeds. The lock is not broken while its "
            "holder lives: resumed, it would overwrite newer writes")


def describe_holder(fd: int) -> str:
    """Who holds the ``flock`` on the open file ``fd``, in words, as ``/proc/locks`` tells."""
    pid = _holder_pid(fd)
    host = socket.gethostname()
    if pid is None:
        return ("a process this host cannot name (no /proc/locks entry: another host sharing the folder, "
                "another pid namespace, or not Linux)")
    if pid == os.getpid():
        return f"this process (pid {pid} on {host}), in another thread"
    command = _command(pid)
    state = _state(pid)
    if state is None:
        condition = "which has just exited"
    elif state in _FROZEN_STATES:
        condition = f"which is {_FROZEN_STATES[state]}"
    else:
        condition = f"which is running (state {state}) but did not release it"
    return f"pid {pid} on {host} ({command or 'command line unknown'}), {condition}"


def _holder_pid(fd: int) -> int | None:
    """The pid of the ``flock`` holder of the file open as ``fd`` (``/proc/locks``; None: not listed or not Linux)."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            lines = f.readlines()
    except OSError:
        return None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a waiter's line has "->" after the number.
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
            pid = int(fields[4])
            return pid or None  # 0: a holder outside this pid namespace
    return None


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in ("Z", "X") else state


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return ""
    return text if len(text) <= 160 else text[:157] + "..."
