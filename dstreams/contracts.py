"""The small typed interfaces the engine defines and the recovery layer implements.

The engine (``dstreams/``) knows neither checkpoint stores nor the metadata log: it talks to them
only through these Protocols, which the runtime's wiring (:mod:`dstreams.recovery.runtime`, called by the
composition root :mod:`dstreams.api.driver`) fills in through constructors. Every implementation here is
optional: a context without a checkpoint location runs with a checkpointer writing to a temporary folder,
no journal, no fence.

* :class:`Checkpointer`: a stateful node's RDD is due for a data checkpoint (``mark``); after each
  batch the checkpointer may start writing (``batch_completed``); a restarted driver tells it what
  it restored (``resumed``); the engine tells it when a committed checkpoint has been adopted
  (``adopted``), on the event loop's thread; ``state_changelog(node_key)`` gives a store-backed state stream
  the :class:`StateChangelog` its tasks write each batch's changes to.
* :class:`BatchJournal`: the metadata log seen from the scheduler. ``batch_generated(t)`` runs
  after batch ``t``'s RDDs are built and before it runs (records its input offsets);
  ``batch_completed(t)`` after every batch up to ``t`` completed. Raising stops this driver.
* :class:`Fence`: ``check_owner()`` raises when another driver has taken over (fencing); sinks call
  it before they commit an output.
* :class:`WriteAheadLog`: where sources that cannot replay (a socket) write a block before using it.
* :class:`OutagePolicy`: which errors mean the store is unavailable, and how long to wait for it.
* :class:`ObjectStoreLocation`: an object store prefix a file source lists and its tasks read.
* :class:`CommitEvents` (the other way round): the engine's event loop as the checkpointer sees it, to post
  a committed checkpoint and to wait until the loop has handled what was posted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pyspark import RDD

from .errors import DStreamsError
from .time import BatchTime

if TYPE_CHECKING:
    from .events import Event
    from .node import DStreamNode

#: Called with a point name ("mid-batch", ...) where tests may inject a fault; a no-op in production.
FaultHook = Callable[[str], None]


class CommitEvents(Protocol):
    """The scheduler's event loop, as the checkpointer sees it (:class:`dstreams.events.EventLoop`)."""

    def post(self, event: Event) -> None: ...

    def wait_idle(self, timeout_s: float) -> bool: ...


class Checkpointer(Protocol):
    #: A stable identity of the checkpoint location (the same for every driver run on it).
    location: str

    def mark(self, node: DStreamNode, time: BatchTime, rdd: RDD) -> None:
        """``node``'s RDD at ``time`` falls on its checkpoint interval (called while it is generated).

        Marking the same node and time again replaces the RDD (a queued batch rebuilt on a newer
        checkpoint: the rebuilt RDD is the one its job computes and caches)."""
        ...

    def batch_completed(self, time: BatchTime) -> None:
        """Every batch up to ``time`` has completed: the marked RDDs up to it may be written."""
        ...

    def adopted(self, node: DStreamNode, time: BatchTime, built_through: int) -> None:
        """The engine now reads ``node``'s checkpoint at ``time``; batches up to ``built_through``
        were built on the older lineage (they may still need older checkpoints)."""
        ...

    def resumed(self, node: DStreamNode, restored_ms: int | None, existing: list[int]) -> None:
        """A restarted driver restored ``node`` from its checkpoint at ``restored_ms`` (None: none
        usable); ``existing`` are the node's checkpoints found in the store."""
        ...

    def state_changelog(self, node_key: str) -> StateChangelog:
        """Where the tasks of the store-backed state stream ``node_key`` write each batch's changes per partition,
        and read them back with the stream's checkpoints (picklable: shipped to the tasks)."""
        ...


class StateChangelog(Protocol):
    """Each batch's changes of each partition of one store-backed state stream, next to its checkpoints, so that a
    task can bring a partition's store to any version since the newest checkpoint on any host
    (:mod:`dstreams.nodes.store_state`). Called in tasks; every method may raise on a store error.

    * ``write(vid, version, partition, entries)``: the ``(key bytes, value bytes or None: deleted)`` that batch
      ``version`` wrote to ``partition`` in the history ``vid`` names (the driver run, and the batches dropped at or
      before ``version``: :meth:`dstreams.state_lineage.Lineage.vid`); written again identically by a retried task.
    * ``read(vid, version, partition)``: those entries; ``FileNotFoundError`` when none were written (or they were
      deleted: only versions after the stream's oldest kept checkpoint are kept).
    * ``checkpoint_state(time_ms, partition)``: the partition's ``(key bytes, value bytes)`` at the committed
      checkpoint of ``time_ms`` (its newest snapshot and the deltas after it).
    """

    def write(self, vid: str, version: int, partition: int, entries: list[tuple[bytes, bytes | None]]) -> None: ...

    def read(self, vid: str, version: int, partition: int) -> list[tuple[bytes, bytes | None]]: ...

    def checkpoint_state(self, time_ms: int, partition: int) -> Any: ...


