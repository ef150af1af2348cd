"""A picklable description of a store, so that executors can open the same store.

Contract: ``StoreSpec(url, options).open()`` returns an equivalent store in any process; opened
stores are cached per process (a boto3 client costs about half a second to create).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .store import Store, open_store

_cache: dict[tuple[str, tuple[tuple[str, Any], ...]], Store] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class StoreSpec:
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def _key(self) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return self.url, tuple(sorted(self.options.items()))

    def open(self) -> Store:
        key = self._key()
        with _lock:
            store = _cache.get(key)
            if store is None:
                store = open_store(self.url, **self.options)
                _cache[key] = store
            return store

    def __hash__(self) -> int:
        return hash(self._key())
