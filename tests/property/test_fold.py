"""The engine's reduce by key (``dstreams.spark.partitioned.fold``) and its fast paths give the plain loop's answer.

``fold`` inlines the reduce functions it recognises (``operator.add``, the built-ins ``max`` and ``min``),
reads a key with a plain ``acc[k]`` in a ``try`` until many keys turn out to be new and then switches to
``k in acc``; ``count_values`` (``countByValue``'s map side) counts with CPython's C counting loop. Every
one of them must give exactly what the plain loop ``acc[k] = func(acc[k], v) if k in acc else v`` gives:
the same keys (the first key object of equal keys), values and value types, in the same order, and the
same exception. Checked here on the subtleties an exact reduce must keep (bool vs int, int subclasses,
floats and NaN, ints beyond int64, str subclasses, lists, None, mixed types, records that are not pairs),
and on Spark: the per-batch combined RDD of a window or a ``runningReduce`` is a JVM RDD (no Python stage
after the shuffle).
"""

from __future__ import annotations

import copy
import functools
import math
import operator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstreams import ManualClock, StreamingContext
from dstreams.spark import partitioned
from dstreams.spark.partitioned import combiner, count_values, fold, recognised, require_pair

from ..support import state_node


class Word(str):
    """A str subclass: equal to its str, kept as the key object when it comes first."""


class Count(int):
    """An int subclass whose ``+`` says where it came from: the inlined ``+`` must call it as ``operator.add`` does."""

    def __add__(self, other: Any) -> Count:
        return Count(int(self) + int(other) + 1000)

    def __radd__(self, other: Any) -> Count:
        return Count(int(other) + int(self) + 2000)


def plain(func: Any, records: list[Any], acc: dict[Any, Any] | None = None) -> dict[Any, Any]:
    """The contract: the plain loop."""
    acc = {} if acc is None else acc
    for x in records:
        k, v = x if (type(x) is tuple and len(x) == 2) else require_pair(x, "test")
        acc[k] = func(acc[k], v) if k in acc else v
    return acc


def outcome(run: Any) -> tuple[Any, ...]:
    """What a run gives, comparable exactly: the pairs with their types (NaN by identity of the repr), or
    the exception's type and message."""
    try:
        out = run()
    except Exception as e:  # noqa: BLE001 - the exception is the outcome compared
        return ("error", type(e), str(e))
    return ("ok", [(type(k), repr(k), type(v), repr(v)) for k, v in out.items()])


KEYS = st.one_of(st.sampled_from(["a", "b", Word("a")]), st.integers(-3, 3), st.booleans(), st.none(),
                 st.just(2.0), st.just(math.nan), st.floats(width=16))
VALUES = st.one_of(st.integers(-5, 5), st.booleans(), st.just(2**70), st.floats(width=16),
                   st.builds(Count, st.integers(0, 3)), st.sampled_from(["x", "y"]), st.none(),
                   st.lists(st.integers(0, 2), max_size=2))
RECORDS = st.lists(st.one_of(st.tuples(KEYS, VALUES), st.tuples(KEYS, VALUES), st.tuples(KEYS, VALUES),
                             st.lists(VALUES, min_size=2, max_size=2), st.just("ab"), st.just((1, 2, 3))),
                   max_size=40)
FUNCS = [operator.add, max, min, operator.sub, lambda a, b: a + b, functools.partial(operator.add), operator.iadd]


@settings(max_examples=600, deadline=None)
@given(RECORDS, st.sampled_from(FUNCS), st.sampled_from([1, 2, 5, 4096]))
def test_fold_is_the_plain_loop(records: list[Any], func: Any, switch_after: int) -> None:
    old = partitioned.MISSES_BEFORE_SWITCH
    partitioned.MISSES_BEFORE_SWITCH = switch_after  # small: both loops run in one partition
    try:
        # Each run on its own copies: operator.iadd mutates lists.
        got = outcome(lambda: fold(func, copy.deepcopy(records), None, "test"))
        want = outcome(lambda: plain(func, copy.deepcopy(records)))
        assert got == want
    finally:
        partitioned.MISSES_BEFORE_SWITCH = old


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(KEYS, st.integers(-3, 3)), max_size=30), st.lists(st.tuples(KEYS, st.integers(-3, 3)),
                                                                          max_size=30))
