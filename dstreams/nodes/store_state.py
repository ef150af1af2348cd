"""The executor store backend (:class:`ExecutorStore`): a keyed operator's state in the executor state store
(:mod:`dstreams.statestore`).

Chosen with ``spark.dstreams.state.store=executor`` (and by ``auto`` once a state moves) for every keyed operator
(:class:`~.keyed.KeyedOp`): the operator's step runs on the keys a batch touches and the due ones
(:func:`~.keyed.store_partition`, the deadlines in the store's index). Two nodes:

* the :class:`~.state.StateNode` on this backend owns the chain of **handle** RDDs. Partition ``p`` of the handle at
  ``t`` applies batch ``t``'s records of partition ``p`` to the partition's store (reading and writing only the keys
  the batch touches) and yields one record, the store version it stands for. The handle at ``t`` depends narrowly on
  the handle before it and on the batch, shuffled once into the state's partitioner, so that Spark's lineage replays
  missing batches in order after a lost executor, as with RDD state. Handles are cached (a few bytes each) at the
  node's level (``spark.dstreams.state.replicas``). A task whose store already holds its version in this history
  applies nothing (:meth:`StoreAccess.to_base`); a batch with no records keeps the previous handle.
* :class:`StateViewNode` (the public stream) reads the whole state as of each handle's version, lazily: an output
  that reads every key costs the whole state, one that reads nothing costs nothing.

Checkpoints go through the engine's checkpointer (same manifest commit, fencing and outage rule): the checkpoint of
``t`` writes, per partition, the keys changed since the previous committed checkpoint (a **delta**, with deletions)
or, every ``spark.dstreams.state.snapshotEvery`` checkpoints and where the store's log no longer reaches the previous
checkpoint, the whole partition (a **snapshot**: the store's file as of the checkpoint's version); its manifest names
the chain it builds on, which the reader rebuilds and the checkpointer keeps (:class:`StoreCheckpointData`). A
checkpoint read back brings each partition's store to that version: kept, rolled back through the store's log, or
reloaded (:meth:`ExecutorStore.loaded_handle`). With the changelog (``spark.dstreams.state.changelog``) a task whose
store is missing or behind on its host catches up inside the task (:func:`catch_up`); copies a host keeps of
partitions that moved elsewhere are swept below :meth:`ExecutorStore.cleanup_horizon`.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import pickle
import sqlite3
import uuid
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import RDD
from pyspark.accumulators import Accumulator, AccumulatorParam

from .. import config
from ..checkpoint_data import CheckpointData
from ..errors import failed_with
from ..faults import task_reached
from ..node import DStreamNode, OneParentNode
from ..spark import jvm
from ..spark.partitioned import partition_aligned_rdd, segmented_merge
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
from .keyed import DUE, store_partition
from .state import StateBackend

if TYPE_CHECKING:
    from ..contracts import StateChangelog
    from ..graph import DStreamGraph
    from .state import StateNode

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


@dataclass(frozen=True)
class StoreAccess:
    """What a task needs to reach a stream's stores, built on the driver for one job and shipped with it: the
    stores' folder, id and deadline index, the driver run and history (``lineage``) a store must be of, how to catch
    one up from the changelog (``catchup``, None: no changelog) and the driver's accumulators."""

    local_dir: str | None
    store_id: str
    indexer: Indexer | None
    run: str
    lineage: Lineage
    catchup: tuple[StateChangelog, CatchUp] | None
    caught_up: Accumulator
    stats: Accumulator

    @contextmanager
    def open(self, i: int, version: int | None = None) -> Iterator[PartitionStore]:
        """Partition ``i``'s store, closed after; with ``version``, first brought there from the changelog where it
        is not this run's, has not got that far or holds another history of it (when the stream writes a changelog;
        else the read raises as it would)."""
        with closing(PartitionStore.open(self.local_dir, self.store_id, i, self.indexer)) as store:
            if version is not None and self.catchup is not None and not self._holds(store, version):
                with store.transaction():
                    if not self._holds(store, version):
                        self._catch_up(store, i, version)
            yield store

    def _holds(self, store: PartitionStore, version: int) -> bool:
        current = store.version
        return (store.run == self.run and current is not None and current >= version
                and self.lineage.agrees(store.lineage, version))

    def _catch_up(self, store: PartitionStore, i: int, version: int) -> bool:
        """Inside a transaction: :func:`catch_up`, counted (False: no changelog, or the plan does not reach)."""
        plan = self.catchup
        done = plan is not None and catch_up(store, plan[0], self.run, i, version, plan[1], self.lineage)
        if done:
            self.caught_up.add(1)
        return done

    def to_base(self, store: PartitionStore, i: int, t: int, base: int | None) -> bool | None:
        """Inside a transaction, before batch ``t`` is applied to partition ``i``'s ``store`` on ``base``: True when
        the store is at ``base`` of this run and history (as it was, rolled back to it through its log, or caught up
        from the changelog); False when ``t`` is applied already (a recomputed handle, a retried or speculative task)
        or the task is superseded (a batch at or before ``t`` was dropped after it was built and the store went on
        with the redone one): nothing to do; None: the store cannot be brought to ``base``.

        A store of this run past ``base`` whose history at ``t`` is another (it applied ``t`` or later before a batch
        was dropped) but the same at ``base`` goes back to ``base`` through its log."""
        version, had, floor, lineage = store.version, store.lineage, store.log_floor, self.lineage
        if store.run == self.run and version is not None:
            if version >= t and (lineage.agrees(had, t) or lineage.misses(had, t)):
                return False
            if base is not None and version >= base and lineage.agrees(had, base):
                if version == base:
                    return True
                if floor is not None and floor <= base:
                    store.rollback(base)  # what it applied after base is of another history (the dropped input's)
                    return True
        return True if base is not None and self._catch_up(store, i, base) else None

    def report(self, i: int, store: PartitionStore) -> None:
        """Partition ``i``'s figures for the driver (:meth:`ExecutorStore.metrics`)."""
        if store.version is not None:
            self.stats.add({i: (store.version, store.keys, store.disk_bytes())})


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


