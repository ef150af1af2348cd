"""Local-folder store, the default backend (POSIX only).

Layout: key ``a/b/c`` is the file ``<root>/a/b/c``. How the contract is met:

* ``put``: the bytes go to a temporary file in the target folder (``.dstreams-tmp-*``, hidden from
  ``list``), are fsynced, then ``os.replace``-d over the key and the folder is fsynced: a reader sees
  the old file or the new one, and a crash leaves at most a stray temporary file.
* ``put_if_absent``: the fsynced temporary file is hard-linked to the key (``os.link`` fails if the
  key exists), which is atomic across threads and processes. On filesystems without hard links it
  falls back to check-and-replace under the folder lock below.
* ``put_if_match``: compare the current etag and replace while holding an exclusive ``flock`` on the
  key's folder. ``put`` and ``delete`` take the same lock, so conditional writes are linearizable
  against every other writer using this class (in any process on the same machine).
* etag: MD5 hex of the content (see :func:`~dstreams.recovery.store.base.content_etag`); content
  hashes, unlike mtime+size, cannot miss a change made within the timestamp granularity.
* ``delete`` removes folders left empty, up to the root, so a long run leaves no empty folders.
* The lock (:mod:`.folder_lock`) covers only the check and the ``os.replace``/``unlink``: temporary files are
  written and fsynced before it is taken, folders fsynced after it is released.

A writer frozen while it holds a folder's lock (a zombie driver SIGSTOPped mid-commit, a long pause) holds up the
other writers of that folder, a new driver's take-over of the metadata log included, until it runs again or dies
(the kernel then releases the lock). They wait for it at most ``lock_seconds`` (default 30 s,
``spark.dstreams.store.lockSeconds``) per attempt, then raise :class:`TransientStoreError` naming the folder and
the holder (pid, command line, whether it is stopped); the retry policy tries again within its bound, then
raises :class:`~.errors.StoreUnavailableError` with that message. The lock is never broken: the frozen writer
may have passed its etag check, and would replace the key when resumed, clobbering whatever was written
meanwhile. Resume or kill the holder; readers (``get``, ``list``) never wait for it.

Limitation: a key cannot also be a prefix folder of other keys (``a`` and ``a/b``): that raises
:class:`StoreConfigError`. The store's own layout never does this.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from dstreams import config

from .base import Store, content_etag
from .errors import PreconditionFailed, StoreConfigError, StorePermissionError, TransientStoreError
from .folder_lock import folder_lock, folder_locks_held
from .keys import RESERVED_PREFIX

__all__ = ["LocalStore", "folder_locks_held"]


if TYPE_CHECKING:
    from ..retry import RetryPolicy

_TMP = RESERVED_PREFIX + "tmp-"
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.ETIMEDOUT, errno.ESTALE, errno.EINTR}
_NO_HARDLINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK}


class LocalStore(Store):
    """A store in a local folder (created on first write). ``fsync=False`` trades durability for speed.

    ``lock_seconds``: how long one attempt of a write waits for its folder's lock before it raises
    :class:`TransientStoreError` naming the holder (default: :data:`dstreams.config.STORE_LOCK_SECONDS`, 30 s).
    """

    def __init__(
        self, path: str | os.PathLike[str], retry: RetryPolicy | None = None, *, fsync: bool = True,
        lock_seconds: float | None = None,
    ) -> None:
        super().__init__(retry)
        self.root = os.path.abspath(os.fspath(path))
        self.fsync = fsync
        if lock_seconds is None:
            lock_seconds = config.get(config.STORE_LOCK_SECONDS, config.active_conf())
        if not isinstance(lock_seconds, (int, float)) or not lock_seconds >= 0:
            raise StoreConfigError(f"lock_seconds must be a number of seconds >= 0, got {lock_seconds!r}")
        self.lock_seconds = float(lock_seconds)

    @property
    def url(self) -> str:
        return Path(self.root).as_uri()

    def _child(self, prefix: str) -> LocalStore:
        return LocalStore(
            os.path.join(self.root, *prefix.rstrip("/").split("/")), self.retry, fsync=self.fsync,
            lock_seconds=self.lock_seconds,
        )

    # ------------------------------------------------------------------ helpers

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Map OS errors: permissions to StorePermissionError, flaky (NFS) ones to TransientStoreError."""
        try:
            yield
        except (FileNotFoundError, FileExistsError, StoreConfigError):
            raise
        except PermissionError as e:
            raise StorePermissionError(
                f"permission denied for {op} {key!r} in {self.url} ({e.filename}): make the folder writable "
                "by this user (owner and mode), or choose another checkpoint folder"
            ) from e
        except NotADirectoryError as e:
            raise StoreConfigError(
                f"cannot {op} {key!r} in {self.url}: a part of its path is a file ({e.filename}); in a local "
                "folder store a key cannot also be a prefix of other keys, and the root must be a folder"
            ) from e
        except OSError as e:
            if e.errno in _TRANSIENT_ERRNOS:
                raise TransientStoreError(f"{op} {key!r} in {self.url}: {e}") from e
            raise

    def _fsync_dir(self, folder: str) -> None:
        if not self.fsync:
            return
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _locked(self, folder: str) -> contextlib.AbstractContextManager[None]:
        """The exclusive lock on ``folder``, waited for at most ``lock_seconds`` (:mod:`.folder_lock`)."""
        return folder_lock(folder, self.lock_seconds)

    def _makedirs(self, folder: str) -> None:
        """Create ``folder`` and missing parents, fsyncing each new entry's parent."""
        missing: list[str] = []
        current = folder
        while not os.path.isdir(current):
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        for created in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(created)
            self._fsync_dir(os.path.dirname(created))

    def _write_temp(self, folder: str, data: bytes) -> str:
        """Write ``data`` to a fresh fsynced temporary file in ``folder`` (created if needed)."""
        for _ in range(5):
            self._makedirs(folder)
            tmp = os.path.join(folder, f"{_TMP}{uuid.uuid4().hex}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:
                continue  # a concurrent delete pruned the empty folder: create it again
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    if self.fsync:
                        os.fsync(f.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return tmp
        raise TransientStoreError(f"folder {folder} kept disappearing while writing to it")

    def _replace(self, tmp: str, path: str, key: str) -> None:
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            raise StoreConfigError(
                f"cannot write {key!r} in {self.url}: it is a folder holding other keys; in a local folder "
                "store a key cannot also be a prefix of other keys"
            ) from None

    # ------------------------------------------------------------------ backend hooks

    def _get_with_etag(self, key: str) -> tuple[bytes, str]:
        with self._errors("get", key):
            try:
                with open(self._path(key), "rb") as f:
                    data = f.read()
            except (IsADirectoryError, NotADirectoryError, FileNotFoundError):
                raise FileNotFoundError(f"no object {key!r} in {self.url}") from None
        return data, content_etag(data)

    def _exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        folder = os.path.dirname(path)
        with self._errors("put", key):
            tmp = self._write_temp(folder, data)
            try:
                with self._locked(folder):
                    self._replace(tmp, path, key)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            self._fsync_dir(folder)

    def _put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        folder = os.path.dirname(path)
        with self._errors("put_if_absent", key):
            tmp = self._write_temp(folder, data)
            try:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise FileExistsError(f"object {key!r} already exists in {self.url}") from None
                except OSError as e:
                    if e.errno not in _NO_HARDLINKS:
                        raise
                    with self._locked(folder):
                        if os.path.lexists(path):
                            raise FileExistsError(f"object {key!r} already exists in {self.url}") from None
                        self._replace(tmp, path, key)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            self._fsync_dir(folder)

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        path = self._path(key)
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            raise PreconditionFailed(f"object {key!r} in {self.url} does not exist (expected etag {etag})")
        with self._errors("put_if_match", key):
            tmp = self._write_temp(folder, data)
            try:
                with self._locked(folder):
                    try:
                        with open(path, "rb") as f:
                            current = content_etag(f.read())
                    except (FileNotFoundError, IsADirectoryError):
                        current = None
                    if current != etag:
                        state = "does not exist" if current is None else "has changed"
                        raise PreconditionFailed(
                            f"object {key!r} in {self.url} {state} (expected etag {etag})"
                        )
                    self._replace(tmp, path, key)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            self._fsync_dir(folder)
        return content_etag(data)

    def _list(self, prefix: str) -> list[str]:
        base = prefix.rpartition("/")[0]
        start = self._path(base) if base else self.root
        keys: list[str] = []
        with self._errors("list", prefix):
            for folder, subfolders, files in os.walk(start):
                rel = os.path.relpath(folder, self.root)
                rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
                # Descend only into folders that can hold matching keys.
                subfolders[:] = [
                    d
                    for d in subfolders
                    if not d.startswith(RESERVED_PREFIX)
                    and ((rel + d + "/").startswith(prefix) or prefix.startswith(rel + d + "/"))
                ]
                keys.extend(
                    rel + f
                    for f in files
                    if not f.startswith(RESERVED_PREFIX) and (rel + f).startswith(prefix)
                )
        return keys

    def _delete(self, key: str) -> None:
        path = self._path(key)
        folder = os.path.dirname(path)
        with self._errors("delete", key):
            try:
                with self._locked(folder):
                    os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return
            self._fsync_dir(folder)
            # Prune folders the delete left empty (rmdir refuses non-empty ones, so this is race-free).
            while folder != self.root and folder.startswith(self.root + os.sep):
                try:
                    os.rmdir(folder)
                except OSError:
                    break
                folder = os.path.dirname(folder)
