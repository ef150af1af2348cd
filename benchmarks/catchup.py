"""Catch-up after a store outage or a driver kill: time to steady state and drain rate, next to the interval.

Run from the repository root, with the Ceph RADOS Gateway of ``scripts/services.sh`` running::

    python -m benchmarks.catchup --quick      # 20 s outage, 20 s down, 10 s steady phase: ~3 min
    python -m benchmarks.catchup              # 30 s outage, 30 s down, 30 s steady phase: ~4-5 min
    python -m benchmarks.catchup --scenarios kill --down-seconds 60 --batch-seconds 1

Each scenario runs the driver ``benchmarks/catchup_app.py`` in its own process (``local[2]``, 1 s batches:
``textFileStream`` on an ``s3://`` prefix of the local gateway, exactly-once ``saveAsTextFiles`` of the
lines and of a ``runningReduce`` word count checkpointed every 2 s, the checkpoint on the same bucket, a
listener writing every completed batch's metrics as a JSON line) while a feeder thread puts one object of
3 unique lines every 0.5 s. Once the stream is steady and has run ``--steady-seconds`` more:

* **outage**: radosgw is stopped (SIGTERM of the pid in ``.ceph/cluster/run/client.rgw.a.pid``, as
  ``services.sh stop`` does) for ``--outage-seconds``, then started again with ``bash scripts/services.sh
  start``; *resume* = the first moment the gateway answers S3 requests again. Before stopping it the
  benchmark waits (up to 10 min) until no pytest process running an outage test is left, and it starts the
  gateway again in a ``finally`` whatever happens.
* **kill**: the driver's whole process group (Python driver, JVM, Python workers) gets SIGKILL; after
  ``--down-seconds`` a new driver is started on the same checkpoint (``getOrCreate``); *resume* = the moment
  it is launched (its JVM start-up and restore count in the catch-up).

Then the feeder stops, the benchmark waits until every fed line is in a committed output, stops the driver
and checks the committed outputs: every fed line in exactly one committed batch, nothing else, no batch
time without a committed output, the final counts equal to what was fed. Definitions (the batch interval
is ``I``; a batch's *lag* is its processing start minus its batch time):

* **steady state**: ``STEADY_RUN`` (5) consecutive batches completed after *resume* each with a
  scheduling delay under ``I`` (tests/fault/test_outage_process.py's first rule), and, the stricter rule the
  headline figures use, each also with a lag under ``2 I`` (its second rule: a batch whose generation
  waited for the store has a small scheduling delay but starts late). The time to steady state is the
  completion of the first batch of that run minus *resume*.
* **backlog at resume**: *resume* minus the batch time of the oldest batch not yet completed at *resume*
  (in batches: how many of the batches completed after *resume* had batch times up to it). For the kill
  this oldest batch is the one after the newest restored state checkpoint: batches the killed driver had
  completed after that checkpoint run again (their outputs are no-ops) and count in it (``batches_redone``).
* **drain rate** (x real time): stream seconds cleared per wall second while catching up,
  ``(backlog + catch-up) / catch-up`` with catch-up = the time to steady state (in that time the backlog
  and the catch-up's own new batches were cleared). *flowing*: the same from the first batch completed
  after *resume* (without the gateway's retry back-off of the batch caught by the outage, the restarted
  driver's JVM start-up, restore and first batch). *ceiling*: interval / median processing time of the
  catch-up batches, the most a drain that runs one batch after another can reach.
* processing times are the engine's own (``BatchInfo.processing_delay_ms``); *before* = the batches of
  the steady phase before the fault, *catch-up* = the batches completed between *resume* and steady state.

Prints a short table and writes ``benchmarks/results/catchup.json`` (machine, parameters, summary and
every batch's metrics with its phase).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
APP = Path(__file__).resolve().parent / "catchup_app.py"
SERVICES = ROOT / "scripts" / "services.sh"
RGW_PID_FILE = ROOT / ".ceph" / "cluster" / "run" / "client.rgw.a.pid"
ENDPOINT = "http://127.0.0.1:7480"
ACCESS_KEY, SECRET_KEY, REGION = "AKTEST", "SKTEST", "us-east-1"

FEED_EVERY_S = 0.5
LINES_PER_OBJECT = 3
WORDS = 7  # each fed line is "line-<n> w<n % WORDS>"
STEADY_RUN = 5  # consecutive batches within the bounds that make a steady state
CHECKPOINT_S = 2.0
#: Command-line fragments of the Ceph outage process test (its pytest file, or its driver): the gateway is not
#: stopped while a process whose command line holds one of them runs (other tests do not stop the gateway).
OUTAGE_TEST_MARKS = ("test_outage_process",)
OTHERS_WAIT_S = 600.0

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


def poll(cond: Callable[[], T], timeout: float, what: str, check: Callable[[], None] | None = None,
         step: float = 0.5) -> T:
    """Call ``cond`` every ``step`` s until it returns a true value (returned); ``check`` raises to give up."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ------------------------------------------------------------------------------------------- the gateway
