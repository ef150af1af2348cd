"""Records written by an output operation, as reported by the sink that wrote them.

Contract:

* The scheduler runs each output operation of a batch inside :func:`counting` (on the thread that runs
  it); a sink that knows how many records it wrote calls :func:`add_written` on that thread (the
  engine's exactly-once sinks do, once per write they commit; a batch whose output was already committed
  by an earlier run adds 0). The count is then ``OutputOperationInfo.records_written``.
* An operation whose sink reports nothing (``foreachRDD`` with the user's own function, ``pprint``) has
  ``None``: unknown, not zero.
* Counts are exact: the sinks count the records each partition's one successful task wrote (the task
  results of a job, or an accumulator updated in the job's result tasks, which Spark applies once per
  partition), never retried or speculative attempts twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class WrittenCount:
    """What the sinks of one output operation reported: ``total`` records, ``None`` while none reported."""

    def __init__(self) -> None:
        self.total: int | None = None

    def add(self, n: int) -> None:
        self.total = (self.total or 0) + n


@contextmanager
def counting() -> Iterator[WrittenCount]:
    """Count what sinks report on this thread until the block ends (nested blocks count separately)."""
    outer = getattr(_local, "count", None)
    count = _local.count = WrittenCount()
    try:
        yield count
    finally:
        _local.count = outer


def add_written(n: int) -> None:
    """Report ``n`` records written by a sink on this thread (ignored outside :func:`counting`)."""
    count = getattr(_local, "count", None)
    if count is not None:
        count.add(n)
