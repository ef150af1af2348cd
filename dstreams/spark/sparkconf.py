"""How dstreams configures a SparkContext it creates itself.

Contract: :func:`tuned_conf` returns a ``SparkConf`` with dstreams' low-latency defaults applied
*only* where the user's conf does not already set the key; :func:`create_spark_context` builds a
SparkContext from it. A SparkContext the user built and handed to ``StreamingContext(sc, ...)`` gets,
through :func:`tune_running_context`, the defaults it lacks that Spark still reads after the context
started (see :data:`LAZY_IN_LOCAL_MODE`, :data:`LAZY_ON_THE_DRIVER`); the others, read only while a
context starts, are named in one warning line with the ``--conf`` flags that set them. Keys the user
set are never changed.

The two settings that matter for micro-batch latency (measured with ``python -m benchmarks.batch_overhead``;
a trivial two-task Python job in ``local[2]``):

* ``spark.python.daemon.module=dstreams.spark.worker_daemon``: the worker daemon drops Spark's redundant
  ``pyspark.zip`` / py4j zip / spark-core jar from the workers' ``sys.path``, which otherwise cost
  60-80 ms per task (see :mod:`dstreams.spark.worker_daemon`). Only set when the Python workers run this very
  interpreter on this machine (``local``/``local-cluster`` masters), where ``dstreams`` is importable.
* ``spark.python.unix.domain.socket.enabled=true``: JVM <-> worker traffic over a Unix socket avoids a
  ~40 ms TCP delayed-ACK stall per task.

The other entries are cosmetic for a streaming driver (no UI, no console progress bar); they did not move
the measured latency. Off ``local``/``local[N]`` masters two more groups apply: speculation
(:data:`SPECULATION_DEFAULTS`) and the timeouts that bound how long a frozen host holds a batch up
(:data:`FROZEN_HOST_DEFAULTS`, :func:`frozen_host_defaults`).
:data:`dstreams.config.SPARK_LOCAL_DIR` (``spark.dstreams.localDir``, else ``DSTREAMS_SPARK_LOCAL_DIR``), when set,
becomes ``spark.local.dir`` (unless the conf sets it), so a run's
scratch space can be isolated (note Spark's ``SPARK_LOCAL_DIRS`` env var still overrides
``spark.local.dir``); :data:`dstreams.config.SPARK_LOG_LEVEL` is the log level of a context
:func:`create_spark_context` creates. When this process is about to start its driver JVM and a
class-data-sharing archive was built (:mod:`dstreams.spark.jvm_cds`), the JVM maps it (a faster start).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark import SparkConf, SparkContext

from .. import config
from . import jvm_cds

logger = logging.getLogger(__name__)

DAEMON_MODULE_KEY = "spark.python.daemon.module"
LOCAL_DIR_ENV = config.SPARK_LOCAL_DIR.env

#: Defaults applied to a SparkContext that dstreams creates (``StreamingContext.local``).
LOW_LATENCY_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.locality.wait": "0",
    "spark.python.worker.reuse": "true",
    DAEMON_MODULE_KEY: "dstreams.spark.worker_daemon",
    "spark.python.unix.domain.socket.enabled": "true",
}

#: Contexts :func:`tune_running_context` has logged about (once per context).
_warned_contexts: weakref.WeakSet[SparkContext] = weakref.WeakSet()

UDS_KEY = "spark.python.unix.domain.socket.enabled"
UDS_DIR_KEY = "spark.python.unix.domain.socket.dir"
#: Longest folder in which PySpark's ``.<uuid4>.sock`` socket names still fit a Unix socket path
#: (at most 107 bytes on Linux): longer ones fail at start-up with "AF_UNIX path too long".
MAX_SOCKET_DIR = 107 - len("/.00000000-0000-0000-0000-000000000000.sock")
_JAVA_TMPDIR = re.compile(r"-Djava\.io\.tmpdir=(\S+)")


def _same_interpreter(python: str | None) -> bool:
    """Whether the worker interpreter ``python`` (None: this one) is ``sys.executable``."""
    if not python:
        return True
    resolved = shutil.which(python) or python
    try:
        return os.path.samefile(resolved, sys.executable)
    except OSError:
        return os.path.realpath(resolved) == os.path.realpath(sys.executable)


def _daemon_module_applies(conf: SparkConf, python: str | None = None) -> bool:
    """``dstreams.spark.worker_daemon`` is only known importable by this interpreter on this machine.

    ``python`` is the workers' interpreter when known (a running context's ``pythonExec``); else the
    conf's ``spark.pyspark.python`` or ``PYSPARK_PYTHON``.
    """
    master = conf.get("spark.master") or ""
    if not master.startswith("local"):
        return False
    python = python or conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    return _same_interpreter(python)


#: Speculative re-execution of stragglers as in the D-Streams paper: a task 1.4x slower than the
#: median of its stage (once half of the stage's tasks finished) is copied to another executor, after
#: a minimum runtime suited to sub-second batches. Applied when the master is not ``local``/``local[N]``
#: (Spark never speculates there).
SPECULATION_DEFAULTS: dict[str, str] = {
    "spark.speculation": "true",
    "spark.speculation.multiplier": "1.4",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "100ms",
    "spark.speculation.interval": "50ms",
}


#: How long a host that stops answering (SIGSTOP, a long GC pause, a hung disk, a network partition) can hold a
#: streaming job up, bounded (docs/guide/cluster.md, "A frozen host"). With Spark's own values a frozen executor is
#: declared lost only after its heartbeat timeout (``spark.network.timeout``, 120 s) *and* the next check of it
#: (``spark.network.timeoutInterval``, every 60 s), and until then every fetch of a cached block or a shuffle block
#: from it waits ``spark.shuffle.io.connectionTimeout`` (120 s) per try, 1 + ``spark.shuffle.io.maxRetries`` (3)
#: tries ``spark.shuffle.io.retryWait`` (5 s) apart: about 8 minutes for one fetch. With these the executor is
#: declared lost 30-35 s after its last heartbeat and a fetch from it gives up after 3 x 10 s + 2 x 1 s; a killed
#: host's refused connections cost 2 s of retries instead of 15. ``spark.rpc.askTimeout`` bounds the driver's
#: blocking calls to it (a blocking unpersist asks every executor). Applied, like speculation, when the master is
#: not ``local``/``local[N]``; a key the user sets wins, and a user's ``spark.network.timeout`` (the fallback of
#: the heartbeat, connection and ask timeouts in Spark) keeps governing those three.
FROZEN_HOST_DEFAULTS: dict[str, str] = {
    "spark.executor.heartbeatInterval": "3s",
    "spark.storage.blockManagerHeartbeatTimeoutMs": "30s",
    "spark.network.timeoutInterval": "5s",
    "spark.shuffle.io.connectionTimeout": "10s",
    "spark.shuffle.io.maxRetries": "2",
    "spark.shuffle.io.retryWait": "1s",
    "spark.rpc.askTimeout": "30s",
}
#: Keys of :data:`FROZEN_HOST_DEFAULTS` whose Spark default is ``spark.network.timeout``.
_FALL_BACK_TO_NETWORK_TIMEOUT = frozenset(
    {"spark.storage.blockManagerHeartbeatTimeoutMs", "spark.shuffle.io.connectionTimeout", "spark.rpc.askTimeout"})
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)


def spark_time_ms(value: str | None, default_unit: str) -> float | None:
    """A Spark time setting (``"30s"``, ``"2min"``, ``"500"`` in ``default_unit``) in ms; None if not one (or None)."""
    m = _TIME.match(value or "")
    if m is None:
        return None
    return float(m.group(1)) * _TIME_UNITS_MS[(m.group(2) or default_unit).lower()]


def frozen_host_defaults(conf: SparkConf) -> dict[str, str]:
    """The entries of :data:`FROZEN_HOST_DEFAULTS` that suit ``conf`` (whatever it sets itself is still left out by
    the caller): none of the network-timeout fallbacks when it sets ``spark.network.timeout``, and the heartbeat
    interval and check interval only where they stay within the executors' timeout that results (Spark refuses to
    start otherwise)."""
    out = dict(FROZEN_HOST_DEFAULTS)
    if conf.contains("spark.network.timeout"):
        for key in _FALL_BACK_TO_NETWORK_TIMEOUT:
            out.pop(key)
    if conf.contains("spark.storage.blockManagerHeartbeatTimeoutMs"):
        timeout = spark_time_ms(conf.get("spark.storage.blockManagerHeartbeatTimeoutMs"), "ms")
    elif conf.contains("spark.network.timeout"):
        timeout = spark_time_ms(conf.get("spark.network.timeout"), "s")
    else:
        timeout = spark_time_ms(out["spark.storage.blockManagerHeartbeatTimeoutMs"], "ms")
    for key in ("spark.executor.heartbeatInterval", "spark.network.timeoutInterval"):
        wanted = spark_time_ms(out[key], "ms")
        if timeout is not None and wanted is not None and wanted > timeout:
            out.pop(key)
    return out


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[*]`` and ``local[N,F]``: one JVM, no speculation."""
    return master == "local" or master.startswith("local[")


