"""The DStream node contract.

A node is one stream in the graph. A subclass overrides at most these six members of :class:`DStreamNode`
(``tests/unit/test_node_contract.py`` holds every node of the library to it; the base class marks every other
member ``typing.final``, so that mypy rejects an override):

* ``slide_duration`` – the interval between two of its RDDs;
* ``dependencies`` – the nodes it reads from;
* ``compute(time) -> RDD | None`` – build (lazily: no Spark job runs here) the RDD of batch ``time``;
* ``describe_params()`` – the parameters that define the topology and change results (``window=30000``,
  ``partitions=4``...), for the graph fingerprint that a restarted driver must reproduce;
* ``parent_remember_duration`` – how long the dependencies must remember their RDDs for this node (a window adds
  its length);
* ``checkpoint_data`` – the node's checkpoint data (:class:`~dstreams.checkpoint_data.CheckpointData`, as Spark's
  ``DStreamCheckpointData``): what the metadata log records of the node and hands back to it after a restart, and
  how its data checkpoints are written, adopted and read back. The recovery layer and the scheduler reach a node's
  recovery only through it.

The base class owns everything else: ``get_or_compute`` (one RDD per valid batch time, memoised in a dict),
validity (``time > zero`` and ``(time - zero) % slide == 0``), persistence, the remember duration (how long
generated RDDs are kept so that windows and state can read them) and ``clear_metadata``, which forgets and
unpersists what is no longer needed so that a long run keeps driver and executor memory flat; the lineage cut of an
adopted checkpoint (``adopt_checkpoint``) and the installing of a checkpoint's reader (``restore_from_checkpoint``),
which the checkpoint data calls. What a node is, beyond behaviour, is data: ``label`` (its name is ``<label>#<id>``,
else ``<ClassName>#<id>``), ``must_checkpoint`` (its RDDs form a state chain that is checkpointed), the type part of
its key (the ``key_name`` constructor argument, default the class's name).

A few kinds of node do more than the base class at a point of the run; each is an optional protocol that the caller
checks with ``isinstance``, not a member of the base class: a node that keeps per-batch records beside its RDDs
forgets them in ``clear_metadata`` (:class:`KeepsBatchRecords`, here); the scheduler's runner asks an event-time
stream for its metrics and lets a node drop what made a batch's try fail (``dstreams.scheduler.runner``); the graph
has a node that persisted RDDs of its own release them when the context stops (``dstreams.graph``).

Input nodes add the input contract (:class:`dstreams.nodes.input.InputNode`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, final, runtime_checkable

from pyspark import RDD, StorageLevel

from .checkpoint_data import CheckpointData
from .spark import jvm
from .time import BatchTime, Duration

if TYPE_CHECKING:
    from .graph import DStreamGraph

log = logging.getLogger(__name__)

#: Default checkpoint interval target (Spark's rule: the smallest multiple of the slide >= 10 s).
DEFAULT_CHECKPOINT_TARGET = Duration(10_000)


@runtime_checkable
class KeepsBatchRecords(Protocol):
    """A node that keeps records per batch beside its RDDs (an event-time stream's watermarks): ``clear_metadata``
    has it forget those of the batches that left its remember window too."""

    def forget_records(self, time: BatchTime) -> None:
        """Forget the records of the batches older than the remember window at ``time``."""


class DStreamNode:
    """Base of every stream node; see the module docstring for the contract."""

    #: True for nodes whose RDD at ``t`` depends on their own RDD at ``t - slide`` (state chains).
    #: Such nodes get a checkpoint interval by default so that their lineage stays bounded.
    must_checkpoint: bool = False
    #: The operator's name in :attr:`name` (None: the class's name).
    label: str | None = None
    #: Whether :attr:`label` names the node (False: an output, whose label names its jobs).
    named_by_label: ClassVar[bool] = True
    #: Every how long the node's RDD is checkpointed (None: never; set by ``DStream.checkpoint``, defaulted by
    #: :meth:`initialize` for a state chain). The class's default serves a stored node that holds none.
    checkpoint_interval: Duration | None = None

    _ids = 0
    _ids_lock = threading.Lock()

    def __init__(self, graph: DStreamGraph, key_name: str | None = None) -> None:
        """``key_name``: the type part of :attr:`key` (checkpoint keys, the fingerprint, the status page); default:
        the class's name (a node parametrised by an operator names the operator's)."""
        self.graph = graph
        with DStreamNode._ids_lock:
            DStreamNode._ids += 1
            self.id = DStreamNode._ids
        #: Stable across driver restarts that rebuild the same graph: the node's position in it.
        self.key = graph.register(self, key_name or type(self).__name__)
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

    # ----------------------------------------------------------------- the six members a subclass overrides
    @property
    def slide_duration(self) -> Duration:
        raise NotImplementedError

    @property
    def dependencies(self) -> list[DStreamNode]:
        raise NotImplementedError

    def compute(self, time: BatchTime) -> RDD | None:
        raise NotImplementedError

    def describe_params(self) -> list[str]:
        """Topology parameters beyond the slide (``window=30000``, ``partitions=4``...); subclasses add theirs."""
        return []

    @property
    def parent_remember_duration(self) -> Duration:
        """How long the dependencies must remember their RDDs for this node (windows add theirs)."""
        assert self.remember_duration is not None
        return self.remember_duration

    @property
    def checkpoint_data(self) -> CheckpointData:
        """The node's checkpoint data (:mod:`dstreams.checkpoint_data`): the default's records nothing in the
        metadata log and checkpoints the node's RDDs as they are, not hash-partitioned."""
        return CheckpointData(self)

    # ----------------------------------------------------------------- naming
    @property
    @final
    def key_name(self) -> str:
        """The type part of :attr:`key` (the ``key_name`` given to the constructor, or the class's name)."""
        return self.key.split("-", 1)[1]

    @property
    @final
    def name(self) -> str:
        """``<label>#<id>`` when the node has a :attr:`label` that names it, else ``<ClassName>#<id>``."""
        label = self.label if self.named_by_label else None
        return f"{label or type(self).__name__}#{self.id}"

    @final
    def describe(self) -> str:
        """The node's parameters that define the topology and its results, for the graph fingerprint: the slide,
        then :meth:`describe_params`."""
        return " ".join([f"slide={self.slide_duration.ms}", *self.describe_params()])

    def __repr__(self) -> str:
        return f"<{self.name} slide={self.slide_duration}>"

    # ----------------------------------------------------------------- lifecycle
    @final
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

    @final
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

    @final
    def remember(self, duration: Duration | None) -> None:
        if duration is not None and (self.remember_duration is None or duration > self.remember_duration):
            self.remember_duration = duration
        if self.remember_duration is not None:
            for dep in self.dependencies:
                dep.remember(self.parent_remember_duration)

    # ----------------------------------------------------------------- generation
    @final
    def is_time_valid(self, time: BatchTime) -> bool:
        if self.zero_time is None:
            raise RuntimeError(f"{self.name} has not been initialised (the context is not started)")
        if time <= self.zero_time:
            return False
        return (time.ms - self.zero_time.ms) % self.slide_duration.ms == 0

    @final
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

    @final
    def checkpoint_due(self, time: BatchTime) -> bool:
        if self.checkpoint_interval is None or self.zero_time is None:
            return False
        return (time.ms - self.zero_time.ms) % self.checkpoint_interval.ms == 0

    @final
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
    @final
    def clear_metadata(self, time: BatchTime) -> None:
        """Forget (and unpersist what the engine persisted of) RDDs older than the remember window; recurse, then
        forget the node's own per-batch records (:class:`KeepsBatchRecords`)."""
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
        if isinstance(self, KeepsBatchRecords):
            self.forget_records(time)

    @final
    def _times_holding(self, rdd: RDD) -> list[int]:
        """The batch times whose RDD is ``rdd`` itself (a node may hand the same RDD to several batches)."""
        return [t for t, r in self.generated.items() if r is rdd]

    @final
    def release(self) -> None:
        """Unpersist every RDD the engine persisted for this node (the context stopped).

        The SparkContext may outlive the StreamingContext (``stop(stopSparkContext=False)``): without
        this, the cached state, window and input RDDs of a stopped stream would stay in executor memory
        for the rest of the application. The RDDs themselves stay usable (recomputed on demand). A node that
        persisted RDDs of its own releases them too (``dstreams.graph.HoldsOwnRDDs``).
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

    @final
    def persist(self, level: StorageLevel) -> None:
        self.storage_level = level

    # ----------------------------------------------------------------- checkpoints read back (the machinery)
    @final
    def adopt_checkpoint(self, time: BatchTime, reader: RDD) -> int:
        """Use ``reader`` (an RDD reading a committed checkpoint) as this node's RDD at ``time``, installed by the
        checkpoint data (:meth:`CheckpointData.restore <dstreams.checkpoint_data.CheckpointData.restore>`).

        RDDs generated afterwards build on it, which cuts their lineage. When the generator has
        already built later batches on the old lineage (a backlog), those RDDs of this node are
        rebuilt on top of ``reader`` too (RDD construction only: no Spark job), or every later
        batch would keep chaining from them and the lineage would never be cut; the rebuild stops
        at an RDD that already reads a newer checkpoint. Jobs already queued keep the RDDs they were
        built with (same data). Replaced RDDs stay cached until they leave the remember window.

        Returns the newest batch time of this node built before the adoption: jobs up to that
        batch may still reach back to the checkpoints older than ``time`` (see the checkpointer's
        deletion rule). Called by :meth:`CheckpointData.adopt <dstreams.checkpoint_data.CheckpointData.adopt>`.
        """
        with self.graph.lock:
            built_through = max(self.generated, default=time.ms)
            old = self.generated.get(time.ms)
            if old is None:
                return built_through  # already forgotten: a newer checkpoint will cut the lineage
            self._retire(time.ms, old)
            self.checkpoint_data.restore(time, reader)
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

    @final
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

    @final
    def _retire(self, t: int, rdd: RDD) -> None:
        if t in self._persisted_by_engine:
            self._retired.setdefault(t, []).append(rdd)

    @final
    def restore_from_checkpoint(self, time: BatchTime, reader: RDD) -> None:
        """Set this node's RDD at ``time`` to ``reader``, which reads a committed checkpoint (the default of
        :meth:`CheckpointData.restore <dstreams.checkpoint_data.CheckpointData.restore>`; a store-backed state
        installs the RDD that brings its stores to it).

        Used when a driver recovers and when a checkpoint is adopted; later batches build on it.
        """
        with self.graph.lock:
            self._install(time, reader)
            self._reader_times.add(time.ms)

    @final
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

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, key_name: str | None = None) -> None:
        super().__init__(graph, key_name)
        self.parent = parent

    @property
    def slide_duration(self) -> Duration:
        return self.parent.slide_duration

    @property
    def dependencies(self) -> list[DStreamNode]:
        return [self.parent]
