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

Dead letters (``saveToStore(..., onError="deadLetter")``): a record the format cannot encode (``pickle`` refuses it,
its ``str`` raises, a circular structure for ``json``) is left out of its part and written, in the same batch folder,
to ``_dead-letters-NNNNN.jsonl`` (one JSON line per record: ``output, batch_ms, part, row, record`` as its ``repr``,
``error``). The leading underscore hides it from readers of ``part-*`` as ``_SUCCESS`` is; it is written by the same
task and committed by the same marker, so it is exactly once like the parts. A partition is first encoded whole;
only when that raises are its records encoded one by one (no cost when nothing is refused). Without it such a
record fails the task, and then the batch, with an error naming the way past it.

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
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark import RDD

from dstreams import faults
from dstreams.errors import failed_in_jvm_with
from dstreams.output_records import add_written
from dstreams.pickling import dumps
from dstreams.recovery.store import is_store_url, local_path
from dstreams.recovery.storespec import StoreSpec

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
        if not failed_in_jvm_with(e, "FileAlreadyExistsException"):
            raise
        add_written(0)  # a concurrent attempt of the same batch wrote it
        return False
    add_written(written)
    return True


def _text(records: Iterable[Any]) -> bytes:
    return "".join(f"{x}\n" for x in records).encode("utf-8")


def _json_lines(records: Iterable[Any]) -> bytes:
    return "".join(json.dumps(x, sort_keys=True, default=str) + "\n" for x in records).encode("utf-8")


def _pickled(records: Iterable[Any]) -> bytes:
    return dumps(list(records))  # cloudpickle for what pickle cannot (dstreams.pickling)


def dead_letters_key(i: int) -> str:
    """The object of partition ``i``'s dead letters in a batch folder."""
    return f"_dead-letters-{i:05d}.jsonl"


def encode_or_route(encode: Callable[[Iterable[Any]], bytes], records: list[Any], output: str, batch_ms: int,
                    part: int) -> tuple[bytes, bytes | None, int]:
    """A partition's part object, its dead letters' object (None: none) and the records in the part: the whole
    partition encoded at once, else record by record with the refused ones routed (module docstring)."""
    try:
        return encode(records), None, len(records)
    except Exception:  # noqa: BLE001 - find the records that fail, one by one
        pass
    good: list[Any] = []
    dead: list[str] = []
    for row, x in enumerate(records):
        try:
            encode([x])
        except Exception as e:  # noqa: BLE001 - the record goes to the dead letters
            try:
                shown = repr(x)
            except Exception:  # noqa: BLE001 - a repr that raises too
                shown = f"<{type(x).__name__} whose repr raises>"
            dead.append(json.dumps({"output": output, "batch_ms": batch_ms, "part": part, "row": row,
                                    "record": shown[:65536], "error": f"{type(e).__name__}: {e}"[:2000]}))
            continue
        good.append(x)
    return encode(good), "".join(line + "\n" for line in dead).encode("utf-8"), len(good)


def _refuses(encode: Callable[[Iterable[Any]], bytes], x: Any) -> bool:
    try:
        encode([x])
    except Exception:  # noqa: BLE001 - a probe
        return True
    return False


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
                               store_options: dict[str, Any] | None = None, format: str = "text",
                               dead_letters: tuple[str, int] | None = None) -> bool:
    """Write ``rdd`` under the store ``location`` once, as ``part-NNNNN[.ext]`` objects and a ``_SUCCESS`` marker.

    Each task writes its partition's object (a speculative or retried attempt, or a re-run of the batch,
    writes the same records under the same key); the driver writes ``_SUCCESS`` after every part, so a
    reader that sees the marker sees the whole batch. Returns False (and writes nothing) when ``location``
    is already committed, and False when another writer committed it while this one wrote. ``guard``
    raises when this driver is fenced off: called before the first part is written and again before
    leftovers of a cut-off write (keys this write does not produce) are deleted and ``_SUCCESS`` is written.
    ``dead_letters`` (the output's name and the batch's ms) routes the records the format refuses (module
    docstring); without it they fail the task.
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

    def write(i: int, it: Iterable[Any]) -> list[tuple[int, bool]]:
        records = list(it)
        dead: bytes | None = None
        if dead_letters is not None:
            data, dead, n = encode_or_route(encode, records, dead_letters[0], dead_letters[1], i)
            if dead is not None:
                spec.open().put(dead_letters_key(i), dead)
        else:
            try:
                data, n = encode(records), len(records)
            except Exception as e:
                raise refused(e, i, records) from e
        spec.open().put(f"part-{i:05d}{ext}", data)
        return [(n, dead is not None)]

    def refused(e: Exception, i: int, records: list[Any]) -> Exception:
        row = next((r for r, x in enumerate(records) if _refuses(encode, x)), None)
        where = f"record {row} ({records[row]!r:.200})" if row is not None else "its records together"
        return ValueError(f"saveToStore: partition {i}, {where}: the {format!r} format cannot encode it "
                          f"({type(e).__name__}: {e}); saveToStore(..., onError='deadLetter') writes such records "
                          f"to {dead_letters_key(i)} in the batch's folder instead and goes on")

    parts = rdd.mapPartitionsWithIndex(write).collect()
    written = sum(n for n, _ in parts)
    if guard is not None:
        guard()
    ours = {f"part-{i:05d}{ext}" for i in range(rdd.getNumPartitions())}
    ours |= {dead_letters_key(i) for i, (_, dead) in enumerate(parts) if dead}
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
