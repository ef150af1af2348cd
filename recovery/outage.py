"""Riding out a checkpoint-store outage: which errors are an outage, and how long to wait for the store.

One store operation retries transient faults for up to ``spark.dstreams.store.retrySeconds`` (30 s, in
:mod:`.retry`) and then raises :class:`StoreUnavailableError`. A longer outage is ridden out one level up,
everywhere the driver depends on the store, by :class:`StoreOutagePolicy`:

* the metadata log's commits (:mod:`.journal`),
* building a batch (a file source listing an ``s3://`` prefix, the socket source's write-ahead log),
* running a batch's output operations (a sink's parts written by the executors, its ``_SUCCESS`` marker):
  the output operation is run again, which the exactly-once sinks make safe; the batch is not reported
  as done before it succeeded.

Each waits and retries (a warning each time) until ``spark.dstreams.store.outageSeconds`` (900 s) has
passed since the outage began for that operation; then the error propagates (a clear error, nothing lost:
``getOrCreate`` resumes from the metadata log). An error raised inside an executor reaches the driver as a
Spark task failure whose text names the store's error type: that counts as an outage too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from dstreams import config

from .store.errors import StoreUnavailableError, TransientStoreError

log = logging.getLogger(__name__)

_NAMES = (StoreUnavailableError.__name__, TransientStoreError.__name__)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_store_outage(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is the store being unavailable, on the driver or in a task."""
    for e in _chain(error):
        if isinstance(e, (StoreUnavailableError, TransientStoreError)):
            return True
        if type(e).__name__ == "Py4JJavaError" and any(name in str(e) for name in _NAMES):
            return True
    return False


class StoreOutagePolicy:
    """The engine's ``OutagePolicy`` for checkpoint and data stores (see the module docstring)."""

    def __init__(self, outage_seconds: float | None = None) -> None:
        self.outage_seconds = (float(config.get(config.STORE_OUTAGE_SECONDS, config.active_conf()))
                               if outage_seconds is None else float(outage_seconds))

    def is_outage(self, error: BaseException) -> bool:
        return is_store_outage(error)

    def retry_delay(self, error: BaseException, waited_s: float, what: str) -> float | None:
        """Seconds to wait before ``what`` is tried again, or None: not an outage, or waited long enough."""
        if not is_store_outage(error):
            return None
        if waited_s >= self.outage_seconds:
            log.error("the store stayed unavailable for %.0f s: %s gives up (raise "
                      "spark.dstreams.store.outageSeconds to wait longer)", waited_s, what)
            return None
        delay = min(10.0, max(1.0, waited_s / 4), self.outage_seconds - waited_s)
        log.warning("store unavailable for %.0f s (%s); %s waits %.0f s and tries again (gives up after %.0f s, "
                    "spark.dstreams.store.outageSeconds)", waited_s, str(error).splitlines()[0][:200] if str(error)
                    else type(error).__name__, what, delay, self.outage_seconds)
        return delay