class BatchJournal(Protocol):
    def batch_generated(self, time: BatchTime) -> None: ...

    def batch_completed(self, time: BatchTime) -> None: ...

    def batch_dropped(self, time: BatchTime, reason: str) -> None:
        """Record that batch ``time``'s input was dropped (before its completion is recorded)."""
        ...

    def checkpoint_committed(self, node_key: str, time_ms: int) -> None: ...

    def close(self) -> None:
        """Stop waiting for an unavailable store (a stop that is not graceful)."""
        ...


class Fence(Protocol):
    def check_owner(self) -> None: ...


class WriteAheadLog(Protocol):
    def write(self, key: str, records: list[Any]) -> str: ...

    def read(self, key: str) -> list[Any]: ...


class ObjectStore(Protocol):
    def list(self, prefix: str) -> list[str]: ...

    def get(self, key: str) -> bytes: ...


class ObjectStoreLocation(Protocol):
    """A picklable description of an object store prefix that any process (executors too) can open."""

    @property
    def url(self) -> str: ...  # read-only: a location is immutable (recovery's StoreSpec is a frozen dataclass)

    def open(self) -> ObjectStore: ...


class SourceNotCheckpointableError(DStreamsError):
    """Raised while serializing a source whose data lives only in this driver (``queueStream``): the
    graph cannot be stored in the checkpoint, and a restarted driver must rebuild it with ``setupFunc``."""


class InputNotRecordedError(DStreamsError, RuntimeError):
    """A source was asked to build again a batch it (or an earlier driver) fixed, whose offsets are no longer
    known: building it from new input would skip the input it had. Raised instead of losing data; it means
    that the engine's plan asked for a batch it should not need (a defect to report)."""


class SourceUnavailableError(DStreamsError):
    """A source's server (e.g. Redis) did not answer after the client's own retries.

    The driver rides it out like an unavailable store (:class:`OutagePolicy`): the batch being built or
    run waits and is tried again, within ``spark.dstreams.store.outageSeconds``.
    """


class OutagePolicy(Protocol):
    """How the scheduler rides out an unavailable store while it builds or runs a batch."""

    def is_outage(self, error: BaseException) -> bool:
        """Whether ``error`` means the store is unavailable (on the driver or inside a task)."""
        ...

    def retry_delay(self, error: BaseException, waited_s: float, what: str) -> float | None:
        """Seconds to wait before ``what`` is tried again after ``error``, or None to give up."""
        ...


class NoOutageRetry:
    """The outage policy of a runtime without one: every error propagates at once."""

    def is_outage(self, error: BaseException) -> bool:
        return False

    def retry_delay(self, error: BaseException, waited_s: float, what: str) -> float | None:
        return None


class NoFence:
    """The fence of a context without a metadata log: nobody else can take over."""

    def check_owner(self) -> None:
        return None


def no_fault(point: str) -> None:
    """The production fault hook: does nothing."""


#: The one format number of everything dstreams writes: in a checkpoint location, the metadata log's head
#: (``meta/head.json``), the stored graph (``meta/graph.pkl``), the data checkpoints' manifests and the header byte
#: of every encoded part (data checkpoints, the state changelog, the write-ahead log: :mod:`dstreams.recovery.codec`),
#: whose state snapshots are store files that carry it too (SQLite's ``user_version``); on an executor, the state
#: store's files (in their name, ``p-NNNNN.f<FORMAT>.sqlite``, and their ``user_version``: :mod:`dstreams.statestore`).
#: A checkpoint location (or an object in it) of another format is refused with
#: :class:`~dstreams.recovery.checkpoint_format.CheckpointFormatError`, which says what to do; a local store file of
#: another format is deleted and rebuilt from the checkpoint (it is a cache). Nothing reads another format (no
#: release has to stay readable): change the number with any change to what dstreams writes or how it is laid out.
#: 5: the checkpoint format (3: state lineage in manifests, changelog objects named by version ids) and the state
#: store's file format (4: the state keyed by the key's bytes) made one number, above both.
FORMAT = 5
