"""Fault injection for tests: a store wrapper that fails chosen operations a given number of times.

``FaultyStore(inner, fail_times=2, ops={"put"})`` makes the next two ``put`` calls fail with
:class:`TransientStoreError` before they reach ``inner``; later calls pass through. ``error`` may be
an exception class (instantiated with a message naming the operation and key) or an instance
(raised as is), e.g. a permanent :class:`StorePermissionError` to check it is not retried.
``when="after"`` lets the call reach ``inner`` and *then* fails it, as a lost response would: the
write happened but the caller saw an error.

The wrapper is itself a :class:`Store` using ``inner``'s retry policy (unless ``retry`` is given), so
the policy retries injected faults exactly as it retries real ones. ``calls`` and ``failures``
count per operation; children share the fault budget and the counters.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal, TypeVar

from .base import Store
from .errors import TransientStoreError

if TYPE_CHECKING:
    from ..retry import RetryPolicy

OPS = frozenset({"get", "exists", "put", "put_if_absent", "put_if_match", "list", "delete"})
T = TypeVar("T")


class _Budget:
    def __init__(self, fail_times: int) -> None:
        self.remaining = fail_times
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()


class FaultyStore(Store):
    """Wraps ``inner`` and fails the next ``fail_times`` calls of ``ops`` (all operations by default)."""

    def __init__(
        self,
        inner: Store,
        fail_times: int = 1,
        error: type[BaseException] | BaseException = TransientStoreError,
        ops: Iterable[str] | None = None,
        *,
        when: Literal["before", "after"] = "before",
        retry: RetryPolicy | None = None,
        _budget: _Budget | None = None,
    ) -> None:
        super().__init__(retry if retry is not None else inner.retry)
        self.ops = frozenset(ops) if ops is not None else OPS
        if not self.ops <= OPS:
            raise ValueError(f"unknown store operations {sorted(self.ops - OPS)}; choose from {sorted(OPS)}")
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        self.inner = inner
        self.error = error
        self.when = when
        self._budget = _budget or _Budget(fail_times)

    @property
    def url(self) -> str:
        return f"faulty+{self.inner.url}"

    @property
    def calls(self) -> Counter[str]:
        return self._budget.calls

    @property
    def failures(self) -> Counter[str]:
        return self._budget.failures

    @property
    def remaining(self) -> int:
        """Faults still to inject."""
        return self._budget.remaining

    def _child(self, prefix: str) -> FaultyStore:
        return FaultyStore(
            self.inner.child(prefix),
            error=self.error,
            ops=self.ops,
            when=self.when,
            retry=self.retry,
            _budget=self._budget,
        )

    def _maybe_fail(self, op: str, key: str, call: Callable[[], T]) -> T:
        budget = self._budget
        with budget.lock:
            budget.calls[op] += 1
            fail = op in self.ops and budget.remaining > 0
            if fail:
                budget.remaining -= 1
                budget.failures[op] += 1
        if not fail:
            return call()
        if self.when == "after":
            call()
        if isinstance(self.error, BaseException):
            raise self.error
        raise self.error(f"injected fault: {op} {key!r} in {self.inner.url}")

    def _get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self._maybe_fail("get", key, lambda: self.inner._get_with_etag(key))

    def _get(self, key: str) -> bytes:
        return self._maybe_fail("get", key, lambda: self.inner._get(key))

    def _exists(self, key: str) -> bool:
        return self._maybe_fail("exists", key, lambda: self.inner._exists(key))

    def _put(self, key: str, data: bytes) -> None:
        self._maybe_fail("put", key, lambda: self.inner._put(key, data))

    def _put_if_absent(self, key: str, data: bytes) -> None:
        self._maybe_fail("put_if_absent", key, lambda: self.inner._put_if_absent(key, data))

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._maybe_fail("put_if_match", key, lambda: self.inner._put_if_match(key, data, etag))

    def _list(self, prefix: str) -> list[str]:
        return self._maybe_fail("list", prefix, lambda: self.inner._list(prefix))

    def _delete(self, key: str) -> None:
        self._maybe_fail("delete", key, lambda: self.inner._delete(key))
