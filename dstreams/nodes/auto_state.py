"""State picked by size (``spark.dstreams.state.store=auto``, the default): ``runningReduce``,
``updateStateByKey(..., updateIdleKeys=False)``, ``track`` (every form), the incremental
``reduceByKeyAndWindow``, the event-time windows and ``sessionWindow`` start on the RDD state and move into the
executor state store once the state is large next to what a batch touches (for a window: the keys of the batches
entering and leaving it).

Why: the RDD state (:mod:`.state`) rebuilds every key each batch and is the faster one for small state; the
executor state store (:mod:`.store_state`) costs a SQLite look-up and write per key a batch touches and nothing per
idle key. The two cost the same when the state holds about ten times the keys a batch touches
(``benchmarks/README.md``, "Picked by size", has the measurements), hence :data:`TOUCH_RATIO`.

Contract:

* One node for every operator (the operator's step is :class:`~.keyed.KeyedOp`'s, the same on both sides). A
  stream starts on the RDD state: its RDD at ``t`` is the state itself (:func:`~.state.rdd_state`), and each
  partition also reports (an accumulator) the keys of its state and the keys the batch touched as the store would
  touch them (:meth:`~.keyed.KeyedOp.touched`: the keys with values; for ``track`` also the keys that timed out,
  ended or fired a timer).
* When the driver builds a new batch, it reads the newest reports: once every partition has reported and the
  state holds at least ``spark.dstreams.state.autoKeys`` keys and :data:`TOUCH_RATIO` times the most keys one of
  the last :data:`WINDOW` batches touched, the largest of them left out (:func:`should_move`,
  :func:`typical_touched`), the stream moves to the store at that batch
  (:attr:`AutoStateNode.switched_at`) and stays there. That batch loads the RDD state of the batch before into
  each partition's store (as an initial state is loaded: :meth:`PartitionStore.ensure_base`) and applies itself;
  from there on the node is the store's (:class:`~.store_state.StoreStateNode`). Batches before ``switched_at``
  are RDD states, batches at or after it store handles, in every rebuild (a lineage cut, a retry, a restart's
  replay).
* Both hold the same state, so the outputs are the same whenever the move happens: the move is not recorded in
  the metadata log. Where the two layouts of an operator differ (plain ``track``, event windows), the operator's
  ``to_store``/``from_store`` convert. Checkpoints carry the move: every checkpoint is written in the store's
  format (one before the
  move is a snapshot of the RDD state's pairs as they are, :data:`~dstreams.statestore.PAIRS_SNAPSHOT`, which the
  store's chain reader takes as a base), its manifest's ``state.auto.switched_at`` says when the stream moved
  (None: not yet), and a restarted driver resumes in the representation its checkpoint was written in
  (:meth:`AutoCheckpointData.manifest`); one resumed before the move decides again.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.accumulators import Accumulator
from pyspark.core.rdd import Partitioner

from ..errors import failed_with
from ..node import DStreamNode
from ..spark.partitioned import ensure_partitioned
from ..statestore import PAIRS_SNAPSHOT, PART_HEADER, StateStoreError
from ..time import BatchTime
from .keyed import KeyedOp
from .state import rdd_state
from .store_state import StoreCheckpointData, StoreStateNode, _LatestPerPartition, state_diff

if TYPE_CHECKING:
    from ..graph import DStreamGraph

log = logging.getLogger(__name__)

#: The state must hold this many times the keys a batch touches before the store is worth it (measured: see
#: ``benchmarks/README.md``, "Picked by size").
TOUCH_RATIO = 10
#: How many of the newest batches' touched keys the rule looks at (a quiet batch alone does not move a stream).
WINDOW = 10


def typical_touched(touched: Sequence[int]) -> int:
    """The keys the newest batches touch, as the rule counts them: the most one of them touched, leaving out the
    single largest once two batches reported (one bulk batch, a first load or a catch-up, does not hold a stream
    back for :data:`WINDOW` batches; bursts that come twice in that many batches do)."""
    ordered = sorted(touched, reverse=True)
    return ordered[1] if len(ordered) > 1 else (ordered[0] if ordered else 0)


def should_move(keys: int, touched: Sequence[int], min_keys: int) -> bool:
    """Whether a state of ``keys`` keys, whose newest batches touched ``touched`` keys each, belongs in the store."""
    return keys >= min_keys and keys >= TOUCH_RATIO * typical_touched(touched)


def _moved_at(manifest: dict[str, Any]) -> int | None:
    """The batch a checkpoint's stream moved into the store at (None: it had not)."""
    moved = manifest.get("state", {}).get("auto", {}).get("switched_at")
    return None if moved is None else int(moved)


