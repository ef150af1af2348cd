"""The executor store backend: a keyed operator's state in the executor state store (:mod:`dstreams.statestore`).

Chosen with ``spark.dstreams.state.store=executor`` (and by ``auto`` once a state moves) for every keyed operator
(:class:`~.keyed.KeyedOp`): the operator's step runs on the keys a batch touches and the due ones
(:func:`~.keyed.store_partition`, the deadlines in the store's index). Two nodes:

* :class:`StoreStateNode` (internal) owns the chain of **handle** RDDs. Partition ``p`` of the handle at
  ``t`` applies batch ``t``'s records of partition ``p`` to the partition's store (reading and writing only the
  keys the batch touches) and yields one record, the store version it stands for. The handle at ``t`` depends
  narrowly on the handle before it and on the batch, shuffled once into the state's partitioner, so that
  Spark's lineage replays missing batches in order after a lost executor, as with RDD state. Handles are
  cached (a few bytes each). A handle whose store already holds its version, in the same driver run and history
  (the batches dropped at or before it: :mod:`dstreams.state_lineage`), applies nothing (a recomputed or retried
  task, a speculative copy). A batch with no records keeps the previous handle.
* :class:`StateViewNode` (the public stream) reads the whole state as of each handle's version, lazily:
  an output that reads every key costs the whole state, one that reads nothing costs nothing.

Checkpoints go through the engine's checkpointer (same manifest commit, fencing and outage rule): the
checkpoint of ``t`` writes, per partition, the keys changed since the previous committed checkpoint (a
**delta**, with deletions) or, every ``spark.dstreams.state.snapshotEvery`` checkpoints and where the store's
log no longer reaches the previous checkpoint, the whole partition (a **snapshot**: the store's file copied as of the
checkpoint's version, :meth:`PartitionStore.export_file`); a restarted driver goes on
with the chain it resumed from (:meth:`StoreCheckpointData.restored`). Its
manifest names the chain of checkpoints it builds on; the reader rebuilds a partition from its newest
snapshot and the deltas after it, and the checkpointer deletes no checkpoint a kept one builds on. A
checkpoint read back (a restart, or the lineage cut of a running stream) brings each partition's store to
that version: kept when this driver run's store is already there or past it, rolled back through the
store's log when an earlier run's store is past it, else reloaded from the checkpoint.

With the changelog (``spark.dstreams.state.changelog``) a task whose store is missing or behind on its host catches up
inside the task (:func:`catch_up`) from the newest checkpoint adopted or read back, or, before any, from the state
loaded at the zero time (empty, or the ``initialRDD``, which the loading tasks write to the changelog: see
:meth:`StoreStateNode._loaded_handle`). Copies a host keeps of partitions that moved elsewhere are deleted once below
the stream's cleanup horizon (:meth:`StoreStateNode.cleanup_horizon`) by the stream's next task on that host
(:func:`~dstreams.statestore.sweep_stale_once`).
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import pickle
import sqlite3
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.core.rdd import Partitioner

from .. import config
from ..checkpoint_data import CheckpointData
from ..errors import failed_with
from ..faults import task_reached
from ..node import DStreamNode, OneParentNode
from ..spark.partitioned import (
    ensure_partitioned,
    partition_aligned_rdd,
    segmented_merge,
)
from ..state_lineage import EMPTY, Lineage
from ..statestore import (
    FILE_SNAPSHOT,
    PART_HEADER,
    Indexer,
    PartitionStore,
    StateStoreError,
    key_bytes,
    remove_store_files,
    sweep_stale_once,
    value_bytes,
)
from ..time import BatchTime
from .event_time import watermark_at
from .keyed import DUE, KeyedNode, KeyedOp, StoreChanges, store_partition

if TYPE_CHECKING:
    from ..contracts import StateChangelog
    from ..graph import DStreamGraph

log = logging.getLogger(__name__)

#: Per partition: (version, keys, bytes on disk) as the newest task that touched its store reported them.
PartitionStats = dict[int, tuple[int, int, int]]
#: How a task brings a store that is not where its batch builds on up to date from the changelog: (the checkpoint
#: time it starts from, whether that start is the empty state at that time instead, the versions this run wrote to
#: the changelog from it on, oldest first: with an empty start, the start itself when a state was loaded there).
CatchUp = tuple[int, bool, tuple[int, ...]]


class _LatestPerPartition(AccumulatorParam):
    """Merges the stores' reports: per partition, the one of the newest version (a retried or recomputed task
    reports the same or an older one, so counting twice is impossible)."""

    def zero(self, value: PartitionStats) -> PartitionStats:
        return {}

    def addInPlace(self, a: PartitionStats, b: PartitionStats) -> PartitionStats:  # noqa: N802 - PySpark's name
        for p, stats in b.items():
            if p not in a or a[p][0] <= stats[0]:
                a[p] = stats
        return a


def _report(stats: Accumulator | None, partition: int, store: PartitionStore) -> None:
    if stats is not None and store.version is not None:
        stats.add({partition: (store.version, store.keys, store.disk_bytes())})


def catch_up(store: PartitionStore, changelog: StateChangelog, run: str, partition: int, target: int,
             plan: CatchUp, lineage: Lineage = EMPTY) -> bool:
    """Inside a transaction: bring ``store`` to version ``target`` of ``run`` with the history ``lineage`` (the dropped
    batches, :mod:`dstreams.state_lineage`) from the changelog (False: ``plan`` does not reach ``target``). A store of
    this run and history at a version of the plan before ``target`` (its start included) applies the versions after
    its own; any other is reloaded from the plan's checkpoint (or emptied) and applies every version of the plan up to
    ``target``, each read from its object of this history (:meth:`Lineage.vid`). With an empty start, the plan's
    versions may begin with the start itself: the state loaded at that version (an ``initialRDD``, a state that moved
    into the store), which its loading task wrote to the changelog; it is applied as the base, not logged. Raises
    :class:`StateStoreError` when the changelog or the checkpoint cannot be read."""
    start, empty, applied = plan
    versions = [v for v in applied if v <= target and (v > start or (v == start and empty))]
    if target != (versions[-1] if versions else start):
        return False
    current = store.version
    try:
        if (store.run == run and current is not None and (current == start or current in versions)
                and current < target and lineage.agrees(store.lineage, current)):
            todo = [v for v in versions if v > current]
        else:
            store.reload(start, run, () if empty else changelog.checkpoint_state(start, partition), lineage)
            todo = versions
        for v in todo:
            writes: dict[bytes, bytes | None] = dict(changelog.read(lineage.vid(run, v), v, partition))
            store.write_many(v, writes, store.get_many(writes), log=v != start)
            store.set_version(v, run, lineage)
    except StateStoreError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read: the batch's retry rebuilds through lineage
        raise StateStoreError(f"the state store of partition {partition} ({store.path}) could not be brought to "
                              f"version {target} from the changelog: {type(e).__name__}: {e}") from e
    return True


def _at_version(store: PartitionStore, version: int, run: str, catchup: tuple[StateChangelog, CatchUp] | None,
                partition: int, caught_up: Accumulator, lineage: Lineage = EMPTY) -> None:
    """Before reading ``store`` as of ``version``: where it is not this run's, has not got that far or holds another
    history of it (``lineage``: the dropped batches), bring it there from the changelog (when the stream writes one;
    else the read raises as it would)."""

    def there() -> bool:
        current = store.version
        return (store.run == run and current is not None and current >= version
                and lineage.agrees(store.lineage, version))

    if catchup is None or there():
        return
    with store.transaction():
        if not there() and catch_up(store, catchup[0], run, partition, version, catchup[1], lineage):
            caught_up.add(1)


def _to_base(store: PartitionStore, t: int, base: int | None, run: str, lineage: Lineage,
             catchup: tuple[StateChangelog, CatchUp] | None, partition: int, caught_up: Accumulator) -> bool | None:
    """Inside a transaction, before batch ``t`` (of ``run``, with the history ``lineage``) is applied to ``store`` on
    ``base``: True when the store is at ``base`` of this run and history (as it was, rolled back to it through its
    log, or caught up from the changelog); False when ``t`` is applied already (a recomputed handle, a retried or
    speculative task) or the task is superseded (a batch at or before ``t`` was dropped after it was built and the
    store went on with the redone one): nothing to do; None: the store cannot be brought to ``base``.

    A store of this run past ``base`` whose history at ``t`` is another (it applied ``t`` or later before a batch
    was dropped) but the same at ``base`` goes back to ``base`` through its log."""
    version, had, floor = store.version, store.lineage, store.log_floor
    if store.run == run and version is not None:
        if version >= t and (lineage.agrees(had, t) or lineage.misses(had, t)):
            return False
        if base is not None and version >= base and lineage.agrees(had, base):
            if version == base:
                return True
            if floor is not None and floor <= base:
                store.rollback(base)  # what it applied after base is of another history (the dropped input's)
                return True
    if catchup is not None and base is not None and catch_up(store, catchup[0], run, partition, base, catchup[1],
                                                             lineage):
        caught_up.add(1)
        return True
    return None


def _sweep_host(folder: str, horizon: int, swept: Accumulator) -> None:
    """After a task applied its batch: delete the stale copies of this stream's other partitions on this host
    (:func:`~dstreams.statestore.sweep_stale_once`: once per host and horizon). A failure to sweep never fails the
    task: it is logged, and the next horizon sweeps again."""
    try:
        removed = sweep_stale_once(folder, horizon)
    except (OSError, sqlite3.Error) as e:
        log.warning("stale state store copies in %s were not swept (the next checkpoint tries again): %s: %s",
                    folder, type(e).__name__, e)
        return
    if removed:
        swept.add(len(removed))


class StoreStateNode(KeyedNode):
    """The executor store's state of the operator ``op`` (see the module docstring): its step applied by
    :func:`~.keyed.store_partition` to the keys each batch touches and the due ones."""

    prefix, backend_params = "Store", ("store=executor",)

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, op: KeyedOp, partitioner: Partitioner,
                 initial: RDD | None, local_dir: str | None, snapshot_every: int) -> None:
        super().__init__(graph, parent, op, partitioner)
        self.initial = ensure_partitioned(initial, partitioner) if initial is not None else None
        #: Whether the stream was defined with an initial state (kept when the graph is stored without it).
        self._had_initial = initial is not None
        self.local_dir = local_dir
        self.snapshot_every = max(1, int(snapshot_every))
        #: This driver run: a store another run wrote is trusted only once brought back to a checkpoint.
        self._run = uuid.uuid4().hex
        #: Committed checkpoints since the newest snapshot (oldest first): what the next delta builds on.
        self._chain: list[int] = []
        #: Checkpoint time -> the chain it was written on (known once exported, used when adopted).
        self._exported: dict[int, list[int]] = {}
        #: Checkpoint times marked and not yet adopted: the store's log must reach back to them.
        self._marked: set[int] = set()
        #: The stores' reports (keys, bytes on disk), created on the driver with the first RDD.
        self._stats: Accumulator | None = None
        #: How many times a task brought a store up to date from the changelog (created with the first RDD).
        self._caught_up: Accumulator | None = None
        #: How many stale store copies tasks deleted (:func:`~dstreams.statestore.sweep_stale`; with the first RDD).
        self._swept: Accumulator | None = None
        #: The newest checkpoint of this stream adopted or read back in this run (None: none yet).
        self._newest_checkpoint: int | None = None
        #: The handle at the zero time (the initial state loaded), once built.
        self._zero_handle: RDD | None = None
        #: The dropped batches of the history of the checkpoint a restart read back (its manifest's ``lineage``).
        self._inherited: Lineage = EMPTY
        self._reset_changelog()
        self.persist(StorageLevel.MEMORY_ONLY)

    def _reset_changelog(self) -> None:
        #: This run's changelog (``spark.dstreams.state.changelog``), resolved with the first batch; False: not yet.
        self._changelog: StateChangelog | None | bool = False
        #: Where a store brought up to date from the changelog starts: (time, the empty state), None: nowhere.
        self._catchup_from: tuple[int, bool] | None = None
        #: The versions this run applied after ``_catchup_from`` (oldest first).
        self._applied: list[int] = []

    # ------------------------------------------------------------------ definition
    def on_store(self, time_ms: int) -> bool:
        return True

    @property
    def checkpoint_data(self) -> StoreCheckpointData:
        """The state's checkpoint data: deltas and snapshots of its stores (:class:`StoreCheckpointData`)."""
        return StoreCheckpointData(self)

    def __getstate__(self) -> dict[str, Any]:
        """The initial state is not stored in the graph (it is checkpointed at the zero time instead: see
        :meth:`_initial_handle`); a restored graph only knows it had one."""
        state = super().__getstate__()
        state["_had_initial"] = self.initial is not None or self._had_initial
        state["initial"] = None
        state.update(_chain=[], _exported={}, _marked=set(), _stats=None, _caught_up=None, _zero_handle=None,
                     _changelog=False, _catchup_from=None, _applied=[], _swept=None, _newest_checkpoint=None,
                     _inherited=EMPTY)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_inherited", EMPTY)
        self._run = uuid.uuid4().hex  # a restored graph is a new run

    def store_id(self) -> str:
        """The folder of this stream's stores on every executor: the same for every driver run on the same
        checkpoint location (so a restarted driver finds its stores), distinct for two locations."""
        checkpointer = self.graph.checkpointer
        location = getattr(checkpointer, "location", "") if checkpointer is not None else ""
        digest = hashlib.sha256(f"{location}\0{self.key}".encode()).hexdigest()[:20]
        return f"{self.key}-{digest}"

    def _stats_accumulator(self) -> Accumulator:
        if self._stats is None:
            self._stats = self.graph.sc.accumulator({}, _LatestPerPartition())
        return self._stats

    def _caught_up_accumulator(self) -> Accumulator:
        if self._caught_up is None:
            self._caught_up = self.graph.sc.accumulator(0)
        return self._caught_up

    def _swept_accumulator(self) -> Accumulator:
        if self._swept is None:
            self._swept = self.graph.sc.accumulator(0)
        return self._swept

    def _checkpoint_seen(self, time_ms: int) -> None:
        """A checkpoint of this stream at ``time_ms`` was adopted or read back in this run."""
        if self._newest_checkpoint is None or time_ms > self._newest_checkpoint:
            self._newest_checkpoint = time_ms

    def cleanup_horizon(self, time_ms: int) -> int | None:
        """Below this version a store copy on any host is stale when batch ``time_ms`` is applied (None: no copy is
        yet): the newest checkpoint adopted or read back in this run, or the oldest version a kept RDD, a checkpoint
        still to write or a delta's base may read (:meth:`_log_floor`), whichever is older. A copy below it is read
        again on no path: a catch-up starts from that checkpoint or a later one (a copy of this run at or after it may
        serve, so it is kept), a read-back reloads a store behind the checkpoint it restores, and no job reads a
        version below the log floor."""
        if self._newest_checkpoint is None:
            return None
        return min(self._newest_checkpoint, self._log_floor(time_ms))

    def store_metrics(self) -> dict[str, Any] | None:
        """Keys and bytes on disk of this stream's stores, summed over the partitions reported so far (each as of
        the newest version a task of it applied or restored), or None before any report."""
        stats: PartitionStats = dict(self._stats.value) if self._stats is not None else {}
        if not stats:
            return None
        return {"keys": sum(s[1] for s in stats.values()), "disk_bytes": sum(s[2] for s in stats.values()),
                "partitions_reported": len(stats), "partitions": self.partitioner.numPartitions,
                "as_of_ms": min(s[0] for s in stats.values()), "changelog": self.state_changelog() is not None,
                "caught_up": self._caught_up.value if self._caught_up is not None else 0,
                "stale_removed": self._swept.value if self._swept is not None else 0}

    # ------------------------------------------------------------------ the operator
    def batch_plan(self, time: BatchTime) -> tuple[list[RDD], Callable[[PartitionStore, list[list[Any]]],
                                                                         StoreChanges]] | None:
        """What batch ``time`` applies: the operator's RDDs (one segment each, in order) and what their segments do
        to a partition's store (:func:`~.keyed.store_partition`); None: nothing (the previous handle stands)."""
        op = self.op
        batches = op.batches(self, time)
        if batches is None:
            return None
        step, group, now = op.step(self, time), op.grouper(self, time), time.ms
        wm = watermark_at(self, time) if op.visits == DUE else None
        return batches, lambda store, segments: store_partition(op, step, store, segments, now, wm, group)

    def indexer(self) -> Indexer | None:
        """The stores' deadline function (:meth:`PartitionStore.due_keys`), or None: no deadlines."""
        return self.op.indexer()

    # ------------------------------------------------------------------ the changelog
    def state_changelog(self) -> StateChangelog | None:
        """This run's changelog, or None: ``spark.dstreams.state.changelog`` (``auto``: on under a cluster master,
        where a partition's task may run on another host than its store)."""
        if self._changelog is False:
            sc, checkpointer = self.graph.sc, self.graph.checkpointer
            mode = config.get(config.STATE_CHANGELOG, sc.getConf())
            on = mode == "on" or (mode == "auto" and not str(sc.master).startswith("local"))
            self._changelog = checkpointer.state_changelog(self.key) if on and checkpointer is not None else None
        return self._changelog  # type: ignore[return-value]

    def catchup_valid(self, start_ms: int) -> bool:
        """Whether a store loaded with the checkpoint at ``start_ms`` and this run's changelog after it is this
        stream's state (a state picked by size: only from the batch before it moved on)."""
        return True

    def _catchup_plan(self, upto_ms: int) -> tuple[StateChangelog, CatchUp] | None:
        """What a task needs to bring a store to a version up to ``upto_ms`` from the changelog, or None."""
        changelog, start = self.state_changelog(), self._catchup_from
        if changelog is None or start is None or not self.catchup_valid(start[0]):
            return None
        begin, empty = start
        return changelog, (begin, empty, tuple(v for v in self._applied
                                               if (v > begin or (empty and v == begin)) and v <= upto_ms))

    def lineage(self, catchup: tuple[StateChangelog, CatchUp] | None, t: int) -> Lineage:
        """The batches dropped in this history (:mod:`dstreams.state_lineage`: the checkpoint a restart read back went
        through and this run dropped) as a task of batch ``t`` compares stores by: those before the oldest version it
        compares at folded (the start of its ``catchup`` plan, whose versions it names, else the stores' log floor)."""
        floor = catchup[1][0] if catchup is not None else self._log_floor(t)
        return self._inherited.with_drops(self.graph.dropped_times).pruned(min(floor, t))

    def _catchup_starts(self, time_ms: int, empty: bool = False, logged: bool = False) -> None:
        """Stores can be brought up to date from the state at ``time_ms`` (a checkpoint read back or adopted; with
        ``empty``, the empty state) and this run's changelog after it; ``logged``: the state loaded at ``time_ms``
        itself is in the changelog (an ``initialRDD``, a state that moved into the store: see
        :meth:`_loaded_handle`), applied on the empty state. A start older than the one set is ignored (an RDD
        rebuilt after a newer checkpoint was adopted): this run's changelog is kept only from the newest start on."""
        if self._catchup_from is not None and time_ms < self._catchup_from[0]:
            return
        self._catchup_from = (time_ms, empty)
        self._applied = ([time_ms] if empty and logged else []) + [v for v in self._applied if v > time_ms]

    # ------------------------------------------------------------------ RDDs
    def _initial_handle(self) -> RDD:
        """The handle at the zero time: every partition's store holds the initial state (empty without one)."""
        assert self.zero_time is not None
        self._check_initial()
        handle = self._loaded_handle(self.zero_time.ms, self.initial)  # streamed into the store
        self._zero_handle = handle
        checkpointer = self.graph.checkpointer
        if self.initial is not None and checkpointer is not None:
            # a snapshot at the zero time: what a restart before the next one needs
            self._marked.add(self.zero_time.ms)
            checkpointer.mark(self, self.zero_time, handle)
        return handle

    def _loaded_handle(self, version: int, state: RDD | None) -> RDD:
        """A handle at ``version``: each partition's store brought to it (:meth:`PartitionStore.ensure_base`, never
        from another run's store: the state loaded is this run's), loaded with that partition of ``state``'s
        (key, value) pairs (None: empty) where it is not there yet.

        From here on stores can catch up (:func:`catch_up`): from the empty state at ``version``, and, when the
        stream writes a changelog and ``state`` is given, from the state loaded, which each partition's loading task
        writes to the changelog as version ``version`` inside the store's transaction (as a batch writes its changes):
        a task on a host without the partition's store rebuilds it from the changelog alone, before the zero time's
        checkpoint (or any later one) is written (issue 42)."""
        run, local_dir, store_id = self._run, self.local_dir, self.store_id()
        stats, indexer = self._stats_accumulator(), self.indexer()
        changelog = self.state_changelog() if state is not None else None
        lineage = self._inherited.with_drops(self.graph.dropped_times).upto(version).pruned(version)
        vid = lineage.vid(run, version)

        def load(i: int, records: Iterable[Any]) -> list[int]:
            store = PartitionStore.open(local_dir, store_id, i, indexer)
            try:
                def logged() -> None:  # inside the store's transaction: a loaded store is in the changelog
                    assert changelog is not None
                    changelog.write(vid, version, i, list(store.items()))

                store.ensure_base(version, run, lambda: ((key_bytes(k), value_bytes(v)) for k, v in records),
                                  reuse_other_runs=False, loaded=logged if changelog is not None else None,
                                  lineage=lineage)
                _report(stats, i, store)
            finally:
                store.close()
            return [version]

        self._catchup_starts(version, empty=True, logged=changelog is not None)
        if state is None:
            return partition_aligned_rdd(self.graph.sc, self.partitioner.numPartitions, lambda i: load(i, ()))
        handle = state.mapPartitionsWithIndex(load, preservesPartitioning=True)
        handle.persist(StorageLevel.MEMORY_ONLY)
        return handle

    def release_own_rdds(self) -> None:
        """The context stopped: unpersist the handle at the zero time (the graph's ``HoldsOwnRDDs``; the handles of
        batches are the engine's, released by ``release``)."""
        zero = getattr(self, "_zero_handle", None)
        if zero is not None:
            zero.unpersist(blocking=False)

    def _check_initial(self) -> None:
        """Raise when the stream had an initial state that neither the graph nor a checkpoint holds."""
        if self.initial is None and self._had_initial:
            raise StateStoreError(
                f"{self.name}: the driver stopped before the initial state (updateStateByKey's initialRDD) was "
                "checkpointed (right after the first batch), and a restored graph does not hold it: start the "
                "application on a new checkpoint location, or delete this one, so that setupFunc defines it again")

    def before_batch_retry(self, time: BatchTime, error: BaseException) -> None:
        """A try that failed on a store not at the version the batch expected (the store folder removed under
        the stream, a task run on another host than its partition's store) is tried again through lineage: the
        cached handles from the newest checkpoint this node reads (its reader included; without one, from the
        zero time) through ``time`` are dropped and persisted again, so that the retry recomputes each
        partition's chain in one task: the checkpoint (or the initial state) loaded into that task's store,
        then the batches since applied (each only where the store does not have it yet)."""
        if not failed_with(error, StateStoreError):
            return
        with self.graph.lock:
            floor = max((t for t in self._reader_times if t <= time.ms), default=None)
            handles = [rdd for t, rdd in self.generated.items() if (floor is None or t >= floor) and t <= time.ms]
            zero = getattr(self, "_zero_handle", None)  # a graph checkpointed before it existed has none
            if floor is None and zero is not None:
                handles.append(zero)
        for rdd in handles:
            rdd.unpersist(blocking=True)
            rdd.persist(StorageLevel.MEMORY_ONLY)

    def _log_floor(self, t: int) -> int:
        """Below this version the store's log may go: no checkpoint still to write, no delta's base and no RDD
        in the remember window needs it."""
        assert self.remember_duration is not None
        floor = t - self.remember_duration.ms - self.slide_duration.ms
        if self._chain:
            floor = min(floor, self._chain[-1])
        if self._marked:
            floor = min(floor, min(self._marked))
        return floor

    def previous_handle(self, time: BatchTime) -> RDD:
        """The handle batch ``time`` applies to: the one of the batch before, the zero time's checkpoint read back
        by a restart, or the initial state loaded."""
        previous = self.get_or_compute(time - self.slide_duration)
        if previous is None and self.zero_time is not None:  # the zero time's checkpoint, read back by a restart
            previous = self.generated.get(self.zero_time.ms) if time - self.slide_duration == self.zero_time else None
        if previous is None:
            previous = self._initial_handle()
        return previous

    def compute(self, time: BatchTime) -> RDD | None:
        previous = self.previous_handle(time)
        plan = self.batch_plan(time)
        if plan is None:
            return previous
        batches, update = plan
        if self.checkpoint_due(time):
            self._marked.add(time.ms)
        t, run, local_dir, store_id = time.ms, self._run, self.local_dir, self.store_id()
        floor, name = self._log_floor(time.ms), self.name
        stats, indexer = self._stats_accumulator(), self.indexer()
        catchup, caught_up = self._catchup_plan(t - 1), self._caught_up_accumulator()
        changelog = self.state_changelog()
        horizon, swept = self.cleanup_horizon(t), self._swept_accumulator()
        # Which history of t this is (a batch at or before t whose input was dropped, onFailure=dropInput, makes
        # another one): a store holding t or its base of another history is not taken for this one.
        lineage = self.lineage(catchup, t)
        vid = lineage.vid(run, t)
        if t not in self._applied:
            bisect.insort(self._applied, t)

        def apply(i: int, segments: list[list[Any]]) -> list[int]:
            base = segments[0][0] if segments[0] else None
            store = PartitionStore.open(local_dir, store_id, i, indexer)
            try:
                with store.transaction():
                    version, owner = store.version, store.run
                    ready = _to_base(store, t, base, run, lineage, catchup, i, caught_up)
                    if ready is False:
                        return [t]  # applied already (a recomputed handle, a retried or speculative task) or superseded
                    if ready is None:
                        raise StateStoreError(
                            f"{name}: the state store of partition {i} ({store.path}) is at version {version} "
                            f"of run {owner}, not at {base} of this run ({run}), so batch {t} cannot be "
                            "applied. Another driver may be writing the same checkpoint location's state, the "
                            "store's folder was removed while the stream ran, or the task runs on another host "
                            "than the partition's store (spark.dstreams.state.changelog=on lets it catch up); "
                            "restart the stream from its checkpoint")
                    writes, old = update(store, segments[1:])
                    store.write_many(t, writes, old)
                    if changelog is not None:  # before the store commits: a version in a store is in the changelog
                        changelog.write(vid, t, i, list(writes.items()))
                    store.set_version(t, run, lineage)
                    store.prune_log(floor)
                _report(stats, i, store)
            finally:
                store.close()
            if horizon is not None:
                _sweep_host(os.path.dirname(store.path), horizon, swept)
            return [t]

        groups = [[previous], *([b] for b in batches)]
        return segmented_merge(self.graph.sc, groups, self.partitioner, apply, with_index=True)

    def view(self, time: BatchTime) -> RDD | None:
        """The whole state at ``time`` as (key, value) pairs, read lazily from the stores."""
        handle = self.get_or_compute(time)
        if handle is None:
            return None
        local_dir, store_id, run, catchup = self.local_dir, self.store_id(), self._run, self._catchup_plan(time.ms)
        caught_up, indexer, lineage = self._caught_up_accumulator(), self.indexer(), self.lineage(catchup, time.ms)

        def read(i: int, it: Iterable[Any]) -> Iterable[Any]:
            (version,) = list(it)
            store = PartitionStore.open(local_dir, store_id, i, indexer)  # a catch-up here keeps the deadline index
            try:
                _at_version(store, version, run, catchup, i, caught_up, lineage)
                with store.reading():
                    for kb, vb in store.items_as_of(version):
                        yield pickle.loads(kb), pickle.loads(vb)
            finally:
                store.close()

        return handle.mapPartitionsWithIndex(read, preservesPartitioning=True)


    def changes(self, time: BatchTime) -> RDD | None:
        """The (key, value) pairs batch ``time`` changed ((key, None): removed), read from the stores' logs:
        costs the keys the batch touched."""
        handle = self.get_or_compute(time)
        if handle is None:
            return None
        t, local_dir, store_id = time.ms, self.local_dir, self.store_id()
        run, catchup, caught_up = self._run, self._catchup_plan(time.ms), self._caught_up_accumulator()
        indexer, lineage = self.indexer(), self.lineage(catchup, time.ms)

        def read(i: int, it: Iterable[Any]) -> Iterable[Any]:
            (version,) = list(it)
            if version != t:
                return  # an empty batch: the handle before it stands for it
            store = PartitionStore.open(local_dir, store_id, i, indexer)  # a catch-up here keeps the deadline index
            try:
                _at_version(store, version, run, catchup, i, caught_up, lineage)
                with store.reading():
                    for kb, vb in store.changed_at(version):
                        yield pickle.loads(kb), None if vb is None else pickle.loads(vb)
            finally:
                store.close()

        return handle.mapPartitionsWithIndex(read, preservesPartitioning=True)


