"""Grep and the windowed WordCount read from Redis Streams, next to the generator source, in one run.

Run from the repository root, with the project's Redis server up (``bash scripts/services.sh start redis``)::

    python -m benchmarks.redis_source --quick     # = python -m benchmarks redis --quick (~8 min)
    python -m benchmarks.redis_source             # longer trials, more rates (~12-20 min)
    python -m benchmarks.redis_source --probe-only   # the per-entry costs alone (~30 s), nothing kept

Contract:

* **Per-entry costs** (one Python process, no Spark; :func:`probe`): ``--probe-entries`` 100-byte lines
  written to a scratch stream key, then per entry, median of ``--repeat`` passes: making the lines
  (:func:`dstreams.nodes.generator.text_records`, what the generator source does); dstreams' executor
  read (:func:`dstreams.redis.source.read_range`: ``XRANGE`` chunks of ``READ_CHUNK`` through
  redis-py, then :func:`line_of`); redis-py's RESP parser alone (bytes, no response callback); the
  replies' bytes off a raw socket, unparsed (the server and the transport); the server's own time of
  those ``XRANGE`` calls and of the driver's range-fixing script (``INFO commandstats`` differences).
* **Per workload** (Grep; WordCount, 30 s window with an inverse function; :mod:`benchmarks.workloads`),
  at the latency target ``T`` (batch interval ``T / 2``, as in ``python -m benchmarks run``):

  1. the generator source's rate search (:func:`benchmarks.run.search`, engine ``dstreams``) in its own
     subprocess with its own SparkContext (``tuned_conf``, ``local[2]``);
  2. the input written beforehand into :data:`KEYS` stream keys (one per core of ``local[2]``: the
     source reads each key in one task): the generator's own lines (``text_records``), field
     :data:`FIELD`, redis-py pipelines of :data:`PIPELINE` ``XADD``\\ s; as many entries per key as the
     longest trial of the Redis search reads: ``max_rate / KEYS * interval * (warm-up + measured +
     margin batches)``, where ``max_rate`` = 2x the search's first rate (:func:`redis_start`), lowered
     when the entries would take more than ``--memory-budget-mb`` of Redis memory;
  3. the Redis source's search in its own subprocess: the same search, trial plan and judgement, the
     same workload over ``ssc.redisStream(keys, url, maxRatePerPartition=rate / KEYS).map(line_of)``,
     each trial from the earliest entry, no trial above ``max_rate``. A trial whose batches run out of
     written entries ends there, is not sustainable and says so (``input_ran_out``);
  4. the keys deleted (``UNLINK``), whatever happened.

* When the run grew Redis's append-only file by more than 64 MiB, ``BGREWRITEAOF`` compacts it at the end
  (the deleted entries' writes would otherwise stay on disk until Redis's next rewrite).
* Output: tables on stdout and ``benchmarks/results/redis_source.json`` (the per-entry costs, each
  search with every trial and its per-batch samples, the data written, Redis's memory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark import SparkContext

from dstreams.nodes.generator import text_records
from dstreams.records import consume
from dstreams.redis.source import _LIMIT_SCRIPT, READ_CHUNK, read_range

from .engines import Plan, Sample, _wait
from .memory import PeakMemory
from .report import _bounds, _fmt_rate
from .run import FULL, QUICK, Mode, _round_rate, search, trial_plan
from .workloads import SEED, WORKLOADS, Workload

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "redis_source.json"
MARKER = "REDIS_SOURCE_RESULT "
DEFAULT_URL = os.environ.get("DSTREAMS_TEST_REDIS_URL", "redis://127.0.0.1:6390/0")
#: Stream keys per workload: one per core of ``local[2]`` (the source reads each key in one task).
KEYS = 2
#: The field holding a line in every entry.
FIELD = "v"
#: ``XADD``\ s per redis-py pipeline (one round trip).
PIPELINE = 10_000
#: Cores of ``local[2]``: the executors' tasks, the Redis server, the JVM and the driver share them.
CORES = 2
#: The probe's step that times what an executor task of the source does per entry.
READ_STEP = "read (read_range + map(line_of))"
#: Key names: ``<prefix>:<pid>:<what>`` (deleted at the end of their use).
PREFIX = "dstreams-bench"
WORKLOAD_NAMES = ("grep", "wordcount")
#: An append-only file grown by more than this during the run is compacted at the end.
AOF_GROWTH_REWRITE = 64 * 2**20
#: Both searches divide the rate by this while nothing was sustainable (``python -m benchmarks run``: 4):
#: their first rates are close to the answer (the generator's from earlier runs, the Redis source's
#: estimated from this run's measurements), so a finer step spends the few trials better.
STEP_DOWN = 2.0


@dataclass(frozen=True)
class Settings:
    """What ``--quick`` changes: the trial plan (:class:`benchmarks.run.Mode`) and the run's sizes."""

    name: str
    mode: Mode
    #: Trials per search (the generator's and the Redis source's), per workload.
    max_trials: dict[str, int]
    #: Batches of written input beyond a trial's warm-up and measured batches (the start-up backlog's settling).
    margin_batches: int
    probe_entries: int
    repeat: int


