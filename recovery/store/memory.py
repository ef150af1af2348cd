"""In-memory store for unit tests: thread-safe, with the full conditional-write contract.

``memory://name`` stores with the same name share their contents within a process (see
:func:`named`); ``clear_named()`` forgets them all. Nothing survives the process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .base import Store, content_etag
from .errors import PreconditionFailed

if TYPE_CHECKING:
    from ..retry import RetryPolicy


class _Space:
    """The shared contents of one in-memory store and of all its children."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.objects: dict[str, bytes] = {}


_named: dict[str, _Space] = {}
_named_lock = threading.Lock()


def named(name: str, retry: RetryPolicy | None = None) -> MemoryStore:
    """The process-wide in-memory store called ``name`` (created empty on first use)."""
    with _named_lock:
        space = _named.setdefault(name, _Space(name))
    return MemoryStore(retry=retry, _space=space)


def clear_named() -> None:
    """Forget every named in-memory store (for test isolation)."""
    with _named_lock:
        _named.clear()


class MemoryStore(Store):
    """A dict behind a lock. ``MemoryStore()`` is a fresh anonymous store."""

    def __init__(
        self, retry: RetryPolicy | None = None, *, _space: _Space | None = None, _root: str = ""
    ) -> None:
        super().__init__(retry)
        self._space = _space if _space is not None else _Space(f"anonymous-{id(self):x}")
        self._root = _root

    @property
    def url(self) -> str:
        return f"memory://{self._space.name}/{self._root}"

    def _child(self, prefix: str) -> MemoryStore:
        return MemoryStore(self.retry, _space=self._space, _root=self._root + prefix)

    def _get_with_etag(self, key: str) -> tuple[bytes, str]:
        with self._space.lock:
            data = self._space.objects.get(self._root + key)
        if data is None:
            raise FileNotFoundError(f"no object {key!r} in {self.url}")
        return data, content_etag(data)

    def _exists(self, key: str) -> bool:
        with self._space.lock:
            return self._root + key in self._space.objects

    def _put(self, key: str, data: bytes) -> None:
        with self._space.lock:
            self._space.objects[self._root + key] = data

    def _put_if_absent(self, key: str, data: bytes) -> None:
        with self._space.lock:
            if self._root + key in self._space.objects:
                raise FileExistsError(f"object {key!r} already exists in {self.url}")
            self._space.objects[self._root + key] = data

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        with self._space.lock:
            current = self._space.objects.get(self._root + key)
            if current is None or content_etag(current) != etag:
                state = "does not exist" if current is None else "has changed"
                raise PreconditionFailed(f"object {key!r} in {self.url} {state} (expected etag {etag})")
            self._space.objects[self._root + key] = data
        return content_etag(data)

    def _list(self, prefix: str) -> list[str]:
        start = self._root + prefix
        cut = len(self._root)
        with self._space.lock:
            return [k[cut:] for k in self._space.objects if k.startswith(start)]

    def _delete(self, key: str) -> None:
        with self._space.lock:
            self._space.objects.pop(self._root + key, None)
