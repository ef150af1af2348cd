"""A local-folder store writer that freezes itself holding its key's folder lock (tests/store/test_store_lock.py).

``python frozen_writer.py ROOT KEY`` increments the integer stored under ``KEY`` of ``LocalStore(ROOT)`` once, with
``put_if_match``. Right after its etag check passed, inside the folder lock and before its ``os.replace``, it prints
``FROZEN <pid>`` and stops itself with SIGSTOP: the most dangerous moment for a zombie, whose replace lands as soon
as it runs again. After a SIGCONT it finishes the write, prints ``DONE <new value>`` and exits; a SIGKILL ends it
with the write not made.

``python frozen_writer.py ROOT FOLDER hold`` takes the lock of the folder ``FOLDER`` (a key prefix: ``meta``),
prints ``FROZEN <pid>``, stops itself, and releases the lock when resumed (a zombie driver frozen mid-commit).

The tests start it with :func:`frozen_writer`, which stops the process (SIGKILL, then reaps it) when they end.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from dstreams.recovery.store.local import LocalStore


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` prints, waited for at most ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError(f"process {proc.pid} printed nothing for {timeout} s")
    return proc.stdout.readline().strip()


@contextlib.contextmanager
def frozen_writer(root: str, key: str, mode: str = "increment",
                  timeout: float = 60.0) -> Iterator[subprocess.Popen[str]]:
    """A child running this script, stopped (SIGSTOP) while it holds the lock of ``key``'s folder; killed at the end."""
    proc = subprocess.Popen([sys.executable, __file__, root, key, mode], stdout=subprocess.PIPE, text=True)
    try:
        line = read_line(proc, timeout)
        assert line == f"FROZEN {proc.pid}", line
        deadline = time.monotonic() + timeout
        while not _stopped(proc.pid):
            assert time.monotonic() < deadline, f"writer {proc.pid} announced its SIGSTOP but is not stopped"
            time.sleep(0.01)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()


def _freeze() -> None:
    print(f"FROZEN {os.getpid()}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


class _FreezingStore(LocalStore):
    def _replace(self, tmp: str, path: str, key: str) -> None:
        _freeze()
        super()._replace(tmp, path, key)


def main(root: str, key: str, mode: str = "increment") -> None:
    store = _FreezingStore(root)
    if mode == "hold":
        with store._locked(store._path(key)):
            _freeze()
        print("DONE", flush=True)
        return
    data, etag = store.get_with_etag(key)
    new = int(data) + 1
    store.put_if_match(key, str(new).encode(), etag)
    print(f"DONE {new}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
