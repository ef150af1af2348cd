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

Two modes, per SparkContext: its conf key ``spark.dstreams.jvm.mode``, else ``DSTREAMS_LEAN_JVM`` in
the driver's environment (see :data:`dstreams.config.JVM_MODE`), resolved when a StreamingContext
starts (:func:`prepare`) and kept on the context's :class:`Bridge`:

* ``compiled`` (the default; ``DSTREAMS_LEAN_JVM=compiled`` or ``1``): a small JVM class compiled at
  start-up (:mod:`dstreams.spark.jvm_compiled`) builds each RDD in one round trip (a persisted one too, a
  shuffle too); when it cannot be compiled, one warning, and every function here takes PySpark's own path;
* ``off`` (``DSTREAMS_LEAN_JVM=0`` or ``off``): every function here takes PySpark's own path: a switch for
  comparing and a way out should a PySpark release change what these build.

:func:`set_mode` forces one mode on every context of the process (tests, benchmarks).
"""


from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from py4j.protocol import Py4JError
from pyspark import RDD, SparkContext, StorageLevel
from pyspark.core.rdd import Partitioner, PipelinedRDD
from pyspark.serializers import BatchedSerializer, CloudPickleSerializer, NoOpSerializer, pack_long

from .. import config
from .jvm_compiled import compile_builder
from .sparkconf import is_local_master

#: RDDs the compiled builder unions in one call (its ``union`` has this many parameters).
UNION_ARITY = 8

#: Pairs buffered per map task before a chunk per target partition is written (bounds memory).
CHUNK_PAIRS = 4096

_PICKLER = CloudPickleSerializer()

log = logging.getLogger(__name__)

MODES = config.JVM_MODES

#: The mode :func:`set_mode` forces on every context, or None (each context's own setting).
_forced: str | None = None


def resolve_mode(sc: SparkContext) -> str:
    """``sc``'s mode: its conf key ``spark.dstreams.jvm.mode``, else ``$DSTREAMS_LEAN_JVM``, else
    ``compiled``; a ``ValueError`` naming the accepted values for anything else."""
    return config.get(config.JVM_MODE, sc._conf)


def set_mode(mode: str | None) -> None:
    """Force ``compiled`` or ``off`` on every SparkContext of this process, over their conf and the
    environment (tests, benchmarks); ``None`` returns each context to its own setting."""
    global _forced
    if mode is not None and mode not in MODES:
        raise ValueError(f"jvm mode {mode!r} is not one of {', '.join(MODES)}")
    _forced = mode


def mode(sc: SparkContext | None = None) -> str:
    """The mode in effect for ``sc`` (default: the running SparkContext; with none, the environment's):
    ``compiled`` also when the builder could not be compiled (see :meth:`Bridge.builder`)."""
    if _forced is not None:
        return _forced
    if sc is None:
        sc = SparkContext._active_spark_context
    if sc is None or sc._jsc is None:
        return config.get(config.JVM_MODE)
    return bridge(sc).mode


class Bridge:
    """One SparkContext's mode and the JVM classes, members and objects its batches reuse.

    Nothing is asked of the JVM before the builder is compiled (:meth:`builder`), so a context in mode
    ``off``, or whose builder cannot be compiled, runs on PySpark's own calls alone."""

    def __init__(self, sc: SparkContext, mode: str | None = None) -> None:
        self.sc = sc
        self.jsc = sc._jsc
        self.mode = resolve_mode(sc) if mode is None else mode
        self.broadcast_threshold = 0
        self._storage_level: Any = None
        self._python_partitioner: Any = None
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

    def reresolve_mode(self) -> str:
        """Read this context's mode again (:func:`resolve_mode`) and keep it."""
        self.mode = resolve_mode(self.sc)
        return self.mode

    def _compile(self) -> None:
        """Compile the builder and look up the JVM members used with it; on failure one warning, and
        the builder stays None (PySpark's own calls)."""
        try:
            builder = compile_builder(self.sc._jvm, self.jsc)
            # Ignored for mypy: PySpark's private _jvm is Optional in its stubs; it is set while a context runs.
            python = self.sc._jvm.org.apache.spark.api.python  # type: ignore[union-attr]
            self.broadcast_threshold = int(python.PythonUtils.getBroadcastThreshold(self.jsc))
            self._storage_level = self.sc._jvm.org.apache.spark.storage.StorageLevel  # type: ignore[union-attr]
            self._python_partitioner = python.PythonPartitioner
            self._builder = builder
        except (Py4JError, AttributeError) as e:  # AttributeError: the context was stopped meanwhile
            if self.sc._jsc is not None:
                log.warning("dstreams: could not compile the JVM batch builder (%s); stateful and windowed "
                            "batches are built with PySpark's own calls (a few ms more driver time per batch)",
                            str(e).splitlines()[0] if str(e) else type(e).__name__)

    def builder(self) -> Any | None:
        """The compiled ``BatchBuilder`` with this context's collections set, or ``None`` when it
        cannot be compiled (tried once per context)."""
        with self._builder_lock:
            if not self._builder_tried:
                self._builder_tried = True
                self._compile()
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
        """The Java storage level of ``level`` (only once the builder compiled)."""
        key = (level.useDisk, level.useMemory, level.useOffHeap, level.deserialized, level.replication)
        with self.lock:
            jlevel = self._levels.get(key)
            if jlevel is None:
                jlevel = self._levels[key] = self._storage_level(*key)
            return jlevel

    def partitioner(self, num_partitions: int, partition_func: Callable[[Any], int]) -> Any:
        """The JVM ``PythonPartitioner`` PySpark's ``partitionBy`` makes (only once the builder compiled)."""
        key = (num_partitions, id(partition_func))
        with self.lock:
            jpart = self._partitioners.get(key)
            if jpart is None:
                jpart = self._partitioners[key] = self._python_partitioner(num_partitions, id(partition_func))
            return jpart

    def collections(self) -> tuple[Any, Any, Any]:
        """Java copies of ``sc.environment`` and ``sc._python_includes`` (rebuilt when they change)
        and an empty list of broadcast variables."""
        sc = self.sc
        # Ignored for mypy: PySpark's private _python_includes and _gateway are Optional in its stubs; set while a
        # context runs.
        key = (tuple(sorted(sc.environment.items())), tuple(sc._python_includes))  # type: ignore[arg-type]
        with self.lock:
            if key != self._collections_key:
                gateway = sc._gateway
                env = gateway.jvm.java.util.HashMap()  # type: ignore[union-attr]
                for k, v in key[0]:
                    env.put(k, v)
                includes = gateway.jvm.java.util.ArrayList()  # type: ignore[union-attr]
                for path in key[1]:
                    includes.add(path)
                self._env, self._includes = env, includes
                self._no_broadcasts = gateway.jvm.java.util.ArrayList()  # type: ignore[union-attr]
                self._collections_key = key
            return self._env, self._includes, self._no_broadcasts


_bridges: dict[int, Bridge] = {}
_bridges_lock = threading.Lock()


def bridge(sc: SparkContext) -> Bridge:
    """The :class:`Bridge` of ``sc`` (made on first use, its mode resolved then; a stopped context's is
    replaced)."""
    with _bridges_lock:
        b = _bridges.get(id(sc))
        if b is None or b.sc is not sc or b.jsc is not sc._jsc:
            b = _bridges[id(sc)] = Bridge(sc)
        return b


def prepare(sc: SparkContext) -> None:
    """Resolve ``sc``'s mode (:func:`resolve_mode`: raises ``ValueError`` for an invalid setting) and keep
    it on its :class:`Bridge`; in mode ``compiled``, compile the JVM batch builder in the background
    (about 0.5 s the first time in a JVM), so the first batch that needs it does not wait as long."""
    b = bridge(sc)
    b.reresolve_mode()
    if mode(sc) == "compiled" and not b._builder_tried:
        threading.Thread(target=b.builder, name="dstreams-jvm-builder", daemon=True).start()


def _compiled_builder(sc: SparkContext) -> Any | None:
    """``sc``'s compiled builder, or None in mode ``off`` or when it could not be compiled."""
    b = bridge(sc)
    if (_forced or b.mode) != "compiled":
        return None
    return b.builder()


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


def _build(rdd: RDD, builder: Any, level: Any = None) -> bool:
    """Give an unbuilt ``PipelinedRDD`` its Java RDD with ``builder``, persisted at the Java ``level`` if
    given; False when it is left to PySpark (then nothing was persisted)."""
    if not isinstance(rdd, PipelinedRDD) or rdd._jrdd_val is not None:
        return False
    pickled = _command(rdd)
    if pickled is None:
        return False
    rdd._jrdd_val = builder.pipe(rdd._prev_jrdd, bytearray(pickled), rdd.preservesPartitioning, rdd.is_barrier,
                                 level)
    return True


def materialize(rdd: RDD) -> RDD:
    """Give a ``PipelinedRDD`` its Java RDD with the fewest round trips (see the module contract)."""
    if isinstance(rdd, PipelinedRDD) and rdd._jrdd_val is None:
        builder = _compiled_builder(rdd.ctx)
        if builder is not None:
            _build(rdd, builder)
    return rdd


def state_level(master: str, conf: config.ConfLike | None = None) -> StorageLevel:
    """How a state's cached RDDs (the RDD state's, an incremental window's, the executor store's handles) are kept
    under ``master`` and ``spark.dstreams.state.replicas`` (read from ``conf``, else the environment): in memory, on
    two executors where there is more than one process (``auto`` off ``local``/``local[N]``, or ``2``), so that a
    lost executor or host leaves every partition readable from its other copy; else on one, and a lost partition is
    recomputed through lineage from the newest checkpoint (one nested task per batch since it)."""
    replicas = config.get(config.STATE_REPLICAS, conf)
    two = not is_local_master(master) and replicas in ("auto", "2")
    return StorageLevel.MEMORY_ONLY_2 if two else StorageLevel.MEMORY_ONLY


def persist(rdd: RDD, level: StorageLevel) -> RDD:
    """``rdd.persist(level)`` reusing the Java storage level (and building a pipelined RDD leanly)."""
    builder = _compiled_builder(rdd.ctx)
    if builder is None:
        return rdd.persist(level)
    jlevel = bridge(rdd.ctx).storage_level(level)
    if not _build(rdd, builder, jlevel):
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
    sc = rdd.ctx
    n, func = partitioner.numPartitions, partitioner.partitionFunc
    builder = _compiled_builder(sc)
    if builder is None:
        return rdd.partitionBy(n, func)
    out_serializer = sc._unbatched_serializer
    keyed = rdd.mapPartitionsWithIndex(_bucket_pairs(n, func, out_serializer.dumps), preservesPartitioning=True)
    assert isinstance(keyed, PipelinedRDD), "PySpark's mapPartitionsWithIndex returns a PipelinedRDD"
    keyed._bypass_serializer = True
    pickled = _command(keyed)
    if pickled is None:  # profiling, broadcast variables, a large command: PySpark's own shuffle
        return rdd.partitionBy(n, func)
    jrdd = builder.shuffle(keyed._prev_jrdd, bytearray(pickled), keyed.is_barrier, bridge(sc).partitioner(n, func))
    out = _BuiltRDD(jrdd, sc, BatchedSerializer(out_serializer), barrier=False)
    out.partitioner = Partitioner(n, func)
    return out


def _union_java(builder: Any, jrdds: list[Any]) -> Any:
    """The flat union of Java RDDs, :data:`UNION_ARITY` per builder call (the union of the first ones is
    then unioned with the next ones)."""
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
    builder = _compiled_builder(sc)
    if builder is None or any(r._jrdd_deserializer != first for r in rdds):
        return sc.union(list(rdds))  # PySpark's own calls; it re-serialises different formats to one
    jrdds = [materialize(r)._jrdd for r in rdds]
    try:
        joined = _union_java(builder, jrdds)
    except Py4JError:  # not a JavaRDD (no Python RDD seen so far): PySpark's general path
        return sc.union(list(rdds))
    barrier = any(r._is_barrier() for r in rdds)
    return _BuiltRDD(joined, sc, first, barrier)


def has_no_partitions(rdd: RDD) -> bool:
    """Whether ``rdd`` has no partition at all (e.g. an empty folder listing seen through per-record
    operations), asked without building a pipelined RDD's JVM side (no function is serialised)."""
    if isinstance(rdd, PipelinedRDD) and rdd._jrdd_val is None:
        return bool(rdd._prev_jrdd.partitions().isEmpty())
    return bool(rdd._jrdd.partitions().isEmpty())


def num_partitions(rdd: RDD) -> int:
    """``rdd.getNumPartitions()`` in one round trip when the compiled builder is there."""
    builder = _compiled_builder(rdd.ctx)
    if builder is None:
        return rdd.getNumPartitions()
    return int(builder.numPartitions(rdd._jrdd))
