"""open_store: choosing the backend from a URL or path, and S3 configuration from the environment."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dstreams.recovery.store import StoreConfigError, is_store_url, local_path, open_store
from dstreams.recovery.store.local import LocalStore
from dstreams.recovery.store.memory import MemoryStore, clear_named
from dstreams.recovery.store.s3 import S3Store


def test_plain_paths_and_file_urls_open_local_folders(tmp_path: Path) -> None:
    by_path = open_store(tmp_path / "ckpt")
    by_str = open_store(str(tmp_path / "ckpt"))
    by_url = open_store((tmp_path / "ckpt").as_uri())
    assert all(isinstance(s, LocalStore) for s in (by_path, by_str, by_url))
    by_path.put("a/b", b"1")
    assert by_url.get("a/b") == b"1" and by_str.list() == ["a/b"]
    assert by_url.url == (tmp_path / "ckpt").as_uri()
    assert (tmp_path / "ckpt" / "a" / "b").read_bytes() == b"1"


def test_local_path_is_the_folder_of_plain_paths_and_file_urls_only(tmp_path: Path) -> None:
    assert local_path(tmp_path / "ckpt") == str(tmp_path / "ckpt")
    assert local_path("relative/ckpt") == "relative/ckpt"
    assert local_path(f"file://{tmp_path}/ckpt") == f"{tmp_path}/ckpt"
    for url in ("s3://bucket/prefix", "s3a://bucket", "memory://name/p", "hdfs://nn:8020/ckpt"):
        assert local_path(url) is None, url
    assert is_store_url("s3://bucket/prefix") and not is_store_url(tmp_path)


def test_relative_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("rel/ckpt")
    assert isinstance(store, LocalStore) and store.root == str(tmp_path / "rel" / "ckpt")


def test_memory_stores_with_the_same_name_are_shared() -> None:
    name = f"shared-{uuid.uuid4().hex[:6]}"
    first, second = open_store(f"memory://{name}"), open_store(f"memory://{name}")
    first.put("k", b"v")
    assert second.get("k") == b"v"
    rooted = open_store(f"memory://{name}/jobs/one")
    rooted.put("k", b"one")
    assert first.get("jobs/one/k") == b"one" and rooted.url == f"memory://{name}/jobs/one/"
    assert open_store("memory://another").list() == []
    assert MemoryStore().list() == []  # anonymous stores share nothing
    clear_named()
    assert open_store(f"memory://{name}").list() == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("hdfs://nn/ckpt", "unsupported store URL scheme 'hdfs'"),
        ("s3:///prefix", "names no bucket"),
        ("memory://", "names no store"),
        ("file://otherhost/x", "remote host"),
        ("s3://bucket/a/../b", "bad prefix"),
        ("", "non-empty"),
    ],
)
def test_bad_urls_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(StoreConfigError, match=message):
        open_store(url)


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(TypeError, match="no options"):
        open_store("memory://x", endpoint_url="http://x")
    with pytest.raises(TypeError, match="either retry or retry_seconds"):
        open_store("memory://x", retry=MemoryStore().retry, retry_seconds=3)
    with pytest.raises(StoreConfigError, match="both access_key and secret_key"):
        open_store("s3://bucket", access_key="only-half")


def test_s3_url_parsing_does_not_need_a_server() -> None:
    store = open_store(
        "s3://my-bucket/jobs/wordcount",
        endpoint_url="http://127.0.0.1:9",
        access_key="a",
        secret_key="b",
        region="eu-west-1",
    )
    assert isinstance(store, S3Store)
    assert store.url == "s3://my-bucket/jobs/wordcount/" and store.endpoint == "http://127.0.0.1:9"
    assert store._shared.client.meta.config.s3["addressing_style"] == "path"
    assert store.child("state").url == "s3://my-bucket/jobs/wordcount/state/"
    assert open_store("s3a://my-bucket", endpoint_url="http://127.0.0.1:9").url == "s3://my-bucket/"
    virtual = open_store("s3://my-bucket", endpoint_url="http://127.0.0.1:9", path_style=False)
    assert virtual._shared.client.meta.config.s3["addressing_style"] == "virtual"


@pytest.mark.s3
def test_s3_configuration_from_the_standard_environment(
    moto_bucket: S3Store, s3_server: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only environment variables, as a user on a cluster would configure it."""
    server = s3_server("moto")
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    store = open_store(f"s3://{moto_bucket.bucket}/from-env", retry_seconds=2)
    assert isinstance(store, S3Store) and store.endpoint == server.endpoint
    assert store._shared.client.meta.config.s3["addressing_style"] == "path"
    store.put_if_absent("hello", b"world")
    assert moto_bucket.get("from-env/hello") == b"world"
    assert store.child("x").url == f"s3://{moto_bucket.bucket}/from-env/x/"