class Gateway:
    """The project's radosgw: whether it runs and answers, stopping it (as services.sh) and starting it."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client, self.bucket = client, bucket
        self.stopped_by_us = False

    @staticmethod
    def pid() -> int | None:
        """The pid of services.sh's radosgw, or None when it does not run."""
        try:
            pid = int(RGW_PID_FILE.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"radosgw" in cmdline else None

    @staticmethod
    def http_up() -> bool:
        try:
            urllib.request.urlopen(ENDPOINT + "/", timeout=2).close()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def s3_up(self) -> bool:
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return True
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except (ProcessLookupError, OSError):
            return False
        return state != "Z"  # radosgw is not our child: a zombie counts as gone

    def stop(self) -> None:
        """SIGTERM, up to 10 s, then SIGKILL; the pid file removed; the port closed."""
        pid = self.pid()
        if pid is None:
            raise RuntimeError(f"radosgw is not running (no live pid in {RGW_PID_FILE})")
        self.stopped_by_us = True
        os.kill(pid, signal.SIGTERM)
        try:
            poll(lambda: not self._alive(pid), 10, "radosgw to exit", step=0.1)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            poll(lambda: not self._alive(pid), 5, "radosgw to exit after SIGKILL", step=0.1)
        RGW_PID_FILE.unlink(missing_ok=True)
        poll(lambda: not self.http_up(), 10, "the gateway's port to close", step=0.1)

    def start(self) -> None:
        """``bash scripts/services.sh start`` (starts only what is down), until the gateway answers S3."""
        proc = subprocess.run(["bash", str(SERVICES), "start"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        if self.pid() is None or not self.http_up():
            raise RuntimeError(f"services.sh start did not bring radosgw back (exit {proc.returncode}):\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        poll(self.s3_up, 60, "the gateway to answer S3 requests", step=0.2)
        self.stopped_by_us = False

    def ensure(self) -> None:
        if self.pid() is None or not self.http_up():
            print("  radosgw is down: bash scripts/services.sh start", flush=True)
            self.start()


def _command_lines() -> dict[int, str]:
    """Every other process's command line, by pid."""
    out = {}
    own = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd:
            out[int(entry.name)] = cmd
    return out


def outage_tests_running() -> list[str]:
    """Command lines of other processes running the project's Ceph outage process test (pytest or its driver)."""
    return [f"{pid}: {cmd[:200]}" for pid, cmd in _command_lines().items() if any(m in cmd for m in OUTAGE_TEST_MARKS)]


def other_pytest_runs() -> list[str]:
    """Other pytest processes (recorded when the gateway goes down: tests on the gateway may see the outage)."""
    return [f"{pid}: {cmd[:300]}" for pid, cmd in _command_lines().items()
            if "pytest" in cmd and "timeout" not in cmd.split(" ", 1)[0]]


def wait_for_other_outage_tests(timeout: float) -> float:
    """Wait until no outage test of someone else runs (they need the gateway up); the seconds waited."""
    start = time.monotonic()
    others = outage_tests_running()
    while others:
        waited = time.monotonic() - start
        if waited > timeout:
            raise TimeoutError(f"an outage test was still running after {timeout:.0f} s: {others}")
        print(f"  waiting for another outage test to finish before stopping radosgw ({waited:.0f} s): {others[0]}",
              flush=True)
        time.sleep(10)
        others = outage_tests_running()
    return time.monotonic() - start


def s3_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=ENDPOINT, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        region_name=REGION,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                      connect_timeout=2, read_timeout=10))


def delete_bucket(client: Any, bucket: str) -> None:
    """Every object of ``bucket``, then the bucket (best effort)."""
    try:
        while True:
            page = client.list_objects_v2(Bucket=bucket, MaxKeys=1000)
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if not keys:
                break
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        print(f"  (could not delete the bucket {bucket}: {e})", flush=True)


# -------------------------------------------------------------------------------------------- the feeder
class Feeder(threading.Thread):
    """Puts ``<prefix>/in/obj-NNNNNN.txt`` (LINES_PER_OBJECT unique lines) every FEED_EVERY_S until finished.

    A failed put (the gateway is down) is tried again with the same key and bytes until it succeeds or the
    feeder is finished; its lines count as fed only once it succeeded.
    """

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        super().__init__(name="catchup-feeder", daemon=True)
        self.client, self.bucket, self.prefix = client, bucket, prefix
        self.fed: list[str] = []
        self.objects = 0
        self.put_errors = 0
        self._done = threading.Event()

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=30)
        if self.is_alive():
            raise RuntimeError("the feeder did not stop")

    def run(self) -> None:
        n = 0
        while not self._done.is_set():
            lines = [f"line-{n + i} w{(n + i) % WORDS}" for i in range(LINES_PER_OBJECT)]
            key = f"{self.prefix}/in/obj-{self.objects:06d}.txt"
            body = ("\n".join(lines) + "\n").encode()
            while not self._done.is_set():
                try:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=body)
                except Exception:  # noqa: BLE001 - retried with the same key and bytes
                    self.put_errors += 1
                    self._done.wait(FEED_EVERY_S)
                    continue
                self.fed.extend(lines)
                self.objects += 1
                n += LINES_PER_OBJECT
                break
            self._done.wait(FEED_EVERY_S)