class ExecutorStore(StateBackend):
    """The executor store backend of a :class:`~.state.StateNode` (module docstring): the node's RDDs are handles,
    the operator's step applied by :func:`~.keyed.store_partition` to the keys each batch touches and the due ones."""

    prefix: str = "Store"
    params: tuple[str, ...] = ("store=executor",)
    initial_in_graph: bool = False

    # What a driver run keeps (:meth:`_runtime`):
    #: this driver run: a store another run wrote is trusted only once brought back to a checkpoint;
    _run: str
    #: committed checkpoints since the newest snapshot (oldest first): what the next delta builds on;
    _chain: list[int]
    #: checkpoint time -> the chain it was written on (known once exported, used when adopted);
    _exported: dict[int, list[int]]
    #: checkpoint times marked and not yet adopted: the store's log must reach back to them;
    _marked: set[int]
    #: the driver's accumulators (``stats``: the stores' reports, ``caught_up``: stores brought up to date from the
    #: changelog, ``swept``: stale copies deleted), each created with the first RDD that needs it;
    _accs: dict[str, Accumulator]
    #: the newest checkpoint of this stream adopted or read back in this run (None: none yet);
    _newest_checkpoint: int | None
    #: the handles that loaded a state into the stores, by version (the zero time's, the auto policy's move): the
    #: backend's own RDDs (a batch's handle is the node's);
    _loaded: dict[int, RDD]
    #: the dropped batches of the history of the checkpoint a restart read back (its manifest's ``lineage``);
    _inherited: Lineage
    #: this run's changelog (``spark.dstreams.state.changelog``), resolved with the first batch (False: not yet);
    _changelog: StateChangelog | None | bool
    #: where a store brought up to date from the changelog starts: (time, the empty state), None: nowhere;
    _catchup_from: tuple[int, bool] | None
    #: the versions this run applied after ``_catchup_from`` (oldest first).
    _applied: list[int]

    def __init__(self, node: StateNode, local_dir: str | None, snapshot_every: int) -> None:
        self.node = node
        self.local_dir = local_dir
        self.snapshot_every = max(1, int(snapshot_every))
        self.__dict__.update(self._runtime())

    def _runtime(self) -> dict[str, Any]:
        return {"_run": uuid.uuid4().hex, "_chain": [], "_exported": {}, "_marked": set(), "_accs": {},
                "_newest_checkpoint": None, "_loaded": {}, "_inherited": EMPTY, "_changelog": False,
                "_catchup_from": None, "_applied": []}

    # ------------------------------------------------------------------ definition
    def on_store(self, time_ms: int) -> bool:
        return True

    def checkpoint_data(self) -> StoreCheckpointData:
        return StoreCheckpointData(self)

    def store_id(self) -> str:
        """The folder of this stream's stores on every executor: the same for every driver run on the same
        checkpoint location (so a restarted driver finds its stores), distinct for two locations."""
        node = self.node
        location = getattr(node.graph.checkpointer, "location", "")  # none without a checkpointer
        digest = hashlib.sha256(f"{location}\0{node.key}".encode()).hexdigest()[:20]
        return f"{node.key}-{digest}"

    def _acc(self, name: str) -> Accumulator:
        """The driver's accumulator ``name`` (:attr:`_accs`), created on first use."""
        if name not in self._accs:
            sc = self.node.graph.sc
            self._accs[name] = sc.accumulator({}, _LatestPerPartition()) if name == "stats" else sc.accumulator(0)
        return self._accs[name]

    def access(self, time_ms: int, upto: int | None = None, lineage: Lineage | None = None) -> StoreAccess:
        """What a task of the version ``time_ms`` needs (:class:`StoreAccess`): catching a store up to versions up to
        ``upto`` (default ``time_ms``), comparing stores by :meth:`lineage`; with ``lineage`` given (a state loaded or
        read back), that history and no catching up."""
        catchup = self._catchup_plan(time_ms if upto is None else upto) if lineage is None else None
        return StoreAccess(self.local_dir, self.store_id(), self.node.op.indexer(), self._run,
                           lineage if lineage is not None else self.lineage(catchup, time_ms), catchup,
                           self._acc("caught_up"), self._acc("stats"))

    def _checkpoint_seen(self, time_ms: int) -> None:
        """A checkpoint of this stream at ``time_ms`` was adopted or read back in this run."""
        newest = self._newest_checkpoint
        self._newest_checkpoint = time_ms if newest is None else max(newest, time_ms)

    def cleanup_horizon(self, log_floor: int) -> int | None:
        """Below this version a store copy on any host is stale (None: no copy is yet) when a batch is applied whose
        :meth:`_log_floor` (the oldest version a kept RDD, a checkpoint still to write or a delta's base may read) is
        ``log_floor``: that or the newest checkpoint adopted or read back in this run, whichever is older. A copy
        below it is read again on no path: a catch-up starts from that checkpoint or a later one (a copy of this run
        at or after it may serve, so it is kept), a read-back reloads a store behind the checkpoint it restores, and
        no job reads a version below the log floor."""
        newest = self._newest_checkpoint
        return None if newest is None else min(newest, log_floor)

    def metrics(self) -> dict[str, Any] | None:
        """Keys and bytes on disk of this stream's stores, summed over the partitions reported so far (each as of
        the newest version a task of it applied or restored), or None before any report."""
        value = {name: acc.value for name, acc in self._accs.items()}  # none created here
        stats: PartitionStats = dict(value.get("stats", {}))
        if not stats:
            return None
        return {"keys": sum(s[1] for s in stats.values()), "disk_bytes": sum(s[2] for s in stats.values()),
                "partitions_reported": len(stats), "partitions": self.node.partitioner.numPartitions,
                "as_of_ms": min(s[0] for s in stats.values()), "changelog": self.state_changelog() is not None,
                "caught_up": value.get("caught_up", 0), "stale_removed": value.get("swept", 0)}

    # ------------------------------------------------------------------ the changelog
    def state_changelog(self) -> StateChangelog | None:
        """This run's changelog, or None: ``spark.dstreams.state.changelog`` (``auto``: on under a cluster master,
        where a partition's task may run on another host than its store)."""
        if self._changelog is False:
            sc, checkpointer = self.node.graph.sc, self.node.graph.checkpointer
            mode = config.get(config.STATE_CHANGELOG, sc.getConf())
            on = mode == "on" or (mode == "auto" and not str(sc.master).startswith("local"))
            self._changelog = checkpointer.state_changelog(self.node.key) if on and checkpointer is not None else None
        return self._changelog  # type: ignore[return-value]

    def _catchup_plan(self, upto_ms: int) -> tuple[StateChangelog, CatchUp] | None:
        """What a task needs to bring a store to a version up to ``upto_ms`` from the changelog, or None (no
        changelog, or no start yet)."""
        changelog, start = self.state_changelog(), self._catchup_from
        if changelog is None or start is None:
            return None
        begin, empty = start
        return changelog, (begin, empty, tuple(v for v in self._applied
                                               if (v > begin or (empty and v == begin)) and v <= upto_ms))

    def lineage(self, catchup: tuple[StateChangelog, CatchUp] | None, t: int) -> Lineage:
        """The batches dropped in this history (:mod:`dstreams.state_lineage`: the checkpoint a restart read back went
        through and this run dropped) as a task of batch ``t`` compares stores by: those before the oldest version it
        compares at folded (the start of its ``catchup`` plan, whose versions it names, else the stores' log floor)."""
        floor = catchup[1][0] if catchup is not None else self._log_floor(t)
        return self._inherited.with_drops(self.node.graph.dropped_times).pruned(min(floor, t))

    def catchup_starts(self, time_ms: int, empty: bool = False, logged: bool = False) -> None:
        """Stores can be brought up to date from the state at ``time_ms`` (a checkpoint read back or adopted; with
        ``empty``, the empty state) and this run's changelog after it; ``logged``: the state loaded at ``time_ms``
        itself is in the changelog (an ``initialRDD``, a state that moved into the store: see
        :meth:`loaded_handle`), applied on the empty state. A start older than the one set is ignored (an RDD
        rebuilt after a newer checkpoint was adopted): this run's changelog is kept only from the newest start on."""
        if self._catchup_from is not None and time_ms < self._catchup_from[0]:
            return
        self._catchup_from = (time_ms, empty)
        self._applied = ([time_ms] if empty and logged else []) + [v for v in self._applied if v > time_ms]

    # ------------------------------------------------------------------ RDDs
    def _initial_handle(self) -> RDD:
        """The handle at the zero time: every partition's store holds the initial state (empty without one)."""
        node = self.node
        assert node.zero_time is not None
        initial = node.initial_state()
        handle = self.loaded_handle(node.zero_time.ms, initial)  # streamed into the store
        checkpointer = node.graph.checkpointer
        if initial is not None and checkpointer is not None:
            # a snapshot at the zero time: what a restart before the next one needs
            self._marked.add(node.zero_time.ms)
            checkpointer.mark(node, node.zero_time, handle)
        return handle

    def loaded_handle(self, version: int, state: RDD | None, read_back: bool = False) -> RDD:
        """A handle at ``version``: each partition's store brought to it (:meth:`PartitionStore.ensure_base`), loaded
        with that partition of ``state`` where it is not there yet: a checkpoint read back (``read_back``: key and
        value bytes; a store of an earlier run past it may be rolled back), or a state loaded ((key, value) pairs,
        None: empty; never from another run's store: the state loaded is this run's).

        From here on stores can catch up (:func:`catch_up`): from the checkpoint read back; or from the empty state at
        ``version`` and, when the stream writes a changelog and ``state`` is given, from the state loaded, which each
        partition's loading task writes to the changelog as version ``version`` inside the store's transaction (as a
        batch writes its changes): a task on a host without the partition's store rebuilds it from the changelog
        alone, before the zero time's checkpoint (or any later one) is written (issue 42)."""
        changelog = self.state_changelog() if state is not None and not read_back else None
        history = self._inherited.with_drops(self.node.graph.dropped_times).upto(version).pruned(version)
        access = self.access(version, lineage=history)  # the history of the state loaded or read back
        vid = access.lineage.vid(access.run, version)

        def load(i: int, records: Iterable[Any]) -> list[int]:
            with access.open(i) as store:
                def logged() -> None:  # inside the store's transaction: a loaded store is in the changelog
                    assert changelog is not None
                    changelog.write(vid, version, i, list(store.items()))

                pairs = records if read_back else ((key_bytes(k), value_bytes(v)) for k, v in records)
                store.ensure_base(version, access.run, lambda: pairs, reuse_other_runs=read_back,
                                  loaded=logged if changelog is not None else None, lineage=access.lineage)
                access.report(i, store)
            task_reached("state-loaded")  # tests: a task paused with its store loaded, before a batch applies to it
            return [version]

        self.catchup_starts(version, empty=not read_back, logged=changelog is not None)
        if state is None:
            handle = partition_aligned_rdd(self.node.graph.sc, self.node.partitioner.numPartitions,
                                           lambda i: load(i, ()))
        else:
            handle = jvm.persist(state.mapPartitionsWithIndex(load, preservesPartitioning=True), self.node.level)
        if not read_back:  # a checkpoint read back is the node's RDD
            self._loaded[version] = handle
        return handle

    def release(self) -> None:
        """The context stopped: unpersist the handles that loaded a state (the handles of batches are the engine's,
        released by the node's ``release``)."""
        for handle in self._loaded.values():
            handle.unpersist(blocking=False)

    def retry(self, time: BatchTime, error: BaseException) -> None:
        """A try that failed on a store not at the version the batch expected (the store folder removed under
        the stream, a task run on another host than its partition's store) is tried again through lineage: the
        cached handles from the newest checkpoint this node reads (its reader included; without one, from the
        zero time; those that loaded a state included) through ``time`` are dropped and persisted again, so that the
        retry recomputes each partition's chain in one task: the checkpoint (or the state loaded) loaded into that
        task's store, then the batches since applied (each only where the store does not have it yet)."""
        if not failed_with(error, StateStoreError):
            return
        node = self.node
        with node.graph.lock:
            floor = max((t for t in node._reader_times if t <= time.ms), default=None)
            handles = [rdd for t, rdd in [*node.generated.items(), *self._loaded.items()]
                       if (floor is None or t >= floor) and t <= time.ms]
        level = self.node.level
        for rdd in handles:
            rdd.unpersist(blocking=True)
            rdd.persist(level)

    def _log_floor(self, t: int) -> int:
        """Below this version the store's log may go: no checkpoint still to write, no delta's base and no RDD
        in the remember window needs it."""
        node = self.node
        assert node.remember_duration is not None
        return min([t - node.remember_duration.ms - node.slide_duration.ms, *self._chain[-1:], *self._marked])

    def compute(self, time: BatchTime, previous: RDD | None = None) -> RDD | None:
        """The handle at ``time``: batch ``time`` applied to ``previous`` (default: the node's RDD before, or the
        initial state loaded); ``previous`` itself when the batch applies nothing."""
        node, op = self.node, self.node.op
        previous = previous or node.previous(time) or self._initial_handle()  # an RDD is never falsy
        batches = op.batches(node, time)
        if batches is None:
            return previous
        step, group, t = op.step(node, time), op.grouper(node, time), time.ms
        wm = watermark_at(node, time) if op.visits == DUE else None
        if node.checkpoint_due(time):
            self._marked.add(t)
        access, floor, name = self.access(t, upto=t - 1), self._log_floor(t), node.name
        changelog, horizon, swept = self.state_changelog(), self.cleanup_horizon(floor), self._acc("swept")
        # Which history of t this is (a batch at or before t whose input was dropped, onFailure=dropInput, makes
        # another one): a store holding t or its base of another history is not taken for this one.
        run, lineage = access.run, access.lineage
        vid = lineage.vid(run, t)
        if t not in self._applied:
            bisect.insort(self._applied, t)

        def apply(i: int, segments: list[list[Any]]) -> list[int]:
            base = segments[0][0] if segments[0] else None
            with access.open(i) as store:
                with store.transaction():
                    ready = access.to_base(store, i, t, base)
                    if ready is False:
                        return [t]  # applied already (a recomputed handle, a retried or speculative task) or superseded
                    if ready is None:
                        raise StateStoreError(
                            f"{name}: the state store of partition {i} ({store.path}) is at version {store.version} "
                            f"of run {store.run}, not at {base} of this run ({run}), so batch {t} cannot be "
                            "applied. Another driver may be writing the same checkpoint location's state, the "
                            "store's folder was removed while the stream ran, or the task runs on another host "
                            "than the partition's store (spark.dstreams.state.changelog=on lets it catch up); "
                            "restart the stream from its checkpoint")
                    writes, old = store_partition(op, step, store, segments[1:], t, wm, group)
                    store.write_many(t, writes, old)
                    if changelog is not None:  # before the store commits: a version in a store is in the changelog
                        changelog.write(vid, t, i, list(writes.items()))
                    store.set_version(t, run, lineage)
                    store.prune_log(floor)
                access.report(i, store)
                path = store.path
            if horizon is not None:
                _sweep_host(os.path.dirname(path), horizon, swept)
            return [t]

        groups = [[previous], *([b] for b in batches)]
        handle = segmented_merge(node.graph.sc, groups, node.partitioner, apply, with_index=True)
        return jvm.persist(handle, self.node.level)  # the engine keeps it persisted (its own level otherwise)

    def view(self, time: BatchTime) -> RDD | None:
        return self._read(time, changed=False)

    def changes(self, time: BatchTime) -> RDD | None:
        return self._read(time, changed=True)

    def _read(self, time: BatchTime, changed: bool) -> RDD | None:
        """Per partition, lazily, the pairs of the store as of the handle's version, or (``changed``) those batch
        ``time`` wrote, read from the store's log: the keys it touched (none where the handle stands for an earlier
        batch: ``time`` had no records). A catch-up here keeps the deadline index."""
        handle = self.node.get_or_compute(time)
        if handle is None:
            return None
        t, access = time.ms, self.access(time.ms)

        def read(i: int, it: Iterable[Any]) -> Iterable[Any]:
            (version,) = list(it)
            if changed and version != t:
                return
            with access.open(i, version) as store, store.reading():
                for kb, vb in store.changed_at(version) if changed else store.items_as_of(version):
                    yield pickle.loads(kb), None if vb is None else pickle.loads(vb)

        return handle.mapPartitionsWithIndex(read, preservesPartitioning=True)


