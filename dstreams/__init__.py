"""dstreams: D-Streams (Zaharia et al., SOSP 2013) on PySpark RDDs.

``from dstreams import StreamingContext`` is a drop-in replacement for
``from pyspark.streaming import StreamingContext``; the paper's operators (``runningReduce``,
``track``, windows with duration strings) come on top.
"""

from dstreams.api.context import StreamingContext, StreamingContextStateError
from dstreams.api.stream import DStream
from dstreams.clock import ManualClock, SystemClock
from dstreams.listener import BatchInfo, OutputOperationInfo, StreamingListener
from dstreams.scheduler import BatchFailedError
from dstreams.time import BatchTime, Duration, parse_duration

__all__ = [
    "StreamingContext",
    "DStream",
    "StreamingListener",
    "StreamingContextStateError",
    "BatchFailedError",
    "ManualClock",
    "SystemClock",
    "BatchInfo",
    "OutputOperationInfo",
    "BatchTime",
    "Duration",
    "parse_duration",
]

__version__ = "0.1.0"
