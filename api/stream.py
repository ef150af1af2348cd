"""The fluent ``DStream``: PySpark's ``pyspark.streaming.DStream`` surface plus the paper's operators.

Every method returns a new ``DStream`` wrapping an engine node (``dstreams.nodes``); nothing runs
until the context starts. Method names, argument order and semantics follow ``pyspark.streaming``
(durations are seconds as numbers, or strings such as ``"500ms"``, ``"1s"``, ``"2min"``). Added on
top: ``runningReduce``, ``track`` and duration strings everywhere.

User functions are shipped to executors with cloudpickle; they must be deterministic (a lost
partition is recomputed from lineage and must come out the same).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, cast, overload

from pyspark import RDD, StorageLevel
from pyspark.core.rdd import Partitioner
from pyspark.resultiterable import ResultIterable

from dstreams import config
from dstreams.dead_letters import (
    DeadLetter,
    FailedUpdate,
    GuardedUpdate,
    check_on_error,
    fold_partition,
    guarded_track,
    tag_partition,
    unwrap_state,
)
from dstreams.dead_letters import dead as dead_records
from dstreams.dead_letters import good as good_records
from dstreams.files.sink import save_text_exactly_once, save_to_store_exactly_once, sink_store_options
from dstreams.node import DStreamNode
from dstreams.nodes.auto_state import AutoPolicy
from dstreams.nodes.keyed import KeyedOp
from dstreams.nodes.output import OutputNode
from dstreams.nodes.reduced_window import IncrementalWindow, ReducedWindowNode
from dstreams.nodes.state import RunningReduce, StateBackend, StateNode, UpdateState
from dstreams.nodes.store_state import ExecutorStore, StateChangesNode, StateViewNode, checkpointed_node
from dstreams.nodes.timers import Track
from dstreams.nodes.transformed import TransformedNode, require_same_slide
from dstreams.nodes.union import UnionNode
from dstreams.nodes.windowed import WindowedNode
from dstreams.records import (
    PartitionFunc,
    filter_records,
    flat_map_records,
    flat_map_values,
    map_records,
    map_values,
)
from dstreams.redis.sink import DEFAULT_CHUNK_SIZE as DEFAULT_REDIS_CHUNK_SIZE
from dstreams.spark.arrow import DEFAULT_BATCH_SIZE as DEFAULT_ARROW_BATCH_SIZE
from dstreams.spark.arrow import arrow_batches_func
from dstreams.spark.partitioned import checked_pairs, count_values, hash_partitioner, pre_combine, pre_reduce
from dstreams.time import BatchTime, Duration, DurationLike, from_user_time, parse_duration, to_datetime

from .functions import positional_arity

if TYPE_CHECKING:
    from .context import StreamingContext
    from .event_time import TimedDStream
    from .owner import GraphOwner

#: The type of a stream's records (covariant: a ``DStream[bool]`` is a ``DStream[int]``), as ``pyspark.streaming``'s.
T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")
U = TypeVar("U")
W = TypeVar("W")
#: Keys of pair streams must be hashable (they are hash-partitioned), as in ``pyspark.streaming``.
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
S = TypeVar("S")


def rdd_to_file_name(prefix: str, suffix: str | None, time_ms: int) -> str:
    """``prefix-<batch ms>[.suffix]``, the name PySpark gives a batch's output folder."""
    return f"{prefix}-{time_ms}" + (f".{suffix}" if suffix else "")