# -------------------------------------------------------------------------------------------- the driver
class Driver:
    """One driver process (its own session: the JVM and the Python workers are in its process group)."""

    def __init__(self, base: str, metrics: Path, log: Path, args: argparse.Namespace, work: Path) -> None:
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   AWS_ENDPOINT_URL_S3=ENDPOINT, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   AWS_DEFAULT_REGION=REGION, DSTREAMS_STORE_RETRY_SECONDS="5", DSTREAMS_STORE_OUTAGE_SECONDS="900",
                   PYTHONUNBUFFERED="1")
        for k in ("DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
            env.pop(k, None)
        self.log = log
        self.launched_ms = now_ms()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(APP), base, str(metrics), "--batch-seconds", f"{args.batch_seconds:g}",
                 "--checkpoint-seconds", f"{CHECKPOINT_S:g}"],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
        self.pid = self.proc.pid

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the driver exited ({self.proc.returncode})\n{self.tail()}")

    def wait_started(self, timeout: float) -> None:
        poll(lambda: "STARTED" in self.tail(10**7), timeout, "the driver to start", self.check_alive)

    def _group_gone(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def kill_hard(self) -> None:
        """SIGKILL to the whole process group (the Python driver, its JVM, the Python workers)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        poll(self._group_gone, 30, "the killed driver's processes to exit", step=0.1)

    def stop(self) -> None:
        """SIGTERM (the driver stops its context), then SIGKILL to whatever of its group is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


# ------------------------------------------------------------------------------------------ the metrics
def read_batches(path: Path) -> list[dict[str, Any]]:
    """Completed batches, in completion order (a line cut by a kill is skipped)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return sorted(rows, key=lambda r: (r["end_ms"] or 0, r["batch_ms"]))


def on_time(row: dict[str, Any], interval_ms: int) -> bool:
    """Rule 1: scheduling delay under one batch interval."""
    return row["scheduling_delay_ms"] is not None and row["scheduling_delay_ms"] < interval_ms


def on_the_clock(row: dict[str, Any], interval_ms: int) -> bool:
    """Rule 2: rule 1, and processing started less than two intervals after the batch time."""
    return (on_time(row, interval_ms) and row["start_ms"] is not None
            and row["start_ms"] - row["batch_ms"] < 2 * interval_ms)


def steady_from(rows: list[dict[str, Any]], after_ms: int, ok: Callable[[dict[str, Any]], bool]
                ) -> dict[str, Any] | None:
    """The first batch completed after ``after_ms`` that starts a run of STEADY_RUN batches all ``ok``."""
    later = [r for r in rows if (r["end_ms"] or 0) > after_ms and not r["failed"]]
    for i in range(len(later) - STEADY_RUN + 1):
        if all(ok(r) for r in later[i:i + STEADY_RUN]):
            return later[i]
    return None


# ------------------------------------------------------------------------------- the committed outputs
class Committed:
    """Committed (``_SUCCESS``) output folders under ``<prefix>/out/``, each read once (they are immutable)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client, self.bucket, self.root = client, bucket, f"{prefix}/out/"
        self.read: dict[tuple[str, int], list[str]] = {}

    def refresh(self) -> dict[tuple[str, int], list[str]]:
        folders: dict[str, list[str]] = {}
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.root, "MaxKeys": 1000}
        while True:
            page = self.client.list_objects_v2(**kw)
            for o in page.get("Contents", []):
                folder, _, leaf = o["Key"][len(self.root):].partition("/")
                folders.setdefault(folder, []).append(leaf)
            if not page.get("IsTruncated"):
                break
            kw["ContinuationToken"] = page["NextContinuationToken"]
        for folder, leaves in folders.items():
            name, _, ms = folder.rpartition("-")
            if "_SUCCESS" not in leaves or (name, int(ms)) in self.read:
                continue
            lines: list[str] = []
            for leaf in sorted(x for x in leaves if x.startswith("part-")):
                body = self.client.get_object(Bucket=self.bucket, Key=f"{self.root}{folder}/{leaf}")["Body"].read()
                lines += [x for x in body.decode().splitlines() if x]
            self.read[(name, int(ms))] = lines
        return self.read

    def times(self, name: str) -> list[int]:
        return sorted(t for n, t in self.read if n == name)

    def lines(self) -> Counter[str]:
        return Counter(x for (n, _), ls in self.read.items() if n == "lines" for x in ls)


