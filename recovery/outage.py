"""Riding out a checkpoint-store outage: which errors are an outage, and how long to wait for the store.

One store operation retries transient faults for up to ``spark.dstreams.store.retrySeconds`` (30 s, in
:mod:`.retry`) and then raises :class:`StoreUnavailableError`. A longer outage is ridden out one level up,
everywhere the driver depends on the store, by one :class:`StoreOutagePolicy` (the composition root,
:mod:`.runtime`, gives the same instance to all of them):

* the metadata log's commits (:mod:`.journal`),
* data checkpoints (:mod:`.checkpointer`): a write is tried again; past the bound it is given up (the
  stream goes on, its lineage is cut by the next checkpoint that commits),
* building a batch (a file source listing an ``s3://`` prefix, the socket source's write-ahead log),
* running a batch's output operations (a sink's parts written by the executors, its ``_SUCCESS`` marker):
  the output operation is run again, which the exactly-once sinks make safe; the batch is not reported
  as done before it succeeded.

Each waits and retries (a warning each time, counted in :data:`OUTAGE_WAITS`) until
``spark.dstreams.store.outageSeconds`` (900 s) has passed since the outage began for that operation; then the
error propagates (a clear error, nothing lost: ``getOrCreate`` resumes from the metadata log). An error raised
inside an executor reaches the driver as a Spark task failure whose text names the store's error type: that
counts as an outage too (:func:`dstreams.errors.failed_with` tells). The journal and the checkpointer wait through
:func:`ride_out`; the scheduler has its own loop over the same policy.
"""

from __future__ import annotations

import logging
import threading
import time as _time
from collections.abc import Callable
from typing import TypeVar

from dstreams import config
from dstreams.contracts import OutagePolicy, SourceUnavailableError
from dstreams.errors import failed_with

from .counters import EventCounts
from .store.errors import StoreUnavailableError, TransientStoreError

log = logging.getLogger(__name__)

T = TypeVar("T")

_OUTAGE_ERRORS = (StoreUnavailableError, TransientStoreError, SourceUnavailableError)
_SETTING = config.STORE_OUTAGE_SECONDS

#: Waits for an unavailable store in this process (one per :meth:`StoreOutagePolicy.retry_delay` that returns a
#: delay, label ``""``). Read by the status server's ``dstreams_store_outage_waits_total``.
OUTAGE_WAITS = EventCounts("waits for an unavailable store")


def outage_seconds_from_env(conf: config.ConfLike | None = None) -> float:
    """The outage bound in seconds (>= 0): ``spark.dstreams.store.outageSeconds`` of ``conf`` (default: the
    running SparkContext's conf), else ``$DSTREAMS_STORE_OUTAGE_SECONDS``, else the default (15 min).
    ``ValueError`` for a value that is not a number of seconds >= 0."""
    return float(config.get(_SETTING, conf if conf is not None else config.active_conf()))


def is_store_outage(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is the store, or a source's server, being unavailable (on the driver
    or in a task: :func:`dstreams.errors.failed_with`)."""
    return failed_with(error, *_OUTAGE_ERRORS)


class StoreOutagePolicy:
    """The engine's ``OutagePolicy`` for checkpoint and data stores (see the module docstring).

    :param outage_seconds: the bound; default :func:`outage_seconds_from_env` (read once, here).
    """

    def __init__(self, outage_seconds: float | None = None) -> None:
        self.outage_seconds = outage_seconds_from_env() if outage_seconds is None else float(outage_seconds)

    def is_outage(self, error: BaseException) -> bool:
        return is_store_outage(error)

    def retry_delay(self, error: BaseException, waited_s: float, what: str) -> float | None:
        """Seconds to wait before ``what`` is tried again, or None: not an outage, or waited long enough.

        Logs a warning for each wait (what waits, for how long so far, the bound and how to change it) and counts
        it in :data:`OUTAGE_WAITS`, and logs an error when it gives up on an outage."""
        if not is_store_outage(error):
            return None
        if waited_s >= self.outage_seconds:
            log.error("the store stayed unavailable for %.0f s: %s gives up (set %s or %s to wait longer)",
                      waited_s, what, _SETTING.key, _SETTING.env)
            return None
        delay = min(10.0, max(1.0, waited_s / 4), self.outage_seconds - waited_s)
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        OUTAGE_WAITS.add()
        log.warning("store unavailable for %.0f s (%s); %s waits and retries in %.0f s (gives up after %.0f s, set "
                    "%s or %s to change)", waited_s, reason, what, delay, self.outage_seconds, _SETTING.key,
                    _SETTING.env)
        return delay


def ride_out(policy: OutagePolicy, what: str, func: Callable[[], T], stop: threading.Event) -> T:
    """``func()``, tried again while ``policy`` says the checkpoint store is down and worth waiting for.

    * Returns what ``func`` returns. If it succeeded after an outage, logs the warning "checkpoint store is
      back after N s".
    * An error ``policy.retry_delay`` does not retry (not an outage, or the outage has lasted the bound
      since ``ride_out`` was called; the policy logs why) propagates at once.
    * Between attempts it waits on ``stop``, not with ``time.sleep``: once ``stop`` is set (before or
      during a wait) the last error propagates at once, so a stopping driver is not held up.

    ``what`` names the operation in the log ("recording the completion of batch 3000"). ``func`` must be
    safe to run again after it failed (the callers' writes are idempotent: same keys, same bytes).
    """
    started = _time.monotonic()
    retried = False
    while True:
        try:
            result = func()
        except Exception as e:
            if stop.is_set():
                raise
            delay = policy.retry_delay(e, _time.monotonic() - started, what)
            if delay is None:
                raise
            retried = True
            if stop.wait(delay):
                log.info("%s stops waiting for the store: stopping (%s)", what, e)
                raise
            continue
        if retried:
            log.warning("checkpoint store is back after %.0f s: %s succeeded", _time.monotonic() - started, what)
        return result
