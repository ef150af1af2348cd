"""Folder sources: ``textFileStream`` and ``binaryRecordsStream``.

Contract: files present when the context starts are ignored (new files only, as in Spark); at
each batch the folder is listed and every file not seen before goes into that batch and no other
(each file in exactly one batch). Names starting with ``.`` or ``_`` are skipped (files being
written should be moved in atomically). The batch's file list is its replayable offset.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from ..time import BatchTime
from .input import InputNode

if TYPE_CHECKING:
    from ..graph import DStreamGraph


class FileInputNode(InputNode):
    def __init__(self, graph: DStreamGraph, directory: str, record_length: int | None = None) -> None:
        super().__init__(graph)
        if record_length is not None and record_length <= 0:
            raise ValueError(f"recordLength must be positive, got {record_length}")
        self.directory = directory
        self.record_length = record_length
        self.seen: set[str] = set()
        self._restored = False

    def _list(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the folder {self.directory!r} watched by a file stream does not exist: create it first"
            ) from None
        out = []
        for n in names:
            if n.startswith((".", "_")):
                continue
            p = os.path.join(self.directory, n)
            if os.path.isfile(p):
                out.append(os.path.abspath(p))
        return sorted(out)

    def start(self) -> None:
        if not self._restored:
            self.seen.update(self._list())

    def source_state(self) -> Any:
        return {"seen": sorted(self.seen)}

    def restore_source_state(self, state: Any) -> None:
        # After a restart, files that arrived while the driver was down are new: only the files
        # recorded as consumed are skipped.
        self.seen = set(state.get("seen", [])) if isinstance(state, dict) else set()
        self._restored = True

    def compute(self, time: BatchTime) -> RDD | None:
        if time.ms in self.replay:
            files = list(self.replay.pop(time.ms).get("files", []))
            self.seen.update(files)
            self._report(time, None, {"files": files})
            return self.read_files(files)
        new = [p for p in self._list() if p not in self.seen]
        self.seen.update(new)
        self._report(time, None, {"files": new})
        return self.read_files(new)

    def read_files(self, paths: list[str]) -> RDD:
        sc = self.graph.sc
        if not paths:
            return sc.emptyRDD()
        if self.record_length is None:
            return sc.textFile(",".join(paths))
        rdds = [sc.binaryRecords(p, self.record_length) for p in paths]
        return rdds[0] if len(rdds) == 1 else sc.union(rdds)
