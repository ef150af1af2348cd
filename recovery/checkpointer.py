"""Data checkpoints of stateful streams into a store, written asynchronously, then the lineage cut.

Contract (the engine's ``dstreams.contracts.Checkpointer``):

* ``mark(node, t, rdd)`` is called while batch ``t`` is generated; nothing is written yet.
* After batch ``t`` completes, a single background writer thread runs one Spark job that writes
  every partition of the (cached) RDD from the executors, in parallel, to
  ``checkpoints/<node key>/<t>/part-NNNNN`` (versioned, checksummed: :mod:`.codec`), then the driver
  writes ``MANIFEST.json`` naming the parts and their checksums (and the checkpoint format): the commit
  point. Nothing reads a part that no manifest names. The batch that triggered the checkpoint does not wait
  for it.
* The writer thread only writes. On commit it posts :class:`~dstreams.events.CheckpointCommitted`
  to the scheduler's event loop, which replaces the node's RDD at ``t`` by one that reads the
  checkpoint (same partitioner, partition ``i`` from part ``i``; ``node.checkpoint_data.adopt``) and
  then calls :meth:`StoreCheckpointer.adopted`: later batches build on it, so lineage reaches back
  at most to the newest committed checkpoint. The metadata log records the newest checkpoint from there.
* The fence is checked before anything destructive, as the sinks do (:mod:`dstreams.files.sink`): before a write's tasks
  write its parts (they would replace the parts the new owner wrote for the same checkpoint), before its
  manifest, and before old checkpoints are deleted (the new owner may have restored from one). A driver that
  another one took over from (fencing) never commits, replaces or deletes a checkpoint, but for one paused
  between a check and the store call after it (no store here has a conditional delete).
* Old checkpoints of a node are deleted once two newer ones are committed *and* nothing the
  engine still holds can reach them: every batch built before the next checkpoint was adopted has
  completed, and the node's RDDs between the two checkpoints have left its remember window (a
  queued batch, or a cached partition lost with an executor, may otherwise need to re-read it);
  and a restart cannot need it: the next one is at or before the oldest of all nodes' newest
  checkpoints, where a restarted driver resumes every node from (:mod:`.resume`).
* A checkpoint at or before the one a restarted driver restored from is not written again.
* A store outage (:func:`~dstreams.recovery.outage.is_store_outage`: the store unavailable on the driver,
  or a task failure naming it) while a checkpoint is written: the whole write (parts, fence check,
  manifest: same keys, same bytes) is tried again under the driver's outage policy, the bound the
  scheduler and the journal use (``spark.dstreams.store.outageSeconds``). Later checkpoints queue behind
  it in the one writer thread and are written after it, oldest first. Past the bound the write is given
  up: its error is recorded and logged, the stream goes on, and its lineage is cut by the next checkpoint
  that commits. Any other error is recorded and logged at once (no retry), and the next checkpoint is
  tried. :meth:`StoreCheckpointer.close` ends a wait for the store at once.
* A recorded error is a :class:`CheckpointError`: text only (type, message cut at :data:`ERROR_TEXT`
  characters, whether it was an outage), so that no exception, traceback frame or RDD outlives the write.
  ``errors`` keeps the newest :data:`RECENT_ERRORS` of them, ``error_count`` counts every one.
* Two attempts of one task (speculation) write identical bytes under the same key: harmless.
* Every write that was started is reported once it ended, committed or not, as a :class:`CheckpointWrite`
  (node key, checkpoint time, duration including outage waits, error): kept in ``recent_writes`` (the newest
  :data:`RECENT_WRITES`) and passed to each observer registered with :meth:`StoreCheckpointer.add_write_observer`
  (the status server's ``dstreams_checkpoint_write_seconds``), on the writer thread. An observer must be quick;
  one that raises is logged and never affects the checkpoint.
"""

from __future__ import annotations

import json
import logging
import threading
import time as _time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import RDD, SparkContext
from pyspark.core.rdd import Partitioner

