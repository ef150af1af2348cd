"""dstreams: D-Streams (Zaharia et al., SOSP 2013) on PySpark RDDs.

``from dstreams import StreamingContext`` is a drop-in replacement for
``from pyspark.streaming import StreamingContext``; the paper's operators (``runningReduce``,
``track``, windows with duration strings) come on top.

The user-facing names are loaded on first use (PEP 562): executors that unpickle an engine
object import ``dstreams`` and must not pay for the api and recovery layers (boto3, tenacity).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dstreams.api.context import StreamingContext, StreamingContextStateError
    from dstreams.api.stream import DStream
    from dstreams.clock import ManualClock, SystemClock
    from dstreams.errors import DStreamsError
    from dstreams.listener import BatchInfo, OutputOperationInfo, StreamingListener
    from dstreams.nodes.timers import Timer, TrackUpdate
    from dstreams.scheduler import BatchFailedError
    from dstreams.time import BatchTime, Duration, parse_duration

__all__ = [
    "StreamingContext",
    "StreamingContextStateError",
    "DStream",
    "ManualClock",
    "SystemClock",
    "BatchInfo",
    "OutputOperationInfo",
    "StreamingListener",
    "BatchFailedError",
    "DStreamsError",
    "BatchTime",
    "Duration",
    "parse_duration",
    "TrackUpdate",
    "Timer",
]

_EXPORTS = {
    "StreamingContext": "dstreams.api.context",
    "StreamingContextStateError": "dstreams.api.context",
    "DStream": "dstreams.api.stream",
    "ManualClock": "dstreams.clock",
    "SystemClock": "dstreams.clock",
    "BatchInfo": "dstreams.listener",
    "OutputOperationInfo": "dstreams.listener",
    "StreamingListener": "dstreams.listener",
    "BatchFailedError": "dstreams.scheduler",
    "DStreamsError": "dstreams.errors",
    "BatchTime": "dstreams.time",
    "Duration": "dstreams.time",
    "parse_duration": "dstreams.time",
    "TrackUpdate": "dstreams.nodes.timers",
    "Timer": "dstreams.nodes.timers",
}

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dstreams' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
