"""A ``flock`` waited for within a bound, and who holds one: the file locks of the local checkpoint store's folders
(:mod:`dstreams.recovery.store.folder_lock`) and of the executor state store's files (:mod:`dstreams.statestore`).

Contract:

* :func:`flock_within` takes a shared or exclusive ``flock`` on an open file, polling (``LOCK_NB``, backing off from
  1 ms to 50 ms) for at most ``timeout_s``; it returns whether it got the lock and never waits longer. A lock held
  by a live process is never broken: the caller reports the holder and lets the process's owner act.
* :func:`describe_holder` names the holder of a ``flock`` in words as the kernel reports it (``/proc/locks``: its
  pid, command line, and whether it is stopped), for the caller's error message. Where ``/proc/locks`` is missing
  (not Linux) or does not list the holder (another pid namespace, another host over NFS), it says so.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time

_FIRST_POLL_S = 0.001
_MAX_POLL_S = 0.05
#: ``/proc/<pid>/stat`` states of a process that runs no code until something else acts.
_FROZEN_STATES = {"T": "stopped (SIGSTOP or a terminal stop)", "t": "stopped by a debugger",
                  "D": "in uninterruptible sleep (stuck in the kernel, e.g. on I/O)"}


def flock_within(fd: int, timeout_s: float, *, exclusive: bool = True) -> bool:
    """Take the ``flock`` on ``fd`` (exclusive, or shared), waiting at most ``timeout_s``; False when it stayed held."""
    operation = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    started = time.monotonic()
    delay = _FIRST_POLL_S
    while True:
        try:
            fcntl.flock(fd, operation)
            return True
        except BlockingIOError:
            pass
        waited = time.monotonic() - started
        if waited >= timeout_s:
            return False
        time.sleep(min(delay, timeout_s - waited))
        delay = min(delay * 2, _MAX_POLL_S)


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
