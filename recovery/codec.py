"""Encoding of one checkpointed partition: versioned, checksummed pickle.

Layout: ``b"DSCK"`` magic, 1-byte format (:data:`~dstreams.contracts.FORMAT`), 4-byte big-endian
record count, 32-byte SHA-256 of the payload, then the payload (a pickled list of records).
:func:`decode_partition` raises :class:`CorruptCheckpointError` for anything that does not check out (truncated
object, bad magic, checksum mismatch) and :class:`~.checkpoint_format.CheckpointFormatError` for an object of
another checkpoint format; it never returns wrong data.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Iterable
from typing import Any

from dstreams.contracts import FORMAT
from dstreams.errors import DStreamsError
from dstreams.pickling import dumps

from .checkpoint_format import check_format

MAGIC = b"DSCK"
_HEADER = struct.Struct(">4sBI32s")


class CorruptCheckpointError(DStreamsError, ValueError):
    """A checkpoint object is truncated or corrupt (not a dstreams object, a checksum that does not match)."""


def encode_partition(records: Iterable[Any]) -> tuple[bytes, str, int]:
    """``(bytes, sha256 hex of the payload, record count)`` for a partition's records."""
    items = list(records)
    payload = dumps(items)  # cloudpickle for what pickle cannot: a class of the user's script (dstreams.pickling)
    digest = hashlib.sha256(payload).digest()
    return _HEADER.pack(MAGIC, FORMAT, len(items), digest) + payload, digest.hex(), len(items)


def decode_partition(data: bytes, expected_sha256: str | None = None, what: str = "checkpoint") -> list[Any]:
    if len(data) < _HEADER.size:
        raise CorruptCheckpointError(f"{what}: truncated ({len(data)} bytes, header needs {_HEADER.size})")
    magic, version, count, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptCheckpointError(f"{what}: not a dstreams checkpoint object (bad magic {magic!r})")
    check_format(version, what)
    payload = data[_HEADER.size:]
    actual = hashlib.sha256(payload).digest()
    if actual != digest or (expected_sha256 is not None and actual.hex() != expected_sha256):
        raise CorruptCheckpointError(f"{what}: checksum mismatch (object corrupt or truncated)")
    items = pickle.loads(payload)
    if not isinstance(items, list) or len(items) != count:
        raise CorruptCheckpointError(f"{what}: record count mismatch")
    return items