def test_fold_into_an_existing_dict(first: list[Any], second: list[Any]) -> None:
    """A window or state merge folds into the dict it already holds."""
    for func in (operator.add, max, min):
        assert outcome(lambda f=func: fold(f, second, plain(f, first), "t")) == outcome(
            lambda f=func: plain(f, second, plain(f, first)))


def test_recognised_functions() -> None:
    assert recognised(operator.add) == "add" and recognised(operator.__add__) == "add"
    assert recognised(max) == "max" and recognised(min) == "min"
    for other in (lambda a, b: a + b, operator.iadd, operator.sub, int.__add__, functools.partial(operator.add),
                  sum, Count.__add__):
        assert recognised(other) is None, other


def test_a_user_function_that_is_not_operator_add_runs_as_it_is() -> None:
    calls: list[tuple[int, int]] = []

    def add_and_log(a: int, b: int) -> int:
        calls.append((a, b))
        return a * 10 + b

    assert fold(add_and_log, [("k", 1), ("k", 2), ("j", 5), ("k", 3)], None, "t") == {"k": 123, "j": 5}
    assert calls == [(1, 2), (12, 3)]


def test_inlined_add_uses_the_values_own_addition() -> None:
    out = fold(operator.add, [("a", Count(1)), ("a", 2), ("b", 1), ("b", Count(1)), ("c", True), ("c", True)])
    assert out == {"a": 1003, "b": 2002, "c": 2}
    assert type(out["a"]) is Count and type(out["b"]) is Count and type(out["c"]) is int


def test_max_and_min_keep_the_first_of_equal_values() -> None:
    one, one_float, true = 1, 1.0, True
    assert type(fold(max, [("k", one), ("k", one_float), ("k", true)])["k"]) is int
    assert type(fold(min, [("k", one_float), ("k", one), ("k", true)])["k"]) is float
    with pytest.raises(TypeError):
        fold(max, [("k", 1), ("k", "a")])


def test_an_error_raised_by_the_reduce_is_not_taken_for_a_new_key() -> None:
    """The fast loop reads a key in a ``try``: a ``KeyError`` from the values' ``+`` must still propagate."""

    class Bad:
        def __add__(self, other: Any) -> Any:
            raise KeyError("from __add__")

    with pytest.raises(KeyError, match="from __add__"):
        fold(operator.add, [("k", Bad()), ("k", 1)])
    with pytest.raises(KeyError, match="from __add__"):
        fold(lambda a, b: a + b, [("k", Bad()), ("k", 1)])


def test_non_numeric_and_mixed_values() -> None:
    assert fold(operator.add, [("k", "a"), ("k", "b"), ("n", [1]), ("n", [2])]) == {"k": "ab", "n": [1, 2]}
    with pytest.raises(TypeError, match="unsupported operand"):
        fold(operator.add, [("k", 1), ("k", "a")])
    with pytest.raises(TypeError, match="needs a stream of \\(key, value\\) pairs"):
        fold(operator.add, [("k", 1), "ab"], None, "reduceByKey")


def test_lists_are_not_mutated_by_the_inlined_add() -> None:
    first = [1]
    out = fold(operator.add, [("k", first), ("k", [2])])
    assert out == {"k": [1, 2]} and first == [1]


def test_many_new_keys_switch_loops_with_the_same_answer() -> None:
    records = [(f"w{i % 9000}", i) for i in range(20_000)]
    assert fold(operator.add, records) == plain(operator.add, records)
    assert list(fold(max, records)) == list(plain(max, records))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(KEYS, st.builds(Count, st.integers(0, 2))), max_size=40))
