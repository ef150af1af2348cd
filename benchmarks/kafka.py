"""Kafka in and out: Kafka -> Grep -> Kafka and Kafka -> windowed WordCount -> Kafka, dstreams' exactly-once and
at-least-once sinks next to Structured Streaming's Kafka source and sink and Quix Streams, on the same broker.

Run from the repository root with the project's broker up (``bash scripts/services.sh start kafka``)::

    python -m benchmarks kafka                       # both workloads, the default engines, one round (~16 min)
    python -m benchmarks kafka --repeat 2            # two interleaved rounds, medians (~33 min)
    python -m benchmarks kafka --workloads grep --engines dstreams-eo dstreams-alo --start 20000
    python -m benchmarks kafka --rates 5000 --warmup-s 5 --settle-s 2 --measure-s 5 --out /tmp/k.json  # one rate

Contract:

* **Engines** (:data:`ENGINES`): ``dstreams-eo`` / ``dstreams-alo`` (``ssc.kafkaStream`` ->
  ``saveToKafka(guarantee="exactly-once" | "at-least-once")``), ``ss-sql`` / ``ss-udf`` (Structured Streaming's
  Kafka source and sink, ``spark-sql-kafka-0-10`` for the installed Spark from Maven Central, built-in functions or
  Python UDFs; its sink is at-least-once), all in ``local[2]`` with ``tuned_conf``
  (:mod:`benchmarks.kafka_apps`); ``quix`` (Quix Streams, ``processing_guarantee="exactly-once"``, two
  instances of one consumer group, WordCount only; :mod:`benchmarks.kafka_quix`, run by an interpreter that has
  quixstreams: ``--quix-python``, default a virtual environment made on first use in ``.bench/quix-venv``).
* **One run** = one workload on one engine, in fresh topics (input and output, :data:`PARTITIONS` partitions
  each, deleted afterwards): a producer process writes the generator's 100-byte lines at a set rate
  (:mod:`benchmarks.kafka_load`), the engine's processes read and write, a measurer process reads the output with
  ``isolation.level=read_committed`` and takes each output record's latency: the time it became visible minus the
  produce time of the newest input it covers (Grep: the matching line itself; WordCount: the newest input record
  of the batch that wrote the row, or of the row's window group for Structured Streaming and Quix).
* **The rate search** runs inside one run, the engine never restarted: a warm-up at the first rate
  (``--warmup-s``; WordCount's is long enough to fill the 30 s window; then on until the outputs are within the
  latency target or steady, at most 90 s more: a first micro-batch compiles code and reads the warm-up's backlog),
  then steps: each rate is produced for ``--settle-s`` and then measured for ``--measure-s``. A step **kept up**
  when the latency did not grow (least-squares growth of the per-second median over the measured seconds under
  ``--growth-ms``) and the producer reached 90 % of the rate; it is **held** when it also kept the outputs' median
  latency within ``--target-ms`` (default 2 s: twice the 1 s batch interval). A step whose latency was above the
  target and falling (a backlog from the start-up or a faster step still draining) is measured once more and
  judged on that second window. A step ends early (not kept up)
  when a second's median latency passes ``--abort-ms`` or no output arrives for that long. The rate doubles while
  held and halves while nothing was; once both are known the search bisects geometrically between the best held
  and the lowest failing rate until they are within ``--precision`` or ``--steps`` rates were tried. After a step
  that did not keep up the producer pauses until the engine caught up (the outputs cover the last input
  produced; at most ``--drain-timeout-s``); the next rate then starts, and its settling begins once the latency
  is back within the target (an engine may still run batches queued during the overload), at most 30 s later.
  ``--rates`` replaces the search by a fixed list of rates (each one step).
* Engines run one after another (``--repeat`` rounds, each round every engine in turn, so repeats interleave); the
  table gives per engine the median over rounds of the best held rate and of the latency at that rate, and the
  same for the best rate kept up with at any latency.
* **Output**: progress and a table on stdout; ``benchmarks/results/kafka.json`` (or ``--out``): every step of
  every run with its latency percentiles, per-second medians, produced rate, and the engine's own per-batch
  metrics over the measured seconds (dstreams: processing, output and scheduling times; Structured Streaming: its
  progress' ``durationMs``).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from .kafka_load import LoadProducer, MeasureClient, WindowStats, growth_ms, spawn_context
from .kafka_protocol import READY, RESULT

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RESULTS = ROOT / "results" / "kafka.json"
BENCH_DIR = REPO / ".bench"
IVY_DIR = BENCH_DIR / "ivy"
QUIX_VENV = BENCH_DIR / "quix-venv"
LOG_DIR = BENCH_DIR / "logs"
DEFAULT_BOOTSTRAP = os.environ.get("DSTREAMS_TEST_KAFKA_BOOTSTRAP", "127.0.0.1:9192")
LAG = "KAFKA_APP_LAG "
#: Partitions of every input and output topic: one per core of ``local[2]``.
PARTITIONS = 2
WORKLOADS = ("grep", "wordcount")
ENGINES = ("dstreams-eo", "dstreams-alo", "ss-sql", "ss-udf", "quix")
DEFAULT_ENGINES = ("dstreams-eo", "dstreams-alo", "ss-sql", "quix")
#: Engines that run a workload (Quix Streams: the WordCount only, as the issue asks).
SUPPORTS = {"quix": ("wordcount",)}
GUARANTEE = {"dstreams-eo": "exactly-once", "dstreams-alo": "at-least-once", "ss-sql": "at-least-once",
             "ss-udf": "at-least-once", "quix": "exactly-once"}
#: First rate of each search (records/s), near the answers of earlier runs on a 2-core machine.
START_RATES: dict[tuple[str, str], int] = {
    ("grep", "dstreams-eo"): 60_000, ("grep", "dstreams-alo"): 60_000, ("grep", "ss-sql"): 20_000,
    ("grep", "ss-udf"): 10_000, ("wordcount", "dstreams-eo"): 20_000, ("wordcount", "dstreams-alo"): 30_000,
    ("wordcount", "ss-sql"): 1_500, ("wordcount", "ss-udf"): 1_000, ("wordcount", "quix"): 50,
}
#: The rate search goes no lower than this.
MIN_RATE = 10
SPARK_KAFKA = "org.apache.spark:spark-sql-kafka-0-10_2.13"
CONNECTOR = "spark-sql-kafka-0-10_2.13"
TOKEN_PROVIDER = "spark-token-provider-kafka-0-10_2.13"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
#: Seconds an engine may take to print READY (Spark and its JVM, the connector's jars).
START_TIMEOUT_S = 240.0
#: Seconds an engine may take to stop and report.
STOP_TIMEOUT_S = 90.0
#: Seconds between two checks of a running step.
POLL_S = 1.0
#: The warm-up also ends when the latency stayed flat over this many seconds (above the target: an engine whose
#: latency has a floor above it), but only this long after the warm-up's planned end.
STEADY_WINDOW_S = 10.0
STEADY_AFTER_S = 30.0
#: After a drain, seconds the next rate may take to bring the latency back within the target before its settling.
RECOVER_S = 30.0
#: Seconds after the warm-up's planned end from which a latency above ``abort_ms`` and growing ends it.
OVERLOAD_AFTER_S = 15.0


@dataclass(frozen=True)
class Settings:
    """The search's timings and thresholds (the command's options)."""

    warmup_s: dict[str, float]
    settle_s: float
    measure_s: float
    steps: int
    precision: float
    target_ms: float
    growth_ms: float
    abort_ms: float
    drain_timeout_s: float
    interval_s: float = 1.0
    #: Seconds the warm-up may go on past ``warmup_s`` until the engine caught up.
    warmup_extra_s: float = 90.0


DEFAULT_SETTINGS = Settings(warmup_s={"grep": 10.0, "wordcount": 30.0}, settle_s=5.0, measure_s=15.0, steps=4,
                            precision=1.4, target_ms=2000.0, growth_ms=500.0, abort_ms=6000.0, drain_timeout_s=120.0)


@dataclass
class Step:
    """One rate of a run: what was produced and what the read_committed consumer saw over the measured seconds."""

    rate: int
    achieved_rate: float
    #: Kept up with the median latency within the target.
    held: bool
    #: Kept up (the latency did not grow, the producer reached the rate), whatever the median latency.
    kept_up: bool
    reason: str
    records_out: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    growth_ms: float
    per_second: list[tuple[int, float, int]]
    measured_from_ms: float
    measured_to_ms: float
    aborted: bool = False
    #: Measured twice: the first window's latency was still falling from an earlier backlog.
    remeasured: bool = False
    #: After the previous step's drain: seconds at this rate until the latency was within the target again
    #: (before the settling), None when not needed or it did not recover within RECOVER_S.
    recovered_s: float | None = None
    drain_s: float | None = None
    engine: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- preparations
def admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def broker_answers(bootstrap: str, timeout_s: float = 10.0) -> bool:
    try:
        admin(bootstrap).list_topics(timeout=timeout_s)
        return True
    except Exception:
        return False


def create_topics(bootstrap: str, names: list[str], partitions: int = PARTITIONS, timeout_s: float = 30.0) -> None:
    """Create ``names`` and wait until each shows all its partitions."""
    from confluent_kafka.admin import NewTopic

    a = admin(bootstrap)
    futures = a.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names],
                              operation_timeout=timeout_s, request_timeout=timeout_s)
    for f in futures.values():
        f.result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = a.list_topics(timeout=5)
        if all(n in md.topics and len(md.topics[n].partitions) == partitions and md.topics[n].error is None
               for n in names):
            return
        time.sleep(0.2)
    raise TimeoutError(f"topics {names} did not show {partitions} partitions within {timeout_s:.0f} s")


def delete_topics(bootstrap: str, match: Callable[[str], bool], timeout_s: float = 30.0) -> list[str]:
    """Delete every topic whose name ``match``\\ es (the run's own, and Quix Streams' internal ones); bounded."""
    a = admin(bootstrap)
    try:
        names = [n for n in a.list_topics(timeout=10).topics if match(n)]
        if names:
            for f in a.delete_topics(names, operation_timeout=timeout_s, request_timeout=timeout_s).values():
                f.result(timeout_s)
        return names
    except Exception as e:
        print(f"WARNING: could not delete the run's topics ({type(e).__name__}: {e})", file=sys.stderr)
        return []


def _on_maven_central(artifact: str, version: str, timeout_s: float) -> bool:
    import urllib.error
    import urllib.request

    url = f"{MAVEN_CENTRAL}/org/apache/spark/{artifact}/{version}/{artifact}-{version}.pom"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def connector_version(installed: str, timeout_s: float = 20.0) -> str:
    """The ``spark-sql-kafka-0-10`` version for pyspark ``installed``: the newest release of the same minor line,
    not above ``installed``, whose connector and its ``spark-token-provider-kafka-0-10`` Maven Central both
    serve (a pip release can precede Maven's; the connector works across the patch releases of a line)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"{MAVEN_CENTRAL}/org/apache/spark/{CONNECTOR}/maven-metadata.xml",
                                timeout=timeout_s) as r:
        published = set(re.findall(r"<version>([0-9]+\.[0-9]+\.[0-9]+)</version>", r.read().decode()))
    line, _, patch = installed.rpartition(".")
    candidates = sorted((v for v in published if v.rpartition(".")[0] == line
                         and int(v.rpartition(".")[2]) <= int(patch)),
                        key=lambda v: int(v.rpartition(".")[2]), reverse=True)
    for version in candidates:
        if all(_on_maven_central(a, version, timeout_s) for a in (CONNECTOR, TOKEN_PROVIDER)):
            return version
    raise RuntimeError(f"Maven Central has no complete {CONNECTOR} for Spark {line}.x (<= {installed})")


