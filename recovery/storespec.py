"""A picklable description of a store, so that executors can open the same store.

Contract: ``StoreSpec(url, options).open()`` returns an equivalent store in any process. An object
store's client is created once per process for each bucket and options (a boto3 client costs 70-300 ms
of CPU and about 12 MB): every prefix of that bucket (a sink opens a new one for each batch) is a child
store sharing it. Other stores are cheap and opened on each call, so nothing accumulates per batch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from .store import STORE_SCHEMES, Store, open_store

_cache: dict[tuple[str, tuple[tuple[str, Any], ...]], Store] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class StoreSpec:
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def _key(self) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return self.url, tuple(sorted(self.options.items()))

    def open(self) -> Store:
        parts = urlsplit(self.url)
        if parts.scheme.lower() not in STORE_SCHEMES or not parts.netloc:
            return open_store(self.url, **self.options)
        key = (f"s3://{parts.netloc}", tuple(sorted(self.options.items())))
        with _lock:
            root = _cache.get(key)
            if root is None:
                root = open_store(key[0], **self.options)
                _cache[key] = root
        prefix = unquote(parts.path).strip("/")
        return root.child(prefix) if prefix else root

    def __hash__(self) -> int:
        return hash(self._key())
