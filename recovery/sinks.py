"""Exactly-once text output per batch: a batch's output is a folder committed by a ``_SUCCESS`` marker.

Contract of :func:`save_text_exactly_once`: the records of ``rdd`` end up, once, in the folder
``path``; a folder that already has its ``_SUCCESS`` marker is left alone (a re-run of a batch
after a failure, whose deterministic content is the same); a folder without it (a write cut off
half-way) is removed and written again. Readers must ignore folders without ``_SUCCESS``.

* Local (or any Hadoop-readable) paths use ``rdd.saveAsTextFile`` (Hadoop's commit protocol writes
  ``_SUCCESS`` last).
* ``s3://`` and other store URLs: each task writes its part object ``part-NNNNN`` (two attempts of
  one task write identical bytes under the same key), then the driver writes ``_SUCCESS``.

``guard()`` is called right before the commit; it raises when this driver has been fenced off.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from pyspark import RDD

from .storespec import StoreSpec

SUCCESS = "_SUCCESS"


def _is_store_url(path: str) -> bool:
    return urlsplit(path).scheme.lower() in ("s3", "s3a")


def save_text_exactly_once(rdd: RDD, path: str, guard: Callable[[], None] | None = None,
                           store_options: dict[str, Any] | None = None) -> bool:
    """Write ``rdd`` as text under ``path`` once; returns False when it was already committed."""
    if _is_store_url(path):
        return _save_to_store(rdd, path, guard, store_options or {})
    local = path[len("file://"):] if path.startswith("file://") else path
    if "://" not in local:
        if os.path.exists(os.path.join(local, SUCCESS)):
            return False
        if os.path.exists(local):
            shutil.rmtree(local)
    if guard is not None:
        guard()
    try:
        rdd.saveAsTextFile(path)
    except Exception as e:
        if "FileAlreadyExistsException" not in str(e):
            raise
        # Another writer created the folder since the check: a driver that took over (then this one
        # is fenced and stops) or a concurrent attempt of the same deterministic batch.
        if guard is not None:
            guard()
        return False
    return True


def _save_to_store(rdd: RDD, url: str, guard: Callable[[], None] | None, options: dict[str, Any]) -> bool:
    spec = StoreSpec(url.rstrip("/"), options)
    store = spec.open()
    if store.exists(SUCCESS):
        return False
    for key in store.list(""):  # leftovers of a write that was cut off
        store.delete(key)

    def write(i: int, it: Iterable[Any]) -> list[int]:
        lines = "".join(f"{x}\n" for x in it).encode("utf-8")
        spec.open().put(f"part-{i:05d}", lines)
        return [i]

    rdd.mapPartitionsWithIndex(write).collect()
    if guard is not None:
        guard()
    store.put(SUCCESS, b"")
    return True