class StoreCheckpointData(CheckpointData):
    """A store-backed state's checkpoint data (``dstreams.checkpoint_data``; the module docstring says what it
    writes): deltas on a chain of checkpoints or snapshots, read back into the executors' stores. A restarted driver
    checks that the parts of a checkpoint's chain exist instead of reading them whole (a store reads them only where
    it cannot get back to the checkpoint on its own)."""

    def __init__(self, store: ExecutorStore) -> None:
        super().__init__(store.node, store.node.partitioner)
        self.store = store

    def reads_to_verify(self, manifest: dict[str, Any]) -> bool:
        return False

    def export(self, time_ms: int, rdd: RDD) -> tuple[RDD, dict[str, Any]]:
        """What the checkpoint of ``time_ms`` writes: a delta on the chain of committed checkpoints, or a
        snapshot (see the module docstring), and the manifest's ``state`` entry naming the chain."""
        store = self.store
        chain = list(store._chain) if 0 < len(store._chain) < store.snapshot_every else []
        store._exported[time_ms] = chain
        base = chain[-1] if chain else None
        access = store.access(time_ms)

        def export(i: int, it: Iterable[Any]) -> Iterable[Any]:
            (version,) = list(it)
            with access.open(i, version) as ps, ps.reading():
                floor = ps.log_floor
                if base is not None and floor is not None and floor <= base:
                    yield (PART_HEADER, "delta")
                    yield from ps.changed_since(base, version)
                    return
                path = f"{ps.path}.snapshot-{version}-{os.getpid()}"
                try:
                    keys = ps.export_file(version, path)
                    task_reached("state-export")  # tests: a task killed with the file written
                    with open(path, "rb") as f:
                        data = f.read()
                finally:
                    remove_store_files(path)
                yield (PART_HEADER, FILE_SNAPSHOT, keys, data)

        # the history of the state it holds: a restart reuses a store of an earlier run only with the same one
        held = access.lineage.upto(time_ms).pruned(time_ms).to_json()
        return rdd.mapPartitionsWithIndex(export), {"state": {"chain": chain, "lineage": held}}

    def adopt(self, time: BatchTime, reader: RDD) -> int:
        """The lineage cut (the base's), then: the adopted checkpoint is the newest of the chain the next delta
        builds on, and the store's log need no longer reach back before it."""
        built_through = super().adopt(time, reader)
        store, zero = self.store, self.node.zero_time
        if zero is not None and time == zero:
            # The initial state's checkpoint (the zero time's handle is not a generated RDD: the base class installs
            # nothing): stores can be brought up to date from it and the changelog from now on.
            store.catchup_starts(time.ms)
            store._checkpoint_seen(time.ms)
        chain = store._exported.pop(time.ms, None)
        if chain is not None:
            store._chain = [*chain, time.ms]
        store._marked = {m for m in store._marked if m > time.ms}
        store._exported = {m: c for m, c in store._exported.items() if m > time.ms}
        return built_through

    def restore(self, time: BatchTime, reader: RDD) -> None:
        """``reader`` yields the state at ``time`` (key bytes, value bytes) per partition; the RDD installed
        brings each partition's store to ``time`` (reading ``reader`` only when the store cannot get there on
        its own). The chain the next checkpoint builds on is set by :meth:`restored` (a restart) or
        :meth:`adopt` (a checkpoint of this run); otherwise it is a snapshot."""
        store, version = self.store, time.ms
        self.node.restore_from_checkpoint(time, store.loaded_handle(version, reader, read_back=True))
        store._checkpoint_seen(version)
        if not store._chain or store._chain[-1] != version:
            store._chain = []

    def manifest(self, time_ms: int, manifest: dict[str, Any]) -> None:
        """A restart reads this checkpoint back: the batches its state's history dropped are this run's history too
        (the newest checkpoint read back decides)."""
        store = self.store
        if store._newest_checkpoint is None or time_ms >= store._newest_checkpoint:
            store._inherited = Lineage.from_json((manifest.get("state") or {}).get("lineage"))

    def restored(self, time_ms: int, chain: list[int]) -> None:
        """The next checkpoint after a restart is a delta on the restored one (the stores' logs reach back to it
        whether they were kept, rolled back or reloaded), unless the chain is due for a snapshot."""
        store = self.store
        store._chain = [*chain, time_ms] if len(chain) + 1 < store.snapshot_every else []


