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

Three modes (:func:`set_mode`, or ``DSTREAMS_LEAN_JVM`` in the driver's environment):

* ``compiled`` (the default): a small JVM class compiled at start-up (:mod:`dstreams.jvm_compiled`)
  builds each RDD in one round trip (a persisted one too, a shuffle too); when it cannot be
  compiled, ``calls`` is used;
* ``calls``: the same objects built with plain Py4J calls on cached classes and collections
  (4 round trips per Python RDD, 9 per shuffle);
* ``off`` (``DSTREAMS_LEAN_JVM=0``): every function here takes PySpark's own path: a switch for
  comparing and a way out should a PySpark release change what these build.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from py4j.protocol import Py4JError
from pyspark import RDD, SparkContext, StorageLevel
from pyspark.core.rdd import PipelinedRDD
from pyspark.rdd import Partitioner
from pyspark.serializers import BatchedSerializer, CloudPickleSerializer, NoOpSerializer, pack_long

from .jvm_compiled import compile_builder

#: RDDs the compiled builder unions in one call (its ``union`` has this many parameters).
UNION_ARITY = 8

#: Pairs buffered per map task before a chunk per target partition is written (bounds memory).
CHUNK_PAIRS = 4096

_PICKLER = CloudPickleSerializer()

log = logging.getLogger(__name__)

MODES = ("compiled", "calls", "off")


def _mode_from_env(value: str) -> str:
    value = value.strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    if value == "calls":
        return "calls"
    if value in ("", "1", "true", "yes", "on", "compiled"):
        return "compiled"
    raise ValueError(f"DSTREAMS_LEAN_JVM={value!r} is not one of compiled, calls, 0 (off)")


_mode = _mode_from_env(os.environ.get("DSTREAMS_LEAN_JVM", ""))
_enabled = _mode != "off"


def set_mode(mode: str) -> None:
    """``compiled`` (default), ``calls`` or ``off`` for the whole driver (see the module docstring)."""
    global _mode, _enabled
    if mode not in MODES:
        raise ValueError(f"jvm mode {mode!r} is not one of {', '.join(MODES)}")
    _mode = mode
    _enabled = mode != "off"


def mode() -> str:
    """The current mode (``compiled`` also when the builder could not be compiled: see :meth:`Bridge.builder`)."""
    return _mode


def set_enabled(enabled: bool) -> None:
    """``set_mode("compiled")`` when true, ``set_mode("off")`` when false."""
    set_mode("compiled" if enabled else "off")


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
        self._builder: Any = None
        self._builder_tried = False
        self._builder_key: tuple[Any, ...] | None = None
        self._builder_lock = threading.Lock()
        self.lock = threading.Lock()

    def builder(self) -> Any | None:
        """The compiled ``BatchBuilder`` with this context's collections set, or ``None`` when it
        cannot be compiled (tried once per context)."""
        with self._builder_lock:
            if not self._builder_tried:
                self._builder_tried = True
                try:
                    self._builder = compile_builder(self.sc._jvm, self.jsc)
                except (Py4JError, AttributeError) as e:  # AttributeError: the context was stopped meanwhile
                    if self.sc._jsc is not None:
                        log.warning("dstreams: could not compile the JVM batch builder (%s); stateful and "
                                    "windowed batches are built with plain Py4J calls (a few ms more driver "
                                    "time per batch)", str(e).splitlines()[0] if str(e) else type(e).__name__)
            builder = self._builder
        if builder is None:
            return None
        env, includes, no_broadcasts = self.collections()
        sc = self.sc
        key = (id(env), id(includes), sc.pythonExec, sc.pythonVer, id(sc._javaAccumulator))
        with self._builder_lock:
            if key != self._builder_key:
                builder.setContext(env, includes, sc.pythonExec, sc.pythonVer, no_broadcasts, sc._javaAccumulator)
                self._builder_key = key
        return builder

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


def prepare(sc: SparkContext) -> None:
    """Compile the JVM batch builder of ``sc`` in the background (about 0.5 s the first time in a JVM),
    so the first batch that needs it does not wait as long; a no-op unless the mode is ``compiled``."""
    if _mode != "compiled":
        return
    b = bridge(sc)
    if not b._builder_tried:
        threading.Thread(target=b.builder, name="dstreams-jvm-builder", daemon=True).start()


def _profiling(sc: SparkContext) -> bool:
    return bool(sc.profiler_collector) and sc._conf.get("spark.python.profile", "false") == "true"


def _pickled_broadcasts(sc: SparkContext) -> bool:
    """Whether pickling a function on this thread registered broadcast variables (the registry is
    thread-local and has no length)."""
    return next(iter(sc._pickled_broadcast_vars), None) is not None


def _command(rdd: PipelinedRDD) -> bytes | None:
    """The pickled command of ``rdd``'s Python function as PySpark's ``_jrdd`` would send it, or
    ``None`` when PySpark must build it itself (profiling, broadcast variables, a large command)."""
    sc = rdd.ctx
    if _profiling(sc) or _pickled_broadcasts(sc):
        return None
    if rdd._bypass_serializer:
        rdd._jrdd_deserializer = NoOpSerializer()
    command = (rdd.func, None, rdd._prev_jrdd_deserializer, rdd._jrdd_deserializer)
    pickled = _PICKLER.dumps(command)
    if _pickled_broadcasts(sc) or len(pickled) > bridge(sc).broadcast_threshold:
        sc._pickled_broadcast_vars.clear()  # PySpark pickles the command again and registers them anew
        return None
    return pickled


def _compiled_builder(sc: SparkContext) -> Any | None:
    return bridge(sc).builder() if _mode == "compiled" else None


def _build(rdd: RDD, level: Any = None) -> bool:
    """Give an unbuilt ``PipelinedRDD`` its Java RDD leanly, persisted at the Java ``level`` if given;
    False when it is left to PySpark (then nothing was persisted)."""
    if not _enabled or not isinstance(rdd, PipelinedRDD) or rdd._jrdd_val is not None:
        return False
    pickled = _command(rdd)
    if pickled is None:
        return False
    sc = rdd.ctx
    builder = _compiled_builder(sc)
    if builder is not None:
        rdd._jrdd_val = builder.pipe(rdd._prev_jrdd, bytearray(pickled), rdd.preservesPartitioning,
                                     rdd.is_barrier, level)
        return True
    b = bridge(sc)
    env, includes, no_broadcasts = b.collections()
    func = b.python_function(bytearray(pickled), env, includes, sc.pythonExec, sc.pythonVer, no_broadcasts,
                             sc._javaAccumulator)
    jrdd = b.python_rdd(rdd._prev_jrdd.rdd(), func, rdd.preservesPartitioning, rdd.is_barrier)
    rdd._jrdd_val = jrdd.asJavaRDD()
    if level is not None:
        rdd._jrdd_val.persist(level)
    return True


def materialize(rdd: RDD) -> RDD:
    """Give a ``PipelinedRDD`` its Java RDD with the fewest round trips (see the module contract)."""
    _build(rdd)
    return rdd


def persist(rdd: RDD, level: StorageLevel) -> RDD:
    """``rdd.persist(level)`` reusing the Java storage level (and building a pipelined RDD leanly)."""
    if not _enabled:
        return rdd.persist(level)
    jlevel = bridge(rdd.ctx).storage_level(level)
    if not _build(rdd, jlevel):
        rdd._jrdd.persist(jlevel)
    rdd.is_cached = True
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
    b = bridge(sc)
    builder = _compiled_builder(sc)
    pickled = _command(keyed) if builder is not None else None
    if builder is not None and pickled is not None:
        jrdd = builder.shuffle(keyed._prev_jrdd, bytearray(pickled), keyed.is_barrier, b.partitioner(n, func))
    else:
        materialize(keyed)
        pairs = b.pairwise_rdd(keyed._jrdd.rdd()).asJavaPairRDD()
        jrdd = b.value_of_pair(pairs.partitionBy(b.partitioner(n, func)))
    out = _BuiltRDD(jrdd, sc, BatchedSerializer(out_serializer), barrier=False)
    out.partitioner = Partitioner(n, func)
    return out


def _union_java(sc: SparkContext, jrdds: list[Any]) -> Any:
    """The union of Java RDDs: flat, :data:`UNION_ARITY` per call with the compiled builder (the
    union of the first ones is then unioned with the next ones), else chained ``JavaRDD.union``."""
    builder = _compiled_builder(sc)
    if builder is None:
        joined = jrdds[0]
        for other in jrdds[1:]:
            joined = joined.union(other)
        return joined
    joined, rest = None, list(jrdds)
    while rest:
        take = UNION_ARITY if joined is None else UNION_ARITY - 1
        args = ([] if joined is None else [joined]) + rest[:take]
        rest = rest[take:]
        joined = builder.union(*args, *[None] * (UNION_ARITY - len(args)))
    return joined


def union(sc: SparkContext, rdds: Sequence[RDD]) -> RDD:
    """``sc.union(rdds)`` (see the module contract); one RDD is returned as it is."""
    if len(rdds) == 1:
        return rdds[0]
    first = rdds[0]._jrdd_deserializer
    if not _enabled or any(r._jrdd_deserializer != first for r in rdds):
        return sc.union(list(rdds))  # PySpark re-serialises them to one format
    jrdds = [materialize(r)._jrdd for r in rdds]
    try:
        joined = _union_java(sc, jrdds)
    except Py4JError:  # not a JavaRDD (no Python RDD seen so far): PySpark's general path
        return sc.union(list(rdds))
    barrier = any(r._is_barrier() for r in rdds)
    return _BuiltRDD(joined, sc, first, barrier)


def num_partitions(rdd: RDD) -> int:
    """``rdd.getNumPartitions()`` in one round trip when the compiled builder is there."""
    builder = _compiled_builder(rdd.ctx) if _enabled else None
    if builder is None:
        return rdd.getNumPartitions()
    return int(builder.numPartitions(rdd._jrdd))