def spark_kafka_jars(timeout_s: float = 600.0) -> list[str]:
    """The jars Structured Streaming's Kafka connector adds to pyspark's: resolved once from Maven Central with
    ``spark.jars.packages`` into ``.bench/ivy`` (cached), then passed as ``spark.jars`` (no resolution per run).
    The connector's version is pyspark's, or the newest published patch release of its line
    (:func:`connector_version`)."""
    import pyspark

    line = pyspark.__version__.rpartition(".")[0]
    wanted = [f"org.apache.spark_spark-sql-kafka-0-10_2.13-{line}.*.jar",
              f"org.apache.spark_spark-token-provider-kafka-0-10_2.13-{line}.*.jar",
              "org.apache.kafka_kafka-clients-*.jar", "org.apache.commons_commons-pool2-*.jar"]

    def found() -> list[str] | None:
        paths = [sorted(glob.glob(str(IVY_DIR / "jars" / w))) for w in wanted]
        return [p[-1] for p in paths] if all(paths) else None

    jars = found()
    if jars:
        return jars
    IVY_DIR.mkdir(parents=True, exist_ok=True)
    _ignore_folder()
    version = connector_version(pyspark.__version__)
    print(f"resolving {SPARK_KAFKA}:{version} from Maven Central into {IVY_DIR} (once)", flush=True)
    code = ("import os; os.environ.setdefault('SPARK_LOCAL_IP', '127.0.0.1'); from pyspark.sql import SparkSession; "
            f"SparkSession.builder.master('local[1]').config('spark.jars.packages', '{SPARK_KAFKA}:{version}')"
            f".config('spark.jars.ivy', '{IVY_DIR}').getOrCreate().stop()")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=timeout_s, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jars = found()
    if not jars:
        raise RuntimeError(f"{SPARK_KAFKA}:{version} did not resolve into {IVY_DIR}")
    return jars


