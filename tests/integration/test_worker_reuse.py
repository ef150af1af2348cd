"""The engine's own partition functions leave PySpark's Python workers reusable.

PySpark reuses a Python worker only when its task read the whole input; a partition function that
ignores its input (a checkpoint reader, the generator source, the partition-aligned reader) made every
such task's worker exit, and the next task paid a fresh one (a fork, imports, a new S3 client).
"""

from __future__ import annotations

import os
import time

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.checkpointer import reader_rdd
from dstreams.recovery.codec import encode_partition
from dstreams.recovery.storespec import StoreSpec
from dstreams.spark.partitioned import partition_aligned_rdd


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


def _assert_workers_stay(pids: list[int]) -> None:
    """A discarded worker exits right after its task; give it a second to do so."""
    assert pids
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        gone = [p for p in pids if _exited(p)]
        assert not gone, f"the Python workers {gone} exited after their task (not reused)"
        time.sleep(0.05)


def _pid(_: object = None) -> int:
    return os.getpid()


def test_partition_aligned_reader_keeps_its_worker(sc):
    rdd = partition_aligned_rdd(sc, 2, lambda i: [os.getpid()])
    _assert_workers_stay(rdd.collect())


@pytest.mark.slow
def test_checkpoint_reader_keeps_its_worker(sc, tmp_path):
    spec = StoreSpec(str(tmp_path / "ckpt"), {})
    store = spec.open()
    parts = []
    for i in range(2):
        data, sha, n = encode_partition([("k", i)])
        store.put(f"p/part-{i:05d}", data)
        parts.append({"index": i, "key": f"part-{i:05d}", "sha256": sha, "records": n})
    manifest = {"num_partitions": 2, "parts": parts}
    for partitioner in (None,):
        rdd = reader_rdd(sc, spec, "p", manifest, partitioner)
        assert sorted(rdd.collect()) == [("k", 0), ("k", 1)]
        _assert_workers_stay(rdd.map(_pid).collect())


@pytest.mark.slow
def test_generator_source_keeps_its_worker(sc):
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    pids: list[int] = []
    ssc.generatorStream(3, 2, recordFunc=lambda seed, t, p, n: [os.getpid()] * n).foreachRDD(
        lambda rdd: pids.extend(rdd.collect()))
    ssc.start()
    try:
        clock.advance(1000)
        ssc.awaitBatch(1000, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    _assert_workers_stay(sorted(set(pids)))
