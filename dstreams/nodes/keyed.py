"""Stateful operators written once: one per-key step per operator, applied by either state backend.

The design is ``docs/internals/state-backends.md``. An operator is a :class:`KeyedOp`: how a batch is brought into
the state's partitioner (:meth:`KeyedOp.prepare`), grouped per key (:meth:`KeyedOp.group`), and its **per-key
step** (:meth:`KeyedOp.step`): ``(key, entry or None, the batch's values or None) -> new entry or None`` (dropped),
built once per batch with what the batch fixes (its time, its watermark). The batch's outputs are part of the new
entry; :meth:`KeyedOp.deadline` says when a key must be stepped again without values. Contract: a key stepped
without values before its deadline comes out unchanged, so a backend that steps every key and one that steps only
the keys with values and the due ones hold the same entries, batch by batch.

The two backends turn a step into a partition's work here and only here: :func:`rdd_partition` (the RDD state:
the previous partition whole, merged with the batch) and :func:`store_partition` (the executor store: the keys
with values and the due ones read, the changed ones written).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark import RDD
from pyspark.core.rdd import Partitioner

from ..spark import jvm
from ..statestore import Indexer, PartitionStore, key_bytes, value_bytes
from ..time import BatchTime, Duration

#: Which keys a batch steps: those with values; those and the due ones; every key of the state.
TOUCHED, DUE, ALL = "touched", "due", "all"

#: ``(key, entry or None, values or None) -> entry or None``.
KeyStep = Callable[[Any, Any, Any], Any]
#: ``entry -> (due at batch time ms, due at watermark ms)``, None for either: not due by that clock.
Deadline = Callable[[Any], tuple[int | None, int | None]]
#: A deadline by batch time that every batch meets: the key is stepped in the next batch (it holds outputs).
NEXT_BATCH = -1
#: What a batch does to one partition's store: (writes, the old values of the keys read).
StoreChanges = tuple[dict[bytes, bytes | None], dict[bytes, bytes]]


class KeyedOp:
    """One stateful operator's semantics (module docstring). Picklable: it travels in the stored graph.

    Subclasses give :attr:`kind`, :attr:`label`, :meth:`prepare` and :meth:`step`, and, as they need,
    :attr:`visits`, :meth:`group`, :meth:`deadline`, :meth:`apply` and the auto policy's hooks."""

    #: The node key's name after the backend's prefix (``RunningReduceNode``: ``StoreRunningReduceNode`` ...).
    kind = "KeyedNode"
    #: The operator's name (``runningReduce``).
    label = "state"
    #: Which keys a batch steps (:data:`TOUCHED`, :data:`DUE`, :data:`ALL`).
    visits = TOUCHED
    #: A window's slide, the interval of the state (None: the parent's), and its length, which the parent must
    #: remember on top of the state's remember duration (None: nothing more).
    state_slide: Duration | None = None
    parent_window: Duration | None = None

    def params(self) -> list[str]:
        """The operator's parameters in the graph fingerprint (before the backend's)."""
        return []

    def prepare(self, batch: RDD, partitioner: Partitioner) -> RDD:
        """The batch's records in ``partitioner`` (the only shuffle of a batch)."""
        raise NotImplementedError

    def batches(self, node: Any, time: BatchTime, skip_empty: bool = False) -> list[RDD] | None:
        """The prepared RDDs batch ``time`` applies, one segment each (None: nothing, the state stands). Default:
        the parent's batch through :meth:`prepare`; without one, none (deadlines and idle updates come due without
        records), or None for a :data:`TOUCHED` operator; with ``skip_empty`` (the RDD state, once there is one), None
        for a batch without partitions that touches no key (an empty folder listing, a catch-up's empty intervals: no
        Spark stage)."""
        batch = node.parent.get_or_compute(time)
        if batch is None:
            return [] if self.visits != TOUCHED else None
        if skip_empty and self.visits == TOUCHED and jvm.has_no_partitions(batch):
            return None
        return [self.prepare(batch, node.partitioner)]

    def group(self, segments: list[list[Any]]) -> dict[Any, Any]:
        """A partition's prepared records per key (default: one segment of ``(key, values)``)."""
        return dict(segments[0]) if segments else {}

    def grouper(self, node: Any, time: BatchTime) -> Callable[[list[list[Any]]], dict[Any, Any]]:
        """How batch ``time``'s segments are grouped (called on the driver; default :meth:`group`)."""
        return self.group

    def step(self, node: Any, time: BatchTime) -> KeyStep:
        """The per-key step of batch ``time`` (called on the driver, once per batch)."""
        raise NotImplementedError

    def deadline(self) -> Deadline | None:
        """The entries' deadlines (:data:`DUE` operators), or None."""
        return None

    def apply(self, step: KeyStep, entries: dict[Any, Any], batch: dict[Any, Any], keys: Iterable[Any]) -> None:
        """``step`` over ``keys``, in place on ``entries`` (the keys' current entries; a key absent has none).
        An operator may give a bulk form with the same result."""
        for k in keys:
            new = step(k, entries.get(k), batch.get(k))
            if new is None:
                entries.pop(k, None)
            else:
                entries[k] = new

    def indexer(self) -> Indexer | None:
        """The store's deadline index: :meth:`deadline` over stored entry bytes."""
        deadline = self.deadline()
        return None if deadline is None else lambda vb: deadline(pickle.loads(vb))

    # ------------------------------------------------------------------ the auto policy's hooks
    def to_store(self, node: Any, time_ms: int) -> Callable[[Any], Any] | None:
        """How an entry of the RDD state at ``time_ms`` becomes one of the store (None: the same layout)."""
        return None

    def from_store(self) -> Callable[[Any], Any] | None:
        """The inverse of :meth:`to_store` (a checkpoint of the RDD state read back)."""
        return None

    def touched(self, previous: list[Any], out: list[Any], keys: set[Any]) -> int:
        """The keys a batch touched on the RDD state, as the store would touch them (default: those with values)."""
        return len(keys)

    def rdd_changes(self, current: RDD, time: BatchTime) -> RDD | None:
        """What batch ``time`` wrote, read from the RDD state ``current`` as the public streams read the store's
        changes (None: compare with the state before)."""
        return None


