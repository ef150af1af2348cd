"""The layout of data checkpoints in a store, and reading them back (no Spark job: plain functions that the
checkpointer's reader RDDs and the state changelog's tasks call).

* ``checkpoints/<node key>/<time, 15 digits>/MANIFEST.json`` commits a checkpoint: it names its parts
  (``part-NNNNN``, :mod:`.codec`) and their checksums; nothing reads a part that no manifest names. A manifest
  carries the format (:data:`~dstreams.contracts.FORMAT`); one of another format raises
  :class:`~.checkpoint_format.CheckpointFormatError`.
* A store-backed state stream's checkpoint (:mod:`dstreams.nodes.store_state`) is a snapshot or a delta on the
  chain of checkpoints its manifest names (``state.chain``): :func:`state_layers` and :func:`read_state_partition`
  rebuild one partition from the newest snapshot on the chain and the deltas after it. A snapshot part is the
  partition's store file (:data:`~dstreams.statestore.FILE_SNAPSHOT`, whose own format,
  :func:`~dstreams.statestore.file_format`, is checked as the part's is), read from a temporary copy on the reading
  executor, or, for a state of ``spark.dstreams.state.store=auto`` checkpointed before it moved to the store, its
  pairs as the RDD state held them (:data:`~dstreams.statestore.PAIRS_SNAPSHOT`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

from dstreams.statestore import (
    FILE_SNAPSHOT,
    PAIRS_SNAPSHOT,
    file_format,
    file_rows,
    key_bytes,
    process_alive,
    value_bytes,
)
from dstreams.statestore import PART_HEADER as STATE_PART_HEADER

from .checkpoint_format import check_format
from .codec import CorruptCheckpointError, decode_partition
from .storespec import StoreSpec

MANIFEST = "MANIFEST.json"

#: A state checkpoint's chain as read back: per checkpoint (oldest first), its prefix and its parts by index.
StateLayers = list[tuple[str, dict[int, dict[str, Any]]]]


def _node_root(node_key: str) -> str:
    return f"checkpoints/{node_key}/"


def checkpoint_prefix(node_key: str, time_ms: int) -> str:
    """Where the checkpoint of ``node_key`` at ``time_ms`` lives (with :func:`list_checkpoints`, the one
    place that spells the key format)."""
    return f"{_node_root(node_key)}{time_ms:015d}"


def read_part(spec: StoreSpec, prefix: str, part: dict[str, Any]) -> list[Any]:
    """The records of one part a manifest names, its checksum verified (a missing part: a corrupt checkpoint)."""
    key = f"{prefix}/{part['key']}"
    try:
        data = spec.open().get(key)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"checkpoint part {key} named by its manifest is missing") from None
    return decode_partition(data, part["sha256"], key)


def load_manifest(store: Any, node_key: str, time_ms: int) -> dict[str, Any]:
    """The manifest of ``node_key``'s checkpoint at ``time_ms``. Raises :class:`CorruptCheckpointError` when it is
    not a manifest of that node and :class:`~.checkpoint_format.CheckpointFormatError` when it is of another
    checkpoint format."""
    prefix = checkpoint_prefix(node_key, time_ms)
    raw = store.get(f"{prefix}/{MANIFEST}")
    try:
        manifest = json.loads(raw)
    except ValueError:
        raise CorruptCheckpointError(f"{prefix}/{MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict) or "format" not in manifest or manifest.get("node") != node_key:
        raise CorruptCheckpointError(f"{prefix}/{MANIFEST} is not a checkpoint manifest of {node_key}")
    check_format(manifest["format"], f"the checkpoint manifest {prefix}/{MANIFEST}")
    return manifest


def list_checkpoints(store: Any, node_key: str) -> list[int]:
    """Times of the committed checkpoints of ``node_key`` (newest first)."""
    times = set()
    root = _node_root(node_key)
    for key in store.list(root):
        rest = key[len(root):]
        t, _, name = rest.partition("/")
        if name == MANIFEST and t.isdigit():
            times.add(int(t))
    return sorted(times, reverse=True)


def state_chain(manifest: dict[str, Any]) -> list[int]:
    """The checkpoint times a store-backed stream's checkpoint builds on (empty for any other)."""
    return [int(t) for t in manifest.get("state", {}).get("chain", [])]


