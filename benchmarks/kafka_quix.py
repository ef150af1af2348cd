"""Quix Streams on the Kafka benchmark's WordCount: Kafka -> 30 s window sliding by 1 s -> Kafka, exactly once.

``<python with quixstreams> -m benchmarks.kafka_quix '<spec as JSON>'`` (started by :mod:`benchmarks.kafka`, one
process per instance of the consumer group: Quix Streams runs one Python thread per process, so two instances use
the two cores as ``local[2]`` does). This module imports only the standard library and ``quixstreams``: it runs in
a separate virtual environment, because quixstreams pins ``confluent-kafka<2.13`` while dstreams uses a newer one.

Contract: the idiomatic Quix Streams WordCount over the spec's ``input`` topic (read from its earliest offset):
the line's words (``expand``), ``group_by`` the word (Quix's repartition topic), ``hopping_window(30 s, interval)``
counted and emitted when each window closes (``final()``, closing by partition: one result per word and window,
as dstreams' window per batch), written to the spec's ``output`` topic with the word as key and
``"<count> <window end - 1 ms>"`` as value. The newest input a closed window covers is its last record, within a
few ms of its end at these rates, so the latency is measured from the window's end (dstreams': from its batch's
last record). The window has a grace period of the spec's ``grace_ms``: the two instances commit their
repartitioned words at different times, so a partition of the repartition topic sees timestamps out of order by
about a commit interval, and without grace those words would be dropped as late.
``processing_guarantee="exactly-once"``, ``commit_interval`` = the interval (Quix commits a transaction per
checkpoint; its default of 5 s would add 5 s to every latency). Protocol: as :mod:`benchmarks.kafka_apps`
(:data:`READY`, ``stop`` on standard input, :data:`RESULT` + JSON).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from benchmarks.kafka_protocol import READY, RESULT, on_stop_line

WINDOW_MS = 30_000


def build_app(spec: dict[str, Any]) -> Any:
    """The Quix Streams application of the module contract (not yet running)."""
    from quixstreams import Application
    from quixstreams.dataframe.windows.aggregations import Count

    interval_ms = round(spec["interval_s"] * 1000)
    app = Application(broker_address=spec["bootstrap"], consumer_group=spec["group"], auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", commit_interval=spec["interval_s"],
                      state_dir=spec["state_dir"], loglevel=spec.get("loglevel", "ERROR"))
    source = app.topic(spec["input"], value_deserializer="bytes", key_deserializer="bytes")
    sink = app.topic(spec["output"], value_serializer="str", key_serializer="str")
    sdf = app.dataframe(source)
    sdf = sdf.apply(lambda line: line.decode().split(), expand=True)
    sdf = sdf.group_by(lambda word: word, name="word", value_deserializer="str", key_deserializer="str",
                       value_serializer="str", key_serializer="str")
    window = sdf.hopping_window(WINDOW_MS, interval_ms, grace_ms=spec.get("grace_ms", 0))
    sdf = window.agg(n=Count()).final(closing_strategy="partition")
    sdf = sdf.apply(lambda w: f"{w['n']} {w['end'] - 1}")
    sdf.to_topic(sink)
    return app


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    app = build_app(spec)

    on_stop_line(app.stop)
    t0 = time.monotonic()
    print(READY, flush=True)
    app.run()
    print(RESULT + json.dumps({"wall_s": round(time.monotonic() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
