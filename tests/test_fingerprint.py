"""Issue 25 item 2: the graph fingerprint covers every parameter that changes results, and a checkpoint
written before a parameter joined the fingerprint (an older fingerprint format) still resumes.

The rule (``dstreams.contracts.FINGERPRINT_FORMAT``, ``recovery/metadata.py``): the head records the format
its fingerprint was written in; a restarted driver compares its graph described in that format, and on a
match upgrades the head to the current format, so later restarts compare every parameter. A head of a newer
format is refused with what to do.
"""

from __future__ import annotations

import json

import pytest

from dstreams import StreamingContext
from dstreams.contracts import FINGERPRINT_FORMAT
from dstreams.recovery.metadata import HEAD, GraphChangedError, MetadataLog
from dstreams.recovery.store import open_store


def _graph(sc, tmp_path, directory: str = "in", partitions: int = 2, seed: int = 7):
    ssc = StreamingContext(sc, 1)
    files = ssc.textFileStream(str(tmp_path / directory))
    gen = ssc.generatorStream(10, partitions, seed=seed)
    files.union(gen.map(str)).foreachRDD(lambda rdd: None)
    return ssc


def test_the_fingerprint_covers_the_file_directory_and_the_generator_partitions_and_seed(sc, tmp_path):
    def fp(fmt: int = FINGERPRINT_FORMAT, **kw):
        ssc = _graph(sc, tmp_path, **kw)
        try:
            return ssc._graph.fingerprint(fmt)
        finally:
            ssc.stop(stopSparkContext=False)

    base = fp()
    assert fp() == base
    assert fp(directory="other") != base
    assert fp(partitions=3) != base
    assert fp(seed=8) != base
    # Format 1 (what older checkpoints hold) leaves them out.
    assert fp(1) == fp(1, directory="other", partitions=3, seed=8) and "dir=" not in " ".join(fp(1))


def _old_head(store, fingerprint: list[str]) -> None:
    """Rewrite the head as a dstreams of fingerprint format 1 wrote it (no format field)."""
    head = json.loads(store.get(HEAD))
    head["fingerprint"] = fingerprint
    head.pop("fingerprint_format", None)
    store.put(HEAD, json.dumps(head).encode())


def test_a_checkpoint_of_the_older_format_resumes_and_is_upgraded():
    store = open_store("memory://fingerprint-upgrade")
    v1, v2 = ["000-Files[slide=1000]<-()"], ["000-Files[slide=1000 dir=in recordLength=None]<-()"]
    first = MetadataLog(store, "app", v2, 1000, {1: v1})
    first.take_over(0)
    _old_head(store, v1)
    second = MetadataLog(store, "app", v2, 1000, {1: v1})
    assert second.take_over(0) is not None
    head = json.loads(store.get(HEAD))
    assert head["fingerprint"] == v2 and head["fingerprint_format"] == FINGERPRINT_FORMAT
    # From now on every parameter is compared: another directory is refused.
    other = ["000-Files[slide=1000 dir=elsewhere recordLength=None]<-()"]
    with pytest.raises(GraphChangedError, match="dir=in.*dir=elsewhere"):
        MetadataLog(store, "app", other, 1000, {1: v1}).take_over(0)


def test_an_older_format_checkpoint_of_another_graph_is_refused():
    store = open_store("memory://fingerprint-old-other")
    MetadataLog(store, "app", ["a"], 1000, {1: ["a1"]}).take_over(0)
    _old_head(store, ["a1"])
    with pytest.raises(GraphChangedError, match="differs"):
        MetadataLog(store, "app", ["b"], 1000, {1: ["b1"]}).take_over(0)


def test_a_checkpoint_of_a_newer_format_is_refused_with_what_to_do():
    store = open_store("memory://fingerprint-newer")
    MetadataLog(store, "app", ["a"], 1000).take_over(0)
    head = json.loads(store.get(HEAD))
    head["fingerprint_format"] = FINGERPRINT_FORMAT + 1
    store.put(HEAD, json.dumps(head).encode())
    with pytest.raises(GraphChangedError, match="newer dstreams.*start from an empty"):
        MetadataLog(store, "app", ["a"], 1000).take_over(0)
