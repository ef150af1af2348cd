"""A batch-ratio executor policy for a streaming job: ask for executors when batches take nearly the batch interval,
give one back when they take far less (the rule of Spark Streaming's ``spark.streaming.dynamicAllocation``,
SPARK-12133). Off by default: nothing installs it; a user registers it as a listener.

Contract of :class:`BatchRatioPolicy` (a streaming listener, ``ssc.addStreamingListener(policy)``):

* Each completed batch with a known processing time adds to the current window. At the first batch completed at
  least ``interval_s`` after the previous decision (or after the policy was created), the policy decides once on the
  window's mean processing time over the batch interval, the **ratio**, and starts a new window:

  - ratio >= ``scale_up_ratio``: ask for ``max(1, round(ratio))`` more executors, no more than ``max_executors`` in
    all (counted as the executors registered now; Spark may take time to deliver them, and asks beyond what the
    cluster can give stay pending);
  - ratio <= ``scale_down_ratio``: give back one executor, never going below ``min_executors``: the one with the
    highest numeric id (the newest, so the one that holds the fewest state stores and cached partitions; an
    executor state store's files stay on its host's disk, and a partition's next task elsewhere catches up from the
    changelog);
  - otherwise nothing.

  A batch that ran after a scaling decision belongs to the next window only; batches with no known processing time
  (a dropped batch) are not counted.
* Every decision is kept in :attr:`BatchRatioPolicy.decisions` (the newest :data:`KEPT_DECISIONS`) and logged.
  A decision the cluster manager refuses (``local[N]`` has no executors to add; an executor already gone) is
  recorded with ``accepted=False`` and never raises: a listener must not stop the stream.
* Executors are asked for and given back through :class:`ExecutorControl`: :class:`JvmExecutorControl` calls the
  SparkContext's ``requestExecutors`` / ``killExecutor`` / ``getExecutorIds`` through Py4J (Spark's developer API for
  it; standalone, YARN and Kubernetes honour it; Spark's own dynamic allocation must be off, or the two policies fight).

Settings (``scale_up_ratio`` 0.9, ``scale_down_ratio`` 0.3, ``interval_s`` 60, ``min_executors`` 1,
``max_executors`` unbounded) are Spark Streaming's defaults; ``scale_down_ratio`` must be below ``scale_up_ratio``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: How many decisions :attr:`BatchRatioPolicy.decisions` keeps.
KEPT_DECISIONS = 100


class ExecutorControl(Protocol):
    """What the policy needs from the cluster: the executors now, and a way to add and remove them."""

    def executor_ids(self) -> list[str]:
        """The ids of the executors registered now (the driver excluded)."""
        ...

    def request(self, count: int) -> bool:
        """Ask the cluster manager for ``count`` more executors; whether it accepted the request."""
        ...

    def kill(self, executor_id: str) -> bool:
        """Give executor ``executor_id`` back (not replaced); whether the cluster manager accepted it."""
        ...


class JvmExecutorControl:
    """:class:`ExecutorControl` through the SparkContext's JVM object (Py4J)."""

    def __init__(self, sc: Any) -> None:
        self._jsc = sc._jsc.sc()

    def executor_ids(self) -> list[str]:
        return sorted((x for x in str(self._jsc.getExecutorIds().mkString(",")).split(",") if x), key=_id_order)

    def request(self, count: int) -> bool:
        return bool(self._jsc.requestExecutors(int(count)))

    def kill(self, executor_id: str) -> bool:
        return bool(self._jsc.killExecutor(str(executor_id)))


def _id_order(executor_id: str) -> tuple[int, str]:
    """Executor ids in numeric order where they are numbers (Spark's are), then by name."""
    return (int(executor_id), "") if executor_id.isdigit() else (1 << 62, executor_id)


@dataclass(frozen=True)
class Decision:
    """One scaling decision: when (monotonic seconds), the window's batches and ratio, what was done
    (``"request"``, ``"kill"`` or ``"none"``), how many executors or which one, and whether it was accepted."""

    at_s: float
    batches: int
    ratio: float
    action: str
    executors_before: int
    count: int = 0
    executor_id: str | None = None
    accepted: bool = True
    reason: str = ""