def quix_python(given: str | None, timeout_s: float = 600.0) -> str:
    """An interpreter with quixstreams: ``given``, else ``.bench/quix-venv`` (made with pip on first use)."""
    if given:
        return given
    py = QUIX_VENV / "bin" / "python"
    if not py.exists():
        _ignore_folder()
        print(f"making {QUIX_VENV} with quixstreams (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(QUIX_VENV)], check=True, timeout=timeout_s)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "quixstreams"], check=True, timeout=timeout_s)
    return str(py)


def _ignore_folder() -> None:
    """``.bench/`` holds caches and logs: it ignores itself in git."""
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    ignore = BENCH_DIR / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")


# --------------------------------------------------------------------------------------------- processes
class EngineProcess:
    """One engine process speaking the READY / stop / RESULT protocol of :mod:`benchmarks.kafka_apps`."""

    def __init__(self, cmd: list[str], log_path: Path) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.log: IO[str] = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, bufsize=1)
        self.ready = threading.Event()
        self.result: dict[str, Any] | None = None
        #: How far the engine's last completed batch is behind (engines that report it), else None.
        self.lag_ms: float | None = None
        self.reader = threading.Thread(target=self._read, name="engine-stdout", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(LAG):
                self.lag_ms = float(line[len(LAG):])
            elif line.startswith(READY):
                self.ready.set()
            elif line.startswith(RESULT):
                self.result = json.loads(line[len(RESULT):])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.5):
            if not self.alive():
                raise RuntimeError(f"the engine exited {self.proc.returncode} before it was ready; see "
                                   f"{self.log_path}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine was not ready within {timeout_s:.0f} s; see {self.log_path}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, Any] | None:
        """Ask it to stop (``stop`` on its standard input), wait (bounded), then terminate or kill it."""
        try:
            if self.proc.stdin and self.alive():
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.reader.join(5)
        self.log.close()
        return self.result


# ---------------------------------------------------------------------------------------------- the search
def round_rate(r: float) -> int:
    """``r`` to two significant digits."""
    if r <= 0:
        return 0
    step = 10 ** max(0, int(math.floor(math.log10(r))) - 1)
    return int(round(r / step) * step)


def next_rate(rate: int, best: int, failed: int | None, precision: float) -> int | None:
    """The search's next rate after trying ``rate`` (None: the search is done)."""
    if failed is None:
        return rate * 2
    if best == 0:
        nxt = round_rate(rate / 2)
        return nxt if nxt >= MIN_RATE else None
    if failed / best <= precision:
        return None
    nxt = round_rate(math.sqrt(best * failed))
    return nxt if best < nxt < failed else None


class Run:
    """One workload on one engine (module contract): topics, load, measurer, engine processes, the steps."""

    def __init__(self, workload: str, engine: str, settings: Settings, args: argparse.Namespace, tag: str) -> None:
        self.workload, self.engine, self.settings, self.args = workload, engine, settings, args
        self.bootstrap: str = args.bootstrap
        self.prefix = f"bench-kafka-{tag}-{workload}-{engine}"
        self.input, self.output = f"{self.prefix}-in", f"{self.prefix}-out"
        self.group = f"{self.prefix}-quix"
        self.steps: list[Step] = []
        self.engines: list[EngineProcess] = []
        self.state_dirs: list[Path] = []
        self.warmup_s: float | None = None

    # ---- engine processes
    def _start_engines(self) -> None:
        spec: dict[str, Any] = {"engine": self.engine, "workload": self.workload, "bootstrap": self.bootstrap,
                                "input": self.input, "output": self.output, "interval_s": self.settings.interval_s}
        if self.engine == "quix":
            py = quix_python(self.args.quix_python)
            for i in range(self.args.quix_instances):
                state = BENCH_DIR / "quix-state" / f"{self.group}-{i}"
                self.state_dirs.append(state)
                cmd = [py, "-m", "benchmarks.kafka_quix",
                       json.dumps({**spec, "group": self.group, "state_dir": str(state),
                                   "grace_ms": self.args.quix_grace_ms})]
                self.engines.append(EngineProcess(cmd, LOG_DIR / f"{self.prefix}-{i}.log"))
        else:
            if self.engine.startswith("ss-"):
                spec["jars"] = spark_kafka_jars()
            cmd = [sys.executable, "-m", "benchmarks.kafka_apps", json.dumps(spec)]
            self.engines.append(EngineProcess(cmd, LOG_DIR / f"{self.prefix}.log"))
        for e in self.engines:
            e.wait_ready(START_TIMEOUT_S)

    def _engines_alive(self) -> bool:
        return all(e.alive() for e in self.engines)

    # ---- steps
    def _window(self, measure: MeasureClient, seconds: float) -> WindowStats:
        now = time.time() * 1000.0
        return measure.stats(now - seconds * 1000.0, now)

    def _watch(self, measure: MeasureClient, until: float, since_ms: float) -> str | None:
        """Sleep until ``until`` (monotonic), checking every :data:`POLL_S`; the reason to abort, if any."""
        s = self.settings
        while time.monotonic() < until:
            time.sleep(min(POLL_S, max(0.0, until - time.monotonic())))
            if not self._engines_alive():
                return "the engine exited"
            st = self._window(measure, 2.0)
            now = time.time() * 1000.0
            last = st.last_arrival_ms or since_ms
            if now - max(last, since_ms) > s.abort_ms:
                return f"no output for {s.abort_ms / 1000:.0f} s"
            if st.p50_ms is not None and st.p50_ms > s.abort_ms:
                return f"latency {st.p50_ms / 1000:.1f} s > {s.abort_ms / 1000:.0f} s"
        return None

    def recover(self, measure: MeasureClient) -> float | None:
        """After a drain: wait until the outputs' latency is back within the target (an engine may still have
        batches queued from the overload: dstreams generates one per interval whatever happens, and each runs
        in turn), at most :data:`RECOVER_S`; seconds waited, or None when it did not recover."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < RECOVER_S:
            time.sleep(POLL_S)
            st = self._window(measure, 3.0)
            if st.records and st.p50_ms is not None and st.p50_ms <= self.settings.target_ms:
                return round(time.monotonic() - t0, 1)
            if not self._engines_alive():
                return None
        return None

    def step(self, producer: LoadProducer, measure: MeasureClient, rate: int, settle_s: float,
             recovering: bool = False) -> Step:
        s = self.settings
        producer.set_rate(rate)
        recovered = self.recover(measure) if recovering else None
        started_ms = time.time() * 1000.0
        reason = self._watch(measure, time.monotonic() + settle_s, started_ms)
        t0 = time.time() * 1000.0
        p0 = producer.produced
        if reason is None:
            reason = self._watch(measure, time.monotonic() + s.measure_s, started_ms)
        t1 = time.time() * 1000.0
        p1 = producer.produced
        st = measure.stats(t0, t1)
        grow = growth_ms(st.per_second)
        remeasured = False
        if reason is None and st.p50_ms is not None and st.p50_ms > s.target_ms and grow < -s.growth_ms:
            # The latency was falling: a backlog from before this step (the start-up, a faster earlier step) was
            # still draining. Judge the rate on a second measured window.
            remeasured = True
            t0, p0 = t1, p1
            reason = self._watch(measure, time.monotonic() + s.measure_s, started_ms)
            t1 = time.time() * 1000.0
            p1 = producer.produced
            st = measure.stats(t0, t1)
            grow = growth_ms(st.per_second)
        achieved = (p1 - p0) / max(t1 - t0, 1.0) * 1000.0
        held = kept_up = False
        aborted = reason is not None
        if reason is None:
            if not st.records:
                reason = "no output"
            elif grow > s.growth_ms:
                reason = f"latency grew {grow:.0f} ms over the measured seconds"
            elif achieved < 0.9 * rate:
                reason = f"the producer reached only {achieved:,.0f}/s"
            elif st.p50_ms is not None and st.p50_ms > s.target_ms:
                kept_up, reason = True, f"kept up, but median latency {st.p50_ms:.0f} ms > target {s.target_ms:.0f} ms"
            else:
                held = kept_up = True
                reason = "held"
        return Step(rate, round(achieved, 1), held, kept_up, reason, st.records, st.p50_ms, st.p90_ms, st.p99_ms,
                    st.max_ms, round(grow, 1), st.per_second, t0, t1, aborted=aborted, remeasured=remeasured,
                    recovered_s=recovered)

    def drain(self, producer: LoadProducer, measure: MeasureClient) -> float | None:
        """Pause the input until the outputs cover the last record produced and the engine has no batches queued
        (dstreams reports how far behind its last completed batch is); seconds waited, None if it did not."""
        producer.set_rate(0)
        time.sleep(0.2)
        last = producer.last_ms
        slack = 300.0 if self.workload == "grep" else 2500.0
        t0 = time.monotonic()
        queued_ms = 2000.0 * self.settings.interval_s
        while time.monotonic() - t0 < self.settings.drain_timeout_s:
            st = self._window(measure, 1.0)
            if (st.newest_covered_ms is not None and st.newest_covered_ms >= last - slack
                    and all(e.lag_ms is None or e.lag_ms <= queued_ms for e in self.engines)):
                return round(time.monotonic() - t0, 1)
            if not self._engines_alive():
                return None
            time.sleep(0.5)
        return None

    def warm_up(self, measure: MeasureClient, seconds: float) -> float | None:
        """Wait ``seconds``, then until the last seconds' outputs are within the latency target, or steady (the
        start-up transient drained: a first batch that compiles code and reads the warm-up's backlog), at most
        ``warmup_extra_s`` more. Seconds waited, or None when it did not catch up (also as soon as the latency is
        above ``abort_ms`` and growing: the rate is too high, and waiting would only pile up input)."""
        t0 = time.monotonic()
        time.sleep(seconds)
        s = self.settings
        while time.monotonic() - t0 < seconds + s.warmup_extra_s:
            st = self._window(measure, 5.0)
            if st.records and st.p50_ms is not None and st.p50_ms <= s.target_ms:
                return round(time.monotonic() - t0, 1)  # caught up
            if time.monotonic() - t0 > seconds + OVERLOAD_AFTER_S:
                st = self._window(measure, STEADY_WINDOW_S)
                if st.p50_ms is not None and st.p50_ms > s.abort_ms and growth_ms(st.per_second) > s.growth_ms:
                    return None  # overloaded, not a start-up transient: the first step fails at once
            if time.monotonic() - t0 > seconds + STEADY_AFTER_S:
                st = self._window(measure, STEADY_WINDOW_S)
                if (st.p50_ms is not None and st.p50_ms < s.abort_ms and len(st.per_second) >= STEADY_WINDOW_S - 2
                        and abs(growth_ms(st.per_second)) <= s.growth_ms / 2):
                    return round(time.monotonic() - t0, 1)  # steady above the target (an engine's latency floor)
            if not self._engines_alive():
                return None
            time.sleep(POLL_S)
        return None

    def search(self, producer: LoadProducer, measure: MeasureClient) -> None:
        s = self.settings
        rates = list(self.args.rates or [])
        rate = rates.pop(0) if rates else (self.args.start or START_RATES.get((self.workload, self.engine), 10_000))
        producer.set_rate(rate)
        print(f"   warm-up at {rate:,}/s for {s.warmup_s[self.workload]:.0f} s", flush=True)
        self.warmup_s = self.warm_up(measure, s.warmup_s[self.workload])
        print(f"   caught up after {self.warmup_s:.0f} s" if self.warmup_s is not None
              else f"   not caught up after {s.warmup_s[self.workload] + s.warmup_extra_s:.0f} s", flush=True)
        best, failed = 0, None
        drained = False
        for i in range(len(self.args.rates) if self.args.rates else s.steps):
            step = self.step(producer, measure, rate, s.settle_s, recovering=drained)
            drained = False
            self.steps.append(step)
            print(f"   {rate:>10,}/s  produced {step.achieved_rate:>10,.0f}/s  out {step.records_out:>9,}  "
                  f"p50 {_ms(step.p50_ms)}  p99 {_ms(step.p99_ms)}  growth {step.growth_ms:>6.0f} ms  {step.reason}",
                  flush=True)
            if not self._engines_alive():
                break
            if step.held:
                best = max(best, rate)
            else:
                failed = rate if failed is None else min(failed, rate)
            if self.args.rates:
                if not rates:
                    break
                nxt: int | None = rates.pop(0)
            else:
                if i == s.steps - 1:
                    break
                nxt = next_rate(rate, best, failed, s.precision)
                if nxt is not None and self.args.max_rate and nxt > self.args.max_rate:
                    nxt = self.args.max_rate if rate < self.args.max_rate else None
            if nxt is None:
                break
            if not step.kept_up:
                step.drain_s = self.drain(producer, measure)
                drained = True
                if step.drain_s is None:
                    print(f"   the engine did not catch up within {s.drain_timeout_s:.0f} s: search ends", flush=True)
                    break
            rate = nxt

    def execute(self) -> dict[str, Any]:
        """The whole run; every process it starts is stopped and its topics deleted, whatever happens."""
        t_run = time.monotonic()
        ctx = spawn_context()
        create_topics(self.bootstrap, [self.input, self.output])
        measure = MeasureClient(ctx, self.bootstrap, self.output, self.input, by_key=self.workload == "grep")
        producer = LoadProducer(ctx, self.bootstrap, self.input, PARTITIONS)
        doc: dict[str, Any] = {"workload": self.workload, "engine": self.engine, "guarantee": GUARANTEE[self.engine],
                               "topics": [self.input, self.output]}
        results: list[dict[str, Any] | None] = []
        try:
            measure.start()
            producer.start()
            t0 = time.monotonic()
            self._start_engines()
            doc["start_s"] = round(time.monotonic() - t0, 1)
            self.search(producer, measure)
            doc["warmup_s"] = self.warmup_s
        except Exception as e:
            doc["failed"] = f"{type(e).__name__}: {e}"
            print(f"   FAILED: {doc['failed']}", flush=True)
        finally:
            producer.set_rate(0)
            for e in self.engines:
                results.append(e.stop())
                if e.proc.returncode not in (0, None):
                    doc.setdefault("engine_exit", []).append({"code": e.proc.returncode, "log": str(e.log_path),
                                                              "tail": e.tail()})
            producer.stop()
            measure.stop()
            doc["producer_errors"] = producer.errors
            doc["deleted_topics"] = delete_topics(self.bootstrap, lambda n: self.prefix in n)
            for d in self.state_dirs:
                shutil.rmtree(d, ignore_errors=True)
        metrics = results[0] if results and results[0] else {}
        for step in self.steps:
            step.engine = engine_breakdown(self.engine, metrics, step.measured_from_ms, step.measured_to_ms)
        doc["steps"] = [asdict(st) for st in self.steps]
        doc.update(summarize(self.steps))
        doc["wall_s"] = round(time.monotonic() - t_run, 1)
        return doc


def _ms(v: float | None) -> str:
    return f"{v:>6.0f} ms" if v is not None else "     - ms"


def _iso_ms(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000.0


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def engine_breakdown(engine: str, metrics: dict[str, Any], t0: float, t1: float) -> dict[str, Any]:
    """Medians of the engine's own per-batch metrics over the batches that ran in ``[t0, t1]``."""
    batches = metrics.get("batches") or []
    if engine.startswith("dstreams"):
        inside = [b for b in batches if t0 <= b["batch_ms"] <= t1]
        return {"batches": len(inside), **{f"median_{k}": _median([b[k] for b in inside if b.get(k) is not None])
                                           for k in ("records", "processing_ms", "output_ms", "scheduling_ms",
                                                     "generation_ms")}}
    if engine.startswith("ss-"):
        inside = [b for b in batches if t0 <= _iso_ms(b["timestamp"]) <= t1]
        keys = sorted({k for b in inside for k in (b.get("duration_ms") or {})})
        return {"batches": len(inside), "median_records": _median([b["records"] for b in inside]),
                **{f"median_{k}_ms": _median([b["duration_ms"][k] for b in inside if k in b["duration_ms"]])
                   for k in keys}}
    return {}


def _at(step: Step | None) -> dict[str, Any] | None:
    if step is None:
        return None
    return {"rate": step.rate, "p50_ms": step.p50_ms, "p90_ms": step.p90_ms, "p99_ms": step.p99_ms,
            "achieved_rate": step.achieved_rate, "engine": step.engine}


def summarize(steps: list[Step]) -> dict[str, Any]:
    """The run's answer: the best held rate, the lowest failing one and the latency at the best; the same for the
    rates it kept up with at any latency."""
    held = [s for s in steps if s.held]
    kept = [s for s in steps if s.kept_up]
    failed = [s.rate for s in steps if not s.held]
    best = max(held, key=lambda s: s.rate) if held else None
    best_kept = max(kept, key=lambda s: s.rate) if kept else None
    return {"max_held_rate": best.rate if best else 0, "lowest_failing_rate": min(failed) if failed else None,
            "at_best": _at(best), "max_kept_up_rate": best_kept.rate if best_kept else 0,
            "at_best_kept_up": _at(best_kept)}


# --------------------------------------------------------------------------------------------------- report
def _fmt_rate(r: float | None) -> str:
    if not r:
        return "-"
    if r >= 1e6:
        return f"{r / 1e6:.2f}M"
    if r >= 1e3:
        return f"{r / 1e3:.0f}k" if r >= 1e4 else f"{r / 1e3:.1f}k"
    return f"{r:.0f}"


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, engine): medians over the rounds of the best held rate and of the latency there, and of the
    best rate kept up with at any latency."""
    rows = []
    keys = list(dict.fromkeys((r["workload"], r["engine"]) for r in runs))
    for workload, engine in keys:
        mine = [r for r in runs if (r["workload"], r["engine"]) == (workload, engine)]
        best = [r.get("max_held_rate") or 0 for r in mine]
        kept = [r.get("max_kept_up_rate") or 0 for r in mine]
        fails = [r["lowest_failing_rate"] for r in mine if r.get("lowest_failing_rate")]
        at = [r["at_best"] for r in mine if r.get("at_best")]
        at_kept = [r["at_best_kept_up"] for r in mine if r.get("at_best_kept_up")]
        rows.append({"workload": workload, "engine": engine, "guarantee": GUARANTEE[engine], "rounds": len(mine),
                     "held_rates": best, "median_held_rate": statistics.median(best) if best else 0,
                     "lowest_failing_rates": fails,
                     "median_p50_ms": _median([a["p50_ms"] for a in at if a["p50_ms"] is not None]),
                     "median_p99_ms": _median([a["p99_ms"] for a in at if a["p99_ms"] is not None]),
                     "kept_up_rates": kept, "median_kept_up_rate": statistics.median(kept) if kept else 0,
                     "kept_up_p50_ms": _median([a["p50_ms"] for a in at_kept if a["p50_ms"] is not None]),
                     "kept_up_p99_ms": _median([a["p99_ms"] for a in at_kept if a["p99_ms"] is not None]),
                     "failed": [r["failed"] for r in mine if r.get("failed")]})
    return rows


def _ms_cell(v: float | None) -> str:
    return f"{v:.0f} ms" if v is not None else "-"


def table_lines(rows: list[dict[str, Any]], settings: Settings) -> list[str]:
    out = [f"Highest input rate held at 1 s batches (median latency <= {settings.target_ms / 1000:g} s and not "
           "growing), latency produce -> visible to a read_committed consumer at that rate; and the highest rate "
           "kept up with at any latency (medians over rounds):",
           f"  {'workload':10s} {'engine':13s} {'sink':14s} {'held':>8s} {'(failing)':>11s} {'p50':>8s} {'p99':>8s}"
           f"  {'kept up':>8s} {'p50':>8s} {'p99':>8s}  held per round"]
    for r in rows:
        fails = ", ".join(_fmt_rate(f) for f in r["lowest_failing_rates"]) or "none"
        held = ", ".join(_fmt_rate(h) for h in r["held_rates"])
        out.append(f"  {r['workload']:10s} {r['engine']:13s} {r['guarantee']:14s} "
                   f"{_fmt_rate(r['median_held_rate']):>8s} {'(' + fails + ')':>11s} "
                   f"{_ms_cell(r['median_p50_ms']):>8s} {_ms_cell(r['median_p99_ms']):>8s}  "
                   f"{_fmt_rate(r['median_kept_up_rate']):>8s} {_ms_cell(r['kept_up_p50_ms']):>8s} "
                   f"{_ms_cell(r['kept_up_p99_ms']):>8s}  {held}"
                   + (f"  FAILED: {r['failed'][0]}" if r["failed"] else ""))
    for wl in WORKLOADS:
        eo = next((r for r in rows if r["workload"] == wl and r["engine"] == "dstreams-eo"), None)
        alo = next((r for r in rows if r["workload"] == wl and r["engine"] == "dstreams-alo"), None)
        if eo and alo and eo["median_held_rate"]:
            out.append(f"  {wl}: dstreams at-least-once / exactly-once held rate = "
                       f"{alo['median_held_rate'] / eo['median_held_rate']:.2f}x (target <= 1.5x)")
    return out


# ----------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str]) -> argparse.Namespace:
    d = DEFAULT_SETTINGS
    ap = argparse.ArgumentParser(prog="python -m benchmarks kafka", description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP, help=f"Kafka broker (default {DEFAULT_BOOTSTRAP})")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES), choices=ENGINES)
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every (workload, engine), interleaved")
    ap.add_argument("--start", type=int, help="first rate of every search (default: per engine and workload)")
    ap.add_argument("--rates", type=int, nargs="+", help="try exactly these rates, one step each (no search)")
    ap.add_argument("--max-rate", type=int, help="never try above this rate")
    ap.add_argument("--steps", type=int, default=d.steps, help="rates tried per search")
    ap.add_argument("--precision", type=float, default=d.precision, help="stop when failing / held <= this")
    ap.add_argument("--warmup-s", type=float, help="warm-up seconds (default: 10 for grep, 30 for wordcount)")
    ap.add_argument("--settle-s", type=float, default=d.settle_s, help="seconds at a new rate before measuring")
    ap.add_argument("--measure-s", type=float, default=d.measure_s, help="measured seconds per rate")
    ap.add_argument("--target-ms", type=float, default=d.target_ms, help="median latency a held rate stays under")
    ap.add_argument("--growth-ms", type=float, default=d.growth_ms, help="latency growth a held rate stays under")
    ap.add_argument("--abort-ms", type=float, default=d.abort_ms, help="end a step when a second's latency passes")
    ap.add_argument("--drain-timeout-s", type=float, default=d.drain_timeout_s)
    ap.add_argument("--quix-python", help="interpreter with quixstreams (default: .bench/quix-venv, made once)")
    ap.add_argument("--quix-instances", type=int, default=2, help="Quix Streams processes (one per core)")
    ap.add_argument("--quix-grace-ms", type=int, default=1000,
                    help="Quix Streams' window grace (its instances' repartitioned words arrive out of order)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    return ap.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    d = DEFAULT_SETTINGS
    warmup = dict(d.warmup_s) if args.warmup_s is None else dict.fromkeys(WORKLOADS, args.warmup_s)
    return replace(d, warmup_s=warmup, settle_s=args.settle_s, measure_s=args.measure_s, steps=args.steps,
                   precision=args.precision, target_ms=args.target_ms, growth_ms=args.growth_ms,
                   abort_ms=args.abort_ms, drain_timeout_s=args.drain_timeout_s)


def _terminated(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse_args(raw)
    settings = settings_of(args)
    # Stopped by a signal, the runs' finally blocks still stop every process they started and delete their topics
    # (SIGINT is ignored in a background job unless set back).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminated)
    if not broker_answers(args.bootstrap):
        print(f"no Kafka broker answers at {args.bootstrap}: start the project's with `bash scripts/services.sh start "
              "kafka`, or pass --bootstrap", file=sys.stderr)
        return 2
    from .__main__ import _machine

    machine = _machine()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t_all = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    pairs = [(w, e) for w in args.workloads for e in args.engines if w in SUPPORTS.get(e, WORKLOADS)]
    runs: list[dict[str, Any]] = []
    for rnd in range(args.repeat):
        for workload, engine in pairs:
            print(f"== round {rnd + 1}/{args.repeat}: {workload} on {engine} ({GUARANTEE[engine]})", flush=True)
            doc = Run(workload, engine, settings, args, f"{tag}{rnd}").execute()
            doc["round"] = rnd + 1
            doc["load_average_after"] = list(os.getloadavg())
            runs.append(doc)
    rows = aggregate(runs)
    doc = {"benchmark": "kafka", "command": "python -m benchmarks kafka " + " ".join(raw), "started": started,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": round(time.monotonic() - t_all, 1),
           "machine": machine, "bootstrap": args.bootstrap, "partitions": PARTITIONS, "record_bytes": 100,
           "settings": asdict(settings), "table": rows, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, args.out)
    print("\n".join(table_lines(rows, settings)))
    print(f"wrote {args.out} ({doc['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
