"""The lean JVM construction (dstreams.jvm) builds what PySpark's own calls build."""

from __future__ import annotations

import pytest
from py4j.protocol import Py4JError
from pyspark import StorageLevel
from pyspark.rdd import portable_hash

from dstreams import jvm
from dstreams.partitioned import hash_partitioner, union_rdds


def _partitions(rdd) -> list[list]:
    return [sorted(p) for p in rdd.glom().collect()]


@pytest.fixture(params=["compiled", "calls", "off"])
def lean(request):
    jvm.set_mode(request.param)
    yield request.param
    jvm.set_mode("compiled")


def test_shuffle_places_records_as_partition_by_does(sc, lean):
    pairs = [(f"k{i % 97}", i) for i in range(10_000)]  # more than CHUNK_PAIRS per map task
    rdd = sc.parallelize(pairs, 2)
    part = hash_partitioner(3)
    got = jvm.shuffle(rdd.map(lambda kv: kv), part)
    want = rdd.partitionBy(3, portable_hash)
    assert got.partitioner == part
    assert _partitions(got) == _partitions(want)
    assert jvm.shuffle(got, part) is got  # already partitioned: no shuffle


def test_union_keeps_partition_alignment_and_order(sc, lean):
    part = hash_partitioner(2)
    a = jvm.shuffle(sc.parallelize([("a", 1), ("b", 2), ("c", 3)], 2), part).mapPartitions(
        lambda it: it, preservesPartitioning=True)
    b = jvm.shuffle(sc.parallelize([("a", 10), ("d", 4)], 1), part)
    joined = union_rdds(sc, [a, b, a])
    assert joined.partitioner == part and joined.getNumPartitions() == 2
    expected = [pa + pb + pa for pa, pb in zip(a.glom().collect(), b.glom().collect(), strict=True)]
    assert joined.glom().collect() == expected
    plain = union_rdds(sc, [sc.parallelize([1, 2], 2), sc.parallelize([3], 1), sc.parallelize(["x"], 1)])
    assert plain.partitioner is None and plain.getNumPartitions() == 4
    assert plain.collect() == [1, 2, 3, "x"]
    mixed = union_rdds(sc, [sc.parallelize([1], 1), sc.textFile(__file__).map(len).filter(lambda n: n < 0)])
    assert mixed.collect() == [1]  # different serializers: PySpark's path


def test_union_of_more_rdds_than_one_builder_call_takes(sc, lean):
    part = hash_partitioner(2)
    count = jvm.UNION_ARITY * 2 + 3
    parts = [jvm.shuffle(sc.parallelize([(f"k{i}", i), (f"j{i}", -i)], 1), part) for i in range(count)]
    joined = union_rdds(sc, parts)
    assert joined.partitioner == part and joined.getNumPartitions() == 2
    per_part = [r.glom().collect() for r in parts]
    assert joined.glom().collect() == [sum((p[i] for p in per_part), []) for i in range(2)]
    plain = union_rdds(sc, [sc.parallelize([i], 1) for i in range(jvm.UNION_ARITY + 1)])
    assert plain.partitioner is None and plain.collect() == list(range(jvm.UNION_ARITY + 1))


def test_materialize_and_persist_build_a_working_cached_rdd(sc, lean):
    factor = sc.broadcast(3)
    rdd = sc.parallelize(range(10), 2).map(lambda x: x * 2)
    cached = jvm.persist(rdd, StorageLevel.MEMORY_ONLY)
    assert cached.is_cached and cached.getStorageLevel() == StorageLevel.MEMORY_ONLY
    assert cached.collect() == [x * 2 for x in range(10)]
    with_broadcast = jvm.materialize(sc.parallelize(range(4), 2).map(lambda x: x * factor.value))
    assert with_broadcast.collect() == [0, 3, 6, 9]  # a closure with a broadcast: PySpark's path
    cached.unpersist()
    factor.unpersist()


def test_the_compiled_builder_is_used_by_default(sc):
    assert jvm.mode() == "compiled"
    assert jvm.bridge(sc).builder() is not None  # Janino is on PySpark's classpath


def test_mode_from_the_environment():
    assert jvm._mode_from_env("") == "compiled"
    assert jvm._mode_from_env("0") == "off"
    assert jvm._mode_from_env(" Calls ") == "calls"
    with pytest.raises(ValueError, match="DSTREAMS_LEAN_JVM"):
        jvm._mode_from_env("fast")
    with pytest.raises(ValueError, match="not one of"):
        jvm.set_mode("fast")


def test_disabled_lean_path_is_pyspark_itself(sc):
    jvm.set_enabled(False)
    try:
        rdd = sc.parallelize(range(4), 2).map(lambda x: x)
        assert jvm.materialize(rdd)._jrdd_val is None  # left to PySpark's lazy _jrdd
    finally:
        jvm.set_enabled(True)
    rdd = sc.parallelize(range(4), 2).map(lambda x: x)
    assert jvm.materialize(rdd)._jrdd_val is not None


def test_shuffle_of_records_that_are_not_pairs_fails_as_partition_by_does(sc, lean):
    with pytest.raises(Exception, match="unpack"):
        jvm.shuffle(sc.parallelize(["abc", "de"], 1), hash_partitioner(2)).collect()


def test_a_builder_that_cannot_be_compiled_falls_back_to_plain_calls(sc, monkeypatch, caplog):
    def no_janino(jvm_view, anchor):
        raise Py4JError("class org.codehaus.janino.SimpleCompiler not found")

    monkeypatch.setattr(jvm, "compile_builder", no_janino)
    broken = jvm.Bridge(sc)
    monkeypatch.setitem(jvm._bridges, id(sc), broken)
    with caplog.at_level("WARNING", logger="dstreams.jvm"):
        assert broken.builder() is None
    assert "could not compile the JVM batch builder" in caplog.text
    got = jvm.shuffle(sc.parallelize([("a", 1), ("b", 2), ("a", 3)], 2).map(lambda kv: kv), hash_partitioner(2))
    assert sorted(got.collect()) == [("a", 1), ("a", 3), ("b", 2)]
    assert jvm.num_partitions(got) == 2