def verify_state_chain(store: Any, manifest: dict[str, Any]) -> None:
    """Raise :class:`CorruptCheckpointError` unless every manifest and part a store-backed stream's checkpoint
    builds on is in ``store`` (one existence check per part; the contents are checked when read)."""
    node_key = manifest["node"]
    for t in [*state_chain(manifest), int(manifest["time_ms"])]:
        m = manifest if t == int(manifest["time_ms"]) else load_manifest(store, node_key, t)
        prefix = checkpoint_prefix(node_key, t)
        for p in m["parts"]:
            if not store.exists(f"{prefix}/{p['key']}"):
                raise CorruptCheckpointError(f"checkpoint part {prefix}/{p['key']} named by its manifest is missing")


def state_layers(store: Any, manifest: dict[str, Any]) -> StateLayers:
    """The chain a store-backed stream's checkpoint builds on, its own parts last (manifests read, parts not)."""
    node_key, n = manifest["node"], int(manifest["num_partitions"])
    manifests = [load_manifest(store, node_key, t) for t in state_chain(manifest)] + [manifest]
    layers: StateLayers = []
    for m in manifests:
        if int(m["num_partitions"]) != n:
            raise CorruptCheckpointError(f"checkpoint of {node_key} at {m['time_ms']} has {m['num_partitions']} "
                                         f"partitions, the chain it belongs to has {n}")
        layers.append((checkpoint_prefix(node_key, int(m["time_ms"])), {int(p["index"]): p for p in m["parts"]}))
    return layers


def read_state_partition(spec: StoreSpec, layers: StateLayers, i: int) -> StatePartition:
    """Partition ``i`` of the state at the newest checkpoint of ``layers`` (read lazily, :class:`StatePartition`)."""
    return StatePartition(spec, layers, i)


class StatePartition:
    """One partition of a store-backed state at a checkpoint: its newest snapshot part on the chain and the delta parts
    after it. Nothing is read until it is used.

    * Iterating it yields the state as (key bytes, value bytes) (a pairs snapshot, written before a state picked by
      size moved, encoded as the store encodes); from a store-file snapshot, streamed (memory: the deltas).
    * :meth:`file_snapshot` gives a store-file snapshot's bytes and the changes after it, which
      :meth:`dstreams.statestore.PartitionStore.reload` copies in SQL instead of inserting key by key; None for a
      pairs snapshot (then the records are read by iterating).
    """

    def __init__(self, spec: StoreSpec, layers: StateLayers, i: int) -> None:
        self.spec, self.layers, self.partition = spec, layers, i
        self._parts: list[list[Any]] | None = None

    def _read(self) -> list[list[Any]]:
        """The parts, newest first, down to the newest snapshot (read once and kept until iterated)."""
        if self._parts is not None:
            return self._parts
        parts: list[list[Any]] = []
        for prefix, by_index in reversed(self.layers):  # newest first, down to the newest snapshot
            p = by_index[self.partition]
            records = read_part(self.spec, prefix, p)
            if not records or not isinstance(records[0], tuple) or records[0][0] != STATE_PART_HEADER:
                raise CorruptCheckpointError(f"checkpoint part {prefix}/{p['key']} is not a part of a store-backed "
                                             "state")
            parts.append(records)
            if records[0][1] == FILE_SNAPSHOT:
                _check_snapshot_file(records[0][3], f"{prefix}/{p['key']}")
            if records[0][1] in (PAIRS_SNAPSHOT, FILE_SNAPSHOT):
                break
        else:
            raise CorruptCheckpointError(f"no snapshot of partition {self.partition} on the chain "
                                         f"{[prefix for prefix, _ in self.layers]}")
        self._parts = parts
        return parts

    def file_snapshot(self, path: str) -> dict[bytes, bytes | None] | None:
        """With a store-file snapshot: the file written at ``path`` and the changes after it (None: the newest
        snapshot is a pairs snapshot, read the records)."""
        parts = self._read()
        if parts[-1][0][1] != FILE_SNAPSHOT:
            return None
        self._parts = None
        changes = _changes_after(parts)
        with open(path, "wb") as f:
            f.write(parts[-1][0][3])
        return changes

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        parts = self._read()
        self._parts = None  # the records go as they are read
        if parts[-1][0][1] == FILE_SNAPSHOT:
            return _file_snapshot_with_deltas(parts)
        return _records_state(parts)