from dstreams import faults
from dstreams.contracts import (
    FORMAT,
    CommitEvents,
    FaultHook,
    Fence,
    NoFence,
    NoOutageRetry,
    OutagePolicy,
    no_fault,
)
from dstreams.events import CheckpointCommitted
from dstreams.records import consume
from dstreams.spark.partitioned import partition_aligned_rdd
from dstreams.time import BatchTime

from .changelog import StoreChangelog, delete_changelogs_through
from .checkpoint_files import (
    MANIFEST,
    checkpoint_prefix,
    list_checkpoints,
    load_manifest,
    part_keys,
    read_part,
    read_state_partition,
    state_chain,
    state_layers,
    verify_state_chain,
)
from .codec import decode_partition, encode_partition
from .outage import ride_out
from .storespec import StoreSpec

if TYPE_CHECKING:
    from dstreams.node import DStreamNode

log = logging.getLogger(__name__)

#: Kept importable from here (the checkpoint layout moved to :mod:`.checkpoint_files`).
__all__ = ["MANIFEST", "CheckpointError", "CheckpointWrite", "StoreCheckpointer", "StoreWriteAheadLog",
           "checkpoint_prefix", "list_checkpoints", "load_manifest", "reader_rdd", "verify_state_chain"]

KEEP_NEWER = 2
#: How many :class:`CheckpointWrite` records ``StoreCheckpointer.recent_writes`` keeps.
RECENT_WRITES = 100
#: How many :class:`CheckpointError` records ``StoreCheckpointer.errors`` keeps (the newest).
RECENT_ERRORS = 20
#: The longest error message a :class:`CheckpointError` keeps (a Spark task failure's text holds a Java trace).
ERROR_TEXT = 4000


@dataclass(frozen=True)
class CheckpointError:
    """A data-checkpoint write that was given up, as text: which checkpoint (``node_key``, ``time_ms``), the
    error's type name and message (at most :data:`ERROR_TEXT` characters), and whether it was a store outage
    (past the outage bound, or cut by ``close``). ``str()`` is ``"<type>: <message>"``."""

    node_key: str
    time_ms: int
    error_type: str
    message: str
    outage: bool

    @classmethod
    def of(cls, node_key: str, time_ms: int, error: BaseException, outage: bool) -> CheckpointError:
        message = str(error)
        if len(message) > ERROR_TEXT:
            message = message[:ERROR_TEXT] + f"... ({len(message) - ERROR_TEXT} more characters)"
        return cls(node_key, time_ms, type(error).__name__, message, outage)

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}"


@dataclass(frozen=True)
class CheckpointWrite:
    """One data-checkpoint write that ended: ``node_key`` and ``time_ms`` name the checkpoint, ``seconds`` is
    the time from the start of the write to its end (waits for an unavailable store included), ``error`` is
    None when the manifest was committed, else the error's text (the write was given up)."""

    node_key: str
    time_ms: int
    seconds: float
    error: str | None = None

    @property
    def committed(self) -> bool:
        return self.error is None


def _state_reader_rdd(sc: SparkContext, spec: StoreSpec, manifest: dict[str, Any],
                      partitioner: Partitioner | None) -> RDD:
    """The reader of a store-backed stream's checkpoint (:mod:`dstreams.nodes.store_state`): partition ``i`` is
    the state at the checkpoint's time as (key bytes, value bytes), rebuilt from the newest snapshot part of
    ``i`` on the checkpoint's chain and the delta parts after it. Lazy: nothing is read until iterated."""
    n = int(manifest["num_partitions"])
    layers = state_layers(spec.open(), manifest)

    def read(i: int) -> Iterable[Any]:
        return read_state_partition(spec, layers, i)

    if partitioner is not None and partitioner.numPartitions == n:
        return partition_aligned_rdd(sc, n, read)

    def consumed_then_read(i: int, it: Iterable[Any]) -> Iterable[Any]:
        consume(it)
        return read(i)

    return sc.parallelize(range(n), n).mapPartitionsWithIndex(consumed_then_read)