def speculation_available(conf: SparkConf) -> bool:
    return not is_local_master(conf.get("spark.master", "local[*]") or "local[*]")


def _applicable_defaults(conf: SparkConf, python: str | None = None) -> dict[str, str]:
    defaults = dict(LOW_LATENCY_DEFAULTS)
    if not _daemon_module_applies(conf, python):
        defaults.pop(DAEMON_MODULE_KEY)
    if speculation_available(conf):
        defaults.update(SPECULATION_DEFAULTS)
        defaults.update(frozen_host_defaults(conf))
    return defaults


def _jvm_properties_are_users() -> bool:
    """Whether the driver JVM's ``spark.*`` system properties express the user's configuration."""
    return SparkContext._gateway is None or "PYSPARK_GATEWAY_PORT" in os.environ


def _export_worker_python(conf: SparkConf) -> None:
    """Make ``spark.pyspark.python`` effective for a SparkContext created in this process.

    PySpark's in-process SparkContext takes its worker interpreter from the ``PYSPARK_PYTHON`` environment
    variable only (default ``python3`` from ``PATH``, often another interpreter without pyspark); the conf
    key is honoured by ``spark-submit`` alone. So when the variable is unset, it is exported from the conf.
    """
    python = conf.get("spark.pyspark.python")
    if python and "PYSPARK_PYTHON" not in os.environ and "PYSPARK_GATEWAY_PORT" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = python