QUICK_SETTINGS = Settings("quick", QUICK, {"grep": 4, "wordcount": 3}, margin_batches=6,
                          probe_entries=100_000, repeat=5)
FULL_SETTINGS = Settings("full", FULL, {"grep": 6, "wordcount": 4}, margin_batches=10,
                         probe_entries=200_000, repeat=7)


def mode_for(settings: Settings, workload: str) -> Mode:
    """The search mode of ``workload``: the benchmark's mode with this run's trial budget."""
    return replace(settings.mode, max_trials=settings.max_trials[workload])


def line_of(record: tuple[str, str, dict[str, str]]) -> str:
    """The line of a Redis Streams record ``(key, entry id, fields)``: its :data:`FIELD` field."""
    return record[2][FIELD]


# ----------------------------------------------------------------------------------------- Redis helpers
def connect(url: str, decode: bool = True) -> Any:
    """A redis-py client for the benchmark's own commands (writes, INFO, UNLINK)."""
    import redis

    return redis.Redis.from_url(url, decode_responses=decode, socket_timeout=120, socket_connect_timeout=5)


def write_lines(r: Any, key: str, n: int, partition: int) -> None:
    """Append ``n`` of the generator's lines to ``key``, :data:`PIPELINE` ``XADD``\\ s per round trip.

    The lines are ``text_records(SEED, chunk * 1000, partition, ...)`` for consecutive chunks: the very
    lines the generator source makes, with its per-batch pools of distinct lines.
    """
    done = chunk = 0
    while done < n:
        size = min(PIPELINE, n - done)
        pipe = r.pipeline(transaction=False)
        for line in text_records(SEED, chunk * 1000, partition, size):
            pipe.execute_command("XADD", key, "*", FIELD, line)
        pipe.execute()
        done += size
        chunk += 1


def used_memory(r: Any) -> int:
    """Redis's ``used_memory`` in bytes."""
    return int(r.info("memory")["used_memory"])


def _aof(r: Any) -> dict[str, Any]:
    return r.info("persistence")


def wait_aof_rewrite(r: Any, timeout_s: float = 180.0) -> float:
    """Wait (bounded) while Redis rewrites its append-only file in a forked child; returns the seconds waited.

    A rewrite started by the writes (``auto-aof-rewrite-percentage``) would take CPU from a trial.
    """
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        info = _aof(r)
        if not int(info.get("aof_rewrite_in_progress", 0)) and not int(info.get("aof_rewrite_scheduled", 0)):
            break
        time.sleep(0.5)
    return round(time.monotonic() - t0, 1)


def run_id(r: Any) -> str | None:
    """The server's ``run_id`` (a new one after every restart), or None when it does not answer."""
    try:
        return str(r.info("server")["run_id"])
    except Exception:
        return None


