"""The lean JVM construction (dstreams.spark.jvm) builds what PySpark's own calls build."""

from __future__ import annotations

import pytest
from py4j.protocol import Py4JError
from pyspark import StorageLevel
from pyspark.rdd import portable_hash

from dstreams.spark import jvm
from dstreams.spark.partitioned import hash_partitioner, union_rdds


def _partitions(rdd) -> list[list]:
    return [sorted(p) for p in rdd.glom().collect()]


MODE_KEY = "spark.dstreams.jvm.mode"
MODE_ENV = "DSTREAMS_LEAN_JVM"


@pytest.fixture(params=["compiled", "off"])
def lean(request):
    jvm.set_mode(request.param)
    yield request.param
    jvm.set_mode(None)


@pytest.fixture
def conf_mode(sc, monkeypatch):
    """Sets ``spark.dstreams.jvm.mode`` on the running context's conf (removed afterwards, and the context's
    mode resolved again from a clean environment)."""
    monkeypatch.delenv(MODE_ENV, raising=False)

    def set_key(value: str | None) -> None:
        if value is None:
            sc._conf._jconf.remove(MODE_KEY)
        else:
            sc._conf.set(MODE_KEY, value)

    yield set_key
    set_key(None)
    monkeypatch.delenv(MODE_ENV, raising=False)
    jvm.bridge(sc).reresolve_mode()


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


@pytest.mark.slow
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


def test_the_compiled_builder_is_used_by_default(sc, conf_mode):
    assert jvm.MODES == ("compiled", "off")
    jvm.prepare(sc)
    assert jvm.mode(sc) == jvm.mode() == "compiled"
    assert jvm.bridge(sc).builder() is not None  # Janino is on PySpark's classpath
    rdd = sc.parallelize(range(4), 2).map(lambda x: x)
    assert jvm.materialize(rdd)._jrdd_val is not None


def test_the_mode_is_the_contexts_conf_key_before_the_environment(sc, conf_mode, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "compiled")
    conf_mode("off")
    jvm.prepare(sc)  # what StreamingContext.start calls: the mode is resolved there, per context
    assert jvm.mode(sc) == "off" and jvm.bridge(sc).mode == "off"
    rdd = sc.parallelize(range(4), 2).map(lambda x: x + 1)
    assert jvm.materialize(rdd)._jrdd_val is None  # left to PySpark's lazy _jrdd
    cached = jvm.persist(rdd, StorageLevel.MEMORY_ONLY)
    assert cached.is_cached and cached.collect() == [1, 2, 3, 4]
    cached.unpersist()
    shuffled = jvm.shuffle(sc.parallelize([("a", 1), ("b", 2)], 2), hash_partitioner(2))
    assert not isinstance(shuffled, jvm._BuiltRDD)  # PySpark's partitionBy
    conf_mode("compiled")
    monkeypatch.setenv(MODE_ENV, "0")
    jvm.prepare(sc)
    assert jvm.mode(sc) == "compiled"


@pytest.mark.parametrize(("value", "expected"), [("", "compiled"), ("1", "compiled"), (" Compiled ", "compiled"),
                                                 ("0", "off"), ("off", "off"), ("OFF", "off")])
def test_the_environment_is_the_fallback(sc, conf_mode, monkeypatch, value, expected):
    monkeypatch.setenv(MODE_ENV, value)
    jvm.prepare(sc)
    assert jvm.mode(sc) == expected
    rdd = sc.parallelize(range(4), 2).map(lambda x: x)
    assert (jvm.materialize(rdd)._jrdd_val is not None) == (expected == "compiled")


def test_invalid_modes_fail_at_start_naming_the_accepted_values(sc, conf_mode, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "calls")  # the removed mode
    with pytest.raises(ValueError, match=r"DSTREAMS_LEAN_JVM='calls' is not one of compiled \(or 1\) and off"):
        jvm.prepare(sc)
    monkeypatch.delenv(MODE_ENV)
    conf_mode("fast")
    with pytest.raises(ValueError, match=r"spark.dstreams.jvm.mode='fast' is not one of compiled .* e.g. "):
        jvm.prepare(sc)
    for bad in ("calls", "fast"):
        with pytest.raises(ValueError, match="not one of compiled, off"):
            jvm.set_mode(bad)


