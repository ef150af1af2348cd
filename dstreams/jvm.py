"""Lean construction of the engine's per-batch RDDs: fewer Py4J round trips on the driver.

Building a windowed batch through PySpark's public API costs ~94 round trips to the JVM (each one
0.1-0.7 ms): every class lookup (``sc._jvm.PythonRDD``) is a reflection call, every Python
function wrapper converts the same environment map and include list to Java collections again, a
storage level is a new Java object per ``persist``, ``sc.union`` checks classes and fills an array
element by element. This module keeps those per SparkContext (:class:`Bridge`) and builds the same
JVM objects PySpark builds, with the same Python-side RDD objects as a result.

Contracts:

* :func:`materialize(rdd)` gives a ``PipelinedRDD`` its Java RDD (``PythonRDD`` over the parent with
  the pickled function), exactly what PySpark's ``_jrdd`` property would build; RDDs that already
  have one, and the cases PySpark treats specially (Python profiling on, broadcast variables pickled
  into the function, a command above the broadcast threshold), are left to PySpark.
* :func:`persist(rdd, level)` is ``rdd.persist(level)`` with the Java storage level reused.
* :func:`shuffle(rdd, partitioner)` is ``rdd.partitionBy(n, partitionFunc)``: the same map-side
  bucketing into pickled chunks per target partition (:func:`_bucket_pairs`), the same JVM
  ``PairwiseRDD`` / ``PythonPartitioner`` (so co-partitioning is recognised exactly as PySpark's),
  the same deserializer and Python partitioner on the result.
* :func:`union(sc, rdds)` is ``sc.union(rdds)`` for RDDs whose Java RDDs are ``JavaRDD`` (every
  Python RDD's): a partition-aware union when all share one partitioner, as Spark decides.

``DSTREAMS_LEAN_JVM=0`` in the driver's environment (or :func:`set_enabled(False)`) makes every
function here take PySpark's own path: a switch for comparing the two and a way out should a
PySpark release change what these build.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from py4j.protocol import Py4JError
from pyspark import RDD, SparkContext, StorageLevel
from pyspark.core.rdd import PipelinedRDD
from pyspark.rdd import Partitioner
from pyspark.serializers import BatchedSerializer, CloudPickleSerializer, NoOpSerializer, pack_long

#: Pairs buffered per map task before a chunk per target partition is written (bounds memory).
CHUNK_PAIRS = 4096

_PICKLER = CloudPickleSerializer()

_enabled = os.environ.get("DSTREAMS_LEAN_JVM", "1").strip().lower() not in ("0", "false", "no", "off")


def set_enabled(enabled: bool) -> None:
    """Turn the lean path on or off for the whole driver (default: on unless ``DSTREAMS_LEAN_JVM=0``)."""
    global _enabled
    _enabled = bool(enabled)


class Bridge:
    """The JVM classes, members and objects one SparkContext's batches reuse."""

    def __init__(self, sc: SparkContext) -> None:
        jvm = sc._jvm
        assert jvm is not None
        self.sc = sc
        self.jsc = sc._jsc
        self.python_rdd = jvm.org.apache.spark.api.python.PythonRDD
        self.value_of_pair = self.python_rdd.valueOfPair
        self.python_function = jvm.org.apache.spark.api.python.SimplePythonFunction
        self.pairwise_rdd = jvm.org.apache.spark.api.python.PairwiseRDD
        self.python_partitioner = jvm.org.apache.spark.api.python.PythonPartitioner
        self.broadcast_threshold = int(jvm.org.apache.spark.api.python.PythonUtils.getBroadcastThreshold(sc._jsc))
        self._storage_level = jvm.org.apache.spark.storage.StorageLevel
        self._levels: dict[tuple[bool, bool, bool, bool, int], Any] = {}
        self._partitioners: dict[tuple[int, int], Any] = {}
        self._collections_key: tuple[Any, ...] | None = None
        self._env: Any = None
        self._includes: Any = None
        self._no_broadcasts: Any = None
        self.lock = threading.Lock()

    def storage_level(self, level: StorageLevel) -> Any:
        key = (level.useDisk, level.useMemory, level.useOffHeap, level.deserialized, level.replication)
        with self.lock:
            jlevel = self._levels.get(key)
            if jlevel is None:
                jlevel = self._levels[key] = self._storage_level(*key)
            return jlevel

    def partitioner(self, num_partitions: int, partition_func: Callable[[Any], int]) -> Any:
        key = (num_partitions, id(partition_func))
        with self.lock:
            jpart = self._partitioners.get(key)
            if jpart is None:
                jpart = self._partitioners[key] = self.python_partitioner(num_partitions, id(partition_func))
            return jpart

    def collections(self) -> tuple[Any, Any, Any]:
        """Java copies of ``sc.environment`` and ``sc._python_includes`` (rebuilt when they change)
        and an empty list of broadcast variables."""
        sc = self.sc
        key = (tuple(sorted(sc.environment.items())), tuple(sc._python_includes))
        with self.lock:
            if key != self._collections_key:
                gateway = sc._gateway
                env = gateway.jvm.java.util.HashMap()
                for k, v in key[0]:
                    env.put(k, v)
                includes = gateway.jvm.java.util.ArrayList()
                for path in key[1]:
                    includes.add(path)
                self._env, self._includes = env, includes
                self._no_broadcasts = gateway.jvm.java.util.ArrayList()
                self._collections_key = key
            return self._env, self._includes, self._no_broadcasts


_bridges: dict[int, Bridge] = {}
_bridges_lock = threading.Lock()


def bridge(sc: SparkContext) -> Bridge:
    """The :class:`Bridge` of ``sc`` (made on first use; a stopped context's is replaced)."""
    with _bridges_lock:
        b = _bridges.get(id(sc))
        if b is None or b.sc is not sc or b.jsc is not sc._jsc:
            b = _bridges[id(sc)] = Bridge(sc)
        return b


