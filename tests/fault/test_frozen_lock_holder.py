"""A new driver never hangs behind a zombie frozen while it holds the checkpoint folder's lock (issue 42, item 4).

A driver frozen (SIGSTOP) in the middle of a metadata commit holds the ``flock`` of the local checkpoint's ``meta``
folder (tests/store/frozen_writer.py plays that zombie: it takes the lock and stops itself). A driver started on
the same checkpoint meanwhile must not wait for it forever: its take-over waits at most ``lock_seconds`` per
attempt, and its start either fails with an error naming the zombie's pid (its store's retry bound passed), or
proceeds once the zombie is killed. The drivers run in this process (the ``sc`` fixture, a manual clock).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.store import StoreUnavailableError
from dstreams.testing import run_until

from ..recovery_app import build
from ..store.frozen_writer import frozen_writer

pytestmark = [pytest.mark.slow, pytest.mark.fault]


class _Starting:
    """``ssc.start()`` in a thread (a start that hangs must fail the test, not block it)."""

    def __init__(self, ssc: StreamingContext) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(ssc,), daemon=True)
        self._thread.start()

    def _run(self, ssc: StreamingContext) -> None:
        try:
            ssc.start()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def join(self, timeout: float) -> BaseException | None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"start() still blocked after {timeout} s"
        return self.error


def test_a_new_driver_never_hangs_behind_a_zombie_frozen_holding_the_metadata_lock(sc, tmp_path, caplog):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    clock = ManualClock()
    first = StreamingContext.getOrCreate(ckpt, lambda: build(sc, ckpt, out, clock))
    try:
        first.start()
        run_until(first, 3000, flush_checkpoints=True)
    finally:
        first.stop(stopSparkContext=False)
    resumed = None
    try:
        with frozen_writer(ckpt, "meta", "hold") as zombie:
            # Its store gives up after 2 s: the start fails with the holder named, within the bound.
            clock2 = ManualClock(3000)
            second = StreamingContext.getOrCreate(ckpt, lambda: build(sc, ckpt, out, clock2), clock=clock2,
                                                  lock_seconds=1, retry_seconds=2)
            started = time.monotonic()
            error = _Starting(second).join(120)
            assert isinstance(error, StoreUnavailableError), error
            assert f"pid {zombie.pid} " in str(error) and "stopped (SIGSTOP" in str(error), error
            assert "meta" in str(error) and "Resume it (kill -CONT) or kill it" in str(error)
            assert time.monotonic() - started < 60
            # Its store would wait 10 minutes: it goes on as soon as the zombie is killed.
            clock3 = ManualClock(3000)
            resumed = StreamingContext.getOrCreate(ckpt, lambda: build(sc, ckpt, out, clock3), clock=clock3,
                                                   lock_seconds=1, retry_seconds=600)
            with caplog.at_level(logging.WARNING, logger="dstreams.recovery.store"):
                starting = _Starting(resumed)
                deadline = time.monotonic() + 60
                while not any(f"pid {zombie.pid} " in r.getMessage() for r in caplog.records):
                    assert time.monotonic() < deadline, "the new driver never reported the frozen lock holder"
                    time.sleep(0.05)
                zombie.kill()
                zombie.wait(timeout=60)
                assert starting.join(120) is None
        run_until(resumed, 5000, flush_checkpoints=True)
        assert resumed._metadata is not None and resumed._metadata.head["epoch"] == 2  # the failed start took none
    finally:
        if resumed is not None:
            resumed.stop(stopSparkContext=False)
