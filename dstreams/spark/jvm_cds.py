"""A class-data-sharing (CDS) archive of the driver JVM's classes: a driver starts about a third faster.

A restarted driver (after a kill, a deploy, a failover) spends most of its first seconds starting the JVM:
loading and verifying the ~10,000 classes of Spark, Scala and Py4J it needs. A dynamic CDS archive
(JDK 13+: ``-XX:ArchiveClassesAtExit`` when made, ``-XX:SharedArchiveFile`` when used) maps those classes,
already parsed and verified, from one file.

Contract:

* :func:`build` makes the archive for this machine's Java and pyspark: it runs a short driver (a Python
  job, a shuffle, two micro-batches of a StreamingContext, so the classes a dstreams driver loads are in
  it) in a process group of its own, waits until its JVM has exited (the JVM writes the archive as it
  exits), checks the file and moves it into place atomically. Older archives of the same pyspark
  installation are removed, and half-written ones whose builder died.
  ``python -m dstreams.spark.jvm_cds`` runs it (``--force`` rebuilds).
* :func:`archive_path` is the archive's place: ``$DSTREAMS_CACHE_DIR`` (default ``~/.cache/dstreams``), a
  name keyed by the place of pyspark's jars (each installation, e.g. each virtualenv, has its own archive:
  the JVM accepts an archive only with the class path it was made with), the pyspark version, its jars
  (names and sizes) and the Java executable (path and modification time), so an upgrade of either starts
  from no archive instead of a stale one.
* :func:`apply(conf)` (called by :func:`dstreams.spark.sparkconf.tuned_conf`) adds the archive to
  ``spark.driver.extraJavaOptions`` when ``spark.dstreams.jvm.classDataSharing`` is ``auto`` (the
  default), the archive exists, this process is about to start its JVM (not under ``spark-submit``, no
  JVM running yet) and the user's options do not choose CDS themselves. The JVM checks the archive against
  its own version and class path and silently ignores one that does not match (its CDS log is turned off):
  a wrong archive costs the speed-up, never a failure.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import config

log = logging.getLogger(__name__)

DRIVER_OPTIONS_KEY = "spark.driver.extraJavaOptions"
#: JVM options a user may have set that mean CDS is already their choice.
_USERS_OWN = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")
#: The CDS log lines a JVM prints when an archive does not match it (to stdout): off.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: The smallest archive taken as complete (a dynamic archive of a Spark driver is ~60 MB).
MIN_ARCHIVE_BYTES = 1 << 20


def cache_dir() -> Path:
    """``$DSTREAMS_CACHE_DIR``, else ``$XDG_CACHE_HOME/dstreams``, else ``~/.cache/dstreams``."""
    explicit = os.environ.get("DSTREAMS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dstreams"


def java_executable() -> str | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH`` (real path)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def _jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def archive_key() -> str | None:
    """What the archive depends on, hashed (None without a Java executable): the place of pyspark's jars
    (the JVM checks its class path against the archive's), then their names, sizes and modification times (the
    JVM refuses, silently, an archive whose jars changed: a virtualenv made again at the same place has the same
    jars with new times), pyspark's version and the Java executable."""
    import pyspark

    java = java_executable()
    if java is None:
        return None
    jars = _jars()
    place = hashlib.sha256(str(jars).encode()).hexdigest()[:8]
    h = hashlib.sha256(f"{pyspark.__version__}\n{java}:{os.stat(java).st_mtime_ns}\n".encode())
    for jar in sorted(jars.glob("*.jar")):
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return f"{place}-{h.hexdigest()[:16]}"


def archive_path() -> Path | None:
    """Where this machine's archive lives (whether or not it was built); None without Java."""
    key = archive_key()
    return None if key is None else cache_dir() / f"spark-driver-{key}.jsa"


def with_archive(options: str | None, archive: Path) -> str | None:
    """``options`` (the driver's extra JVM options) with ``archive`` mapped, or None to leave them alone
    (the user chose CDS options themselves, or the path would not survive Spark's option splitting)."""
    current = options or ""
    if any(flag in current for flag in _USERS_OWN) or any(c.isspace() or c in "'\"\\" for c in str(archive)):
        return None
    return f"{current} -XX:SharedArchiveFile={archive} {QUIET}".strip()


