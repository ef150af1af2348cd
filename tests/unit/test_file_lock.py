"""``dstreams.file_lock`` (a ``flock`` waited for within a bound) and its use by the executor state store's files: a
task that needs a store file whose lock a frozen process holds fails within the bound, naming the holder, instead of
waiting forever (issue 42, item 4: nothing waits on a frozen process without a timeout)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstreams import statestore
from dstreams.file_lock import describe_holder, flock_within
from dstreams.statestore import StateStoreError

#: Slack over a bound for a loaded 2-core machine.
SLACK_S = 10.0

_HOLD_AND_STOP = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("HELD", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_flock_within_gets_a_free_lock_and_gives_up_on_a_held_one_within_the_bound(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    waiter = os.open(path, os.O_RDWR)
    try:
        assert flock_within(holder, 0.0)
        started = time.monotonic()
        assert not flock_within(waiter, 0.3, exclusive=False)
        assert 0.3 <= time.monotonic() - started < 0.3 + SLACK_S
        assert f"this process (pid {os.getpid()}" in describe_holder(waiter)
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert flock_within(waiter, 0.0, exclusive=False)  # shared locks share
        assert flock_within(holder, 0.0, exclusive=False)
    finally:
        os.close(holder)
        os.close(waiter)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names the holder through /proc/locks")
def test_a_task_fails_within_the_bound_when_a_frozen_process_holds_its_store_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process frozen (SIGSTOP) holding a store file's exclusive lock, as a sweep does for milliseconds: taking the
    file for a task raises StateStoreError within HOLD_TIMEOUT_S naming the stopped pid; once it is gone, it works."""
    monkeypatch.setattr(statestore, "HOLD_TIMEOUT_S", 0.5)
    path = str(tmp_path / f"p-00000.f{statestore.FORMAT}.sqlite")
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_AND_STOP, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HELD"
        deadline = time.monotonic() + 30
        while not _stopped(proc.pid):
            assert time.monotonic() < deadline, "the holder did not stop"
            time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(StateStoreError) as e:
            statestore._hold(path)
        assert time.monotonic() - started < 0.5 + SLACK_S
        message = str(e.value)
        assert path in message and f"pid {proc.pid}" in message and "stopped" in message, message
        assert "kill -CONT" in message, message  # what to do
    finally:
        proc.kill()
        proc.wait(timeout=30)
    fd = statestore._hold(path)  # the holder is gone: the kernel released its lock
    os.close(fd)


def test_resuming_the_holder_as_the_error_says_lets_the_task_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statestore, "HOLD_TIMEOUT_S", 0.3)
    path = str(tmp_path / f"p-00001.f{statestore.FORMAT}.sqlite")
    script = _HOLD_AND_STOP + "os.close(fd)\nprint('RELEASED', flush=True)\n"
    proc = subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HELD"
        deadline = time.monotonic() + 30
        while not _stopped(proc.pid):
            assert time.monotonic() < deadline, "the holder did not stop"
            time.sleep(0.01)
        with pytest.raises(StateStoreError):
            statestore._hold(path)
        os.kill(proc.pid, signal.SIGCONT)  # the way out the message names
        assert proc.stdout.readline().strip() == "RELEASED"
        fd = statestore._hold(path)
        os.close(fd)
    finally:
        proc.kill()
        proc.wait(timeout=30)
