"""Key validation shared by all backends.

A key is a relative, '/'-separated string such as ``"state/node-3/00042.arrow"``. Rejected with a
``ValueError``: non-strings, the empty key, absolute keys (leading '/'), empty segments ('a//b',
trailing '/'), '.' and '..' segments, backslashes and NUL characters, and segments starting with
:data:`RESERVED_PREFIX` (the local backend's temporary files). A *prefix* (for ``list``) may also
be empty or end with '/'.
"""

from __future__ import annotations

RESERVED_PREFIX = ".dstreams-"


def validate_key(key: object, *, what: str = "key") -> str:
    """Return ``key`` if it is a valid store key, else raise ``ValueError`` saying what is wrong."""
    if not isinstance(key, str):
        raise ValueError(f"store {what} must be a str, got {type(key).__name__}: {key!r}")
    if not key:
        raise ValueError(f"store {what} must not be empty")
    if key.startswith("/"):
        raise ValueError(f"store {what} {key!r} must be relative (no leading '/')")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"store {what} {key!r} must not contain backslashes or NUL characters")
    for segment in key.split("/"):
        if segment == "":
            raise ValueError(f"store {what} {key!r} has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise ValueError(f"store {what} {key!r} must not contain '.' or '..' segments")
        if segment.startswith(RESERVED_PREFIX):
            raise ValueError(f"store {what} {key!r}: segments starting with {RESERVED_PREFIX!r} are reserved")
    return key


def validate_prefix(prefix: object) -> str:
    """Like :func:`validate_key`, but ``""`` (everything) and a trailing '/' are allowed."""
    if prefix == "":
        return ""
    if isinstance(prefix, str) and prefix.endswith("/") and prefix != "/":
        validate_key(prefix[:-1], what="prefix")
        return prefix
    return validate_key(prefix, what="prefix")


def as_root(prefix: str) -> str:
    """Normalise a validated prefix into a root: ``""`` or ending in '/'."""
    return prefix if prefix == "" or prefix.endswith("/") else prefix + "/"
