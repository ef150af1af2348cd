"""File streams on an S3 prefix (moto server): new objects only, each in exactly one batch, replayed
after a driver restart."""

from __future__ import annotations

import os
import uuid

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.files.source import split_lines
from dstreams.recovery.store import open_store
from dstreams.testing import collect, manual_context, run_batches

from ..recovery_app import read_outputs
from ..support import MOTO_ENDPOINT, service_unavailable

MOTO = MOTO_ENDPOINT
MOTO_OPTS = {"endpoint_url": MOTO, "access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


@pytest.fixture()
def bucket() -> str:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=MOTO, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    name = f"in-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=name)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"moto server at {MOTO} is not reachable ({e}); run `bash scripts/services.sh start`")
    return name


def test_split_lines_reads_like_spark_text_file():
    assert split_lines(b"a\nb\r\nc\rd") == ["a", "b", "c", "d"]
    assert split_lines(b"a\n\nb\n") == ["a", "", "b"]
    assert split_lines(b"") == []
    assert split_lines("é\n".encode()) == ["é"]


@pytest.mark.s3
def test_s3_text_file_stream_each_new_object_in_exactly_one_batch(sc, bucket):
    incoming = open_store(f"s3://{bucket}/incoming", **MOTO_OPTS)
    incoming.put("old.txt", b"ignored\n")
    with manual_context(1, sc=sc) as ssc:
        got = collect(ssc.textFileStream(f"s3://{bucket}/incoming/", **MOTO_OPTS), sort=True)
        ssc.start()
        incoming.put("a.txt", b"a1\r\na2\n")
        run_batches(ssc, 2, timeout=120)
        incoming.put("b.txt", b"b1\n")
        incoming.put("sub/c.txt", b"c1\nc2")
        incoming.put("_temporary/x", b"skipped\n")
        incoming.put(".hidden", b"skipped\n")
        run_batches(ssc, 1, timeout=120)
        incoming.delete("a.txt")  # forgotten by the source: its state is the folder's current listing
        run_batches(ssc, 1, timeout=120)
        assert ssc._graph.inputs[0].seen == {"b.txt", "old.txt", "sub/c.txt"}
    assert [got[t] for t in (1000, 2000, 3000, 4000)] == [["a1", "a2"], [], ["b1", "c1", "c2"], []]


@pytest.mark.s3
def test_s3_binary_records_stream_and_a_torn_object(sc, bucket):
    incoming = open_store(f"s3://{bucket}/bin", **MOTO_OPTS)
    with manual_context(1, sc=sc) as ssc:
        got = collect(ssc.binaryRecordsStream(f"s3://{bucket}/bin", 4, **MOTO_OPTS), sort=True)
        ssc.start()
        incoming.put("r1", b"abcdEFGH")
        run_batches(ssc, 1, timeout=120)
        incoming.put("r2", b"xyz")  # not a multiple of the record length
        ssc.clock.advance(1000)
        with pytest.raises(Exception, match="not a multiple of recordLength=4"):
            ssc.awaitTermination(120)
    assert got[1000] == [b"EFGH", b"abcd"]


def test_store_options_on_a_local_folder_are_refused(sc, tmp_path):
    with manual_context(1, sc=sc) as ssc, pytest.raises(ValueError, match="s3:// locations only"):
        ssc.textFileStream(str(tmp_path), endpoint_url="http://x")


@pytest.mark.s3
def test_s3_file_stream_after_a_driver_restart_reads_every_object_once(sc, bucket, tmp_path):
    incoming = open_store(f"s3://{bucket}/incoming", **MOTO_OPTS)
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")

    def build(clock):
        def setup():
            ssc = StreamingContext(sc, 1, clock=clock)
            ssc.checkpoint(ckpt)
            ssc.textFileStream(f"s3://{bucket}/incoming", **MOTO_OPTS).saveAsTextFiles(os.path.join(out, "lines"))
            return ssc
        return StreamingContext.getOrCreate(ckpt, setup, clock=clock)

    clock = ManualClock()
    first = build(clock)
    first.start()
    try:
        incoming.put("1.txt", b"one\n")
        run_batches(first, 1, timeout=120)
        incoming.put("2.txt", b"two\n")
        run_batches(first, 1, timeout=120)
    finally:
        first.stop(stopSparkContext=False)  # the driver "dies" after batch 2
    incoming.put("3.txt", b"three\n")  # arrives while it is down
    second = build(ManualClock(2000))
    second.start()
    try:
        run_batches(second, 2, timeout=120, backlog=True)  # batches 3000 and 4000, generated together
    finally:
        second.stop(stopSparkContext=False)
    lines = [line for batch in read_outputs(out).values() for line in batch]
    assert sorted(lines) == ["one", "three", "two"]


@pytest.mark.s3
def test_s3_file_stream_on_a_missing_bucket_is_a_clear_error(sc):
    with manual_context(1, sc=sc) as ssc:
        ssc.textFileStream(f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/in", **MOTO_OPTS).pprint()
        with pytest.raises(Exception, match="(?i)bucket"):
            ssc.start()
