"""The DStream node contract.

A node is one stream in the graph. Subclasses implement exactly three things:

* ``slide_duration`` – the interval between two of its RDDs;
* ``dependencies`` – the nodes it reads from;
* ``compute(time) -> RDD | None`` – build (lazily: no Spark job runs here) the RDD of batch ``time``.

The base class owns everything else: ``get_or_compute`` (one RDD per valid batch time, memoised in
a dict), validity (``time > zero`` and ``(time - zero) % slide == 0``), persistence, the remember
duration (how long generated RDDs are kept so that windows and state can read them) and
``clear_metadata``, which forgets and unpersists what is no longer needed so that a long run keeps
driver and executor memory flat.

A node also owns its **recovery contract**; the recovery layer calls only these members:

* ``describe_params()`` – the parameters that define the topology and change results, for the graph
  fingerprint that a restarted driver must reproduce (each subclass names its own);
* ``must_checkpoint`` and ``checkpoint_partitioner`` – whether the node's RDDs form a state chain that
  is checkpointed, and the partitioner a checkpoint reader must keep (None: not hash-partitioned);
* ``restore_from_checkpoint(time, reader)`` – a restarted driver installs the RDD reading the node's
  checkpoint at ``time``; later batches build on it;
* ``adopt_checkpoint(time, reader)`` – a checkpoint committed while running replaces the node's RDD
  at ``time`` (the lineage cut), on the event loop's thread;
* ``batch_record(time)`` / ``replay_records(records)`` and ``node_state()`` / ``restore_node_state(state)``
  – the one persistence contract (the metadata log; input offsets and source state are the input base
  class's default of it): ``batch_record``/``replay_records`` is what a node fixed on the driver while building
  batch ``time`` that a replay must reuse (JSON-able; an event-time stream's watermark): the journal
  writes it to the metadata log with the batch's input offsets, and a restarted driver hands the
  recorded ones back before generating. None (the default): nothing to record.

Input nodes add the offsets contract (:class:`dstreams.nodes.input.InputNode`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark import RDD, StorageLevel
from pyspark.core.rdd import Partitioner

from .spark import jvm
from .time import BatchTime, Duration

if TYPE_CHECKING:
    from .graph import DStreamGraph

log = logging.getLogger(__name__)

#: Default checkpoint interval target (Spark's rule: the smallest multiple of the slide >= 10 s).
DEFAULT_CHECKPOINT_TARGET = Duration(10_000)


class DStreamNode:
    """Base of every stream node; see the module docstring for the contract."""

    #: True for nodes whose RDD at ``t`` depends on their own RDD at ``t - slide`` (state chains).
    #: Such nodes get a checkpoint interval by default so that their lineage stays bounded.
    must_checkpoint: ClassVar[bool] = False
    #: ``DStream.checkpoint(interval)`` also caches the stream (False: a store-backed state's view, whose
    #: state is already kept by the executor state store).
    checkpoint_persists: ClassVar[bool] = True
    #: A restarted driver reads this node's checkpoint whole to verify it before resuming from it (False: the
    #: executor state store, which checks that the parts exist and reads them only where a store needs them).
    checkpoint_read_to_verify: ClassVar[bool] = True

    _ids = 0
    _ids_lock = threading.Lock()

    def __init__(self, graph: DStreamGraph) -> None:
        self.graph = graph
        with DStreamNode._ids_lock:
            DStreamNode._ids += 1
            self.id = DStreamNode._ids
        #: Stable across driver restarts that rebuild the same graph: the node's position in it.
        self.key = graph.register(self)
        self.generated: dict[int, RDD] = {}
        self._retired: dict[int, list[RDD]] = {}
        self.zero_time: BatchTime | None = None
        self.remember_duration: Duration | None = None
        self.storage_level: StorageLevel | None = None
        self.checkpoint_interval: Duration | None = None
        self._persisted_by_engine: set[int] = set()
        #: Times whose RDD reads a committed checkpoint (adopted or restored): lineage stops there.
        self._reader_times: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        """A node is stored in the checkpoint before it runs: no RDDs, only its definition."""
        state = dict(self.__dict__)
        state.update(generated={}, _retired={}, _persisted_by_engine=set(), _reader_times=set())
        return state

    # ----------------------------------------------------------------- the three members
    @property
    def slide_duration(self) -> Duration:
        raise NotImplementedError

    @property
    def dependencies(self) -> list[DStreamNode]:
        raise NotImplementedError

    def compute(self, time: BatchTime) -> RDD | None:
        raise NotImplementedError

    # ----------------------------------------------------------------- naming
    @property
    def key_name(self) -> str:
        """The type part of :attr:`key` (checkpoint keys, the fingerprint, the status page): the class's name,
        or what a node parametrised by an operator says (read while the base ``__init__`` registers the node)."""
        return type(self).__name__

    @property
    def name(self) -> str:
        return f"{type(self).__name__}#{self.id}"

    def describe(self) -> str:
        """The node's parameters that define the topology and its results, for the graph fingerprint: the slide,
        then :meth:`describe_params`."""
        return " ".join([f"slide={self.slide_duration.ms}", *self.describe_params()])

    def describe_params(self) -> list[str]:
        """Topology parameters beyond the slide (``window=30000``, ``partitions=4``...); subclasses add theirs."""
        return []

    # ----------------------------------------------------------------- the persistence contract
    # What a node records in the metadata log and restores from after a driver restart (as Spark's
    # DStreamCheckpointData serves both state and Kafka offsets). The journal asks every node, the resume plan
    # hands back to every node; nothing else of a node is persisted in the log. The input base class's default
    # is its input offsets and source state (``dstreams.nodes.input``); an event-time stream records its
    # watermark (``dstreams.nodes.event_time``).
    def batch_record(self, time: BatchTime) -> Any:
        """What this node fixed for batch ``time`` that a replay must reuse (JSON-able), or None.

        Called on the event loop after the batch is built and before it runs (the journal).
        """
        return None

    def replay_records(self, records: dict[int, Any]) -> None:
        """A restarted driver hands back what :meth:`batch_record` returned, by batch time (ms), before it
        generates a batch (only the times that recorded something; not called when none did)."""

    def node_state(self) -> Any:
        """What the node must remember across a driver restart beyond its batches' records (JSON-able; e.g. the
        files a folder source consumed), or None. Recorded with every batch; the newest one is handed back."""
        return None

    def restore_node_state(self, state: Any) -> None:
        """A restarted driver hands back the newest :meth:`node_state` recorded, before :meth:`replay_records`."""

    def event_time_metrics(self, time: BatchTime) -> dict[str, Any] | None:
        """What batch ``time`` saw of this node's event time, for ``BatchInfo.event_time`` (None: not an
        event-time stream). Reads only: called on a runner thread."""
        return None

    def before_batch_retry(self, time: BatchTime, error: BaseException) -> None:
        """Called on every node before a failed batch ``time`` is tried again, with the try's error (a hook: a
        node drops what made the try fail). The default does nothing."""

    @property
    def checkpoint_partitioner(self) -> Partitioner | None:
        """The partitioner a reader of this node's checkpoint must keep (None: not hash-partitioned)."""
        return None

    def __repr__(self) -> str:
        return f"<{self.name} slide={self.slide_duration}>"

    # ----------------------------------------------------------------- lifecycle
    def initialize(self, zero_time: BatchTime) -> None:
        """Fix the zero time, default the checkpoint interval and remember duration; recurse."""
        if self.zero_time is not None and self.zero_time != zero_time:
            raise RuntimeError(f"{self.name} initialised twice with different zero times")
        self.zero_time = zero_time
        slide = self.slide_duration
        if self.must_checkpoint and self.checkpoint_interval is None:
            k = -(-DEFAULT_CHECKPOINT_TARGET.ms // slide.ms)
            self.checkpoint_interval = Duration(slide.ms * k)
        minimum = slide
        if self.checkpoint_interval is not None and minimum <= self.checkpoint_interval:
            # Keep the newest checkpointed RDD reachable until the next one exists.
            minimum = self.checkpoint_interval * 2
        if self.remember_duration is None or self.remember_duration < minimum:
            self.remember_duration = minimum
        for dep in self.dependencies:
            dep.initialize(zero_time)

    def validate_at_start(self) -> None:
        """Raise ValueError for a graph that cannot run (checked once, at ``start()``)."""
        slide = self.slide_duration
        if slide.ms <= 0:
            raise ValueError(f"{self.name}: slide duration must be positive")
        if self.checkpoint_interval is not None:
            if not self.checkpoint_interval.is_multiple_of(slide):
                raise ValueError(
                    f"{self.name}: checkpoint interval {self.checkpoint_interval} must be a multiple of "
                    f"the slide duration {slide}"
                )
        for dep in self.dependencies:
            dep.validate_at_start()

    @property
    def parent_remember_duration(self) -> Duration:
        """How long the dependencies must remember their RDDs for this node (windows add theirs)."""
        assert self.remember_duration is not None
        return self.remember_duration

    def remember(self, duration: Duration | None) -> None:
        if duration is not None and (self.remember_duration is None or duration > self.remember_duration):
            self.remember_duration = duration
        if self.remember_duration is not None:
            for dep in self.dependencies:
                dep.remember(self.parent_remember_duration)

    # ----------------------------------------------------------------- generation
    def is_time_valid(self, time: BatchTime) -> bool:
        if self.zero_time is None:
            raise RuntimeError(f"{self.name} has not been initialised (the context is not started)")
        if time <= self.zero_time:
            return False
        return (time.ms - self.zero_time.ms) % self.slide_duration.ms == 0

    def get_or_compute(self, time: BatchTime) -> RDD | None:
        """The RDD of batch ``time`` (computed once and memoised), or None at an invalid time."""
        rdd = self.generated.get(time.ms)
        if rdd is not None:
            return rdd
        if not self.is_time_valid(time):
            return None
        rdd = self.compute(time)
        if rdd is None:
            return None
        if self.storage_level is not None and not rdd.is_cached:
            jvm.persist(rdd, self.storage_level)
            self._persisted_by_engine.add(time.ms)
        if self.checkpoint_due(time):
            checkpointer = self.graph.checkpointer
            assert checkpointer is not None, "a node has a zero time only once its graph started with its services"
            checkpointer.mark(self, time, rdd)
        self.generated[time.ms] = rdd
        return rdd

    def checkpoint_due(self, time: BatchTime) -> bool:
        if self.checkpoint_interval is None or self.zero_time is None:
            return False
        return (time.ms - self.zero_time.ms) % self.checkpoint_interval.ms == 0

    def slice(self, from_time: BatchTime, to_time: BatchTime) -> list[RDD]:
        """RDDs of the valid batch times in ``[from_time, to_time]`` (both aligned down to the grid)."""
        if self.zero_time is None:
            raise RuntimeError(f"{self.name} has not been initialised (the context is not started)")
        slide = self.slide_duration
        zero = self.zero_time
        start = from_time if from_time.is_aligned(slide, zero) else from_time.floor(slide, zero)
        end = to_time if to_time.is_aligned(slide, zero) else to_time.floor(slide, zero)
        out: list[RDD] = []
        for t in start.to(end, slide):
            if t > zero:
                rdd = self.get_or_compute(t)
                if rdd is not None:
                    out.append(rdd)
        return out

    # ----------------------------------------------------------------- cleanup
    def clear_metadata(self, time: BatchTime) -> None:
        """Forget (and unpersist what the engine persisted of) RDDs older than the remember window."""
        assert self.remember_duration is not None
        horizon = time.ms - self.remember_duration.ms
        old = [t for t in self.generated if t <= horizon]
        for t in old:
            rdd = self.generated.pop(t)
            self._reader_times.discard(t)
            if t in self._persisted_by_engine:
                self._persisted_by_engine.discard(t)
                later = self._times_holding(rdd)
                if later:  # the same RDD is a later batch's too (a state no input changed): it keeps the cache
                    self._persisted_by_engine.add(max(later))
                else:
                    rdd.unpersist(blocking=False)
        for t in [t for t in self._retired if t <= horizon]:
            for rdd in self._retired.pop(t):
                if not self._times_holding(rdd):
                    rdd.unpersist(blocking=False)
        for dep in self.dependencies:
            dep.clear_metadata(time)

    def _times_holding(self, rdd: RDD) -> list[int]:
        """The batch times whose RDD is ``rdd`` itself (a node may hand the same RDD to several batches)."""
        return [t for t, r in self.generated.items() if r is rdd]

    def release(self) -> None:
        """Unpersist every RDD the engine persisted for this node (the context stopped).

        The SparkContext may outlive the StreamingContext (``stop(stopSparkContext=False)``): without
        this, the cached state, window and input RDDs of a stopped stream would stay in executor memory
        for the rest of the application. The RDDs themselves stay usable (recomputed on demand).
        """
        for t in sorted(self._persisted_by_engine):
            rdd = self.generated.get(t)
            if rdd is not None:
                rdd.unpersist(blocking=False)
        self._persisted_by_engine.clear()
        for rdds in self._retired.values():
            for rdd in rdds:
                rdd.unpersist(blocking=False)
        self._retired.clear()

    def persist(self, level: StorageLevel) -> None:
        self.storage_level = level

    def adopt_checkpoint(self, time: BatchTime, reader: RDD) -> int:
        """Use ``reader`` (an RDD reading a committed checkpoint) as this node's RDD at ``time``.

        RDDs generated afterwards build on it, which cuts their lineage. When the generator has
        already built later batches on the old lineage (a backlog), those RDDs of this node are
        rebuilt on top of ``reader`` too (RDD construction only: no Spark job), or every later
        batch would keep chaining from them and the lineage would never be cut; the rebuild stops
        at an RDD that already reads a newer checkpoint. Jobs already queued keep the RDDs they were
        built with (same data). Replaced RDDs stay cached until they leave the remember window.

        Returns the newest batch time of this node built before the adoption: jobs up to that
        batch may still reach back to the checkpoints older than ``time`` (see the checkpointer's
        deletion rule).
        """
        with self.graph.lock:
            built_through = max(self.generated, default=time.ms)
            old = self.generated.get(time.ms)
            if old is None:
                return built_through  # already forgotten: a newer checkpoint will cut the lineage
            self._retire(time.ms, old)
            self.restore_from_checkpoint(time, reader)
            if not self.must_checkpoint:
                return built_through
            slide = self.slide_duration
            t = time + slide
            while t.ms in self.generated and t.ms not in self._reader_times:
                fresh = self.compute(t)
                if fresh is None:
                    break
                self._retire(t.ms, self.generated[t.ms])
                self._install(t, fresh)
                t = t + slide
            return built_through

    def forget(self, time: BatchTime) -> None:
        """Drop the memoised RDD at ``time``; the next ``get_or_compute(time)`` builds it again.

        Used when a queued batch is rebuilt on a newly adopted checkpoint. An RDD that reads a
        checkpoint is kept. What the engine cached of the dropped RDD is released when ``time``
        leaves the remember window, as for a replaced RDD.
        """
        with self.graph.lock:
            if time.ms in self._reader_times:
                return
            rdd = self.generated.pop(time.ms, None)
            if rdd is not None:
                self._retire(time.ms, rdd)
                self._persisted_by_engine.discard(time.ms)

    def _retire(self, t: int, rdd: RDD) -> None:
        if t in self._persisted_by_engine:
            self._retired.setdefault(t, []).append(rdd)

    def checkpoint_export(self, time_ms: int, rdd: RDD) -> tuple[RDD, dict[str, Any]]:
        """What the checkpoint of ``rdd`` (this node's RDD at ``time_ms``) writes, and entries to add to its
        manifest. Default: the RDD's records, nothing added (a store-backed state writes its changes)."""
        return rdd, {}

    def reads_checkpoint_to_verify(self, manifest: dict[str, Any]) -> bool:
        """Whether a restarted driver reads this node's checkpoint (whose manifest is ``manifest``) whole to verify
        it before resuming from it, so that a corrupt one is skipped for the one before. Default:
        :attr:`checkpoint_read_to_verify`."""
        return self.checkpoint_read_to_verify

    def checkpoint_manifest(self, time_ms: int, manifest: dict[str, Any]) -> None:
        """A restarted driver is about to install this node's checkpoint at ``time_ms``
        (:meth:`restore_from_checkpoint`); ``manifest`` is that checkpoint's manifest, with the entries
        :meth:`checkpoint_export` added. Default: nothing to do."""

    def checkpoint_restored(self, time_ms: int, chain: list[int]) -> None:
        """A restarted driver resumes this node from its checkpoint at ``time_ms``, which builds on the checkpoints
        ``chain`` (oldest first; empty unless the node writes deltas). Default: nothing to do."""

    def restore_from_checkpoint(self, time: BatchTime, reader: RDD) -> None:
        """Set this node's RDD at ``time`` to ``reader``, which reads a committed checkpoint.

        Used when a driver recovers and when a checkpoint is adopted; later batches build on it.
        """
        with self.graph.lock:
            self._install(time, reader)
            self._reader_times.add(time.ms)

    def _install(self, time: BatchTime, rdd: RDD) -> None:
        if self.storage_level is not None and not rdd.is_cached:
            jvm.persist(rdd, self.storage_level)
        self.generated[time.ms] = rdd
        self._persisted_by_engine.add(time.ms)
        self._reader_times.discard(time.ms)


class OneParentNode(DStreamNode):
    """A node computed from one parent stream: the properties every such node shares.

    Contract: :attr:`parent` is the stream the node reads; :attr:`dependencies` is ``[parent]``; the slide is
    the parent's (a window overrides :attr:`slide_duration` with its own); the name is ``<label>#<id>`` when
    ``label`` is set (a class attribute, or an instance attribute set by ``__init__``), else the base class's
    ``<ClassName>#<id>``.
    """

    #: The operator's name in :attr:`name` (None: the class's name).
    label: str | None = None

    def __init__(self, graph: DStreamGraph, parent: DStreamNode) -> None:
        super().__init__(graph)
        self.parent = parent

    @property
    def name(self) -> str:
        return f"{self.label}#{self.id}" if self.label else super().name

    @property
    def slide_duration(self) -> Duration:
        return self.parent.slide_duration

    @property
    def dependencies(self) -> list[DStreamNode]:
        return [self.parent]
