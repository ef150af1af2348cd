"""The checkpoint store interface.

A :class:`Store` is a flat map from keys (relative '/'-separated strings, see
:mod:`dstreams.recovery.store.keys`) to immutable byte strings, rooted at some prefix. Contract,
identical for every backend:

* ``get(key)`` / ``get_with_etag(key)`` raise ``FileNotFoundError`` for a missing key.
* ``put(key, data)`` writes atomically: a reader sees the old bytes or the new ones, never a mix.
* ``put_if_absent(key, data)`` writes only if the key does not exist, else raises
  ``FileExistsError``; when several writers race, exactly one wins.
* ``put_if_match(key, data, etag)`` overwrites only if the object's current etag is ``etag``
  (as returned by ``get_with_etag`` or a previous ``put_if_match``), else raises
  :class:`PreconditionFailed` (a ``FileExistsError``); a vanished key also fails the precondition.
  It returns the new etag. With ``put_if_absent`` this is the compare-and-swap used for fencing.
* An etag is an opaque, unquoted string that changes whenever the bytes change. Memory and local
  stores use the content's MD5 hex digest, S3 the server's ETag (the same MD5 for single-part
  uploads). Rewriting identical bytes may keep the etag: harmless for compare-and-swap, since the
  state is identical.
* ``list(prefix)`` returns every key starting with the string ``prefix``, sorted; ``delete`` of a
  missing key is not an error; ``child(prefix)`` is the same store rooted one level deeper.

Transient faults are retried by one :class:`~dstreams.recovery.retry.RetryPolicy` around every
backend call. A conditional write whose response was lost (a transient error after the server
applied it) would otherwise fail on its own retry; so when a retried ``put_if_absent`` /
``put_if_match`` meets an object holding exactly the bytes it was writing, it counts as success.

Backends implement the underscored raw methods, which receive validated keys relative to the
store's root and need not retry.
"""

from __future__ import annotations

import builtins
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .. import retry as _retry
from .errors import TransientStoreError
from .keys import validate_key, validate_prefix

if TYPE_CHECKING:
    from ..retry import RetryPolicy

T = TypeVar("T")


def content_etag(data: bytes) -> str:
    """The etag every backend uses for ``data``: its MD5 hex digest."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"store data must be bytes, got {type(data).__name__}; encode text first")


class Store(ABC):
    """A checkpoint store rooted at a prefix. See the module docstring for the contract."""

    def __init__(self, retry: RetryPolicy | None = None) -> None:
        self.retry: RetryPolicy = retry if retry is not None else _retry.RetryPolicy.from_env()

    # ------------------------------------------------------------------ description

    @property
    @abstractmethod
    def url(self) -> str:
        """A URL naming this store and its root, e.g. ``s3://bucket/prefix/`` or ``file:///data/ckpt``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # ------------------------------------------------------------------ public API

    def child(self, prefix: str) -> Store:
        """The store rooted at ``prefix`` inside this one: its key ``k`` is this store's ``prefix/k``."""
        prefix = validate_key(prefix.rstrip("/") if isinstance(prefix, str) else prefix, what="prefix")
        return self._child(prefix + "/")

    def get(self, key: str) -> bytes:
        """The bytes stored under ``key``; ``FileNotFoundError`` if there are none."""
        key = validate_key(key)
        return self._call("get", key, lambda: self._get(key))

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The bytes under ``key`` and their etag; ``FileNotFoundError`` if missing."""
        key = validate_key(key)
        return self._call("get", key, lambda: self._get_with_etag(key))

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object."""
        key = validate_key(key)
        return self._call("exists", key, lambda: self._exists(key))

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` atomically, replacing any previous object."""
        key, data = validate_key(key), _as_bytes(data)
        self._call("put", key, lambda: self._put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` only if the key is free; else ``FileExistsError``."""
        key, data = validate_key(key), _as_bytes(data)
        self._call("put_if_absent", key, self._reconciled(key, data, lambda: self._put_if_absent(key, data)))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Overwrite ``key`` only if its current etag is ``etag``; return the new etag.

        Raises :class:`PreconditionFailed` if the object changed or no longer exists.
        """
        key, data = validate_key(key), _as_bytes(data)
        if not isinstance(etag, str) or not etag.strip('"'):
            raise ValueError(f"put_if_match needs the etag string from get_with_etag, got {etag!r}")
        etag = etag.strip('"')
        return self._call(
            "put_if_match", key, self._reconciled(key, data, lambda: self._put_if_match(key, data, etag))
        )

    def list(self, prefix: str = "") -> list[str]:
        """All keys starting with ``prefix`` (a plain string prefix, recursive), sorted."""
        prefix = validate_prefix(prefix)
        return sorted(self._call("list", prefix, lambda: self._list(prefix)))

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""
        key = validate_key(key)
        self._call("delete", key, lambda: self._delete(key))

    # ------------------------------------------------------------------ helpers

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        return self.retry.call(fn, op=op, key=key, where=self.url)

    def _reconciled(self, key: str, data: bytes, write: Callable[[], T]) -> Callable[[], T | str]:
        """Wrap a conditional write so a retry that finds its own bytes already written succeeds."""
        failed_before = False

        def attempt() -> T | str:
            nonlocal failed_before
            try:
                return write()
            except TransientStoreError:
                failed_before = True
                raise
            except FileExistsError:
                if not failed_before:
                    raise
                try:
                    current, etag = self._get_with_etag(key)
                except FileNotFoundError:
                    current, etag = None, ""
                if current != data:
                    raise
                return etag

        return attempt

    # ------------------------------------------------------------------ backend hooks

    @abstractmethod
    def _child(self, prefix: str) -> Store:
        """A store rooted at this root + ``prefix`` (validated, ends with '/')."""

    @abstractmethod
    def _get_with_etag(self, key: str) -> tuple[bytes, str]: ...

    def _get(self, key: str) -> bytes:
        return self._get_with_etag(key)[0]

    @abstractmethod
    def _exists(self, key: str) -> bool: ...

    @abstractmethod
    def _put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def _put_if_absent(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def _put_if_match(self, key: str, data: bytes, etag: str) -> str: ...

    @abstractmethod
    def _list(self, prefix: str) -> builtins.list[str]: ...  # (``list`` is the method above here)

    @abstractmethod
    def _delete(self, key: str) -> None: ...
