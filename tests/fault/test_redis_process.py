"""Issue 13: a driver reading Redis Streams, killed with SIGKILL three times, loses and repeats nothing.

A producer thread keeps writing keyed entries into 4 stream keys of the project's Redis server
(scripts/services.sh). The driver (tests/redis_app.py) saves every entry it reads (``<key> <id>``) and a
per-key count kept with ``updateStateByKey`` with exactly-once ``saveAsTextFiles``. It is killed with
SIGKILL at random moments (after 2-5 more committed batches) three times (twice at the CI scale,
``tests/support.py``'s :func:`~tests.support.ci_scale`: a kill of a driver that was itself resumed is still
in it) and resumed with ``getOrCreate`` each time; then the producer stops, the driver drains the streams and stops. The
committed outputs must hold every produced entry exactly once, and the last counts must equal what was
produced per key.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from ..process_support import committed_batches, stop_process, wait_for
from ..support import scaled

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.redis]

APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "redis_app.py")  # tests/: shared
KEYS = 4
#: The second kill already meets a resumed driver (its backlog, its checkpoints); a third repeats that.
KILLS = scaled(3, 2)


class Producer(threading.Thread):
    """Writes ``(key, id)`` entries into the keys in a round-robin, a few every 50 ms, until stopped."""

    def __init__(self, client, keys: list[str]) -> None:
        super().__init__(daemon=True, name="redis-producer")
        self.client, self.keys = client, keys
        self.written: list[tuple[str, str]] = []
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.stopped.wait(0.05):
                for _ in range(3):
                    key = self.keys[n % len(self.keys)]
                    self.written.append((key, self.client.xadd(key, {"n": str(n)})))
                    n += 1
        except BaseException as e:  # reported by the test
            self.error = e


@pytest.mark.timeout(1200)
def test_driver_killed_three_times_reads_every_entry_exactly_once(tmp_path, redis_url, redis_client, redis_prefix):
    keys = [f"{redis_prefix}{i}" for i in range(KEYS)]
    for k in keys:  # the keys exist before the stream starts (missing keys fail at start by default)
        redis_client.xadd(k, {"n": "init"})
    ckpt, out, log_path = str(tmp_path / "ckpt"), str(tmp_path / "out"), str(tmp_path / "driver.log")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)

    def start() -> subprocess.Popen:
        log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen([sys.executable, APP, redis_url, redis_prefix, str(KEYS), ckpt, out], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))

    producer = Producer(redis_client, keys)
    rng = random.Random(13)
    proc = start()
    try:
        producer.start()
        for _kill in range(KILLS):
            target = len(committed_batches(out, "entries")) + rng.randint(2, 5)
            wait_for(lambda t=target: len(committed_batches(out, "entries")) >= t, 180, f"{target} committed batches",
                  proc, log_path)
            time.sleep(rng.uniform(0, 1))  # a random moment within a batch
            stop_process(proc, signal.SIGKILL)
            proc = start()
        wait_for(lambda: len(committed_batches(out, "entries")) >= 3, 180, "batches after the last restart", proc,
                 log_path)
        producer.stopped.set()
        producer.join(10)
        assert producer.error is None, producer.error
        expected = {f"{k} {i}" for k, i in producer.written} | {
            f"{k} {e[0]}" for k in keys for e in redis_client.xrange(k, count=1)}

        def all_read() -> bool:
            return sum(len(v) for v in committed_batches(out, "entries").values()) >= len(expected)

        # The backlog of the restarts: minutes on a loaded machine.
        wait_for(all_read, 420, f"all {len(expected)} entries committed", proc, log_path)
        time.sleep(2.5)  # the next batches commit the counts of the last entries (and nothing new)
        stop_process(proc, signal.SIGTERM)
        assert proc.returncode == 0, open(log_path, errors="replace").read()[-4000:]
    finally:
        producer.stopped.set()
        stop_process(proc, signal.SIGKILL)
    entries = committed_batches(out, "entries")
    lines = [line for t in sorted(entries) for line in entries[t]]
    duplicates = [x for x, n in Counter(lines).items() if n > 1]
    assert not duplicates, duplicates[:10]
    assert set(lines) == expected
    counts = committed_batches(out, "counts")
    times = sorted(counts)
    assert times == list(range(times[0], times[-1] + 1000, 1000)), "no batch time is missing"
    # A batch interrupted after its first output (a kill, or a graceful stop that timed out under load) is
    # re-run by the next driver; only the very last batch may be left with its entries but not its counts.
    assert set(entries) - set(counts) <= {times[-1] + 1000}, sorted(set(entries) ^ set(counts))
    assert set(counts) <= set(entries)
    per_key = Counter(line.split()[0] for t in entries if t <= times[-1] for line in entries[t])
    last = dict(eval(line) for line in counts[times[-1]])  # noqa: S307 - our own output: "('key', n)"
    assert last == dict(per_key)
    assert open(log_path, errors="replace").read().count("STARTED") == KILLS + 1
