"""A deterministic generator source whose records are made inside the executors.

Contract: batch ``t`` is an RDD of ``num_partitions`` partitions; partition ``p`` holds the records
``record_func(seed, t, p, n)`` returns, where ``n`` is the number of records per partition for that
batch. Nothing but ``(t, p, n)`` leaves the driver, so the driver is not the bottleneck, and the
batch can be rebuilt identically from ``(seed, t)`` after any failure (replay by seed).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from ..records import consume
from ..time import BatchTime
from .input import InputNode

if TYPE_CHECKING:
    from ..graph import DStreamGraph

RecordFunc = Callable[[int, int, int, int], Iterable[Any]]

_WORDS = (
    "the quick brown fox jumps over lazy dog stream spark batch window state lineage checkpoint "
    "record partition driver executor shuffle reduce count word error warning info debug page view "
    "click user session alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi"
).split()


def text_records(seed: int, time_ms: int, partition: int, n: int, record_bytes: int = 100) -> Iterator[str]:
    """``n`` pseudo-random text lines of ``record_bytes`` characters made of common words.

    Deterministic in ``(seed, time_ms, partition)``. A pool of up to 256 distinct lines is drawn
    first, then each record is a pool line picked by one random byte: the per-record cost is a C-level
    ``map`` step (tens of ns), so generation stays much cheaper than the work measured downstream.
    """
    rng, pool = _line_pool(seed, time_ms, partition, n, record_bytes)
    pool_size = len(pool)
    if pool_size == _POOL:
        return map(pool.__getitem__, rng.randbytes(n))
    choice = rng.randrange
    return iter([pool[choice(pool_size)] for _ in range(n)])


def text_record_batches(seed: int, time_ms: int, partition: int, n: int, record_bytes: int = 100,
                        batch_size: int = 65_536) -> Iterator[Any]:
    """The lines of :func:`text_records` (the very same ones, in order) as Arrow record batches.

    Each ``pyarrow.RecordBatch`` has one string column ``value`` of at most ``batch_size`` lines. As a
    ``generatorStream`` ``recordFunc`` it makes a stream whose elements are record batches, which
    ``mapArrowBatches`` hands to its function as they are: a vectorized path from source to result
    with no Python object per record.
    """
    import pyarrow as pa

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if n <= 0:
        return iter(())
    rng, pool = _line_pool(seed, time_ms, partition, n, record_bytes)
    if len(pool) == _POOL:
        picks = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(rng.randbytes(n))])
        lines = pa.array(pool, pa.string()).take(picks)
    else:
        choice = rng.randrange
        lines = pa.array([pool[choice(len(pool))] for _ in range(n)], pa.string())
    return (pa.RecordBatch.from_arrays([lines.slice(i, batch_size)], names=["value"])
            for i in range(0, n, batch_size))


def _line_pool(seed: int, time_ms: int, partition: int, n: int, record_bytes: int) -> tuple[random.Random, list[str]]:
    """The seeded generator of ``(seed, time_ms, partition)`` and the pool of lines drawn from it first."""
    rng = random.Random(f"{seed}:{time_ms}:{partition}")
    words = _WORDS
    pool_size = min(n, _POOL) or 1
    pool: list[str] = []
    for _ in range(pool_size):
        parts: list[str] = []
        size = 0
        while size < record_bytes:
            w = words[rng.randrange(len(words))]
            parts.append(w)
            size += len(w) + 1
        pool.append(" ".join(parts)[:record_bytes].ljust(record_bytes))
    return rng, pool


#: Lines per generator pool: one random byte picks a line.
_POOL = 256


class GeneratorInputNode(InputNode):
    """``generatorStream``: ``records_per_partition`` records per batch in each of ``num_partitions``."""

    def __init__(
        self,
        graph: DStreamGraph,
        records_per_partition: int,
        num_partitions: int,
        seed: int,
        record_func: RecordFunc | None,
    ) -> None:
        super().__init__(graph)
        if records_per_partition < 0:
            raise ValueError(f"recordsPerPartition must be >= 0, got {records_per_partition}")
        if num_partitions <= 0:
            raise ValueError(f"numPartitions must be positive, got {num_partitions}")
        self.records_per_partition = int(records_per_partition)
        self.num_partitions = int(num_partitions)
        self.seed = int(seed)
        self.record_func: RecordFunc = record_func or text_records
        self._base: RDD | None = None

    def describe_params(self) -> list[str]:
        return [f"records={self.records_per_partition}", f"partitions={self.num_partitions}", f"seed={self.seed}"]

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_base": None}

    def compute(self, time: BatchTime) -> RDD | None:
        replayed = self.replayed_offsets(time)
        seed = int(replayed["seed"]) if replayed is not None else self.seed
        t, n, func = time.ms, self.records_per_partition, self.record_func

        def gen(partition: int, it: Iterable[Any]) -> Iterable[Any]:
            consume(it)  # the partition number: read it, or the Python worker is not reused
            return func(seed, t, partition, n)

        rdd = self._partitions_rdd().mapPartitionsWithIndex(gen)
        self.report_batch(time, n * self.num_partitions, {"seed": seed, "time": t})  # last: the batch is fixed
        return rdd

    def _partitions_rdd(self) -> RDD:
        """One ``parallelize(range(P), P)`` reused by every batch: building it costs the driver a
        serialisation and several Py4J calls per batch; each batch's RDD is a new map over it."""
        sc = self.graph.sc
        rdd = self._base
        if rdd is None or rdd.ctx is not sc or sc._jsc is None:
            rdd = sc.parallelize(range(self.num_partitions), self.num_partitions)
            self._base = rdd
        return rdd
