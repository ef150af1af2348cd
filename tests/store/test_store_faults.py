"""Retries and error reporting: injected faults, the time bound, and real misconfigured S3 servers."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from dstreams.recovery.retry import ENV_RETRY_SECONDS, RetryPolicy
from dstreams.recovery.store import (
    BucketNotFoundError,
    Store,
    StoreAuthError,
    StorePermissionError,
    StoreUnavailableError,
    TransientStoreError,
    open_store,
)
from dstreams.recovery.store.faulty import FaultyStore
from dstreams.recovery.store.memory import MemoryStore
from dstreams.recovery.store.s3 import S3Store

FAST = RetryPolicy(total_seconds=5.0, initial=0.001, maximum=0.01)


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "retrying" in r.getMessage()
    ]


def test_transient_failures_are_retried_and_logged(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    faulty = FaultyStore(store, fail_times=2, ops={"put"}, retry=FAST)
    with caplog.at_level(logging.WARNING, logger="dstreams.recovery.store"):
        faulty.put("ckpt/1", b"data")
    assert store.get("ckpt/1") == b"data"
    assert faulty.failures["put"] == 2 and faulty.calls["put"] == 3
    warnings = retry_warnings(caplog)
    assert len(warnings) == 2
    assert all("put 'ckpt/1'" in w and "injected fault" in w for w in warnings), warnings


def test_faults_hit_only_the_chosen_operations() -> None:
    faulty = FaultyStore(MemoryStore(FAST), fail_times=1, ops={"get"})
    faulty.put("k", b"v")  # not failed
    assert faulty.remaining == 1
    assert faulty.get("k") == b"v"  # fails once, retried
    assert faulty.failures == {"get": 1}
    with pytest.raises(ValueError, match="unknown store operations"):
        FaultyStore(MemoryStore(FAST), ops={"rename"})


def test_conditional_writes_recover_from_a_lost_response() -> None:
    """The write reached the store but its answer was lost: the retry must not report a conflict."""
    inner = MemoryStore(FAST)
    faulty = FaultyStore(inner, fail_times=1, ops={"put_if_absent", "put_if_match"}, when="after")
    faulty.put_if_absent("epoch", b"1")
    assert inner.get("epoch") == b"1"
    _, etag = inner.get_with_etag("epoch")
    faulty = FaultyStore(inner, fail_times=1, ops={"put_if_match"}, when="after")
    new_etag = faulty.put_if_match("epoch", b"2", etag)
    assert inner.get_with_etag("epoch") == (b"2", new_etag)
    # ... but a real conflict after a lost response is still a conflict.
    faulty = FaultyStore(inner, fail_times=1, ops={"put_if_absent"}, when="after")
    with pytest.raises(FileExistsError):
        faulty.put_if_absent("epoch", b"3")


@pytest.mark.serial  # times the retry bound to within 1.1 s
def test_giving_up_after_the_time_bound_says_so(caplog: pytest.LogCaptureFixture) -> None:
    bound = RetryPolicy(total_seconds=0.4, initial=0.02, maximum=0.1)
    faulty = FaultyStore(MemoryStore(), fail_times=10_000, ops={"get"}, retry=bound)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(StoreUnavailableError) as gave_up:
        faulty.get("state/7")
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 1.5
    message = str(gave_up.value)
    assert "unreachable for 0.4 s" in message and "bound 0.4 s" in message
    assert "'state/7'" in message and ENV_RETRY_SECONDS in message
    assert isinstance(gave_up.value.__cause__, TransientStoreError)
    assert faulty.failures["get"] >= 3 and len(retry_warnings(caplog)) == faulty.failures["get"] - 1


def test_permanent_errors_are_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    denied = StorePermissionError("access denied for put 'k': grant s3:PutObject")
    faulty = FaultyStore(MemoryStore(), fail_times=5, error=denied, ops={"put"}, retry=FAST)
    with caplog.at_level(logging.WARNING), pytest.raises(StorePermissionError, match="grant"):
        faulty.put("k", b"v")
    assert faulty.calls["put"] == 1
    assert retry_warnings(caplog) == []


def test_zero_bound_means_one_attempt() -> None:
    faulty = FaultyStore(MemoryStore(), fail_times=1, retry=RetryPolicy(total_seconds=0))
    with pytest.raises(StoreUnavailableError, match="1 attempts"):
        faulty.exists("k")


def test_retry_bound_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_RETRY_SECONDS, "2.5")
    assert RetryPolicy.from_env().total_seconds == 2.5
    assert open_store("memory://env-test").retry.total_seconds == 2.5
    assert open_store("memory://env-test", retry_seconds=1).retry.total_seconds == 1
    monkeypatch.setenv(ENV_RETRY_SECONDS, "soon")
    with pytest.raises(ValueError, match=f"{ENV_RETRY_SECONDS}='soon' is not a number"):
        RetryPolicy.from_env()
    monkeypatch.delenv(ENV_RETRY_SECONDS)
    assert RetryPolicy.from_env().total_seconds == 30
    with pytest.raises(ValueError, match="total_seconds"):
        RetryPolicy(total_seconds=-1)


def test_s3_error_responses_are_mapped(caplog: pytest.LogCaptureFixture) -> None:
    """Answers no test server gives on demand (throttling, 500, access denied), via botocore's Stubber."""
    store = S3Store(
        "bucket", "p", endpoint_url="http://127.0.0.1:9", access_key="a", secret_key="b", retry=FAST
    )
    with Stubber(store._shared.client) as stub, caplog.at_level(logging.WARNING):
        stub.add_client_error("put_object", "SlowDown", "Reduce your request rate", 503)
        stub.add_client_error("put_object", "InternalError", "oops", 500)
        stub.add_response("put_object", {"ETag": '"abc"'})
        store.put("k", b"v")
        assert len(retry_warnings(caplog)) == 2 and "SlowDown" in retry_warnings(caplog)[0]
        stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403)
        with pytest.raises(StorePermissionError, match="lack permission"):
            store.get("k")
        stub.add_client_error("put_object", "ConditionalRequestConflict", "busy", 409)
        stub.add_client_error("put_object", "PreconditionFailed", "no", 412)
        # After a transient failure a 412 may be our own write: the store reads the object to check.
        body = StreamingBody(io.BytesIO(b"someone else's"), 14)
        stub.add_response("get_object", {"Body": body, "ETag": '"e"'}, {"Bucket": "bucket", "Key": "p/k"})
        with pytest.raises(FileExistsError):
            store.put_if_absent("k", b"v")
        stub.assert_no_pending_responses()


