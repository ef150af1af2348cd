"""Issue 12: a driver process rides out a 60 s outage of the real Ceph RADOS Gateway (30 s at the CI scale).

The driver (benchmarks/catchup_app.py, shared with the catch-up benchmark) keeps its checkpoint, its input
(``textFileStream`` on an ``s3://``
prefix) and its outputs (exactly-once ``saveAsTextFiles`` of the raw lines and of a running word count) on
the gateway started by scripts/services.sh. A feeder in the test puts one small object of unique lines
every 0.5 s. Once batches flow steadily, the test stops radosgw (SIGTERM, as services.sh does), waits
``OUTAGE_S``, and starts it again with ``scripts/services.sh start`` (which starts only what is down). It checks
that the driver did not exit and goes on completing batches, measures how long after the gateway is back
the stream is in steady state again (scheduling delay under one batch interval), then drains the input,
stops the driver and checks that every fed line is in the committed line outputs exactly once and that
the final counts equal what was fed. radosgw is started again in ``finally`` whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter

import pytest

from ..process_support import (
    BATCH_MS,
    BATCH_S,
    CATCHUP_APP,
    Feeder,
    Outputs,
    assert_exactly_once,
    driver_env,
    metrics,
    rss_mb,
    s3_client,
    stop_driver,
    tail,
    wait_for_driver,
)
from ..support import DEFAULT_RGW_ENDPOINT, RGW_ENDPOINT, scaled, service_unavailable

# serial: the project's gateway is down for OUTAGE_S (60 s, 30 at the CI scale), which every other Ceph test running
# beside it would meet.
pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.s3, pytest.mark.serial]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVICES = os.path.join(ROOT, "scripts", "services.sh")
RGW_PID_FILE = os.path.join(ROOT, ".ceph", "cluster", "run", "client.rgw.a.pid")
DEFAULT_RGW = DEFAULT_RGW_ENDPOINT

# The batch interval (BATCH_S, tests/process_support.py): 1 s (issue 12); DSTREAMS_OUTAGE_TEST_BATCH_S overrides it
# (experiments on a slow machine).
# The outage: 60 s (issue 12); 30 s at the CI scale (tests/support.py's ci_scale; the same path: six times the driver's
# store retry bound of 5 s, batches waiting on the store, then the backlog caught up); DSTREAMS_OUTAGE_TEST_OUTAGE_S
# sets it either way.
OUTAGE_S = float(os.environ.get("DSTREAMS_OUTAGE_TEST_OUTAGE_S") or scaled(60, 30))
STEADY_RUN = 5  # consecutive batches within the bounds below that make a steady state
# Back to steady state within this long after the gateway answers again. Measured on this 2-core machine:
# 20 s when it was quiet (a 66 s backlog drained at ~4x real time), 76 s while a benchmark loaded both
# cores. Bounded at twice the outage.
RECOVERY_BOUND_S = 120.0


def _now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def rgw_bucket():
    if RGW_ENDPOINT.rstrip("/") != DEFAULT_RGW:
        pytest.skip(f"DSTREAMS_TEST_RGW_ENDPOINT={RGW_ENDPOINT}: this test stops and restarts the project's own "
                    "radosgw (scripts/services.sh), not an external one")
    client = s3_client()
    bucket = f"outage-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"Ceph RGW at {RGW_ENDPOINT} is not reachable ({e}); run `bash scripts/services.sh start`")
    if _rgw_pid() is None:
        service_unavailable(f"the radosgw at {RGW_ENDPOINT} was not started by scripts/services.sh (no live pid in "
                            f"{RGW_PID_FILE}): this test must be able to stop and restart it")
    return bucket


# ---------------------------------------------------------------- the gateway


def _rgw_pid() -> int | None:
    """The pid of the project's radosgw (services.sh's rgw_ours), or None when it is not running."""
    try:
        pid = int(open(RGW_PID_FILE).read().strip())
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if b"radosgw" in cmdline else None


def _http_up() -> bool:
    try:
        urllib.request.urlopen(RGW_ENDPOINT + "/", timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _s3_up(client, bucket: str) -> bool:
    try:
        client.head_bucket(Bucket=bucket)
        return True
    except Exception:  # noqa: BLE001
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not reaped: radosgw is not our child) counts as gone.
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stop_rgw() -> None:
    """As services.sh's stop_pid: SIGTERM, up to 10 s, then SIGKILL; then the port must be closed."""
    pid = _rgw_pid()
    assert pid is not None, "radosgw is not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not _alive(pid), f"radosgw (pid {pid}) did not exit"
    try:
        os.remove(RGW_PID_FILE)
    except OSError:
        pass
    deadline = time.monotonic() + 10
    while _http_up() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _http_up(), "the gateway still answers after radosgw exited"


