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

* A stream starts on the RDD state: its RDD at ``t`` is the state itself, as :class:`~.state.RunningReduceNode`'s
  or :class:`~.state.UpdateStateNode`'s, and each partition's merge also reports (an accumulator) the keys of
  its state and the keys the batch touched as the store would touch them (:meth:`AutoStateNode.touch_counter`:
  the keys of the batch's records; for ``track`` also the keys that timed out, ended or fired a timer,
  :func:`track_touched`).
* When the driver builds a new batch, it reads the newest reports: once every partition has reported and the
  state holds at least ``spark.dstreams.state.autoKeys`` keys and :data:`TOUCH_RATIO` times the most keys one of
  the last :data:`WINDOW` batches touched, the largest of them left out (:func:`should_move`,
  :func:`typical_touched`), the stream moves to the store at that batch
  (:attr:`AutoStateNode.switched_at`) and stays there. That batch loads the RDD state of the batch before into
  each partition's store (as an initial state is loaded: :meth:`PartitionStore.ensure_base`) and applies itself;
  from there on the node is its store-backed class. Batches before ``switched_at`` are RDD states, batches at
  or after it store handles, in every rebuild (a lineage cut, a retry, a restart's replay).
* Both hold the same state, so the outputs are the same whenever the move happens: the move is not recorded in
  the metadata log. Checkpoints carry it: every checkpoint is written in the store's format (one before the
  move is a snapshot of the RDD state's pairs as they are, :data:`~dstreams.statestore.PAIRS_SNAPSHOT`, which the
  store's chain reader takes as a base), its manifest's ``state.auto.switched_at`` says when the stream moved
  (None: not yet), and a restarted driver resumes in the representation its checkpoint was written in
  (:meth:`AutoStateNode.checkpoint_manifest`); one resumed before the move decides again.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.accumulators import Accumulator
from pyspark.core.rdd import Partitioner

from ..dead_letters import for_batch
from ..errors import failed_with
from ..node import DStreamNode
from ..spark import jvm
from ..spark.partitioned import ensure_partitioned, segmented_merge
from ..statestore import PAIRS_SNAPSHOT, PART_HEADER, StateStoreError
from ..time import BatchTime, Duration
from .event_time import watermark_at
from .event_window import _closed_through, event_window_merge, session_merge, session_step
from .reduced_window import window_plan
from .state import Merge, keep_idle, running_reduce_merge, track_merge, update_state_merge
from .store_event_window import StoreEventWindowNode, StoreSessionWindowNode
from .store_state import (
    StoreRunningReduceNode,
    StoreStateNode,
    StoreUpdateStateNode,
    _LatestPerPartition,
    state_diff,
)
from .store_track import StoreTrackNode
from .store_window import StoreWindowNode
from .timers import Timer, timer_track_merge

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


#: ``(previous entries, entries after the batch, keys of the batch's records) -> keys the batch touched``.
TouchCounter = Callable[[list[Any], Sequence[Any], set[Any]], int]


def _keys_with_records(previous: list[Any], out: Sequence[Any], keys: set[Any]) -> int:
    return len(keys)


def track_touched(plain: bool) -> TouchCounter:
    """The keys a ``track`` batch touches, as its store touches them: keys with events, keys gone from the state
    (timed out, or ended by the user's function) and, with timers, keys whose timer fired (their entry's
    ``touched`` flag). The store reads and writes each of them, so the rule must count them all: a state whose
    keys mostly time out or fire every batch costs the same on either side."""

    def count(previous: list[Any], out: Sequence[Any], keys: set[Any]) -> int:
        kept = {kv[0] for kv in out}
        touched = keys | {kv[0] for kv in previous if kv[0] not in kept}
        if not plain:
            touched.update(kv[0] for kv in out if kv[1][-1])
        return len(touched)

    return count


def should_move(keys: int, touched: Sequence[int], min_keys: int) -> bool:
    """Whether a state of ``keys`` keys, whose newest batches touched ``touched`` keys each, belongs in the store."""
    return keys >= min_keys and keys >= TOUCH_RATIO * typical_touched(touched)


def _moved_at(manifest: dict[str, Any]) -> int | None:
    """The batch a checkpoint's stream moved into the store at (None: it had not)."""
    moved = manifest.get("state", {}).get("auto", {}).get("switched_at")
    return None if moved is None else int(moved)


class AutoStateNode(StoreStateNode):
    """Base of the state streams picked by size (module docstring). A subclass mixes this class before its
    store-backed class, calls :meth:`_auto_init` and gives :meth:`rdd_merge`."""

    auto_keys: int
    #: The batch time from which the stream is on the store (None: still on the RDD state).
    switched_at: int | None

    def _auto_init(self, auto_keys: int) -> None:
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

    def describe_params(self) -> list[str]:
        return [f"partitions={self.partitioner.numPartitions}", "store=auto"]

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

    def rdd_merge(self, time: BatchTime) -> Merge:
        """The RDD state's merge of a state partition with batch ``time``'s (prepared) records."""
        raise NotImplementedError

    def store_entry(self, time_ms: int) -> Callable[[Any], Any] | None:
        """How a value of the RDD state at batch ``time_ms`` becomes one of the store (None: the same layout).
        Applied when the stream moves and when a checkpoint of the RDD state is written, so that every checkpoint
        is in the store's layout (a delta after the move may build on one)."""
        return None

    def rdd_entry(self) -> Callable[[Any], Any] | None:
        """The inverse of :meth:`store_entry`, applied when a checkpoint of the RDD state is read back."""
        return None

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
        state, convert = self._rdd_previous(before + self.slide_duration), self.store_entry(before.ms)
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
        previous = self._rdd_previous(time)
        batch = self.parent.get_or_compute(time)
        if batch is None and (previous is None or not self.applies_every_batch):
            return previous  # no batch: nothing (as the RDD state)
        if (batch is not None and previous is not None and not self.applies_every_batch
                and jvm.has_no_partitions(batch)):
            # a batch without partitions leaves the state as it was (as RunningReduceNode), but before any state
            # it makes an empty one, so outputs see a (empty) state
            return previous
        groups = [[previous] if previous is not None else [], [self.prepare(batch)] if batch is not None else []]
        return self._counted_merge(time, groups, self.rdd_merge(time), 1)

    def touch_counter(self) -> TouchCounter:
        """How a partition counts the keys a batch touched on the RDD state, as the store would touch them: by
        default the keys of the batch's records."""
        return _keys_with_records

    def _counted_merge(self, time: BatchTime, groups: list[list[RDD]], merge: Merge, batches_from: int) -> RDD:
        """The RDD state at ``time``: ``merge`` of ``groups``' segments per partition (the segments from
        ``batches_from`` on are the batch's records, keyed), each partition reporting the keys of its state and
        the keys the batch touched."""
        if self._rdd_stats is None:
            self._rdd_stats = self.graph.sc.accumulator({}, _LatestPerPartition())
        stats, t, count = self._rdd_stats, time.ms, self.touch_counter()

        def counted(i: int, segments: list[list[Any]]) -> Iterable[Any]:
            keys = {kv[0] for segment in segments[batches_from:] for kv in segment}
            out = merge(segments)
            if not isinstance(out, (list, tuple)):
                out = list(out)
            stats.add({i: (t, len(out), count(segments[0], out, keys))})
            return out

        return segmented_merge(self.graph.sc, groups, self.partitioner, counted, with_index=True)

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
        return state_diff(self.graph.sc, current, self._rdd_previous(time), self.partitioner)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_export(self, time_ms: int, rdd: RDD) -> tuple[RDD, dict[str, Any]]:
        """Before the move: a snapshot of the RDD state's pairs (a store's chain may build on it); after it, the store's
        delta or snapshot. The manifest says when the stream moved."""
        if self.on_store(time_ms):
            out, entries = super().checkpoint_export(time_ms, rdd)
            entries["state"]["auto"] = {"switched_at": self.switched_at}
            return out, entries
        self._exported[time_ms] = []
        convert = self.store_entry(time_ms) or (lambda v: v)

        def export(it: Iterable[Any]) -> Iterable[Any]:
            yield (PART_HEADER, PAIRS_SNAPSHOT)  # the pairs as they are: as compact as the RDD state's checkpoint
            for k, v in it:
                yield k, convert(v)

        return rdd.mapPartitions(export, preservesPartitioning=True), {"state": {"chain": [],
                                                                                "auto": {"switched_at": None}}}

    def reads_checkpoint_to_verify(self, manifest: dict[str, Any]) -> bool:
        """A checkpoint of the RDD state (small: the stream had not moved) is read whole to verify it, as the RDD
        state's are; one of the store is checked as the store's are (its parts exist)."""
        return _moved_at(manifest) is None

    def checkpoint_manifest(self, time_ms: int, manifest: dict[str, Any]) -> None:
        """A restart resumes on the store from the batch its checkpoint says the stream moved at."""
        super().checkpoint_manifest(time_ms, manifest)
        moved = _moved_at(manifest)
        if moved is not None and (self.switched_at is None or moved < self.switched_at):
            self.switched_at = moved

    def restore_from_checkpoint(self, time: BatchTime, reader: RDD) -> None:
        if self.on_store(time.ms):
            super().restore_from_checkpoint(time, reader)
            return
        convert = self.rdd_entry() or (lambda v: v)
        pairs = reader.map(lambda kv: (pickle.loads(kv[0]), convert(pickle.loads(kv[1]))), preservesPartitioning=True)
        DStreamNode.restore_from_checkpoint(self, time, pairs)
        self._catchup_starts(time.ms)  # a checkpoint of the batch before the move is where the store starts
        if reader.is_cached:  # read whole to verify it (a restart): released with the RDD it feeds
            self._retired.setdefault(time.ms, []).append(reader)

    def release(self) -> None:
        super().release()  # the zero time's handle too
        if self._moved_handle is not None:
            self._moved_handle.unpersist(blocking=False)


class AutoRunningReduceNode(AutoStateNode, StoreRunningReduceNode):
    """``runningReduce(f)`` with its state picked by size (module docstring)."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 partitioner: Partitioner, local_dir: str | None, snapshot_every: int, auto_keys: int) -> None:
        StoreRunningReduceNode.__init__(self, graph, parent, func, partitioner, local_dir, snapshot_every)
        self._auto_init(auto_keys)

    def rdd_merge(self, time: BatchTime) -> Merge:
        return running_reduce_merge(self.func)


class AutoUpdateStateNode(AutoStateNode, StoreUpdateStateNode):
    """``updateStateByKey(updateFunc, ..., updateIdleKeys=False)`` with its state picked by size (module
    docstring): a key without new values keeps its state on either representation."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, update: Callable[[list[Any], Any], Any],
                 partitioner: Partitioner, initial: RDD | None, local_dir: str | None, snapshot_every: int,
                 auto_keys: int) -> None:
        StoreUpdateStateNode.__init__(self, graph, parent, update, partitioner, initial, False, local_dir,
                                      snapshot_every)
        self._auto_init(auto_keys)

    def describe_params(self) -> list[str]:
        return [*super().describe_params(), "updateIdleKeys=False"]

    def rdd_merge(self, time: BatchTime) -> Merge:
        return update_state_merge(keep_idle(for_batch(self.update, time.ms)))