def _user_states(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    """A state partition with dead letters as the user sees it: a failed key's state as it was before (none: no
    pair)."""
    for k, s in pairs:
        if type(s) is FailedUpdate:
            s = s.state
            if s is None:
                continue
        yield k, s


def _user_changes(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    """``changes()`` of a state with dead letters: as :func:`_user_states`, a failed new key as ``(key, None)``."""
    return ((k, unwrap_state(s)) for k, s in pairs)


def _failures_of(operator: str, batch_ms: int) -> Callable[[Iterable[tuple[Any, Any]]], Iterator[DeadLetter]]:
    """The dead letters of the batch at ``batch_ms`` among a partition of its state changes."""

    def run(pairs: Iterable[tuple[Any, Any]]) -> Iterator[DeadLetter]:
        for k, s in pairs:
            if type(s) is FailedUpdate and s.batchTime == batch_ms:
                yield DeadLetter((k, s.values), operator, s.error, batch_ms)

    return run


class DStream(Generic[T_co]):
    """A discretized stream: one RDD per batch interval (see the module docstring).

    Generic in the type of its records, as ``pyspark.streaming.DStream`` is: ``ssc.queueStream([[1, 2]]).map(str)``
    is a ``DStream[str]``; the pair operators (``reduceByKey``, ``join``, ``updateStateByKey``...) are defined on a
    ``DStream[tuple[K, V]]``. The types are for the type checker only: nothing is checked at run time.

    It uses its context (``ssc``, a ``StreamingContext``) only through :class:`~dstreams.api.owner.GraphOwner`.
    """

    def __init__(self: DStream[Any], node: DStreamNode, ssc: GraphOwner) -> None:
        """A stream of ``node``'s RDDs in ``ssc``'s graph (of records of any type: the operators that make a stream
        give it its record type)."""
        self._node = node
        self._ssc = ssc
        self._sc = ssc.sparkContext
        self.is_cached = False
        self.is_checkpointed = False
        self._dead_letters: DStream[Any] | None = None
        #: A state stream made with dead letters: the stream of the raw state, whose values may be FailedUpdates.
        self._state_source: DStream[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A stream captured by a user function is stored with the checkpointed graph without its SparkContext."""
        return {k: v for k, v in self.__dict__.items() if k != "_sc"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._sc = self._ssc.sparkContext

    # ------------------------------------------------------------------ plumbing
    def _derive(self, node: DStreamNode) -> DStream[Any]:
        return DStream(node, self._ssc)

    def _check_open(self) -> None:
        self._ssc.check_not_started("add a transformation")

    def _default_partitions(self, n: int | None) -> int:
        if n is None:
            return self._sc.defaultParallelism
        if not isinstance(n, int) or n <= 0:
            raise ValueError(f"numPartitions must be a positive int, got {n!r}")
        return n

    def _duration(self, d: DurationLike | None, what: str) -> Duration | None:
        return None if d is None else parse_duration(d, what)

    @property
    def _slideDuration(self) -> float:
        """The slide in seconds (PySpark's attribute name)."""
        return self._node.slide_duration.seconds

    def slideDuration(self) -> float:
        return self._node.slide_duration.seconds

    def context(self) -> StreamingContext:
        """The StreamingContext this stream belongs to."""
        return cast("StreamingContext", self._ssc)

    def __repr__(self) -> str:
        return f"DStream({self._node.name})"

    # ------------------------------------------------------------------ transform family
    @overload
    def transform(self: DStream[T], func: Callable[[RDD[T]], RDD[U]]) -> DStream[U]: ...

    @overload
    def transform(self: DStream[T], func: Callable[[datetime, RDD[T]], RDD[U]]) -> DStream[U]: ...

    def transform(self, func: Callable[..., RDD[Any]]) -> DStream[Any]:
        """A stream whose RDD of each batch is ``func(rdd)`` or ``func(time, rdd)``."""
        self._check_open()
        n = positional_arity(func, (1, 2), "transform")

        def apply(rdds: list[RDD], t: BatchTime) -> RDD:
            return func(rdds[0]) if n == 1 else func(to_datetime(t), rdds[0])

        return self._derive(TransformedNode(self._node.graph, [self._node], apply, "transform"))

    @overload
    def transformWith(self: DStream[T], func: Callable[[RDD[T], RDD[U]], RDD[W]], other: DStream[U],
                      keepSerializer: bool = False) -> DStream[W]: ...

    @overload
    def transformWith(self: DStream[T], func: Callable[[datetime, RDD[T], RDD[U]], RDD[W]], other: DStream[U],
                      keepSerializer: bool = False) -> DStream[W]: ...

    def transformWith(self, func: Callable[..., RDD[Any]], other: DStream[Any],
                      keepSerializer: bool = False) -> DStream[Any]:
        """A stream of ``func(rdd_a, rdd_b)`` or ``func(time, rdd_a, rdd_b)`` per batch."""
        self._check_open()
        n = positional_arity(func, (2, 3), "transformWith")

        def apply(rdds: list[RDD], t: BatchTime) -> RDD:
            return func(rdds[0], rdds[1]) if n == 2 else func(to_datetime(t), rdds[0], rdds[1])

        return self._derive(TransformedNode(self._node.graph, [self._node, other._node], apply, "transformWith"))

    def _rdd_op(self, label: str, op: Callable[[RDD[Any]], RDD[Any]]) -> DStream[Any]:
        self._check_open()
        return self._derive(TransformedNode(self._node.graph, [self._node], lambda rdds, t: op(rdds[0]), label))

    def _per_record(self, label: str, func: PartitionFunc, preservesPartitioning: bool, f: Callable[[Any], Any],
                    onError: str | None) -> DStream[Any]:
        """A per-record operator: one Python call of the user's function per record (``dstreams.records``); with
        dead letters (``onError``, else ``spark.dstreams.onRecordError``) the records it raises on are routed."""
        if self._routes_dead_letters(onError, label):
            return self._routing_dead_letters(label, lambda name, ms: tag_partition(label, f, name, ms),
                                              preservesPartitioning)
        return self._rdd_op(label, lambda rdd: rdd.mapPartitionsWithIndex(func, preservesPartitioning))

    def _routes_dead_letters(self, onError: str | None, label: str) -> bool:
        """Whether ``label`` routes its records' errors to dead letters: ``onError``, else the setting
        ``spark.dstreams.onRecordError``."""
        mode = config.get(config.ON_RECORD_ERROR, self._sc.getConf()) if onError is None else \
            check_on_error(onError, label)
        return mode == "deadLetter"

    def _routing_dead_letters(self, label: str, tagger: Callable[[str, int], PartitionFunc],
                              preservesPartitioning: bool) -> DStream[Any]:
        """``label`` with its function guarded (``dstreams.dead_letters``): ``tagger(operator name, batch ms)`` is the
        partition function that tags each output GOOD or DEAD. Returns the stream of the good outputs, whose
        ``deadLetters()`` is the stream of the dead letters; both read one persisted tagged RDD."""
        self._check_open()
        graph = self._node.graph
        name = f"{label}#{len(graph.dead_letter_nodes) + 1}"

        def tag(rdds: list[RDD], t: BatchTime) -> RDD:
            return rdds[0].mapPartitionsWithIndex(tagger(name, t.ms), preservesPartitioning)

        tagged = self._derive(TransformedNode(graph, [self._node], tag, label)).cache()
        good = tagged.mapPartitions(good_records, preservesPartitioning=True)
        dead = tagged.mapPartitions(dead_records, preservesPartitioning=True)
        graph.dead_letter_nodes.append(dead._node)
        good._dead_letters = dead
        return good

    def _folded_for_reduce(self, label: str, func: Callable[[Any, Any], Any], key: Any = None,
                           pairs: bool = True) -> DStream[Any]:
        """A reduce's input with dead letters: the records of each partition folded by key with ``func`` inside a
        guard (:func:`~dstreams.dead_letters.fold_partition`; ``pairs=False``: the records are values, all of
        ``key``), as ``(key, folded)`` pairs; ``deadLetters()`` has the records routed."""
        return self._routing_dead_letters(label, lambda name, ms: fold_partition(func, name, ms, key, pairs), True)

    def _with_dead_letters_of(self, source: DStream[Any]) -> Self:
        """This stream, whose ``deadLetters()`` is ``source``'s."""
        self._dead_letters = source._dead_letters
        return self

    def _state_with_dead_letters(self: DStream[Any], label: str) -> DStream[Any]:
        """The user's view of a state stream made with a :class:`~dstreams.dead_letters.GuardedUpdate` (this
        stream): the states as they are (a failed key's state as before its failure), with the failures of each
        batch as ``deadLetters()`` (``(key, newValues)`` records, read from the keys the batch changed)."""
        graph = self._node.graph
        name = f"{label}#{len(graph.dead_letter_nodes) + 1}"
        view = self.mapPartitions(_user_states, preservesPartitioning=True)
        changed = self.changes()

        def failures(rdds: list[RDD], t: BatchTime) -> RDD:
            return rdds[0].mapPartitions(_failures_of(name, t.ms))

        dead = changed._derive(TransformedNode(graph, [changed._node], failures, "deadLetters"))
        graph.dead_letter_nodes.append(dead._node)
        view._dead_letters = dead
        view._state_source = self
        return view

    def deadLetters(self) -> DStream[DeadLetter]:
        """The records this operator's function raised on, one :class:`~dstreams.dead_letters.DeadLetter`
        (``record, operator, error, batchTime``) each, batch by batch: a stream like any other, which any sink
        saves exactly once. Only for an operator made with ``onError="deadLetter"`` (or under
        ``spark.dstreams.onRecordError=deadLetter``); every operator's at once: ``ssc.deadLetters()``."""
        if self._dead_letters is None:
            raise ValueError(f"{self._node.name} routes no dead letters: make the operator with onError='deadLetter' "
                             "(stream.map(f, onError='deadLetter'); also flatMap, filter, mapValues, flatMapValues, "
                             "reduce, reduceByKey, runningReduce, reduceByKeyAndWindow, reduceByWindow, "
                             "updateStateByKey, track), "
                             "or set spark.dstreams.onRecordError=deadLetter before defining it")
        return self._dead_letters

    def mapPartitionsWithIndex(self: DStream[T], f: Callable[[int, Iterable[T]], Iterable[U]],
                               preservesPartitioning: bool = False) -> DStream[U]:
        return self._rdd_op("mapPartitionsWithIndex",
                            lambda rdd: rdd.mapPartitionsWithIndex(f, preservesPartitioning))

    def mapPartitions(self: DStream[T], f: Callable[[Iterable[T]], Iterable[U]],
                      preservesPartitioning: bool = False) -> DStream[U]:
        return self._rdd_op("mapPartitions", lambda rdd: rdd.mapPartitions(f, preservesPartitioning))

    def mapArrowBatches(self, f: Callable[[Any], Any], batchSize: int = DEFAULT_ARROW_BATCH_SIZE,
                        preservesPartitioning: bool = False) -> DStream[Any]:
        """Vectorized map: ``f`` receives each partition as ``pyarrow.RecordBatch`` chunks (column ``value``).

        ``f`` returns a RecordBatch/Table (its rows become the records: the values of a single column,
        tuples for several) or any iterable of records. Chunks hold at most ``batchSize`` records, in
        order. Use ``pyarrow.compute`` inside ``f`` to process a chunk without a Python call per record.
        """
        func = arrow_batches_func(f, batchSize)
        return self._rdd_op("mapArrowBatches", lambda rdd: rdd.mapPartitions(func, preservesPartitioning))

    def map(self: DStream[T], f: Callable[[T], U], preservesPartitioning: bool = False, *,
            onError: str | None = None) -> DStream[U]:
        """``f(x)`` for every record; ``onError="deadLetter"`` routes the records ``f`` raises on to
        :meth:`deadLetters` (default: ``spark.dstreams.onRecordError``, ``"fail"``)."""
        return self._per_record("map", map_records(f), preservesPartitioning, f, onError)

    def flatMap(self: DStream[T], f: Callable[[T], Iterable[U]], preservesPartitioning: bool = False, *,
                onError: str | None = None) -> DStream[U]:
        """The elements of ``f(x)`` for every record (``onError`` as for :meth:`map`)."""
        return self._per_record("flatMap", flat_map_records(f), preservesPartitioning, f, onError)

    def filter(self: DStream[T], f: Callable[[T], bool], *, onError: str | None = None) -> DStream[T]:
        """The records for which ``f`` is true (``onError`` as for :meth:`map`)."""
        return self._per_record("filter", filter_records(f), True, f, onError)

    def glom(self: DStream[T]) -> DStream[list[T]]:
        return self._rdd_op("glom", lambda rdd: rdd.glom())

    def repartition(self: DStream[T], numPartitions: int) -> DStream[T]:
        n = self._default_partitions(numPartitions)
        return self._rdd_op("repartition", lambda rdd: rdd.repartition(n))

    def partitionBy(self: DStream[tuple[K, V]], numPartitions: int,
                    partitionFunc: Callable[[K], int] | None = None) -> DStream[tuple[K, V]]:
        from pyspark.core.rdd import portable_hash

        n = self._default_partitions(numPartitions)
        pf = partitionFunc or portable_hash
        check = checked_pairs("partitionBy")
        return self._rdd_op("partitionBy", lambda rdd: rdd.mapPartitions(check).partitionBy(n, pf))

    def mapValues(self: DStream[tuple[K, V]], f: Callable[[V], U], *,
                  onError: str | None = None) -> DStream[tuple[K, U]]:
        """``(k, f(v))`` for every pair (``onError`` as for :meth:`map`)."""
        return self._per_record("mapValues", map_values(f), True, f, onError)

    def flatMapValues(self: DStream[tuple[K, V]], f: Callable[[V], Iterable[U]], *,
                      onError: str | None = None) -> DStream[tuple[K, U]]:
        """``(k, y)`` for every ``y`` of ``f(v)`` (``onError`` as for :meth:`map`)."""
        return self._per_record("flatMapValues", flat_map_values(f), True, f, onError)

    # ------------------------------------------------------------------ aggregations per batch
    def count(self) -> DStream[int]:
        """A stream with one element per batch: the number of records (as in PySpark)."""
        return self.mapPartitions(lambda it: [sum(1 for _ in it)]).reduce(operator.add, onError="fail")

    def reduce(self: DStream[T], func: Callable[[T, T], T], *, onError: str | None = None) -> DStream[T]:
        """A stream with the reduce of each batch (nothing for a batch with no partitions).

        ``onError="deadLetter"`` (default: ``spark.dstreams.onRecordError``) routes the records ``func`` raises on
        to :meth:`deadLetters` (:mod:`dstreams.dead_letters` has which record a raise blames)."""
        if self._routes_dead_letters(onError, "reduce"):
            keyed = self._folded_for_reduce("reduce", func, None, pairs=False)
        else:
            keyed = self.map(lambda x: (None, x), onError="fail")
        reduced = keyed.reduceByKey(func, 1, onError="fail").map(lambda kv: kv[1], onError="fail")
        return reduced._with_dead_letters_of(keyed)

    def countByValue(self: DStream[K]) -> DStream[tuple[K, int]]:
        """``(record, count)`` per distinct record of each batch: ``map(lambda x: (x, 1)).reduceByKey(add)``'s
        answer, counted on the map side by CPython's C counting loop (:func:`count_values`)."""
        part = hash_partitioner(self._default_partitions(None))
        return self._rdd_op("countByValue",
                            lambda rdd: pre_reduce(rdd, operator.add, part, "countByValue", count_values))

    def combineByKey(self: DStream[tuple[K, V]], createCombiner: Callable[[V], U], mergeValue: Callable[[U, V], U],
                     mergeCombiners: Callable[[U, U], U],
                     numPartitions: int | None = None) -> DStream[tuple[K, U]]:
        n = self._default_partitions(numPartitions)
        check = checked_pairs("combineByKey")
        return self._rdd_op(
            "combineByKey",
            lambda rdd: rdd.mapPartitions(check).combineByKey(createCombiner, mergeValue, mergeCombiners, n),
        )

    def reduceByKey(self: DStream[tuple[K, V]], func: Callable[[V, V], V], numPartitions: int | None = None, *,
                    onError: str | None = None) -> DStream[tuple[K, V]]:
        """Per key, the reduce of the batch's values with ``func`` (associative and commutative), in
        ``numPartitions`` hash partitions: a map-side combine, one shuffle, a merge (:func:`pre_reduce`;
        ``operator.add``, ``max`` and ``min`` run inlined, :func:`dstreams.spark.partitioned.fold`). The pairs of a
        partition are combined in memory (no spill to disk, unlike PySpark's ``combineByKey``).

        ``onError="deadLetter"`` (default: ``spark.dstreams.onRecordError``) routes the records ``func`` raises on
        to :meth:`deadLetters` (:mod:`dstreams.dead_letters` has which record a raise blames)."""
        if self._routes_dead_letters(onError, "reduceByKey"):
            folded = self._folded_for_reduce("reduceByKey", func)
            return folded.reduceByKey(func, numPartitions, onError="fail")._with_dead_letters_of(folded)
        part = hash_partitioner(self._default_partitions(numPartitions))
        return self._rdd_op("reduceByKey", lambda rdd: pre_reduce(rdd, func, part, "reduceByKey"))

    def groupByKey(self: DStream[tuple[K, V]],
                   numPartitions: int | None = None) -> DStream[tuple[K, ResultIterable[V]]]:
        n = self._default_partitions(numPartitions)
        check = checked_pairs("groupByKey")
        return self._rdd_op("groupByKey", lambda rdd: rdd.mapPartitions(check).groupByKey(n))

    # ------------------------------------------------------------------ two streams
    def union(self: DStream[T], other: DStream[U]) -> DStream[T | U]:
        require_same_slide([self._node, other._node], "union", "the two DStreams should have the same slide duration")
        self._check_open()
        return self._derive(UnionNode(self._node.graph, [self._node, other._node]))

    def _pair_op(self, label: str, other: DStream[Any], op: Callable[[RDD[Any], RDD[Any]], RDD[Any]]) -> DStream[Any]:
        check_a, check_b = checked_pairs(label), checked_pairs(label)

        def apply(a: RDD[Any], b: RDD[Any]) -> RDD[Any]:
            return op(a.mapPartitions(check_a, True), b.mapPartitions(check_b, True))

        return self.transformWith(apply, other)

    def cogroup(self: DStream[tuple[K, V]], other: DStream[tuple[K, W]], numPartitions: int | None = None,
                ) -> DStream[tuple[K, tuple[ResultIterable[V], ResultIterable[W]]]]:
        n = self._default_partitions(numPartitions)
        return self._pair_op("cogroup", other, lambda a, b: a.cogroup(b, n))

    def join(self: DStream[tuple[K, V]], other: DStream[tuple[K, W]],
             numPartitions: int | None = None) -> DStream[tuple[K, tuple[V, W]]]:
        n = self._default_partitions(numPartitions)
        return self._pair_op("join", other, lambda a, b: a.join(b, n))

    def leftOuterJoin(self: DStream[tuple[K, V]], other: DStream[tuple[K, W]],
                      numPartitions: int | None = None) -> DStream[tuple[K, tuple[V, W | None]]]:
        n = self._default_partitions(numPartitions)
        return self._pair_op("leftOuterJoin", other, lambda a, b: a.leftOuterJoin(b, n))

    def rightOuterJoin(self: DStream[tuple[K, V]], other: DStream[tuple[K, W]],
                       numPartitions: int | None = None) -> DStream[tuple[K, tuple[V | None, W]]]:
        n = self._default_partitions(numPartitions)
        return self._pair_op("rightOuterJoin", other, lambda a, b: a.rightOuterJoin(b, n))

    def fullOuterJoin(self: DStream[tuple[K, V]], other: DStream[tuple[K, W]],
                      numPartitions: int | None = None) -> DStream[tuple[K, tuple[V | None, W | None]]]:
        n = self._default_partitions(numPartitions)
        return self._pair_op("fullOuterJoin", other, lambda a, b: a.fullOuterJoin(b, n))

    # ------------------------------------------------------------------ windows
    def window(self: DStream[T], windowDuration: DurationLike,
               slideDuration: DurationLike | None = None) -> DStream[T]:
        """All records of the last ``windowDuration``, every ``slideDuration`` (default: this slide)."""
        self._check_open()
        w = parse_duration(windowDuration, "windowDuration")
        s = self._duration(slideDuration, "slideDuration") or self._node.slide_duration
        return self._derive(WindowedNode(self._node.graph, self._node, w, s))

    def reduceByKeyAndWindow(self: DStream[tuple[K, V]], func: Callable[[V, V], V],
                             invFunc: Callable[[V, V], V] | None,
                             windowDuration: DurationLike, slideDuration: DurationLike | None = None,
                             numPartitions: int | None = None,
                             filterFunc: Callable[[tuple[K, V]], bool] | None = None, *,
                             onError: str | None = None) -> DStream[tuple[K, V]]:
        """Per key, the reduce of the values in the window; incremental when ``invFunc`` is given.

        With ``invFunc`` the window is updated as previous window - batches that left + batches that
        entered, so its cost does not grow with the window's length. ``filterFunc`` keeps only the
        pairs it accepts (use it to drop keys whose value fell back to zero). Unlike PySpark, a
        ``filterFunc`` is also honoured without ``invFunc``. With ``spark.dstreams.state.store=executor``, an
        incremental window (``invFunc`` and a window of at least 5 slides) lives in the executors' state stores:
        a slide reads and writes only the keys of the batches entering and leaving the window.
        ``onError="deadLetter"`` (default: ``spark.dstreams.onRecordError``) routes the records ``func`` raises on to
        :meth:`deadLetters` (:mod:`dstreams.dead_letters` has which record a raise blames): each
        batch's records once, as they enter the window; an ``invFunc`` or ``filterFunc`` that raises fails the batch.
        """
        if self._routes_dead_letters(onError, "reduceByKeyAndWindow"):
            folded = self._folded_for_reduce("reduceByKeyAndWindow", func)
            return folded.reduceByKeyAndWindow(func, invFunc, windowDuration, slideDuration, numPartitions,
                                               filterFunc, onError="fail")._with_dead_letters_of(folded)
        return self._reduce_by_key_and_window(func, invFunc, windowDuration, slideDuration, numPartitions,
                                              filterFunc, "reduceByKeyAndWindow", None)

    def _reduce_by_key_and_window(self, func: Callable[[Any, Any], Any], invFunc: Callable[[Any, Any], Any] | None,
                                  windowDuration: DurationLike, slideDuration: DurationLike | None,
                                  numPartitions: int | None, filterFunc: Callable[[tuple[Any, Any]], bool] | None,
                                  label: str, combine: Callable[[Iterable[Any]], Iterable[tuple[Any, Any]]] | None,
                                  ) -> DStream[Any]:
        """:meth:`reduceByKeyAndWindow` with the map-side ``combine`` of :func:`pre_combine` (None: the
        fold of ``func``), named ``label`` in errors."""
        self._check_open()
        w = parse_duration(windowDuration, "windowDuration")
        s = self._duration(slideDuration, "slideDuration") or self._node.slide_duration
        part = hash_partitioner(self._default_partitions(numPartitions))
        from dstreams.nodes.windowed import check_window

        check_window(self._node.slide_duration, w, s)
        graph = self._node.graph
        combined = TransformedNode(graph, [self._node],
                                   lambda rdds, t: pre_combine(rdds[0], func, part, label, combine),
                                   "reduceByKey")
        if invFunc is not None and w.ms >= 5 * s.ms:  # updated incrementally: a keyed state
            combined.persist(StorageLevel.MEMORY_ONLY)
            op = IncrementalWindow(func, invFunc, w, s, filterFunc)
            return self._derive(self._state_node(op, part, parent=combined))
        return self._derive(ReducedWindowNode(graph, combined, func, invFunc, w, s, part, filterFunc))

    def reduceByWindow(self: DStream[T], reduceFunc: Callable[[T, T], T], invReduceFunc: Callable[[T, T], T] | None,
                       windowDuration: DurationLike, slideDuration: DurationLike | None = None, *,
                       onError: str | None = None) -> DStream[T]:
        """The reduce of every record in the window (one element per slide); ``onError`` as for
        :meth:`reduceByKeyAndWindow`."""
        if self._routes_dead_letters(onError, "reduceByWindow"):
            keyed = self._folded_for_reduce("reduceByWindow", reduceFunc, 1, pairs=False)
        else:
            keyed = self.map(lambda x: (1, x), onError="fail")
        reduced = keyed.reduceByKeyAndWindow(reduceFunc, invReduceFunc, windowDuration, slideDuration, 1,
                                             onError="fail")
        return reduced.map(lambda kv: kv[1], onError="fail")._with_dead_letters_of(keyed)

    def countByWindow(self: DStream[Any], windowDuration: DurationLike,
                      slideDuration: DurationLike | None = None) -> DStream[int]:
        return self.map(lambda x: 1, onError="fail").reduceByWindow(operator.add, operator.sub, windowDuration,
                                                                    slideDuration, onError="fail")

    def countByValueAndWindow(self: DStream[K], windowDuration: DurationLike, slideDuration: DurationLike | None = None,
                              numPartitions: int | None = None) -> DStream[tuple[K, int]]:
        """``(record, count)`` over the window for every record counted more than zero times: the answer of
        ``map(lambda x: (x, 1)).reduceByKeyAndWindow(add, sub, ...)`` filtered, with the map side counted by
        CPython's C counting loop (:func:`count_values`)."""
        counted = self._reduce_by_key_and_window(operator.add, operator.sub, windowDuration, slideDuration,
                                                 numPartitions, None, "countByValueAndWindow", count_values)
        return counted.filter(lambda kv: kv[1] > 0, onError="fail")

    def groupByKeyAndWindow(self: DStream[tuple[K, V]], windowDuration: DurationLike,
                            slideDuration: DurationLike | None = None,
                            numPartitions: int | None = None) -> DStream[tuple[K, ResultIterable[V]]]:
        def extend(a: list[V], b: list[V]) -> list[V]:
            a.extend(b)
            return a

        ls = self.mapValues(lambda x: [x], onError="fail")
        grouped = ls.reduceByKeyAndWindow(extend, lambda a, b: a[len(b):],
                                          windowDuration, slideDuration, numPartitions, onError="fail")
        return grouped.mapValues(ResultIterable, onError="fail")

    # ------------------------------------------------------------------ state
    def updateStateByKey(self: DStream[tuple[K, V]], updateFunc: Callable[[list[V], S | None], S | None],
                         numPartitions: int | None = None,
                         initialRDD: RDD[tuple[K, S]] | Iterable[tuple[K, S]] | None = None,
                         updateIdleKeys: bool = True, *, onError: str | None = None) -> DStream[tuple[K, S]]:
        """Per key state: ``updateFunc(newValues, lastState) -> newState`` (None drops the key).

        As in PySpark, ``updateFunc`` runs every batch for every key of the state (``newValues`` is ``[]`` for a
        key without new values). ``updateIdleKeys=False`` (dstreams only) runs it only for keys with new values,
        the others keeping their state: with ``spark.dstreams.state.store=executor`` a batch then costs the keys
        it touches, not the size of the state.

        ``onError="deadLetter"`` (default: ``spark.dstreams.onRecordError``): a key whose ``updateFunc`` raises
        keeps its state as it was (a new key gets none) and ``(key, newValues)`` goes to :meth:`deadLetters`; the
        other keys are updated. ``changes()`` works on the returned stream as without it.
        """
        self._check_open()
        guarded = self._routes_dead_letters(onError, "updateStateByKey")
        if guarded:
            updateFunc = GuardedUpdate(updateFunc, keep_idle=not updateIdleKeys)
        part = hash_partitioner(self._default_partitions(numPartitions))
        if initialRDD is not None and not isinstance(initialRDD, RDD):
            initialRDD = self._sc.parallelize(list(initialRDD))
        if initialRDD is not None:
            initialRDD = initialRDD.mapPartitions(checked_pairs("updateStateByKey's initialRDD"))
        # with idle keys updated a batch costs the whole state anyway: auto keeps it on the RDD state
        state = self._keyed_state(UpdateState(updateFunc, bool(updateIdleKeys)), part, initialRDD,
                                  auto=not updateIdleKeys)
        return state._state_with_dead_letters("updateStateByKey") if guarded else state

    def runningReduce(self: DStream[tuple[K, V]], func: Callable[[V, V], V], numPartitions: int | None = None, *,
                      onError: str | None = None) -> DStream[tuple[K, V]]:
        """Per key, the running reduce of every value so far (the paper's ``runningReduce``).

        Emits every key's current value each batch. With the RDD state (the default) the state stays
        hash-partitioned and is merged with each batch without a shuffle of the state; with
        ``spark.dstreams.state.store=executor`` it lives in the executors' state stores and a batch reads and
        writes only the keys it has.

        ``onError="deadLetter"`` (default: ``spark.dstreams.onRecordError``) routes the records ``func`` raises on
        to :meth:`deadLetters` (:mod:`dstreams.dead_letters` has which record a raise blames); a raise merging a
        batch's reduce into a key's state fails the batch.
        """
        self._check_open()
        if self._routes_dead_letters(onError, "runningReduce"):
            folded = self._folded_for_reduce("runningReduce", func)
            return folded.runningReduce(func, numPartitions, onError="fail")._with_dead_letters_of(folded)
        part = hash_partitioner(self._default_partitions(numPartitions))
        return self._keyed_state(RunningReduce(func), part)

    def _keyed_state(self, op: KeyedOp, part: Partitioner, initial: RDD | None = None, auto: bool = True) -> DStream:
        return self._derive(self._state_node(op, part, initial, auto))

    def _state_node(self, op: KeyedOp, part: Partitioner, initial: RDD | None = None, auto: bool = True,
                    parent: DStreamNode | None = None) -> DStreamNode:
        """The public node of ``op``'s state over ``parent`` (default: this stream) on the backend
        ``spark.dstreams.state.store`` names (``auto``, where ``auto`` allows it: picked by size; else the RDD
        state): the store's view, or the RDD state itself."""
        graph, parent = self._node.graph, parent or self._node
        store, by_size = self._state_store(), self._auto_state() if auto else None
        backend: Callable[[StateNode], StateBackend]
        if store is not None:
            backend = partial(ExecutorStore, local_dir=store[0], snapshot_every=store[1])
        elif by_size is not None:
            backend = partial(AutoPolicy, local_dir=by_size[0], snapshot_every=by_size[1], auto_keys=by_size[2])
        else:
            return StateNode(graph, parent, op, part, initial)
        return StateViewNode(graph, StateNode(graph, parent, op, part, initial, backend))

    def changes(self: DStream[tuple[K, V]]) -> DStream[tuple[K, V | None]]:
        """On a stream made by ``runningReduce`` or ``updateStateByKey`` (dstreams only): per batch, the
        ``(key, state)`` pairs that batch changed, ``(key, None)`` for a key it removed.

        With ``spark.dstreams.state.store=executor`` it reads what the batch wrote, so an output of the changes
        costs the keys the batch touched, where an output of the state stream itself reads every key; on the RDD
        state it compares each partition of the state with the one before.
        """
        self._check_open()
        if self._state_source is not None:  # made with dead letters: the raw state's changes, as the user sees them
            return self._state_source.changes().mapPartitions(_user_changes, preservesPartitioning=True)
        if not isinstance(self._node, StateViewNode) and not (
                isinstance(self._node, StateNode) and isinstance(self._node.op, (RunningReduce, UpdateState))):
            raise TypeError("changes() is defined on the stream that runningReduce() or updateStateByKey() returns "
                            f"(this one is {self._node.name}): call it on that stream, before any other operation")
        return self._derive(StateChangesNode(self._node.graph, self._node))

    def _state_store(self) -> tuple[str | None, int] | None:
        """(local folder, snapshot cadence) when ``spark.dstreams.state.store`` is ``executor``, else None."""
        conf = self._sc.getConf()
        if config.get(config.STATE_STORE, conf) != "executor":
            return None
        return config.get(config.STATE_LOCAL_DIR, conf), config.get(config.STATE_SNAPSHOT_EVERY, conf)

    def _auto_state(self) -> tuple[str | None, int, int] | None:
        """(local folder, snapshot cadence, keys to move at) when ``spark.dstreams.state.store`` is ``auto``."""
        conf = self._sc.getConf()
        if config.get(config.STATE_STORE, conf) != "auto":
            return None
        return (config.get(config.STATE_LOCAL_DIR, conf), config.get(config.STATE_SNAPSHOT_EVERY, conf),
                config.get(config.STATE_AUTO_KEYS, conf))

    def track(self: DStream[tuple[K, V]], init: Callable[[K, V], Any], update: Callable[[K, Any, V], Any],
              timeout: DurationLike, numPartitions: int | None = None,
              timers: Callable[[K, Any, Any], Any] | None = None, emit: str = "all", *,
              onError: str | None = None) -> DStream[tuple[K, Any]]:
        """The paper's state tracking over a stream of ``(key, event)``.

        A key's state is created by ``init(key, event)``, updated by ``update(key, state, event)``
        (None drops it) and dropped after ``timeout`` with no event. Emits ``(key, state)`` for the
        live keys every batch.

        ``timers=on_timer`` adds per-key timers (MillWheel's, Flink's), any number per key, each named by a
        tag: ``init``/``update``/``on_timer`` may return ``dstreams.TrackUpdate(state, timers={tag:
        dstreams.Timer(kind, time) or None}, emit=[...])`` to set, replace (a ``Timer``) or delete (None) the
        timer of each tag and to emit records. An event-time timer (``kind="event"``) fires in the batch whose
        watermark reaches it (needs ``withEventTime`` upstream), a processing-time one (``"processing"``) in the
        first batch at or after it; per key and batch, event-time timers first, each kind in (time, tag) order.
        ``on_timer(key, state, dstreams.Timer(kind, time, tag))`` returns the new state (None drops the key
        and its timers) or a ``TrackUpdate``; a timer a callback sets, replaces or deletes does not fire in
        that batch. ``TrackUpdate(eventTime=t, processingTime=t)`` sets the timers of tags ``"event"`` and
        ``"processing"``. The returned stream's ``emitted()`` holds the emitted records. Timers are
        checkpointed with the state and fire exactly once across a driver failover
        (:mod:`dstreams.nodes.timers` has the whole rule).

        ``emit="updated"`` (the ``mapWithState``-style variant) emits ``(key, state)`` only for the keys
        that received events or fired a timer in the batch (and are still alive), instead of every live key.

        ``onError="deadLetter"`` (default: ``spark.dstreams.onRecordError``): an ``init``/``update`` that raises
        leaves the key's state as it was before that event and ``(key, event)`` goes to :meth:`deadLetters`; an
        ``on_timer`` that raises leaves the state as it was and ``(key, timer)`` goes there; the other events go on.
        """
        self._check_open()
        t = parse_duration(timeout, "timeout")
        guarded = self._routes_dead_letters(onError, "track")
        dead_name = f"track#{len(self._node.graph.dead_letter_nodes) + 1}"
        if guarded:
            init, update, timers = guarded_track(init, update, timers, dead_name)
        part = hash_partitioner(self._default_partitions(numPartitions))
        if emit not in ("all", "updated"):
            raise ValueError(f"emit must be 'all' or 'updated', got {emit!r}")
        from .event_time import TrackedDStream

        plain = timers is None and emit == "all" and not guarded  # dead letters travel as emitted records
        # the store holds the timers' layout; the RDD state (alone, or under auto before the move) the plain one
        op = Track(init, update, t, timers, plain and self._state_store() is None)
        node = self._state_node(op, part)
        if not isinstance(node, StateViewNode):
            if plain:
                return self._derive(node).mapValues(lambda entry: entry[0], onError="fail")
            tracked = TrackedDStream(node, self._ssc, updated_only=emit == "updated")
        else:
            tracked = TrackedDStream(node, self._ssc, updated_only=emit == "updated",
                                     changes=StateChangesNode(node.graph, node))
        return tracked._routing_failures() if guarded else tracked

    # ------------------------------------------------------------------ event time
    def withEventTime(self: DStream[T], extract: Callable[[T], Any], allowedLateness: DurationLike = 0,
                      dropLate: bool = False, *, onError: str | None = None) -> TimedDStream[T]:
        """This stream with an event time per record and a low watermark (docs/guide/event-time.md).

        ``extract(record)`` returns the record's event time: seconds since the epoch (int or float, as
        ``time.time()``) or a ``datetime`` (naive: UTC). The watermark in force for batch ``t`` is the
        maximum event time of the batches before ``t`` minus ``allowedLateness`` (a duration: ``"30s"``),
        capped by what the sources upstream declare, and never goes back. Records of batch ``t`` below it
        are behind the watermark: counted in the batch metrics (``BatchInfo.event_time``) and available from
        ``lateRecords()``. By default they stay in the stream and each event-time window or session counts
        them in its windows still open (a record is late only for the windows that closed, as in Flink and
        Structured Streaming); ``dropLate=True`` drops them here, so that no operator downstream sees them
        (for ``track`` or ``updateStateByKey`` on the records, which have no windows). The returned stream's
        ``map``/``flatMap``/``filter``/``mapValues``/``flatMapValues``/``union`` keep the event time for the
        event-time operators (``reduceByKeyAndEventWindow``, ``reduceByEventWindow``, ``sessionWindow``); its
        other methods see the plain records.
        The watermark of each batch is recorded in the metadata log, so a restarted driver
        (``getOrCreate``) replays every batch with the watermark it had.
        ``onError="deadLetter"`` (or ``spark.dstreams.onRecordError=deadLetter``): a record whose ``extract`` raises
        or returns no event time (not a number or ``datetime``) goes to the returned stream's ``deadLetters()``
        and counts nowhere (not in the watermark, not in the batch's records); the default fails the batch.
        """
        self._check_open()
        from dstreams.nodes.event_time import EventStamp, EventTimeNode

        from .event_time import TimedDStream

        lateness = parse_duration(allowedLateness, "allowedLateness", allow_zero=True)
        if self._routes_dead_letters(onError, "withEventTime"):
            stamp = EventStamp(extract)
            stamped = self._routing_dead_letters("withEventTime",
                                                 lambda name, ms: tag_partition("map", stamp, name, ms), False)
            node = EventTimeNode(self._node.graph, stamped._node, extract, lateness, bool(dropLate), stamped=True)
            timed = TimedDStream(node, node, self._ssc)
            timed._dead_letters = stamped._dead_letters
            return timed
        node = EventTimeNode(self._node.graph, self._node, extract, lateness, bool(dropLate))
        return TimedDStream(node, node, self._ssc)

    def watermarks(self) -> DStream[float | None]:
        """One record per batch: the low watermark in force for it (seconds since the epoch; None before
        the first record). A stream built from several event-time streams (a union, a join) has the
        minimum of their watermarks. Fails for a stream with no ``withEventTime`` upstream."""
        self._check_open()
        from dstreams.nodes.event_time import WatermarkNode

        return self._derive(WatermarkNode(self._node.graph, self._node))

    # ------------------------------------------------------------------ persistence
    def cache(self) -> Self:
        return self.persist(StorageLevel.MEMORY_ONLY)

    def persist(self, storageLevel: StorageLevel) -> Self:
        self._node.persist(storageLevel)
        self.is_cached = True
        return self

    def checkpoint(self, interval: DurationLike) -> Self:
        """Checkpoint this stream's RDDs every ``interval`` (a multiple of its slide)."""
        self._check_open()
        if self._state_source is not None:  # a state made with dead letters: the state is what is checkpointed
            self._state_source.checkpoint(interval)
        node = checkpointed_node(self._node)  # a store-backed state's view: its state
        node.checkpoint_interval = parse_duration(interval, "checkpoint interval")
        if node.storage_level is None:
            node.persist(StorageLevel.MEMORY_ONLY)
        self.is_checkpointed = True
        return self

    # ------------------------------------------------------------------ outputs
    @overload
    def foreachRDD(self: DStream[T], func: Callable[[RDD[T]], object]) -> None: ...

    @overload
    def foreachRDD(self: DStream[T], func: Callable[[datetime, RDD[T]], object]) -> None: ...

    def foreachRDD(self, func: Callable[..., object]) -> None:
        """Run ``func(rdd)`` or ``func(time, rdd)`` for every batch (on the driver).

        ``func`` runs again for a batch that is re-run after a failure: make its effects
        idempotent per batch time (e.g. write under a key derived from ``time``).
        """
        self._output(func, getattr(func, "__name__", "foreachRDD"))

    def _output(self, func: Callable[..., Any], label: str, on_start: Callable[[], None] | None = None) -> None:
        """Register ``func`` (``func(rdd)`` or ``func(time, rdd)``) as an output named ``label`` (in errors, the
        status page and the metrics); ``on_start()`` runs when a driver has taken its epoch, before its first
        batch."""
        self._ssc.check_not_started("add an output operation")
        n = positional_arity(func, (1, 2), "foreachRDD")

        def run(rdd: RDD[Any], t: BatchTime) -> None:
            if n == 1:
                func(rdd)
            else:
                func(to_datetime(t), rdd)

        OutputNode(self._node.graph, self._node, run, label, on_start)

    def pprint(self, num: int = 10) -> None:
        """Print the first ``num`` elements of each batch (PySpark's format)."""

        def take_and_print(time: Any, rdd: RDD[Any]) -> None:
            taken = rdd.take(num + 1)
            print("-------------------------------------------")
            print(f"Time: {time.replace(tzinfo=None)}")
            print("-------------------------------------------")
            for record in taken[:num]:
                print(record)
            if len(taken) > num:
                print("...")
            print("", flush=True)

        self._output(take_and_print, "pprint")

    def saveAsTextFiles(self, prefix: str, suffix: str | None = None, **storeOptions: Any) -> None:
        """Save each batch as a text-file folder ``prefix-<batch ms>[.suffix]``, exactly once.

        A folder is committed by its ``_SUCCESS`` marker: a batch re-run after a failure leaves a
        committed folder alone and rewrites one that was cut off half-way. ``prefix`` may be a
        local path or an ``s3://bucket/prefix`` URL (then each task writes its part object);
        ``storeOptions`` (``endpoint_url``, ``access_key``, ...) default to the checkpoint store's
        when that is an ``s3://`` location too, else to boto3's standard chain.
        """
        ssc = self._ssc

        def save(time: Any, rdd: RDD[Any]) -> None:
            ms = round(time.timestamp() * 1000)
            env = ssc.output_environment()
            path = rdd_to_file_name(prefix, suffix, ms)
            options = sink_store_options(path, storeOptions, env.checkpoint_dir, env.store_options)
            save_text_exactly_once(rdd, path, env.check_owner, options)

        self._output(save, f"saveAsTextFiles({prefix!r})")

    def saveToStore(self, location: str, format: str = "text", *, onError: str = "fail", **storeOptions: Any) -> None:
        """Save each batch under ``location/<batch ms, 15 digits>/`` in a store, exactly once.

        ``location`` is an ``s3://bucket/prefix`` URL or a local folder (shared by the executors).
        Each task writes its partition as ``part-NNNNN`` (``format``: ``"text"`` lines of ``str(x)``,
        ``"json"`` lines, ``.jsonl``, or ``"pickle"``, a pickled list, ``.pickle``); the driver then
        writes ``_SUCCESS``. A batch re-run after a failure or a driver restart leaves a committed
        batch alone and rewrites one that was cut off, so readers that only take folders with
        ``_SUCCESS`` see every batch once. ``storeOptions`` as for ``StreamingContext.checkpoint``
        (default: the checkpoint store's when that is an ``s3://`` location, else boto3's chain).
        A record the format cannot encode (``pickle`` refuses it) fails the batch; with ``onError="deadLetter"``
        it goes, exactly once, to ``_dead-letters-NNNNN.jsonl`` in the batch's folder instead
        (:mod:`dstreams.files.sink`).
        """
        ssc = self._ssc
        from dstreams.files.sink import FORMATS

        if format not in FORMATS:
            raise ValueError(f"unknown output format {format!r}: choose one of {sorted(FORMATS)}")
        if onError not in ("fail", "deadLetter"):
            raise ValueError(f"saveToStore: onError must be 'fail' or 'deadLetter', got {onError!r}")
        output = f"saveToStore({str(location)})"
        if not location or str(location).startswith("memory://"):
            raise ValueError("saveToStore needs an s3:// URL or a local folder the executors can write "
                             f"(memory:// stores live in one process), got {location!r}")

        def save(time: Any, rdd: RDD[Any]) -> None:
            ms = round(time.timestamp() * 1000)
            env = ssc.output_environment()
            options = sink_store_options(str(location), storeOptions, env.checkpoint_dir, env.store_options)
            target = f"{str(location).rstrip('/')}/{ms:015d}"
            save_to_store_exactly_once(rdd, target, env.check_owner, options, format,
                                       (output, ms) if onError == "deadLetter" else None)

        self._output(save, f"saveToStore({str(location)!r})")

    def saveToRedisStream(self, url: str, key: str, fields: Sequence[str] | Callable[[Any], Mapping[str, Any]]
                          | None = None, chunkSize: int = DEFAULT_REDIS_CHUNK_SIZE, *, onError: str = "fail",
                          maxEntryBytes: int | None = None, deadLetterKey: str | None = None) -> None:
        """Add each batch's records to the Redis stream ``key`` at ``url``, exactly once.

        Each record becomes one entry: a mapping of field -> value when ``fields`` is None, a tuple zipped with
        the names in ``fields``, or what the function ``fields(record)`` returns (values: str, bytes, int or
        float). Record ``i`` of partition ``p`` of batch ``t`` gets the id ``<t ms>-<p * 2**32 + i>``; Redis
        refuses an id at or below the stream's last one, and the sink writes a batch in id order, in atomic
        chunks of ``chunkSize`` entries that skip (after checking them) the entries already there: a batch
        re-run after a failure or a driver restart adds nothing twice and completes one cut off half-way. The
        key must have this sink as its only writer: entries another writer adds with higher ids fail the next
        batch with ``RedisStreamConflictError`` (never a silent loss). Read it with ``ssc.redisStream(key)``;
        see :mod:`dstreams.redis.sink` for the details. Needs redis-py (``pip install
        'dstreams[redis]'``).

        A record that cannot be encoded, or whose entry is larger than ``maxEntryBytes`` (default: Redis's limit,
        512 MiB), fails the batch; with ``onError="deadLetter"`` it goes instead, exactly once, to the stream
        ``deadLetterKey`` (default ``"<key>:dead-letters"``: fields ``output, batch_ms, part, row, record, error``)
        and the rest of the batch is written.
        """
        from dstreams.redis.sink import DEFAULT_MAX_ENTRY_BYTES, save_to_redis_stream

        ssc = self._ssc
        if not isinstance(key, str) or not key:
            raise ValueError(f"saveToRedisStream needs a stream key (a non-empty str), got {key!r}")
        if fields is not None and not callable(fields):
            if isinstance(fields, str) or not fields or not all(isinstance(f, str) for f in fields):
                raise ValueError("saveToRedisStream's fields: None (records are dicts), a list of field names "
                                 f"(records are tuples) or a function record -> dict, got {fields!r}")
            fields = list(fields)
        if int(chunkSize) < 1:
            raise ValueError(f"saveToRedisStream's chunkSize must be >= 1, got {chunkSize!r}")
        if onError not in ("fail", "deadLetter"):
            raise ValueError(f"saveToRedisStream: onError must be 'fail' or 'deadLetter', got {onError!r}")
        max_bytes = DEFAULT_MAX_ENTRY_BYTES if maxEntryBytes is None else int(maxEntryBytes)
        if max_bytes < 1:
            raise ValueError(f"saveToRedisStream's maxEntryBytes must be >= 1, got {maxEntryBytes!r}")
        dead_key = None
        if onError == "deadLetter":
            dead_key = deadLetterKey if deadLetterKey is not None else f"{key}:dead-letters"
            if not isinstance(dead_key, str) or not dead_key or dead_key == key:
                raise ValueError(f"saveToRedisStream's deadLetterKey must be a non-empty str other than the key, "
                                 f"got {deadLetterKey!r}")
        if ssc.concurrent_batches > 1:
            raise ValueError("saveToRedisStream writes batches in id order and needs them one at a time: "
                             f"concurrentBatches is {ssc.concurrent_batches} (set it, or "
                             "spark.streaming.concurrentJobs, to 1)")

        def save(time: Any, rdd: RDD[Any]) -> None:
            ms = round(time.timestamp() * 1000)
            save_to_redis_stream(rdd, ms, url, key, fields, ssc.output_environment().check_owner, int(chunkSize),
                                 max_entry_bytes=max_bytes, dead_letter_key=dead_key)

        self._output(save, f"saveToRedisStream({key!r})")

    def saveToPostgres(self, dsn: str, table: str, mode: str = "append", keyColumns: Sequence[str] | None = None,
                       columns: Sequence[str] | None = None, outputName: str | None = None, *,
                       onError: str = "fail") -> None:
        """Write each batch's records into the PostgreSQL table ``table`` at ``dsn``, exactly once.

        Records are tuples in the order of ``columns`` (default: every column of the table, in table order) or
        dicts by column name. ``mode="append"`` inserts them; ``mode="upsert"`` inserts or updates by
        ``keyColumns`` (a unique index must cover them; the last record of a key in a batch wins). The partitions
        are copied (``COPY``) in parallel into a staging table; the driver then moves the batch into ``table`` in one
        transaction together with its commit record ``(outputName, batch time)`` and a fence check, so a batch
        re-run after a kill, a failover or by a zombie driver writes nothing twice, and a fenced driver commits
        nothing. ``outputName`` (default: the table and the checkpoint location) names the commit records: give
        two outputs writing one table distinct names. The table must exist. ``onError="deadLetter"``: a record the
        table refuses (a constraint) goes, in the same transaction, to ``dstreams_sink_dead_letters`` (in the table's
        schema) instead of failing the batch. See :mod:`dstreams.postgres.sink`. Needs psycopg 3
        (``pip install 'dstreams[postgres]'``).
        """
        from dstreams.postgres.sink import MODES, claim_at_start, resolve_target, save_to_postgres

        ssc = self._ssc
        if mode not in MODES:
            raise ValueError(f"saveToPostgres: mode must be one of {MODES}, got {mode!r}")
        if onError not in ("fail", "deadLetter"):
            raise ValueError(f"saveToPostgres: onError must be 'fail' or 'deadLetter', got {onError!r}")
        if mode == "upsert" and not keyColumns:
            raise ValueError("saveToPostgres(mode='upsert') needs keyColumns (the columns of a unique index)")
        if not isinstance(table, str) or not table:
            raise ValueError(f"saveToPostgres needs a table name, got {table!r}")
        resolved: dict[str, Any] = {}

        def resolved_target(env: Any) -> Any:
            target = resolved.get("target")
            if target is None:
                name = outputName or (f"{table}@{env.checkpoint_dir}" if env.checkpoint_dir else table)
                target = resolved["target"] = resolve_target(dsn, table, mode, keyColumns, columns, name, onError)
            return target

        def claim() -> None:  # a new driver fences older ones off at once, not at its first commit (issue 42)
            env = ssc.output_environment()
            if env.epoch is not None:
                claim_at_start(lambda: resolved_target(env), env.epoch, dsn)

        def save(time: Any, rdd: RDD[Any]) -> None:
            env = ssc.output_environment()
            save_to_postgres(rdd, round(time.timestamp() * 1000), resolved_target(env), env.check_owner, env.epoch)

        self._output(save, f"saveToPostgres({table!r})", claim)

    def saveToKafka(self, topic: str, kafkaParams: Mapping[str, Any], keyFunc: Callable[[Any], Any] | None = None,
                    valueFunc: Callable[[Any], Any] | None = None, keySerializer: Callable[[Any], Any] | None = None,
                    valueSerializer: Callable[[Any], Any] | None = None, guarantee: str = "exactly-once",
                    outputName: str | None = None, ledgerTopic: str = "dstreams-ledger", *, onError: str = "fail",
                    deadLetterTopic: str | None = None) -> None:
        """Write each batch's records to the Kafka topic ``topic``, exactly once for ``read_committed`` consumers.

        A record that is a 2-tuple is ``(key, value)``, anything else is the value (no key); ``keyFunc(record)`` /
        ``valueFunc(record)`` pick them otherwise. Keys and values are written as bytes: ``bytes`` as they are,
        ``str`` as UTF-8, numbers as text, dicts and lists as JSON, None as null; ``keySerializer`` /
        ``valueSerializer`` (a function -> bytes) for anything else. ``kafkaParams`` needs ``bootstrap.servers``
        (or pyspark 2.4's ``metadata.broker.list``); other librdkafka producer settings pass through.

        ``guarantee="exactly-once"``: each output partition of a batch is one Kafka transaction, written by its
        task under a stable ``transactional.id`` together with a ledger entry (a consumer-group offset on
        ``ledgerTopic``, created when missing) recording the batch; a re-run batch, a retried or speculative task
        and a zombie driver write nothing twice. Consumers must read with ``isolation.level=read_committed``.
        Batches must run one at a time (``concurrentBatches`` 1). ``guarantee="at-least-once"``: an idempotent
        producer without transactions, faster, but a re-run batch writes again. ``outputName`` (default: the topic
        and the checkpoint location) names the ledger: give two outputs writing one topic distinct names. The topic
        must exist. See :mod:`dstreams.kafka.sink`. Needs confluent-kafka (``pip install 'dstreams[kafka]'``).

        A record that cannot be encoded or that the producer refuses as too large fails the batch; with
        ``onError="deadLetter"`` it goes instead, in the same transaction, to ``deadLetterTopic`` (default
        ``"<topic>.dead-letters"``; it must exist) as a JSON value (``output, batch_ms, part, row, record, error``).
        """
        from dstreams import faults
        from dstreams.kafka.sink import EXACTLY_ONCE, claim_at_start, make_target, save_to_kafka, with_output

        ssc = self._ssc
        if onError not in ("fail", "deadLetter"):
            raise ValueError(f"saveToKafka: onError must be 'fail' or 'deadLetter', got {onError!r}")
        dead_topic = (deadLetterTopic or f"{topic}.dead-letters") if onError == "deadLetter" else None
        target = make_target(topic, kafkaParams, outputName, guarantee, ledgerTopic, keyFunc, valueFunc,
                             keySerializer, valueSerializer, dead_topic)
        if guarantee == "exactly-once" and ssc.concurrent_batches > 1:
            raise ValueError("saveToKafka(guarantee='exactly-once') commits batches in order and needs them one at "
                             f"a time: concurrentBatches is {ssc.concurrent_batches} (set it, or "
                             "spark.streaming.concurrentJobs, to 1; or use guarantee='at-least-once')")

        def named(env: Any) -> Any:
            return with_output(target, outputName or (f"{topic}@{env.checkpoint_dir}" if env.checkpoint_dir else topic))

        def claim() -> None:  # a new driver fences older ones off at once, not at its first commit (issue 42)
            env = ssc.output_environment()
            if env.epoch is not None and guarantee == EXACTLY_ONCE:
                claim_at_start(named(env), env.epoch)

        def save(time: Any, rdd: RDD[Any]) -> None:
            ms = round(time.timestamp() * 1000)
            env = ssc.output_environment()
            save_to_kafka(rdd, ms, named(env), env.check_owner, env.epoch, lambda: faults.reached("sink-write"))

        self._output(save, f"saveToKafka({topic!r})", claim)

    # ------------------------------------------------------------------ inspection
    def slice(self: DStream[T], begin: Any, end: Any) -> list[RDD[T]]:
        """The RDDs of the batches between ``begin`` and ``end`` (datetimes or unix seconds)."""
        b, e = from_user_time(begin), from_user_time(end)
        return self._ssc.on_graph_thread(lambda: self._node.slice(b, e))
