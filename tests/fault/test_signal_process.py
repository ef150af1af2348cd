"""Issue 15: SIGTERM mid-stream stops a driver gracefully; a restart resumes with nothing lost or duplicated.

The driver (benchmarks/catchup_app.py with ``--engine-signals``: no handler of its own, blocked in
``ssc.awaitTermination()`` as a plain pyspark.streaming script) keeps its checkpoint, its input
(``textFileStream`` on an ``s3://`` prefix) and its exactly-once outputs (the raw lines, a running word
count) on the project's Ceph RADOS Gateway. A feeder puts one small object of unique lines every 0.5 s and
keeps feeding while the driver is down. The test sends SIGTERM while batches flow and checks: exit code 0,
every output folder the driver started is committed (no half-written output: a graceful stop finishes the
generated batches), and each batch time has both outputs. A second driver started on the same checkpoint
resumes (``getOrCreate``: "restored the stream graph", no fresh start); after the input drains and a second
SIGTERM, every fed line is in exactly one committed batch and the final counts equal what was fed.

Two launchers: ``python app.py`` (PySpark starts the JVM as a child) and ``spark-submit app.py`` (the JVM
starts the Python driver). The first SIGTERM goes to the process the launcher started (the Python driver,
or the ``spark-submit`` JVM, which must hand it to the Python driver instead of stopping the SparkContext);
the second to the whole process group (as systemd or a terminal's Ctrl-C does: the driver receives it
twice, directly and forwarded by the JVM, and must not take the copy for a second signal).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from ..process_support import (
    BATCH_MS,
    CATCHUP_APP,
    Feeder,
    Outputs,
    assert_exactly_once,
    driver_env,
    metrics,
    s3_client,
    stop_driver,
    tail,
    wait_for_driver,
)
from ..support import RGW_ENDPOINT, service_unavailable

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.s3, pytest.mark.ceph]

EXIT_TIMEOUT_S = 120  # a graceful stop waits for the generated batches (10 intervals at most by default)


@pytest.fixture(scope="module")
def signal_bucket():
    client = s3_client()
    bucket = f"signal-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"Ceph RGW at {RGW_ENDPOINT} is not reachable ({e}); run `bash scripts/services.sh start`")
    return bucket


def _command(launcher: str) -> list[str]:
    if launcher == "python":
        return [sys.executable]
    import pyspark

    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    return [submit, "--master", "local[2]", "--conf", f"spark.pyspark.driver.python={sys.executable}"]


def _start(launcher: str, base: str, metrics_path: str, log_path: str, cwd: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([*_command(launcher), CATCHUP_APP, base, metrics_path, "--engine-signals"],
                                env=driver_env(), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)


def _driver_pid(log_path: str) -> int:
    """The Python driver's process id, from its ``STARTED pid N`` line (the JVM's child under spark-submit)."""
    found = re.findall(r"STARTED pid (\d+)", tail(log_path, 10**7))
    assert found, tail(log_path)
    return int(found[-1])


def _completed_by(metrics_path: str, pid: int) -> list[dict]:
    return [r for r in metrics(metrics_path) if r["pid"] == pid and not r["failed"]]


def _folders(client, bucket: str, prefix: str) -> dict[str, set[str]]:
    """Every output folder under ``<prefix>/out/`` with the names of its objects."""
    root = f"{prefix}/out/"
    found: dict[str, set[str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
        for o in page.get("Contents", []):
            folder, _, leaf = o["Key"][len(root):].partition("/")
            found.setdefault(folder, set()).add(leaf)
    return found


def _sigterm_and_wait(proc: subprocess.Popen, log_path: str, group: bool = False) -> int:
    """SIGTERM to the launched process (or its whole process group) and its exit code."""
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the driver did not exit {EXIT_TIMEOUT_S} s after SIGTERM\n{tail(log_path)}") from None


@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher", ["python", "spark-submit"])
def test_sigterm_mid_stream_stops_gracefully_and_a_restart_resumes_exactly_once(tmp_path, signal_bucket, launcher):
    client = s3_client()
    prefix = f"run-{uuid.uuid4().hex[:6]}"
    base = f"s3://{signal_bucket}/{prefix}"
    metrics_path = str(tmp_path / "metrics.jsonl")
    logs = [str(tmp_path / "driver-1.log"), str(tmp_path / "driver-2.log")]
    feeder = Feeder(client, signal_bucket, prefix)
    outputs = Outputs(client, signal_bucket, prefix)
    procs: list[subprocess.Popen] = []
    try:
        # ---- first driver: batches flow, then SIGTERM while the feeder keeps putting objects
        first = _start(launcher, base, metrics_path, logs[0], str(tmp_path))
        procs.append(first)
        wait_for_driver(lambda: "STARTED" in tail(logs[0], 10**7), 240, "the driver to start", first, logs[0])
        feeder.start()
        feeder.resume()
        first_pid = _driver_pid(logs[0])
        wait_for_driver(lambda: len(_completed_by(metrics_path, first_pid)) >= 6 and feeder.objects >= 6, 240,
              "batches with input", first, logs[0])
        code = _sigterm_and_wait(first, logs[0])
        text = tail(logs[0], 10**7)
        assert code == 0, f"exit code {code} after SIGTERM\n{text[-6000:]}"
        assert "SIGTERM received: stopping the stream" in text and "TERMINATED" in text, text[-6000:]
        assert "Traceback" not in text, text[-6000:]
        if launcher == "spark-submit":  # the JVM got the signal and handed it on
            assert "SIGTERM reached the driver JVM; forwarded to the Python driver" in text, text[-6000:]

        # ---- nothing half-written: every folder the driver started is committed, each batch has both outputs
        folders = _folders(client, signal_bucket, prefix)
        uncommitted = sorted(f for f, leaves in folders.items() if "_SUCCESS" not in leaves)
        assert not uncommitted, f"output folders left without _SUCCESS by the graceful stop: {uncommitted}"
        by_time: dict[int, set[str]] = {}
        for folder in folders:
            name, _, ms = folder.rpartition("-")
            by_time.setdefault(int(ms), set()).add(name)
        assert all(names == {"lines", "counts"} for names in by_time.values()), by_time
        stopped_at = max(by_time)

        # ---- second driver: resumes from the checkpoint (the feeder went on while it was down)
        time.sleep(3)
        second = _start(launcher, base, metrics_path, logs[1], str(tmp_path))
        procs.append(second)
        wait_for_driver(lambda: "STARTED" in tail(logs[1], 10**7), 240, "the second driver to start", second, logs[1])
        assert "restored the stream graph from the checkpoint" in tail(logs[1], 10**7)
        second_pid = _driver_pid(logs[1])
        wait_for_driver(lambda: len(_completed_by(metrics_path, second_pid)) >= 4, 240, "batches of the second driver",
              second, logs[1])
        # The second driver starts after the newest state checkpoint (every 2 batches): it redoes at most the
        # batch after it to rebuild the state (its committed outputs are kept, not written again), and skips none.
        resumed = min(r["batch_ms"] for r in _completed_by(metrics_path, second_pid))
        assert stopped_at - 2 * BATCH_MS < resumed <= stopped_at + BATCH_MS, (stopped_at, resumed)

        # ---- drain, then stop the second driver the same way
        feeder.finish()
        fed = list(feeder.fed)

        def drained() -> bool:
            read = outputs.refresh()
            seen = Counter(x for (n, _), ls in read.items() if n == "lines" for x in ls)
            return all(seen[x] for x in fed)

        wait_for_driver(drained, 180, "every fed line in a committed output", second, logs[1], 2.0)
        last_lines = max(t for t in outputs.times("lines") if outputs.read[("lines", t)])
        wait_for_driver(lambda: outputs.refresh() and max(outputs.times("counts"), default=0) >= last_lines, 60,
              "the counts of the last batch with input", second, logs[1], 1.0)
        code = _sigterm_and_wait(second, logs[1], group=True)
        text = tail(logs[1], 10**7)
        assert code == 0, f"exit code {code} after SIGTERM to the process group\n{text[-6000:]}"
        # The signal reaches the driver twice (the process group, then the JVM's forwarded copy): the copy must not
        # count as a second signal (which exits at once, code 143). When the copy comes while the stop runs it is
        # logged as the same signal; on a loaded machine it may come only after the stop finished (a fresh clone
        # with two busy loops beside it: no log line, exit 0), so the exit code and the absence of an exit at once
        # are what is asserted.
        assert "exiting now" not in text, text[-6000:]
        assert "Traceback" not in text, text[-6000:]
    finally:
        if feeder.is_alive():
            feeder.finish()
        for proc in procs:
            stop_driver(proc)

    # ---- exactly once across the stop and the restart
    outputs.refresh()
    assert_exactly_once(outputs, fed, max(outputs.times("lines")))