def tuned_conf(
    master: str = "local[*]",
    app_name: str = "dstreams",
    conf: SparkConf | Mapping[str, str] | None = None,
) -> SparkConf:
    """A SparkConf for ``master`` with dstreams' defaults where ``conf`` leaves a key unset.

    Precedence: ``conf`` > ``spark.*`` JVM system properties (only under ``spark-submit``) > ``master`` /
    ``app_name`` > dstreams' defaults. When this process launched the JVM itself (pyspark's in-process
    gateway), its system properties are the *first* SparkContext's conf (master, app name, ...), not the
    user's, so they are not loaded: a second context gets the master asked for.

    Side effect: outside ``spark-submit``, an unset ``PYSPARK_PYTHON`` is exported from
    ``spark.pyspark.python`` (this interpreter unless ``conf`` names another), because PySpark's
    in-process SparkContext reads the worker interpreter from that variable only.
    """
    if "PYSPARK_GATEWAY_PORT" in os.environ and SparkContext._jvm is None:
        # Under spark-submit the JVM already runs with the user's --master/--conf as system properties,
        # but a SparkConf made before PySpark connects to it is a bare dict that cannot load them (the
        # master would silently become ``master``'s default): connect first. Cheap, and only here.
        SparkContext._ensure_initialized()
    out = SparkConf(loadDefaults=_jvm_properties_are_users())
    if isinstance(conf, SparkConf):
        for k, v in conf.getAll():
            out.set(k, v)
    elif conf is not None:
        for k, v in conf.items():
            out.set(k, str(v))
    if not out.contains("spark.master"):
        out.setMaster(master)
    if not out.contains("spark.app.name"):
        out.setAppName(app_name)
    if not out.contains("spark.pyspark.python") and "PYSPARK_PYTHON" not in os.environ:
        out.set("spark.pyspark.python", sys.executable)
    _export_worker_python(out)
    for k, v in _applicable_defaults(out).items():
        if not out.contains(k):
            out.set(k, v)
    local_dir = config.get(config.SPARK_LOCAL_DIR, out)
    if local_dir and not out.contains("spark.local.dir"):
        os.makedirs(local_dir, exist_ok=True)
        out.set("spark.local.dir", local_dir)
    _fit_socket_dir(out)
    jvm_cds.apply(out)
    return out


