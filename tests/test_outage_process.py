"""Issue 12: a driver process rides out a 60 s outage of the real Ceph RADOS Gateway.

The driver (benchmarks/catchup_app.py, shared with the catch-up benchmark) keeps its checkpoint, its input
(``textFileStream`` on an ``s3://``
prefix) and its outputs (exactly-once ``saveAsTextFiles`` of the raw lines and of a running word count) on
the gateway started by scripts/services.sh. A feeder in the test puts one small object of unique lines
every 0.5 s. Once batches flow steadily, the test stops radosgw (SIGTERM, as services.sh does), waits
60 s, and starts it again with ``scripts/services.sh start`` (which starts only what is down). It checks
that the driver did not exit and goes on completing batches, measures how long after the gateway is back
the stream is in steady state again (scheduling delay under one batch interval), then drains the input,
stops the driver and checks that every fed line is in the committed line outputs exactly once and that
the final counts equal what was fed. radosgw is started again in ``finally`` whatever happens.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter

import pytest

from .support import RGW_ENDPOINT, service_unavailable

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.s3]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "benchmarks", "catchup_app.py")
SERVICES = os.path.join(ROOT, "scripts", "services.sh")
RGW_PID_FILE = os.path.join(ROOT, ".ceph", "cluster", "run", "client.rgw.a.pid")
DEFAULT_RGW = "http://127.0.0.1:7480"

# The batch interval: 1 s (issue 12); DSTREAMS_OUTAGE_TEST_BATCH_S overrides it (experiments on a slow machine).
BATCH_S = float(os.environ.get("DSTREAMS_OUTAGE_TEST_BATCH_S", "1"))
BATCH_MS = round(BATCH_S * 1000)
OUTAGE_S = float(os.environ.get("DSTREAMS_OUTAGE_TEST_OUTAGE_S", "60"))  # 60 s (issue 12); overridable for experiments
FEED_EVERY_S = 0.5
LINES_PER_OBJECT = 3
WORDS = 7  # each line is "line-<n> w<n % WORDS>"
STEADY_RUN = 5  # consecutive batches within the bounds below that make a steady state
# Back to steady state within this long after the gateway answers again. Measured on this 2-core machine:
# 20 s when it was quiet (a 66 s backlog drained at ~4x real time), 76 s while a benchmark loaded both
# cores. Bounded at twice the outage.
RECOVERY_BOUND_S = 120.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _client():
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=RGW_ENDPOINT, aws_access_key_id="AKTEST", aws_secret_access_key="SKTEST",
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                      connect_timeout=2, read_timeout=10))


@pytest.fixture(scope="module")
def rgw_bucket():
    if RGW_ENDPOINT.rstrip("/") != DEFAULT_RGW:
        pytest.skip(f"DSTREAMS_TEST_RGW_ENDPOINT={RGW_ENDPOINT}: this test stops and restarts the project's own "
                    "radosgw (scripts/services.sh), not an external one")
    client = _client()
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


# ---------------------------------------------------------------- the feeder


class Feeder(threading.Thread):
    """Puts ``in/obj-NNNNNN.txt`` with LINES_PER_OBJECT unique lines every FEED_EVERY_S while enabled.

    A put that fails is tried again (same key, same bytes: idempotent) until it succeeds; its lines are
    recorded as fed only then. ``pause()`` returns once no put is in flight.
    """

    def __init__(self, client, bucket: str, prefix: str) -> None:
        super().__init__(name="outage-feeder", daemon=True)
        self.client, self.bucket, self.prefix = client, bucket, prefix
        self.fed: list[str] = []
        self.objects = 0
        self.put_errors = 0
        self._enabled = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._n = 0

    def resume(self) -> None:
        self._enabled.set()

    def pause(self) -> None:
        self._enabled.clear()
        with self._lock:  # waits for a put in flight
            pass

    def finish(self) -> None:
        self.pause()
        self._done.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the feeder did not stop"

    def _put_one(self) -> None:
        lines = [f"line-{self._n + i} w{(self._n + i) % WORDS}" for i in range(LINES_PER_OBJECT)]
        key = f"{self.prefix}/in/obj-{self.objects:06d}.txt"
        body = ("\n".join(lines) + "\n").encode()
        while not self._done.is_set():
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body)
                break
            except Exception:  # noqa: BLE001 - retried with the same key and bytes
                self.put_errors += 1
                time.sleep(0.5)
        else:
            return
        self.fed.extend(lines)
        self.objects += 1
        self._n += LINES_PER_OBJECT

    def run(self) -> None:
        while not self._done.is_set():
            if not self._enabled.wait(0.1):
                continue
            with self._lock:
                if not self._enabled.is_set():
                    continue
                self._put_one()
            time.sleep(FEED_EVERY_S)


# ---------------------------------------------------------------- the driver and its metrics


def _env() -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               AWS_ENDPOINT_URL_S3=RGW_ENDPOINT, AWS_ACCESS_KEY_ID="AKTEST", AWS_SECRET_ACCESS_KEY="SKTEST",
               AWS_DEFAULT_REGION="us-east-1", DSTREAMS_STORE_RETRY_SECONDS="5",
               DSTREAMS_STORE_OUTAGE_SECONDS="900", PYTHONUNBUFFERED="1")
    for k in ("DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        env.pop(k, None)
    return env


def _tail(log_path: str, n: int = 6000) -> str:
    try:
        return open(log_path, errors="replace").read()[-n:]
    except OSError:
        return ""


def _stop_driver(proc: subprocess.Popen) -> None:
    """SIGTERM (the app stops its context and exits), then the whole process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the JVM and Python workers too, if any is left
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _rss_mb(pid: int) -> int | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _metrics(path: str) -> list[dict]:
    """Completed batches, in completion order."""
    try:
        text = open(path).read()
    except OSError:
        return []
    rows = [json.loads(line) for line in text.splitlines() if line.strip().endswith("}")]
    return sorted(rows, key=lambda r: (r["end_ms"] or 0, r["batch_ms"]))


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


