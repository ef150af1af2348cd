"""Exactly-once text sinks: local folders and S3 (moto server) committed by _SUCCESS."""

from __future__ import annotations

import os
import shutil
import urllib.request
import uuid
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dstreams.files.sink import SUCCESS, save_text_exactly_once
from dstreams.recovery.store import open_store
from dstreams.testing import manual_context, run_batches

from ..support import MOTO_ENDPOINT, RGW_ENDPOINT, service_unavailable

MOTO = MOTO_ENDPOINT
MOTO_OPTS = {"endpoint_url": MOTO, "access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


def test_local_sink_skips_committed_and_rewrites_partial(sc, tmp_path):
    path = str(tmp_path / "out-1000")
    assert save_text_exactly_once(sc.parallelize([1, 2], 2), path) is True
    assert save_text_exactly_once(sc.parallelize([9], 1), path) is False  # committed: left alone
    assert sorted(open(os.path.join(path, p)).read() for p in os.listdir(path) if p.startswith("part-")) == [
        "1\n", "2\n"]
    partial = str(tmp_path / "out-2000")
    os.makedirs(partial)
    open(os.path.join(partial, "part-00007"), "w").write("stale\n")
    assert save_text_exactly_once(sc.parallelize([3], 1), partial) is True
    assert not os.path.exists(os.path.join(partial, "part-00007"))


def test_fenced_driver_does_not_commit(sc, tmp_path):
    class Fenced(Exception):  # noqa: N818
        pass

    def guard():
        raise Fenced()

    path = str(tmp_path / "out-3000")
    with pytest.raises(Fenced):
        save_text_exactly_once(sc.parallelize([1], 1), path, guard)
    assert not os.path.exists(os.path.join(path, "_SUCCESS"))


@pytest.mark.s3
def test_s3_sink_through_save_as_text_files(sc, tmp_path):
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=MOTO, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    bucket = f"sink-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"moto server at {MOTO} is not reachable ({e}); run `bash scripts/services.sh start`")
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([[("a", 1), ("b", 2)], [("a", 3)]]).saveAsTextFiles(f"s3://{bucket}/out/counts",
                                                                            **MOTO_OPTS)
        ssc.start()
        run_batches(ssc, 2, timeout=120)
    store = open_store(f"s3://{bucket}/out", **MOTO_OPTS)
    keys = store.list("")
    assert "counts-1000/_SUCCESS" in keys and "counts-2000/_SUCCESS" in keys
    lines = b"".join(store.get(k) for k in keys if k.startswith("counts-1000/part-")).decode().split()
    assert sorted(lines) == ["('a',", "('b',", "1)", "2)"]


def _moto_bucket(prefix: str) -> str:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=MOTO, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    bucket = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"moto server at {MOTO} is not reachable ({e}); run `bash scripts/services.sh start`")
    return bucket


@pytest.mark.s3
def test_save_to_store_writes_each_batch_once_as_json_lines(sc):
    import json

    bucket = _moto_bucket("store-sink")
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([[("a", 1), ("b", 2)], [("a", 3)]]).saveToStore(f"s3://{bucket}/out", "json", **MOTO_OPTS)
        ssc.start()
        run_batches(ssc, 2, timeout=120)
    store = open_store(f"s3://{bucket}/out", **MOTO_OPTS)
    keys = store.list("")
    assert "000000000001000/_SUCCESS" in keys and "000000000002000/_SUCCESS" in keys
    parts = [k for k in keys if k.startswith("000000000001000/part-")]
    assert parts and all(k.endswith(".jsonl") for k in parts)
    records = [json.loads(line) for k in parts for line in store.get(k).decode().splitlines()]
    assert sorted(records) == [["a", 1], ["b", 2]]


def test_save_to_store_leaves_a_committed_batch_alone_and_rewrites_a_partial_one(sc, tmp_path):
    import pickle

    from dstreams.files.sink import save_to_store_exactly_once

    target = str(tmp_path / "out" / "000000000001000")
    assert save_to_store_exactly_once(sc.parallelize([1, 2, 3], 2), target, format="pickle") is True
    assert save_to_store_exactly_once(sc.parallelize([9], 1), target, format="pickle") is False
    parts = sorted(p for p in os.listdir(target) if p.startswith("part-"))
    assert parts == ["part-00000.pickle", "part-00001.pickle"]
    got = [x for p in parts for x in pickle.loads(open(os.path.join(target, p), "rb").read())]
    assert got == [1, 2, 3]
    partial = str(tmp_path / "out" / "000000000002000")
    os.makedirs(partial)
    open(os.path.join(partial, "part-00007.pickle"), "wb").write(b"stale")
    assert save_to_store_exactly_once(sc.parallelize([4], 1), partial, format="pickle") is True
    assert sorted(os.listdir(partial)) == ["_SUCCESS", "part-00000.pickle"]


