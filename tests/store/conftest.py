"""Fixtures for the checkpoint store tests.

``store`` runs a test against every backend: memory, local folder, a moto server and a real Ceph
RADOS Gateway (both over HTTP through boto3). The S3 servers are started by
``bash scripts/services.sh start``; their endpoints come from ``DSTREAMS_TEST_MOTO_ENDPOINT`` and
``DSTREAMS_TEST_RGW_ENDPOINT`` (defaults in tests/support.py). A server that does not answer makes
its tests skip with the reason, or fail when services are required (``CI=true``,
``DSTREAMS_REQUIRE_SERVICES=1`` or ``--require-services``: see tests/support.py). Each test module gets
a fresh bucket per server, each test a fresh prefix in it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from dstreams.recovery.retry import RetryPolicy
from dstreams.recovery.store import Store
from dstreams.recovery.store.local import LocalStore
from dstreams.recovery.store.memory import MemoryStore
from dstreams.recovery.store.s3 import S3Store

from ..support import MOTO_ENDPOINT, RGW_ENDPOINT, service_unavailable

# Short bound so that a dead server fails a test in seconds, not 30 s.
TEST_RETRY = RetryPolicy(total_seconds=5.0, initial=0.02, maximum=0.5)
# Small pages so every list over a few keys exercises S3 pagination.
S3_PAGE_SIZE = 4


@dataclass(frozen=True)
class S3Server:
    name: str
    endpoint: str
    access_key: str
    secret_key: str

    def store(self, bucket: str, prefix: str = "", **options: object) -> S3Store:
        options.setdefault("retry", TEST_RETRY)
        options.setdefault("page_size", S3_PAGE_SIZE)
        return S3Store(
            bucket,
            prefix,
            endpoint_url=self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            **options,  # type: ignore[arg-type]
        )


SERVERS = {
    "moto": S3Server("moto", MOTO_ENDPOINT, "testing", "testing"),
    "rgw": S3Server("Ceph RGW", RGW_ENDPOINT, "AKTEST", "SKTEST"),
}


@cache
def answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status) within 2 s."""
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def require(server_name: str) -> S3Server:
    server = SERVERS[server_name]
    if not answers(server.endpoint):
        service_unavailable(
            f"{server.name} does not answer at {server.endpoint}: "
            "start it with `bash scripts/services.sh start` "
            f"(or point DSTREAMS_TEST_{'RGW' if server_name == 'rgw' else 'MOTO'}_ENDPOINT at one)"
        )
    return server


@pytest.fixture
def s3_server() -> Callable[[str], S3Server]:
    """``s3_server("moto" | "rgw")``: the server's endpoint and credentials; skips (or fails, when services
    are required) if it is down."""
    return require


def _bucket(server_name: str) -> Iterator[S3Store]:
    """A fresh bucket on the server, emptied and removed afterwards; yields a store at its root."""
    server = require(server_name)
    bucket = f"dstreams-test-{uuid.uuid4().hex[:12]}"
    root = server.store(bucket)
    client = root._shared.client
    client.create_bucket(Bucket=bucket)
    yield root
    for key in root.list():
        client.delete_object(Bucket=bucket, Key=key)
    client.delete_bucket(Bucket=bucket)


@pytest.fixture(scope="module")
def moto_bucket() -> Iterator[S3Store]:
    yield from _bucket("moto")


@pytest.fixture(scope="module")
def rgw_bucket() -> Iterator[S3Store]:
    yield from _bucket("rgw")


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path, *, fsync: bool = True) -> Store:
    if kind == "memory":
        return MemoryStore(TEST_RETRY)
    if kind == "local":
        return LocalStore(tmp_path / "store", TEST_RETRY, fsync=fsync)
    # A child of the module's bucket store: a fresh prefix sharing one boto3 client (creating a
    # client costs about half a second).
    root: S3Store = request.getfixturevalue(f"{kind}_bucket")
    return root.child(f"t-{uuid.uuid4().hex[:8]}")


BACKENDS = [
    "memory",
    "local",
    pytest.param("moto", marks=pytest.mark.s3),
    pytest.param("rgw", marks=pytest.mark.s3),
]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of each backend."""
    return make_store(request.param, request, tmp_path)


@pytest.fixture(params=["memory", "local"])
def fs_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh store of the cheap backends only, without fsync (for tests with many keys)."""
    return make_store(request.param, request, tmp_path, fsync=False)