def entry_records(field: int, record: Callable[[Any, Any], Any]) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """Partition function over the state or what a batch wrote (``changes``, ``(key, None)`` for a removed key):
    ``record(key, item)`` for each item of each entry's ``field`` (the outputs a batch put in its entries)."""

    def run(it: Iterable[Any]) -> Iterator[Any]:
        for k, entry in it:
            if entry is not None:
                for item in entry[field]:
                    yield record(k, item)

    return run


def rdd_partition(op: KeyedOp, step: KeyStep, previous: Iterable[Any], segments: list[list[Any]],
                  group: Callable[[list[list[Any]]], dict[Any, Any]] | None = None) -> list[Any]:
    """The RDD state's partition after a batch: ``previous`` (its pairs) with ``op``'s step applied to the keys with
    values (:data:`TOUCHED`) or to every key (the RDD state has no index: a key not due comes out unchanged); the
    batch's ``segments`` grouped by ``group`` (default ``op.group``)."""
    entries = dict(previous)
    batch = (group or op.group)(segments)
    keys: Iterable[Any] = batch if op.visits == TOUCHED else [*entries, *(k for k in batch if k not in entries)]
    op.apply(step, entries, batch, keys)
    return list(entries.items())


def store_partition(op: KeyedOp, step: KeyStep, store: PartitionStore, segments: list[list[Any]], now: int,
                    watermark: int | None, group: Callable[[list[list[Any]]], dict[Any, Any]] | None = None
                    ) -> StoreChanges:
    """What a batch does to one partition's store: ``op``'s step over the keys with values and the keys due at
    ``now``/``watermark`` (:data:`ALL`: every key, writing only those whose bytes change); returns the writes
    (None: delete) and the old values of the keys read."""
    batch = (group or op.group)(segments)
    kbs = {key_bytes(k): k for k in batch}
    if op.visits == ALL:
        old = dict(store.items())
        kbs.update((kb, pickle.loads(kb)) for kb in old if kb not in kbs)
    else:
        if op.visits == DUE:
            kbs.update((kb, pickle.loads(kb)) for kb in store.due_keys(now, watermark) if kb not in kbs)
        old = store.get_many(kbs)
    entries = {kbs[kb]: pickle.loads(vb) for kb, vb in old.items()}
    op.apply(step, entries, batch, list(kbs.values()))
    writes: dict[bytes, bytes | None] = {}
    for kb, k in kbs.items():
        if k in entries:
            vb = value_bytes(entries[k])
            if op.visits != ALL or vb != old.get(kb):
                writes[kb] = vb
        elif kb in old:
            writes[kb] = None
    return writes, old


__all__ = ["ALL", "DUE", "NEXT_BATCH", "TOUCHED", "Deadline", "KeyStep", "KeyedOp", "entry_records",
           "rdd_partition", "store_partition"]
