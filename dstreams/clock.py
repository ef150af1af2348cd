"""Clocks injected into the job generator.

Contract: ``time_ms()`` is monotone non-decreasing integer milliseconds; ``wait_till(t, stop)``
blocks until ``time_ms() >= t`` or ``stop`` is set, and returns the clock's time then.
``SystemClock`` follows wall time; ``ManualClock`` only moves when a test calls ``advance`` or
``set_time``, so tests never sleep to make batches happen.
"""

from __future__ import annotations

import threading
import time as _time


class Clock:
    """Interface of an injected clock."""

    def time_ms(self) -> int:
        raise NotImplementedError

    def wait_till(self, target_ms: int, stop: threading.Event) -> int:
        raise NotImplementedError


class SystemClock(Clock):
    """Wall-clock time in milliseconds since the epoch."""

    def time_ms(self) -> int:
        return int(_time.time() * 1000)

    def wait_till(self, target_ms: int, stop: threading.Event) -> int:
        while not stop.is_set():
            now = self.time_ms()
            remaining = target_ms - now
            if remaining <= 0:
                return now
            # Sleep in short slices so stop() is honoured quickly.
            stop.wait(min(remaining, 100) / 1000.0)
        return self.time_ms()


class ManualClock(Clock):
    """A clock that tests move by hand; starts at ``start_ms`` (0 by default)."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = int(start_ms)
        self._cond = threading.Condition()

    def time_ms(self) -> int:
        with self._cond:
            return self._now

    def advance(self, ms: int) -> int:
        """Move the clock forward by ``ms`` milliseconds and wake waiting threads."""
        if ms < 0:
            raise ValueError("a ManualClock only moves forward")
        with self._cond:
            self._now += int(ms)
            self._cond.notify_all()
            return self._now

    def set_time(self, ms: int) -> None:
        with self._cond:
            if ms < self._now:
                raise ValueError(f"a ManualClock only moves forward ({ms} < {self._now})")
            self._now = int(ms)
            self._cond.notify_all()

    def wait_till(self, target_ms: int, stop: threading.Event) -> int:
        with self._cond:
            while self._now < target_ms and not stop.is_set():
                self._cond.wait(0.05)
            return self._now
