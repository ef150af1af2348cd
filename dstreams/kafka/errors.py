"""The Kafka connector's errors: each says what went wrong, where (topic, partition, offsets) and the way out."""

from __future__ import annotations

from dstreams.errors import DStreamsError


class KafkaDataLossError(DStreamsError, RuntimeError):
    """Offsets the stream had not read are gone from the broker (retention, a deleted topic or partition, a
    truncated log). ``failOnDataLoss=False`` skips them (counted as ``recordsLost``)."""


class KafkaDecodeError(DStreamsError, ValueError):
    """A decoder or record function raised on a record: the message names topic, partition and offset."""


class KafkaReadTimeoutError(DStreamsError, RuntimeError):
    """A range reader got nothing from a partition for the poll timeout (a broker down or unreachable)."""


#: How the data-loss errors name the way out.
SKIP_LOST_HOW = (
    "To go on without them (they are lost): pass failOnDataLoss=False to the stream (kafkaStream(..., "
    "failOnDataLoss=False), or kafkaParams {'failOnDataLoss': 'false'} for KafkaUtils); a context restored from a "
    "checkpoint keeps its options, so restart with StreamingContext.getOrCreate(path, setupFunc, rebuildGraph=True) "
    "where setupFunc passes it. The skipped offsets are counted in each batch's recordsLost (status page, "
    "/metrics dstreams_input_records_lost). To lose nothing, keep records until the stream has read them "
    "(retention.ms / retention.bytes above the stream's lag)")