def reader_rdd(sc: SparkContext, spec: StoreSpec, prefix: str, manifest: dict[str, Any],
               partitioner: Partitioner | None) -> RDD:
    """An RDD whose partition ``i`` is part ``i`` of the checkpoint (keeping the partitioner)."""
    parts = {int(p["index"]): p for p in manifest["parts"]}
    n = int(manifest["num_partitions"])

    def read(i: int, it: Iterable[Any]) -> list[Any]:
        consume(it)  # the partition number: read it, or the Python worker is not reused
        return read_part(spec, prefix, parts[i])

    if "state" in manifest:
        return _state_reader_rdd(sc, spec, manifest, partitioner)
    if partitioner is not None and partitioner.numPartitions == n:
        return partition_aligned_rdd(sc, n, lambda i: read(i, ()))
    return sc.parallelize(range(n), n).mapPartitionsWithIndex(read)


class StoreCheckpointer:
    """Checkpoints stateful streams into ``spec``'s store (see the module docstring).

    :param events: the scheduler's event loop; committed checkpoints are posted there for adoption.
    :param fence: checked before each manifest is written (raises when another driver took over).
    :param outage: how long a write waits for an unavailable store (the composition root passes the
        policy the scheduler and the journal use); default :class:`~dstreams.contracts.NoOutageRetry`:
        a failed write is not retried.
    """

    def __init__(self, sc: SparkContext, spec: StoreSpec, events: CommitEvents, fence: Fence | None = None, *,
                 outage: OutagePolicy | None = None, fault_hook: FaultHook = no_fault) -> None:
        self.fault_hook = fault_hook
        self.sc = sc
        self.spec = spec
        #: The checkpoint location's identity (stable across driver runs; names executor state stores).
        self.location = spec.url
        self.store = spec.open()
        self.events = events
        self.fence: Fence = fence if fence is not None else NoFence()
        self.outage: OutagePolicy = outage if outage is not None else NoOutageRetry()
        self._pending: dict[int, list[tuple[DStreamNode, RDD]]] = defaultdict(list)
        #: Guards the bookkeeping below and ``_futures``; never held while a write runs or is waited for.
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="dstreams-checkpoint")
        #: Writes and deletions submitted and not yet seen done (appended from the event loop, read by ``flush``).
        self._futures: list[Future[None]] = []
        #: Set by ``close``: a write waiting for an unavailable store gives up.
        self._closed = threading.Event()
        #: The Spark job group of the write running now (cancelled by a ``close`` that does not wait).
        self._job_group: str | None = None
        #: Committed checkpoint times per node key, oldest first.
        self.committed: dict[str, list[int]] = defaultdict(list)
        #: (node key, checkpoint time) -> newest batch of the node built before it was adopted.
        self._built_through: dict[tuple[str, int], int] = {}
        #: (node key, checkpoint time) -> the checkpoints it builds on (a store-backed stream's deltas).
        self._chains: dict[tuple[str, int], list[int]] = {}
        self._nodes: dict[str, DStreamNode] = {}
        self._restored: dict[str, int] = {}
        self._completed_ms: int | None = None
        #: The newest failed writes (at most ``RECENT_ERRORS``, oldest first; appended on the writer thread).
        self.errors: list[CheckpointError] = []
        #: Every failed write so far.
        self.error_count = 0
        #: The newest writes that ended, oldest first (at most ``RECENT_WRITES``; appended on the writer thread).
        self.recent_writes: deque[CheckpointWrite] = deque(maxlen=RECENT_WRITES)
        self._write_observers: list[Callable[[CheckpointWrite], None]] = []

    def add_write_observer(self, observer: Callable[[CheckpointWrite], None]) -> None:
        """Call ``observer(write)`` for every write that ends from now on (on the writer thread)."""
        with self._lock:
            self._write_observers = [*self._write_observers, observer]

    def remove_write_observer(self, observer: Callable[[CheckpointWrite], None]) -> None:
        """Stop calling ``observer`` (no error if it is not registered)."""
        with self._lock:
            self._write_observers = [o for o in self._write_observers if o != observer]  # == : bound methods

    def _report_write(self, write: CheckpointWrite) -> None:
        self.recent_writes.append(write)
        for observer in self._write_observers:
            try:
                observer(write)
            except Exception:  # noqa: BLE001 - monitoring never affects a checkpoint
                log.warning("checkpoint write observer %r failed", observer, exc_info=True)

    def mark(self, node: DStreamNode, time: BatchTime, rdd: RDD) -> None:
        with self._lock:
            if time.ms <= self._restored.get(node.key, -1):
                return  # covered by the checkpoint this driver restored from
            entries = self._pending[time.ms]
            entries[:] = [(n, r) for n, r in entries if n is not node]
            entries.append((node, rdd))

    def resumed(self, node: DStreamNode, restored_ms: int | None, existing: list[int]) -> None:
        """A restarted driver restored ``node`` from its checkpoint at ``restored_ms`` (None: none).

        ``existing`` are the node's checkpoints found in the store: those up to the restored one
        join the committed ones (nothing of this run is built on them), so the deletion rule
        eventually removes them too; newer ones are written again as the batches are re-run.
        """
        chains: dict[int, list[int]] = {}
        for t in existing:
            if restored_ms is not None and t <= restored_ms:
                try:
                    chains[t] = state_chain(load_manifest(self.store, node.key, t))
                except Exception as e:  # noqa: BLE001 - unreadable: it cannot be read back either
                    log.debug("manifest of %s at %d not read: %s", node.key, t, e)
        with self._lock:
            self._nodes[node.key] = node
            if restored_ms is None:
                return
            for t, chain in chains.items():
                self._chains[(node.key, t)] = chain
            self._restored[node.key] = restored_ms
            older = {t for t in existing if t <= restored_ms}
            for t in older:
                self._built_through.setdefault((node.key, t), -1)
            times = self.committed[node.key]
            times[:] = sorted(set(times) | older)

    def state_changelog(self, node_key: str) -> StoreChangelog:
        return StoreChangelog(self.spec, node_key)

    def batch_completed(self, time: BatchTime) -> None:
        with self._lock:
            self._completed_ms = time.ms
            due = sorted(t for t in self._pending if t <= time.ms)
            work = [(t, node, rdd) for t in due for node, rdd in self._pending.pop(t)]
        for t, node, rdd in work:
            self._submit(self._write, node, t, rdd)
        self._queue_deletions()

    def _submit(self, fn: Any, *args: Any) -> None:
        """Queue ``fn(*args)`` on the writer thread; forget the futures that are done (under the lock)."""
        with self._lock:
            try:
                future = self._writer.submit(fn, *args)
            except RuntimeError:  # closed: the context is stopping
                log.debug("checkpointer closed: %s not started", getattr(fn, "__name__", fn))
                return
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)

    def _started(self) -> list[Future[None]]:
        """A snapshot of the submitted futures (waited on without the lock)."""
        with self._lock:
            return list(self._futures)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait for the checkpoints already started to be written and adopted (used in tests)."""
        for f in self._started():
            f.result(timeout=timeout_s)
        self.events.wait_idle(timeout_s)
        for f in self._started():  # the deletions the adoptions started
            f.result(timeout=timeout_s)

    def close(self, wait: bool = True) -> None:
        """Stop writing. A write waiting for an unavailable store gives up at once (its error recorded,
        nothing committed), so a stop is never held up by an outage. With ``wait``, the writes already
        queued still run (each tried once more, without waiting for the store) and are waited for;
        without, they are dropped and this returns at once."""
        self._writer.shutdown(wait=False, cancel_futures=not wait)  # first, or a dropped write could still start
        self._closed.set()
        group = self._job_group
        if not wait and group is not None:
            # A write's Spark job still running when the SparkContext stops next can leave the writer thread
            # blocked in the JVM call (and the interpreter waiting for it at exit): cancel it now.
            try:
                self.sc.cancelJobGroup(group)
            except Exception:  # noqa: BLE001 - the SparkContext may be stopping
                log.debug("could not cancel the checkpoint job %s", group, exc_info=True)
        if wait:
            self._writer.shutdown(wait=True)

    # ------------------------------------------------------------------ writing
    def _write(self, node: DStreamNode, t: int, rdd: RDD) -> None:
        """Write the checkpoint of ``node`` at ``t``, riding out a store outage (see the module docstring).

        Never raises: a checkpoint that is not written only delays the lineage cut; the stream goes on.
        """
        what = f"writing the checkpoint of {node.name} at {t}"
        started = _time.monotonic()
        try:
            ride_out(self.outage, what, lambda: self._write_checkpoint(node, t, rdd), self._closed)
        except BaseException as e:
            error = CheckpointError.of(node.key, t, e, self.outage.is_outage(e))
            with self._lock:
                self.error_count += 1
                self.errors = [*self.errors, error][-RECENT_ERRORS:]  # a new list: readers never see one change
            # Logged as text too: a log record keeps its arguments (a handler that holds records would keep the
            # exception, its traceback and through it the RDD).
            self._report_write(CheckpointWrite(node.key, t, _time.monotonic() - started, str(error)))
            if not error.outage:
                log.warning("checkpoint of %s at %d failed (the next one will be tried): %s", node.name, t, error)
            elif self._closed.is_set():
                log.warning("checkpoint of %s at %d not written: the checkpointer closed while the store was "
                            "unavailable (%s)", node.name, t, error)
            else:
                log.error("checkpoint of %s at %d not written: the store stayed unavailable past the outage bound "
                          "(%s); the stream goes on, its lineage is cut by the next checkpoint that commits",
                          node.name, t, error)
        else:
            self._report_write(CheckpointWrite(node.key, t, _time.monotonic() - started))

    def _write_checkpoint(self, node: DStreamNode, t: int, rdd: RDD) -> None:
        prefix = checkpoint_prefix(node.key, t)
        spec = self.spec

        def write(i: int, it: Iterable[Any]) -> list[dict[str, Any]]:
            records = list(it)
            keys = part_keys(records)  # a store-backed state's part: its keys, shown by the status page
            data, sha, count = encode_partition(records)
            del records
            key = f"part-{i:05d}"
            spec.open().put(f"{prefix}/{key}", data)
            entry = {"index": i, "key": key, "sha256": sha, "records": count, "bytes": len(data)}
            return [entry if keys is None else {**entry, "keys": keys}]

        data = node.checkpoint_data
        rdd, extra = data.export(t, rdd)
        self.fence.check_owner()  # before the tasks replace parts of the same checkpoint another driver wrote
        group = f"dstreams-checkpoint-{node.key}-{t}"
        self.sc.setJobGroup(group, f"checkpoint of {node.name} at {t}")
        faults.carry(self.sc)  # a test's task-side faults, to the checkpoint's tasks
        self._job_group = group
        try:
            parts = sorted(rdd.mapPartitionsWithIndex(write).collect(), key=lambda p: p["index"])
        finally:
            self._job_group = None
        partitioner = data.partitioner
        manifest = {
            "format": FORMAT,
            "node": node.key,
            "time_ms": t,
            "num_partitions": len(parts),
            "partitioned": partitioner is not None,
            "parts": parts,
            **extra,
        }
        self.fault_hook("checkpoint-write")
        self.fence.check_owner()
        self.store.put(f"{prefix}/{MANIFEST}", json.dumps(manifest, sort_keys=True).encode())
        with self._lock:
            self._chains[(node.key, t)] = state_chain(manifest)
        log.debug("checkpoint of %s at %d committed (%d parts)", node.name, t, len(parts))
        self.events.post(CheckpointCommitted(node, BatchTime(t), reader_rdd(self.sc, spec, prefix, manifest,
                                                                            partitioner)))

    def adopted(self, node: DStreamNode, time: BatchTime, built_through: int) -> None:
        """The engine adopted the checkpoint at ``time`` (on its event loop): it is committed for deletion's
        bookkeeping; batches up to ``built_through`` were built on the older lineage."""
        with self._lock:
            self._nodes[node.key] = node
            self._built_through[(node.key, time.ms)] = built_through
            times = self.committed[node.key]
            if time.ms not in times:
                times.append(time.ms)
                times.sort()
        self._queue_deletions()

    # ------------------------------------------------------------------ deleting
    def _deletable(self, node_key: str) -> bool:
        """Whether the oldest committed checkpoint of ``node_key`` may go (caller holds the lock).

        It may once it is obsolete (:meth:`_obsolete`) and so is every kept checkpoint that is a delta on it
        (a store-backed stream's chain goes as a whole, oldest first, once its newest delta is obsolete).
        """
        times = self.committed[node_key]
        if not self._obsolete(node_key, 0):
            return False
        return all(self._obsolete(node_key, j) for j in range(1, len(times))
                   if times[0] in self._chains.get((node_key, times[j]), ()))

    def _obsolete(self, node_key: str, j: int) -> bool:
        """Whether nothing but the checkpoints it builds on needs checkpoint ``j`` (by age) of ``node_key``: at least
        ``KEEP_NEWER`` newer ones are committed after its successor and the successor has taken over: every batch
        built on the older lineage has completed, and the node's RDDs before the successor have left its remember
        window."""
        times = self.committed[node_key]
        if len(times) - j <= KEEP_NEWER + 1 or self._completed_ms is None:
            return False
        successor = times[j + 1]
        # A restart resumes every stream from its newest checkpoint at or before the oldest of the streams'
        # newest ones (recovery.resume): that one stays until a newer one is at or before it too.
        common = min((ts[-1] for ts in self.committed.values() if ts), default=None)
        if common is not None and successor > common:
            return False
        built = self._built_through.get((node_key, successor))
        if built is None or self._completed_ms < built:
            return False
        node = self._nodes.get(node_key)
        remember = node.remember_duration.ms if node is not None and node.remember_duration else 0
        return self._completed_ms - remember >= successor

    def _queue_deletions(self) -> None:
        """Queue the deletion of the checkpoints deletable now, decided now.

        The deletion runs on the writer thread after the writes queued before it, and deletes only what
        was deletable when it was queued: every write that may still read those checkpoints (the batches
        built on their lineage have completed, so their writes are queued) runs first. Deciding when the
        deletion runs instead could remove a checkpoint that a write queued after it still reads.
        """
        doomed: list[tuple[str, int]] = []
        with self._lock:
            while True:
                key = next((k for k in self.committed if self._deletable(k)), None)
                if key is None:
                    break
                old = self.committed[key].pop(0)
                self._built_through.pop((key, old), None)
                self._chains.pop((key, old), None)
                doomed.append((key, old))
        if doomed:
            self._submit(self._delete, doomed)

    def _delete(self, doomed: list[tuple[str, int]]) -> None:
        try:
            self.fence.check_owner()
        except Exception as e:  # noqa: BLE001 - fenced, or the store is down: delete nothing
            log.warning("old checkpoints not deleted (%s): %s", ", ".join(f"{k} at {t}" for k, t in doomed),
                        f"{type(e).__name__}: {e}")
            return
        for key, old in doomed:
            prefix = checkpoint_prefix(key, old)
            try:
                # The manifest goes first: a half-deleted checkpoint is never trusted.
                self.store.delete(f"{prefix}/{MANIFEST}")
                for part in self.store.list(prefix + "/"):
                    self.store.delete(part)
                delete_changelogs_through(self.store, key, old)  # what only this checkpoint's lineage reads
            except Exception as e:
                log.warning("could not delete old checkpoint %s: %s", prefix, e)


class StoreWriteAheadLog:
    """Write-ahead log of driver-side input blocks (socket lines) in the checkpoint store.

    ``write(key, records)`` stores the block as ``<key>.<tag>`` and returns that name, which the metadata log
    records and ``read`` takes. ``tag`` is unique to the log object, that is to one driver: a driver that
    writes a block again (its batch built again) replaces its own, never another driver's. Without it a
    zombie still building batch ``t`` from its own socket would replace the lines the new owner recorded for
    ``t``, and a later replay of ``t`` would read the zombie's.
    """

    def __init__(self, store: Any, tag: str | None = None) -> None:
        self.store = store
        self.tag = tag or uuid.uuid4().hex[:12]

    def write(self, key: str, records: list[Any]) -> str:
        data, _, _ = encode_partition(records)
        name = f"{key}.{self.tag}"
        self.store.put(name, data)
        return name

    def read(self, key: str) -> list[Any]:
        return decode_partition(self.store.get(key), None, key)
