"""Helpers of the tests that run a driver in a process of its own and kill, stop or signal it.

Two parts:

* Any driver process: :func:`tail` of its log, :func:`wait_for` a condition while it runs (failing at once when
  it exits, or after a timeout, with the log's end), :func:`stop_process` with a signal, :func:`kill_group` (SIGKILL
  its process group: the driver, its JVM and Python workers), :func:`stop_driver` (SIGTERM, then the group), and
  :func:`committed_batches` of a local exactly-once text output.
* The catch-up app on the Ceph RADOS Gateway (``benchmarks/catchup_app.py``; tests/fault/test_outage_process.py and
  tests/fault/test_signal_process.py): the gateway's :func:`s3_client`, the driver's :func:`driver_env`, its
  per-batch :func:`metrics`, the :class:`Feeder` of input objects, the committed :class:`Outputs` and
  :func:`assert_exactly_once`.

Waits poll with a timeout; nothing sleeps to wait for a process otherwise.
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
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from .support import RGW_ENDPOINT

# ---------------------------------------------------------------- any driver process


def tail(log_path: str | os.PathLike[str], n: int = 6000) -> str:
    """The last ``n`` characters of the log at ``log_path`` ("" when it cannot be read)."""
    try:
        with open(log_path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def wait_for(cond: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen,
             log_path: str | os.PathLike[str], step: float = 0.5,
             details: Callable[[], str] | None = None) -> Any:
    """Poll ``cond`` every ``step`` seconds until it returns a true value, which is returned.

    Raises ``AssertionError`` as soon as ``proc`` has exited with ``cond`` still false (checked once more after
    the exit), and ``TimeoutError`` after ``timeout`` seconds; both name ``what`` and end with the log's tail
    (after ``details()``, for a timeout, when given).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if proc.poll() is not None:
            value = cond()
            if value:
                return value
            raise AssertionError(f"driver exited ({proc.returncode}) while waiting for {what}\n{tail(log_path)}")
        if time.monotonic() > deadline:
            extra = f"{details()}\n" if details is not None else ""
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}\n{extra}driver log:\n{tail(log_path)}")
        time.sleep(step)


def stop_process(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``proc`` (unless it has exited) and wait for it: 90 s, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def is_stopped(pid: int) -> bool:
    """Process ``pid`` is stopped (SIGSTOP): its state in /proc is T (False once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the driver's process group (the driver and its JVM; started with ``start_new_session=True``) and
    wait until it is gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30  # best effort: the JVM leaves the group once it is reaped
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def stop_driver(proc: subprocess.Popen) -> None:
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


def committed_batches(out: str, name: str) -> dict[int, list[str]]:
    """The committed batches (``_SUCCESS``) of the local text output ``name`` under ``out``: batch ms -> lines."""
    result: dict[int, list[str]] = {}
    if not os.path.isdir(out):
        return result
    for folder in os.listdir(out):
        base, _, t = folder.rpartition("-")
        path = os.path.join(out, folder)
        if base != name or not os.path.exists(os.path.join(path, "_SUCCESS")):
            continue
        lines: list[str] = []
        for part in sorted(os.listdir(path)):
            if part.startswith("part-"):
                with open(os.path.join(path, part)) as f:
                    lines += f.read().splitlines()
        result[int(t)] = lines
    return result


# ---------------------------------------------------------------- the catch-up app on the Ceph gateway

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATCHUP_APP = os.path.join(ROOT, "benchmarks", "catchup_app.py")
BATCH_S = float(os.environ.get("DSTREAMS_OUTAGE_TEST_BATCH_S", "1"))
BATCH_MS = round(BATCH_S * 1000)
FEED_EVERY_S = 0.5
LINES_PER_OBJECT = 3
WORDS = 7  # each line is "line-<n> w<n % WORDS>"


def s3_client():
    """A boto3 client of the gateway (one attempt per call, short timeouts: an outage shows at once)."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=RGW_ENDPOINT, aws_access_key_id="AKTEST", aws_secret_access_key="SKTEST",
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                      connect_timeout=2, read_timeout=10))


def with_gateway(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the gateway's endpoint and credentials for a driver process (and the executors it starts, which
    inherit them), and without the variables that would point boto3 elsewhere."""
    env.update(AWS_ENDPOINT_URL_S3=RGW_ENDPOINT, AWS_ACCESS_KEY_ID="AKTEST", AWS_SECRET_ACCESS_KEY="SKTEST",
               AWS_DEFAULT_REGION="us-east-1")
    for k in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        env.pop(k, None)
    return env


def driver_env() -> dict[str, str]:
    """The catch-up driver's environment: the gateway's endpoint and credentials, no fault injection."""
    env = with_gateway(dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                            DSTREAMS_STORE_RETRY_SECONDS="5", DSTREAMS_STORE_OUTAGE_SECONDS="900",
                            PYTHONUNBUFFERED="1"))
    for k in ("DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER"):
        env.pop(k, None)
    return env


def rss_mb(pid: int) -> int | None:
    """The resident memory of process ``pid`` in MB (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def metrics(path: str) -> list[dict]:
    """The catch-up driver's completed batches (its metrics.jsonl), in completion order."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    rows = [json.loads(line) for line in text.splitlines() if line.strip().endswith("}")]
    return sorted(rows, key=lambda r: (r["end_ms"] or 0, r["batch_ms"]))


def wait_for_driver(cond: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen, log_path: str,
                    step: float = 0.5) -> Any:
    """:func:`wait_for` for the catch-up driver: a timeout also shows its RSS and its last batches (the
    ``metrics.jsonl`` next to ``log_path``)."""

    def details() -> str:
        rows = metrics(os.path.join(os.path.dirname(log_path), "metrics.jsonl"))
        recent = "\n".join(json.dumps(r) for r in rows[-8:])
        return f"driver RSS {rss_mb(proc.pid)} MB; last batches:\n{recent}"

    return wait_for(cond, timeout, what, proc, log_path, step, details)


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