def test_save_to_store_refuses_an_unknown_format_and_memory_stores(sc):
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.queueStream([[1]])
        with pytest.raises(ValueError, match="unknown output format 'csv'"):
            stream.saveToStore("s3://b/out", "csv")
        with pytest.raises(ValueError, match="memory://"):
            stream.saveToStore("memory://x/out")


def test_store_specs_of_one_bucket_share_one_client_and_nothing_accumulates():
    """A sink opens a new prefix every batch: one boto3 client per bucket and options, not one per batch."""
    from dstreams.recovery import storespec

    before = len(storespec._cache)
    a = storespec.StoreSpec("s3://spec-share/out/lines-1000", dict(MOTO_OPTS)).open()
    b = storespec.StoreSpec("s3://spec-share/out/lines-2000", dict(MOTO_OPTS)).open()
    root = storespec.StoreSpec("s3://spec-share", dict(MOTO_OPTS)).open()
    assert a._shared is b._shared is root._shared  # one client
    assert a.url == "s3://spec-share/out/lines-1000/" and root.url == "s3://spec-share/"
    assert len(storespec._cache) <= before + 1
    for t in range(3000, 10_000, 1000):
        storespec.StoreSpec(f"s3://spec-share/out/lines-{t}", dict(MOTO_OPTS)).open()
    assert len(storespec._cache) <= before + 1


def test_sinks_report_the_records_they_commit_once(sc, tmp_path):
    from dstreams.files.sink import save_to_store_exactly_once
    from dstreams.output_records import counting

    rdd = sc.parallelize(range(10), 3)
    with counting() as local:
        assert save_text_exactly_once(rdd, str(tmp_path / "text"))
    with counting() as store:
        assert save_to_store_exactly_once(rdd, str(tmp_path / "store"), format="json")
    with counting() as again:  # already committed: nothing written this time
        assert not save_to_store_exactly_once(rdd, str(tmp_path / "store"), format="json")
        assert not save_text_exactly_once(rdd, str(tmp_path / "text"))
    assert (local.total, store.total, again.total) == (10, 10, 0)


def test_batch_infos_carry_the_records_each_output_wrote(sc, tmp_path):
    with manual_context(1, sc=sc) as ssc:
        batches = [list(range(5)), [], list(range(7))]
        stream = ssc.queueStream([sc.parallelize(b, 2) for b in batches])
        stream.saveAsTextFiles(str(tmp_path / "out"))
        stream.map(str).saveToStore(str(tmp_path / "store"), format="json")
        stream.foreachRDD(lambda rdd: rdd.count())  # the user's own output: unknown
        ssc.start()
        infos = run_batches(ssc, 3)
        with urllib.request.urlopen(ssc.uiWebUrl + "/metrics", timeout=10) as r:
            exposition = r.read().decode()
    ops = [op for _, op in sorted(infos[0].output_operations.items())]
    written = [[op.records_written for _, op in sorted(info.output_operations.items())] for info in infos]
    assert written == [[5, 5, None], [0, 0, None], [7, 7, None]]
    (family,) = [f for f in text_string_to_metric_families(exposition) if f.name == "dstreams_output_records"]
    totals = {(s.labels["output"], s.labels["name"]): s.value for s in family.samples
              if s.name == "dstreams_output_records_total"}
    assert totals == {(str(op.output_id), op.output_name): 12 for op in ops[:2]}  # the foreachRDD reports nothing


# ---------------------------------------------------------------------------------------------------
# A zombie driver's sink (issue 22, item 3): a driver that another one took over from must not delete or
# overwrite the output the new owner wrote, whether the owner's write is in progress or committed.
# ---------------------------------------------------------------------------------------------------

RGW = RGW_ENDPOINT
RGW_OPTS = {"endpoint_url": RGW, "access_key": "AKTEST", "secret_key": "SKTEST", "region": "us-east-1"}


