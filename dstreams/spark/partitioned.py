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

import builtins
import operator
import threading
from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pyspark import RDD, SparkContext, StorageLevel
from pyspark.core.rdd import Partitioner, portable_hash

from ..records import consume
from . import jvm


class SegmentMarker:
    """Separates two segments inside one partition of a segmented union."""

    __slots__ = ()

    def __reduce__(self) -> tuple[type[SegmentMarker], tuple[()]]:
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
    merge: Callable[..., Iterable[Any]],
    with_index: bool = False,
) -> RDD:
    """Merge groups of co-partitioned RDDs partition by partition (no shuffle).

    Every RDD in ``groups`` must already be partitioned by ``partitioner``. ``merge(segments)`` gets one list
    of records per group; with ``with_index``, ``merge(partition, segments)``.
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

    def run(it: Iterable[Any]) -> Iterable[Any]:
        return merge(split_segments(it, count))

    def run_indexed(i: int, it: Iterable[Any]) -> Iterable[Any]:
        return merge(i, split_segments(it, count))

    union = union_rdds(sc, parts)
    if union.partitioner != partitioner:
        raise RuntimeError("internal: partition-aware union lost its partitioner")
    if with_index:
        return union.mapPartitionsWithIndex(run_indexed, preservesPartitioning=True)
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


# ----------------------------------------------------------------------------------------- folds by key
# The hot loops of every reduce by key (map-side combine, post-shuffle merge, window and state merges):
# one step per record. Each reduce function has two loops, for two shapes of input:
#
# * *hits* (first): most keys are already in the dict (a word count: ~50 words in 100,000 pairs). The
#   lookup is a plain ``acc[k]`` in a ``try`` (free in CPython 3.11 unless it raises), no method call;
# * *new*: most keys are new (``k in acc`` first, as a ``KeyError`` costs more than a lookup). The hits
#   loop hands the rest of the partition to it after :data:`MISSES_BEFORE_SWITCH` new keys.
#
# The functions the engine recognises (``operator.add``, the built-in ``max`` and ``min``:
# :func:`recognised`) are inlined: ``old + v`` is what ``operator.add(old, v)`` computes (both are
# ``PyNumber_Add``), ``v if v > old else old`` what ``max(old, v)`` returns (the built-in keeps the first
# of equal items and compares ``v > old``), ``v if v < old else old`` ``min(old, v)``'s; so every value,
# type and exception is the generic loop's. A key's first value is kept as it is, later values are
# ``func(previous, value)``, in input order; the dict keeps each key's first key object and first-seen
# order. The eight loops below are spelled out on purpose: CPython inlines nothing, and a shared helper
# or a per-record branch on the function would put back the per-pair cost this removes.

#: New keys the *hits* loop of :func:`fold` takes (each a caught ``KeyError``) before it hands the rest of
#: the input to the *new* loop: bounds the exceptions' cost on data with many distinct keys (~1 ms).
MISSES_BEFORE_SWITCH = 4096

Loop = Callable[[dict[Any, Any], Iterator[Any], Callable[[Any, Any], Any], str], Any]


def _hits_generic(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> bool:
    misses = 0
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        try:
            old = acc[k]
        except KeyError:
            acc[k] = v
            misses += 1
            if misses >= MISSES_BEFORE_SWITCH:
                return True
        else:
            acc[k] = func(old, v)
    return False


def _new_generic(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> None:
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        if k in acc:
            acc[k] = func(acc[k], v)
        else:
            acc[k] = v


def _hits_add(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> bool:
    misses = 0
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        try:
            old = acc[k]
        except KeyError:
            acc[k] = v
            misses += 1
            if misses >= MISSES_BEFORE_SWITCH:
                return True
        else:
            acc[k] = old + v
    return False


def _new_add(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> None:
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        if k in acc:
            acc[k] = acc[k] + v
        else:
            acc[k] = v


def _hits_max(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> bool:
    misses = 0
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        try:
            old = acc[k]
        except KeyError:
            acc[k] = v
            misses += 1
            if misses >= MISSES_BEFORE_SWITCH:
                return True
        else:
            if v > old:
                acc[k] = v
    return False


def _new_max(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> None:
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        if k in acc:
            if v > acc[k]:
                acc[k] = v
        else:
            acc[k] = v


def _hits_min(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> bool:
    misses = 0
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        try:
            old = acc[k]
        except KeyError:
            acc[k] = v
            misses += 1
            if misses >= MISSES_BEFORE_SWITCH:
                return True
        else:
            if v < old:
                acc[k] = v
    return False


def _new_min(acc: dict[Any, Any], pairs: Iterator[Any], func: Callable[[Any, Any], Any], op: str) -> None:
    for x in pairs:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, op)
        if k in acc:
            if v < acc[k]:
                acc[k] = v
        else:
            acc[k] = v


#: (hits loop, new-keys loop) per recognised reduce function; None: the generic pair.
_FOLDS: dict[str | None, tuple[Loop, Loop]] = {
    None: (_hits_generic, _new_generic),
    "add": (_hits_add, _new_add),
    "max": (_hits_max, _new_max),
    "min": (_hits_min, _new_min),
}


def recognised(func: Callable[[Any, Any], Any]) -> str | None:
    """``"add"`` for ``operator.add``, ``"max"``/``"min"`` for the built-ins; None for any other function
    (a lambda doing the same, a subclass's method, ``operator.iadd``...: those run as they are)."""
    if func is operator.add:
        return "add"
    if func is builtins.max:
        return "max"
    if func is builtins.min:
        return "min"
    return None


def fold(func: Callable[[Any, Any], Any], pairs: Iterable[Any], acc: dict[Any, Any] | None = None,
         op: str = "reduce") -> dict[Any, Any]:
    """Fold ``pairs`` into ``acc`` (a new dict by default) by key with ``func``, in order; returns ``acc``.

    A key seen for the first time keeps its value as is; later values are ``func(previous, value)``:
    the result of the plain loop ``acc[k] = func(acc[k], v) if k in acc else v`` for every function,
    value type and exception (see the comment above). A record that is not a ``(key, value)`` pair
    fails with the error of :func:`require_pair` naming ``op``.
    """
    acc = {} if acc is None else acc
    hits, new = _FOLDS[recognised(func)]
    source = iter(pairs)
    if hits(acc, source, func, op):
        new(acc, source, func, op)
    return acc


def combiner(func: Callable[[Any, Any], Any], op: str) -> Callable[[Iterable[Any]], Iterable[tuple[Any, Any]]]:
    """The map-side combine of :func:`pre_reduce`: a partition's pairs reduced by key with ``func``,
    in input order (:func:`fold`); a record that is not a pair fails with the error of
    :func:`require_pair`."""

    def combine(it: Iterable[Any]) -> Iterable[tuple[Any, Any]]:
        return fold(func, it, {}, op).items()

    return combine


def count_values(it: Iterable[Any]) -> Iterable[tuple[Any, int]]:
    """The map-side combine of ``countByValue``: ``(record, how many times it occurs)``, in first-seen order.

    The answer of :func:`combiner` with ``operator.add`` on ``(record, 1)`` pairs (a first ``1``, then
    ``+ 1``: exact ints; each key's first object), counted by the C loop behind ``collections.Counter``.
    """
    acc: dict[Any, int] = {}
    _count_elements(acc, it)
    return acc.items()


def pre_reduce(rdd: RDD, func: Callable[[Any, Any], Any], partitioner: Partitioner, op: str,
               combine: Callable[[Iterable[Any]], Iterable[tuple[Any, Any]]] | None = None) -> RDD:
    """Per-batch reduce by key into ``partitioner`` (map-side combine, one shuffle, a merge with ``func``).

    ``combine`` replaces the map-side :func:`combiner` (e.g. :func:`count_values` for a stream of records
    to count); its pairs must be what :func:`combiner` with ``func`` would give.
    """
    side = combiner(func, op) if combine is None else combine

    def merge(it: Iterable[tuple[Any, Any]]) -> Iterable[tuple[Any, Any]]:
        return fold(func, it, {}, op).items()

    return jvm.shuffle(rdd.mapPartitions(side), partitioner).mapPartitions(merge, preservesPartitioning=True)


def pre_combine(rdd: RDD, func: Callable[[Any, Any], Any], partitioner: Partitioner, op: str,
                combine: Callable[[Iterable[Any]], Iterable[tuple[Any, Any]]] | None = None) -> RDD:
    """Per-batch *combined* pairs in ``partitioner``: the map-side combine and the shuffle of
    :func:`pre_reduce`, without its merge (no Python stage after the shuffle).

    A key may occur once per map partition in a partition of the result: a consumer must fold it
    (:func:`fold` with ``func``), as the window and state merges do. The result is a JVM RDD of the
    shuffled chunks, read with the context's serializer (the same frames of pickled lists), so it can be
    cached in the JVM and unioned with the engine's Python RDDs partition-wise.
    """
    side = combiner(func, op) if combine is None else combine
    out = jvm.shuffle(rdd.mapPartitions(side), partitioner)
    out._jrdd_deserializer = rdd.ctx.serializer
    return out


def shuffle_ordered(rdd: RDD, partitioner: Partitioner, op: str) -> RDD:
    """Per-batch group by key, before its merge: each map partition's values of a key as one chunk tagged with the
    map partition, shuffled into ``partitioner``. A consumer merges a partition's records with
    :func:`merge_ordered` in its own task (no Python stage after the shuffle: the chunks are read by the task that
    uses them, as :func:`pre_combine`'s). The result is a JVM RDD read with the context's serializer, so it can be
    unioned with the engine's Python RDDs partition-wise. Records: ``(key, (map partition, [values...]))``."""

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

    out = jvm.shuffle(rdd.mapPartitionsWithIndex(combine), partitioner)
    out._jrdd_deserializer = rdd.ctx.serializer
    return out


def merge_ordered(it: Iterable[tuple[Any, tuple[int, list[Any]]]]) -> Iterator[tuple[Any, list[Any]]]:
    """A partition of :func:`shuffle_ordered`'s records grouped by key: ``(key, [values...])``, each key's values in
    input order (its chunks ordered by map partition), whatever order the shuffle fetched the map outputs in."""
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
            chunks.sort(key=_chunk_order)
            yield k, [v for _, vs in chunks for v in vs]


def _chunk_order(chunk: tuple[int, list[Any]]) -> int:
    return chunk[0]


def pre_group_ordered(rdd: RDD, partitioner: Partitioner, op: str) -> RDD:
    """Per-batch group by key that keeps each key's values in input order (deterministic): the records of
    :func:`shuffle_ordered` merged by :func:`merge_ordered` in a Python stage after the shuffle. Output records:
    ``(key, [values...])``."""
    return shuffle_ordered(rdd, partitioner, op).mapPartitions(merge_ordered, preservesPartitioning=True)