def apply(conf: Any) -> bool:
    """Map the archive in the driver JVM ``conf`` is about to start (see the module docstring); whether
    the option was added."""
    from pyspark import SparkContext

    if config.get(config.CLASS_DATA_SHARING, conf) != "auto":
        return False
    if "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._gateway is not None:
        return False  # the driver JVM already runs (spark-submit, or an earlier context of this process)
    path = archive_path()
    if path is None or not path.is_file():
        return False
    options = with_archive(conf.get(DRIVER_OPTIONS_KEY), path)
    if options is None:
        return False
    conf.set(DRIVER_OPTIONS_KEY, options)
    return True


# ---------------------------------------------------------------------------------------------- building
#: The driver the archive is made from (run by :func:`build` in a process of its own; argv[1]: the archive).
DUMP_DRIVER = """
import sys
from pyspark import SparkConf
from dstreams import StreamingContext
from dstreams.spark.sparkconf import create_spark_context
conf = SparkConf().set("spark.driver.extraJavaOptions", "-XX:ArchiveClassesAtExit=" + sys.argv[1] + " " + sys.argv[2])
conf.set("spark.dstreams.jvm.classDataSharing", "off")
sc = create_spark_context("local[2]", "dstreams-cds-archive", conf)
sc.parallelize(range(100), 2).map(lambda x: (x % 7, 1)).reduceByKey(lambda a, b: a + b).collect()
ssc = StreamingContext(sc, 0.5)  # the engine's JVM side too: the compiled builder, a shuffle per batch
counts = ssc.generatorStream(10, 2).map(lambda line: (len(line), 1)).reduceByKey(lambda a, b: a + b)
counts.foreachRDD(lambda rdd: rdd.collect())
ssc.start()
ssc.awaitTerminationOrTimeout(1.5)
ssc.stop(stopSparkContext=True)
"""


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def build(force: bool = False, timeout_s: float = 300.0) -> Path:
    """Build this machine's archive (see the module docstring) and return its path; an existing one is
    kept unless ``force``. Raises ``RuntimeError`` saying what failed."""
    path = archive_path()
    if path is None:
        raise RuntimeError("no Java executable found (JAVA_HOME or java on PATH): nothing to archive")
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    env = dict(os.environ, DSTREAMS_CLASS_DATA_SHARING="off", PYTHONUNBUFFERED="1")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    proc = subprocess.Popen([sys.executable, "-c", DUMP_DRIVER, str(tmp), QUIET], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        # The JVM writes the archive while it exits, after the Python driver is gone: wait for the group.
        gone = _wait_group_gone(proc.pid, timeout_s)
    except subprocess.TimeoutExpired:
        out, gone = b"", False
    if not gone or proc.returncode != 0:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        tmp.unlink(missing_ok=True)
        tail = out.decode(errors="replace")[-3000:]
        raise RuntimeError(f"building the CDS archive failed (exit code {proc.returncode}, JVM exited: {gone}):\n"
                           f"{tail}")
    if not tmp.is_file() or tmp.stat().st_size < MIN_ARCHIVE_BYTES:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"the JVM wrote no usable CDS archive at {tmp} (a JDK without dynamic archiving, or "
                           f"no base archive?); output:\n{out.decode(errors='replace')[-3000:]}")
    os.replace(tmp, path)
    place = path.name.split("-")[2]  # the same pyspark installation's older archives (other installs keep theirs)
    for old in path.parent.glob(f"spark-driver-{place}-*.jsa*"):
        if old != path and not _being_built(old):
            old.unlink(missing_ok=True)
    return path


def _being_built(path: Path) -> bool:
    """Whether ``path`` is the temporary archive of a build whose process still runs."""
    _, sep, pid = path.name.rpartition(".tmp-")
    if not sep or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstreams.spark.jvm_cds",
                                description="Build the driver JVM's class-data-sharing archive for this Java "
                                            "and pyspark (dstreams' drivers then start about a third faster).")
    p.add_argument("--force", action="store_true", help="rebuild an existing archive")
    args = p.parse_args(argv)
    started = time.monotonic()
    try:
        path = build(force=args.force)
    except RuntimeError as e:
        print(f"dstreams: {e}", file=sys.stderr)
        return 1
    print(f"dstreams: class-data-sharing archive {path} ({path.stat().st_size // (1 << 20)} MB, "
          f"{time.monotonic() - started:.0f} s); drivers started with dstreams' conf map it "
          f"(spark.dstreams.jvm.classDataSharing=off turns it off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
