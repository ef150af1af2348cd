"""How dstreams configures a SparkContext it creates itself.

Contract: :func:`tuned_conf` returns a ``SparkConf`` with dstreams' low-latency defaults applied
*only* where the user's conf does not already set the key; :func:`create_spark_context` builds a
SparkContext from it. A SparkContext handed to ``StreamingContext(sc, ...)`` is never changed.

The two settings that matter for micro-batch latency (measured with ``python -m benchmarks.batch_overhead``;
a trivial two-task Python job in ``local[2]``):

* ``spark.python.daemon.module=dstreams.worker_daemon``: the worker daemon drops Spark's redundant
  ``pyspark.zip`` / py4j zip / spark-core jar from the workers' ``sys.path``, which otherwise cost
  60-80 ms per task (see :mod:`dstreams.worker_daemon`). Only set when the Python workers run this very
  interpreter on this machine (``local``/``local-cluster`` masters), where ``dstreams`` is importable.
* ``spark.python.unix.domain.socket.enabled=true``: JVM <-> worker traffic over a Unix socket avoids a
  ~40 ms TCP delayed-ACK stall per task.

The other entries are cosmetic for a streaming driver (no UI, no console progress bar); they did not move
the measured latency. :data:`dstreams.config.SPARK_LOCAL_DIR` (``spark.dstreams.localDir``, else
``DSTREAMS_SPARK_LOCAL_DIR``), when set, becomes ``spark.local.dir`` (unless the conf sets it), so a run's
scratch space can be isolated (note Spark's ``SPARK_LOCAL_DIRS`` env var still overrides
``spark.local.dir``); :data:`dstreams.config.SPARK_LOG_LEVEL` is the log level of a context
:func:`create_spark_context` creates.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Mapping

from pyspark import SparkConf, SparkContext

from . import config

logger = logging.getLogger(__name__)

DAEMON_MODULE_KEY = "spark.python.daemon.module"
LOCAL_DIR_ENV = config.SPARK_LOCAL_DIR.env

#: Defaults applied to a SparkContext that dstreams creates (``StreamingContext.local``).
LOW_LATENCY_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.locality.wait": "0",
    "spark.python.worker.reuse": "true",
    DAEMON_MODULE_KEY: "dstreams.worker_daemon",
    "spark.python.unix.domain.socket.enabled": "true",
}

_warned_contexts: set[int] = set()

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


def _daemon_module_applies(conf: SparkConf) -> bool:
    """``dstreams.worker_daemon`` is only known importable by this interpreter on this machine."""
    master = conf.get("spark.master") or ""
    if not master.startswith("local"):
        return False
    python = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
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


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[*]`` and ``local[N,F]``: one JVM, no speculation."""
    return master == "local" or master.startswith("local[")


def speculation_available(conf: SparkConf) -> bool:
    return not is_local_master(conf.get("spark.master", "local[*]") or "local[*]")


def _applicable_defaults(conf: SparkConf) -> dict[str, str]:
    defaults = dict(LOW_LATENCY_DEFAULTS)
    if not _daemon_module_applies(conf):
        defaults.pop(DAEMON_MODULE_KEY)
    if speculation_available(conf):
        defaults.update(SPECULATION_DEFAULTS)
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


def _warn_if_untuned(sc: SparkContext) -> None:
    if id(sc) in _warned_contexts:
        return
    conf = sc.getConf()
    missing = sorted(k for k in _applicable_defaults(conf) if not conf.contains(k))
    if missing:
        _warned_contexts.add(id(sc))
        logger.warning(
            "dstreams: reusing the running SparkContext, which lacks dstreams' low-latency settings %s "
            "(left unchanged); expect ~2x slower micro-batches. To get them, build your context with "
            "SparkContext(conf=dstreams.sparkconf.tuned_conf(master, app_name, your_conf)).",
            missing,
        )


def create_spark_context(
    master: str = "local[*]",
    app_name: str = "dstreams",
    conf: SparkConf | Mapping[str, str] | None = None,
) -> SparkContext:
    """Create (or return the running) SparkContext with :func:`tuned_conf`.

    A SparkContext that is already running is returned as is (its conf is never modified); if it lacks
    the tuning, one warning line says so and how to get it.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with SparkContext._lock:
        running = SparkContext._active_spark_context
    if running is not None:
        _warn_if_untuned(running)
        return running
    tuned = tuned_conf(master, app_name, conf)
    log_level = config.get(config.SPARK_LOG_LEVEL, tuned)  # a bad value fails before a JVM context starts
    sc = SparkContext.getOrCreate(tuned)
    sc.setLogLevel(log_level)
    return sc
