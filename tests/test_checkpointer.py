"""Data checkpoints into a store: written after the batch, committed by a manifest, lineage cut."""

from __future__ import annotations

import operator

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.checkpointer import list_checkpoints, load_manifest
from dstreams.recovery.codec import CorruptCheckpointError, decode_partition, encode_partition
from dstreams.recovery.store import open_store


def test_codec_round_trip_and_corruption():
    data, sha, n = encode_partition([("a", 1), ("b", [2, 3])])
    assert n == 2 and decode_partition(data, sha) == [("a", 1), ("b", [2, 3])]
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        decode_partition(data[:10])
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        decode_partition(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptCheckpointError, match="magic"):
        decode_partition(b"XXXX" + data[4:])


def test_memory_store_is_refused_for_checkpoints(sc):
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    with pytest.raises(ValueError, match="executors"):
        ssc.checkpoint("memory://x")


def test_state_is_checkpointed_and_lineage_stays_bounded(sc, tmp_path):
    url = str(tmp_path / "ckpt")
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(url)
    pairs = ssc.queueStream([[("k", 1), (f"x{i % 3}", 1)] for i in range(24)])
    counts = pairs.runningReduce(operator.add).checkpoint("2s")
    seen: list[list] = []
    counts.foreachRDD(lambda rdd: seen.append(sorted(rdd.collect())))
    lineage: list[int] = []
    counts.foreachRDD(lambda rdd: lineage.append(rdd.toDebugString().count(b"PythonRDD")))
    ssc.start()
    try:
        for i in range(1, 25):
            clock.advance(1000)
            ssc.awaitBatch(i * 1000, 120)
            ssc._checkpointer.flush(60)  # make the commits deterministic for the assertions
    finally:
        ssc.stop(stopSparkContext=False)
    assert seen[-1] == [("k", 24), ("x0", 8), ("x1", 8), ("x2", 8)]
    store = open_store(url)
    node_key = counts._node.key
    times = list_checkpoints(store, node_key)
    assert times[0] == 24_000 and len(times) <= 3  # older ones deleted
    manifest = load_manifest(store, node_key, times[0])
    assert manifest["num_partitions"] == 2 and sum(p["records"] for p in manifest["parts"]) == 4
    # Lineage: without the cut it grows with every batch; with it, it is periodic (bounded by the
    # checkpoint interval plus the time a commit takes).
    assert max(lineage[-8:]) <= max(lineage[6:14]), lineage
    assert lineage[-1] < lineage[3] * 4, lineage
    assert ssc._checkpointer.errors == []