def test_set_mode_overrides_every_context_until_reset(sc, conf_mode):
    conf_mode("compiled")
    jvm.prepare(sc)
    jvm.set_mode("off")
    try:
        assert jvm.mode(sc) == "off"
        rdd = sc.parallelize(range(4), 2).map(lambda x: x)
        assert jvm.materialize(rdd)._jrdd_val is None  # left to PySpark's lazy _jrdd
    finally:
        jvm.set_mode(None)
    assert jvm.mode(sc) == "compiled"
    rdd = sc.parallelize(range(4), 2).map(lambda x: x)
    assert jvm.materialize(rdd)._jrdd_val is not None


def test_shuffle_of_records_that_are_not_pairs_fails_as_partition_by_does(sc, lean):
    with pytest.raises(Exception, match="unpack"):
        jvm.shuffle(sc.parallelize(["abc", "de"], 1), hash_partitioner(2)).collect()


def test_a_builder_that_cannot_be_compiled_falls_back_to_pyspark_with_one_warning(sc, monkeypatch, caplog):
    def no_janino(jvm_view, anchor):
        raise Py4JError("class org.codehaus.janino.SimpleCompiler not found")

    monkeypatch.setattr(jvm, "compile_builder", no_janino)
    broken = jvm.Bridge(sc, "compiled")
    monkeypatch.setitem(jvm._bridges, id(sc), broken)
    with caplog.at_level("WARNING", logger="dstreams.spark.jvm"):
        assert broken.builder() is None
        assert jvm.mode(sc) == "compiled"  # the setting; the builder is what is missing
        pairs = sc.parallelize([("a", 1), ("b", 2), ("a", 3)], 2).map(lambda kv: kv)
        got = jvm.shuffle(pairs, hash_partitioner(2))
        assert not isinstance(got, jvm._BuiltRDD)  # PySpark's own partitionBy
        assert got.partitioner == hash_partitioner(2)
        assert sorted(got.collect()) == [("a", 1), ("a", 3), ("b", 2)]
        assert jvm.num_partitions(got) == 2
        rdd = sc.parallelize(range(4), 2).map(lambda x: x * 2)
        assert jvm.materialize(rdd)._jrdd_val is None  # left to PySpark's lazy _jrdd
        cached = jvm.persist(rdd, StorageLevel.MEMORY_ONLY)
        assert cached.is_cached and cached.getStorageLevel() == StorageLevel.MEMORY_ONLY
        joined = union_rdds(sc, [got, jvm.shuffle(sc.parallelize([("c", 4)], 1), hash_partitioner(2))])
        assert not isinstance(joined, jvm._BuiltRDD) and joined.partitioner == hash_partitioner(2)
        assert sorted(joined.collect()) == [("a", 1), ("a", 3), ("b", 2), ("c", 4)]
        assert cached.collect() == [0, 2, 4, 6]
        cached.unpersist()
    warnings = [r for r in caplog.records if "could not compile the JVM batch builder" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "PySpark's own calls" in warnings[0].getMessage()


def test_a_builder_compiled_again_in_the_same_jvm_works(sc):
    """A second SparkContext in one Python process (a notebook's ``sc.stop()`` then ``SparkContext()``) builds
    its builder in the same JVM: Py4J caches reflected methods by class name, so a second class of the same
    name would be called through the first one's methods ("object is not an instance of declaring class")."""
    from dstreams.spark.jvm_compiled import compile_builder

    rdd = sc.parallelize([1, 2, 3], 3)._jrdd
    first = compile_builder(sc._jvm, sc._jsc)
    assert first.numPartitions(rdd) == 3
    second = compile_builder(sc._jvm, sc._jsc)
    assert second is not first and second.numPartitions(rdd) == 3
    assert first.numPartitions(rdd) == 3
