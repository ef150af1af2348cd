"""Per-record operators: PySpark's results with one Python call per record, and no silent truncation."""

from __future__ import annotations

import pytest

from dstreams.records import filter_records, flat_map_records, flat_map_values, map_records, map_values


def test_same_results_as_the_builtin_operators():
    xs = list(range(20))
    assert list(map_records(lambda x: x * 2)(0, iter(xs))) == [x * 2 for x in xs]
    assert list(filter_records(lambda x: x % 3 == 0)(0, iter(xs))) == [x for x in xs if x % 3 == 0]
    assert list(flat_map_records(lambda x: [x] * (x % 3))(0, iter(xs))) == [y for x in xs for y in [x] * (x % 3)]
    pairs = [(x % 4, x) for x in xs]
    assert list(map_values(lambda v: -v)(0, iter(pairs))) == [(k, -v) for k, v in pairs]
    assert list(flat_map_values(range)(0, iter(pairs))) == [(k, y) for k, v in pairs for y in range(v)]
    assert list(map_records(str)(3, iter([]))) == []


def test_user_function_called_once_per_record():
    calls: list[int] = []

    def f(x: int) -> bool:
        calls.append(x)
        return True

    list(filter_records(f)(0, iter(range(5))))
    assert calls == [0, 1, 2, 3, 4]


def _raise_at_3(v: int, wrap: bool) -> object:
    if v == 3:
        raise StopIteration("user bug")
    return [v] if wrap else v


@pytest.mark.parametrize(
    ("make", "records", "wrap"),
    [
        (map_records, list(range(6)), False),
        (filter_records, list(range(6)), False),
        (flat_map_records, list(range(6)), True),
        (map_values, [(0, i) for i in range(6)], False),
        (flat_map_values, [(0, i) for i in range(6)], True),
    ],
)
def test_stop_iteration_in_user_code_fails_instead_of_truncating(make, records, wrap):
    func = make(lambda v: _raise_at_3(v, wrap))
    with pytest.raises(RuntimeError):
        list(func(0, iter(records)))


def test_stop_iteration_fails_the_spark_task(sc):
    def f(x):
        if x == 7:
            raise StopIteration()
        return x

    with pytest.raises(Exception, match="StopIteration"):
        sc.parallelize(range(10), 2).mapPartitionsWithIndex(map_records(f)).collect()