def _check_snapshot_file(data: bytes, key: str) -> None:
    """Raise unless ``data`` (a store-file snapshot of the part ``key``) is a store file of this format:
    :class:`CorruptCheckpointError` for bytes that are no store file, else
    :class:`~.checkpoint_format.CheckpointFormatError` for one of another format."""
    found = file_format(data)
    if found is None:
        raise CorruptCheckpointError(f"checkpoint part {key}: its state snapshot is not a store file")
    check_format(found, f"the state snapshot in checkpoint part {key}")


def _changes_after(parts: list[list[Any]]) -> dict[bytes, bytes | None]:
    """What the delta parts (all but the last of ``parts``, newest first) write, oldest applied first."""
    changed: dict[bytes, bytes | None] = {}
    for records in reversed(parts[:-1]):
        changed.update(records[1:])
    return changed


def _records_state(parts: list[list[Any]]) -> Iterator[tuple[bytes, bytes]]:
    """A partition from a pairs snapshot (``parts[-1]``: plain (key, value) pairs of a state picked by size, not yet
    moved) and the deltas after it (newest first), as (key bytes, value bytes)."""
    state = {key_bytes(k): value_bytes(v) for k, v in parts[-1][1:]}
    for records in reversed(parts[:-1]):
        for k, v in records[1:]:
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
    yield from state.items()


def _file_snapshot_with_deltas(parts: list[list[Any]]) -> Iterator[tuple[bytes, bytes]]:
    """A partition from a store-file snapshot (``parts[-1]``) and the deltas after it (newest first), streamed: the
    file's rows that no delta wrote, then the deltas' values (memory: the deltas, not the state)."""
    changed = _changes_after(parts)
    data = parts[-1][0][3]
    del parts[:]
    folder = tempfile.gettempdir()
    sweep_reader_files(folder)
    fd, path = tempfile.mkstemp(prefix=f"{READER_PREFIX}{os.getpid()}-", suffix=".sqlite", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        del data
        for k, v in file_rows(path):
            if k not in changed:
                yield k, v
    finally:
        os.remove(path)
    for k, value in changed.items():
        if value is not None:
            yield k, value


#: A streaming reader's copy of a store-file snapshot in the system temp folder: ``<prefix><pid>-<random>.sqlite``.
READER_PREFIX = "dstreams-snapshot-"
_READER_FILE = re.compile(rf"{re.escape(READER_PREFIX)}(\d+)-[^.]+\.sqlite(?:-wal|-shm|-journal)?")


def sweep_reader_files(folder: str) -> None:
    """Remove the snapshot copies in ``folder`` of readers whose process is gone (a task killed while it streamed
    a snapshot leaves its copy behind; the next reader on the host removes it)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for n in names:
        if (m := _READER_FILE.fullmatch(n)) is not None and not process_alive(int(m.group(1))):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.remove(os.path.join(folder, n))


def part_keys(records: list[Any]) -> int | None:
    """How many keys a store-backed state's checkpoint part holds (None: not such a part)."""
    first = records[0] if records else None
    if type(first) is not tuple or len(first) < 2 or type(first[0]) is not str or first[0] != STATE_PART_HEADER:
        return None
    if records[0][1] == FILE_SNAPSHOT:
        return int(records[0][2])
    return len(records) - 1
