"""Folder sources: ``textFileStream`` and ``binaryRecordsStream``, on a local folder or an S3 prefix.

Contract: files present when the context starts are ignored (new files only, as in Spark); at
each batch the folder is listed and every file not seen before goes into that batch and no other
(each file in exactly one batch). Names starting with ``.`` or ``_`` are skipped (files being
written should be moved in atomically; for S3 keys any path component counts, and an object
appears whole once its upload completes). The batch's file list is its replayable offset.

What the source remembers between batches (and across a driver restart, in the metadata log) is the
set of files in the folder's last listing: a file deleted from the folder is forgotten, so the state is
bounded by the number of files the folder holds. Delete or move processed files to keep it small.

**At most N files per batch** (``maxFilesPerBatch``, else :data:`~dstreams.config.FILES_MAX_FILES_PER_BATCH`):
a batch takes the first N new files in listing order (sorted paths or keys) and the others wait. A
waiting file is simply not remembered as seen, so the next listing finds it new again: it goes into a
later batch, in listing order with the files that arrived since, and into no other. The remembered set
is recorded with every batch's offsets, so a restarted driver rebuilds the batches it replays from their
recorded files and takes the waiting files afterwards. The batch's metrics metadata then holds
``maxFilesPerBatch``, ``files`` (taken) and ``filesWaiting``.

Locations: a local path (read by Spark's ``textFile``/``binaryRecords``) or a store URL
``s3://bucket/prefix/`` (listed by the driver, each object read by an executor through the store layer
with its retries; endpoint and credentials from boto3's standard chain or ``storeOptions``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from .. import config
from ..contracts import ObjectStoreLocation
from ..time import BatchTime
from .input import InputNode

if TYPE_CHECKING:
    from ..graph import DStreamGraph

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
#: At most this many objects per partition when reading a store prefix (more objects: fewer tasks).
_MAX_PARTITIONS = 64


def _visible(name: str) -> bool:
    """False when any path component starts with ``.`` or ``_`` (temporary or hidden, as in Hadoop)."""
    return not any(part.startswith((".", "_")) for part in name.strip("/").split("/"))


def split_lines(data: bytes) -> list[str]:
    """Lines of a text object as Spark's ``textFile`` reads them (``\\n``, ``\\r\\n`` or ``\\r``; UTF-8)."""
    lines = _LINE_BREAK.split(data)
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.decode("utf-8", errors="replace") for line in lines]


def _read_objects(spec: Any, record_length: int | None, keys: Iterator[str]) -> Iterator[Any]:
    """Executor side: the records of the objects ``keys`` of the store ``spec``."""
    store = spec.open()
    for key in keys:
        try:
            data = store.get(key)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{spec.url.rstrip('/')}/{key} was listed for this batch but is gone: files of a file stream "
                "must stay until their batch has run") from None
        if record_length is None:
            yield from split_lines(data)
        else:
            if len(data) % record_length:
                raise ValueError(f"{spec.url.rstrip('/')}/{key} holds {len(data)} bytes, not a multiple of "
                                 f"recordLength={record_length}")
            for i in range(0, len(data), record_length):
                yield data[i:i + record_length]


class FileInputNode(InputNode):
    """A folder source. ``store`` (an :class:`~dstreams.contracts.ObjectStoreLocation`) reads an object
    store prefix instead of the local folder ``directory``; the api layer opens it for store URLs.
    ``max_files_per_batch`` bounds the new files of a batch (None: the conf's setting, else unbounded)."""

    #: The argument; a class default so that a graph checkpointed before it existed still loads.
    max_files_per_batch: int | None = None
    #: The bound in force, resolved at ``start()``.
    _files_limit: int | None = None

    def __init__(self, graph: DStreamGraph, directory: str, record_length: int | None = None,
                 store: ObjectStoreLocation | None = None, max_files_per_batch: int | None = None) -> None:
        super().__init__(graph)
        if record_length is not None and record_length <= 0:
            raise ValueError(f"recordLength must be positive, got {record_length}")
        if not directory:
            raise ValueError("the directory of a file stream must be a non-empty path or s3:// URL")
        if max_files_per_batch is not None and (
                isinstance(max_files_per_batch, bool) or not isinstance(max_files_per_batch, int)
                or max_files_per_batch < 1):
            raise ValueError(f"maxFilesPerBatch must be a positive int or None, got {max_files_per_batch!r}")
        self.directory = directory
        self.record_length = record_length
        self.max_files_per_batch = max_files_per_batch
        self.seen: set[str] = set()
        self._restored = False
        self._spec = store

    def _list(self) -> list[str]:
        if self._spec is not None:
            try:
                keys = self._spec.open().list("")
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"the location {self.directory!r} watched by a file stream does not exist (missing bucket?)"
                ) from None
            return sorted(k for k in keys if _visible(k))
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the folder {self.directory!r} watched by a file stream does not exist: create it first"
            ) from None
        out = []
        for n in names:
            if not _visible(n):
                continue
            p = os.path.join(self.directory, n)
            if os.path.isfile(p):
                out.append(os.path.abspath(p))
        return sorted(out)

    def start(self) -> None:
        self._files_limit = self.max_files_per_batch
        if self._files_limit is None:
            self._files_limit = config.get(config.FILES_MAX_FILES_PER_BATCH, self.graph.sc.getConf())
        if not self._restored:
            self.seen = set(self._list())

    def source_state(self) -> Any:
        return {"seen": sorted(self.seen)}

    def restore_source_state(self, state: Any) -> None:
        # After a restart, files that arrived while the driver was down are new: only the files
        # recorded as consumed are skipped.
        self.seen = set(state.get("seen", [])) if isinstance(state, dict) else set()
        self._restored = True

    def compute(self, time: BatchTime) -> RDD | None:
        replayed = self.replayed_offsets(time)
        if replayed is not None:
            files = list(replayed.get("files", []))
            self.seen.update(files)
            self.report_batch(time, None, {"files": files})
            return self.read_files(files)
        listing = self._list()
        new = [p for p in listing if p not in self.seen]
        limit = self._files_limit
        taken, waiting = (new[:limit], new[limit:]) if limit is not None else (new, [])
        # Remember the current listing only: deleted files are forgotten (bounded state). Waiting files
        # are not remembered, so that a later listing finds them new again.
        self.seen = set(listing).difference(waiting)
        metadata = None
        if limit is not None:
            metadata = {"maxFilesPerBatch": limit, "files": len(taken), "filesWaiting": len(waiting)}
        self.report_batch(time, None, {"files": taken}, metadata)
        return self.read_files(taken)

    def read_files(self, paths: list[str]) -> RDD:
        sc = self.graph.sc
        if not paths:
            return sc.emptyRDD()
        if self._spec is not None:
            spec, record_length = self._spec, self.record_length
            keys = sc.parallelize(paths, min(len(paths), _MAX_PARTITIONS))
            return keys.mapPartitions(lambda it: _read_objects(spec, record_length, it))
        if self.record_length is None:
            return sc.textFile(",".join(paths))
        rdds = [sc.binaryRecords(p, self.record_length) for p in paths]
        return rdds[0] if len(rdds) == 1 else sc.union(rdds)
