"""The local-folder store's folder lock when its holder is frozen (issue 42, item 4): bounded, named, never broken.

A writer holding a folder's lock (``put``, ``put_if_match``, ``delete``) that is frozen (SIGSTOP, a long pause)
must not hold up the other writers forever: they wait at most ``lock_seconds`` per attempt, then fail with a
transient error naming the folder and the holder's pid. The lock is never broken: the frozen writer passed its
etag check, and its replace lands when it resumes, so the increments below must all count.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from dstreams.recovery.retry import RetryPolicy
from dstreams.recovery.store import PreconditionFailed, StoreConfigError, StoreUnavailableError, open_store
from dstreams.recovery.store.errors import TransientStoreError
from dstreams.recovery.store.folder_lock import folder_lock, folder_locks_held
from dstreams.recovery.store.local import LocalStore

from .frozen_writer import frozen_writer, read_line

ONE_ATTEMPT = RetryPolicy(total_seconds=0)
#: A loaded machine may be slow to schedule the waiting writer: the bound asserted is the lock's plus this.
SLACK_S = 10.0


def _increment(store: LocalStore, key: str) -> None:
    """Add one to the integer under ``key`` (a compare-and-swap loop)."""
    while True:
        data, etag = store.get_with_etag(key)
        try:
            store.put_if_match(key, str(int(data) + 1).encode(), etag)
            return
        except PreconditionFailed:
            continue


def _in_thread(fn, timeout: float) -> BaseException | None:
    """Run ``fn()`` in a thread, and return what it raised (None: nothing); fail when it takes over ``timeout``."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            raised.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the writer is still blocked after {timeout} s"
    return raised[0]


@pytest.mark.fault
@pytest.mark.parametrize("op", ["put_if_match", "put", "delete"])
def test_a_writer_behind_a_frozen_holder_fails_in_bounded_time_naming_it(tmp_path: Path, op: str) -> None:
    root = str(tmp_path)
    LocalStore(root).put("meta/head", b"0")
    store = LocalStore(root, ONE_ATTEMPT, lock_seconds=1.0)
    with frozen_writer(root, "meta/head") as holder:
        write = {"put_if_match": lambda: store.put_if_match("meta/head", b"7", store.get_with_etag("meta/head")[1]),
                 "put": lambda: store.put("meta/other", b"7"),
                 "delete": lambda: store.delete("meta/head")}[op]
        started = time.monotonic()
        error = _in_thread(write, 1.0 + SLACK_S)
        assert time.monotonic() - started >= 1.0
        assert isinstance(error, StoreUnavailableError), error
        cause = error.__cause__
        assert isinstance(cause, TransientStoreError)
        message = str(cause)
        assert os.path.join(root, "meta") in message
        assert f"pid {holder.pid} " in message and "stopped (SIGSTOP" in message, message
        assert "Resume it (kill -CONT) or kill it" in message
        assert str(error).count(f"pid {holder.pid} ") == 1  # the store's error carries it too
        assert store.get("meta/head") == b"0" and not store.exists("meta/other")  # nothing was written
        holder.send_signal(signal.SIGCONT)
        assert read_line(holder, 60) == "DONE 1"
        assert holder.wait(timeout=60) == 0
    write()  # the holder is gone: the same write goes through
    assert store.list("meta/") == {"put_if_match": ["meta/head"], "put": ["meta/head", "meta/other"],
                                   "delete": []}[op]


@pytest.mark.fault
@pytest.mark.parametrize("end", ["resumed", "killed"])
def test_no_update_is_lost_to_a_frozen_writer(tmp_path: Path, end: str) -> None:
    """A writer keeps incrementing while another is frozen inside its increment, past its check; once that one
    is resumed (its increment lands) or killed (it never does), every successful increment is counted."""
    root = str(tmp_path)
    LocalStore(root).put("counter", b"0")
    store = LocalStore(root, RetryPolicy(total_seconds=0.5, initial=0.05, maximum=0.1), lock_seconds=0.2)
    timeouts: list[str] = []
    done = threading.Event()
    increments = 20

    def writer() -> None:
        for _ in range(increments):
            while True:
                try:
                    _increment(store, "counter")
                    break
                except StoreUnavailableError as e:
                    timeouts.append(str(e))
        done.set()

    with frozen_writer(root, "counter") as holder:
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not timeouts:
            assert time.monotonic() < deadline, "the writer never reported the frozen holder"
            assert not done.is_set(), "the writer finished while the folder's lock was held"
            time.sleep(0.05)
        assert store.get("counter") == b"0"
        if end == "resumed":
            holder.send_signal(signal.SIGCONT)
            assert read_line(holder, 60) == "DONE 1"
            assert holder.wait(timeout=60) == 0
        else:
            holder.kill()
            holder.wait(timeout=60)
        thread.join(120)
        assert not thread.is_alive(), "the writer is still blocked after the holder ended"
    assert f"pid {holder.pid} " in timeouts[0]
    assert int(store.get("counter")) == increments + (1 if end == "resumed" else 0)


def test_a_lock_held_by_another_thread_of_this_process(tmp_path: Path) -> None:
    folder = str(tmp_path)
    with folder_lock(folder, 1.0):
        assert folder_locks_held() == 1
        error = _in_thread(lambda: folder_lock(folder, 0.3).__enter__(), 0.3 + SLACK_S)
        assert isinstance(error, TransientStoreError)
        assert f"this process (pid {os.getpid()} " in str(error) and "another thread" in str(error)
    assert folder_locks_held() == 0
    with folder_lock(folder, 0.0):  # free: no wait at all is enough
        pass


def test_no_fsync_while_a_folder_lock_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The critical sections stay short: fsyncs (of the data and of the folder) run outside the lock."""
    synced_under_lock: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        if folder_locks_held():
            synced_under_lock.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = LocalStore(tmp_path)
    store.put("a/k", b"1")
    _, etag = store.get_with_etag("a/k")
    store.put_if_match("a/k", b"2", etag)
    store.put_if_absent("a/j", b"3")
    store.delete("a/k")
    assert synced_under_lock == []


def test_lock_seconds_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert LocalStore(tmp_path).lock_seconds == 30.0
    assert open_store(str(tmp_path), lock_seconds=2).lock_seconds == 2.0  # type: ignore[attr-defined]
    assert LocalStore(tmp_path, lock_seconds=3).child("x").lock_seconds == 3.0  # type: ignore[attr-defined]
    monkeypatch.setenv("DSTREAMS_STORE_LOCK_SECONDS", "5")
    assert LocalStore(tmp_path).lock_seconds == 5.0
    with pytest.raises(StoreConfigError, match="lock_seconds"):
        LocalStore(tmp_path, lock_seconds=-1)
