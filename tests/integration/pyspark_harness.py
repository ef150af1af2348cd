"""Differential harness: run one pipeline on dstreams and on ``pyspark.streaming`` with the same input.

A pipeline is a :class:`Spec`: queue-stream inputs (one list of batches per stream), a batch count
and a ``build(ssc, streams, sink)`` function written against the API both engines share. ``build``
registers the streams to compare with ``sink.out`` (a two-argument ``foreachRDD`` collector) or
``sink.out_untimed`` (a one-argument one), and driver-side probes (e.g. ``slice``) with
``sink.probe``.

* dstreams runs on a ``ManualClock``: the harness advances it one batch at a time and waits for
  each batch (no sleeping).
* ``pyspark.streaming`` runs on its real clock. A "ticker" ``foreachRDD`` on the first input is
  registered after every other output; PySpark runs a batch's output operations in order and
  one batch after another, so once the ticker saw batch N every output of batches 1..N is
  collected. The harness polls for that with ``awaitTerminationOrTimeout`` (which also raises a
  failed batch's error) under a hard deadline, then stops the context.

Every collected value is keyed by its batch index (1 = the first batch), computed from the batch
time relative to the ticker's first batch, so windowed outputs that fire every other batch are
compared at the same batches; batches after ``Spec.batches`` (PySpark keeps running until stopped)
are dropped.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark import RDD, SparkContext

Normaliser = Callable[[list[Any]], Any]
Build = Callable[[Any, list[Any], "Sink"], None]


# ---------------------------------------------------------------------------------------- normalising
def canon(value: Any) -> Any:
    """An order-insensitive canonical form: tuples keep their order, other iterables become sorted lists.

    ``ResultIterable`` (groupByKey, cogroup), lists and sets all become lists sorted by ``repr`` (a
    total order for mixed types such as ``None`` next to ints in outer joins).
    """
    if value is None or isinstance(value, (str, bytes, int, float, complex)):
        return value
    if isinstance(value, tuple):
        return tuple(canon(v) for v in value)
    if isinstance(value, dict):
        return sorted(((canon(k), canon(v)) for k, v in value.items()), key=repr)
    if isinstance(value, Iterable):
        return sorted((canon(v) for v in value), key=repr)
    return value


def canon_batch(records: list[Any]) -> list[Any]:
    """A batch's records, each canonical, sorted (order inside a batch is not part of the contract)."""
    return sorted((canon(r) for r in records), key=repr)


def glom_elements(parts: list[list[Any]]) -> Counter[str]:
    """The multiset of the elements of a glom'd batch (for partition counts that legitimately differ)."""
    return Counter(repr(canon(x)) for part in parts for x in part)


# ---------------------------------------------------------------------------------------- pipelines
@dataclass
class Sink:
    """Collects the outputs of one run; ``build`` registers streams and probes on it.

    Streams registered with :meth:`out` are tagged with their name and unioned per slide duration
    (one Spark job per batch instead of one per output, which keeps both engines fast); a single
    two-argument ``foreachRDD(time, rdd)`` per slide collects the union and splits it by tag.
    """

    timed: dict[str, list[tuple[float, Any]]] = field(default_factory=dict)
    untimed: dict[str, list[Any]] = field(default_factory=dict)
    probes: dict[str, Callable[[float, float], Any]] = field(default_factory=dict)
    ticks: list[float] = field(default_factory=list)
    _pending: dict[float, list[tuple[str, Any]]] = field(default_factory=dict)
    _normalisers: dict[str, Normaliser] = field(default_factory=dict)

    def _claim(self, name: str) -> None:
        if name in self._normalisers or name in self.untimed:
            raise ValueError(f"duplicate output name {name!r}")

    def out(self, name: str, stream: Any, normalise: Normaliser = canon_batch) -> None:
        """Collect ``stream`` each time it produces an RDD (at its own slide)."""
        self._claim(name)
        self._normalisers[name] = normalise
        self.timed[name] = []
        tagged = stream.map(lambda record, tag=name: (tag, record))
        self._pending.setdefault(stream._slideDuration, []).append((name, tagged))

    def out_untimed(self, name: str, stream: Any, normalise: Normaliser = canon_batch) -> None:
        """Collect ``stream`` with its own one-argument ``foreachRDD(rdd)`` (for streams that emit every batch)."""
        self._claim(name)
        store = self.untimed[name] = []

        def collect(rdd: RDD) -> None:
            store.append(normalise(rdd.collect()))

        stream.foreachRDD(collect)

    def probe(self, name: str, fn: Callable[[float, float], Any]) -> None:
        """Run ``fn(first_batch_unix_s, batch_s)`` on the driver once every batch has run, before stop."""
        self.probes[name] = fn

    def _collector(self, names: list[str]) -> Callable[[datetime, RDD], None]:
        def collect(t: datetime, rdd: RDD) -> None:
            split: dict[str, list[Any]] = {name: [] for name in names}
            for tag, record in rdd.collect():
                split[tag].append(record)
            at = t.timestamp()
            for name, records in split.items():
                self.timed[name].append((at, self._normalisers[name](records)))

        return collect

    def _finish(self, ssc: Any) -> None:
        """Union the registered streams per slide and register one collector per union."""
        for group in self._pending.values():
            streams = [tagged for _, tagged in group]
            union = streams[0] if len(streams) == 1 else ssc.union(*streams)
            union.foreachRDD(self._collector([name for name, _ in group]))
        self._pending.clear()