def check_outputs(committed: Committed, fed: list[str], interval_ms: int, last_lines: int) -> dict[str, Any]:
    """Exactly once: every fed line in one committed batch, nothing else, no batch missing, final counts."""
    lines = committed.lines()
    duplicated = sorted(x for x, c in lines.items() if c > 1)
    missing = sorted(set(fed) - set(lines))
    unexpected = sorted(set(lines) - set(fed))
    gaps: dict[str, list[int]] = {}
    for name in ("lines", "counts"):
        times = [t for t in committed.times(name) if t <= last_lines]
        gaps[name] = sorted(set(range(times[0], last_lines + 1, interval_ms)) - set(times)) if times else []
    final = committed.read[("counts", max(committed.times("counts")))]
    counts = dict(ast.literal_eval(x) for x in final)
    expected = dict(Counter(w for line in fed for w in line.split()))
    ok = not (duplicated or missing or unexpected or gaps["lines"] or gaps["counts"]) and counts == expected
    return {"ok": ok, "lines_fed": len(fed), "lines_committed": sum(lines.values()),
            "duplicated": duplicated[:20], "missing": missing[:20], "unexpected": unexpected[:20],
            "batches_without_output": {k: v[:20] for k, v in gaps.items()},
            "final_counts_equal_fed": counts == expected, "committed_batches": len(committed.times("lines"))}