def _fit_socket_dir(conf: SparkConf) -> None:
    """Keep Unix-domain sockets startable when the JVMs' ``java.io.tmpdir`` is a long path.

    Without ``spark.python.unix.domain.socket.dir``, PySpark puts its sockets in the JVM's
    ``java.io.tmpdir``; past :data:`MAX_SOCKET_DIR` characters the SparkContext fails to start. Then the
    sockets go to ``/tmp`` (their names are random, as in Java's default temporary folder), or, where
    ``/tmp`` is not writable, Unix sockets are turned off (TCP instead: a few ms more per task). A
    socket folder the user set is left alone.
    """
    if conf.get(UDS_KEY, "false").lower() != "true" or conf.contains(UDS_DIR_KEY):
        return
    tmpdirs = []
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        found = _JAVA_TMPDIR.findall(conf.get(key, "") or "")
        if found:
            tmpdirs.append(found[-1])
    if all(len(d) <= MAX_SOCKET_DIR for d in tmpdirs):
        return
    if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
        conf.set(UDS_DIR_KEY, "/tmp")
        logger.info("dstreams: java.io.tmpdir is too long for Unix socket paths; sockets go to /tmp")
    else:
        conf.set(UDS_KEY, "false")
        logger.warning("dstreams: java.io.tmpdir is too long for Unix socket paths and /tmp is not writable: "
                       "Python workers talk to the JVM over TCP (set %s to a short folder to keep them)",
                       UDS_DIR_KEY)


#: Read by Spark for every Python task, or when a Python worker pool starts, from the ``SparkEnv``'s conf,
#: which under a ``local``/``local[N]`` master *is* the running SparkContext's conf (one JVM): setting
#: them on a running local context takes effect from its next Python task. ``BasePythonRunner`` reads
#: the daemon module and worker reuse per task (the worker pools are keyed by the daemon module, so a
#: new module starts a new daemon even after Python tasks ran); ``PythonWorkerFactory`` reads the Unix
#: socket settings when a pool starts. Under other masters the executors copied the conf when they
#: registered, so these need ``--conf``.
LAZY_IN_LOCAL_MODE: frozenset[str] = frozenset(
    {DAEMON_MODULE_KEY, UDS_KEY, UDS_DIR_KEY, "spark.python.worker.reuse"})

#: Read by the driver's scheduler for every task set (``TaskSetManager.getLocalityWait``): settable on a
#: running context under any master.
LAZY_ON_THE_DRIVER: frozenset[str] = frozenset({"spark.locality.wait"})

#: Defaults never reported missing: Spark's own default already is dstreams' value
#: (``spark.python.worker.reuse``), or the setting is cosmetic and did not move the measured batch
#: latency (the UI, the console progress bar; read only when the context starts).
NOT_REPORTED: frozenset[str] = frozenset(
    {"spark.python.worker.reuse", "spark.ui.enabled", "spark.ui.showConsoleProgress"})


@dataclass(frozen=True)
class RunningContextTuning:
    """What :func:`tune_running_context` did to a running SparkContext.

    ``applied``: dstreams' defaults the context lacked, set on its live conf (effective from the next
    task). ``missing``: defaults it lacks that Spark reads only while a context starts (or, under a
    cluster master, while executors start): they must be passed when the context is created.
    """

    applied: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def conf_flags(self) -> str:
        """The ``--conf key=value`` flags (``spark-submit``/``pyspark``) that set :attr:`missing`."""
        return " ".join(f"--conf {k}={v}" for k, v in sorted(self.missing.items()))

    def missing_line(self, master: str) -> str | None:
        """The one warning line naming :attr:`missing` and the flags to pass (None: nothing missing)."""
        if not self.missing:
            return None
        return (f"dstreams: this SparkContext (master {master}) was started without settings Spark reads only "
                f"when a context or its executors start, so they cannot be applied now: "
                f"{', '.join(sorted(self.missing))}; expect slower micro-batches. Create the context with "
                f"{self.conf_flags()} (spark-submit/pyspark flags; or set them on its SparkConf, or use "
                f"dstreams.spark.sparkconf.tuned_conf / StreamingContext.local)")