def test_count_values_is_the_add_combine_of_ones(records: list[Any]) -> None:
    got = outcome(lambda: dict(count_values(iter(records))))
    want = outcome(lambda: dict(combiner(operator.add, "t")((r, 1) for r in records)))
    assert got == want
    if got[0] == "ok":  # the first key object of equal keys, as the fold keeps it
        counted = dict(count_values(iter(records)))
        folded = dict(combiner(operator.add, "t")((r, 1) for r in records))
        assert [id(k) for k in counted] == [id(k) for k in folded]


def test_count_values_refuses_unhashable_records_as_the_fold_does() -> None:
    with pytest.raises(TypeError, match="unhashable"):
        list(count_values(iter([[1], [1]])))


# ------------------------------------------------------------------------------------------ on Spark
def _class_name(rdd: Any) -> str:
    return str(rdd._jrdd.rdd().getClass().getSimpleName())


def test_per_batch_combined_rdds_need_no_python_stage_after_the_shuffle(sc: Any) -> None:
    """The cached per-batch RDD of a window and the batch a ``runningReduce`` merges are the shuffle's
    JVM output (no Python runner after the shuffle; the merge folds them), and the answers are right."""
    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    batches = [[("a", 1), ("b", 2), ("a", 3)], [("a", 4), ("c", 1)], [("b", 5)]]
    pairs = ssc.queueStream([sc.parallelize(b, 2) for b in batches])
    window = pairs.reduceByKeyAndWindow(operator.add, None, 2, 1)
    running = pairs.runningReduce(operator.add)
    counts = pairs.map(lambda kv: kv[0]).countByValueAndWindow(2, 1)
    seen: dict[str, list[list[Any]]] = {"window": [], "running": [], "counts": []}
    window.foreachRDD(lambda rdd: seen["window"].append(sorted(rdd.collect())))
    running.foreachRDD(lambda rdd: seen["running"].append(sorted(rdd.collect())))
    counts.foreachRDD(lambda rdd: seen["counts"].append(sorted(rdd.collect())))
    ssc.start()
    try:
        for i in range(1, len(batches) + 1):
            clock.advance(1000)
            ssc.awaitBatch(i * 1000, 120.0)
        def built() -> tuple[Any, Any]:
            last = window._node.zero_time + window._node.slide_duration * 3
            return (window._node.parent.get_or_compute(last),
                    state_node(running).op.prepare(pairs._node.get_or_compute(last), state_node(running).partitioner))

        per_batch, prepared = ssc.on_graph_thread(built)
        assert _class_name(per_batch) != "PythonRDD" and _class_name(prepared) != "PythonRDD"
    finally:
        ssc.stop(stopSparkContext=False)
    assert seen["window"] == [[("a", 4), ("b", 2)], [("a", 8), ("b", 2), ("c", 1)], [("a", 4), ("b", 5), ("c", 1)]]
    assert seen["running"] == [[("a", 4), ("b", 2)], [("a", 8), ("b", 2), ("c", 1)], [("a", 8), ("b", 7), ("c", 1)]]
    assert seen["counts"] == [[("a", 2), ("b", 1)], [("a", 3), ("b", 1), ("c", 1)], [("a", 1), ("b", 1), ("c", 1)]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from("abcd"), st.integers()), max_size=8), min_size=1, max_size=4),
       st.randoms(use_true_random=False))
def test_merge_ordered_gives_each_keys_values_in_input_order_whatever_the_fetch_order(partitions, rnd) -> None:
    """The chunks of :func:`shuffle_ordered` (a key's values per map partition, tagged with it) merged by
    :func:`merge_ordered` in any order of arrival: each key once, its values in input order (map partition, then
    position), as one pass over the input would group them."""
    from dstreams.spark.partitioned import merge_ordered

    chunks = []
    for index, records in enumerate(partitions):
        per_key: dict[str, list[int]] = {}
        for k, v in records:
            per_key.setdefault(k, []).append(v)
        chunks.extend((k, (index, vs)) for k, vs in per_key.items())
    rnd.shuffle(chunks)
    expected: dict[str, list[int]] = {}
    for records in partitions:
        for k, v in records:
            expected.setdefault(k, []).append(v)
    merged = list(merge_ordered(chunks))
    assert len(merged) == len(expected) and dict(merged) == expected
