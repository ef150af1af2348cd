"""Process-wide, thread-safe event counts of the recovery layer, read by monitoring (the status server's
``/metrics``).

Contract:

* An :class:`EventCounts` is a tally of events by label (a short, bounded set of strings: a store operation's
  name, not a key). :meth:`EventCounts.add` may be called from any thread; counts only grow, from 0 when the
  process starts (never reset), so a reader reports them as Prometheus counters as they are.
* The counts are those of *this process*: on the driver, the driver's own store operations. Executors (Python
  workers) are other processes: what they count stays there.
* The instances: :data:`dstreams.recovery.retry.STORE_RETRIES` (store operations retried after a transient
  error, by operation: one per retry) and :data:`dstreams.recovery.outage.OUTAGE_WAITS` (waits for an
  unavailable store: one per wait, label ``""``).
"""

from __future__ import annotations

import threading


class EventCounts:
    """A thread-safe tally of events by label (see the module docstring)."""

    def __init__(self, description: str) -> None:
        #: What is counted (for a reader's help text).
        self.description = description
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, label: str = "", n: int = 1) -> None:
        """Count ``n`` (>= 0) more events under ``label``."""
        if n < 0:
            raise ValueError(f"counts only grow: add({label!r}, {n})")
        with self._lock:
            self._counts[label] = self._counts.get(label, 0) + n

    def snapshot(self) -> dict[str, int]:
        """The count of every label seen so far (a copy)."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        """All events counted so far, over every label."""
        with self._lock:
            return sum(self._counts.values())

    def __repr__(self) -> str:
        return f"EventCounts({self.description!r}, {self.snapshot()})"
