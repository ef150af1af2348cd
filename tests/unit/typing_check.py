"""Pipelines whose types must check (issue 41 item 6): ``DStream`` is generic as ``pyspark.streaming``'s.

Never run, never imported: ``tests/unit/test_typing.py`` runs mypy, with the project's settings, over this file (every
line must type-check) and over ``tests/unit/typing_reject.py`` (every line marked there must not). Each annotation
states what the operator must return, so a signature that loses a type parameter (``DStream[Any]`` is accepted for any
annotation, but not where a method is only defined on pairs) or gets one wrong fails here.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from datetime import datetime

from pyspark import RDD, StorageLevel
from pyspark.resultiterable import ResultIterable

from dstreams import DStream, StreamingContext
from dstreams.api.event_time import EventWindowView, TimedDStream
from dstreams.dead_letters import DeadLetter


def per_record(ssc: StreamingContext) -> None:
    numbers: DStream[int] = ssc.queueStream([[1, 2], [3]])
    strings: DStream[str] = numbers.map(str)
    lines: DStream[str] = ssc.textFileStream("in")
    words: DStream[str] = lines.flatMap(str.split)
    long_words: DStream[str] = words.filter(lambda w: len(w) > 3)
    records: DStream[bytes] = ssc.binaryRecordsStream("in", 8)
    sizes: DStream[int] = records.map(len)
    chunks: DStream[list[str]] = long_words.glom()
    firsts: DStream[str] = strings.mapPartitions(lambda it: (s[:1] for s in it))
    indexed: DStream[tuple[int, int]] = sizes.mapPartitionsWithIndex(lambda i, it: ((i, n) for n in it))
    total: DStream[int] = numbers.reduce(operator.add)
    counted: DStream[int] = words.count()
    both: DStream[int | str] = numbers.union(strings)
    same: DStream[int] = ssc.union(numbers, sizes)
    spread: DStream[str] = strings.repartition(4)
    windowed: DStream[str] = strings.window("30s", "10s")
    per_window: DStream[int] = numbers.reduceByWindow(operator.add, operator.sub, 30, 10)
    in_window: DStream[int] = words.countByWindow(30, 10)
    bools: DStream[bool] = numbers.map(lambda n: n > 1)
    covariant: DStream[int] = bools  # a stream of bool is a stream of int, as a list[bool] is not
    kept: DStream[str] = strings.cache().persist(StorageLevel.MEMORY_ONLY).checkpoint("10s")
    dead: DStream[DeadLetter] = numbers.map(lambda n: 1 // n, onError="deadLetter").deadLetters()
    rdds: list[RDD[int]] = numbers.slice(0, 10)
    del covariant, chunks, firsts, indexed, total, counted, both, same, spread, windowed, per_window, in_window
    del kept, dead, rdds


def pairs(ssc: StreamingContext) -> None:
    words: DStream[str] = ssc.textFileStream("in").flatMap(str.split)
    ones: DStream[tuple[str, int]] = words.map(lambda w: (w, 1))
    counts: DStream[tuple[str, int]] = ones.reduceByKey(operator.add, 4)
    halves: DStream[tuple[str, float]] = counts.mapValues(lambda n: n / 2)
    letters: DStream[tuple[str, str]] = counts.flatMapValues(lambda n: "x" * n)
    grouped: DStream[tuple[str, ResultIterable[int]]] = ones.groupByKey()
    combined: DStream[tuple[str, list[int]]] = ones.combineByKey(lambda v: [v], lambda c, v: [*c, v],
                                                                 lambda a, b: a + b)
    by_value: DStream[tuple[str, int]] = words.countByValue()
    by_value_window: DStream[tuple[str, int]] = words.countByValueAndWindow(30, 10)
    partitioned: DStream[tuple[str, int]] = counts.partitionBy(2, lambda k: len(k))
    joined: DStream[tuple[str, tuple[int, float]]] = counts.join(halves)
    left: DStream[tuple[str, tuple[int, float | None]]] = counts.leftOuterJoin(halves)
    right: DStream[tuple[str, tuple[int | None, float]]] = counts.rightOuterJoin(halves)
    full: DStream[tuple[str, tuple[int | None, float | None]]] = counts.fullOuterJoin(halves)
    cogrouped: DStream[tuple[str, tuple[ResultIterable[int], ResultIterable[float]]]] = counts.cogroup(halves)
    windowed: DStream[tuple[str, int]] = ones.reduceByKeyAndWindow(operator.add, operator.sub, 30, 10,
                                                                   filterFunc=lambda kv: kv[1] > 0)
    grouped_window: DStream[tuple[str, ResultIterable[int]]] = ones.groupByKeyAndWindow(30, 10)
    del letters, grouped, combined, by_value, by_value_window, partitioned, joined, left, right, full, cogrouped
    del windowed, grouped_window


def total(values: list[int], state: int | None) -> int | None:
    return sum(values) + (state or 0)


def state(ssc: StreamingContext) -> None:
    ones: DStream[tuple[str, int]] = ssc.textFileStream("in").map(lambda w: (w, 1))
    totals: DStream[tuple[str, int]] = ones.updateStateByKey(total, initialRDD=[("a", 1)])
    running: DStream[tuple[str, int]] = ones.runningReduce(operator.add)
    changed: DStream[tuple[str, int | None]] = running.changes()
    tracked: DStream[tuple[str, object]] = ones.track(lambda k, v: v, lambda k, s, v: s + v, "10m")
    del totals, changed, tracked


def event_time(ssc: StreamingContext) -> None:
    events: DStream[tuple[str, float]] = ssc.queueStream([[("a", 1.5)]])
    timed: TimedDStream[tuple[str, float]] = events.withEventTime(lambda r: r[1], "5s")
    still_timed: TimedDStream[tuple[str, int]] = timed.mapValues(round)
    plain: TimedDStream[float] = timed.map(lambda r: r[1])
    windows: EventWindowView[tuple[tuple[str, tuple[float, float]], int]] = still_timed.reduceByKeyAndEventWindow(
        operator.add, "1min")
    totals: EventWindowView[tuple[tuple[float, float], float]] = plain.reduceByEventWindow(operator.add, "1min")
    late: DStream[tuple[str, float]] = timed.lateRecords()
    marks: DStream[float | None] = events.watermarks()
    del windows, totals, late, marks


def rdd_functions(ssc: StreamingContext) -> None:
    numbers: DStream[int] = ssc.queueStream([[1, 2]])
    doubled: DStream[int] = numbers.transform(lambda rdd: rdd.map(lambda n: n * 2))
    stamped: DStream[str] = numbers.transform(lambda t, rdd: rdd.map(lambda n: f"{t}: {n}"))
    zipped: DStream[tuple[int, str]] = numbers.transformWith(lambda a, b: a.zip(b), stamped)

    def show(time: datetime, rdd: RDD[int]) -> None:
        print(time, rdd.collect())

    def pairs_of(it: Iterable[int]) -> Iterator[tuple[int, int]]:
        return ((n, n) for n in it)

    numbers.foreachRDD(show)
    numbers.foreachRDD(lambda rdd: rdd.count())
    squares: DStream[tuple[int, int]] = doubled.mapPartitions(pairs_of)
    del zipped, squares