class BatchRatioPolicy:
    """The batch-ratio policy (module doc) as a streaming listener."""

    def __init__(self, control: ExecutorControl, batch_interval_ms: int, *, scale_up_ratio: float = 0.9,
                 scale_down_ratio: float = 0.3, interval_s: float = 60.0, min_executors: int = 1,
                 max_executors: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if batch_interval_ms <= 0:
            raise ValueError(f"the batch interval must be positive, not {batch_interval_ms} ms")
        if not 0 <= scale_down_ratio < scale_up_ratio:
            raise ValueError(f"scale_down_ratio ({scale_down_ratio}) must be at least 0 and below scale_up_ratio "
                             f"({scale_up_ratio}), e.g. 0.3 and 0.9")
        if min_executors < 0 or (max_executors is not None and max_executors < max(1, min_executors)):
            raise ValueError(f"executor bounds must satisfy 0 <= min_executors <= max_executors (and max_executors "
                             f">= 1), not {min_executors} and {max_executors}")
        if interval_s <= 0:
            raise ValueError(f"the decision interval must be positive, not {interval_s} s")
        self.control = control
        self.batch_interval_ms = int(batch_interval_ms)
        self.scale_up_ratio, self.scale_down_ratio = float(scale_up_ratio), float(scale_down_ratio)
        self.interval_s = float(interval_s)
        self.min_executors, self.max_executors = int(min_executors), max_executors
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = clock()
        self._sum_ms = 0
        self._count = 0
        self.decisions: deque[Decision] = deque(maxlen=KEPT_DECISIONS)

    @classmethod
    def for_context(cls, ssc: Any, **settings: Any) -> BatchRatioPolicy:
        """A policy for the StreamingContext ``ssc`` (its SparkContext's executors, its batch interval), registered
        as its listener."""
        duration = ssc._graph.batch_duration
        policy = cls(JvmExecutorControl(ssc.sparkContext), int(duration.ms), **settings)
        ssc.addStreamingListener(policy)
        return policy

    # ------------------------------------------------------------------ listener callbacks
    def onBatchCompleted(self, batchCompleted: Any) -> None:  # noqa: N802, N803 - PySpark's listener names
        info = batchCompleted.batchInfo()
        delay = getattr(info, "processing_delay_ms", None)
        self.batch_completed(None if delay is None or delay < 0 else int(delay))

    def batch_completed(self, processing_ms: int | None) -> Decision | None:
        """Count one completed batch (None: no known processing time) and decide when the interval is over; returns
        the decision made now, if any."""
        with self._lock:
            if processing_ms is not None:
                self._sum_ms += processing_ms
                self._count += 1
            now = self._clock()
            if now - self._window_start < self.interval_s:
                return None
            count, total = self._count, self._sum_ms
            self._window_start, self._sum_ms, self._count = now, 0, 0
            if count == 0:
                return None
            decision = self._decide(now, count, total / count / self.batch_interval_ms)
            self.decisions.append(decision)
        log.info("batch-ratio policy: %s", decision)
        return decision

    def _decide(self, now: float, batches: int, ratio: float) -> Decision:
        try:
            executors = self.control.executor_ids()
        except Exception as e:  # noqa: BLE001 - never stop the stream
            return Decision(now, batches, ratio, "none", -1, accepted=False, reason=f"executors unknown: {e}")
        n = len(executors)
        if ratio >= self.scale_up_ratio:
            want = max(1, round(ratio))
            if self.max_executors is not None:
                want = min(want, self.max_executors - n)
            if want <= 0:
                return Decision(now, batches, ratio, "none", n, reason=f"at max_executors ({self.max_executors})")
            return self._act(Decision(now, batches, ratio, "request", n, count=want),
                             lambda: self.control.request(want))
        if ratio <= self.scale_down_ratio:
            if n <= max(self.min_executors, 1):
                return Decision(now, batches, ratio, "none", n, reason=f"at min_executors ({self.min_executors})")
            victim = sorted(executors, key=_id_order)[-1]
            return self._act(Decision(now, batches, ratio, "kill", n, count=1, executor_id=victim),
                             lambda: self.control.kill(victim))
        return Decision(now, batches, ratio, "none", n)

    @staticmethod
    def _act(decision: Decision, call: Callable[[], bool]) -> Decision:
        try:
            accepted = call()
        except Exception as e:  # noqa: BLE001 - never stop the stream
            return Decision(**{**decision.__dict__, "accepted": False, "reason": f"{type(e).__name__}: {e}"})
        if accepted:
            return decision
        return Decision(**{**decision.__dict__, "accepted": False, "reason": "refused by the cluster manager"})


__all__ = ["BatchRatioPolicy", "Decision", "ExecutorControl", "JvmExecutorControl"]
