"""State picked by size (``spark.dstreams.state.store=auto``, the default): ``runningReduce``,
``updateStateByKey(..., updateIdleKeys=False)``, ``track`` (every form), the incremental ``reduceByKeyAndWindow``,
the event-time windows and ``sessionWindow`` start on the RDD state and move into the executor state store once the
state is large next to what a batch touches (for a window: the keys of the batches entering and leaving it).

Why: the RDD state (:mod:`.state`) rebuilds every key each batch and is the faster one for small state; the executor
state store (:mod:`.store_state`) costs a SQLite look-up and write per key a batch touches and nothing per idle key.
The two cost the same when the state holds about ten times the keys a batch touches (``benchmarks/README.md``,
"Picked by size", has the measurements), hence :data:`TOUCH_RATIO`.

Contract: :class:`AutoPolicy` is a :class:`~.state.StateBackend` made of the two backends of the same node (an
:class:`~.state.RDDState` and an :class:`~.store_state.ExecutorStore`, running the operator's one step) and of the
rule that moves the state from the first to the second once, at a new batch (:attr:`AutoPolicy.switched_at`): once
every partition has reported (:meth:`AutoPolicy._report`) and the state holds at least
``spark.dstreams.state.autoKeys`` keys and :data:`TOUCH_RATIO` times the keys a batch typically touches
(:func:`should_move`). Batches before ``switched_at`` are RDD states, batches at or after it store handles, in every
rebuild (a lineage cut, a retry, a restart's replay). Both hold the same state, so the outputs are the same whenever
the move happens and the move is not recorded in the metadata log; checkpoints carry it
(:class:`AutoCheckpointData`: every one in the store's format, its manifest saying when the stream moved), and a
restarted driver resumes in the representation its checkpoint was written in (one resumed before the move decides
again).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark import RDD
from pyspark.accumulators import Accumulator

from ..checkpoint_data import CheckpointData
from ..statestore import PAIRS_SNAPSHOT, PART_HEADER
from ..time import BatchTime
from .state import RDDState, StateBackend
from .store_state import ExecutorStore, StoreCheckpointData, _LatestPerPartition

if TYPE_CHECKING:
    from .state import StateNode

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


class AutoPolicy(StateBackend):
    """The state backend picked by size (module docstring): ``node``'s operator on :attr:`rdd` until the stream
    moves, then on :attr:`store`; each call goes to the backend of the batch it is about."""

    prefix: str = "Auto"
    params: tuple[str, ...] = ("store=auto",)

    def __init__(self, node: StateNode, local_dir: str | None, snapshot_every: int, auto_keys: int) -> None:
        self.node = node
        #: The RDD state (which checkpoints the initial state at the zero time: a restart before the next checkpoint
        #: reads it back) and the store (holding no version before the move).
        self.rdd = RDDState(node, checkpoints_initial=True)
        self.store = ExecutorStore(node, local_dir, snapshot_every)
        self.auto_keys = max(1, int(auto_keys))
        self.__dict__.update(self._runtime())

    #: The batch time from which the stream is on the store (None: still on the RDD state).
    switched_at: int | None
    #: Per partition: (batch time, keys of the state, keys the batch touched), the newest batch's.
    _rdd_stats: Accumulator | None
    #: The keys touched by the newest batches (at most WINDOW), and the batch last sampled.
    _touched: list[int]
    _sampled: int

    def _runtime(self) -> dict[str, Any]:
        """A stored graph has not moved: a restart learns the move from its checkpoint
        (:meth:`AutoCheckpointData.manifest`)."""
        return {"switched_at": None, "_rdd_stats": None, "_touched": [], "_sampled": -1}

    def on_store(self, time_ms: int) -> bool:
        return self.switched_at is not None and time_ms >= self.switched_at

    def metrics(self) -> dict[str, Any] | None:
        return self.store.metrics() if self.switched_at is not None else None

    def checkpoint_data(self) -> AutoCheckpointData:
        return AutoCheckpointData(self)

    # ------------------------------------------------------------------ the move
    def _ready_to_move(self) -> bool:
        stats = dict(self._rdd_stats.value) if self._rdd_stats is not None else {}
        if len(stats) < self.node.partitioner.numPartitions:
            return False
        newest = min(s[0] for s in stats.values())
        if newest != self._sampled:
            self._sampled = newest
            self._touched = [*self._touched, sum(s[2] for s in stats.values())][-WINDOW:]
        return should_move(sum(s[1] for s in stats.values()), self._touched, self.auto_keys)

    def compute(self, time: BatchTime) -> RDD | None:
        node = self.node
        if self.switched_at is None and time.ms > max(node.generated, default=-1) and self._ready_to_move():
            # Only a new batch moves the stream: a rebuild of earlier ones (a lineage cut) keeps their kind.
            self.switched_at = time.ms
            log.info("%s moves into the executor state store at batch %d (state of at least %d keys, batches "
                     "touching %d)", node.name, time.ms, self.auto_keys, typical_touched(self._touched))
        if not self.on_store(time.ms):
            return self.rdd.compute(time, self._report(time))
        return self.store.compute(time, self._move(time) if time.ms == self.switched_at else None)

    def _move(self, time: BatchTime) -> RDD:
        """The handle batch ``time`` (the move) applies to: every partition's store loaded with the RDD state of the
        batch before."""
        before = time - self.node.slide_duration
        state, convert = self.rdd.previous(time), self.node.op.to_store(self.node, before.ms)
        if state is not None and convert is not None:
            state = state.mapValues(convert)  # keeps the partitioning
        return self.store.loaded_handle(before.ms, state)

    def _report(self, time: BatchTime) -> Callable[[int, list[list[Any]], list[Any]], None]:
        """Each partition of the RDD state at ``time`` reports the keys of its state and the keys the batch touched
        as the store would touch them (the operator's ``touched``)."""
        if self._rdd_stats is None:
            self._rdd_stats = self.node.graph.sc.accumulator({}, _LatestPerPartition())
        stats, t, count = self._rdd_stats, time.ms, self.node.op.touched

        def report(i: int, segments: list[list[Any]], out: list[Any]) -> None:
            keys = {kv[0] for segment in segments[1:] for kv in segment}
            stats.add({i: (t, len(out), count(segments[0], out, keys))})

        return report

    def retry(self, time: BatchTime, error: BaseException) -> None:
        self.store.retry(time, error)  # the move's handle is the store's

    def release(self) -> None:
        self.store.release()  # its own handles: the zero time's, the move's

    # ------------------------------------------------------------------ views
    def _backend_at(self, time: BatchTime) -> RDDState | ExecutorStore:
        """The backend batch ``time`` is on, once it is built (building it may be what moves the stream)."""
        self.node.get_or_compute(time)
        return self.store if self.on_store(time.ms) else self.rdd

    def view(self, time: BatchTime) -> RDD | None:
        return self._backend_at(time).view(time)

    def changes(self, time: BatchTime) -> RDD | None:
        return self._backend_at(time).changes(time)


class AutoCheckpointData(CheckpointData):
    """The checkpoint data of a state picked by size (module docstring): every checkpoint in the store's format,
    its manifest saying when the stream moved (``state.auto.switched_at``); after the move, the store's
    (:class:`~.store_state.StoreCheckpointData`, to which the chain's bookkeeping always goes)."""

    def __init__(self, policy: AutoPolicy) -> None:
        super().__init__(policy.node, policy.node.partitioner)
        self.policy, self.stored = policy, StoreCheckpointData(policy.store)

    def export(self, time_ms: int, rdd: RDD) -> tuple[RDD, dict[str, Any]]:
        """Before the move: a snapshot of the RDD state's pairs (a store's chain may build on it); after it, the store's
        delta or snapshot. The manifest says when the stream moved."""
        policy = self.policy
        if policy.on_store(time_ms):
            out, entries = self.stored.export(time_ms, rdd)
            entries["state"]["auto"] = {"switched_at": policy.switched_at}
            return out, entries
        policy.store._exported[time_ms] = []
        convert = policy.node.op.to_store(policy.node, time_ms) or (lambda v: v)

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
        self.stored.manifest(time_ms, manifest)
        policy, moved = self.policy, _moved_at(manifest)
        if moved is not None and (policy.switched_at is None or moved < policy.switched_at):
            policy.switched_at = moved

    def restore(self, time: BatchTime, reader: RDD) -> None:
        """After the move: the store's. Before it: the RDD state read back (its pairs as they were)."""
        policy, node = self.policy, self.node
        if policy.on_store(time.ms):
            self.stored.restore(time, reader)
            return
        convert = policy.node.op.from_store() or (lambda v: v)
        pairs = reader.map(lambda kv: (pickle.loads(kv[0]), convert(pickle.loads(kv[1]))), preservesPartitioning=True)
        node.restore_from_checkpoint(time, pairs)
        policy.store.catchup_starts(time.ms)  # a checkpoint of the batch before the move is where the store starts
        if reader.is_cached:  # read whole to verify it (a restart): released with the RDD it feeds
            node._retired.setdefault(time.ms, []).append(reader)

    def restored(self, time_ms: int, chain: list[int]) -> None:
        self.stored.restored(time_ms, chain)

    def adopt(self, time: BatchTime, reader: RDD) -> int:
        return self.stored.adopt(time, reader)


__all__ = ["TOUCH_RATIO", "WINDOW", "AutoCheckpointData", "AutoPolicy", "should_move", "typical_touched"]
