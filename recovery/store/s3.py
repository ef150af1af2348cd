"""S3-compatible store (boto3): AWS S3, Ceph RADOS Gateway, moto, ... at any endpoint URL.

Configuration: explicit options win, else boto3's standard chain applies (``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
``AWS_PROFILE``, ``AWS_REGION``, config files, instance roles). Path-style addressing
(``http://host/bucket/key``) is the default whenever an endpoint URL is configured, since
self-hosted servers rarely have per-bucket DNS names; ``path_style=False`` forces virtual hosts.

How the contract is met:

* ``put_if_absent``: ``PutObject`` with ``If-None-Match: *``; 412 means the key exists.
* ``put_if_match``: ``PutObject`` with ``If-Match: <etag>``; 412 (or 404 on a vanished key) means
  the precondition failed. Etags travel *without* their surrounding quotes: Ceph RGW (16.2)
  answers 412 to a quoted ``If-Match`` even when the etag matches; AWS and moto accept both.
* etag: the server's ``ETag`` header, unquoted (the content MD5 for single-part uploads).
* ``list``: ``ListObjectsV2`` pages of ``page_size`` keys.
* boto3's own retries are off (one attempt per call) so that the store's single retry policy owns
  retries; throttling, 5xx, 409 ConditionalRequestConflict, connection and timeout errors become
  :class:`TransientStoreError`, everything else a permanent error saying how to fix it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
import botocore.exceptions as bx
import botocore.loaders
import botocore.session
from botocore.config import Config

from .base import Store
from .errors import (
    BucketNotFoundError,
    PreconditionFailed,
    StoreAuthError,
    StoreConfigError,
    StoreError,
    StorePermissionError,
    TransientStoreError,
)
from .keys import as_root, validate_prefix

if TYPE_CHECKING:
    from ..retry import RetryPolicy

_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_loader_lock = threading.Lock()
_loader: botocore.loaders.Loader | None = None


def _data_loader() -> botocore.loaders.Loader:
    """botocore's model loader, one per process and shared by every session made here.

    Each new boto3 session otherwise reads and decodes the S3 service model and endpoint rules again
    (about 60 ms of CPU per client; a Python worker opening its first store paid it on every fork).
    The loader only caches read-only model data; credentials stay per session.
    """
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        return _loader


def warm_worker() -> None:
    """Import and load what an S3 client needs, before a worker daemon forks its workers.

    ``dstreams.spark.worker_daemon`` calls it when ``DSTREAMS_WORKER_PRELOAD`` names this module: every
    forked worker then inherits boto3 and the loaded S3 model instead of paying ~250 ms of CPU for
    them at its first store access. No client is kept and nothing touches the network.
    """
    session = _session(None, None, None, "us-east-1", None)
    session.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def _session(access_key: str | None, secret_key: str | None, session_token: str | None, region: str | None,
             profile: str | None) -> boto3.session.Session:
    core = botocore.session.Session()
    core.register_component("data_loader", _data_loader())
    return boto3.session.Session(
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        aws_session_token=session_token,
        region_name=region,
        profile_name=profile,
        botocore_session=core,
    )
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "RequestLimitExceeded",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "ConditionalRequestConflict",
    "OperationAborted",
}
_AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "AuthorizationHeaderMalformed",
    "InvalidSecurity",
    "RequestTimeTooSkewed",
}
_CREDENTIALS_HELP = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary credentials) "
    "or AWS_PROFILE, or pass access_key=/secret_key= to open_store"
)


class _Shared:
    """What a store and its children share: the client, the bucket and the bucket-exists check."""

    def __init__(self, client: Any, bucket: str, endpoint: str | None, credentials_source: str) -> None:
        self.client = client
        self.bucket = bucket
        self.endpoint = endpoint
        self.credentials_source = credentials_source
        self.bucket_checked = False


def _configured_endpoint(endpoint_url: str | None) -> str | None:
    if endpoint_url:
        return endpoint_url
    return next((os.environ[name] for name in _ENDPOINT_ENV if os.environ.get(name)), None)


class S3Store(Store):
    """A store in ``bucket`` under ``prefix``. See the module docstring for options and behaviour."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        retry: RetryPolicy | None = None,
        *,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        path_style: bool | None = None,
        page_size: int = 1000,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_pool_connections: int = 16,
        _shared: _Shared | None = None,
    ) -> None:
        super().__init__(retry)
        if not bucket or "/" in bucket:
            raise StoreConfigError(f"invalid S3 bucket name {bucket!r}: use s3://<bucket>/<prefix>")
        if not 1 <= page_size <= 1000:
            raise StoreConfigError(f"page_size must be between 1 and 1000, got {page_size}")
        self.page_size = page_size
        try:
            self._root = as_root(validate_prefix(prefix.strip("/")))
        except ValueError as e:
            raise StoreConfigError(f"bad S3 prefix {prefix!r}: {e}") from None
        self._shared = _shared or self._connect(
            bucket,
            endpoint_url=endpoint_url,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            region=region,
            profile=profile,
            path_style=path_style,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
        )

    @staticmethod
    def _connect(
        bucket: str,
        *,
        endpoint_url: str | None,
        access_key: str | None,
        secret_key: str | None,
        session_token: str | None,
        region: str | None,
        profile: str | None,
        path_style: bool | None,
        connect_timeout: float,
        read_timeout: float,
        max_pool_connections: int,
    ) -> _Shared:
        if (access_key is None) != (secret_key is None):
            raise StoreConfigError("pass both access_key and secret_key to open_store, or neither")
        endpoint = _configured_endpoint(endpoint_url)
        if path_style is None:
            path_style = endpoint is not None
        try:
            session = _session(access_key, secret_key, session_token, region, profile)
            config = Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                s3={"addressing_style": "path" if path_style else "virtual"},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                max_pool_connections=max_pool_connections,
            )
            client = session.client(
                "s3",
                endpoint_url=endpoint_url,
                config=config,
                region_name=session.region_name or "us-east-1",
            )
        except bx.ProfileNotFound as e:
            raise StoreAuthError(
                f"{e}: fix AWS_PROFILE or the profile= option, or {_CREDENTIALS_HELP}"
            ) from e
        except ValueError as e:  # botocore: "Invalid endpoint: ..."
            raise StoreConfigError(f"cannot use S3 endpoint {endpoint!r}: {e}") from e
        try:
            credentials = session.get_credentials()
        except bx.BotoCoreError:
            credentials = None
        source = credentials.method if credentials is not None else "none found"
        return _Shared(client, bucket, client.meta.endpoint_url if endpoint else None, source)

    # ------------------------------------------------------------------ description

    @property
    def bucket(self) -> str:
        return self._shared.bucket

    @property
    def endpoint(self) -> str | None:
        """The endpoint URL in use, or None for AWS's default endpoints."""
        return self._shared.endpoint

    @property
    def url(self) -> str:
        return f"s3://{self._shared.bucket}/{self._root}"

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint or 'AWS'})"

    def _child(self, prefix: str) -> S3Store:
        return S3Store(
            self._shared.bucket,
            self._root + prefix,
            self.retry,
            page_size=self.page_size,
            _shared=self._shared,
        )

    # ------------------------------------------------------------------ error mapping

    def _where(self) -> str:
        return f"{self.url} (endpoint {self.endpoint or 'AWS S3'})"

    def _bucket_missing(self) -> BucketNotFoundError:
        bucket, endpoint = self._shared.bucket, self.endpoint
        how = f"aws s3 mb s3://{bucket}" + (f" --endpoint-url {endpoint}" if endpoint else "")
        return BucketNotFoundError(
            f"S3 bucket {bucket!r} does not exist at {endpoint or 'AWS S3'}: create it first "
            f"(e.g. `{how}`, or boto3 create_bucket(Bucket={bucket!r})) or fix the bucket in the store URL"
        )

    def _map_client_error(self, e: bx.ClientError, op: str, key: str) -> Exception:
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = e.response.get("Error", {}).get("Message") or ""
        detail = f"{op} {key!r} in {self._where()}: {code or status} {message}"
        if code in _TRANSIENT_CODES or status >= 500 or status in (408, 429):
            return TransientStoreError(detail.rstrip())
        if code == "NoSuchBucket":
            return self._bucket_missing()
        if code in ("NoSuchKey", "404", "NotFound"):
            return FileNotFoundError(f"no object {key!r} in {self.url}")
        if code == "PreconditionFailed" or status == 412:
            return PreconditionFailed(f"object {key!r} in {self.url} has changed or does not exist")
        if code == "RequestTimeTooSkewed":
            return StoreAuthError(
                f"{detail}: this machine's clock differs too much from the server's; sync it"
            )
        if code in _AUTH_CODES or (status == 403 and code in ("403", "Forbidden")):
            return StoreAuthError(
                f"the S3 server rejected the credentials ({code}) for {op} {key!r} in {self._where()}; "
                f"credentials came from: {self._shared.credentials_source}. Check them: {_CREDENTIALS_HELP}"
            )
        if code == "AccessDenied" or status == 403:
            return StorePermissionError(
                f"access denied for {op} {key!r} in {self._where()}: the credentials (from "
                f"{self._shared.credentials_source}) are valid but lack permission; grant s3:GetObject, "
                "s3:PutObject, s3:DeleteObject and s3:ListBucket on the bucket, or use other credentials"
            )
        if code in ("InvalidBucketName", "InvalidArgument", "InvalidRequest", "NotImplemented"):
            return StoreConfigError(f"{detail} (does this server support conditional writes?)")
        return StoreError(detail)

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        try:
            yield
        except bx.ClientError as e:
            raise self._map_client_error(e, op, key) from e
        except (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError) as e:
            raise StoreAuthError(
                f"no usable S3 credentials for {self._where()} ({e}): {_CREDENTIALS_HELP}"
            ) from e
        except bx.SSLError as e:
            raise StoreConfigError(f"TLS error talking to {self._where()}: {e}") from e
        except (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError) as e:
            raise TransientStoreError(f"{op} {key!r} in {self._where()}: {e}") from e
        except bx.ParamValidationError as e:
            raise StoreConfigError(f"{op} {key!r} in {self._where()}: {e}") from e

    def _check_bucket(self) -> None:
        """Raise BucketNotFoundError if the bucket is missing (checked once per client)."""
        if self._shared.bucket_checked:
            return
        try:
            with self._errors("check bucket", ""):
                self._shared.client.head_bucket(Bucket=self._shared.bucket)
        except FileNotFoundError:
            raise self._bucket_missing() from None
        self._shared.bucket_checked = True

    # ------------------------------------------------------------------ backend hooks

    def _get_with_etag(self, key: str) -> tuple[bytes, str]:
        with self._errors("get", key):
            response = self._shared.client.get_object(Bucket=self._shared.bucket, Key=self._root + key)
            data = response["Body"].read()
        return data, response["ETag"].strip('"')

    def _exists(self, key: str) -> bool:
        try:
            with self._errors("exists", key):
                self._shared.client.head_object(Bucket=self._shared.bucket, Key=self._root + key)
        except FileNotFoundError:
            self._check_bucket()  # a HEAD answers a bare 404 for a missing bucket too
            return False
        return True

    def _put(self, key: str, data: bytes) -> None:
        with self._errors("put", key):
            self._shared.client.put_object(Bucket=self._shared.bucket, Key=self._root + key, Body=data)

    def _put_if_absent(self, key: str, data: bytes) -> None:
        try:
            with self._errors("put_if_absent", key):
                self._shared.client.put_object(
                    Bucket=self._shared.bucket, Key=self._root + key, Body=data, IfNoneMatch="*"
                )
        except PreconditionFailed:
            raise FileExistsError(f"object {key!r} already exists in {self.url}") from None

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        try:
            with self._errors("put_if_match", key):
                response = self._shared.client.put_object(
                    Bucket=self._shared.bucket, Key=self._root + key, Body=data, IfMatch=etag
                )
        except FileNotFoundError:
            raise PreconditionFailed(
                f"object {key!r} in {self.url} does not exist (expected etag {etag})"
            ) from None
        except PreconditionFailed:
            raise PreconditionFailed(
                f"object {key!r} in {self.url} has changed (expected etag {etag})"
            ) from None
        return str(response["ETag"]).strip('"')

    def _list(self, prefix: str) -> list[str]:
        cut = len(self._root)
        keys: list[str] = []
        with self._errors("list", prefix):
            pages = self._shared.client.get_paginator("list_objects_v2").paginate(
                Bucket=self._shared.bucket,
                Prefix=self._root + prefix,
                PaginationConfig={"PageSize": self.page_size},
            )
            for page in pages:
                keys.extend(obj["Key"][cut:] for obj in page.get("Contents", ()))
        return keys

    def _delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._shared.client.delete_object(Bucket=self._shared.bucket, Key=self._root + key)
