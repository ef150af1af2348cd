"""A driver writing a deterministic stream to Kafka with ``saveToKafka`` (for the Kafka sink's process tests).

``python kafka_sink_app.py BOOTSTRAP TOPIC CHECKPOINT [GUARANTEE]``: 1 s batches over ``generatorStream`` (2
partitions of :data:`PER_PARTITION` records, :func:`records`), each record ``(key, value)`` written to ``TOPIC``
with ``saveToKafka`` (exactly once by default). Resumes with ``getOrCreate(CHECKPOINT)``; SIGTERM stops gracefully
and exits 0 (``tests/redis_app.py``'s ``run_driver``).

Faults, from the environment (installed by ``run_driver``, :mod:`dstreams.faults`):
``DSTREAMS_FAULT_TASK_KILL=<point>:<marker>`` reaches the tasks (carried with the batches' jobs); with
``KAFKA_SINK_APP_DIE_WITH=<marker>`` as well, the driver SIGKILLs itself as soon as that marker file is gone (a
task reached the point and killed its worker): the driver dies while a partition of the batch is in its commit
(``kafka-before-commit``: its transaction open) or just committed (``kafka-after-commit``).
``DSTREAMS_FAULT_TASK_PAUSE=<point>:<marker>`` stops (SIGSTOP) the task that reaches the point while the marker exists.
``DSTREAMS_FAULT_PAUSE`` / ``DSTREAMS_FAULT_KILL`` work as for any driver.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

PER_PARTITION = 40
PARTITIONS = 2
KEYS_PER_PARTITION = 4
#: Long: a transaction left open by a killed worker must be resolved by the restarted driver's tasks
#: (``init_transactions``), not by the broker's timeout.
TRANSACTION_TIMEOUT_MS = 120_000


def records(seed: int, t: int, partition: int, n: int) -> list[tuple[str, str]]:
    """Record ``i`` of ``partition`` in batch ``t``: key ``k<partition>-<i mod 4>``, value ``<t>:<partition>:<i>``
    (a key lives in one partition: its order is the order of ``i`` in each batch, then of the batches)."""
    return [(f"k{partition}-{i % KEYS_PER_PARTITION}", f"{t}:{partition}:{i}") for i in range(n)]


def build(sc: Any, bootstrap: str, topic: str, checkpoint: str, guarantee: str = "exactly-once") -> Any:
    from dstreams import StreamingContext

    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(checkpoint)
    ssc.generatorStream(PER_PARTITION, PARTITIONS, seed=7, recordFunc=records).saveToKafka(
        topic, {"bootstrap.servers": bootstrap, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}, guarantee=guarantee)
    return ssc


def _die_when_gone(marker: str) -> None:
    def watch() -> None:
        while os.path.exists(marker):
            time.sleep(0.005)
        print("KILLING THE DRIVER: a task reached its kill point", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="die-with-marker").start()


def main(bootstrap: str, topic: str, checkpoint: str, guarantee: str = "exactly-once") -> int:
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, where redis_app is
    from redis_app import run_driver

    marker = os.environ.get("KAFKA_SINK_APP_DIE_WITH")
    if marker:
        _die_when_gone(marker)
    return run_driver("dstreams-kafka-sink-app", checkpoint,
                      lambda sc: build(sc, bootstrap, topic, checkpoint, guarantee))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
