"""The store contract, run against every backend (memory, local folder, moto, Ceph RGW)."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstreams.recovery.store import PreconditionFailed, Store

BINARY = bytes(range(256)) * 5 + b"\x00\r\n\xff"


def test_missing_key_raises_file_not_found(store: Store) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        store.get("nope")
    with pytest.raises(FileNotFoundError):
        store.get_with_etag("a/b/nope")
    assert not store.exists("nope")


def test_binary_round_trip_and_overwrite(store: Store) -> None:
    store.put("bin/blob", BINARY)
    assert store.get("bin/blob") == BINARY
    assert store.exists("bin/blob")
    store.put("bin/blob", b"")
    assert store.get("bin/blob") == b""
    store.put("bin/blob", bytearray(b"third"))
    assert store.get("bin/blob") == b"third"
    store.put("üñí/ключ-1", b"text")
    assert store.get("üñí/ключ-1") == b"text"


def test_put_if_absent_refuses_existing_key(store: Store) -> None:
    store.put_if_absent("epoch", b"1")
    with pytest.raises(FileExistsError, match="epoch"):
        store.put_if_absent("epoch", b"2")
    assert store.get("epoch") == b"1"


def test_put_if_match_is_compare_and_swap(store: Store) -> None:
    store.put_if_absent("master/epoch", b"epoch=1")
    data, etag = store.get_with_etag("master/epoch")
    assert data == b"epoch=1" and etag and not etag.startswith('"')
    new_etag = store.put_if_match("master/epoch", b"epoch=2", etag)
    assert store.get_with_etag("master/epoch") == (b"epoch=2", new_etag)
    assert new_etag != etag
    # The old etag is stale now: refused, and the record is untouched.
    with pytest.raises(PreconditionFailed) as refused:
        store.put_if_match("master/epoch", b"epoch=3-from-a-zombie", etag)
    assert isinstance(refused.value, FileExistsError)
    assert store.get("master/epoch") == b"epoch=2"
    # A quoted etag (as boto3 shows them) is accepted too.
    store.put_if_match("master/epoch", b"epoch=3", f'"{new_etag}"')
    assert store.get("master/epoch") == b"epoch=3"


def test_put_if_match_on_missing_key_fails_precondition(store: Store) -> None:
    with pytest.raises(PreconditionFailed):
        store.put_if_match("never-written", b"x", "0" * 32)
    assert not store.exists("never-written")


def test_list_by_prefix_is_sorted_and_recursive(store: Store) -> None:
    keys = ["a/1", "a/2", "a/b/3", "a/bc/4", "ab/5", "b/6", "top", "a/b/c/d/7"]
    for key in random.Random(7).sample(keys, len(keys)):
        store.put(key, key.encode())
    assert store.list() == sorted(keys)
    assert store.list("a/") == ["a/1", "a/2", "a/b/3", "a/b/c/d/7", "a/bc/4"]
    assert store.list("a/b") == ["a/b/3", "a/b/c/d/7", "a/bc/4"]
    assert store.list("a/b/") == ["a/b/3", "a/b/c/d/7"]
    assert store.list("a") == ["a/1", "a/2", "a/b/3", "a/b/c/d/7", "a/bc/4", "ab/5"]
    assert store.list("zzz") == []
    assert store.list("nothing/here/") == []


def test_list_paginates(store: Store) -> None:
    # S3 stores in these tests use 4 keys per page: 23 keys take 6 pages.
    keys = [f"batch/{i:05d}" for i in range(23)]
    for key in keys:
        store.put(key, b"x")
    assert store.list("batch/") == keys


def test_list_over_a_thousand_keys(fs_store: Store) -> None:
    keys = [f"ckpt/{i // 100:02d}/{i:05d}" for i in range(1100)]
    for key in keys:
        fs_store.put(key, b"")
    assert fs_store.list() == keys
    assert len(fs_store.list("ckpt/05/")) == 100


def test_delete(store: Store) -> None:
    store.delete("missing")  # not an error
    store.delete("missing/deeper/key")
    store.put("d/1", b"1")
    store.put("d/2", b"2")
    store.delete("d/1")
    assert store.list("d/") == ["d/2"]
    with pytest.raises(FileNotFoundError):
        store.get("d/1")
    store.delete("d/1")
    store.put_if_absent("d/1", b"again")  # a deleted key is free again
    assert store.get("d/1") == b"again"


def test_child_stores_are_isolated(store: Store) -> None:
    store.put("outside", b"o")
    left, right = store.child("jobs/left"), store.child("jobs/right/")
    left.put("state/1", b"L")
    right.put("state/1", b"R")
    assert left.get("state/1") == b"L" and right.get("state/1") == b"R"
    assert left.list() == ["state/1"]
    assert store.list() == ["jobs/left/state/1", "jobs/right/state/1", "outside"]
    assert store.get("jobs/left/state/1") == b"L"
    with pytest.raises(FileNotFoundError):
        left.get("outside")
    grandchild = left.child("state")
    assert grandchild.list() == ["1"]
    assert grandchild.url.rstrip("/").endswith("jobs/left/state")
    grandchild.delete("1")
    assert store.list("jobs/") == ["jobs/right/state/1"]


BAD_KEYS = [
    "",
    "/abs",
    "a//b",
    "a/",
    "..",
    "a/../b",
    ".",
    "a/./b",
    "back\\slash",
    "nul\x00",
    ".dstreams-tmp-x",
]


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_bad_keys_are_rejected(store: Store, bad: str) -> None:
    operations: list[Callable[[], object]] = [
        lambda: store.put(bad, b"x"),
        lambda: store.put_if_absent(bad, b"x"),
        lambda: store.put_if_match(bad, b"x", "etag"),
        lambda: store.get(bad),
        lambda: store.get_with_etag(bad),
        lambda: store.exists(bad),
        lambda: store.delete(bad),
    ]
    for operation in operations:
        with pytest.raises(ValueError, match="key"):
            operation()
    if bad not in ("", "a/"):
        with pytest.raises(ValueError):
            store.child(bad)
    assert store.list() == []


def test_bad_values_are_rejected(store: Store) -> None:
    with pytest.raises(TypeError, match="bytes"):
        store.put("k", "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.get(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix"):
        store.list("/abs")
    with pytest.raises(ValueError, match="etag"):
        store.put_if_match("k", b"x", "")


def _race(n: int, attempt: Callable[[int], None]) -> tuple[list[int], list[BaseException]]:
    """Run ``attempt(i)`` in ``n`` threads released together; return winners and errors."""
    barrier = threading.Barrier(n)
    winners: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait(timeout=10)
        try:
            attempt(i)
        except BaseException as e:  # noqa: BLE001 - collected and checked by the test
            with lock:
                errors.append(e)
        else:
            with lock:
                winners.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return winners, errors


def test_concurrent_put_if_absent_has_one_winner(store: Store) -> None:
    winners, errors = _race(8, lambda i: store.put_if_absent("race/lock", f"writer-{i}".encode()))
    assert len(winners) == 1, (winners, errors)
    assert len(errors) == 7 and all(isinstance(e, FileExistsError) for e in errors), errors
    assert store.get("race/lock") == f"writer-{winners[0]}".encode()


def test_concurrent_put_if_match_has_one_winner(store: Store) -> None:
    store.put("race/epoch", b"epoch-0")
    _, etag = store.get_with_etag("race/epoch")
    winners, errors = _race(8, lambda i: store.put_if_match("race/epoch", f"epoch-1-by-{i}".encode(), etag))
    assert len(winners) == 1, (winners, errors)
    assert len(errors) == 7 and all(isinstance(e, PreconditionFailed) for e in errors), errors
    assert store.get("race/epoch") == f"epoch-1-by-{winners[0]}".encode()


KEY_PARTS = st.sampled_from(["a", "b", "ab", "a.b", "0", "ü"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.sets(st.lists(KEY_PARTS, min_size=1, max_size=3).map("/".join), max_size=12),
    prefix=st.lists(KEY_PARTS, max_size=3).map("/".join) | st.sampled_from(["", "a/", "a/b/", "ab"]),
)
def test_list_matches_a_plain_string_prefix_filter(fs_store: Store, keys: set[str], prefix: str) -> None:
    """On the local backend a key can't also be a folder of other keys: skip such key sets."""
    if any(other.startswith(key + "/") for key in keys for other in keys):
        return
    root = fs_store.child(f"case-{uuid.uuid4().hex[:8]}")
    for key in keys:
        root.put(key, b"")
    assert root.list(prefix) == sorted(k for k in keys if k.startswith(prefix))