@dataclass
class Spec:
    """A pipeline: ``inputs[i][b]`` is batch ``b`` of queue stream ``i``; ``batches`` may exceed the queue."""

    inputs: list[list[list[Any]]]
    batches: int
    build: Build
    batch_s: float = 0.5
    checkpoint: bool = False
    slices: int = 2


@dataclass
class Result:
    """One engine's outputs: ``outputs[name][batch_index]`` (1-based) and each probe's value."""

    outputs: dict[str, dict[int, Any]]
    probes: dict[str, Any]


def _wire(ssc: Any, sc: SparkContext, spec: Spec) -> Sink:
    sink = Sink()
    streams = [ssc.queueStream([sc.parallelize(b, spec.slices) for b in batches]) for batches in spec.inputs]
    spec.build(ssc, streams, sink)
    sink._finish(ssc)
    def tick(t: datetime, rdd: RDD) -> None:
        sink.ticks.append(t.timestamp())

    streams[0].foreachRDD(tick)  # the last output operation of every batch
    return sink


def _result(sink: Sink, spec: Spec, probes: dict[str, Any]) -> Result:
    if len(sink.ticks) < spec.batches:
        raise AssertionError(f"only {len(sink.ticks)} of {spec.batches} batches ran")
    first = sink.ticks[0]
    outputs: dict[str, dict[int, Any]] = {}
    for name, entries in sink.timed.items():
        indexed = {round((t - first) / spec.batch_s) + 1: v for t, v in entries}
        outputs[name] = {i: v for i, v in indexed.items() if 1 <= i <= spec.batches}
    for name, values in sink.untimed.items():
        outputs[name] = {i + 1: v for i, v in enumerate(values[: spec.batches])}
    return Result(outputs, probes)


def _run_probes(sink: Sink, spec: Spec) -> dict[str, Any]:
    return {name: fn(sink.ticks[0], spec.batch_s) for name, fn in sink.probes.items()}


def run_dstreams(sc: SparkContext, spec: Spec, checkpoint_dir: str | None = None,
                 timeout_s: float = 120.0) -> Result:
    """Run ``spec`` on dstreams, batch by batch on a ManualClock."""
    from dstreams import ManualClock, StreamingContext

    clock = ManualClock()
    ssc = StreamingContext(sc, spec.batch_s, clock=clock)
    batch_ms = round(spec.batch_s * 1000)
    try:
        if spec.checkpoint and checkpoint_dir:
            ssc.checkpoint(checkpoint_dir)
        sink = _wire(ssc, sc, spec)
        ssc.start()
        for i in range(1, spec.batches + 1):
            clock.advance(batch_ms)
            ssc.awaitBatch(i * batch_ms, timeout_s)
            ssc.awaitTerminationOrTimeout(0)  # raises the error of a failed batch
        probes = _run_probes(sink, spec)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    return _result(sink, spec, probes)


def run_pyspark(sc: SparkContext, spec: Spec, checkpoint_dir: str | None = None,
                timeout_s: float = 180.0) -> Result:
    """Run ``spec`` on ``pyspark.streaming`` in real time until the ticker saw ``spec.batches`` batches."""
    from pyspark.streaming import StreamingContext as PySSC

    ssc = PySSC(sc, spec.batch_s)
    try:
        if spec.checkpoint:
            if not checkpoint_dir:
                raise ValueError("pyspark.streaming needs a checkpoint directory for this pipeline")
            ssc.checkpoint(checkpoint_dir)
        sink = _wire(ssc, sc, spec)
        ssc.start()
        deadline = time.monotonic() + timeout_s
        while len(sink.ticks) < spec.batches:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pyspark.streaming ran {len(sink.ticks)} of {spec.batches} batches "
                                   f"in {timeout_s} s")
            ssc.awaitTerminationOrTimeout(0.05)  # bounded poll; raises a failed batch's error
        probes = _run_probes(sink, spec)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    return _result(sink, spec, probes)