def _two_drivers(location: str, options: dict) -> tuple:
    """The metadata logs of a zombie (epoch 1) and of the driver that took over from it (epoch 2), on the
    real MetadataLog at ``location`` (as two driver processes would)."""
    from dstreams.recovery.metadata import MetadataLog

    zombie = MetadataLog(open_store(location, **options), "zombie-sink", ["g"], 1000)
    assert zombie.take_over(0) is None
    owner = MetadataLog(open_store(location, **options), "zombie-sink", ["g"], 1000)
    assert owner.take_over(0) is not None and owner.head["epoch"] == 2
    return zombie, owner


def _sink_location(kind: str, tmp_path) -> tuple[str, dict]:
    """A fresh sink location on ``kind`` (local folder, moto or the Ceph RADOS Gateway) and its store options."""
    if kind == "local":
        return str(tmp_path / "sink"), {}
    boto3 = pytest.importorskip("boto3")
    endpoint, options = (MOTO, MOTO_OPTS) if kind == "moto" else (RGW, RGW_OPTS)
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=options["access_key"],
                          aws_secret_access_key=options["secret_key"], region_name="us-east-1")
    bucket = f"zombie-sink-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"{kind} at {endpoint} is not reachable ({e}); run `bash scripts/services.sh start`")
    return f"s3://{bucket}/sink", dict(options)


@pytest.mark.parametrize("kind", ["local", "moto", "rgw"])
def test_zombie_store_sink_is_fenced_before_it_touches_the_owners_parts(sc, tmp_path, kind):
    from dstreams.files.sink import save_to_store_exactly_once
    from dstreams.recovery.metadata import FencedError

    location, options = _sink_location(kind, tmp_path)
    zombie, owner = _two_drivers(f"{location}/ckpt", options)
    target = f"{location}/out/000000000001000"
    store = open_store(target, **options)
    owners = {"part-00000": b"owner 0\n", "part-00001": b"owner 1\n", "part-00002": b"owner 2\n"}
    for key, data in owners.items():  # the new owner's write of the batch, not committed yet
        store.put(key, data)
    with pytest.raises(FencedError, match="replaced by another driver"):
        save_to_store_exactly_once(sc.parallelize(["zombie"], 1), target, zombie.check_owner, options)
    assert {k: store.get(k) for k in store.list("")} == owners  # not deleted, not overwritten, not committed
    owner.check_owner()  # the owner still owns the location


def test_zombie_local_sink_is_fenced_before_it_touches_the_owners_folder(sc, tmp_path):
    from dstreams.recovery.metadata import FencedError

    zombie, owner = _two_drivers(str(tmp_path / "ckpt"), {})
    path = tmp_path / "out" / "counts-1000"
    path.mkdir(parents=True)
    (path / "part-00000").write_text("owner\n")  # the new owner's write, not committed yet
    with pytest.raises(FencedError, match="replaced by another driver"):
        save_text_exactly_once(sc.parallelize(["zombie"], 1), str(path), zombie.check_owner)
    assert sorted(os.listdir(path)) == ["part-00000"] and (path / "part-00000").read_text() == "owner\n"
    owner.check_owner()


def _commits_at_call(n: int, commit) -> Callable[[], None]:
    """A guard that passes, and whose ``n``-th call is followed at once by the new owner's commit: a zombie
    paused right after it checked the fence, while the driver that took over wrote and committed the batch."""
    calls = []

    def guard() -> None:
        calls.append(1)
        if len(calls) == n:
            commit()

    return guard


@pytest.mark.parametrize("call", [1, 2])
@pytest.mark.parametrize("kind", ["local", "moto"])
def test_store_sink_never_deletes_a_batch_committed_after_its_fence_check(sc, tmp_path, kind, call):
    from dstreams.files.sink import SUCCESS, save_to_store_exactly_once

    location, options = _sink_location(kind, tmp_path)
    target = f"{location}/out/000000000001000"
    store = open_store(target, **options)
    owners = {"part-00000": b"a\n", "part-00001": b"b\n", "part-00002": b"c\n", SUCCESS: b""}

    def commit() -> None:
        for key, data in owners.items():  # parts first, then the marker, as the owner's sink does
            store.put(key, data)

    guard = _commits_at_call(call, commit)
    assert save_to_store_exactly_once(sc.parallelize(["a"], 1), target, guard, options) is False
    assert {k: store.get(k) for k in store.list("")} == owners