def _plain_to_store(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """A :class:`~.state.TrackNode` entry ``(state, last_event_ms)`` in the store's (timers') layout."""
    return (entry[0], entry[1], {}, [], True, False)


def _store_to_plain(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    return (entry[0], entry[1])


class AutoTrackNode(AutoStateNode, StoreTrackNode):
    """``track(init, update, timeout, ...)``, every form, with its state picked by size (module docstring).

    On the RDD state it is :class:`~.timers.TimerTrackNode`'s merge with ``timers=`` or ``emit="updated"``, and
    plain ``track``'s lighter :class:`~.state.TrackNode` merge (entries ``(state, last_event_ms)``) without them;
    the store holds the timers' layout, so a plain ``track``'s entries are converted when the stream moves and
    in the checkpoints of its RDD state. Timeouts and timers apply in every batch, one without a batch RDD too
    (as on the store)."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, init: Callable[[Any, Any], Any],
                 update: Callable[[Any, Any, Any], Any], timeout: Duration, partitioner: Partitioner,
                 on_timer: Callable[[Any, Any, Timer], Any] | None, plain: bool, local_dir: str | None,
                 snapshot_every: int, auto_keys: int) -> None:
        StoreTrackNode.__init__(self, graph, parent, init, update, timeout, partitioner, on_timer, local_dir,
                                snapshot_every)
        #: TrackNode's layout on the RDD state (no timers, every live key emitted).
        self.plain = plain
        self._auto_init(auto_keys)

    def describe_params(self) -> list[str]:
        return [*StoreTrackNode.describe_params(self)[:2], *(["plain"] if self.plain else []),
                *super().describe_params()]

    def rdd_merge(self, time: BatchTime) -> Merge:
        if self.plain:
            return track_merge(self.init, self.update, time.ms, self.timeout.ms)
        return timer_track_merge(self, time)

    def store_entry(self, time_ms: int) -> Callable[[Any], Any] | None:
        return _plain_to_store if self.plain else None

    def touch_counter(self) -> TouchCounter:
        return track_touched(self.plain)

    def rdd_entry(self) -> Callable[[Any], Any] | None:
        return _store_to_plain if self.plain else None

    def changes(self, time: BatchTime) -> RDD | None:
        """What batch ``time`` wrote, as the store reports it (``emit="updated"`` and ``emitted()`` read it): on
        the RDD state, the entries the batch touched, emitted records with or dropped (timers' layout), or the
        keys with events (plain ``track``, whose dropped keys are gone)."""
        current = self.get_or_compute(time)
        if current is None or self.on_store(time.ms):
            return super().changes(time)
        if not self.plain:
            return current.filter(lambda kv: kv[1][-1] or kv[1][-3] or not kv[1][-2])
        now = time.ms
        return current.filter(lambda kv: kv[1][1] == now).mapValues(lambda e: (e[0], e[1], {}, [], True, True))


class AutoWindowNode(AutoStateNode, StoreWindowNode):
    """``reduceByKeyAndWindow(func, invFunc, window, slide, ...)`` updated incrementally (an inverse function and a
    window of at least 5 slides), with its state picked by size (module docstring): on the RDD state it is
    :class:`~.reduced_window.ReducedWindowNode`'s window (:func:`~.reduced_window.window_plan`), on the store
    :class:`~.store_window.StoreWindowNode`'s; both hold the window's reduce per key. The keys a slide touches
    are those of the batches entering and leaving the window."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 inv_func: Callable[[Any, Any], Any], window: Duration, slide: Duration, partitioner: Partitioner,
                 filter_func: Callable[[Any], bool] | None, local_dir: str | None, snapshot_every: int,
                 auto_keys: int) -> None:
        StoreWindowNode.__init__(self, graph, parent, func, inv_func, window, slide, partitioner, filter_func,
                                 local_dir, snapshot_every)
        self._auto_init(auto_keys)

    def describe_params(self) -> list[str]:
        return [f"window={self.window.ms}", "inverse", *super().describe_params()]

    def incremental(self) -> bool:
        """Always (as :meth:`ReducedWindowNode.incremental <.reduced_window.ReducedWindowNode.incremental>`): a
        window recomputed each slide keeps no state and is not picked by size."""
        return True

    def _rdd_compute(self, time: BatchTime) -> RDD | None:
        previous = self._rdd_previous(time)
        plan = window_plan(self, time, previous)
        if plan is None or isinstance(plan, RDD):
            return plan
        groups, merge = plan
        return self._counted_merge(time, groups, merge, 1 if previous is not None else 0)


class AutoSessionWindowNode(AutoStateNode, StoreSessionWindowNode):
    """``sessionWindow(gap, aggregate)`` with its state picked by size (module docstring): on the RDD state
    :class:`~.event_window.SessionWindowNode`'s merge, on the store
    :class:`~.store_event_window.StoreSessionWindowNode`'s; both hold per key ``(open sessions, emitted, late
    records)``. The keys a batch touches are those with records in it."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, gap: Duration, aggregate: Callable[[list[Any]], Any],
                 partitioner: Partitioner, local_dir: str | None, snapshot_every: int, auto_keys: int) -> None:
        StoreSessionWindowNode.__init__(self, graph, parent, gap, aggregate, partitioner, local_dir, snapshot_every)
        self._auto_init(auto_keys)

    def describe_params(self) -> list[str]:
        return [f"gap={self.gap.ms}", *super().describe_params()]

    def rdd_merge(self, time: BatchTime) -> Merge:
        return session_merge(session_step(self.gap.ms, self.aggregate, watermark_at(self, time)))

    def changes(self, time: BatchTime) -> RDD | None:
        """What batch ``time`` wrote, as far as the public streams read it: on the RDD state, the entries holding
        sessions it emitted or records it found late (each entry holds only its batch's)."""
        current = self.get_or_compute(time)
        if current is None or self.on_store(time.ms):
            return super().changes(time)
        return current.filter(lambda kv: kv[1][1] or kv[1][2])


class AutoEventWindowNode(AutoStateNode, StoreEventWindowNode):
    """``reduceByKeyAndEventWindow`` (both ``emit`` modes, with and without ``invFunc``) with its state picked by
    size (module docstring): on the RDD state :class:`~.event_window.EventWindowNode`'s merge, entries ``(panes or
    windows, carry, emitted)``; on the store :class:`~.store_event_window.StoreEventWindowNode`'s, whose entries
    also carry the window closed through (``jmax``) and the mode for the deadline index. An RDD entry of batch
    ``t`` gets ``t``'s ``jmax`` when it moves or is checkpointed: on the RDD state every key steps every batch, so
    every window through it is closed for every key. The keys a batch touches are those with records in it."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 inv_func: Callable[[Any, Any], Any] | None, window: Duration, slide: Duration, emit: str,
                 partitioner: Partitioner, local_dir: str | None, snapshot_every: int, auto_keys: int) -> None:
        StoreEventWindowNode.__init__(self, graph, parent, func, inv_func, window, slide, emit, partitioner,
                                      local_dir, snapshot_every)
        self._auto_init(auto_keys)

    def describe_params(self) -> list[str]:
        return [*StoreEventWindowNode.describe_params(self)[:-2], *super().describe_params()]

    def rdd_merge(self, time: BatchTime) -> Merge:
        return event_window_merge(self, time)

    def store_entry(self, time_ms: int) -> Callable[[Any], Any] | None:
        jmax = _closed_through(watermark_at(self, BatchTime(time_ms)), self.window.ms, self.slide.ms)
        mode = self.emit
        return lambda e: (e[0], e[1], e[2], jmax, mode)

    def rdd_entry(self) -> Callable[[Any], Any] | None:
        return lambda e: (e[0], e[1], e[2])

    def changes(self, time: BatchTime) -> RDD | None:
        """What batch ``time`` wrote, as far as the public stream reads it: on the RDD state, the entries holding
        windows it emitted (each entry holds only its batch's)."""
        current = self.get_or_compute(time)
        if current is None or self.on_store(time.ms):
            return super().changes(time)
        return current.filter(lambda kv: kv[1][2])


__all__ = ["TOUCH_RATIO", "WINDOW", "AutoRunningReduceNode", "AutoStateNode", "AutoTrackNode", "AutoUpdateStateNode",
           "AutoEventWindowNode", "AutoSessionWindowNode", "AutoWindowNode", "should_move", "typical_touched"]
