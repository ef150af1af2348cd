"""The Kafka source and the exactly-once sink through a broker that stops and starts again (the project's own broker,
``scripts/services.sh stop|start kafka``; its data is kept): the driver rides the outage out, and what a
read_committed consumer sees equals a run without the restart."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from dstreams import ManualClock, StreamingContext

from ..kafka_support import create_topic, produce, read_committed
from ..support import kafka_is_external

pytest.importorskip("confluent_kafka")
pytestmark = [pytest.mark.fault, pytest.mark.serial]  # serial: the shared broker stops and starts

SERVICES = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"


def _services(*args: str) -> None:
    done = subprocess.run(["bash", str(SERVICES), *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"services.sh {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.timeout(600)
def test_a_broker_stopped_and_started_between_batches_loses_and_repeats_nothing(sc, kafka_bootstrap):
    if kafka_is_external():
        pytest.skip("the broker is not the project's own (DSTREAMS_TEST_KAFKA_BOOTSTRAP): it is not restarted here")
    source = create_topic(kafka_bootstrap, partitions=2, prefix="restart-in")
    sink = create_topic(kafka_bootstrap, partitions=2, prefix="restart-out")
    produce(kafka_bootstrap, source, [(f"k{i % 5}", str(i)) for i in range(20)])
    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    params = {"bootstrap.servers": kafka_bootstrap}
    got: list[list[int]] = []
    s = ssc.kafkaStream(source, params, startingOffsets="earliest", decoder=lambda r: (r.key.decode(), int(r.value)))
    s.foreachRDD(lambda rdd: got.append(sorted(v for _k, v in rdd.collect())))
    s.saveToKafka(sink, params, valueFunc=lambda kv: str(kv[1]), keyFunc=lambda kv: kv[0], outputName=sink)
    ssc.start()
    try:
        clock.advance(1000)
        ssc.awaitBatch(1000, 120)
        _services("stop", "kafka")
        try:
            clock.advance(1000)  # batch 2 is generated while the broker is down: the driver waits it out
        finally:
            _services("start", "kafka")
        ssc.awaitBatch(2000, 240)
        produce(kafka_bootstrap, source, [(f"k{i % 5}", str(i)) for i in range(20, 30)])
        clock.advance(1000)
        info = ssc.awaitBatch(3000, 240)
        assert not [op.failure_reason for op in info.output_operations.values() if op.failure_reason]
    finally:
        ssc.stop(stopSparkContext=False)
    assert got[0] == list(range(20)) and got[1] == [] and got[2] == list(range(20, 30))
    # A committed transaction's markers reach the partitions just after commit_transaction returns (the coordinator
    # writes them; slower on a broker that has just restarted): read until batch 3's records are visible (bounded).
    deadline = time.monotonic() + 60
    while len(out := read_committed(kafka_bootstrap, sink)) < 30 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(int(v) for _p, _o, _k, v in out) == list(range(30))  # each once
    per_key: dict[bytes, list[int]] = {}
    for _p, _o, k, v in out:
        per_key.setdefault(k, []).append(int(v))
    assert all(vs == sorted(vs) for vs in per_key.values()), per_key  # order per key kept