# -------------------------------------------------------------------------------------------- analysis
def summarise(rows: list[dict[str, Any]], interval_ms: int, steady_ms: int, fault_ms: int, resume_ms: int,
              catchup_rows: list[dict[str, Any]], killed_last_ms: int | None) -> dict[str, Any]:
    """The figures of one scenario from its batches (see the module's definitions); labels each row's phase.

    ``catchup_rows`` are the batches that ran after the fault (the restarted driver's for the kill) and
    ``killed_last_ms`` the newest batch the killed driver completed.
    """
    later = [r for r in catchup_rows if (r["end_ms"] or 0) > resume_ms]
    by_sched = steady_from(later, resume_ms, lambda r: on_time(r, interval_ms))
    by_clock = steady_from(later, resume_ms, lambda r: on_the_clock(r, interval_ms))
    if by_sched is None or by_clock is None:
        raise RuntimeError("no steady state after the fault in the batches given")
    steady_end = by_clock["end_ms"]
    for r in rows:
        end = r["end_ms"] or 0
        r["phase"] = ("warm-up" if end < steady_ms else "before" if end <= fault_ms else
                      "fault" if end <= resume_ms else "catch-up" if end <= steady_end else "after")
    catching = [r for r in later if (r["end_ms"] or 0) <= steady_end]
    oldest = min(r["batch_ms"] for r in later)
    backlog_s = (resume_ms - oldest) / 1000
    catchup_s = (steady_end - resume_ms) / 1000
    # Once batches flow: from the first batch completed after resume, whatever was behind at that moment.
    first_end = min(r["end_ms"] for r in later)
    behind_then = min((r["batch_ms"] for r in later if r["end_ms"] > first_end), default=first_end)
    flowing_s = (steady_end - first_end) / 1000
    backlog_flowing_s = (first_end - behind_then) / 1000
    before = [r["processing_ms"] for r in rows if r["phase"] == "before" and not r["failed"]]
    during = [r["processing_ms"] for r in catching if not r["failed"]]
    med_before, med_during = _median(before), _median(during)
    starts = [r["start_ms"] for r in later if r["start_ms"] is not None and r["start_ms"] >= resume_ms]
    return {
        "resume_ms": resume_ms,
        "backlog_at_resume_s": round(backlog_s, 1),
        "backlog_at_resume_batches": sum(1 for r in later if r["batch_ms"] <= resume_ms),
        "oldest_batch_after_fault_ms": oldest,
        "batches_redone": (sum(1 for r in later if r["batch_ms"] <= killed_last_ms)
                           if killed_last_ms is not None else None),
        "first_batch_start_after_resume_s": round((min(starts) - resume_ms) / 1000, 1) if starts else None,
        "first_batch_done_after_resume_s": round((first_end - resume_ms) / 1000, 1),
        "to_steady_s_scheduling_delay": round((by_sched["end_ms"] - resume_ms) / 1000, 1),
        "to_steady_s": round(catchup_s, 1),
        "to_steady_intervals": round(catchup_s * 1000 / interval_ms, 1),
        "catchup_batches": len(catching),
        "drain_x": round((backlog_s + catchup_s) / catchup_s, 2) if catchup_s > 0 else None,
        "drain_x_counted": round(len(catching) * interval_ms / 1000 / catchup_s, 2) if catchup_s > 0 else None,
        "backlog_when_flowing_s": round(backlog_flowing_s, 1),
        "drain_x_flowing": round((backlog_flowing_s + flowing_s) / flowing_s, 2) if flowing_s > 0 else None,
        "drain_x_ceiling": round(interval_ms / med_during, 2) if med_during else None,
        "median_processing_before_ms": med_before,
        "median_processing_catchup_ms": med_during,
        "processing_ratio_catchup_to_before": (round(med_during / med_before, 2)
                                               if med_before and med_during is not None else None),
        "before_batches": len(before),
        "max_scheduling_delay_ms_catchup": max((r["scheduling_delay_ms"] or 0 for r in catching), default=None),
        "max_lag_ms_catchup": max(((r["start_ms"] or 0) - r["batch_ms"] for r in catching), default=None),
        "failed_batches": sum(1 for r in rows if r["failed"]),
    }


