"""Local-folder specifics: what is left on disk, and keys that collide with folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstreams.recovery.store import StoreConfigError, StorePermissionError
from dstreams.recovery.store.local import LocalStore


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_writes_leave_only_the_objects(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/b/c", b"1")
    store.put("a/b/c", b"2")
    store.put_if_absent("a/d", b"3")
    with pytest.raises(FileExistsError):
        store.put_if_absent("a/d", b"4")
    _, etag = store.get_with_etag("a/d")
    store.put_if_match("a/d", b"5", etag)
    assert files_under(tmp_path) == ["a", "a/b", "a/b/c", "a/d"]


def test_delete_prunes_empty_folders_up_to_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root").child("job")
    store.put("batches/0001/part-0", b"x")
    store.put("keep", b"y")
    store.delete("batches/0001/part-0")
    assert files_under(tmp_path / "root") == ["job", "job/keep"]
    store.delete("keep")
    assert files_under(tmp_path / "root") == ["job"]  # the store's own root stays


def test_stray_temporary_files_are_invisible(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/k", b"v")
    (tmp_path / "a" / ".dstreams-tmp-crashed").write_bytes(b"partial")
    assert store.list() == ["a/k"]


def test_a_key_that_is_a_folder(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/b", b"1")
    with pytest.raises(StoreConfigError, match="prefix of other keys"):
        store.put("a", b"2")
    with pytest.raises(StoreConfigError, match="prefix of other keys"):
        store.put("a/b/c", b"3")
    with pytest.raises(FileNotFoundError):
        store.get("a")
    assert not store.exists("a")
    store.delete("a")  # a folder is not an object: nothing to delete
    assert store.list() == ["a/b"]


def test_permission_denied_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulated: the tests may run as root, which ignores folder modes.
    def denied(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied", dst)

    store = LocalStore(tmp_path)
    monkeypatch.setattr("dstreams.recovery.store.local.os.replace", denied)
    with pytest.raises(StorePermissionError, match="make the folder writable") as error:
        store.put("k", b"v")
    assert str(tmp_path / "k") in str(error.value)
    monkeypatch.undo()
    assert store.list() == []  # the temporary file was removed