class AutoStateNode(StoreStateNode):
    """A state stream picked by size (module docstring): ``op``'s step on the RDD state (:func:`~.state.rdd_state`)
    until the stream moves, then on the store."""

    prefix, backend_params = "Auto", ("store=auto",)
    auto_keys: int
    #: The batch time from which the stream is on the store (None: still on the RDD state).
    switched_at: int | None

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, op: KeyedOp, partitioner: Partitioner,
                 initial: RDD | None, local_dir: str | None, snapshot_every: int, auto_keys: int) -> None:
        super().__init__(graph, parent, op, partitioner, initial, local_dir, snapshot_every)
        self.auto_keys = max(1, int(auto_keys))
        self.switched_at = None
        #: Per partition: (batch time, keys of the state, keys the batch touched), newest batch's.
        self._rdd_stats: Accumulator | None = None
        #: The keys touched by the newest batches (at most WINDOW), and the batch last sampled.
        self._touched: list[int] = []
        self._sampled = -1
        #: The newest handle that loaded the RDD state into the stores (the move), once built.
        self._moved_handle: RDD | None = None
        #: Whether the initial state's zero-time checkpoint was marked (RDD state).
        self._initial_marked = False


    def __getstate__(self) -> dict[str, Any]:
        """As the RDD state's, a stored graph holds the initial state's records (collected once, when the graph is
        stored): a driver that dies before the zero time's checkpoint commits is restarted with it (the store's
        own node relies on that checkpoint alone)."""
        state = super().__getstate__()
        state.update(switched_at=None, _rdd_stats=None, _touched=[], _sampled=-1, _moved_handle=None,
                     _initial_marked=False)
        if self.initial is not None:
            state["_initial_records"] = self.initial.collect()
        return state

    def catchup_valid(self, start_ms: int) -> bool:
        """Only the batch before the move and later are in the store's versions and the changelog."""
        return self.switched_at is not None and start_ms >= self.switched_at - self.slide_duration.ms

    def on_store(self, time_ms: int) -> bool:
        """Whether the stream's RDD at ``time_ms`` is a store handle (else an RDD state)."""
        return self.switched_at is not None and time_ms >= self.switched_at

    def store_metrics(self) -> dict[str, Any] | None:
        return super().store_metrics() if self.switched_at is not None else None

    # ------------------------------------------------------------------ the move
    def _ready_to_move(self) -> bool:
        stats = dict(self._rdd_stats.value) if self._rdd_stats is not None else {}
        if len(stats) < self.partitioner.numPartitions:
            return False
        newest = min(s[0] for s in stats.values())
        if newest != self._sampled:
            self._sampled = newest
            self._touched = [*self._touched, sum(s[2] for s in stats.values())][-WINDOW:]
        return should_move(sum(s[1] for s in stats.values()), self._touched, self.auto_keys)

    def compute(self, time: BatchTime) -> RDD | None:
        if self.switched_at is None and time.ms > max(self.generated, default=-1) and self._ready_to_move():
            # Only a new batch moves the stream: a rebuild of earlier ones (a lineage cut) keeps their kind.
            self.switched_at = time.ms
            log.info("%s moves into the executor state store at batch %d (state of at least %d keys, batches "
                     "touching %d)", self.name, time.ms, self.auto_keys, typical_touched(self._touched))
        if self.on_store(time.ms):
            return super().compute(time)
        return self._rdd_compute(time)

    def previous_handle(self, time: BatchTime) -> RDD:
        if time.ms == self.switched_at:
            return self._move(time - self.slide_duration)
        return super().previous_handle(time)

    def _move(self, before: BatchTime) -> RDD:
        """The handle at ``before`` (the batch before the move): every partition's store loaded with the RDD state
        of ``before``."""
        state, convert = self._rdd_previous(before + self.slide_duration), self.op.to_store(self, before.ms)
        if state is not None and convert is not None:
            state = state.mapValues(convert)  # keeps the partitioning
        handle = self._loaded_handle(before.ms, state)
        self._moved_handle = handle
        return handle

    def before_batch_retry(self, time: BatchTime, error: BaseException) -> None:
        super().before_batch_retry(time, error)
        moved = self._moved_handle
        if moved is not None and self.on_store(time.ms) and failed_with(error, StateStoreError):
            moved.unpersist(blocking=True)
            moved.persist(StorageLevel.MEMORY_ONLY)

    # ------------------------------------------------------------------ the RDD state
    def _rdd_initial(self) -> RDD | None:
        """The state before the first batch: the initial RDD (its zero-time checkpoint marked once), or None."""
        records = getattr(self, "_initial_records", None)
        if self.initial is None and records is not None:  # a restored graph
            self.initial = ensure_partitioned(self.graph.sc.parallelize(records), self.partitioner)
            self._initial_records = None
        if self.initial is None:
            self._check_initial()
            return None
        checkpointer = self.graph.checkpointer
        if checkpointer is not None and not self._initial_marked and self.zero_time is not None:
            self._initial_marked = True  # the stored graph does not hold the initial state: its checkpoint does
            checkpointer.mark(self, self.zero_time, self.initial)
        return self.initial

    def _rdd_previous(self, time: BatchTime) -> RDD | None:
        """The RDD state batch ``time`` merges into (None: no state yet)."""
        before = time - self.slide_duration
        previous = self.get_or_compute(before)
        if previous is None and self.zero_time is not None and before == self.zero_time:
            previous = self.generated.get(before.ms)  # the zero time's checkpoint, read back by a restart
        return previous if previous is not None else self._rdd_initial()

    def _rdd_compute(self, time: BatchTime) -> RDD | None:
        """The RDD state at ``time``, each partition reporting the keys of its state and the keys the batch touched as
        the store would touch them (the operator's ``touched``)."""
        if self._rdd_stats is None:
            self._rdd_stats = self.graph.sc.accumulator({}, _LatestPerPartition())
        stats, t, count = self._rdd_stats, time.ms, self.op.touched

        def report(i: int, segments: list[list[Any]], out: list[Any]) -> None:
            keys = {kv[0] for segment in segments[1:] for kv in segment}
            stats.add({i: (t, len(out), count(segments[0], out, keys))})

        return rdd_state(self, time, self._rdd_previous(time), report)

    # ------------------------------------------------------------------ views
    def view(self, time: BatchTime) -> RDD | None:
        current = self.get_or_compute(time)  # first: building batch ``time`` may be what moves the stream
        if current is None or not self.on_store(time.ms):
            return current
        return super().view(time)

    def changes(self, time: BatchTime) -> RDD | None:
        current = self.get_or_compute(time)
        if current is None:
            return None
        if self.on_store(time.ms):
            return super().changes(time)
        changed = self.op.rdd_changes(current, time)
        if changed is not None:
            return changed
        return state_diff(self.graph.sc, current, self._rdd_previous(time), self.partitioner)

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_data(self) -> AutoCheckpointData:
        """The state's checkpoint data: the RDD state's pairs before the move, the store's after it."""
        return AutoCheckpointData(self)

    def release_own_rdds(self) -> None:
        super().release_own_rdds()  # the zero time's handle
        if self._moved_handle is not None:
            self._moved_handle.unpersist(blocking=False)