def plan_running_context(
    conf: SparkConf,
    *,
    python_exec: str | None,
    python_workers_started: bool,
    java_tmpdir: str | None,
) -> RunningContextTuning:
    """Which of dstreams' defaults a running context with ``conf`` lacks, split into settable and missing.

    Pure. A default is considered only when ``conf`` leaves its key unset and it is not in
    :data:`NOT_REPORTED`. ``python_exec``: the workers' interpreter (``sc.pythonExec``), which decides
    whether the daemon module applies at all. ``python_workers_started``: whether the context already
    started a Python worker pool; the Unix-socket switch is read when a pool starts, so it is settable
    only for a new pool: before the first Python task, or when the daemon module changes too (pools are
    keyed by it). ``java_tmpdir``: the JVM's ``java.io.tmpdir``, where sockets go by default; when it is
    too long for a socket path, sockets go to ``/tmp`` (or stay TCP when that is not writable).
    """
    master = conf.get("spark.master", "") or ""
    wanted = {k: v for k, v in _applicable_defaults(conf, python_exec).items()
              if k not in NOT_REPORTED and not conf.contains(k)}
    settable = LAZY_ON_THE_DRIVER | (LAZY_IN_LOCAL_MODE if is_local_master(master) else frozenset())
    applied = {k: v for k, v in wanted.items() if k in settable}
    missing = {k: v for k, v in wanted.items() if k not in settable}
    if UDS_KEY in applied and python_workers_started and DAEMON_MODULE_KEY not in applied:
        missing[UDS_KEY] = applied.pop(UDS_KEY)
    if UDS_KEY in applied and not conf.contains(UDS_DIR_KEY) and len(java_tmpdir or "") > MAX_SOCKET_DIR:
        if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
            applied[UDS_DIR_KEY] = "/tmp"
        else:
            del applied[UDS_KEY]  # TCP, as tuned_conf falls back to
    return RunningContextTuning(applied, missing)


def _python_workers_started(sc: SparkContext) -> bool:
    """Whether this driver JVM's ``SparkEnv`` already started a Python worker pool (one Py4J call)."""
    # Ignored for mypy: PySpark's private _jvm is Optional in its stubs; it is set while a context runs.
    return int(sc._jvm.org.apache.spark.SparkEnv.get().pythonWorkers().size()) > 0  # type: ignore[union-attr]


def _java_tmpdir(sc: SparkContext) -> str | None:
    # Ignored for mypy: PySpark's private _jvm is Optional in its stubs; it is set while a context runs.
    return sc._jvm.java.lang.System.getProperty("java.io.tmpdir")  # type: ignore[union-attr]


def tune_running_context(sc: SparkContext) -> RunningContextTuning:
    """Give a SparkContext the user built the low-latency settings Spark still honours once it runs.

    Sets :attr:`RunningContextTuning.applied` on the context's live conf (``sc._conf`` wraps the JVM
    SparkContext's own ``SparkConf``, which a local master's executor reads per task) and logs it at
    INFO; logs :meth:`RunningContextTuning.missing_line` once per context at WARNING. Keys the context
    sets are left alone. A context :func:`create_spark_context` made has everything: no Py4J call beyond
    reading its conf, nothing logged. Idempotent.
    """
    # The live conf, not sc.getConf(): that copy also loads the JVM's spark.* system properties, which in
    # a process that launched its own JVM are the first context's conf, not this one's.
    conf = sc._conf
    master = conf.get("spark.master", "") or ""
    python = getattr(sc, "pythonExec", None)
    unset = {k for k in _applicable_defaults(conf, python) if k not in NOT_REPORTED and not conf.contains(k)}
    if not unset:
        return RunningContextTuning()
    local_uds = is_local_master(master) and UDS_KEY in unset
    plan = plan_running_context(
        conf,
        python_exec=python,
        python_workers_started=local_uds and DAEMON_MODULE_KEY not in unset and _python_workers_started(sc),
        java_tmpdir=_java_tmpdir(sc) if local_uds else None,
    )
    for k, v in plan.applied.items():
        sc._conf.set(k, v)
    if sc in _warned_contexts:
        return plan
    _warned_contexts.add(sc)
    if plan.applied:
        logger.info("dstreams: applied to the running SparkContext (Spark reads them per task): %s",
                    ", ".join(f"{k}={v}" for k, v in sorted(plan.applied.items())))
    line = plan.missing_line(master)
    if line:
        logger.warning("%s", line)
    return plan


def create_spark_context(
    master: str = "local[*]",
    app_name: str = "dstreams",
    conf: SparkConf | Mapping[str, str] | None = None,
) -> SparkContext:
    """Create (or return the running) SparkContext with :func:`tuned_conf`.

    A SparkContext that is already running is returned with :func:`tune_running_context` applied (the
    defaults Spark still reads; one warning line names the ones it cannot take any more).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with SparkContext._lock:
        running = SparkContext._active_spark_context
    if running is not None:
        tune_running_context(running)
        return running
    tuned = tuned_conf(master, app_name, conf)
    log_level = config.get(config.SPARK_LOG_LEVEL, tuned)  # a bad value fails before a JVM context starts
    sc = SparkContext.getOrCreate(tuned)
    sc.setLogLevel(log_level)
    return sc
