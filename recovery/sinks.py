"""Exactly-once text output per batch: a batch's output is a folder committed by a ``_SUCCESS`` marker.

Contract of :func:`save_text_exactly_once`: the records of ``rdd`` end up, once, in the folder
``path``; a folder that already has its ``_SUCCESS`` marker is left alone (a re-run of a batch
after a failure, whose deterministic content is the same); anything else at ``path`` (a write cut off
half-way) is replaced. Readers must ignore folders without ``_SUCCESS``.

* Local paths: ``rdd.saveAsTextFile`` writes into a private staging folder, ``<parent>/.dstreams-staging/
  <name>.<32 hex digits>`` (Hadoop's commit protocol writes its ``_SUCCESS`` last; the leading dot hides
  it from Hadoop's readers and from anything that looks for ``<name>``), and the driver commits it with
  one ``os.rename`` onto ``path``: a folder appears at ``path`` whole, marker included.
* Other Hadoop URLs (``hdfs://``...): ``rdd.saveAsTextFile(path)`` directly (no leftovers are removed).
* ``s3://`` and other store URLs: :func:`save_to_store_exactly_once` with the text encoding.

:func:`save_to_store_exactly_once` is the same protocol for any store location (local folder or
``s3://``) with a choice of encoding (:data:`FORMATS`): the sink behind ``DStream.saveToStore``. Each task
writes its part object ``part-NNNNN[.ext]`` (two attempts of one task write identical bytes under the same
key), then the driver writes ``_SUCCESS``.

Both report the records of a write they commit to :func:`dstreams.output_records.add_written` (the batch's
``OutputOperationInfo.records_written``): counted per partition by the one task result Spark keeps of it.

Fencing (a driver that another one took over from: a zombie)
------------------------------------------------------------

``guard()`` raises (``FencedError``) when this driver has been fenced off. It is called twice per write, and
both sinks call it **before anything destructive**: before the first write that may replace an object (a
part) or remove one (a leftover), and again right before the commit. It is one read of the metadata head
(``MetadataLog.check_owner``): a GET of a small object, cheap next to the write itself, so twice is fine.
A zombie still running batch ``t`` while the new owner writes and commits ``t`` therefore stops at its
first check if the takeover came before it. What remains is a zombie paused between a check and the
action that follows it (a GC pause, a frozen VM, SIGSTOP); each sink is built so that this window can
damage nothing the stores let us protect:

* **Local folders** have an atomic rename, which refuses a non-empty target. The write goes to a private
  staging folder; the commit renames it onto ``path``. Once anyone committed ``path``, every other rename
  fails and that writer returns False: a zombie can neither replace nor remove a committed folder, at any
  moment. Something at ``path`` without ``_SUCCESS`` (written by an older version, or by hand) is moved
  away to the staging area with one rename, and removed only if what was moved has no ``_SUCCESS`` (if
  someone committed meanwhile, it is renamed back: for that instant a reader finds no folder, and nothing
  committed is lost). The only deletions are of a writer's own staging folder and of staging folders left
  by writers of the same batch that died (removed by the writer that commits it, after its commit). No race
  that loses or damages committed output remains on this path.
* **Object stores** have no rename and no delete that can be made conditional on anything (put-if-absent
  and put-if-match exist, and the commit uses the first; a fence lives in another object), so they cannot
  fence a zombie's delete themselves, and the sink avoids deleting. A re-run of the
  same deterministic batch writes the same records to the same part keys, so parts are overwritten in
  place, never deleted first: a zombie's overwrite of a part the owner committed puts back the same
  partition of the same batch. Only keys this write does not produce (parts beyond its partition count,
  or of another format: leftovers of a write cut off under another configuration) are deleted, after the
  second check and after a fresh look for ``_SUCCESS`` (if another driver committed meanwhile, nothing is
  deleted and the write returns False). ``_SUCCESS`` itself is written with put-if-absent: the first
  writer commits, later ones return False. The race that remains: a zombie paused between that look for
  ``_SUCCESS`` and its deletes (milliseconds), during which the new owner takes over and commits ``t``
  with *more* partitions (or another format) than the zombie's write: the zombie's deletes then remove
  owner's parts beyond its own count. That needs a changed configuration (partition count) between the
  two drivers on top of the pause at that moment; closing it needs a conditional delete the stores do
  not offer, or a layout where ``_SUCCESS`` names the parts (readers of ``part-*`` would have to change).
  The same holds for the overwrites between the first check and each task's put (the length of the
  write job): harmless unless the two drivers partition ``t`` differently or the user's functions are
  not deterministic.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark import RDD

from dstreams.output_records import add_written

from . import faults
from .store import is_store_url, local_path
from .storespec import StoreSpec

SUCCESS = "_SUCCESS"


def save_text_exactly_once(rdd: RDD, path: str, guard: Callable[[], None] | None = None,
                           store_options: dict[str, Any] | None = None) -> bool:
    """Write ``rdd`` as text under ``path`` once; returns False when it was already committed (by an earlier
    run, or by another driver while this write ran). ``guard`` raises when this driver is fenced off; it is
    called before anything is written or removed, and before the commit (see the module docstring)."""
    if is_store_url(path):
        return save_to_store_exactly_once(rdd, path, guard, store_options, "text")
    local = local_path(path)
    if local is None:
        return _save_hadoop(rdd, path, guard)
    if _committed(local):
        add_written(0)
        return False
    if guard is not None:
        guard()
    faults.reached("sink-write")
    local = os.path.abspath(local)
    staging = os.path.join(os.path.dirname(local), STAGING)
    os.makedirs(staging, exist_ok=True)
    temp = os.path.join(staging, f"{os.path.basename(local)}.{uuid.uuid4().hex}")
    try:
        written = _save_counted(rdd, temp)
        if guard is not None:
            guard()
        committed = _rename_into(temp, local)
    finally:
        shutil.rmtree(temp, ignore_errors=True)  # ours: gone already when the commit renamed it
    if not committed:
        add_written(0)  # another writer of this batch committed it first
        return False
    _remove_dead_stagings(staging, os.path.basename(local))
    add_written(written)
    return True


#: The hidden folder next to a local output where writes are staged before their commit (a rename).
STAGING = ".dstreams-staging"


def _committed(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, SUCCESS))


def _save_counted(rdd: RDD, path: str) -> int:
    """``rdd.saveAsTextFile(path)``; returns the records written."""
    written = rdd.context.accumulator(0)

    def count(it: Iterable[Any]) -> Iterator[Any]:
        n = 0
        for x in it:
            n += 1
            yield x
        written.add(n)  # in the save's result tasks: Spark applies one successful attempt per partition

    rdd.mapPartitions(count, preservesPartitioning=True).saveAsTextFile(path)
    return int(written.value)


#: What ``os.rename`` of a folder raises when something is at the target (a non-empty folder, a file).
_TARGET_IN_THE_WAY = frozenset({errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR})


def _rename_into(temp: str, path: str) -> bool:
    """Commit the complete folder ``temp`` as ``path`` with one rename. False when ``path`` is committed by
    someone else; anything uncommitted at ``path`` is moved away first (never a committed folder)."""
    for _ in range(3):
        try:
            os.rename(temp, path)  # atomic; refused when path is a non-empty folder
            return True
        except OSError as e:
            if _committed(path):
                return False
            if e.errno not in _TARGET_IN_THE_WAY:
                if not os.path.exists(temp):
                    raise RuntimeError(
                        f"the staged output {temp} disappeared before it was committed to {path}, which nobody "
                        "committed either: another process removed it (is something cleaning that folder?); "
                        "the batch fails and is written again when it is retried"
                    ) from e
                raise
            _discard_uncommitted(path, os.path.dirname(temp))
    raise RuntimeError(f"could not commit {temp} as {path}: something keeps re-creating {path} without a "
                       f"{SUCCESS} marker; stop whatever else writes there")


def _discard_uncommitted(path: str, staging: str) -> None:
    """Remove what is at ``path`` unless it is committed: moved away with one rename first, then looked at
    (a folder committed between the caller's check and the move is renamed back, not removed)."""
    moved = os.path.join(staging, f"{os.path.basename(path)}.{uuid.uuid4().hex}.discarded")
    try:
        os.rename(path, moved)
    except FileNotFoundError:
        return  # gone meanwhile
    if _committed(moved):
        try:
            os.rename(moved, path)  # someone committed it meanwhile: put it back
            return
        except OSError:
            pass  # and committed it again since: that copy stays, this duplicate goes
    _remove(moved)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _remove_dead_stagings(staging: str, name: str) -> None:
    """After ``name`` was committed: remove what other writers of it staged and left (they died before their
    commit; one still writing fails its save or its rename and returns False, as the batch is committed)."""
    mine = re.compile(re.escape(name) + r"\.[0-9a-f]{32}(\.discarded)?")
    try:
        entries = os.listdir(staging)
    except FileNotFoundError:
        return
    for entry in entries:
        if mine.fullmatch(entry):
            _remove(os.path.join(staging, entry))


def _save_hadoop(rdd: RDD, path: str, guard: Callable[[], None] | None) -> bool:
    """A Hadoop URL other than a local path: Hadoop's own commit protocol, nothing removed."""
    if guard is not None:
        guard()
    try:
        written = _save_counted(rdd, path)
    except Exception as e:
        # Another writer touched the folder since the check: a driver that took over (then this one is
        # fenced, and that is the error to report: its write lost a race it had no business running)
        # or a concurrent attempt of the same deterministic batch.
        if guard is not None:
            guard()
        if "FileAlreadyExistsException" not in str(e):
            raise
        add_written(0)  # a concurrent attempt of the same batch wrote it
        return False
    add_written(written)
    return True


class _Counted:
    """The records of ``it``, once, counting them in ``n`` as they go by."""

    def __init__(self, it: Iterable[Any]) -> None:
        self._it = it
        self.n = 0

    def __iter__(self) -> Iterator[Any]:
        for x in self._it:
            self.n += 1
            yield x


def _text(records: Iterable[Any]) -> bytes:
    return "".join(f"{x}\n" for x in records).encode("utf-8")


def _json_lines(records: Iterable[Any]) -> bytes:
    return "".join(json.dumps(x, sort_keys=True, default=str) + "\n" for x in records).encode("utf-8")


def _pickled(records: Iterable[Any]) -> bytes:
    return pickle.dumps(list(records), protocol=pickle.HIGHEST_PROTOCOL)


#: Encodings of a part object: name -> (encoder of a partition's records, file extension).
FORMATS: dict[str, tuple[Callable[[Iterable[Any]], bytes], str]] = {
    "text": (_text, ""),
    "json": (_json_lines, ".jsonl"),
    "pickle": (_pickled, ".pickle"),
}


def sink_store_options(location: str, explicit: dict[str, Any], checkpoint_dir: str | None,
                       checkpoint_options: dict[str, Any]) -> dict[str, Any]:
    """The store options a sink writing to ``location`` uses: ``explicit`` ones when given, else the
    checkpoint store's when both are object stores (same endpoint and credentials), else none (boto3's
    standard chain)."""
    if explicit:
        return explicit
    if is_store_url(location) and is_store_url(checkpoint_dir):
        return dict(checkpoint_options)
    return {}


def save_to_store_exactly_once(rdd: RDD, location: str, guard: Callable[[], None] | None = None,
                               store_options: dict[str, Any] | None = None, format: str = "text") -> bool:
    """Write ``rdd`` under the store ``location`` once, as ``part-NNNNN[.ext]`` objects and a ``_SUCCESS`` marker.

    Each task writes its partition's object (a speculative or retried attempt, or a re-run of the batch,
    writes the same records under the same key); the driver writes ``_SUCCESS`` after every part, so a
    reader that sees the marker sees the whole batch. Returns False (and writes nothing) when ``location``
    is already committed, and False when another writer committed it while this one wrote. ``guard``
    raises when this driver is fenced off: called before the first part is written and again before
    leftovers of a cut-off write (keys this write does not produce) are deleted and ``_SUCCESS`` is written.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown output format {format!r}: choose one of {sorted(FORMATS)}")
    encode, ext = FORMATS[format]
    spec = StoreSpec(location.rstrip("/"), dict(store_options or {}))
    store = spec.open()
    if store.exists(SUCCESS):
        add_written(0)
        return False
    if guard is not None:
        guard()
    faults.reached("sink-write")

    def write(i: int, it: Iterable[Any]) -> list[int]:
        records = _Counted(it)
        spec.open().put(f"part-{i:05d}{ext}", encode(records))
        return [records.n]

    written = sum(rdd.mapPartitionsWithIndex(write).collect())
    if guard is not None:
        guard()
    ours = {f"part-{i:05d}{ext}" for i in range(rdd.getNumPartitions())}
    leftovers = [key for key in store.list("") if key != SUCCESS and key not in ours]
    if leftovers:  # of a write cut off with more partitions or another format
        if store.exists(SUCCESS):  # another driver committed the batch meanwhile: not ours to delete
            add_written(0)
            return False
        for key in leftovers:
            store.delete(key)
    try:
        store.put_if_absent(SUCCESS, b"")
    except FileExistsError:
        add_written(0)  # another writer of this batch committed it first
        return False
    add_written(written)
    return True