class AutoCheckpointData(StoreCheckpointData):
    """The checkpoint data of a state picked by size (module docstring): every checkpoint in the store's format,
    its manifest saying when the stream moved (``state.auto.switched_at``)."""

    node: AutoStateNode

    def export(self, time_ms: int, rdd: RDD) -> tuple[RDD, dict[str, Any]]:
        """Before the move: a snapshot of the RDD state's pairs (a store's chain may build on it); after it, the store's
        delta or snapshot. The manifest says when the stream moved."""
        node = self.node
        if node.on_store(time_ms):
            out, entries = super().export(time_ms, rdd)
            entries["state"]["auto"] = {"switched_at": node.switched_at}
            return out, entries
        node._exported[time_ms] = []
        convert = node.op.to_store(node, time_ms) or (lambda v: v)

        def export(it: Iterable[Any]) -> Iterable[Any]:
            yield (PART_HEADER, PAIRS_SNAPSHOT)  # the pairs as they are: as compact as the RDD state's checkpoint
            for k, v in it:
                yield k, convert(v)

        return rdd.mapPartitions(export, preservesPartitioning=True), {"state": {"chain": [],
                                                                                "auto": {"switched_at": None}}}

    def reads_to_verify(self, manifest: dict[str, Any]) -> bool:
        """A checkpoint of the RDD state (small: the stream had not moved) is read whole to verify it, as the RDD
        state's are; one of the store is checked as the store's are (its parts exist)."""
        return _moved_at(manifest) is None

    def manifest(self, time_ms: int, manifest: dict[str, Any]) -> None:
        """A restart resumes on the store from the batch its checkpoint says the stream moved at."""
        super().manifest(time_ms, manifest)
        node = self.node
        moved = _moved_at(manifest)
        if moved is not None and (node.switched_at is None or moved < node.switched_at):
            node.switched_at = moved

    def restore(self, time: BatchTime, reader: RDD) -> None:
        """After the move: the store's. Before it: the RDD state read back (its pairs as they were)."""
        node = self.node
        if node.on_store(time.ms):
            super().restore(time, reader)
            return
        convert = node.op.from_store() or (lambda v: v)
        pairs = reader.map(lambda kv: (pickle.loads(kv[0]), convert(pickle.loads(kv[1]))), preservesPartitioning=True)
        node.restore_from_checkpoint(time, pairs)
        node._catchup_starts(time.ms)  # a checkpoint of the batch before the move is where the store starts
        if reader.is_cached:  # read whole to verify it (a restart): released with the RDD it feeds
            node._retired.setdefault(time.ms, []).append(reader)


__all__ = ["TOUCH_RATIO", "WINDOW", "AutoCheckpointData", "AutoStateNode", "should_move", "typical_touched"]
