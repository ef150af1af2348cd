"""The combine candidates of ``benchmarks/combine_cost.py`` against the engine's dict fold.

The engine keeps its dict fold (``dstreams.spark.partitioned.combiner``): measured, neither pyarrow's hash
group-by nor the chunked dict variants were faster on WordCount-like data (benchmarks/README.md,
"The map-side combine"). These tests keep the candidates exact, so that the measurement compares equal
results and a candidate could replace the fold without changing any answer: the same pairs, value types
and order (Arrow: the same pairs and types, its own order), on inputs with the subtleties an exact
reduce must keep (bool vs int, floats and NaN, ints beyond int64, None keys, str subclasses, non-pairs).
"""

from __future__ import annotations

import math
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import combine_cost
from dstreams.spark.partitioned import combiner


class Word(str):
    """A str subclass: a dict keeps it as the key object; an Arrow column would turn it into a str."""


ENGINE = combiner(operator.add, "test")
KEYS = st.one_of(st.sampled_from(["a", "b", "c", Word("a")]), st.integers(-3, 3), st.booleans(), st.none(),
                 st.just(2.0))
VALUES = st.one_of(st.just(1), st.integers(-5, 5), st.booleans(), st.just(2**70),
                   st.floats(allow_nan=True, allow_infinity=False, width=32))
PAIRS = st.lists(st.tuples(KEYS, VALUES), max_size=60)


def _outcome(run, records):
    try:
        out = list(run(list(records)))
    except (TypeError, OverflowError) as e:
        return ("error", type(e))
    return ("ok", out)


def _same(a, b) -> bool:
    """Pairs equal with NaN equal to NaN, and value types equal."""
    if len(a) != len(b):
        return False
    for (ka, va), (kb, vb) in zip(a, b, strict=True):
        if type(ka) is not type(kb) or ka != kb or type(va) is not type(vb):
            return False
        if not (va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb))):
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(PAIRS, st.sampled_from([1, 3, 4096]))
def test_dict_variants_give_the_engines_answer_exactly(pairs, chunk):
    old = combine_cost.CHUNK
    combine_cost.CHUNK = chunk  # small chunks mix counted, inlined and checked chunks in one partition
    try:
        expected = _outcome(ENGINE, pairs)
        for run in (combine_cost.inline_add, combine_cost.count_add):
            got = _outcome(run, pairs)
            assert got[0] == expected[0]
            assert got[1] == expected[1] if got[0] == "error" else _same(got[1], expected[1])
    finally:
        combine_cost.CHUNK = old


@settings(max_examples=300, deadline=None)
@given(PAIRS)
def test_arrow_either_refuses_or_gives_the_same_pairs(pairs):
    got = _outcome(combine_cost.arrow_add, pairs)
    if got[0] == "error":
        return  # a production path would fall back to the dict fold here
    expected = _outcome(ENGINE, pairs)
    assert expected[0] == "ok"
    assert _same(sorted(got[1], key=repr), sorted(expected[1], key=repr))


def test_arrow_refuses_what_it_cannot_reduce_exactly():
    for pairs in ([("a", True)], [(True, 1)], [("a", 1), (1, 1)], [(Word("a"), 1), ("b", 1)],
                  [("a", 1.5)], [("a", 2**63)], [("a", 2**62), ("a", 2**62)], [(None, 1)], [("a", 1, 2)]):
        assert _outcome(combine_cost.arrow_add, pairs)[0] == "error", pairs


def test_a_record_that_is_not_a_pair_fails_as_in_the_engine():
    for run in (ENGINE, combine_cost.inline_add, combine_cost.count_add):
        with pytest.raises(TypeError, match="needs a stream of \\(key, value\\) pairs"):
            list(run([("a", 1), "ab"]))


def test_the_benchmark_runs_and_its_candidates_agree():
    rows = combine_cost.measure(pairs=3000, repeat=1, distincts=(100,))
    assert len(rows) == 4
    for row in rows:
        assert {"dict", "inline", "count", "arrow"} <= row.keys()
