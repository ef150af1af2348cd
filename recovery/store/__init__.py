"""Checkpoint stores: one small interface, three backends, one retry policy.

``open_store(url_or_path, **options)`` picks the backend from the URL:

* ``s3://bucket/prefix`` (or ``s3a://``): :class:`~.s3.S3Store` rooted at ``prefix``; options are
  ``S3Store``'s (``endpoint_url``, ``access_key``, ``secret_key``, ``region``, ``path_style``, ...).
* ``memory://name[/prefix]``: the process-wide in-memory store ``name`` (same name, same store).
* ``file:///path`` or a plain path: :class:`~.local.LocalStore` in that folder (the default).

Every backend also takes ``retry`` (a :class:`~dstreams.recovery.retry.RetryPolicy`) or
``retry_seconds`` (the bound of the default policy; default ``$DSTREAMS_STORE_RETRY_SECONDS`` or 30).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from .. import retry as _retry
from .base import Store, content_etag
from .errors import (
    BucketNotFoundError,
    PreconditionFailed,
    StoreAuthError,
    StoreConfigError,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
    TransientStoreError,
)
from .keys import as_root, validate_key, validate_prefix

__all__ = [
    "STORE_SCHEMES",
    "BucketNotFoundError",
    "PreconditionFailed",
    "Store",
    "StoreAuthError",
    "StoreConfigError",
    "StoreError",
    "StorePermissionError",
    "StoreUnavailableError",
    "TransientStoreError",
    "content_etag",
    "is_store_url",
    "local_path",
    "open_store",
    "validate_key",
]


#: URL schemes of object stores (S3-compatible, through boto3).
STORE_SCHEMES = ("s3", "s3a")


def is_store_url(location: str | os.PathLike[str] | None) -> bool:
    """Whether ``location`` names an object store (``s3://``/``s3a://``) rather than a local folder.

    The one place that decides it: checkpoints, file sources and sinks all ask here.
    """
    return location is not None and urlsplit(os.fspath(location)).scheme.lower() in STORE_SCHEMES


def local_path(location: str | os.PathLike[str]) -> str | None:
    """The local path that ``location`` names, or None when it is a URL of anything else.

    A plain path is returned as it is and a ``file://`` URL without its scheme (``file:///data/x`` ->
    ``/data/x``); an ``s3://``, ``memory://``, ``hdfs://`` (any other ``scheme://``) location is not local.
    The one place that decides it: checkpoint locations and the text sink ask here (with
    :func:`is_store_url` for object stores).
    """
    text = os.fspath(location)
    if text.startswith("file://"):
        return text[len("file://"):]
    return None if "://" in text else text


def _root_from_path(path: str, url: str) -> str:
    path = path.strip("/")
    if not path:
        return ""
    try:
        return as_root(validate_prefix(path))
    except ValueError as e:
        raise StoreConfigError(f"bad prefix in store URL {url!r}: {e}") from None


def open_store(url_or_path: str | os.PathLike[str], **options: Any) -> Store:
    """Open the store named by ``url_or_path`` (see the module docstring)."""
    retry = options.pop("retry", None)
    retry_seconds = options.pop("retry_seconds", None)
    if retry is None:
        retry = _retry.RetryPolicy.from_env(retry_seconds)
    elif retry_seconds is not None:
        raise TypeError("pass either retry or retry_seconds to open_store, not both")

    text = os.fspath(url_or_path)
    if not isinstance(text, str) or not text:
        raise StoreConfigError(f"store location must be a non-empty path or URL, got {url_or_path!r}")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in STORE_SCHEMES:
        from .s3 import S3Store

        if not parts.netloc:
            raise StoreConfigError(f"store URL {text!r} names no bucket: use s3://<bucket>/<prefix>")
        return S3Store(parts.netloc, _root_from_path(unquote(parts.path), text), retry, **options)
    if scheme == "memory":
        from .memory import named

        _no_options("memory", options)
        if not parts.netloc:
            raise StoreConfigError(f"store URL {text!r} names no store: use memory://<name>[/<prefix>]")
        store = named(parts.netloc, retry)
        root = _root_from_path(unquote(parts.path), text)
        return store.child(root) if root else store
    if scheme == "file" or scheme == "" or len(scheme) == 1:  # len 1: a Windows drive letter
        from .local import LocalStore

        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise StoreConfigError(f"file URL {text!r} names a remote host; use file:///absolute/path")
            text = unquote(parts.path)
        return LocalStore(text, retry, **options)
    raise StoreConfigError(
        f"unsupported store URL scheme {parts.scheme!r} in {text!r}: use s3://bucket/prefix, "
        "file:///path (or a plain path) or memory://name"
    )


def _no_options(kind: str, options: dict[str, Any]) -> None:
    if options:
        raise TypeError(
            f"the {kind} store takes no options besides retry/retry_seconds, got {sorted(options)}"
        )