# ------------------------------------------------------------------------------------------- scenarios
def run_scenario(kind: str, args: argparse.Namespace, client: Any, bucket: str, gateway: Gateway,
                 work: Path) -> dict[str, Any]:
    """One scenario (``outage`` or ``kill``) on a fresh prefix: steady, fault, catch-up, drain, checks."""
    interval_ms = round(args.batch_seconds * 1000)
    prefix = f"{kind}-{uuid.uuid4().hex[:6]}"
    base = f"s3://{bucket}/{prefix}"
    wdir = work / kind
    wdir.mkdir(parents=True, exist_ok=True)
    metrics = wdir / "metrics.jsonl"
    feeder = Feeder(client, bucket, prefix)
    committed = Committed(client, bucket, prefix)
    drivers: list[Driver] = []
    result: dict[str, Any] = {"prefix": base}
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{kind} {time.monotonic() - t0:6.1f} s] {msg}", flush=True)

    try:
        gateway.ensure()
        if kind == "outage":  # wait now rather than with a driver running (checked again before the stop)
            wait_for_other_outage_tests(OTHERS_WAIT_S)
        drivers.append(Driver(base, metrics, wdir / "driver-1.log", args, wdir))
        drivers[-1].wait_started(args.timeout)
        say(f"driver started (pid {drivers[-1].pid}); feeding an object every {FEED_EVERY_S} s")
        feeder.start()

        def steady_before() -> bool:
            rows = read_batches(metrics)
            if len(rows) < 10 or feeder.objects < 10:
                return False
            if not all(on_the_clock(r, interval_ms) and not r["failed"] for r in rows[-STEADY_RUN:]):
                return False
            committed.refresh()
            return any(ls for (n, _), ls in committed.read.items() if n == "lines")

        poll(steady_before, args.timeout, "batches to flow steadily", drivers[-1].check_alive, step=1.0)
        steady_ms = now_ms()
        say(f"steady; running {args.steady_seconds:g} s more before the fault")
        time.sleep(args.steady_seconds)
        drivers[-1].check_alive()

        killed_last_ms: int | None = None
        load_at_fault = [round(x, 2) for x in os.getloadavg()]
        if kind == "outage":
            waited = wait_for_other_outage_tests(OTHERS_WAIT_S)
            result["waited_for_other_tests_s"] = round(waited, 1)
            result["other_pytest_runs_at_outage"] = other_pytest_runs()
            for other in result["other_pytest_runs_at_outage"]:
                print(f"  note: another pytest runs while radosgw goes down: {other[:160]}", flush=True)
            fault_ms = now_ms()
            gateway.stop()
            say(f"radosgw stopped; down for {args.outage_seconds:g} s")
            restarted_by_others = False
            while now_ms() - fault_ms < args.outage_seconds * 1000:
                drivers[-1].check_alive()
                restarted_by_others = restarted_by_others or gateway.http_up()
                time.sleep(0.5)
            t_start = time.monotonic()
            gateway.start()
            resume_ms = now_ms()
            result["gateway_down_s"] = round((resume_ms - fault_ms) / 1000, 1)
            result["gateway_restart_s"] = round(time.monotonic() - t_start, 1)
            result["gateway_answered_during_outage"] = restarted_by_others
            say(f"radosgw back after {result['gateway_down_s']} s (services.sh start took "
                f"{result['gateway_restart_s']} s)")
            drivers[-1].check_alive()
            catchup_pid = drivers[-1].pid
        else:
            fault_ms = now_ms()
            drivers[-1].kill_hard()
            done = [r for r in read_batches(metrics) if not r["failed"]]
            killed_last_ms = max(r["batch_ms"] for r in done)
            say(f"driver killed (SIGKILL to its process group); down for {args.down_seconds:g} s")
            time.sleep(max(0.0, args.down_seconds - (now_ms() - fault_ms) / 1000))
            drivers.append(Driver(base, metrics, wdir / "driver-2.log", args, wdir))
            resume_ms = drivers[-1].launched_ms
            result["driver_down_s"] = round((resume_ms - fault_ms) / 1000, 1)
            drivers[-1].wait_started(args.timeout)
            say(f"restarted driver (pid {drivers[-1].pid}) started after {(now_ms() - resume_ms) / 1000:.1f} s")
            catchup_pid = drivers[-1].pid

        def steady_after() -> list[dict[str, Any]] | None:
            rows = [r for r in read_batches(metrics) if r["pid"] == catchup_pid]
            ok_sched = steady_from(rows, resume_ms, lambda r: on_time(r, interval_ms))
            ok_clock = steady_from(rows, resume_ms, lambda r: on_the_clock(r, interval_ms))
            return rows if ok_sched and ok_clock else None

        poll(steady_after, args.timeout * 3, "steady state after the fault", drivers[-1].check_alive, step=1.0)
        say("steady again; a few more batches, then the feeder stops and the input drains")
        time.sleep(5)
        feeder.finish()
        fed = list(feeder.fed)

        def drained() -> bool:
            committed.refresh()
            seen = committed.lines()
            return all(seen[x] for x in fed)

        poll(drained, args.timeout, "every fed line in a committed output", drivers[-1].check_alive, step=2.0)
        last_lines = max(t for t in committed.times("lines") if committed.read[("lines", t)])
        poll(lambda: committed.refresh() and max(committed.times("counts"), default=0) >= last_lines, args.timeout,
             "the counts of the last batch with input", drivers[-1].check_alive, step=1.0)
        drivers[-1].check_alive()
        drivers[-1].stop()
        committed.refresh()
        result["exactly_once"] = check_outputs(committed, fed, interval_ms, last_lines)

        rows = read_batches(metrics)
        catchup_rows = [r for r in rows if r["pid"] == catchup_pid]
        result.update(summarise(rows, interval_ms, steady_ms, fault_ms, resume_ms, catchup_rows, killed_last_ms))
        result.update(load_average_at_fault=load_at_fault, load_average_at_end=[round(x, 2) for x in os.getloadavg()],
                      fault_ms=fault_ms, steady_ms=steady_ms, objects_fed=feeder.objects,
                      put_errors=feeder.put_errors, driver_logs_warnings=sum(
                          d.tail(10**8).count("store unavailable for") for d in drivers),
                      batches=rows)
        say(f"to steady state {result['to_steady_s']} s after resume, backlog {result['backlog_at_resume_s']} s, "
            f"drain {result['drain_x']}x; exactly once: {result['exactly_once']['ok']}")
        return result
    finally:
        if feeder.is_alive():
            feeder.finish()
        for d in drivers:
            d.stop()
        if kind == "outage" and (gateway.stopped_by_us or gateway.pid() is None):
            gateway.ensure()