@pytest.mark.s3
def test_unreachable_endpoint_is_retried_then_reported(caplog: pytest.LogCaptureFixture) -> None:
    store = S3Store(
        "bucket",
        endpoint_url="http://127.0.0.1:9",
        access_key="k",
        secret_key="s",  # refused
        retry=RetryPolicy(total_seconds=0.5, initial=0.05, maximum=0.2),
    )
    with caplog.at_level(logging.WARNING), pytest.raises(StoreUnavailableError, match="unreachable for"):
        store.get("k")
    assert retry_warnings(caplog)


@pytest.mark.s3
@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_missing_bucket_is_a_clear_permanent_error(
    server_name: str, s3_server: Callable[[str], Any], caplog: pytest.LogCaptureFixture
) -> None:
    server = s3_server(server_name)
    store = server.store("no-such-bucket-dstreams", "ckpt")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        for operation in (
            lambda: store.get("k"),
            lambda: store.put_if_absent("k", b"x"),
            lambda: store.list(),
            lambda: store.exists("k"),
        ):
            with pytest.raises(BucketNotFoundError) as missing:
                operation()
            assert not isinstance(missing.value, FileNotFoundError)
            message = str(missing.value)
            assert "'no-such-bucket-dstreams' does not exist" in message
            assert f"aws s3 mb s3://no-such-bucket-dstreams --endpoint-url {server.endpoint}" in message
    assert time.monotonic() - started < 3
    assert retry_warnings(caplog) == []


@pytest.mark.s3
def test_wrong_credentials_against_rgw_are_a_clear_error(rgw_bucket: S3Store) -> None:
    def with_keys(access_key: str, secret_key: str) -> S3Store:
        return S3Store(
            rgw_bucket.bucket,
            endpoint_url=rgw_bucket.endpoint,
            access_key=access_key,
            secret_key=secret_key,
            retry=FAST,
        )

    bad = with_keys("WRONGKEY", "WRONGSECRET")
    started = time.monotonic()
    for operation in (lambda: bad.get("k"), lambda: bad.exists("k"), lambda: bad.put("k", b"x")):
        with pytest.raises(StoreAuthError) as rejected:
            operation()
        message = str(rejected.value)
        assert "rejected the credentials" in message and "AWS_ACCESS_KEY_ID" in message
        assert "access_key=" in message and "came from: explicit" in message
    assert time.monotonic() - started < 3
    with pytest.raises(StoreAuthError, match="SignatureDoesNotMatch"):
        with_keys("AKTEST", "WRONGSECRET").put("k", b"x")