def unlink_keys(r: Any, keys: list[str], timeout_s: float = 120.0) -> bool:
    """``UNLINK`` the keys, retrying (bounded) while the server does not answer; whether it worked."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r.unlink(*keys)
            return True
        except Exception as e:
            if time.monotonic() > deadline:
                print(f"WARNING: could not delete {keys} ({type(e).__name__}: {e}): delete them with "
                      f"redis-cli UNLINK", file=sys.stderr)
                return False
            time.sleep(2.0)


def _server_stats(r: Any, command: str) -> tuple[int, int]:
    """``(calls, usec)`` of ``command`` in ``INFO commandstats`` (zeros before its first call)."""
    stats = r.info("commandstats").get(f"cmdstat_{command}") or {}
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def _bulk_size(b: bytes) -> int:
    return len(b"$%d\r\n" % len(b)) + len(b) + 2


def _reply_size(entries: list[Any]) -> int:
    """Bytes of the RESP2 reply of an ``XRANGE`` that returned ``entries`` (``[id, [field, value, ...]]``)."""
    total = len(b"*%d\r\n" % len(entries))
    for entry_id, fields in entries:
        total += len(b"*2\r\n") + _bulk_size(entry_id) + len(b"*%d\r\n" % len(fields))
        total += sum(_bulk_size(f) for f in fields)
    return total


def _resp(*args: str | bytes | int) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class RawConnection:
    """A plain socket to the server of a ``redis://`` URL: sends commands, receives a known number of bytes."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=60)
        if u.password:
            user = [unquote(u.username)] if u.username else []
            self.call(_resp("AUTH", *user, unquote(u.password)))
        db = (u.path or "/0").strip("/") or "0"
        if db != "0":
            self.call(_resp("SELECT", db))

    def call(self, command: bytes) -> bytes:
        """Send a command with a short reply and return that reply's first line."""
        self.sock.sendall(command)
        reply = self.sock.recv(4096)
        if not reply.startswith(b"+"):
            raise RuntimeError(f"Redis answered {reply[:200]!r}")
        return reply

    def receive(self, command: bytes, size: int) -> None:
        """Send ``command`` and receive its ``size``-byte reply without looking at it."""
        self.sock.sendall(command)
        buf = memoryview(bytearray(size))
        got = 0
        while got < size:
            n = self.sock.recv_into(buf[got:], size - got)
            if n == 0:
                raise ConnectionError("Redis closed the connection")
            got += n

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------------------------- per-entry costs
def _timed(fn: Callable[[], None], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def probe(url: str, entries: int, repeat: int) -> dict[str, Any]:
    """Per-entry costs of making, reading and parsing the benchmark's lines (see the module contract)."""
    import redis

    r = connect(url)
    key = f"{PREFIX}:{os.getpid()}:probe"
    r.unlink(key)
    before = used_memory(r)
    t0 = time.perf_counter()
    write_lines(r, key, entries, 0)
    write_s = time.perf_counter() - t0
    bytes_per_entry = (used_memory(r) - before) / entries
    try:
        # The chunks dstreams' executors read: (exclusive start id, reply size), from one parsed pass.
        raw_client = connect(url, decode=False)
        raw_client.response_callbacks.pop("XRANGE", None)  # this instance's: the RESP parser's output as is
        chunks: list[tuple[bytes, int]] = []
        last = b"0-0"
        while True:
            got = raw_client.execute_command("XRANGE", key, b"(" + last, b"+", "COUNT", READ_CHUNK)
            chunks.append((last, _reply_size(got)))
            if got:
                last = got[-1][0]
            if len(got) < READ_CHUNK:
                break

        def parse_only() -> None:
            for begin, _ in chunks:
                raw_client.execute_command("XRANGE", key, b"(" + begin, b"+", "COUNT", READ_CHUNK)

        raw = RawConnection(url)

        def raw_bytes() -> None:
            for begin, size in chunks:
                raw.receive(_resp("XRANGE", key, b"(" + begin, "+", "COUNT", READ_CHUNK), size)

        def executor_read() -> None:
            consume(map(line_of, read_range(url, key, "0-0", last.decode(), entries, None)))

        steps: dict[str, list[float]] = {
            "generate (text_records)": _timed(lambda: consume(text_records(SEED, 0, 0, entries)), repeat),
        }
        calls0, usec0 = _server_stats(r, "xrange")
        steps[READ_STEP] = _timed(executor_read, repeat)
        calls1, usec1 = _server_stats(r, "xrange")
        steps["redis-py parser alone (bytes, no callback)"] = _timed(parse_only, repeat)
        steps["raw socket, reply unparsed"] = _timed(raw_bytes, repeat)
        raw.close()
        e_calls0, e_usec0 = _server_stats(r, "eval")
        steps["range-fixing script (EVAL, wall)"] = _timed(
            lambda: r.eval(_LIMIT_SCRIPT, 1, key, "0-0", entries, READ_CHUNK), repeat)
        e_calls1, e_usec1 = _server_stats(r, "eval")
    finally:
        r.unlink(key)
    out: dict[str, Any] = {}
    for name, times in steps.items():
        med = statistics.median(times)
        out[name] = {"us_per_entry_median": med / entries * 1e6, "us_per_entry_min": min(times) / entries * 1e6,
                     "entries_per_s_median": entries / med}
    # Server time per entry (INFO commandstats counts the calls of every client: another client's
    # concurrent XRANGE or EVAL would show here too; the calls are recorded to check).
    out["server: XRANGE"] = {"us_per_entry_median": (usec1 - usec0) / (repeat * entries),
                             "calls": calls1 - calls0, "expected_calls": repeat * len(chunks)}
    out["server: range-fixing script"] = {"us_per_entry_median": (e_usec1 - e_usec0) / (repeat * entries),
                                          "calls": e_calls1 - e_calls0, "expected_calls": repeat}
    read_us = out[READ_STEP]["us_per_entry_median"]
    return {"entries": entries, "repeat": repeat, "hiredis": bool(redis.utils.HIREDIS_AVAILABLE),
            "redis_py": redis.__version__, "write_entries_per_s": entries / write_s,
            "bytes_per_entry": bytes_per_entry, "steps": out,
            # What KEYS executor processes could read with nothing else to do: the Redis source's ceiling.
            "read_ceiling_entries_per_s": KEYS * 1e6 / read_us}


def print_probe(res: dict[str, Any]) -> None:
    print(f"\nPer-entry costs, one Python process, {res['entries']:,} entries of 100-byte lines, median of "
          f"{res['repeat']} (redis-py {res['redis_py']}, hiredis {'yes' if res['hiredis'] else 'no'}):")
    print(f"  {'step':46s} {'us/entry':>9s} {'entries/s':>12s}")
    for name, s in res["steps"].items():
        rate = s.get("entries_per_s_median")
        print(f"  {name:46s} {s['us_per_entry_median']:9.3f} {_fmt_rate(rate):>12s}")
    print(f"  writes (redis-py pipelines of {PIPELINE:,} XADDs): {res['write_entries_per_s']:,.0f} entries/s; "
          f"{res['bytes_per_entry']:.0f} bytes of Redis memory per entry")
    print(f"  read ceiling on {KEYS} cores (one process per key, nothing else running): "
          f"{res['read_ceiling_entries_per_s']:,.0f} entries/s; the source's CPU per entry (read + server): "
          f"{source_us(res):.2f} us", flush=True)


# ---------------------------------------------------------------------------------------------- trials
class RedisTrials:
    """The Redis source's trial (``run`` of :func:`benchmarks.run.search`), over keys written beforehand.

    One trial: ``ssc.redisStream(keys, url, startFrom="earliest", maxRatePerPartition=rate / len(keys))
    .map(line_of)`` and the workload's ``build``; samples from ``ssc.batchInfos()`` as the generator's
    trial takes them, each with its record count and the driver's time building it (``generation_ms``:
    fixing the batch's ranges, :mod:`dstreams.redis.source`). Every batch holds ``len(keys) *
    limit`` entries while the written ones last; the first batch holding fewer ends the trial's samples
    and the trial, and its rate goes to :attr:`ran_out`.
    """

    def __init__(self, url: str, keys: list[str]) -> None:
        self.url = url
        self.keys = keys
        self.ran_out: set[int] = set()

    def __call__(self, sc: SparkContext, wl: Workload, rate: int, interval_s: float, plan: Plan) -> list[Sample]:
        from dstreams import StreamingContext

        per_key = rate / len(self.keys)
        full = len(self.keys) * max(1, int(per_key * interval_s))  # the node's per-key limit per batch
        ssc = StreamingContext(sc, interval_s)
        lines = ssc.redisStream(self.keys, url=self.url, startFrom="earliest", maxRatePerPartition=per_key)
        wl.build(ssc, lines.map(line_of), interval_s, lambda _: None)
        short = False

        def samples() -> list[Sample]:
            nonlocal short
            infos = sorted((i for i in ssc.batchInfos() if i.processing_end_time_ms is not None),
                           key=lambda i: i.batch_time_ms)
            out = []
            for k, i in enumerate(infos):
                if i.num_records < full:
                    short = True
                    break
                out.append(Sample(k, float(i.scheduling_delay_ms), float(i.processing_delay_ms),
                                  {"records": i.num_records, "generation_ms": i.generation_ms}))
            return out

        ssc.start()
        try:
            got = _wait(samples, plan, interval_s, stop=lambda: short)
        finally:
            ssc.stop(stopSparkContext=False, stopGraceFully=False)
        if short:
            self.ran_out.add(rate)
        return got


def model_rate(generator_best: int, source_us: float) -> float:
    """The model of the Redis source's rate: the generator pipeline's cost per record plus the source's.

    ``1 / generator_best`` is the generator pipeline's wall time per record at its sustained rate (the
    workload's work and the per-batch fixed costs, on all :data:`CORES`); ``source_us`` is the CPU time
    per entry the Redis source adds (:func:`source_us`: the executor's read and the server's work), shared
    by the cores. The rate where the two fill the cores.
    """
    per_record_s = (1.0 / generator_best if generator_best else 0.0) + source_us * 1e-6 / CORES
    return 1.0 / per_record_s


def source_us(probe_res: dict[str, Any]) -> float:
    """CPU microseconds per entry the Redis source adds: the executor's read, the server's XRANGE and script."""
    steps = probe_res["steps"]
    return sum(steps[k]["us_per_entry_median"] for k in (READ_STEP, "server: XRANGE", "server: range-fixing script"))


def redis_start(generator_best: int, per_entry_us: float) -> int:
    """The Redis search's first rate: 0.8x :func:`model_rate` (the search goes up from there when it sustains)."""
    return max(1_000, _round_rate(0.8 * model_rate(generator_best, per_entry_us)))


def _floor_rate(r: float) -> int:
    """``r`` rounded down to two significant digits."""
    if r < 10:
        return int(r)
    step = 10 ** (int(math.floor(math.log10(r))) - 1)
    return int(r // step * step)


def data_plan(wl: Workload, target_ms: float, mode: Mode, margin_batches: int, start: int,
              bytes_per_entry: float, budget_bytes: float) -> dict[str, Any]:
    """How much to write for a search starting at ``start``: ``max_rate`` and the entries per key.

    Enough for a trial at ``max_rate`` = 2x ``start`` (the search's first step up) to read its warm-up,
    measured and margin batches; ``max_rate`` is lowered when that would exceed ``budget_bytes`` of
    Redis memory.
    """
    plan = trial_plan(wl, target_ms, mode)
    interval_s = target_ms / 2000.0
    batches = plan.warmup + plan.measure + margin_batches
    fit = budget_bytes / bytes_per_entry / (batches * interval_s)  # the highest rate the budget holds
    max_rate = _floor_rate(min(2 * start, fit))
    per_key = max(1, int(max_rate / KEYS * interval_s)) * batches
    return {"max_rate": max_rate, "budget_limited": fit < 2 * start, "batches": batches,
            "entries_per_key": per_key, "entries": per_key * KEYS,
            "estimated_bytes": per_key * KEYS * bytes_per_entry}


# --------------------------------------------------------------------------------------------- children
def child_main(spec: dict[str, Any]) -> int:
    """One search in this process with its own SparkContext; prints :data:`MARKER` + the search's JSON."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from dstreams.spark.sparkconf import create_spark_context

    settings = QUICK_SETTINGS if spec["settings"] == "quick" else FULL_SETTINGS
    wl = WORKLOADS[spec["workload"]]
    mode = mode_for(settings, wl.name)
    sc = create_spark_context("local[2]", f"bench-redis-source-{spec['source']}-{wl.name}")
    sc.setLogLevel("ERROR")
    memory = PeakMemory(getattr(getattr(sc._gateway, "proc", None), "pid", None)).start()
    try:
        if spec["source"] == "generator":
            result = search("dstreams", wl, spec["target_ms"], mode, sc, memory, down=STEP_DOWN)
        else:
            runner = RedisTrials(spec["url"], spec["keys"])
            result = search("dstreams-redis", wl, spec["target_ms"], mode, sc, memory, run=runner,
                            start=spec["start"], max_rate=spec["max_rate"], down=STEP_DOWN)
            for trial in result["trials"]:
                if trial["rate"] in runner.ran_out:
                    trial["input_ran_out"] = True
                    trial["reason"] += " (the entries written beforehand ran out)"
    finally:
        memory.stop()
        sc.stop()
    print(MARKER + json.dumps(result), flush=True)
    return 0


def _run_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.redis_source", "--child", json.dumps(spec)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT.parent, stdout=subprocess.PIPE, stderr=None, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout_s:.0f} s", "trials": [], "max_sustainable_rate": 0}
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            doc = json.loads(line[len(MARKER):])
            doc["wall_s"] = round(time.monotonic() - t0, 1)
            return doc
    return {"failed": f"child exited {proc.returncode}", "trials": [], "max_sustainable_rate": 0}


# ----------------------------------------------------------------------------------------------- report
def _search_cell(s: dict[str, Any]) -> str:
    if s.get("failed") or s.get("error"):
        return f"failed: {s.get('failed') or s.get('error')}"
    best = s.get("max_sustainable_rate") or 0
    if not best:
        tried = min((t["rate"] for t in s["trials"]), default=None)
        return f"none (>= {_fmt_rate(tried)} tried)"
    fail = s.get("lowest_failing_rate")
    upper = f"< {_fmt_rate(fail)}" if fail else "no failing rate tried"
    return f"{_fmt_rate(best)} ({upper})"


def ratio(generator: dict[str, Any], redis_search: dict[str, Any]) -> dict[str, Any] | None:
    """Generator rate / Redis rate, with the range the two searches' bounds allow (None: not comparable)."""
    g, r = _bounds(generator), _bounds(redis_search)
    if g is None or r is None:
        return None
    return {"ratio": g[0] / r[0], "low": g[0] / r[1] if r[1] else None, "high": g[1] / r[0] if g[1] else None}


def _ratio_cell(x: dict[str, Any] | None) -> str:
    if x is None:
        return "-"
    lo = f"{x['low']:.1f}x" if x["low"] is not None else "?"
    hi = f"{x['high']:.1f}x" if x["high"] is not None else "?"
    return f"{x['ratio']:.1f}x ({lo} to {hi})"


def best_trial(s: dict[str, Any]) -> dict[str, Any] | None:
    """The sustainable trial at the search's best rate."""
    best = s.get("max_sustainable_rate") or 0
    return next((t for t in s.get("trials", []) if t["rate"] == best and t.get("sustainable")), None)


def _median_detail(trial: dict[str, Any], field: str) -> float | None:
    """Median of a per-batch ``detail`` field over the trial's measured batches."""
    start = trial.get("measured_from_batch") or 0
    values = [x["detail"][field] for x in trial["samples"][start:start + trial.get("batches_measured", 0)]
              if x.get("detail") and x["detail"].get(field) is not None]
    return statistics.median(values) if values else None


def print_results(doc: dict[str, Any]) -> None:
    print(f"\nSustained at the {doc['target_ms'] / 1000:g} s latency target ({doc['interval_ms']:.0f} ms batches), "
          f"records/s, mode={doc['mode']} (best sustainable rate, lowest failing rate):")
    print(f"  {'workload':10s} {'generator source':28s} {'Redis Streams source':28s} {'model':>9s}  "
          "generator / Redis (bounds)")
    for w in doc["workloads"]:
        print(f"  {w['workload']:10s} {_search_cell(w['generator']):28s} {_search_cell(w['redis']):28s} "
              f"{_fmt_rate(w['data'].get('model_rate')):>9s}  {_ratio_cell(w['ratio'])}")
    print(f"  model = 1 / (1 / generator rate + (read + server XRANGE + server script) us per entry / {CORES} cores)")
    print("  per batch at the best rate, medians over the measured batches (ms):")
    for w in doc["workloads"]:
        cells = []
        for source in ("generator", "redis"):
            t = best_trial(w[source])
            if t is None:
                cells.append("-")
                continue
            cell = f"processing {t['median_processing_ms']:.0f}, scheduling delay {t['median_scheduling_ms']:.0f}"
            building = _median_detail(t, "generation_ms")
            if building is not None:
                cell += f" (of which the driver building the batch {building:.0f})"
            cells.append(cell)
        print(f"    {w['workload']:10s} generator: {cells[0]}; Redis: {cells[1]}")
    for w in doc["workloads"]:
        d = w["data"]
        print(f"  {w['workload']}: wrote {d['entries']:,} entries in {KEYS} keys ({d['write_s']:.0f} s, "
              f"{d['entries'] / max(d['write_s'], 1e-9):,.0f} entries/s), Redis used_memory "
              f"{d['used_memory_after_write'] / 2**20:,.0f} MiB; Redis search up to {d['max_rate']:,}/s"
              + ("; THE REDIS SERVER RESTARTED DURING THE SEARCH" if d.get("redis_restarted") else ""))


# ------------------------------------------------------------------------------------------------- main
def run_workload(r: Any, name: str, args: argparse.Namespace, settings: Settings,
                 probe_res: dict[str, Any]) -> dict[str, Any]:
    """The generator's search, the input written, the Redis source's search, the keys deleted."""
    wl = WORKLOADS[name]
    mode = mode_for(settings, name)
    base = {"workload": name, "target_ms": args.target_ms, "settings": settings.name}
    print(f"== {name}: generator source", flush=True)
    generator = _run_child({**base, "source": "generator"}, args.timeout)
    per_entry_us = source_us(probe_res)
    start = redis_start(generator.get("max_sustainable_rate") or 0, per_entry_us)
    plan = data_plan(wl, args.target_ms, mode, settings.margin_batches, start, probe_res["bytes_per_entry"],
                     args.memory_budget_mb * 2**20)
    keys = [f"{PREFIX}:{os.getpid()}:{name}:{i}" for i in range(KEYS)]
    data: dict[str, Any] = {"keys": keys, **plan, "start": start,
                            "model_rate": model_rate(generator.get("max_sustainable_rate") or 0, per_entry_us)}
    print(f"== {name}: writing {plan['entries']:,} entries into {KEYS} keys (Redis search from {start:,}/s, "
          f"at most {plan['max_rate']:,}/s)", flush=True)
    server = run_id(r)
    try:
        r.unlink(*keys)
        before = used_memory(r)
        t0 = time.monotonic()
        for i, key in enumerate(keys):
            write_lines(r, key, plan["entries_per_key"], i)
        data["write_s"] = round(time.monotonic() - t0, 1)
        data["used_memory_after_write"] = used_memory(r)
        data["used_memory_of_entries"] = data["used_memory_after_write"] - before
        data["aof_rewrite_wait_s"] = wait_aof_rewrite(r)
        print(f"   {data['write_s']:.0f} s; Redis used_memory {data['used_memory_after_write'] / 2**20:,.0f} MiB",
              flush=True)
        print(f"== {name}: Redis Streams source", flush=True)
        redis_search = _run_child({**base, "source": "redis", "url": args.url, "keys": keys, "start": start,
                                   "max_rate": plan["max_rate"]}, args.timeout)
    finally:
        data["deleted"] = unlink_keys(r, keys)
    if run_id(r) != server:
        data["redis_restarted"] = True
        print(f"WARNING: the Redis server restarted (or stopped) while {name} read from it: its figures are "
              "disturbed", file=sys.stderr, flush=True)
    return {"workload": name, "generator": generator, "redis": redis_search, "data": data,
            "ratio": ratio(generator, redis_search)}


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw and raw[0] == "--child":
        return child_main(json.loads(raw[1]))
    ap = argparse.ArgumentParser(prog="python -m benchmarks.redis_source", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rates, shorter trials (~8 min)")
    ap.add_argument("--url", default=DEFAULT_URL, help=f"Redis server (default {DEFAULT_URL})")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOAD_NAMES), choices=list(WORKLOAD_NAMES))
    ap.add_argument("--target-ms", type=float, default=1000.0, help="latency target (batch interval = target / 2)")
    ap.add_argument("--probe-only", action="store_true", help="only the per-entry costs; no Spark, no JSON")
    ap.add_argument("--probe-entries", type=int, help="entries of the per-entry cost probe")
    ap.add_argument("--repeat", type=int, help="passes of each per-entry cost step")
    ap.add_argument("--memory-budget-mb", type=float, default=1200.0,
                    help="Redis memory the written entries may take (MiB)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per search subprocess")
    args = ap.parse_args(raw)
    settings = QUICK_SETTINGS if args.quick else FULL_SETTINGS
    r = connect(args.url)
    try:
        r.ping()
    except Exception as e:
        print(f"Redis at {args.url} does not answer ({type(e).__name__}: {e}); start the project's server with "
              "`bash scripts/services.sh start redis`, or pass --url", file=sys.stderr)
        return 2
    from .__main__ import _machine

    machine = _machine()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t_run = time.monotonic()
    aof_start = int(_aof(r).get("aof_current_size", 0))
    probe_res = probe(args.url, args.probe_entries or settings.probe_entries, args.repeat or settings.repeat)
    print_probe(probe_res)
    if args.probe_only:
        return 0
    workloads = []
    try:
        for name in args.workloads:
            workloads.append(run_workload(r, name, args, settings, probe_res))
    finally:
        grown = int(_aof(r).get("aof_current_size", 0)) - aof_start
        if grown > AOF_GROWTH_REWRITE:
            wait_aof_rewrite(r)
            print(f"compacting Redis's append-only file (grew by {grown / 2**20:,.0f} MiB): BGREWRITEAOF", flush=True)
            r.bgrewriteaof()
            time.sleep(1.0)
            wait_aof_rewrite(r)
    command = "python -m benchmarks.redis_source " + " ".join(raw)
    doc = {"benchmark": "redis_source", "command": command.strip(), "mode": settings.name, "started": started,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": round(time.monotonic() - t_run, 1),
           "machine": machine, "url": args.url, "keys_per_workload": KEYS, "target_ms": args.target_ms,
           "interval_ms": args.target_ms / 2, "probe": probe_res, "workloads": workloads}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, RESULTS)
    print_probe(probe_res)
    print_results(doc)
    print(f"wrote {RESULTS} ({doc['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