def _start_rgw(timeout: float = 240) -> None:
    """``scripts/services.sh start`` (starts only what is down) until the gateway answers."""
    result = subprocess.run(["bash", SERVICES, "start"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if _rgw_pid() is None or not _http_up():
        raise AssertionError(f"services.sh start did not bring radosgw back (rc {result.returncode}):\n"
                             f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")


def _ensure_rgw() -> None:
    if _rgw_pid() is None or not _http_up():
        _start_rgw()


# ---------------------------------------------------------------- the driver's metrics


def _on_time(row: dict) -> bool:
    """Scheduling delay under one batch interval."""
    return row["scheduling_delay_ms"] is not None and row["scheduling_delay_ms"] < BATCH_MS


def _on_the_clock(row: dict) -> bool:
    """Processing started less than two intervals after the batch time. Stricter than the scheduling delay,
    which counts from the batch's submission: a batch generated late (its generation waited for the store,
    or for the batches generated before it) has a small scheduling delay but starts late."""
    return row["start_ms"] is not None and row["start_ms"] - row["batch_ms"] < 2 * BATCH_MS


def _steady_from(rows: list[dict], after_ms: int, ok) -> dict | None:
    """The first batch completed after ``after_ms`` that starts a run of STEADY_RUN batches all ``ok``."""
    later = [r for r in rows if (r["end_ms"] or 0) > after_ms and not r["failed"]]
    for i in range(len(later) - STEADY_RUN + 1):
        if all(ok(r) for r in later[i:i + STEADY_RUN]):
            return later[i]
    return None


# ---------------------------------------------------------------- the test


@pytest.mark.timeout(1500)
def test_gateway_down_60s_mid_stream_driver_rides_it_out_exactly_once(tmp_path, rgw_bucket):
    t_test = time.monotonic()
    client = s3_client()
    prefix = f"run-{uuid.uuid4().hex[:6]}"
    base = f"s3://{rgw_bucket}/{prefix}"
    log_path, metrics_path = str(tmp_path / "driver.log"), str(tmp_path / "metrics.jsonl")
    feeder = Feeder(client, rgw_bucket, prefix)
    outputs = Outputs(client, rgw_bucket, prefix)
    proc = None
    report: dict[str, object] = {}
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, CATCHUP_APP, base, metrics_path, "--batch-seconds", str(BATCH_S)],
                                    env=driver_env(), stdout=log,
                                    stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True)
        wait_for_driver(lambda: "STARTED" in tail(log_path, 10**7), 240, "the driver to start", proc, log_path)
        feeder.start()
        feeder.resume()

        def steady_before() -> bool:
            rows = metrics(metrics_path)
            if len(rows) < 15 or feeder.objects < 10:
                return False
            if not all(_on_time(r) and _on_the_clock(r) and not r["failed"] for r in rows[-STEADY_RUN:]):
                return False
            outputs.refresh()  # (a file stream's batches do not count their records: look at the output)
            return any(ls for (n, _), ls in outputs.read.items() if n == "lines")

        wait_for_driver(steady_before, 300, "batches to flow steadily before the outage", proc, log_path)
        before = metrics(metrics_path)
        report["driver_rss_mb_before_outage"] = rss_mb(proc.pid)
        report["processing_delay_before_ms"] = sorted(r["processing_ms"] for r in before[-STEADY_RUN:])

        # ---- the outage: gateway down for OUTAGE_S
        feeder.pause()
        _stop_rgw()
        t_down = time.monotonic()
        t_down_ms = _now_ms()
        fed_before_outage = len(feeder.fed)
        while time.monotonic() - t_down < OUTAGE_S:
            assert proc.poll() is None, f"the driver exited during the outage ({proc.returncode})\n{tail(log_path)}"
            assert not _http_up(), "the gateway answered during the outage (someone restarted it)"
            time.sleep(0.5)
        completed_during = [r for r in metrics(metrics_path) if (r["end_ms"] or 0) > t_down_ms + 10_000]
        t_restart = time.monotonic()
        _start_rgw()
        deadline = time.monotonic() + 60
        while not _s3_up(client, rgw_bucket):
            assert time.monotonic() < deadline, "the gateway answers HTTP but not S3 requests"
            time.sleep(0.2)
        t_back_ms = _now_ms()
        report["gateway_down_s"] = round(time.monotonic() - t_down, 1)
        report["gateway_restart_s"] = round(time.monotonic() - t_restart, 1)
        feeder.resume()

        # ---- the driver did not exit, and goes on
        assert proc.poll() is None, f"the driver exited after the outage ({proc.returncode})\n{tail(log_path)}"
        wait_for_driver(lambda: len([r for r in metrics(metrics_path) if (r["end_ms"] or 0) > t_back_ms]) >= 3, 180,
              "batches completing after the gateway is back", proc, log_path)

        # ---- back to steady state (measured)
        def steady_after():
            rows = metrics(metrics_path)
            by_sched = _steady_from(rows, t_back_ms, _on_time)
            by_clock = _steady_from(rows, t_back_ms, lambda r: _on_time(r) and _on_the_clock(r))
            return (rows, by_sched, by_clock) if by_sched and by_clock else None

        rows, by_sched, by_clock = wait_for_driver(steady_after, 600, "steady state after the outage", proc, log_path,
                                                   1.0)
        after = [r for r in rows if (r["end_ms"] or 0) > t_back_ms]
        report["recovery_s_scheduling_delay"] = round((by_sched["end_ms"] - t_back_ms) / 1000, 1)
        report["recovery_s_on_the_clock"] = round((by_clock["end_ms"] - t_back_ms) / 1000, 1)
        report["catch_up_batches_scheduling_delay"] = sum(1 for r in after if r["end_ms"] <= by_sched["end_ms"])
        report["catch_up_batches_on_the_clock"] = sum(1 for r in after if r["end_ms"] <= by_clock["end_ms"])
        report["batches_completed_during_outage"] = len(completed_during)
        report["max_scheduling_delay_ms_after"] = max(r["scheduling_delay_ms"] or 0 for r in after)
        report["max_start_lag_ms_after"] = max((r["start_ms"] or 0) - r["batch_ms"] for r in after)
        report["failed_batches"] = sum(1 for r in rows if r["failed"])
        report["driver_rss_mb_steady_after"] = rss_mb(proc.pid)

        # ---- drain: stop feeding, wait until every fed line is in a committed output
        time.sleep(5)
        feeder.finish()
        fed = list(feeder.fed)
        assert len(fed) > fed_before_outage > 0, "nothing was fed after the outage"

        def drained():
            read = outputs.refresh()
            seen = Counter(x for (n, _), ls in read.items() if n == "lines" for x in ls)
            return all(seen[x] for x in fed)

        wait_for_driver(drained, 180, "every fed line in a committed output", proc, log_path, 2.0)
        last_lines = max(t for t in outputs.times("lines") if outputs.read[("lines", t)])

        def counts_through_last_input() -> bool:
            outputs.refresh()
            return max(outputs.times("counts"), default=0) >= last_lines

        wait_for_driver(counts_through_last_input, 60, "the counts of the last batch with input", proc, log_path, 1.0)
        assert proc.poll() is None, f"the driver exited ({proc.returncode})\n{tail(log_path)}"
        report["driver_alive_to_the_end"] = True
    finally:
        print("OUTAGE REPORT (so far) " + json.dumps(report), flush=True)
        if feeder.is_alive():
            feeder.finish()
        if proc is not None:
            stop_driver(proc)
        _ensure_rgw()

    text = open(log_path, errors="replace").read()
    assert "DRIVER FAILED" not in text and "DRIVER STOPPED ON ITS OWN" not in text, text[-6000:]
    report["outage_warnings_in_driver_log"] = text.count("store unavailable for")
    outputs.refresh()

    assert_exactly_once(outputs, fed, last_lines)

    report["lines_fed"] = len(fed)
    report["objects_fed"] = feeder.objects
    report["committed_batches"] = len(outputs.times("lines"))
    report["test_duration_s"] = round(time.monotonic() - t_test, 1)
    print("OUTAGE REPORT " + json.dumps(report), flush=True)
    assert report["recovery_s_scheduling_delay"] < RECOVERY_BOUND_S, report
    assert report["recovery_s_on_the_clock"] < RECOVERY_BOUND_S, report
