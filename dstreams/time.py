"""Integer-millisecond time for the engine.

Contract: every instant and every length of time inside the engine is an ``int`` number of
milliseconds wrapped in :class:`BatchTime` (an instant, ms since the epoch or since a manual
clock's zero) or :class:`Duration` (a length). Floats never enter the engine: user-facing
durations are parsed once (``"500ms"``, ``"1s"``, ``"2min"`` or a number of seconds, as PySpark
accepts) by :func:`parse_duration`.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass
from numbers import Real
from typing import overload

__all__ = ["BatchTime", "Duration", "DurationLike", "parse_duration", "to_datetime"]


@dataclass(frozen=True, order=True)
class Duration:
    """A length of time in integer milliseconds (user input is checked positive by parse_duration)."""

    ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.ms, int) or isinstance(self.ms, bool):
            raise TypeError(f"Duration needs an int number of milliseconds, got {self.ms!r}")

    def __add__(self, other: Duration) -> Duration:
        return Duration(self.ms + other.ms)

    def __sub__(self, other: Duration) -> Duration:
        return Duration(self.ms - other.ms)

    def __mul__(self, k: int) -> Duration:
        return Duration(self.ms * k)

    __rmul__ = __mul__

    def __floordiv__(self, other: Duration) -> int:
        return self.ms // other.ms

    def is_multiple_of(self, other: Duration) -> bool:
        """True when this duration is a whole number of ``other`` (``other`` must be positive)."""
        return other.ms > 0 and self.ms % other.ms == 0

    @property
    def seconds(self) -> float:
        return self.ms / 1000.0

    def __str__(self) -> str:
        return format_ms(self.ms)


@dataclass(frozen=True, order=True)
class BatchTime:
    """An instant in integer milliseconds (the end of a batch interval)."""

    ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.ms, int) or isinstance(self.ms, bool):
            raise TypeError(f"BatchTime needs an int number of milliseconds, got {self.ms!r}")

    def __add__(self, d: Duration) -> BatchTime:
        return BatchTime(self.ms + d.ms)

    @overload
    def __sub__(self, other: BatchTime) -> Duration: ...

    @overload
    def __sub__(self, other: Duration) -> BatchTime: ...

    def __sub__(self, other: Duration | BatchTime) -> Duration | BatchTime:
        if isinstance(other, BatchTime):
            return Duration(self.ms - other.ms)
        return BatchTime(self.ms - other.ms)

    def floor(self, d: Duration, zero: BatchTime | None = None) -> BatchTime:
        """The latest instant ``<= self`` that lies on the grid ``zero + k * d``."""
        z = zero.ms if zero is not None else 0
        return BatchTime(z + ((self.ms - z) // d.ms) * d.ms)

    def is_aligned(self, d: Duration, zero: BatchTime) -> bool:
        return (self.ms - zero.ms) % d.ms == 0

    def until(self, end: BatchTime, step: Duration) -> list[BatchTime]:
        """Instants ``self, self+step, ...`` that are ``< end``."""
        return [BatchTime(t) for t in range(self.ms, end.ms, step.ms)]

    def to(self, end: BatchTime, step: Duration) -> list[BatchTime]:
        """Instants ``self, self+step, ...`` that are ``<= end``."""
        return [BatchTime(t) for t in range(self.ms, end.ms + 1, step.ms)]

    def __str__(self) -> str:
        return f"{self.ms} ms"


DurationLike = Duration | int | float | str

_UNITS_MS = {
    "ms": 1,
    "milli": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


def parse_duration(value: DurationLike, what: str = "duration", allow_zero: bool = False) -> Duration:
    """Turn a user-facing duration into a :class:`Duration`.

    Accepts a :class:`Duration`, a number of **seconds** (``1``, ``0.5``: PySpark's convention) or
    a string with a unit (``"500ms"``, ``"1s"``, ``"2min"``, ``"1h"``). The result must be a whole
    number of milliseconds and positive (zero only with ``allow_zero``). Anything else raises
    ``ValueError``/``TypeError`` naming ``what`` and the accepted forms.
    """
    if isinstance(value, Duration):
        ms = value.ms
    elif isinstance(value, bool):
        raise TypeError(f"{what} must be seconds (a number) or a string like '500ms', '1s', '2min'; got {value!r}")
    elif isinstance(value, Real):
        f = float(value)
        if math.isnan(f) or math.isinf(f):
            raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
        ms_f = f * 1000.0
        ms = round(ms_f)
        if abs(ms_f - ms) > 1e-6:
            raise ValueError(f"{what} must be a whole number of milliseconds, got {value!r} seconds")
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m or m.group(2).lower() not in _UNITS_MS:
            raise ValueError(
                f"malformed {what} {value!r}: use a number with a unit, e.g. '500ms', '1s', '2min', '1h', "
                "or a number of seconds"
            )
        ms_f = float(m.group(1)) * _UNITS_MS[m.group(2).lower()]
        ms = round(ms_f)
        if abs(ms_f - ms) > 1e-6:
            raise ValueError(f"{what} {value!r} is not a whole number of milliseconds")
    elif isinstance(value, _dt.timedelta):
        ms = value // _dt.timedelta(milliseconds=1)
    else:
        raise TypeError(
            f"{what} must be seconds (a number) or a string like '500ms', '1s', '2min'; "
            f"got {type(value).__name__} {value!r}"
        )
    if ms < 0 or (ms == 0 and not allow_zero):
        raise ValueError(f"{what} must be positive, got {value!r}")
    return Duration(int(ms))


def format_ms(ms: int) -> str:
    """Human form of a millisecond count: ``1500 -> '1.5s'``, ``250 -> '250ms'``."""
    if ms % 60_000 == 0 and ms >= 60_000:
        return f"{ms // 60_000}min"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    if ms > 1000:
        return f"{ms / 1000:g}s"
    return f"{ms}ms"


def to_datetime(t: BatchTime) -> _dt.datetime:
    """The timezone-aware local datetime of a batch time (what user callbacks receive)."""
    return _dt.datetime.fromtimestamp(t.ms / 1000.0).astimezone()


def from_user_time(value: _dt.datetime | int | float | BatchTime) -> BatchTime:
    """A user-given instant (datetime, unix seconds, or BatchTime) as a BatchTime."""
    if isinstance(value, BatchTime):
        return value
    if isinstance(value, _dt.datetime):
        return BatchTime(round(value.timestamp() * 1000))
    if isinstance(value, Real) and not isinstance(value, bool):
        return BatchTime(round(float(value) * 1000))
    raise TypeError(f"expected a datetime or unix timestamp in seconds, got {value!r}")
