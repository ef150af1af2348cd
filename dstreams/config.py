"""Every engine setting in one place: a Spark conf key ``spark.dstreams.*``, the environment variable that
stands in for it, its type, default, validation and a one-line doc.

Contract:

* :func:`get(setting, conf)` is the setting's value: ``conf.get(setting.key)`` when ``conf`` (a
  ``SparkConf``, or anything with ``get(key)``) is given and sets the key, else
  ``conf.get(setting.spark_key)`` for a setting that Spark also has under its own name
  (``spark.streaming.*``: pyspark applications keep their conf), else ``$<setting.env>``, else
  ``setting.default``. A blank value counts as unset. A value that does not parse raises ``ValueError``
  naming where it came from (the key or the variable), what is accepted and an example value.
* The driver reads the SparkContext's conf first (:func:`active_conf` finds the running one when a caller
  has no conf at hand). Executors (Python workers) have no SparkConf: they read the environment only, so a
  setting they use (:data:`STORE_RETRY_SECONDS`, :data:`STORE_LOCK_SECONDS`) is given to them with
  ``spark.executorEnv.<VARIABLE>`` (local executors inherit the driver's environment).
* :data:`SETTINGS` lists every setting; :data:`ENVIRONMENT_ONLY` and :data:`INTERNAL` dstreams' variables
  without a conf key; :data:`STANDARD` the variables of Spark, PySpark, Java, AWS and XDG that the library
  reads (the test-only fault points are no settings: a test installs them, :mod:`dstreams.faults`).
  :func:`markdown_table` renders them all as the settings page
  (docs/reference/settings.md; ``python -m dstreams.config`` prints it).

This module imports the standard library only: executors import it, and it knows neither the api nor
recovery.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class ConfLike(Protocol):
    """What :func:`get` needs of a ``SparkConf``."""

    def get(self, key: str) -> str | None: ...


@dataclass(frozen=True)
class Setting:
    """One engine setting. ``parse`` turns a non-blank raw string into the value or raises ``ValueError``
    (its message is ignored); ``accepts`` says in words what it takes, ``example`` is a valid value."""

    key: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    accepts: str
    example: str
    doc: str
    #: Spark's own conf key for the same setting, read when ``key`` is not set (None: Spark has none).
    spark_key: str | None = None

    def error(self, source: str, raw: str) -> ValueError:
        """The error for ``raw``, read from ``source`` (the key or the variable), that does not parse."""
        keys = self.key if self.spark_key is None else f"{self.key}, else {self.spark_key}"
        return ValueError(f"{source}={raw!r} is not {self.accepts}: set it to e.g. {source}={self.example}, "
                          f"or unset it (Spark conf key {keys}, else environment variable {self.env})")


@dataclass(frozen=True)
class EnvVar:
    """An environment-only variable, listed on the settings page."""

    env: str
    default: str
    doc: str


# --- parsers ------------------------------------------------------------------------------------------

JVM_MODES = ("compiled", "off")


def _jvm_mode(raw: str) -> str:
    value = raw.strip().lower()
    if value in ("compiled", "1"):
        return "compiled"
    if value in ("off", "0"):
        return "off"
    raise ValueError(raw)


def _seconds(raw: str) -> float:
    value = float(raw)
    if math.isnan(value) or value < 0:
        raise ValueError(raw)
    return value


LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")


def _log_level(raw: str) -> str:
    value = raw.strip().upper()
    if value not in LOG_LEVELS:
        raise ValueError(raw)
    return value


def _switch(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise ValueError(raw)


def _text(raw: str) -> str:
    return raw.strip()


def _finite(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def _gain(raw: str) -> float:
    value = _finite(raw)
    if value < 0:
        raise ValueError(raw)
    return value


def _positive(raw: str) -> float:
    value = _finite(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


def _port(raw: str) -> int:
    """A TCP port number, 0 (any free port) to 65535."""
    value = int(raw.strip())
    if not 0 <= value <= 65535:
        raise ValueError(raw)
    return value


def _rate_or_unlimited(raw: str) -> float | None:
    """A rate in records per second; ``0`` (or a negative number, as Spark takes it) is no limit."""
    value = _finite(raw)
    return value if value > 0 else None


def _at_least_one(raw: str) -> int:
    """A whole number >= 1."""
    value = int(raw.strip())
    if value < 1:
        raise ValueError(raw)
    return value


def _count_or_unlimited(raw: str) -> int | None:
    """A whole number >= 0; ``0`` is no limit."""
    value = int(raw.strip())
    if value < 0:
        raise ValueError(raw)
    return value or None


# --- the settings -------------------------------------------------------------------------------------

JVM_MODE = Setting(
    key="spark.dstreams.jvm.mode",
    env="DSTREAMS_LEAN_JVM",
    default="compiled",
    parse=_jvm_mode,
    accepts="one of compiled (or 1) and off (or 0)",
    example="off",
    doc="How the driver builds the per-batch RDDs: `compiled` = one Py4J call per RDD through a JVM class "
        "compiled at start-up (falls back to PySpark's calls, with a warning, if it cannot be compiled); "
        "`off` = PySpark's own calls. Resolved per SparkContext when a StreamingContext starts.",
)

CHECKPOINT_GRAPH = Setting(
    key="spark.dstreams.checkpoint.graph",
    env="DSTREAMS_CHECKPOINT_GRAPH",
    default=True,
    parse=_switch,
    accepts="on or off",
    example="off",
    doc="With a checkpoint location, store the stream graph (your functions, cloudpickled) so that "
        "`getOrCreate` restores it without calling setupFunc, as PySpark does; a function that cannot be "
        "serialized then fails `start()`. `off`: nothing is stored and `getOrCreate` calls setupFunc on every "
        "restart (for functions that must capture driver-only objects such as an open file).",
)

STORE_RETRY_SECONDS = Setting(
    key="spark.dstreams.store.retrySeconds",
    env="DSTREAMS_STORE_RETRY_SECONDS",
    default=30.0,
    parse=_seconds,
    accepts="a number of seconds >= 0",
    example="30",
    doc="How long one checkpoint-store operation retries transient errors (0 = one attempt). Executors "
        "read the environment variable only (`spark.executorEnv.DSTREAMS_STORE_RETRY_SECONDS` on a cluster).",
)

STORE_LOCK_SECONDS = Setting(
    key="spark.dstreams.store.lockSeconds",
    env="DSTREAMS_STORE_LOCK_SECONDS",
    default=30.0,
    parse=_seconds,
    accepts="a number of seconds >= 0",
    example="30",
    doc="Local-folder checkpoint store: how long one write waits for the lock of its key's folder, held by "
        "another writer (a zombie driver frozen mid-write), before it fails with a transient error naming "
        "the holder's pid (then retried within `spark.dstreams.store.retrySeconds`). The lock is never "
        "broken: resume or kill the holder. Executors read the environment variable only.",
)

STORE_OUTAGE_SECONDS = Setting(
    key="spark.dstreams.store.outageSeconds",
    env="DSTREAMS_STORE_OUTAGE_SECONDS",
    default=900.0,
    parse=_seconds,
    accepts="a number of seconds >= 0",
    example="900",
    doc="How long the driver waits (retrying) for an unavailable store: metadata commits, file listings, "
        "sink writes and write-ahead-log blocks wait, then the driver stops with the store's error; a "
        "checkpoint write waits, then gives up (the next checkpoint cuts the lineage).",
)

SPARK_LOG_LEVEL = Setting(
    key="spark.dstreams.logLevel",
    env="DSTREAMS_SPARK_LOG_LEVEL",
    default="WARN",
    parse=_log_level,
    accepts="a Spark log level (" + ", ".join(LOG_LEVELS) + ")",
    example="WARN",
    doc="Log level set on a SparkContext that dstreams creates itself (`StreamingContext.local`, "
        "`create_spark_context`).",
)

SPARK_LOCAL_DIR = Setting(
    key="spark.dstreams.localDir",
    env="DSTREAMS_SPARK_LOCAL_DIR",
    default=None,
    parse=_text,
    accepts="a folder",
    example="/tmp/dstreams-spark",
    doc="Scratch folder (created if missing) that becomes `spark.local.dir` of a SparkContext dstreams "
        "creates, unless the conf sets `spark.local.dir` (Spark's `SPARK_LOCAL_DIRS` still overrides both).",
)

BACKPRESSURE_ENABLED = Setting(
    key="spark.dstreams.backpressure.enabled",
    spark_key="spark.streaming.backpressure.enabled",
    env="DSTREAMS_BACKPRESSURE_ENABLED",
    default=False,
    parse=_switch,
    accepts="on or off",
    example="true",
    doc="Backpressure: each rate-limited source (log sources, the socket source) adapts its rate to how fast "
        "batches are processed, with a PID estimator fed by every completed batch's records, processing delay "
        "and scheduling delay; the limit of each batch is in its metrics (`streamIdToInputInfo()` metadata).",
)

BACKPRESSURE_INITIAL_RATE = Setting(
    key="spark.dstreams.backpressure.initialRate",
    spark_key="spark.streaming.backpressure.initialRate",
    env="DSTREAMS_BACKPRESSURE_INITIAL_RATE",
    default=None,
    parse=_rate_or_unlimited,
    accepts="a number of records per second (0 = none)",
    example="10000",
    doc="With backpressure, a source's rate (records/s, all partitions) until the estimator has its first "
        "estimate (after two non-empty batches); unset: unlimited until then, apart from the static maximum.",
)

BACKPRESSURE_PID_PROPORTIONAL = Setting(
    key="spark.dstreams.backpressure.pid.proportional",
    spark_key="spark.streaming.backpressure.pid.proportional",
    env="DSTREAMS_BACKPRESSURE_PID_PROPORTIONAL",
    default=1.0,
    parse=_gain,
    accepts="a number >= 0",
    example="1.0",
    doc="Backpressure's weight of the gap between the last rate and the rate the last batch was processed at.",
)

BACKPRESSURE_PID_INTEGRAL = Setting(
    key="spark.dstreams.backpressure.pid.integral",
    spark_key="spark.streaming.backpressure.pid.integral",
    env="DSTREAMS_BACKPRESSURE_PID_INTEGRAL",
    default=0.2,
    parse=_gain,
    accepts="a number >= 0",
    example="0.2",
    doc="Backpressure's weight of the backlog (the scheduling delay, as a rate): drains a queue of batches.",
)

BACKPRESSURE_PID_DERIVED = Setting(
    key="spark.dstreams.backpressure.pid.derived",
    spark_key="spark.streaming.backpressure.pid.derived",
    env="DSTREAMS_BACKPRESSURE_PID_DERIVED",
    default=0.0,
    parse=_gain,
    accepts="a number >= 0",
    example="0.0",
    doc="Backpressure's weight of how fast the gap changes.",
)

BACKPRESSURE_PID_MIN_RATE = Setting(
    key="spark.dstreams.backpressure.pid.minRate",
    spark_key="spark.streaming.backpressure.pid.minRate",
    env="DSTREAMS_BACKPRESSURE_PID_MIN_RATE",
    default=100.0,
    parse=_positive,
    accepts="a number of records per second > 0",
    example="100",
    doc="Backpressure never lowers a source's rate below this (records/s, all partitions).",
)

SOURCE_MAX_RATE_PER_PARTITION = Setting(
    key="spark.dstreams.source.maxRatePerPartition",
    spark_key="spark.streaming.kafka.maxRatePerPartition",
    env="DSTREAMS_SOURCE_MAX_RATE_PER_PARTITION",
    default=None,
    parse=_rate_or_unlimited,
    accepts="a number of records per second (0 = no limit)",
    example="1000",
    doc="Log sources (Redis Streams, and any source that asks the input contract for its limit): at most this "
        "many records per partition per second of batch interval in a batch; the rest waits for later batches "
        "(pyspark applications that set Spark's Kafka key keep working).",
)

KAFKA_POLL_MS = Setting(
    key="spark.dstreams.kafka.pollMs",
    spark_key="spark.streaming.kafka.consumer.poll.ms",
    env="DSTREAMS_KAFKA_POLL_MS",
    default=120_000,
    parse=_at_least_one,
    accepts="a number of milliseconds >= 1",
    example="30000",
    doc="Kafka source: a range reader that gets nothing from a partition for this long fails its task (a broker "
        "down); Spark retries the task, then the batch's retries apply.",
)

KAFKA_MIN_PARTITIONS = Setting(
    key="spark.dstreams.kafka.minPartitions",
    env="DSTREAMS_KAFKA_MIN_PARTITIONS",
    default=None,
    parse=_count_or_unlimited,
    accepts="a number of tasks (0 = as many as topic-partitions with records)",
    example="8",
    doc="Kafka source: split a batch's offset ranges into at least this many tasks (larger ranges get more), as "
        "Structured Streaming's `minPartitions`; `kafkaStream(minPartitions=...)` overrides it.",
)

KAFKA_MAX_RECORDS_PER_TASK = Setting(
    key="spark.dstreams.kafka.maxRecordsPerTask",
    env="DSTREAMS_KAFKA_MAX_RECORDS_PER_TASK",
    default=None,
    parse=_count_or_unlimited,
    accepts="a number of offsets (0 = no limit)",
    example="200000",
    doc="Kafka source: a topic-partition's range larger than this is read by several tasks (consecutive pieces).",
)

RECEIVER_MAX_RATE = Setting(
    key="spark.dstreams.receiver.maxRate",
    spark_key="spark.streaming.receiver.maxRate",
    env="DSTREAMS_RECEIVER_MAX_RATE",
    default=None,
    parse=_rate_or_unlimited,
    accepts="a number of records per second (0 = no limit)",
    example="1000",
    doc="`socketTextStream`: at most this many lines per second of batch interval in a batch; received lines "
        "beyond it stay queued in the driver for later batches.",
)

FILES_MAX_FILES_PER_BATCH = Setting(
    key="spark.dstreams.files.maxFilesPerBatch",
    env="DSTREAMS_FILES_MAX_FILES_PER_BATCH",
    default=None,
    parse=_count_or_unlimited,
    accepts="a whole number >= 0 (0 = no limit)",
    example="100",
    doc="`textFileStream`/`binaryRecordsStream`: at most this many new files per batch, the first in listing "
        "order; the others go into later batches (each file still in exactly one batch, across restarts too). "
        "The streams' `maxFilesPerBatch` argument overrides it.",
)

LISTENER_BUS_CAPACITY = Setting(
    key="spark.dstreams.listenerBus.capacity",
    spark_key="spark.scheduler.listenerbus.eventqueue.capacity",
    env="DSTREAMS_LISTENER_BUS_CAPACITY",
    default=10000,
    parse=_at_least_one,
    accepts="a whole number >= 1",
    example="20000",
    doc="How many events may wait for the streaming listeners (`addStreamingListener`, the status page, the "
        "progress line); when they fall that far behind, new events are dropped, counted and reported in a warning "
        "at most once a minute. Read when the StreamingContext is created.",
)

UI_ENABLED = Setting(
    key="spark.dstreams.ui.enabled",
    env="DSTREAMS_UI_ENABLED",
    default=True,
    parse=_switch,
    accepts="on or off",
    example="false",
    doc="Run the status server in the driver while a StreamingContext is active: a live page (`/`), the same "
        "data as JSON (`/api/...`) and Prometheus metrics (`/metrics`); its URL is logged at start and is "
        "`ssc.uiWebUrl`. Like Spark's UI it binds to `SPARK_LOCAL_IP`, else all addresses.",
)

UI_PORT = Setting(
    key="spark.dstreams.ui.port",
    env="DSTREAMS_UI_PORT",
    default=4050,
    parse=_port,
    accepts="a port number from 0 to 65535",
    example="4050",
    doc="The status server's port; when it is taken, the next ones are tried (`spark.port.maxRetries`, 16 by "
        "default), as Spark does for its UI. `0`: any free port.",
)

UI_SHOW_PROGRESS = Setting(
    key="spark.dstreams.ui.showProgress",
    env="DSTREAMS_UI_SHOW_PROGRESS",
    default=None,
    parse=_switch,
    accepts="on or off",
    example="false",
    doc="The progress line on stderr while a StreamingContext runs: after each batch, one line rewritten in place "
        "(batch time, records, processing time, scheduling and total delay, the status page's URL). Unset: on "
        "when stderr is a terminal, off in logs, pipes and CI; `true` forces it on (not on a terminal: one line "
        "per update), `false` off.",
)

SIGNAL_MODES = ("graceful", "immediate", "off")


def _signal_mode(raw: str) -> str:
    value = raw.strip().lower()
    if value not in SIGNAL_MODES:
        raise ValueError(raw)
    return value


_TIME_UNITS_S = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _spark_time_seconds(raw: str) -> float:
    """A Spark time string (``30s``, ``500ms``, ``2min``, ``1h``); a bare number is milliseconds, as in Spark."""
    text = raw.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number):].strip() or "ms"
    if unit not in _TIME_UNITS_S:
        raise ValueError(raw)
    value = float(number) * _TIME_UNITS_S[unit]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(raw)
    return value


STOP_ON_SIGNAL = Setting(
    key="spark.dstreams.stopOnSignal",
    env="DSTREAMS_STOP_ON_SIGNAL",
    default="graceful",
    parse=_signal_mode,
    accepts="one of " + ", ".join(SIGNAL_MODES),
    example="immediate",
    doc="What SIGTERM and SIGINT do while a StreamingContext runs in the main thread: `graceful` stops generating "
        "batches, lets the generated ones finish and commit (outputs, metadata, checkpoints due), stops the "
        "SparkContext and exits 0 (a second signal exits at once, code 128 + the signal); `immediate` stops at "
        "once (the interrupted batch is redone on restart); `off` installs no handler. A handler the application "
        "installed before `start()` is left alone.",
)

GRACEFUL_STOP_TIMEOUT = Setting(
    key="spark.dstreams.gracefulStopTimeout",
    spark_key="spark.streaming.gracefulStopTimeout",
    env="DSTREAMS_GRACEFUL_STOP_TIMEOUT",
    default=None,
    parse=_spark_time_seconds,
    accepts="a Spark time (`30s`, `500ms`, `2min`; a bare number is milliseconds) > 0",
    example="60s",
    doc="How long a graceful stop (`ssc.stop(stopGraceFully=True)`, a signal) waits for the generated batches; "
        "unset: 10 batch intervals, at least 10 s. Past it, the batches still running are cancelled: their "
        "exactly-once outputs are redone on restart, never half-written.",
)

def _attempts(raw: str) -> int:
    value = int(raw.strip())
    if value < 1:
        raise ValueError(raw)
    return value


BATCH_FAILURE_MODES = ("auto", "stop", "dropInput")


def _spelled(*modes: str) -> Callable[[str], str]:
    """A parser of one of ``modes`` in any case (blanks around ignored), giving the mode as spelled here."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        for mode in modes:
            if value == mode.lower():
                return mode
        raise ValueError(raw)

    return parse


