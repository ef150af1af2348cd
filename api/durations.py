"""Duration parsing for the API: seconds as numbers (as PySpark) or ``"500ms"``, ``"1s"``, ``"2min"``."""

from dstreams.time import Duration, DurationLike, parse_duration

__all__ = ["Duration", "DurationLike", "parse_duration"]
