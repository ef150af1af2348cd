"""The RDD of one Kafka batch: one task per offset-range piece, with ``offsetRanges()`` (pyspark 2.4's ``KafkaRDD``).

:class:`KafkaRDD` is a ``PipelinedRDD``: the operators applied to it (``map``, ``filter``, ``reduceByKey``'s
combine) run in the same Python pass as the read, as for any PySpark source; ``offsetRanges()`` lists one
:class:`~dstreams.kafka.offsets.OffsetRange` per topic-partition of the batch (empty ones included, as Spark's),
whatever the number of tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pyspark import RDD, SparkContext
from pyspark.core.rdd import PipelinedRDD

from ..records import consume
from .offsets import OffsetRange
from .reader import read_range
from .records import KafkaRecord


class KafkaRDD(PipelinedRDD):
    """An RDD that reads Kafka offset ranges; :meth:`offsetRanges` says which."""

    def __init__(self, prev: RDD, func: Callable[[int, Iterable[Any]], Iterable[Any]],
                 offset_ranges: Sequence[OffsetRange]) -> None:
        super().__init__(prev, func, False)
        self._offset_ranges = list(offset_ranges)

    def offsetRanges(self) -> list[OffsetRange]:
        """One range per topic-partition of this RDD (pyspark 2.4's ``KafkaRDD.offsetRanges``)."""
        return list(self._offset_ranges)


def kafka_rdd(sc: SparkContext, conf: dict[str, Any], ranges: Sequence[OffsetRange], tasks: Sequence[OffsetRange],
              decode: Callable[[KafkaRecord], Any] | None, fail_on_data_loss: bool, poll_timeout_s: float,
              on_decode_error: Callable[[KafkaRecord, BaseException], Any] | None = None) -> KafkaRDD:
    """A :class:`KafkaRDD` whose partition ``i`` reads ``tasks[i]`` (pieces of ``ranges``, which
    ``offsetRanges()`` returns); no task when ``tasks`` is empty."""
    work = [r.to_json() for r in tasks]

    def part(i: int, it: Iterable[Any]) -> Iterator[Any]:
        consume(it)
        return read_range(conf, OffsetRange.from_json(work[i]), decode, fail_on_data_loss, poll_timeout_s,
                          on_decode_error)

    prev = sc.parallelize(range(len(work)), len(work)) if work else sc.emptyRDD()
    return KafkaRDD(prev, lambda i, it: part(i, it), ranges)