_failure_mode = _spelled(*BATCH_FAILURE_MODES)


BATCH_MAX_ATTEMPTS = Setting(
    key="spark.dstreams.batch.maxAttempts",
    env="DSTREAMS_BATCH_MAX_ATTEMPTS",
    default=3,
    parse=_attempts,
    accepts="a whole number >= 1",
    example="5",
    doc="How many times a failed batch is tried (the first run included) before `spark.dstreams.batch.onFailure` "
        "applies. A retry runs again the batch's outputs that had not committed (in order), after 0.5 s, 1 s, "
        "2 s, ... (at most 10 s). A failure while the batch is built (a source or a driver-side function) is "
        "retried the same way. Store outages are ridden out apart (`spark.dstreams.store.outageSeconds`).",
)

BATCH_ON_FAILURE = Setting(
    key="spark.dstreams.batch.onFailure",
    env="DSTREAMS_BATCH_ON_FAILURE",
    default="auto",
    parse=_failure_mode,
    accepts="auto, stop or dropInput",
    example="dropInput",
    doc="What happens to a batch that failed `spark.dstreams.batch.maxAttempts` times. `auto`: `stop` with a "
        "checkpoint location (a restart can run the batch again), `dropInput` without one (nothing could ever run "
        "it again: PySpark's behaviour, the error is raised by `awaitTermination()` and the stream goes on). "
        "`stop`: the context stops "
        "with the batch's error (`awaitTermination()` raises it) and the batch is left not done, so a restart with "
        "`getOrCreate` runs it again: nothing is lost. `dropInput`: the batch's input is dropped for good and the "
        "stream goes on (the outputs it had committed stay); the drop is recorded in the metadata log, counted in "
        "`/metrics` (`dstreams_batches_dropped_total`) and shown in `BatchInfo.dropped` and on the status page.",
)

