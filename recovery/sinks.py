"""Exactly-once text output per batch: a batch's output is a folder committed by a ``_SUCCESS`` marker.

Contract of :func:`save_text_exactly_once`: the records of ``rdd`` end up, once, in the folder
``path``; a folder that already has its ``_SUCCESS`` marker is left alone (a re-run of a batch
after a failure, whose deterministic content is the same); a folder without it (a write cut off
half-way) is removed and written again. Readers must ignore folders without ``_SUCCESS``.

* Local (or any Hadoop-readable) paths use ``rdd.saveAsTextFile`` (Hadoop's commit protocol writes
  ``_SUCCESS`` last).
* ``s3://`` and other store URLs: each task writes its part object ``part-NNNNN`` (two attempts of
  one task write identical bytes under the same key), then the driver writes ``_SUCCESS``.

:func:`save_to_store_exactly_once` is the same protocol for any store location (local folder or
``s3://``) with a choice of encoding (:data:`FORMATS`): the sink behind ``DStream.saveToStore``.

``guard()`` is called right before the commit; it raises when this driver has been fenced off.

Both report the records of a write they commit to :func:`dstreams.output_records.add_written` (the batch's
``OutputOperationInfo.records_written``): counted per partition by the one task result Spark keeps of it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark import RDD

from dstreams.output_records import add_written

from .store import is_store_url
from .storespec import StoreSpec

SUCCESS = "_SUCCESS"


def save_text_exactly_once(rdd: RDD, path: str, guard: Callable[[], None] | None = None,
                           store_options: dict[str, Any] | None = None) -> bool:
    """Write ``rdd`` as text under ``path`` once; returns False when it was already committed."""
    if is_store_url(path):
        return save_to_store_exactly_once(rdd, path, guard, store_options, "text")
    local = path[len("file://"):] if path.startswith("file://") else path
    if "://" not in local:
        if os.path.exists(os.path.join(local, SUCCESS)):
            add_written(0)
            return False
        if os.path.exists(local):
            shutil.rmtree(local)
    if guard is not None:
        guard()
    written = rdd.context.accumulator(0)

    def count(it: Iterable[Any]) -> Iterator[Any]:
        n = 0
        for x in it:
            n += 1
            yield x
        written.add(n)  # in the save's result tasks: Spark applies one successful attempt per partition

    try:
        rdd.mapPartitions(count, preservesPartitioning=True).saveAsTextFile(path)
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
    add_written(written.value)
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

    Each task writes its partition's object (a speculative or retried attempt writes the same bytes under
    the same key); the driver writes ``_SUCCESS`` after every part, so a reader that sees the marker sees
    the whole batch. Returns False (and writes nothing) when ``location`` is already committed; leftovers
    of a write that was cut off are deleted first.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown output format {format!r}: choose one of {sorted(FORMATS)}")
    encode, ext = FORMATS[format]
    spec = StoreSpec(location.rstrip("/"), dict(store_options or {}))
    store = spec.open()
    if store.exists(SUCCESS):
        add_written(0)
        return False
    for key in store.list(""):  # leftovers of a write that was cut off
        store.delete(key)

    def write(i: int, it: Iterable[Any]) -> list[int]:
        records = _Counted(it)
        spec.open().put(f"part-{i:05d}{ext}", encode(records))
        return [records.n]

    written = sum(rdd.mapPartitionsWithIndex(write).collect())
    if guard is not None:
        guard()
    store.put(SUCCESS, b"")
    add_written(written)
    return True