def _wait(cond, timeout: float, what: str, proc: subprocess.Popen, log_path: str, step: float = 0.5):
    """Poll ``cond`` until it returns a true value (returned); fail if the driver exits or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"driver exited ({proc.returncode}) while waiting for {what}\n{_tail(log_path)}")
        if time.monotonic() > deadline:
            metrics = os.path.join(os.path.dirname(log_path), "metrics.jsonl")
            recent = "\n".join(json.dumps(r) for r in _metrics(metrics)[-8:])
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}; driver RSS {_rss_mb(proc.pid)} MB; "
                               f"last batches:\n{recent}\ndriver log:\n{_tail(log_path)}")
        time.sleep(step)


# ---------------------------------------------------------------- committed outputs


class Outputs:
    """Committed (``_SUCCESS``) output folders under ``<prefix>/out/``, each read once (they are immutable)."""

    def __init__(self, client, bucket: str, prefix: str) -> None:
        self.client, self.bucket, self.root = client, bucket, f"{prefix}/out/"
        self.read: dict[tuple[str, int], list[str]] = {}

    def _keys(self) -> list[str]:
        keys: list[str] = []
        token = None
        while True:
            kw = {"Bucket": self.bucket, "Prefix": self.root, "MaxKeys": 1000}
            if token:
                kw["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kw)
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = page["NextContinuationToken"]

    def refresh(self) -> dict[tuple[str, int], list[str]]:
        keys = self._keys()
        folders: dict[str, list[str]] = {}
        for k in keys:
            folder, _, leaf = k[len(self.root):].partition("/")
            folders.setdefault(folder, []).append(leaf)
        for folder, leaves in folders.items():
            name, _, ms = folder.rpartition("-")
            if "_SUCCESS" not in leaves or (name, int(ms)) in self.read:
                continue
            lines: list[str] = []
            for leaf in sorted(leaves):
                if leaf.startswith("part-"):
                    body = self.client.get_object(Bucket=self.bucket, Key=f"{self.root}{folder}/{leaf}")["Body"].read()
                    lines += [x for x in body.decode().splitlines() if x]
            self.read[(name, int(ms))] = lines
        return self.read

    def times(self, name: str) -> list[int]:
        return sorted(t for n, t in self.read if n == name)


def assert_exactly_once(outputs: Outputs, fed: list[str], through_ms: int) -> None:
    """Every fed line in exactly one committed ``lines`` batch and nothing else; no batch time up to
    ``through_ms`` without a committed ``lines`` and ``counts`` output; the final counts equal what was fed."""
    lines = Counter(x for (n, _), ls in outputs.read.items() if n == "lines" for x in ls)
    duplicated = {x: c for x, c in lines.items() if c > 1}
    assert not duplicated, f"lines in more than one committed batch: {sorted(duplicated)[:20]}"
    assert set(lines) == set(fed), (f"missing: {sorted(set(fed) - set(lines))[:20]}, "
                                    f"unexpected: {sorted(set(lines) - set(fed))[:20]}")
    for name in ("lines", "counts"):
        times = [t for t in outputs.times(name) if t <= through_ms]
        gaps = sorted(set(range(times[0], through_ms + 1, BATCH_MS)) - set(times))
        assert not gaps, f"{name}: batches without a committed output: {gaps[:20]}"
    final = outputs.read[("counts", max(outputs.times("counts")))]
    assert dict(ast.literal_eval(x) for x in final) == dict(Counter(w for line in fed for w in line.split()))


# ---------------------------------------------------------------- the test


@pytest.mark.timeout(1500)
def test_gateway_down_60s_mid_stream_driver_rides_it_out_exactly_once(tmp_path, rgw_bucket):
    t_test = time.monotonic()
    client = _client()
    prefix = f"run-{uuid.uuid4().hex[:6]}"
    base = f"s3://{rgw_bucket}/{prefix}"
    log_path, metrics_path = str(tmp_path / "driver.log"), str(tmp_path / "metrics.jsonl")
    feeder = Feeder(client, rgw_bucket, prefix)
    outputs = Outputs(client, rgw_bucket, prefix)
    proc = None
    report: dict[str, object] = {}
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, APP, base, metrics_path, "--batch-seconds", str(BATCH_S)],
                                    env=_env(), stdout=log,
                                    stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True)
        _wait(lambda: "STARTED" in _tail(log_path, 10**7), 240, "the driver to start", proc, log_path)
        feeder.start()
        feeder.resume()

        def steady_before() -> bool:
            rows = _metrics(metrics_path)
            if len(rows) < 15 or feeder.objects < 10:
                return False
            if not all(_on_time(r) and _on_the_clock(r) and not r["failed"] for r in rows[-STEADY_RUN:]):
                return False
            outputs.refresh()  # (a file stream's batches do not count their records: look at the output)
            return any(ls for (n, _), ls in outputs.read.items() if n == "lines")

        _wait(steady_before, 300, "batches to flow steadily before the outage", proc, log_path)
        before = _metrics(metrics_path)
        report["driver_rss_mb_before_outage"] = _rss_mb(proc.pid)
        report["processing_delay_before_ms"] = sorted(r["processing_ms"] for r in before[-STEADY_RUN:])

        # ---- the outage: gateway down for OUTAGE_S
        feeder.pause()
        _stop_rgw()
        t_down = time.monotonic()
        t_down_ms = _now_ms()
        fed_before_outage = len(feeder.fed)
        while time.monotonic() - t_down < OUTAGE_S:
            assert proc.poll() is None, f"the driver exited during the outage ({proc.returncode})\n{_tail(log_path)}"
            assert not _http_up(), "the gateway answered during the outage (someone restarted it)"
            time.sleep(0.5)
        completed_during = [r for r in _metrics(metrics_path) if (r["end_ms"] or 0) > t_down_ms + 10_000]
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
        assert proc.poll() is None, f"the driver exited after the outage ({proc.returncode})\n{_tail(log_path)}"
        _wait(lambda: len([r for r in _metrics(metrics_path) if (r["end_ms"] or 0) > t_back_ms]) >= 3, 180,
              "batches completing after the gateway is back", proc, log_path)

        # ---- back to steady state (measured)
        def steady_after():
            rows = _metrics(metrics_path)
            by_sched = _steady_from(rows, t_back_ms, _on_time)
            by_clock = _steady_from(rows, t_back_ms, lambda r: _on_time(r) and _on_the_clock(r))
            return (rows, by_sched, by_clock) if by_sched and by_clock else None

        rows, by_sched, by_clock = _wait(steady_after, 600, "steady state after the outage", proc, log_path, 1.0)
        after = [r for r in rows if (r["end_ms"] or 0) > t_back_ms]
        report["recovery_s_scheduling_delay"] = round((by_sched["end_ms"] - t_back_ms) / 1000, 1)
        report["recovery_s_on_the_clock"] = round((by_clock["end_ms"] - t_back_ms) / 1000, 1)
        report["catch_up_batches_scheduling_delay"] = sum(1 for r in after if r["end_ms"] <= by_sched["end_ms"])
        report["catch_up_batches_on_the_clock"] = sum(1 for r in after if r["end_ms"] <= by_clock["end_ms"])
        report["batches_completed_during_outage"] = len(completed_during)
        report["max_scheduling_delay_ms_after"] = max(r["scheduling_delay_ms"] or 0 for r in after)
        report["max_start_lag_ms_after"] = max((r["start_ms"] or 0) - r["batch_ms"] for r in after)
        report["failed_batches"] = sum(1 for r in rows if r["failed"])
        report["driver_rss_mb_steady_after"] = _rss_mb(proc.pid)

        # ---- drain: stop feeding, wait until every fed line is in a committed output
        time.sleep(5)
        feeder.finish()
        fed = list(feeder.fed)
        assert len(fed) > fed_before_outage > 0, "nothing was fed after the outage"

        def drained():
            read = outputs.refresh()
            seen = Counter(x for (n, _), ls in read.items() if n == "lines" for x in ls)
            return all(seen[x] for x in fed)

        _wait(drained, 180, "every fed line in a committed output", proc, log_path, 2.0)
        last_lines = max(t for t in outputs.times("lines") if outputs.read[("lines", t)])

        def counts_through_last_input() -> bool:
            outputs.refresh()
            return max(outputs.times("counts"), default=0) >= last_lines

        _wait(counts_through_last_input, 60, "the counts of the last batch with input", proc, log_path, 1.0)
        assert proc.poll() is None, f"the driver exited ({proc.returncode})\n{_tail(log_path)}"
        report["driver_alive_to_the_end"] = True
    finally:
        print("OUTAGE REPORT (so far) " + json.dumps(report), flush=True)
        if feeder.is_alive():
            feeder.finish()
        if proc is not None:
            _stop_driver(proc)
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
