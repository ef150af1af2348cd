"""Error types raised by every checkpoint store.

Standard exceptions carry the common cases so callers need no store-specific handling:

* a missing key raises :class:`FileNotFoundError`;
* ``put_if_absent`` on an existing key raises :class:`FileExistsError`;
* ``put_if_match`` with a stale etag raises :class:`PreconditionFailed` (a ``FileExistsError``).

Everything else is a :class:`StoreError`. Only :class:`TransientStoreError` is retried (by the
policy in :mod:`dstreams.recovery.retry`); the others are permanent and their messages say how to
fix the cause. A missing bucket is deliberately *not* a ``FileNotFoundError``: a caller treating
"no checkpoint yet" as a fresh start must not silently start fresh against a misspelt bucket.
"""

from __future__ import annotations

from dstreams.errors import DStreamsError


class StoreError(DStreamsError):
    """Base class of the store's own errors (permanent unless :class:`TransientStoreError`)."""


class TransientStoreError(StoreError):
    """A fault that may go away on its own: throttling, 5xx, connection reset, timeout."""


class StoreUnavailableError(StoreError):
    """The retry policy gave up: the store kept failing transiently for the whole time bound."""


class PreconditionFailed(DStreamsError, FileExistsError):  # noqa: N818 - named after the HTTP status it mirrors
    """``put_if_match``: the object changed (or vanished) since the caller read its etag."""


class BucketNotFoundError(StoreError):
    """The bucket named in an ``s3://`` URL does not exist."""


class StoreAuthError(StoreError):
    """The store rejected or could not find credentials."""


class StorePermissionError(StoreError, PermissionError):
    """The credentials are valid but not allowed to do this operation."""


class StoreConfigError(StoreError):
    """The store is misconfigured (bad URL, bad option, a key that collides with a folder...)."""