@pytest.mark.parametrize("call", [1, 2])
def test_local_sink_never_removes_a_folder_committed_after_its_fence_check(sc, tmp_path, call):
    path = tmp_path / "out" / "counts-1000"

    def commit() -> None:  # another driver's committed write of the same batch
        if path.exists():
            shutil.rmtree(path)  # a leftover the owner removed before its commit
        path.mkdir(parents=True)
        (path / "part-00000").write_text("owner\n")
        (path / SUCCESS).write_text("")

    path.mkdir(parents=True)
    (path / "part-00003").write_text("cut off\n")  # a leftover of a write that was cut off
    guard = _commits_at_call(call, commit)
    assert save_text_exactly_once(sc.parallelize(["zombie"], 1), str(path), guard) is False
    assert sorted(os.listdir(path)) == ["_SUCCESS", "part-00000"] and (path / "part-00000").read_text() == "owner\n"
    assert _staged(tmp_path / "out") == []  # the zombie's own staging folder is gone


def _staged(parent) -> list[str]:
    from dstreams.files.sink import STAGING

    staging = parent / STAGING
    return sorted(os.listdir(staging)) if staging.exists() else []


def test_local_sink_stages_its_write_and_clears_what_killed_writers_left(sc, tmp_path):
    from dstreams.files.sink import STAGING

    out = tmp_path / "out"
    # What a driver killed between its write and its commit left:
    stale = out / STAGING / "counts-1000.0123456789abcdef0123456789abcdef"
    stale.mkdir(parents=True)
    (stale / "part-00000").write_text("stale\n")
    (stale / SUCCESS).write_text("")
    other = out / STAGING / "counts-2000.0123456789abcdef0123456789abcdef"  # another batch's: not this write's
    other.mkdir()
    path = out / "counts-1000"
    assert save_text_exactly_once(sc.parallelize(["x", "y"], 2), str(path)) is True
    assert sorted(p for p in os.listdir(path) if not p.startswith(".")) == ["_SUCCESS", "part-00000", "part-00001"]
    assert _staged(out) == ["counts-2000.0123456789abcdef0123456789abcdef"]
    assert sorted(os.listdir(out)) == [STAGING, "counts-1000"]  # readers listing the folder skip the hidden one


def _unpicklable(x):  # noqa: ANN001, ANN202 - a record pickle refuses (a generator) for "bad"
    return (x, (y for y in ())) if x == "bad" else x


def test_save_to_store_routes_a_record_its_format_refuses_once_or_fails_naming_the_way(sc, tmp_path):
    """Issue 44: with ``onError="deadLetter"`` a record ``pickle`` refuses goes to ``_dead-letters-NNNNN.jsonl`` in the
    batch's folder, committed with its parts; a cut-off write's re-run and a re-run of the committed batch write it
    once. Without it the batch fails naming the record and that way past it."""
    import json
    import pickle

    from dstreams.files.sink import save_to_store_exactly_once

    records = [1, "bad", 3, 4]
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([sc.parallelize(records, 2)]).map(_unpicklable).saveToStore(
            str(tmp_path / "out"), "pickle", onError="deadLetter")
        ssc.start()
        run_batches(ssc, 1)
    folder = tmp_path / "out" / "000000000001000"
    assert sorted(os.listdir(folder)) == ["_SUCCESS", "_dead-letters-00000.jsonl", "part-00000.pickle",
                                          "part-00001.pickle"]
    got = [x for p in ("part-00000.pickle", "part-00001.pickle") for x in pickle.loads((folder / p).read_bytes())]
    assert got == [1, 3, 4]
    (dead,) = [json.loads(line) for line in (folder / "_dead-letters-00000.jsonl").read_text().splitlines()]
    assert (dead["output"], dead["batch_ms"], dead["part"], dead["row"]) == (
        f"saveToStore({tmp_path / 'out'})", 1000, 0, 1)
    assert dead["record"].startswith("('bad', <generator object") and "generator" in dead["error"]
    # a write cut off before its commit, re-run: the same objects, once
    rdd = sc.parallelize(records, 2).map(_unpicklable)
    partial = tmp_path / "again" / "000000000001000"
    assert save_to_store_exactly_once(rdd, str(partial), format="pickle", dead_letters=("o", 1000)) is True
    (partial / "_SUCCESS").unlink()
    assert save_to_store_exactly_once(rdd, str(partial), format="pickle", dead_letters=("o", 1000)) is True
    assert save_to_store_exactly_once(rdd, str(partial), format="pickle", dead_letters=("o", 1000)) is False
    assert len((partial / "_dead-letters-00000.jsonl").read_text().splitlines()) == 1
    with pytest.raises(Exception, match=r"partition 0, record 1 \(\('bad'.*cannot encode it.*onError='deadLetter'"):
        save_to_store_exactly_once(rdd, str(tmp_path / "failed" / "1"), format="pickle")
