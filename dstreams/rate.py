"""Rate control of sources: a PID rate estimator (backpressure) and a per-source rate limiter.

Contract:

* :class:`PIDRateEstimator` turns what each completed batch measured into the rate (records per
  second, for the whole source) the next batches should ingest so that a batch is processed within
  the batch interval. :meth:`PIDRateEstimator.update` takes the batch's completion time, its number
  of records, its processing delay and its scheduling delay, and returns the new rate or ``None``
  when it has no (new) estimate: for the first usable batch (it only calibrates the estimator), for
  a batch without records or without a measured processing delay, and for a batch that does not
  complete after the last one used. A rate is never below the minimum rate.
* The control law (the design of Spark's ``PIDRateEstimator``): with ``processed`` the records per
  second the batch was processed at, the *error* is how far the last rate is above it, the
  *accumulated error* is the backlog the scheduling delay stands for, expressed as a rate
  (``scheduling delay * processed / batch interval``), and the *trend* is how fast the error
  changes; the new rate is the last rate minus ``proportional * error + integral * accumulated +
  derivative * trend``. Defaults are Spark's: 1.0, 0.2, 0.0 and a minimum of 100 records/s.
* :class:`RateLimiter` is one source's limit: a static maximum (records per partition per second,
  Spark's ``maxRatePerPartition``/``receiver.maxRate``) and, with backpressure, the estimator's
  rate (the initial rate until the estimator has one), combined into the maximum number of records
  per partition for the next batch (the smaller of the two, shared evenly by the partitions, times
  the batch interval), never below 1. ``None`` means unlimited (neither is set).
* :func:`rate_settings` reads the limiter's settings from a Spark conf (:mod:`dstreams.config`).

Plain Python objects used on the driver's event loop only (not thread-safe).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import config

#: Added before rounding a per-batch limit down, so that e.g. ``0.7 * 10`` gives 7, not 6.
_ROUNDING_SLACK = 1e-9


@dataclass(frozen=True)
class PIDGains:
    """The estimator's parameters (Spark's ``spark.streaming.backpressure.pid.*`` defaults)."""

    proportional: float = 1.0
    integral: float = 0.2
    derivative: float = 0.0
    min_rate: float = 100.0

    def __post_init__(self) -> None:
        for name in ("proportional", "integral", "derivative"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"the PID {name} gain must be a finite number >= 0, got {value}")
        if not math.isfinite(self.min_rate) or self.min_rate <= 0:
            raise ValueError(f"the minimum rate must be a finite number > 0, got {self.min_rate}")


class PIDRateEstimator:
    """Backpressure's rate estimate for one source (see the module docstring)."""

    def __init__(self, batch_interval_ms: int, gains: PIDGains | None = None) -> None:
        if batch_interval_ms <= 0:
            raise ValueError(f"the batch interval must be positive, got {batch_interval_ms} ms")
        self.batch_interval_ms = batch_interval_ms
        self.gains = gains if gains is not None else PIDGains()
        self._last_time_ms: int | None = None  # completion time of the last batch used
        self._last_rate = 0.0  # the last rate returned (after calibration: the first processing rate)
        self._last_error = 0.0
        self._estimate: float | None = None

    @property
    def estimate(self) -> float | None:
        """The last rate :meth:`update` returned (records/s), or None before the first one."""
        return self._estimate

    def update(self, time_ms: int, records: int, processing_delay_ms: int, scheduling_delay_ms: int) -> float | None:
        """Take in one completed batch; the new rate (records/s), or None when there is no new estimate."""
        if records <= 0 or processing_delay_ms <= 0:
            return None
        if self._last_time_ms is not None and time_ms <= self._last_time_ms:
            return None
        processed = records * 1000.0 / processing_delay_ms
        if self._last_time_ms is None:  # calibration: the first batch tells the processing rate, nothing more
            self._last_time_ms = time_ms
            self._last_rate = processed
            self._last_error = 0.0
            return None
        elapsed_s = (time_ms - self._last_time_ms) / 1000.0
        g = self.gains
        error = self._last_rate - processed
        accumulated = max(0, scheduling_delay_ms) * processed / self.batch_interval_ms
        trend = (error - self._last_error) / elapsed_s
        rate = max(g.min_rate, self._last_rate - g.proportional * error - g.integral * accumulated
                   - g.derivative * trend)
        self._last_time_ms = time_ms
        self._last_rate = rate
        self._last_error = error
        self._estimate = rate
        return rate


