"""Where every generated batch is: queued, held, running or done; the one lock the generator and the runners share.

Contract of :class:`BatchTracker`:

* The generator :meth:`queue` s batches in time order; the runners :meth:`take` them in that order and report each
  :meth:`finished`; a batch is *queued*, *held* (taken out of the queue while its jobs are rebuilt, see
  :meth:`holding`), *running*, then *done* (its completion recorded: :meth:`mark_done_through`).
* The tracker is **open** until the context stops (:meth:`stop_running`) or a batch fails for good
  (:meth:`fail`): after that no batch is queued or started, and the queue is emptied. :meth:`accepting` says which.
* :meth:`wait_for_batch` waits for a batch's completion, and raises :class:`BatchNotDoneError` as soon as the
  tracker failed and nothing runs any more.
* The metrics of finished batches are kept (the newest ``keep_batch_infos``) in :attr:`infos`.
"""

from __future__ import annotations

import logging
import threading
import time as _time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..graph import Job
from ..listener import BatchInfo
from ..time import BatchTime
from .failure import BatchNotDoneError, last_line

log = logging.getLogger(__name__)


@dataclass
class Batch:
    time: BatchTime
    jobs: list[Job]
    info: BatchInfo
    error: BaseException | None = None
    #: Its completion must not be recorded: it failed for good (``onFailure=stop``, a store down past the
    #: outage bound) or a stop cut it; a restart runs it again from the metadata log.
    incomplete: bool = False
    #: How many of ``jobs`` have run to their end in this driver: a retry starts after them.
    jobs_done: int = 0
    #: Failed for good under ``onFailure=dropInput``: its input is dropped (see ``JobGenerator.drop``).
    dropped: bool = False
    #: The error a dropped batch reports to ``awaitTermination``, once its drop is recorded.
    drop_error: BaseException | None = None


class BatchTracker:
    """The batches between generation and completion (module docstring)."""

    def __init__(self, keep_batch_infos: int = 1000) -> None:
        self._cond = threading.Condition()
        self._queue: deque[Batch] = deque()
        self._running: dict[int, Batch] = {}
        self._held = 0  # queued batches taken out while they are rebuilt on a new checkpoint
        self._stopped = False
        self._fatal_error: BaseException | None = None
        self._done_through = -1  # every batch up to this time has completed and been cleaned up
        self.last_completed: BatchTime | None = None
        self.infos: deque[BatchInfo] = deque(maxlen=keep_batch_infos)

    # ------------------------------------------------------------------ state
    @property
    def fatal_error(self) -> BaseException | None:
        return self._fatal_error

    def accepting(self) -> bool:
        """Whether a batch may still be queued or started: not after a stop or a fatal error."""
        with self._cond:
            return self._accepting()

    def _accepting(self) -> bool:
        return self._fatal_error is None and not self._stopped

    def busy(self) -> bool:
        """Whether a batch is queued, held or running."""
        with self._cond:
            return bool(self._queue or self._running or self._held)

    # ------------------------------------------------------------------ the generator's side
    def queue(self, b: Batch) -> bool:
        """Queue ``b`` for the runners; False (not queued) when the tracker no longer accepts batches."""
        with self._cond:
            if not self._accepting():
                return False
            self._queue.append(b)
            self._cond.notify_all()
            return True

    def holding(self, rebuild: Callable[[list[Batch]], None]) -> None:
        """``rebuild(held)`` with the queued batches taken out of the queue (runners cannot start them), then
        put back in order (unless the tracker closed meanwhile)."""
        with self._cond:
            held = list(self._queue)
            self._queue.clear()
            self._held += len(held)
        try:
            rebuild(held)
        finally:
            with self._cond:
                self._held -= len(held)
                if self._accepting():
                    self._queue.extendleft(reversed(held))
                self._cond.notify_all()

    def mark_done_through(self, ready: list[int], time: BatchTime) -> None:
        """Batches ``ready`` (and every one before them) are done; ``time`` has completed. Wakes the waiters."""
        with self._cond:
            self._done_through = max([self._done_through, *ready]) if ready else self._done_through
            self.last_completed = time if self.last_completed is None else max(self.last_completed, time)
            self._cond.notify_all()

    # ------------------------------------------------------------------ the runners' side
    def take(self) -> Batch | None:
        """The next queued batch, now running (blocks); None once the tracker no longer accepts batches."""
        with self._cond:
            while not self._queue and self._accepting():
                self._cond.wait(0.1)
            if not self._accepting():  # a graceful stop drained the queue before setting it, or a batch failed
                return None
            b = self._queue.popleft()
            self._running[b.time.ms] = b
            return b

    def record_info(self, info: BatchInfo) -> None:
        """Keep a finished batch's metrics (read by :meth:`wait_for_batch`)."""
        with self._cond:
            self.infos.append(info)

    def finished(self, b: Batch) -> None:
        """``b`` no longer runs."""
        with self._cond:
            self._running.pop(b.time.ms, None)
            self._cond.notify_all()

    # ------------------------------------------------------------------ closing
    def fail(self, e: BaseException) -> None:
        """Close on a fatal error: from here on no batch is queued or started and the queue is emptied (batches
        already running with ``concurrentBatches > 1`` end as they are). The first error is kept."""
        with self._cond:
            if self._fatal_error is None:
                self._fatal_error = e
            if self._queue:
                log.info("%d queued batch(es) will not run: %s", len(self._queue), last_line(str(e)))
            self._queue.clear()
            self._cond.notify_all()

    def drain(self, deadline: float) -> bool:
        """Wait (until the monotonic ``deadline``) for every queued, held and running batch to end; whether they
        did."""
        with self._cond:
            while (self._queue or self._running or self._held) and _time.monotonic() < deadline:
                self._cond.wait(0.05)
            return not (self._queue or self._running or self._held)

    def stop_running(self) -> tuple[int, list[Batch]]:
        """Close for a stop: empty the queue; the number of queued batches that will not run and the running
        ones (to cancel)."""
        with self._cond:
            dropped = len(self._queue)
            self._queue.clear()
            running = list(self._running.values())
            self._stopped = True
            self._cond.notify_all()
            return dropped, running

    # ------------------------------------------------------------------ waiting
    def wait_for_batch(self, t: BatchTime, timeout_s: float, settle: Callable[[float], object]) -> BatchInfo:
        """Block until batch ``t`` has completed (raises TimeoutError after ``timeout_s``).

        Raises :class:`BatchNotDoneError` (with the fatal error as its cause) as soon as the tracker failed and
        ``t`` is not done: it never will be in this driver. ``settle(seconds)`` lets completions already posted
        be recorded before that is decided (the event loop's ``wait_idle``).
        """
        deadline = _time.monotonic() + timeout_s
        while True:
            with self._cond:
                while True:
                    if self._done_through >= t.ms:
                        for info in reversed(self.infos):
                            if info.batch_time_ms == t.ms:
                                return info
                        raise KeyError(f"batch {t} completed but its metrics were not kept")
                    remaining = deadline - _time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(f"batch {t} did not complete within {timeout_s} s")
                    if self._fatal_error is not None and not self._running and not self._queue and not self._held:
                        break  # nothing runs any more: see below, outside the lock
                    self._cond.wait(min(remaining, 0.1))
            settle(max(0.0, min(5.0, deadline - _time.monotonic())))
            with self._cond:
                if self._done_through >= t.ms:
                    continue
            raise BatchNotDoneError(f"batch {t} will not complete: the streaming context stopped on an error "
                                    f"({last_line(str(self._fatal_error))})") from self._fatal_error