ON_RECORD_ERROR = Setting(
    key="spark.dstreams.onRecordError",
    env="DSTREAMS_ON_RECORD_ERROR",
    default="fail",
    parse=_spelled("fail", "deadLetter"),
    accepts="fail or deadLetter",
    example="deadLetter",
    doc="What a record does when the function of `map`, `flatMap`, `filter`, `mapValues` or `flatMapValues` raises "
        "on it, for operators made without `onError=`. `fail`: the task fails, then the batch (its retries and "
        "`spark.dstreams.batch.onFailure` apply). `deadLetter`: the record goes to the operator's dead letters "
        "(`stream.deadLetters()`, all of a context's: `ssc.deadLetters()`), one `DeadLetter(record, operator, "
        "error, batchTime)` each, and the rest of the batch goes on. Read when the operator is defined.",
)

#: Every engine setting, in the order of the settings page.
def _sharing(raw: str) -> str:
    value = raw.strip().lower()
    if value in ("auto", "1", "on", "true"):
        return "auto"
    if value in ("off", "0", "false"):
        return "off"
    raise ValueError(raw)


def _one_of(*values: str) -> Callable[[str], str]:
    """A parser of one of ``values`` (any case, surrounding blanks ignored)."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in values:
            raise ValueError(raw)
        return value

    return parse


_state_store = _one_of("auto", "rdd", "executor")


STATE_STORE = Setting(
    key="spark.dstreams.state.store",
    env="DSTREAMS_STATE_STORE",
    default="auto",
    parse=_state_store,
    accepts="auto, rdd or executor",
    example="executor",
    doc="Where the stateful operators keep their state. `rdd`: a cached RDD rebuilt every batch (fastest for "
        "small state; a batch costs the whole state). `executor`: a versioned store per state partition on the "
        "executor's disk (SQLite): a batch reads and writes only the keys it touches, and checkpoints write the "
        "keys changed since the previous one. `auto` (the default): `runningReduce`, "
        "`updateStateByKey(..., updateIdleKeys=False)`, `track`, the incremental windows, the event-time windows and "
        "`sessionWindow` start on the RDD state and move into the executor store once the state is large next to "
        "what a batch touches (`spark.dstreams.state.autoKeys`); see the guide's \"Large state\" page. "
        "Read when the operator is defined: a restart runs the graph stored in its checkpoint, "
        "built under the value it was written with (with "
        "`spark.dstreams.checkpoint.graph=off` a graph rebuilt under another value is another graph, and the "
        "error names the value to set).",
)

STATE_AUTO_KEYS = Setting(
    key="spark.dstreams.state.autoKeys",
    env="DSTREAMS_STATE_AUTO_KEYS",
    default=100_000,
    parse=_at_least_one,
    accepts="a whole number >= 1",
    example="1000000",
    doc="With `spark.dstreams.state.store=auto`: the fewest keys of state at which a stream moves from the RDD "
        "state into the executor state store (it moves once it also holds at least 10 times the keys one of its "
        "last 10 batches touched, the largest of them left out; it does not move back).",
)

STATE_LOCAL_DIR = Setting(
    key="spark.dstreams.state.localDir",
    env="DSTREAMS_STATE_LOCAL_DIR",
    default=None,
    parse=_text,
    accepts="a folder",
    example="/var/tmp/dstreams-state",
    doc="Folder of the executor state stores (`spark.dstreams.state.store=executor`) on every executor; default "
        "`dstreams-state` in the system's temporary folder. Local disk: the stores are rebuilt from checkpoints "
        "when it is lost.",
)

STATE_SNAPSHOT_EVERY = Setting(
    key="spark.dstreams.state.snapshotEvery",
    env="DSTREAMS_STATE_SNAPSHOT_EVERY",
    default=10,
    parse=_at_least_one,
    accepts="a whole number >= 1",
    example="5",
    doc="With the executor state store, every how many checkpoints a stream writes its whole state (a "
        "snapshot); the others write the keys changed since the previous checkpoint. A read-back reads the "
        "newest snapshot and the changes after it.",
)


STATE_CHANGELOG = Setting(
    key="spark.dstreams.state.changelog",
    env="DSTREAMS_STATE_CHANGELOG",
    default="auto",
    parse=_one_of("auto", "on", "off"),
    accepts="auto, on or off",
    example="on",
    doc="With the executor state store and a checkpoint location: `on` writes each batch's changes of each state "
        "partition to the checkpoint location (`changelogs/`, one object per partition and batch), so that a task "
        "that runs on another host than its partition's store (or finds the store lost or behind) brings a store "
        "there up to date from the newest checkpoint and the changes after it, instead of failing the batch "
        "(whose retry then rebuilds the store through lineage). `auto` (the default): `on` under a cluster master "
        "(`spark://`, `yarn`, `k8s://`...), `off` under `local` and `local-cluster`, whose executors share one "
        "disk. See the guide's \"Large state\" page.",
)


STATE_REPLICAS = Setting(
    key="spark.dstreams.state.replicas",
    env="DSTREAMS_STATE_REPLICAS",
    default="auto",
    parse=_one_of("auto", "1", "2"),
    accepts="auto, 1 or 2",
    example="1",
    doc="On how many executors each partition of a state's cached RDDs is kept: the RDD state's, an incremental "
        "window's (`reduceByKeyAndWindow` with an inverse function) and the executor state store's handles. `2` "
        "(what `auto`, the default, means under a cluster master, `local-cluster` included): a lost executor or "
        "host leaves every partition readable from its other copy, so the batch that meets the loss recomputes "
        "nothing of the state (a copy of each state partition per batch over the network, and the RDD state twice "
        "in memory). `1` (always under `local`/`local[N]`, one process): a lost partition is recomputed through "
        "lineage from the newest checkpoint, one nested task per batch since it (the paper's recovery; up to "
        "about 2.5 s more for that batch with 10 s checkpoints on the three-host test cluster). See the guide's "
        "\"Running on a cluster\" page. Read when the operator is defined.",
)


CLASS_DATA_SHARING = Setting(
    key="spark.dstreams.jvm.classDataSharing",
    env="DSTREAMS_CLASS_DATA_SHARING",
    default="auto",
    parse=_sharing,
    accepts="auto or off",
    example="off",
    doc="`auto`: a driver JVM that dstreams' conf starts (`tuned_conf`, `StreamingContext.local`, "
        "`create_spark_context`) maps the class-data-sharing archive that `python -m dstreams.spark.jvm_cds` built "
        "for this Java and pyspark, when there is one (a driver starts about a third faster); `off`: never. "
        "The archive lives in `DSTREAMS_CACHE_DIR` (default `~/.cache/dstreams`).",
)

SETTINGS: tuple[Setting, ...] = (JVM_MODE, CLASS_DATA_SHARING, CHECKPOINT_GRAPH, STORE_RETRY_SECONDS,
                                 STORE_LOCK_SECONDS, STORE_OUTAGE_SECONDS, SPARK_LOG_LEVEL,
                                 SPARK_LOCAL_DIR, SOURCE_MAX_RATE_PER_PARTITION, KAFKA_POLL_MS, KAFKA_MIN_PARTITIONS,
                                 KAFKA_MAX_RECORDS_PER_TASK, RECEIVER_MAX_RATE,
                                 FILES_MAX_FILES_PER_BATCH, BACKPRESSURE_ENABLED, BACKPRESSURE_INITIAL_RATE,
                                 BACKPRESSURE_PID_PROPORTIONAL, BACKPRESSURE_PID_INTEGRAL, BACKPRESSURE_PID_DERIVED,
                                 BACKPRESSURE_PID_MIN_RATE, LISTENER_BUS_CAPACITY, UI_ENABLED, UI_PORT,
                                 UI_SHOW_PROGRESS,
                                 STOP_ON_SIGNAL,
                                 GRACEFUL_STOP_TIMEOUT, BATCH_MAX_ATTEMPTS, BATCH_ON_FAILURE, ON_RECORD_ERROR,
                                 STATE_STORE, STATE_AUTO_KEYS, STATE_LOCAL_DIR, STATE_SNAPSHOT_EVERY,
                                 STATE_CHANGELOG, STATE_REPLICAS)

# --- reading ------------------------------------------------------------------------------------------


def lookup(setting: Setting, conf: ConfLike | None = None,
           environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(source, raw value)`` of the first non-blank of ``conf``'s key, ``conf``'s Spark key and the
    environment variable (``source`` is the key or the variable's name), or None when none sets it."""
    if conf is not None:
        for key in (setting.key, setting.spark_key):
            raw = conf.get(key) if key is not None else None
            if key is not None and raw is not None and str(raw).strip():
                return key, str(raw)
    raw = (os.environ if environ is None else environ).get(setting.env)
    if raw is not None and raw.strip():
        return setting.env, raw
    return None


