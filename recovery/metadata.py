"""The metadata log for master (driver) failover, fenced by compare-and-swap on one head object.

Layout in the checkpoint store:

* ``meta/head.json`` – the only mutable object: application name, graph fingerprint, batch
  duration, zero time, the owning driver's **epoch**, the input offsets of every batch not yet
  known to be outside the replay window (with, under their node keys, what other nodes fixed
  for the batch: an event-time stream's watermark record ``{"max", "wm", "prev"}``), the time
  through which every batch has completed, the newest committed data checkpoint of every
  stateful stream and per-source state (e.g. the files a folder source has consumed). Every
  update is a conditional write on the ETag this driver last wrote (``put_if_match``).
* ``meta/batches/<time>.json`` – an immutable record per batch (its offsets and epoch), written
  before the batch runs, for audit and debugging; ``meta/dropped/<time>.json`` – one per batch whose input
  was dropped (``spark.dstreams.batch.onFailure=dropInput``), with the failure. The head keeps the drops a
  restart may replay (``dropped``: time -> failure) and their count (``dropped_total``).

Fencing: a driver that starts on an existing log takes the next epoch by a conditional write of
the head. From then on, any commit of an older driver (paused, then resumed: a zombie) fails its
compare-and-swap and raises :class:`FencedError`; the zombie stops without committing metadata,
checkpoints or outputs. Stores without conditional writes cannot fence (all three backends here
have them: S3's ``If-Match``/``If-None-Match``, the local folder's lock, the memory store).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

from dstreams.contracts import FORMAT, FaultHook, no_fault
from dstreams.errors import DStreamsError

from .checkpoint_format import check_format
from .store import PreconditionFailed, Store

HEAD = "meta/head.json"
#: How many times a take-over reads the head again after the previous owner's commits won the race (each a CAS).
_TAKE_OVER_ATTEMPTS = 10


class FencedError(DStreamsError, RuntimeError):
    """Another driver has taken over this checkpoint location; this one must stop."""


class GraphChangedError(DStreamsError, ValueError):
    """The stream graph built by ``setupFunc`` differs from the one that wrote the checkpoint."""


class ForeignCheckpointError(DStreamsError, ValueError):
    """The checkpoint location holds another application's data, or something that is not a dstreams metadata log
    (a location written by dstreams in another checkpoint format raises
    :class:`~.checkpoint_format.CheckpointFormatError` instead)."""


def describe_graph_change(old: list[str], new: list[str]) -> str:
    lines = []
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else "(none)"
        b = new[i] if i < len(new) else "(none)"
        if a != b:
            lines.append(f"  node {i}: checkpoint has {a}, setupFunc built {b}")
    hint = state_store_hint(old, new)
    return "\n".join(lines[:20] + ([hint] if hint else []))


def _state_store_of(fingerprint: list[str]) -> str | None:
    """The ``spark.dstreams.state.store`` a graph's stateful streams were built under, where its fingerprint
    tells (its node keys name their classes: ``002-AutoRunningReduceNode[...]``)."""
    classes = {line.split("[", 1)[0].split("-", 1)[-1] for line in fingerprint}
    if any(c.startswith("Store") and c.endswith("Node") and c != "StoreStateNode" for c in classes):
        return "executor"
    if any(c.startswith("Auto") and c.endswith("Node") for c in classes):
        return "auto"
    if classes & {"RunningReduceNode", "UpdateStateNode", "TrackNode"}:  # auto builds runningReduce as Auto...
        return "rdd"
    return None


def state_store_hint(old: list[str], new: list[str]) -> str | None:
    """A line naming the setting to set back when the two graphs differ by ``spark.dstreams.state.store``."""
    was, now = _state_store_of(old), _state_store_of(new)
    if was is None or now is None or was == now:
        return None
    return (f"  the checkpoint's stateful streams were built with spark.dstreams.state.store={was}, this driver's "
            f"with {now} (the default is auto): set spark.dstreams.state.store={was} (or DSTREAMS_STATE_STORE={was}) "
            "to resume this checkpoint")


class MetadataLog:
    """The head object plus per-batch records; see the module docstring."""

    def __init__(self, store: Store, app_name: str, fingerprint: list[str], batch_ms: int, *,
                 fault_hook: FaultHook = no_fault) -> None:
        """``fingerprint``: the graph's (:meth:`dstreams.graph.DStreamGraph.fingerprint`), compared with the one a
        checkpoint's head holds; ``fault_hook``: called at the fault point ``after-metadata-commit`` (tests; the
        runtime passes :func:`dstreams.faults.reached`)."""
        self.fault_hook = fault_hook
        self.store = store
        self.app_name = app_name
        self.fingerprint = fingerprint
        self.batch_ms = batch_ms
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.head: dict[str, Any] = {}
        self._etag: str | None = None
        self._lock = threading.Lock()
        self.fenced = False

    # ------------------------------------------------------------------ reading
    @staticmethod
    def read(store: Store) -> dict[str, Any] | None:
        """The head of the log at ``store``, or None when there is none.

        Raises :class:`ForeignCheckpointError` when the object is not a dstreams metadata log and
        :class:`~.checkpoint_format.CheckpointFormatError` when it is one of another checkpoint format (every start
        with a checkpoint location reads the head first, so such a location is refused before anything else)."""
        try:
            raw = store.get(HEAD)
        except FileNotFoundError:
            return None
        return MetadataLog._parse(store, raw)

    @staticmethod
    def _parse(store: Store, raw: bytes) -> dict[str, Any]:
        """The head ``raw`` read from ``store``, checked as :meth:`read` says."""
        try:
            head = json.loads(raw)
        except ValueError:
            raise ForeignCheckpointError(
                f"{store.url}/{HEAD} is not a dstreams metadata log (not JSON): point the checkpoint at an "
                "empty location or at one written by this application"
            ) from None
        if not isinstance(head, dict) or "format" not in head or "app" not in head:
            raise ForeignCheckpointError(
                f"{store.url}/{HEAD} is not a dstreams metadata log (no format or application): point the checkpoint "
                f"at an empty location or at one written by this application ({str(head)[:200]})")
        check_format(head["format"], f"the checkpoint location {store.url} ({HEAD})")
        return head

    # ------------------------------------------------------------------ taking over
    def take_over(self, zero_ms: int) -> dict[str, Any] | None:
        """Become the owning driver. Returns the previous head (None for a fresh location).

        Raises :class:`ForeignCheckpointError` for another application's log,
        :class:`~.checkpoint_format.CheckpointFormatError` for a log of another checkpoint format,
        :class:`GraphChangedError` when the topology differs and :class:`FencedError` when another driver takes
        over at the same moment. A commit of the previous owner that lands between the read of the head and the
        conditional write (a zombie resumed in the middle of a commit it had checked: one frozen holding a local
        folder's lock, which this driver waited for) makes it start again from the newer head.
        """
        with self._lock:
            try:
                raw, etag = self.store.get_with_etag(HEAD)
            except FileNotFoundError:
                self.head = {
                    "format": FORMAT,
                    "app": self.app_name,
                    "fingerprint": self.fingerprint,
                    "batch_ms": self.batch_ms,
                    "zero_ms": zero_ms,
                    "epoch": 1,
                    "owner": self.owner,
                    "offsets": {},
                    "completed_through": None,
                    "checkpoints": {},
                    "sources": {},
                }
                data = self._encode()
                try:
                    self.store.put_if_absent(HEAD, data)
                except FileExistsError:
                    raise FencedError("another driver created this checkpoint location at the same moment") from None
                _, self._etag = self.store.get_with_etag(HEAD)
                return None
            for _ in range(_TAKE_OVER_ATTEMPTS):
                previous = self._parse(self.store, raw)
                self._check_compatible(previous)
                self.head = dict(previous, epoch=int(previous["epoch"]) + 1, owner=self.owner)
                try:
                    self._etag = self.store.put_if_match(HEAD, self._encode(), etag)
                    return previous
                except PreconditionFailed:
                    pass
                # The head changed since it was read. Under the same epoch, its owner committed meanwhile (a zombie
                # resumed in the middle of a commit it had checked, or a driver still running): take over from the
                # newer head. A new epoch is another driver's take-over.
                try:
                    raw, etag = self.store.get_with_etag(HEAD)
                except FileNotFoundError:
                    raise FencedError("another driver removed this checkpoint location's head meanwhile") from None
                if self._parse(self.store, raw).get("epoch") != previous.get("epoch"):
                    raise FencedError("another driver took over this checkpoint location at the same moment")
            raise FencedError(f"the previous owner of this checkpoint location committed {_TAKE_OVER_ATTEMPTS} times "
                              "while this driver was taking over: stop it first")

    def _check_compatible(self, previous: dict[str, Any]) -> None:
        """Raise when the head ``previous`` is another application's or another graph's (see :meth:`take_over`)."""
        if previous.get("app") != self.app_name:
            raise ForeignCheckpointError(
                f"the checkpoint at {self.store.url} belongs to application {previous.get('app')!r}, not "
                f"{self.app_name!r}: use another checkpoint location, or the same appName"
            )
        if previous.get("batch_ms") != self.batch_ms:
            raise GraphChangedError(
                f"the checkpoint was written with a batch duration of {previous.get('batch_ms')} ms; "
                f"this context uses {self.batch_ms} ms"
            )
        if previous.get("fingerprint") != self.fingerprint:
            raise GraphChangedError(
                "the stream graph built by setupFunc differs from the one in the checkpoint at "
                f"{self.store.url}:\n" + describe_graph_change(previous.get("fingerprint", []), self.fingerprint)
                + "\nrestore the original graph, or start from an empty checkpoint location"
            )

    # ------------------------------------------------------------------ committing
    def _encode(self) -> bytes:
        return json.dumps(self.head, sort_keys=True).encode()

    def commit(self, **updates: Any) -> None:
        """Apply ``updates`` to the head and write it conditionally (raises FencedError)."""
        self.update(lambda _head: updates)

    def update(self, changes: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Apply ``changes(head)`` to the head and write it conditionally (raises FencedError).

        ``changes`` is called under the log's lock with the current head and returns the fields to set: a
        read-modify-write of a field that two threads change (the per-batch offsets: added by the generator,
        pruned by the runner) sees the other's last commit, so neither drops what the other wrote.
        """
        with self._lock:
            if self.fenced:
                raise FencedError(self._fenced_message())
            new = dict(self.head)
            new.update(changes(self.head))
            old, self.head = self.head, new
            try:
                assert self._etag is not None
                self._etag = self.store.put_if_match(HEAD, self._encode(), self._etag)
                self.fault_hook("after-metadata-commit")
            except PreconditionFailed:
                self.head = old
                self.fenced = True
                raise FencedError(self._fenced_message()) from None
            except BaseException:
                self.head = old
                raise

    def _fenced_message(self) -> str:
        current = None
        try:
            current = self.read(self.store)
        except Exception:
            pass
        who = f" (now epoch {current.get('epoch')}, owner {current.get('owner')})" if current else ""
        return (f"this driver (epoch {self.head.get('epoch')}) has been replaced by another driver{who}: "
                "it stops without committing anything more")

    def check_owner(self) -> None:
        """Raise FencedError if another driver has taken over (a read; used before sink commits)."""
        current = self.read(self.store)
        if current is None or current.get("epoch") != self.head.get("epoch") or current.get("owner") != self.owner:
            with self._lock:
                self.fenced = True
            raise FencedError(self._fenced_message())

    def record_drop(self, time_ms: int, reason: str) -> None:
        record = {"time_ms": time_ms, "epoch": self.head.get("epoch"), "reason": reason}
        self.store.put(f"meta/dropped/{time_ms:015d}.json", json.dumps(record, sort_keys=True).encode())

    def record_batch(self, time_ms: int, offsets: dict[str, Any]) -> None:
        record = {"time_ms": time_ms, "epoch": self.head.get("epoch"), "offsets": offsets}
        self.store.put(f"meta/batches/{time_ms:015d}.json", json.dumps(record, sort_keys=True).encode())
