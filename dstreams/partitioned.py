"""Partition-wise (narrow) combination of RDDs that share one hash partitioner.

State streams and invertible windows keep one hash partitioning for their whole life. To merge
the previous state with a batch without shuffling the state, the RDDs are put side by side in a
partition-aware union (Spark's ``PartitionerAwareUnionRDD``: partition ``i`` of the union is the
concatenation of partition ``i`` of every parent), separated by *segment markers*, and one Python
function reads each partition's segments in order. The markers come from a tiny cached RDD with
one marker object per partition, so no data RDD is ever re-read just to tag it.

Contract of :func:`segmented_merge`: ``merge(segments)`` receives a list of iterators, one per
segment (segment ``j`` holds the records of the RDDs of group ``j``, in the order given) and
returns an iterable of records; the result keeps the partitioner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pyspark import RDD, SparkContext, StorageLevel
from pyspark.rdd import Partitioner, portable_hash

from . import jvm
from .records import consume


class SegmentMarker:
    """Separates two segments inside one partition of a segmented union."""

    __slots__ = ()

    def __reduce__(self):
        return (SegmentMarker, ())


_MARKER_TYPE = SegmentMarker


def hash_partitioner(num_partitions: int) -> Partitioner:
    """The partitioner used by every state stream and keyed window (PySpark's own hash)."""
    return Partitioner(num_partitions, portable_hash)


def union_rdds(sc: SparkContext, rdds: Sequence[RDD]) -> RDD:
    """Union of ``rdds``; partition-wise (and keeping the partitioner) when they all share one.

    The partitioner is kept only when Spark built a partition-aware union (as many partitions as
    the partitioner has), so a Python-side partitioner that the JVM does not share is never trusted.
    """
    if len(rdds) == 1:
        return rdds[0]
    out = jvm.union(sc, rdds)
    first = rdds[0].partitioner
    if first is not None and all(r.partitioner == first for r in rdds) and (
        jvm.num_partitions(out) == first.numPartitions
    ):
        out.partitioner = first
    return out


class _MarkerCache:
    """One cached marker RDD per (SparkContext, number of partitions)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rdds: dict[tuple[int, int], RDD] = {}

    def get(self, sc: SparkContext, num_partitions: int) -> RDD:
        key = (id(sc), num_partitions)
        with self._lock:
            rdd = self._rdds.get(key)
            if rdd is None or rdd.ctx._jsc is None:
                rdd = (
                    sc.parallelize([], 1)
                    .partitionBy(num_partitions, portable_hash)
                    .mapPartitions(_one_marker, preservesPartitioning=True)
                    .persist(StorageLevel.MEMORY_ONLY)
                )
                rdd.setName(f"dstreams-segment-markers-{num_partitions}")
                self._rdds[key] = rdd
            return rdd


def _one_marker(it: Iterable[Any]) -> list[SegmentMarker]:
    consume(it)
    return [SegmentMarker()]


MARKERS = _MarkerCache()


def partition_aligned_rdd(sc: SparkContext, num_partitions: int, read: Callable[[int], Iterable[Any]]) -> RDD:
    """An RDD whose partition ``i`` is ``read(i)`` and that keeps the state partitioning of ``num_partitions``.

    Built on the (cached, hash-partitioned) segment markers, so Spark sees a partitioned RDD and merges
    with it stay narrow: what a reader of a partitioned checkpoint builds on.
    """

    def partition(i: int, it: Iterable[Any]) -> Iterable[Any]:
        consume(it)  # the marker: read it, or the Python worker is not reused
        return read(i)

    return MARKERS.get(sc, num_partitions).mapPartitionsWithIndex(partition, preservesPartitioning=True)


def ensure_partitioned(rdd: RDD, partitioner: Partitioner) -> RDD:
    """``rdd`` hash-partitioned by ``partitioner`` (a shuffle only when it is not already)."""
    return jvm.shuffle(rdd, partitioner)


def split_segments(it: Iterable[Any], count: int) -> list[list[Any]]:
    """Split one partition of a segmented union into ``count`` lists (consumes ``it``)."""
    segments: list[list[Any]] = [[] for _ in range(count)]
    j = 0
    current = segments[0]
    marker = _MARKER_TYPE
    for x in it:
        if x.__class__ is marker:
            j += 1
            current = segments[j]
        else:
            current.append(x)
    return segments


def segmented_merge(
    sc: SparkContext,
    groups: Sequence[Sequence[RDD]],
    partitioner: Partitioner,
    merge: Callable[[list[list[Any]]], Iterable[Any]],
) -> RDD:
    """Merge groups of co-partitioned RDDs partition by partition (no shuffle).

    Every RDD in ``groups`` must already be partitioned by ``partitioner``.
    """
    n = partitioner.numPartitions
    parts: list[RDD] = []
    markers = MARKERS.get(sc, n)
    for j, group in enumerate(groups):
        if j > 0:
            parts.append(markers)
        for r in group:
            if r.partitioner != partitioner:
                raise ValueError("segmented_merge: every RDD must share the state's partitioner")
            parts.append(r)
    count = len(groups)

    def run(it: Iterator[Any]) -> Iterable[Any]:
        return merge(split_segments(it, count))

    union = union_rdds(sc, parts)
    if union.partitioner != partitioner:
        raise RuntimeError("internal: partition-aware union lost its partitioner")
    return union.mapPartitions(run, preservesPartitioning=True)


def require_pair(x: Any, op: str) -> tuple[Any, Any]:
    """``x`` as a (key, value) pair, or a TypeError that says how to make one."""
    if type(x) is tuple and len(x) == 2:
        return x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return (x[0], x[1])
    raise TypeError(
        f"{op} needs a stream of (key, value) pairs, but got the element {x!r:.200} "
        f"of type {type(x).__name__}; map the stream to pairs first, e.g. .map(lambda x: (x, 1))"
    )


def checked_pairs(op: str) -> Callable[[Iterable[Any]], Iterator[tuple[Any, Any]]]:
    """A mapPartitions function that passes pairs through and fails clearly on anything else."""

    def check(it: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        for x in it:
            if type(x) is tuple and len(x) == 2:
                yield x
            else:
                yield require_pair(x, op)

    return check


_MISSING = object()


def reduce_pairs(func: Callable[[Any, Any], Any], pairs: Iterable[tuple[Any, Any]],
                 acc: dict[Any, Any] | None = None) -> dict[Any, Any]:
    """Fold ``pairs`` into ``acc`` (a new dict by default) by key with ``func``, in order; returns ``acc``.

    A key seen for the first time keeps its value as is; later values are ``func(previous, value)``.
    """
    acc = {} if acc is None else acc
    get = acc.get
    missing = _MISSING
    for k, v in pairs:
        old = get(k, missing)
        acc[k] = v if old is missing else func(old, v)
    return acc


def combiner(func: Callable[[Any, Any], Any], op: str) -> Callable[[Iterable[Any]], Iterable[tuple[Any, Any]]]:
    """The map-side combine of :func:`pre_reduce`: a partition's pairs reduced by key with ``func``,
    in input order; a record that is not a pair fails with the error of :func:`require_pair`."""

    # Hot loop (one step per record): one dict lookup and one store per record.
    def combine(it: Iterable[Any]) -> Iterable[tuple[Any, Any]]:
        acc: dict[Any, Any] = {}
        get = acc.get
        missing = _MISSING
        for x in it:
            if type(x) is tuple and len(x) == 2:
                k, v = x
            else:
                k, v = require_pair(x, op)
            old = get(k, missing)
            acc[k] = v if old is missing else func(old, v)
        return acc.items()

    return combine


def pre_reduce(rdd: RDD, func: Callable[[Any, Any], Any], partitioner: Partitioner, op: str) -> RDD:
    """Per-batch reduce by key into ``partitioner`` (map-side combine, one shuffle)."""

    def merge(it: Iterable[tuple[Any, Any]]) -> Iterable[tuple[Any, Any]]:
        return reduce_pairs(func, it).items()

    return jvm.shuffle(rdd.mapPartitions(combiner(func, op)), partitioner).mapPartitions(
        merge, preservesPartitioning=True)


def pre_group_ordered(rdd: RDD, partitioner: Partitioner, op: str) -> RDD:
    """Per-batch group by key that keeps each key's values in input order (deterministic).

    Records are tagged with their input partition on the map side; after the shuffle each key's
    chunks are ordered by that tag, so the value list is the same whatever order the shuffle
    fetched the map outputs in. Output records: ``(key, [values...])``.
    """

    def combine(index: int, it: Iterable[Any]) -> Iterable[tuple[Any, tuple[int, list[Any]]]]:
        acc: dict[Any, list[Any]] = {}
        for x in it:
            k, v = x if (type(x) is tuple and len(x) == 2) else require_pair(x, op)
            lst = acc.get(k)
            if lst is None:
                acc[k] = [v]
            else:
                lst.append(v)
        return ((k, (index, vs)) for k, vs in acc.items())

    def merge(it: Iterable[tuple[Any, tuple[int, list[Any]]]]) -> Iterable[tuple[Any, list[Any]]]:
        acc: dict[Any, list[tuple[int, list[Any]]]] = {}
        for k, chunk in it:
            lst = acc.get(k)
            if lst is None:
                acc[k] = [chunk]
            else:
                lst.append(chunk)
        for k, chunks in acc.items():
            if len(chunks) == 1:
                yield k, chunks[0][1]
            else:
                chunks.sort(key=lambda c: c[0])
                yield k, [v for _, vs in chunks for v in vs]

    grouped = jvm.shuffle(rdd.mapPartitionsWithIndex(combine), partitioner)
    return grouped.mapPartitions(merge, preservesPartitioning=True)