# ---------------------------------------------------------------------------------------------- output
def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        mem_gb: float | None = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gb = None
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_gb": mem_gb, "python": platform.python_version(),
            "pyspark": metadata.version("pyspark"), "os": platform.platform(terse=True),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def print_table(doc: dict[str, Any]) -> None:
    interval = doc["params"]["batch_seconds"]
    print()
    print(f"batch interval {interval:g} s; steady = {STEADY_RUN} consecutive batches with scheduling delay < 1 "
          f"interval (rule 1) and processing starting < 2 intervals after their batch time (rule 2)")
    print(f"{'scenario':<8} {'fault':>6} {'backlog at resume':>18} {'to steady r1/r2':>16} {'intervals':>9} "
          f"{'drain':>6} {'flowing':>7} {'ceiling':>7} {'proc ms before/catch-up':>24} {'exactly once':>12}")
    for kind, s in doc["scenarios"].items():
        if "error" in s:
            print(f"{kind:<8} {s['error'][:300]}")
            continue
        fault = s.get("gateway_down_s") or s.get("driver_down_s")
        backlog = f"{s['backlog_at_resume_s']:.1f} s ({s['backlog_at_resume_batches']} b)"
        steady = f"{s['to_steady_s_scheduling_delay']:.1f} / {s['to_steady_s']:.1f} s"
        proc = f"{_f(s['median_processing_before_ms'], '.0f')} / {_f(s['median_processing_catchup_ms'], '.0f')}"
        print(f"{kind:<8} {fault:>5.1f}s {backlog:>18} {steady:>16} {s['to_steady_intervals']:>9.1f} "
              f"{_f(s['drain_x'], '.2f'):>5}x {_f(s['drain_x_flowing'], '.2f'):>6}x "
              f"{_f(s['drain_x_ceiling'], '.2f'):>6}x {proc:>24} {'yes' if s['exactly_once']['ok'] else 'NO':>12}")
    print("drain = (backlog at resume + time to steady) / time to steady (rule 2); flowing = the same from the "
          "first batch completed after resume; ceiling = interval / median catch-up processing time")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.catchup", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20 s outage and down time, 10 s steady phase")
    p.add_argument("--outage-seconds", type=float, help="how long radosgw stays down (default 30, quick 20)")
    p.add_argument("--down-seconds", type=float, help="how long the killed driver stays down (default 30, quick 20)")
    p.add_argument("--batch-seconds", type=float, default=1.0, help="batch interval of the driver")
    p.add_argument("--steady-seconds", type=float, help="steady phase before the fault (default 30, quick 10)")
    p.add_argument("--scenarios", nargs="+", choices=["outage", "kill"], default=["outage", "kill"])
    p.add_argument("--timeout", type=float, default=300.0, help="bound of each wait, seconds")
    p.add_argument("--keep", action="store_true", help="keep the S3 bucket and the driver logs")
    p.add_argument("--output", type=Path, default=RESULTS / "catchup.json")
    args = p.parse_args(argv)
    args.outage_seconds = args.outage_seconds or (20.0 if args.quick else 30.0)
    args.down_seconds = args.down_seconds or (20.0 if args.quick else 30.0)
    args.steady_seconds = args.steady_seconds if args.steady_seconds is not None else (10.0 if args.quick else 30.0)

    def on_term(signum: int, frame: Any) -> None:  # noqa: ARG001 - so that every finally runs
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    client = s3_client()
    bucket = f"catchup-{uuid.uuid4().hex[:8]}"
    gateway = Gateway(client, bucket)
    gateway.ensure()
    client.create_bucket(Bucket=bucket)
    started = time.monotonic()
    doc: dict[str, Any] = {
        "benchmark": "catchup",
        "command": " ".join(["python -m benchmarks.catchup", *(sys.argv[1:] if argv is None else argv)]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "params": {"batch_seconds": args.batch_seconds, "outage_seconds": args.outage_seconds,
                   "down_seconds": args.down_seconds, "steady_seconds": args.steady_seconds, "quick": args.quick,
                   "checkpoint_seconds": CHECKPOINT_S, "feed_every_s": FEED_EVERY_S,
                   "lines_per_object": LINES_PER_OBJECT, "steady_run": STEADY_RUN, "master": "local[2]",
                   "store": f"Ceph RADOS Gateway at {ENDPOINT}", "driver_env": {
                       "DSTREAMS_STORE_RETRY_SECONDS": "5", "DSTREAMS_STORE_OUTAGE_SECONDS": "900"}},
        "scenarios": {},
    }
    work = Path(tempfile.mkdtemp(prefix="dstreams-catchup-"))
    failed = False
    try:
        for kind in args.scenarios:
            try:
                doc["scenarios"][kind] = run_scenario(kind, args, client, bucket, gateway, work)
                failed = failed or not doc["scenarios"][kind]["exactly_once"]["ok"]
            except (RuntimeError, TimeoutError, OSError) as e:
                print(f"{kind}: FAILED: {e}", flush=True)
                doc["scenarios"][kind] = {"error": str(e)[:4000]}
                failed = True
    finally:
        gateway.ensure()
        if not args.keep:
            delete_bucket(client, bucket)
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept s3://{bucket} and {work}")
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    print_table(doc)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, args.output)
    print(f"wrote {args.output}; elapsed {doc['elapsed_s']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