class StateViewNode(OneParentNode):
    """The public stream of a store-backed state (or one picked by size): the whole state at each batch, read
    lazily (:meth:`~.state.StateBackend.view`). The view is never checkpointed: its state is
    (:func:`checkpointed_node`)."""

    def __init__(self, graph: DStreamGraph, parent: StateNode) -> None:
        super().__init__(graph, parent)
        self.state = parent

    def __getstate__(self) -> dict[str, Any]:
        """The view has no checkpoint interval of its own to store (its state's is the one set)."""
        state = super().__getstate__()
        state.pop("checkpoint_interval", None)
        return state

    def compute(self, time: BatchTime) -> RDD | None:
        return self.state.backend.view(time)


def checkpointed_node(node: DStreamNode) -> DStreamNode:
    """The node that ``DStream.checkpoint(interval)`` on ``node``'s stream sets the interval of: the state of a
    store-backed state's view (the view is never checkpointed, and the state is persisted already), else ``node``."""
    return node.state if isinstance(node, StateViewNode) else node


class StateChangesNode(OneParentNode):
    """``changes()`` of a state stream (its :class:`~.state.StateNode`, or the view of one): per batch, the (key,
    state) pairs that batch changed, (key, None) for a key it removed (:meth:`~.state.StateBackend.changes`)."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode) -> None:
        super().__init__(graph, parent)
        self.state: StateNode = checkpointed_node(parent)  # type: ignore[assignment]

    def compute(self, time: BatchTime) -> RDD | None:
        return self.state.backend.changes(time)


__all__ = ["PART_HEADER", "ExecutorStore", "StateChangesNode", "StateViewNode", "StoreAccess", "StoreCheckpointData",
           "catch_up", "checkpointed_node"]
