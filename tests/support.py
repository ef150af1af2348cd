"""Test harness: run a dstreams pipeline batch by batch on a ManualClock and collect its outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dstreams import DStream, ManualClock, StreamingContext

Build = Callable[[DStream], dict[str, DStream]]


def collector(store: dict[str, list[Any]], name: str, normalise: Callable[[list[Any]], Any] = sorted):
    def collect(rdd):
        store.setdefault(name, []).append(normalise(rdd.collect()))

    return collect


def run_manual(sc, inputs: list[list[Any]], build: Build, batches: int | None = None, batch_ms: int = 1000,
               normalise: Callable[[list[Any]], Any] = sorted, timeout_s: float = 120.0,
               ssc_setup: Callable[[StreamingContext], None] | None = None) -> dict[str, list[Any]]:
    """Feed ``inputs`` (one list per batch) through ``build`` and return each output's batches.

    ``build(stream)`` returns named output streams; each is collected per batch, with ``normalise``
    applied (sorted by default, since order inside a batch is not part of the contract).
    """
    n = batches if batches is not None else len(inputs)
    clock = ManualClock()
    ssc = StreamingContext(sc, batch_ms / 1000.0, clock=clock)
    if ssc_setup:
        ssc_setup(ssc)
    stream = ssc.queueStream([sc.parallelize(b, 2) for b in inputs])
    outputs: dict[str, list[Any]] = {}
    for name, s in build(stream).items():
        outputs[name] = []
        s.foreachRDD(collector(outputs, name, normalise))
    ssc.start()
    try:
        for i in range(1, n + 1):
            clock.advance(batch_ms)
            ssc.awaitBatch(i * batch_ms, timeout_s)
    finally:
        ssc.stop(stopSparkContext=False)
    return outputs