class StoreCheckpointData(CheckpointData):
    """A store-backed state's checkpoint data (``dstreams.checkpoint_data``; the module docstring says what it
    writes): deltas on a chain of checkpoints or snapshots, read back into the executors' stores. A restarted driver
    checks that the parts of a checkpoint's chain exist instead of reading them whole (a store reads them only where
    it cannot get back to the checkpoint on its own)."""

    node: StoreStateNode

    def __init__(self, node: StoreStateNode) -> None:
        super().__init__(node, node.partitioner)

    def reads_to_verify(self, manifest: dict[str, Any]) -> bool:
        return False

    def export(self, time_ms: int, rdd: RDD) -> tuple[RDD, dict[str, Any]]:
        """What the checkpoint of ``time_ms`` writes: a delta on the chain of committed checkpoints, or a
        snapshot (see the module docstring), and the manifest's ``state`` entry naming the chain."""
        node = self.node
        chain = list(node._chain) if 0 < len(node._chain) < node.snapshot_every else []
        node._exported[time_ms] = chain
        base = chain[-1] if chain else None
        local_dir, store_id, run, catchup = node.local_dir, node.store_id(), node._run, node._catchup_plan(time_ms)
        caught_up, indexer, lineage = node._caught_up_accumulator(), node.indexer(), node.lineage(catchup, time_ms)

        def export(i: int, it: Iterable[Any]) -> Iterable[Any]:
            (version,) = list(it)
            store = PartitionStore.open(local_dir, store_id, i, indexer)  # a catch-up here keeps the deadline index
            try:
                _at_version(store, version, run, catchup, i, caught_up, lineage)
                with store.reading():
                    floor = store.log_floor
                    if base is not None and floor is not None and floor <= base:
                        yield (PART_HEADER, "delta")
                        yield from store.changed_since(base, version)
                    else:
                        path = f"{store.path}.snapshot-{version}-{os.getpid()}"
                        try:
                            keys = store.export_file(version, path)
                            task_reached("state-export")  # tests: a task killed with the file written
                            with open(path, "rb") as f:
                                data = f.read()
                        finally:
                            remove_store_files(path)
                        yield (PART_HEADER, FILE_SNAPSHOT, keys, data)
            finally:
                store.close()

        # the history of the state it holds: a restart reuses a store of an earlier run only with the same one
        held = lineage.upto(time_ms).pruned(time_ms).to_json()
        return rdd.mapPartitionsWithIndex(export), {"state": {"chain": chain, "lineage": held}}

    def adopt(self, time: BatchTime, reader: RDD) -> int:
        """The lineage cut (the base's), then: the adopted checkpoint is the newest of the chain the next delta
        builds on, and the store's log need no longer reach back before it."""
        built_through = super().adopt(time, reader)
        node = self.node
        if node.zero_time is not None and time == node.zero_time:
            # The initial state's checkpoint: the zero time's handle is not a generated RDD, so the base class
            # installs nothing; stores can be brought up to date from this checkpoint and the changelog from now on
            # (before, a store missing on a task's host before the first regular checkpoint failed the batch).
            node._catchup_starts(time.ms)
            node._checkpoint_seen(time.ms)
        chain = node._exported.pop(time.ms, None)
        if chain is not None:
            node._chain = [*chain, time.ms]
        node._marked = {m for m in node._marked if m > time.ms}
        node._exported = {m: c for m, c in node._exported.items() if m > time.ms}
        return built_through

    def restore(self, time: BatchTime, reader: RDD) -> None:
        """``reader`` yields the state at ``time`` (key bytes, value bytes) per partition; the RDD installed
        brings each partition's store to ``time`` (reading ``reader`` only when the store cannot get there on
        its own). The chain the next checkpoint builds on is set by :meth:`restored` (a restart) or
        :meth:`adopt` (a checkpoint of this run); otherwise it is a snapshot."""
        node = self.node
        version, run, local_dir, store_id = time.ms, node._run, node.local_dir, node.store_id()
        stats, indexer = node._stats_accumulator(), node.indexer()
        lineage = node._inherited.with_drops(node.graph.dropped_times).upto(version).pruned(version)

        def restore(i: int, records: Iterable[Any]) -> list[int]:
            store = PartitionStore.open(local_dir, store_id, i, indexer)
            try:
                store.ensure_base(version, run, lambda: records, lineage=lineage)
                _report(stats, i, store)
            finally:
                store.close()
            return [version]

        handle = reader.mapPartitionsWithIndex(restore, preservesPartitioning=True)
        node.restore_from_checkpoint(time, handle)
        node._catchup_starts(time.ms)
        node._checkpoint_seen(time.ms)
        if not node._chain or node._chain[-1] != time.ms:
            node._chain = []

    def manifest(self, time_ms: int, manifest: dict[str, Any]) -> None:
        """A restart reads this checkpoint back: the batches its state's history dropped are this run's history too
        (the newest checkpoint read back decides)."""
        node = self.node
        if node._newest_checkpoint is None or time_ms >= node._newest_checkpoint:
            node._inherited = Lineage.from_json((manifest.get("state") or {}).get("lineage"))

    def restored(self, time_ms: int, chain: list[int]) -> None:
        """The next checkpoint after a restart is a delta on the restored one (the stores' logs reach back to it
        whether they were kept, rolled back or reloaded), unless the chain is due for a snapshot."""
        node = self.node
        node._chain = [*chain, time_ms] if len(chain) + 1 < node.snapshot_every else []


