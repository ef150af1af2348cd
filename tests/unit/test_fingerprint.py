"""The graph fingerprint covers every parameter that changes results (issue 25 item 2), in one format (issue 41
item 4): a restarted driver's graph must describe itself exactly as the checkpoint's head recorded it."""

from __future__ import annotations

import json

import pytest

from dstreams import StreamingContext
from dstreams.recovery.metadata import HEAD, GraphChangedError, MetadataLog
from dstreams.recovery.store import open_store


def _graph(sc, tmp_path, directory: str = "in", partitions: int = 2, seed: int = 7):
    ssc = StreamingContext(sc, 1)
    files = ssc.textFileStream(str(tmp_path / directory))
    gen = ssc.generatorStream(10, partitions, seed=seed)
    files.union(gen.map(str)).foreachRDD(lambda rdd: None)
    return ssc


def test_the_fingerprint_covers_the_file_directory_and_the_generator_partitions_and_seed(sc, tmp_path):
    def fp(**kw):
        ssc = _graph(sc, tmp_path, **kw)
        try:
            return ssc._graph.fingerprint()
        finally:
            ssc.stop(stopSparkContext=False)

    base = fp()
    assert fp() == base
    assert fp(directory="other") != base
    assert fp(partitions=3) != base
    assert fp(seed=8) != base
    described = " ".join(base)
    assert "dir=" in described and "seed=7" in described and "partitions=2" in described


def test_a_restart_with_the_same_graph_takes_over_and_keeps_the_fingerprint():
    store = open_store("memory://fingerprint-same")
    fingerprint = ["000-Files[slide=1000 dir=in recordLength=None]<-()"]
    MetadataLog(store, "app", fingerprint, 1000).take_over(0)
    previous = MetadataLog(store, "app", fingerprint, 1000).take_over(0)
    assert previous is not None and previous["epoch"] == 1
    head = json.loads(store.get(HEAD))
    assert head["fingerprint"] == fingerprint and head["epoch"] == 2
    assert "fingerprint_format" not in head  # one format: the head's own


def test_a_restart_whose_graph_differs_in_one_parameter_is_refused_with_what_changed():
    store = open_store("memory://fingerprint-other")
    MetadataLog(store, "app", ["000-Files[slide=1000 dir=in recordLength=None]<-()"], 1000).take_over(0)
    other = ["000-Files[slide=1000 dir=elsewhere recordLength=None]<-()"]
    with pytest.raises(GraphChangedError, match="(?s)dir=in.*dir=elsewhere.*empty checkpoint location"):
        MetadataLog(store, "app", other, 1000).take_over(0)
