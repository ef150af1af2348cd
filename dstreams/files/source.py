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

**Backpressure** (``spark.streaming.backpressure.enabled``): a file source's unit is the file (its record
count is unknown until its files are read), so the PID estimator learns a rate in files per second from each
completed batch's files, processing time and scheduling delay, and a batch takes at most
``rate x batch interval`` files (at least one), or ``maxFilesPerBatch`` when that is smaller. The first
batch, before any estimate, takes ``maxFilesPerBatch`` files (all of them without one); the initial rate,
the minimum rate and ``maxRatePerPartition`` are in records and do not apply (the floor is one file per
batch). The batch's metadata then also holds ``rate``
(files/s).

Locations: a local path (read by Spark's ``textFile``/``binaryRecords``) or a store URL
``s3://bucket/prefix/`` (listed by the driver, each object read by an executor through the store layer
with its retries; endpoint and credentials from boto3's standard chain or ``storeOptions``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from dstreams import config
from dstreams.contracts import ObjectStoreLocation
from dstreams.nodes.input import InputNode
from dstreams.rate import RateSettings
from dstreams.time import BatchTime

if TYPE_CHECKING:
    from dstreams.graph import DStreamGraph
    from dstreams.listener import BatchInfo

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
#: At most this many partitions (tasks) when reading a store prefix's objects.
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


def _read_objects(spec: Any, record_length: int | None, keys: Iterable[str]) -> Iterator[Any]:
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

    #: The bound in force, resolved at ``start()``.
    _files_limit: int | None = None

    def __init__(self, graph: DStreamGraph, directory: str, record_length: int | None = None,
                 store: ObjectStoreLocation | None = None, max_files_per_batch: int | None = None) -> None:
        # Checked before the node joins the graph: a bad argument leaves no half-made source behind.
        if record_length is not None and record_length <= 0:
            raise ValueError(f"recordLength must be positive, got {record_length}")
        if not directory:
            raise ValueError("the directory of a file stream must be a non-empty path or s3:// URL")
        if max_files_per_batch is not None and (
                isinstance(max_files_per_batch, bool) or not isinstance(max_files_per_batch, int)
                or max_files_per_batch < 1):
            raise ValueError(f"maxFilesPerBatch must be a positive int or None, got {max_files_per_batch!r}")
        super().__init__(graph)
        self.directory = directory
        self.record_length = record_length
        self.max_files_per_batch = max_files_per_batch
        self.seen: set[str] = set()
        self._restored = False
        self._spec = store
        self._init_files_rate()

    def describe_params(self) -> list[str]:
        return [f"dir={self.directory}", f"recordLength={self.record_length}"]

    def _init_files_rate(self) -> None:
        #: Files taken per batch time (ms), what backpressure learns from.
        self._taken: dict[int, int] = {}

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

    def node_state(self) -> Any:
        return {"seen": sorted(self.seen)}

    def restore_node_state(self, state: Any) -> None:
        # After a restart, files that arrived while the driver was down are new: only the files
        # recorded as consumed are skipped.
        self.seen = set(state.get("seen", [])) if isinstance(state, dict) else set()
        self._restored = True

    def compute(self, time: BatchTime) -> RDD | None:
        # The input contract's failure rule: the listing, the files taken and the RDD are fixed first; the
        # node remembers them (``seen``, ``_taken``, the report) only once the RDD is built.
        replayed = self.replayed_offsets(time)
        if replayed is not None:
            files = list(replayed.get("files", []))
            rdd = self.read_files(files)
            self.seen.update(files)
            self._taken[time.ms] = len(files)
            self.report_batch(time, None, {"files": files})
            return rdd
        listing = self._list()
        new = [p for p in listing if p not in self.seen]
        limit, rate = self._files_limit, self._files_rate()
        if rate is not None:
            by_rate = max(1, math.floor(rate * self.slide_duration.ms / 1000.0 + 1e-9))
            limit = by_rate if limit is None else min(limit, by_rate)
        taken, waiting = (new[:limit], new[limit:]) if limit is not None else (new, [])
        metadata: dict[str, Any] | None = None
        if limit is not None:
            metadata = {"maxFilesPerBatch": limit, "files": len(taken), "filesWaiting": len(waiting)}
            if rate is not None:
                metadata["rate"] = rate
        rdd = self.read_files(taken)
        # Remember the current listing only: deleted files are forgotten (bounded state). Waiting files
        # are not remembered, so that a later listing finds them new again.
        self.seen = set(listing).difference(waiting)
        self._taken[time.ms] = len(taken)
        self.report_batch(time, None, {"files": taken}, metadata)
        return rdd

    # ----------------------------------------------------------------- backpressure, in files per second
    def _files_rate(self) -> float | None:
        """Backpressure's current rate in files/s, or None (off, or no estimate yet)."""
        limiter = self._limiter()
        return None if limiter is None else limiter.rate()

    def limiter_settings(self, settings: RateSettings) -> RateSettings | None:
        """Backpressure only, in files per second: the record limits do not apply, and the minimum rate is in
        records/s too (Spark's default, 100, would be 100 files/s): a file source's floor is one file per batch
        interval instead."""
        if not settings.backpressure:
            return None
        gains = dataclasses.replace(settings.gains, min_rate=1000.0 / self.slide_duration.ms)
        return dataclasses.replace(settings, max_rate_per_partition=None, initial_rate=None, gains=gains)

    def completed_units(self, info: BatchInfo) -> int | None:
        """The files a completed batch took (what backpressure learns from)."""
        return self._taken.get(info.batch_time_ms)

    def max_records_per_partition(self, time: BatchTime, partitions: int) -> int | None:
        """None: a file source's records are not counted before they are read; it limits files instead."""
        return None

    def forget_before(self, time: BatchTime) -> None:
        super().forget_before(time)
        horizon = time.ms - (self.remember_duration.ms if self.remember_duration else 0)
        for t in [t for t in self._taken if t <= horizon]:
            del self._taken[t]

    def read_files(self, paths: list[str]) -> RDD:
        sc = self.graph.sc
        if not paths:
            return sc.emptyRDD()
        # One task per file would pay PySpark's per-task cost (and, downstream, one output part per file) for
        # every small file of a backlog: the files are spread over the default parallelism.
        target = min(_MAX_PARTITIONS, max(1, sc.defaultParallelism))
        if self._spec is not None:
            spec, record_length = self._spec, self.record_length
            keys = sc.parallelize(paths, min(len(paths), target))
            return keys.mapPartitions(lambda it: _read_objects(spec, record_length, it))
        rdd: RDD  # of lines (str) or of fixed-length records (bytes)
        if self.record_length is None:
            rdd = sc.textFile(",".join(paths))
        else:
            rdds = [sc.binaryRecords(p, self.record_length) for p in paths]
            rdd = rdds[0] if len(rdds) == 1 else sc.union(rdds)
        return rdd.coalesce(target) if len(paths) > target else rdd