@dataclass(frozen=True)
class RateSettings:
    """What a source's :class:`RateLimiter` is built from."""

    #: Static maximum in records per partition per second (None: none).
    max_rate_per_partition: float | None = None
    backpressure: bool = False
    #: Backpressure's rate (records/s for the source) until the estimator has one (None: unlimited).
    initial_rate: float | None = None
    gains: PIDGains = PIDGains()

    @property
    def limits(self) -> bool:
        """Whether these settings can ever limit a batch."""
        return self.backpressure or self.max_rate_per_partition is not None


def rate_settings(conf: config.ConfLike | None, max_rate: config.Setting = config.SOURCE_MAX_RATE_PER_PARTITION,
                  ) -> RateSettings:
    """The rate settings in ``conf`` (then the environment), with ``max_rate`` as the static maximum's setting
    (:data:`~dstreams.config.SOURCE_MAX_RATE_PER_PARTITION` for log sources,
    :data:`~dstreams.config.RECEIVER_MAX_RATE` for receivers)."""
    return RateSettings(
        max_rate_per_partition=config.get(max_rate, conf),
        backpressure=config.get(config.BACKPRESSURE_ENABLED, conf),
        initial_rate=config.get(config.BACKPRESSURE_INITIAL_RATE, conf),
        gains=PIDGains(
            proportional=config.get(config.BACKPRESSURE_PID_PROPORTIONAL, conf),
            integral=config.get(config.BACKPRESSURE_PID_INTEGRAL, conf),
            derivative=config.get(config.BACKPRESSURE_PID_DERIVED, conf),
            min_rate=config.get(config.BACKPRESSURE_PID_MIN_RATE, conf),
        ),
    )


class RateLimiter:
    """One source's maximum records per partition per batch (see the module docstring)."""

    def __init__(self, batch_interval_ms: int, settings: RateSettings) -> None:
        if batch_interval_ms <= 0:
            raise ValueError(f"the batch interval must be positive, got {batch_interval_ms} ms")
        for name in ("max_rate_per_partition", "initial_rate"):
            value = getattr(settings, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value}")
        self.batch_interval_ms = batch_interval_ms
        self.settings = settings
        self.estimator = PIDRateEstimator(batch_interval_ms, settings.gains) if settings.backpressure else None

    def rate(self) -> float | None:
        """Backpressure's current rate for the whole source (records/s): the estimate, else the initial
        rate; None without backpressure or before any."""
        if self.estimator is None:
            return None
        estimate = self.estimator.estimate
        return estimate if estimate is not None else self.settings.initial_rate

    def max_records_per_partition(self, partitions: int) -> int | None:
        """The most records each of ``partitions`` partitions may hold in the next batch (>= 1), or None."""
        if partitions < 1:
            raise ValueError(f"a source has at least one partition, got {partitions}")
        per_second: list[float] = []
        if self.settings.max_rate_per_partition is not None:
            per_second.append(self.settings.max_rate_per_partition)
        rate = self.rate()
        if rate is not None:
            per_second.append(rate / partitions)
        if not per_second:
            return None
        per_batch = min(per_second) * self.batch_interval_ms / 1000.0
        return max(1, math.floor(per_batch + _ROUNDING_SLACK))

    def batch_completed(self, time_ms: int, records: int, processing_delay_ms: int,
                        scheduling_delay_ms: int) -> float | None:
        """Feed one completed batch to the estimator (no-op without backpressure); the new rate or None."""
        if self.estimator is None:
            return None
        return self.estimator.update(time_ms, records, processing_delay_ms, scheduling_delay_ms)