def parse(setting: Setting, source: str, raw: str) -> Any:
    """``raw`` (read from ``source``) parsed for ``setting``; a clear ``ValueError`` when it does not parse."""
    try:
        return setting.parse(raw)
    except ValueError:
        raise setting.error(source, raw) from None


def get(setting: Setting, conf: ConfLike | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """The value of ``setting``: ``conf.get(key)``, else the environment variable, else the default."""
    found = lookup(setting, conf, environ)
    if found is None:
        return setting.default
    return parse(setting, *found)


def active_conf() -> ConfLike | None:
    """The conf of the SparkContext running in this process (the driver), or None (an executor, or no
    context yet). Never imports PySpark itself."""
    pyspark_context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    spark_context = getattr(pyspark_context, "SparkContext", None)
    sc = getattr(spark_context, "_active_spark_context", None)
    if sc is None or getattr(sc, "_jsc", None) is None:
        return None
    return getattr(sc, "_conf", None)


# --- documentation ------------------------------------------------------------------------------------


def _default_text(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"

#: Settings read from the environment only (they are needed where no SparkConf exists).
ENVIRONMENT_ONLY: tuple[EnvVar, ...] = (
    EnvVar("DSTREAMS_CACHE_DIR", "", "Where `python -m dstreams.spark.jvm_cds` puts the driver JVM's "
           "class-data-sharing archive and where drivers look for it (default `$XDG_CACHE_HOME/dstreams`, "
           "else `~/.cache/dstreams`)."),
)

#: Environment variables dstreams sets for its own processes (not user settings), listed for completeness.
INTERNAL: tuple[EnvVar, ...] = (
    EnvVar("DSTREAMS_WORKER_PRELOAD", "", "Set by dstreams in the Python workers' environment: modules its worker "
           "daemon imports before forking (the S3 store when checkpoints are on S3)."),
)


#: Other tools' environment variables (Spark, PySpark, Java, AWS, XDG) that dstreams reads too.
STANDARD: tuple[EnvVar, ...] = (
    EnvVar("SPARK_LOCAL_IP", "", "Spark's bind address; the status server binds to it too (else all addresses). "
           "`StreamingContext.local` and `create_spark_context` set it to `127.0.0.1` when it is unset."),
    EnvVar("SPARK_PUBLIC_DNS", "", "Spark's public host name: the host of the status server's URL (`ssc.uiWebUrl`), "
           "as in Spark's UI."),
    EnvVar("PYSPARK_PYTHON", "", "PySpark's worker interpreter. When unset, dstreams' conf (`tuned_conf`) sets "
           "`spark.pyspark.python` to this interpreter and exports it here (outside `spark-submit`); in local mode "
           "dstreams' worker daemon is used only when the workers run this interpreter."),
    EnvVar("PYSPARK_GATEWAY_PORT", "", "Set by `spark-submit`: the driver JVM already runs, so dstreams reads its "
           "`spark.*` properties as the user's conf and neither maps a class-data-sharing archive nor exports "
           "`PYSPARK_PYTHON`."),
    EnvVar("JAVA_HOME", "", "The Java that Spark's launcher runs (else `java` on `PATH`): the class-data-sharing "
           "archive is built and looked up for it."),
    EnvVar("XDG_CACHE_HOME", "", "The default parent of `DSTREAMS_CACHE_DIR` (`$XDG_CACHE_HOME/dstreams`, else "
           "`~/.cache/dstreams`)."),
    EnvVar("AWS_ENDPOINT_URL_S3", "", "The S3-compatible endpoint of `s3://` locations when `storeOptions` name no "
           "`endpoint_url` (boto3's variable; it wins over `AWS_ENDPOINT_URL`). Credentials and region come from "
           "boto3's own chain (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, ...)."),
    EnvVar("AWS_ENDPOINT_URL", "", "The endpoint of `s3://` locations when neither `storeOptions` nor "
           "`AWS_ENDPOINT_URL_S3` name one (boto3's variable)."),
    EnvVar("SPARK_EXECUTOR_ID", "", "Set by Spark on some executors: the executor a Python task runs on, for the "
           "test-only straggler fault (`dstreams.faults`; else the executor JVM's `--executor-id`)."),
    EnvVar("SPARK_LOG_URL_STDERR", "", "Set by standalone workers: its `executorId=` names the executor when "
           "nothing else does (for the test-only straggler fault)."),
    EnvVar("SPARK_LOG_URL_STDOUT", "", "As `SPARK_LOG_URL_STDERR`, read after it."),
)


def markdown_table() -> str:
    """The settings page (docs/reference/settings.md): every setting, the environment-only and internal variables, the
    other tools' variables dstreams reads."""
    rows = ["| Spark conf key | environment variable | default | what it does |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        doc = s.doc if s.spark_key is None else f"{s.doc} Spark's key `{s.spark_key}` counts when this one is unset."
        rows.append(f"| `{s.key}` | `{s.env}` | {_default_text(s.default)} | {doc} |")
    for v in (*ENVIRONMENT_ONLY, *INTERNAL, *STANDARD):
        rows.append(f"| (none) | `{v.env}` | {_default_text(v.default or None)} | {v.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