def _profiling(sc: SparkContext) -> bool:
    return bool(sc.profiler_collector) and sc._conf.get("spark.python.profile", "false") == "true"


def _pickled_broadcasts(sc: SparkContext) -> bool:
    """Whether pickling a function on this thread registered broadcast variables (the registry is
    thread-local and has no length)."""
    return next(iter(sc._pickled_broadcast_vars), None) is not None


def materialize(rdd: RDD) -> RDD:
    """Give a ``PipelinedRDD`` its Java RDD with the fewest round trips (see the module contract)."""
    if not _enabled or not isinstance(rdd, PipelinedRDD) or rdd._jrdd_val is not None:
        return rdd
    sc = rdd.ctx
    if _profiling(sc) or _pickled_broadcasts(sc):
        return rdd  # PySpark's own path
    if rdd._bypass_serializer:
        rdd._jrdd_deserializer = NoOpSerializer()
    command = (rdd.func, None, rdd._prev_jrdd_deserializer, rdd._jrdd_deserializer)
    pickled = _PICKLER.dumps(command)
    b = bridge(sc)
    if _pickled_broadcasts(sc) or len(pickled) > b.broadcast_threshold:
        sc._pickled_broadcast_vars.clear()  # PySpark pickles the command again and registers them anew
        return rdd
    env, includes, no_broadcasts = b.collections()
    func = b.python_function(bytearray(pickled), env, includes, sc.pythonExec, sc.pythonVer, no_broadcasts,
                             sc._javaAccumulator)
    jrdd = b.python_rdd(rdd._prev_jrdd.rdd(), func, rdd.preservesPartitioning, rdd.is_barrier)
    rdd._jrdd_val = jrdd.asJavaRDD()
    return rdd


def persist(rdd: RDD, level: StorageLevel) -> RDD:
    """``rdd.persist(level)`` reusing the Java storage level (and building a pipelined RDD leanly)."""
    if not _enabled:
        return rdd.persist(level)
    materialize(rdd)
    rdd.is_cached = True
    rdd._jrdd.persist(bridge(rdd.ctx).storage_level(level))
    return rdd


class _BuiltRDD(RDD):
    """An RDD over a Java RDD the engine built, whose barrier flag is known without asking the JVM."""

    def __init__(self, jrdd: Any, ctx: SparkContext, deserializer: Any, barrier: bool) -> None:
        super().__init__(jrdd, ctx, deserializer)
        self._barrier = barrier

    def _is_barrier(self) -> bool:
        return self._barrier


def _bucket_pairs(num_partitions: int, partition_func: Callable[[Any], int],
                  dumps: Callable[[Any], bytes]) -> Callable[[int, Iterable[Any]], Iterator[bytes]]:
    """Map side of a shuffle: ``(target partition as a packed long, pickled list of pairs)`` items,
    one pair of items per target partition every :data:`CHUNK_PAIRS` pairs and at the end."""

    def bucket(_: int, pairs: Iterable[Any]) -> Iterator[bytes]:
        buckets: dict[int, list[Any]] = {}
        held = 0
        for key, value in pairs:  # a record that is not a pair fails here, as in partitionBy
            target = partition_func(key) % num_partitions
            chunk = buckets.get(target)
            if chunk is None:
                buckets[target] = [(key, value)]
            else:
                chunk.append((key, value))
            held += 1
            if held >= CHUNK_PAIRS:
                for target, chunk in buckets.items():
                    yield pack_long(target)
                    yield dumps(chunk)
                buckets = {}
                held = 0
        for target, chunk in buckets.items():
            yield pack_long(target)
            yield dumps(chunk)

    return bucket


def shuffle(rdd: RDD, partitioner: Partitioner) -> RDD:
    """``rdd.partitionBy(partitioner.numPartitions, partitioner.partitionFunc)`` (see the module contract)."""
    if rdd.partitioner == partitioner:
        return rdd
    if not _enabled:
        return rdd.partitionBy(partitioner.numPartitions, partitioner.partitionFunc)
    sc = rdd.ctx
    n, func = partitioner.numPartitions, partitioner.partitionFunc
    out_serializer = sc._unbatched_serializer
    keyed = rdd.mapPartitionsWithIndex(_bucket_pairs(n, func, out_serializer.dumps), preservesPartitioning=True)
    keyed._bypass_serializer = True  # type: ignore[attr-defined]
    materialize(keyed)
    b = bridge(sc)
    pairs = b.pairwise_rdd(keyed._jrdd.rdd()).asJavaPairRDD()
    jrdd = b.value_of_pair(pairs.partitionBy(b.partitioner(n, func)))
    out = _BuiltRDD(jrdd, sc, BatchedSerializer(out_serializer), barrier=False)
    out.partitioner = Partitioner(n, func)
    return out


def union(sc: SparkContext, rdds: Sequence[RDD]) -> RDD:
    """``sc.union(rdds)`` (see the module contract); one RDD is returned as it is."""
    if len(rdds) == 1:
        return rdds[0]
    first = rdds[0]._jrdd_deserializer
    if not _enabled or any(r._jrdd_deserializer != first for r in rdds):
        return sc.union(list(rdds))  # PySpark re-serialises them to one format
    jrdds = [materialize(r)._jrdd for r in rdds]
    joined = jrdds[0]
    try:
        for other in jrdds[1:]:
            joined = joined.union(other)
    except Py4JError:  # not a JavaRDD (no Python RDD seen so far): PySpark's general path
        return sc.union(list(rdds))
    barrier = any(r._is_barrier() for r in rdds)
    return _BuiltRDD(joined, sc, first, barrier)
