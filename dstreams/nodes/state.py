"""The stateful node: one class, :class:`StateNode`, runs any keyed operator (:class:`~.keyed.KeyedOp`) against a
state backend (:class:`StateBackend`), picked by ``spark.dstreams.state.store`` (``docs/internals/state-backends.md``):
the RDD state (``rdd``, :class:`RDDState`, here), the executor state store (``executor``,
:class:`~.store_state.ExecutorStore`) or the policy that starts on the first and moves the state into the second once
it is large next to what a batch touches (``auto``, :class:`~.auto_state.AutoPolicy`). Here too the operators
``runningReduce`` and ``updateStateByKey``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pyspark import RDD
from pyspark.core.rdd import Partitioner

from ..checkpoint_data import CheckpointData
from ..dead_letters import for_batch
from ..node import DStreamNode, OneParentNode
from ..spark import jvm
from ..spark.partitioned import (
    ensure_partitioned,
    fold,
    merge_ordered,
    pre_combine,
    segmented_merge,
    shuffle_ordered,
)
from ..statestore import StateStoreError
from ..time import BatchTime, Duration
from .keyed import ALL, TOUCHED, KeyedOp, KeyStep, rdd_partition

if TYPE_CHECKING:
    from ..graph import DStreamGraph


class RunningReduce(KeyedOp):
    """``runningReduce(f)``: per key, the reduce of every value seen so far. The batch is reduced on its own first,
    then merged into the state (the association of a per-batch ``reduceByKey`` followed by the state's update)."""

    kind, label = "RunningReduceNode", "runningReduce"

    def __init__(self, func: Callable[[Any, Any], Any]) -> None:
        self.func = func

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        """The batch's combined pairs, not merged (:func:`pre_combine`): :meth:`group` reduces them, so the batch
        needs no Python stage of its own after the shuffle."""
        return pre_combine(batch, self.func, partitioner, "runningReduce")

    def group(self, segments: list[list[Any]]) -> dict[Any, Any]:
        return fold(self.func, segments[0], {}, "runningReduce") if segments else {}

    def step(self, node: DStreamNode, time: BatchTime) -> KeyStep:
        func = self.func
        return lambda k, entry, v: v if entry is None else func(entry, v)

    def apply(self, step: KeyStep, entries: dict[Any, Any], batch: dict[Any, Any], keys: Iterable[Any]) -> None:
        """The step in bulk (:func:`fold`'s fast paths; a state of None is a state here)."""
        fold(self.func, batch.items(), entries, "runningReduce")


class UpdateState(KeyedOp):
    """``updateStateByKey(updateFunc)``: ``updateFunc(newValues, lastState)``, None drops the key; ``newValues`` in
    the batch's input order. With ``update_idle_keys`` (PySpark's rule) it runs for every key of the state each batch
    (``[]`` for a key without values); without, only for the keys with values, the others keeping their state."""

    kind, label = "UpdateStateNode", "updateStateByKey"

    def __init__(self, update: Callable[[list[Any], Any], Any], update_idle_keys: bool) -> None:
        self.update = update
        self.update_idle_keys = update_idle_keys
        self.visits = ALL if update_idle_keys else TOUCHED

    def params(self) -> list[str]:
        return [f"updateIdleKeys={self.update_idle_keys}"]

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        return shuffle_ordered(batch, partitioner, "updateStateByKey")  # grouped by merge_ordered

    def group(self, segments: list[list[Any]]) -> dict[Any, Any]:
        return dict(merge_ordered(segments[0])) if segments else {}

    def step(self, node: DStreamNode, time: BatchTime) -> KeyStep:
        update = for_batch(self.update, time.ms)
        return lambda k, state, values: update(values if values is not None else [], state)


class StateBackend:
    """Where a :class:`StateNode` keeps its state; built from the node (``backend(node)``) and bound to it. Within a
    partition a backend reads the keys a batch touches and the keys that are due and writes the changes
    (:func:`~.keyed.rdd_partition`, :func:`~.keyed.store_partition`); for the stream it gives the members below.
    The defaults are the RDD state's."""

    #: The node the backend is bound to.
    node: StateNode
    #: The node key's prefix (``Store`` + ``RunningReduceNode``) and the backend's parameters in the fingerprint.
    prefix: str = ""
    params: tuple[str, ...] = ()
    #: Whether a stored graph holds the initial state's records (else only that there was one: a checkpoint at
    #: the zero time holds it).
    initial_in_graph: bool = True

    def compute(self, time: BatchTime) -> RDD | None:
        """The node's RDD at ``time``: batch ``time`` applied to the state (the state's pairs, or a store handle)."""
        raise NotImplementedError

    def on_store(self, time_ms: int) -> bool:
        """Whether the node's RDD at ``time_ms`` is a handle of the executor store (else the state's pairs)."""
        return False

    def view(self, time: BatchTime) -> RDD | None:
        """The whole state at ``time`` as (key, value) pairs (default: the node's RDD, the state itself)."""
        return self.node.get_or_compute(time)

    def changes(self, time: BatchTime) -> RDD | None:
        """The (key, value) pairs batch ``time`` changed, (key, None) for a key it removed."""
        raise NotImplementedError

    def checkpoint_data(self) -> CheckpointData:
        """How the state is checkpointed, exported and restored (the node's ``checkpoint_data``; default: its RDD's
        pairs, read back in the state's partitioner)."""
        return CheckpointData(self.node, self.node.partitioner)

    def metrics(self) -> dict[str, Any] | None:
        """The executor store's figures (keys, bytes on disk...), None: none (the RDD state, no report yet)."""
        return None

    def retry(self, time: BatchTime, error: BaseException) -> None:
        """Drop what made a try of batch ``time`` fail before it is tried again (``error``: the try's)."""

    def release(self) -> None:
        """The context stopped: unpersist the RDDs the backend persisted itself."""

    def _runtime(self) -> dict[str, Any]:
        """What the backend keeps for one driver run, as it starts: a stored graph holds none of it, and a graph
        read back is a new run."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, **self._runtime()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**state, **self._runtime()})


def state_diff(sc: Any, current: RDD, previous: RDD | None, partitioner: Partitioner) -> RDD:
    """The (key, state) pairs of ``current`` that ``previous`` (None: no state before) does not hold, and
    (key, None) for its keys ``current`` lacks: two RDD states of one partitioner compared partition by
    partition (no shuffle)."""
    if previous is None:
        return current
    if previous is current:
        return current.filter(lambda _: False)
    missing = object()

    def diff(segments: list[list[Any]]) -> Iterable[Any]:
        before = dict(segments[1])
        out = []
        for k, v in segments[0]:
            if before.pop(k, missing) != v:
                out.append((k, v))
        out.extend((k, None) for k in before)
        return out

    return segmented_merge(sc, [[current], [previous]], partitioner, diff)


class RDDState(StateBackend):
    """The RDD state backend: a chain of hash-partitioned state RDDs, each partition of the one at ``t`` the one at
    ``t - slide`` (or the initial state) merged with batch ``t``'s records, brought into the state's partitioner by the
    operator's ``prepare`` (the only shuffle of a batch: the state itself is never shuffled again), by
    :func:`~.keyed.rdd_partition`. State RDDs are cached and, every checkpoint interval, checkpointed so that the
    lineage stays bounded; the node is the public stream. With ``checkpoints_initial`` (the auto policy's) the initial
    state is checkpointed at the zero time, as the store's."""

    #: Whether this run marked the initial state for its checkpoint at the zero time.
    _initial_marked: bool

    def __init__(self, node: StateNode, checkpoints_initial: bool = False) -> None:
        self.node = node
        self.checkpoints_initial = checkpoints_initial
        self.__dict__.update(self._runtime())

    def _runtime(self) -> dict[str, Any]:
        return {"_initial_marked": False}

    def previous(self, time: BatchTime) -> RDD | None:
        """The RDD state batch ``time`` merges into: the node's before, else the initial state (checkpointed at the
        zero time once, where asked); None: no state yet."""
        node = self.node
        previous = node.previous(time)
        if previous is not None:
            return previous
        initial, checkpointer = node.initial_state(), node.graph.checkpointer
        if initial is not None and self.checkpoints_initial and not self._initial_marked and checkpointer is not None:
            assert node.zero_time is not None
            self._initial_marked = True  # a restart before the next checkpoint reads it back
            checkpointer.mark(node, node.zero_time, initial)
        return initial

    def compute(self, time: BatchTime, report: Callable[[int, list[list[Any]], list[Any]], None] | None = None
                ) -> RDD | None:
        """The state at ``time``; the one before itself when the batch applies nothing (none, or without partitions
        for a :data:`~.keyed.TOUCHED` operator). ``report(partition, segments, out)`` sees each partition's work
        (the auto policy's counts)."""
        node, op, previous = self.node, self.node.op, self.previous(time)
        batches = op.batches(node, time, skip_empty=previous is not None)
        if batches is None or (previous is None and not batches):
            return previous
        step, group = op.step(node, time), op.grouper(node, time)

        def merge(i: int, segments: list[list[Any]]) -> Iterable[Any]:
            out = rdd_partition(op, step, segments[0], segments[1:], group)
            if report is not None:
                report(i, segments, out)
            return out

        groups = [[previous] if previous is not None else [], *([b] for b in batches)]
        return segmented_merge(node.graph.sc, groups, node.partitioner, merge, with_index=True)

    def changes(self, time: BatchTime) -> RDD | None:
        """The operator's reading of its changes (:meth:`~.keyed.KeyedOp.rdd_changes`), else the state compared with
        the one before, partition by partition (the whole state)."""
        node = self.node
        current = node.get_or_compute(time)
        if current is None:
            return None
        changed = node.op.rdd_changes(current, time)
        return changed if changed is not None else state_diff(node.graph.sc, current, self.previous(time),
                                                              node.partitioner)


class StateNode(OneParentNode):
    """The state of the keyed operator ``op`` over ``parent`` in ``partitioner``, from ``initial`` (None: empty),
    on the backend ``backend`` builds from the node (module docstring; default the RDD state). The node's key names
    the backend and the operator (``StoreRunningReduceNode``); its fingerprint has the operator's parameters, the
    partitions and the backend's; its slide and what its parent remembers are the operator's (a window's)."""

    must_checkpoint = True

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, op: KeyedOp, partitioner: Partitioner,
                 initial: RDD | None = None, backend: Callable[[StateNode], StateBackend] = RDDState) -> None:
        self.op, self.partitioner, self.label = op, partitioner, op.label
        self.initial = ensure_partitioned(initial, partitioner) if initial is not None else None
        #: Whether the stream was defined with an initial state, and its records once a stored graph holds them.
        self._had_initial = initial is not None
        self._initial_records: list[Any] | None = None
        #: How the state's RDDs (or the store's handles) are cached (:func:`~dstreams.spark.jvm.state_level`).
        self.level = jvm.state_level(str(graph.sc.master), graph.sc.getConf())
        self.backend = backend(self)
        super().__init__(graph, parent, key_name=f"{self.backend.prefix}{op.kind}")
        self.persist(self.level)

    def __getstate__(self) -> dict[str, Any]:
        """The initial state RDD is stored as its records (collected once, when the graph is stored) where the
        backend says so (:attr:`StateBackend.initial_in_graph`), else only that there was one."""
        state = super().__getstate__()
        if self.initial is not None:
            records = self.initial.collect() if self.backend.initial_in_graph else None
            state.update(initial=None, _had_initial=True, _initial_records=records)
        return state

    def describe_params(self) -> list[str]:
        return [*self.op.params(), f"partitions={self.partitioner.numPartitions}", *self.backend.params]

    @property
    def checkpoint_data(self) -> CheckpointData:
        return self.backend.checkpoint_data()

    @property
    def slide_duration(self) -> Duration:
        slide = self.op.state_slide
        return slide if slide is not None else self.parent.slide_duration

    @property
    def parent_remember_duration(self) -> Duration:
        remember, window = super().parent_remember_duration, self.op.parent_window
        return remember + window if window is not None else remember

    def compute(self, time: BatchTime) -> RDD | None:
        return self.backend.compute(time)

    def initial_state(self) -> RDD | None:
        """The state before the first batch (None: none), rebuilt from a stored graph's records. Raises
        :class:`~dstreams.statestore.StateStoreError` for a stream defined with one that neither the stored graph
        nor a checkpoint holds."""
        if self.initial is None and self._initial_records is not None:
            self.initial = ensure_partitioned(self.graph.sc.parallelize(self._initial_records), self.partitioner)
            self._initial_records = None
        if self.initial is None and self._had_initial:
            raise StateStoreError(
                f"{self.name}: the driver stopped before the initial state (updateStateByKey's initialRDD) was "
                "checkpointed (right after the first batch), and a restored graph does not hold it: start the "
                "application on a new checkpoint location, or delete this one, so that setupFunc defines it again")
        return self.initial

    def previous(self, time: BatchTime) -> RDD | None:
        """The node's RDD batch ``time`` builds on: the one of the batch before, or the zero time's checkpoint read
        back by a restart (None: neither; the backend starts from the initial state)."""
        before = time - self.slide_duration
        previous = self.get_or_compute(before)
        if previous is None and before == self.zero_time:
            previous = self.generated.get(before.ms)
        return previous

    def on_store(self, time_ms: int) -> bool:
        return self.backend.on_store(time_ms)

    def store_metrics(self) -> dict[str, Any] | None:
        """The executor store's figures (:meth:`StateBackend.metrics`)."""
        return self.backend.metrics()

    def before_batch_retry(self, time: BatchTime, error: BaseException) -> None:
        """The scheduler's ``RetryAware``: the backend drops what made the try fail."""
        self.backend.retry(time, error)

    def release_own_rdds(self) -> None:
        """The graph's ``HoldsOwnRDDs``: the backend's own RDDs (a store's handle at the zero time)."""
        self.backend.release()


__all__ = ["RDDState", "RunningReduce", "StateBackend", "StateNode", "UpdateState", "state_diff"]