class StateViewNode(OneParentNode):
    """The public stream of a store-backed state: the whole state at each batch, read lazily. The view is never
    checkpointed: its state is (:func:`checkpointed_node`)."""

    def __init__(self, graph: DStreamGraph, parent: StoreStateNode) -> None:
        super().__init__(graph, parent)
        self.state = parent

    def __getstate__(self) -> dict[str, Any]:
        """The view has no checkpoint interval of its own to store (its state's is the one set)."""
        state = super().__getstate__()
        state.pop("checkpoint_interval", None)
        return state

    def compute(self, time: BatchTime) -> RDD | None:
        return self.state.view(time)


def checkpointed_node(node: DStreamNode) -> DStreamNode:
    """The node that ``DStream.checkpoint(interval)`` on ``node``'s stream sets the interval of: the state of a
    store-backed state's view (the view is never checkpointed, and the state is persisted already), else ``node``."""
    return node.state if isinstance(node, StateViewNode) else node


class StateChangesNode(OneParentNode):
    """``changes()`` of a state stream: per batch, the (key, state) pairs that batch changed, (key, None) for a
    key it removed. On the executor state store it reads the stores' logs (the keys the batch touched); on the
    RDD state it compares the state with the one before, partition by partition (the whole state)."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode) -> None:
        super().__init__(graph, parent)

    def compute(self, time: BatchTime) -> RDD | None:
        parent = self.parent
        if isinstance(parent, StateViewNode):
            return parent.state.changes(time)
        current = parent.get_or_compute(time)
        if current is None:
            return None
        previous = parent.get_or_compute(time - self.slide_duration)
        if previous is None:
            previous = parent.initial_state()  # type: ignore[attr-defined]
        return state_diff(self.graph.sc, current, previous, parent.partitioner)  # type: ignore[attr-defined]


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


__all__ = ["PART_HEADER", "StateChangesNode", "StateViewNode", "StoreCheckpointData", "StoreStateNode",
           "checkpointed_node", "state_diff"]
