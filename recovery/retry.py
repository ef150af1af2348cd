"""The one retry policy for store operations (tenacity).

Contract: :meth:`RetryPolicy.call` runs an operation, retries it only when it raises
:class:`~dstreams.recovery.store.errors.TransientStoreError`, with exponential backoff and full
jitter (``initial`` seconds, doubling, capped at ``maximum``), and never sleeps past the time bound
``total_seconds``. Each retry is logged at WARNING with the store, operation and key, and counted in
:data:`STORE_RETRIES` under the operation's name (process-wide, :mod:`.counters`). When the
bound is reached it raises :class:`~dstreams.recovery.store.errors.StoreUnavailableError`
("... unreachable for N s ..."), chained to the last transient error. Any other exception
propagates at once, without retry.

The bound defaults to :data:`DEFAULT_RETRY_SECONDS` and can be set with the ``retry_seconds`` option of
``open_store``, or :data:`dstreams.config.STORE_RETRY_SECONDS` (read when a store is opened): on the
driver the Spark conf key ``spark.dstreams.store.retrySeconds`` of the running SparkContext, else the
environment variable ``DSTREAMS_STORE_RETRY_SECONDS``; executors read the environment variable only.
``0`` means a single attempt.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from dstreams import config

from .counters import EventCounts
from .store.errors import StoreUnavailableError, TransientStoreError

ENV_RETRY_SECONDS = config.STORE_RETRY_SECONDS.env
DEFAULT_RETRY_SECONDS: float = config.STORE_RETRY_SECONDS.default

log = logging.getLogger("dstreams.recovery.store")

T = TypeVar("T")

#: Store operations retried after a transient error in this process, by operation (``put``, ``get``...): one per
#: retry. Read by the status server's ``dstreams_store_retries_total``.
STORE_RETRIES = EventCounts("store operations retried after a transient error, by operation")


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for transient store faults."""

    total_seconds: float = DEFAULT_RETRY_SECONDS
    initial: float = 0.1
    maximum: float = 5.0

    def __post_init__(self) -> None:
        for name in ("total_seconds", "initial", "maximum"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"RetryPolicy.{name} must be a number >= 0, got {value!r}")

    @classmethod
    def from_env(cls, total_seconds: float | None = None, *, conf: config.ConfLike | None = None,
                 **kwargs: float) -> RetryPolicy:
        """The policy with ``total_seconds`` if given, else ``spark.dstreams.store.retrySeconds`` of ``conf``
        (default: the running SparkContext's conf, none on an executor), else
        ``$DSTREAMS_STORE_RETRY_SECONDS``, else 30 s. ``ValueError`` for a value that is not a number >= 0."""
        if total_seconds is None:
            total_seconds = config.get(config.STORE_RETRY_SECONDS, conf if conf is not None else config.active_conf())
        return cls(total_seconds=float(total_seconds), **kwargs)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        backoff = min(self.maximum, self.initial * 2 ** (state.attempt_number - 1))
        remaining = self.total_seconds - (state.seconds_since_start or 0.0)
        return max(0.0, min(random.uniform(0, backoff), remaining))

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        return (state.seconds_since_start or 0.0) >= self.total_seconds

    def call(self, fn: Callable[[], T], *, op: str, key: str, where: str) -> T:
        """Run ``fn()`` under the policy; ``op``, ``key`` and ``where`` (store URL) label logs/errors."""

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            STORE_RETRIES.add(op)
            log.warning(
                "store %s: %s %r failed (attempt %d: %s); retrying in %.2f s",
                where,
                op,
                key,
                state.attempt_number,
                error,
                state.next_action.sleep if state.next_action else 0,
            )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientStoreError),
            stop=self._stop,
            wait=self._wait,
            before_sleep=before_sleep,
            reraise=False,
        )
        started = time.monotonic()
        try:
            return retrying(fn)
        except tenacity.RetryError as gave_up:
            last = gave_up.last_attempt.exception()
            raise StoreUnavailableError(
                f"store {where} was unreachable for {time.monotonic() - started:.1f} s "
                f"({gave_up.last_attempt.attempt_number} attempts, bound {self.total_seconds:g} s) during "
                f"{op} {key!r}; last error: {last}. Check that the store is up and reachable, or allow more "
                f"time with {ENV_RETRY_SECONDS} (or open_store(..., retry_seconds=...))."
            ) from last
