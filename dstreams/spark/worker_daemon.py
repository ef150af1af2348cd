"""PySpark worker daemon that drops Spark's redundant zip/jar archives from ``sys.path``.

Use it with ``spark.python.daemon.module=dstreams.spark.worker_daemon`` (``dstreams.spark.sparkconf`` sets it for
the SparkContexts dstreams creates). The JVM starts it as ``python -m dstreams.spark.worker_daemon <worker module>``;
it cleans the path and then runs
:func:`pyspark.daemon.manager`, which reads ``sys.argv[1]`` (left untouched) as the worker module.

Why: the JVM puts ``pyspark.zip``, ``py4j-*-src.zip`` and the spark-core jar at the front of every Python
worker's ``PYTHONPATH``. ``pyspark.worker_util.setup_spark_files`` calls ``importlib.invalidate_caches()``
on every task, and on CPython 3.10-3.12 that makes each ``zipimporter`` in ``sys.path_importer_cache``
re-read its archive's central directory (pyspark.zip alone has ~1,300 entries, the jar thousands): 60-80 ms
per task, i.e. most of the cost of a trivial micro-batch job. With a pip-installed pyspark these archives
only shadow the same code installed as plain directories, so removing them (and their importer-cache
entries, including the per-package ``.../pyspark.zip/pyspark`` ones) before pyspark is imported removes
the cost without changing which code runs.

Safety rules (see :func:`redundant_archives`):

* only Spark's own archives are candidates: basename ``pyspark.zip``, ``py4j-*-src.zip``, or a
  ``spark-*.jar`` inside a ``jars`` directory; user ``--py-files`` archives are never touched;
* ``pyspark.zip`` / the py4j zip go only if a plain directory on the path provides the same package at
  the same version (or already shadows the archive); the jars go only if pyspark then resolves to a
  directory. When pyspark is only available from the zip, nothing is removed.
"""

from __future__ import annotations

import fnmatch
import gc
import os
import re
import socket
import sys
import zipfile
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext  # only for the checker: main() imports pyspark after strip_redundant_archives

_VERSION_RE = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.MULTILINE)
_PY4J_ZIP_RE = re.compile(r"^py4j-(.+)-src\.zip$")


def _is_archive(entry: str) -> bool:
    return os.path.isfile(entry)


def _kind(entry: str) -> str | None:
    """Which Spark archive ``entry`` is: ``"pyspark"``, ``"py4j"``, ``"jar"``, or None (not Spark's)."""
    base = os.path.basename(entry.rstrip(os.sep))
    if base == "pyspark.zip":
        return "pyspark"
    if _PY4J_ZIP_RE.match(base):
        return "py4j"
    parent = os.path.basename(os.path.dirname(entry.rstrip(os.sep)))
    if fnmatch.fnmatchcase(base, "spark-*.jar") and parent == "jars":
        return "jar"
    return None


def _parse_version(text: str) -> str | None:
    m = _VERSION_RE.search(text)
    return m.group(1) if m else None


def _dir_version(directory: str, pkg: str) -> str | None:
    try:
        with open(os.path.join(directory, pkg, "version.py"), encoding="utf-8") as f:
            return _parse_version(f.read())
    except OSError:
        return None


def _zip_version(archive: str, pkg: str) -> str | None:
    if pkg == "py4j":
        m = _PY4J_ZIP_RE.match(os.path.basename(archive))
        if m:
            return m.group(1)
    try:
        with zipfile.ZipFile(archive) as z:
            return _parse_version(z.read(f"{pkg}/version.py").decode("utf-8"))
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def _first_dir_provider(path: Sequence[str], pkg: str) -> int | None:
    """Index of the first plain-directory entry of ``path`` holding package ``pkg``."""
    for i, entry in enumerate(path):
        directory = entry or os.getcwd()
        if os.path.isfile(os.path.join(directory, pkg, "__init__.py")):
            return i
    return None


def redundant_archives(path: Sequence[str]) -> list[str]:
    """The entries of ``path`` that are Spark's own archives made redundant by a directory install.

    Pure apart from reading the file system; ``path`` is not modified.
    """
    removed: set[str] = set()
    for pkg in ("pyspark", "py4j"):
        d = _first_dir_provider(path, pkg)
        if d is None:
            continue  # only the archive provides it: keep the archive
        dir_version = _dir_version(path[d] or os.getcwd(), pkg)
        for i, entry in enumerate(path):
            if _kind(entry) != pkg or not _is_archive(entry):
                continue
            # Already shadowed (the directory comes first), or the same release: removing it changes nothing.
            if i > d or (dir_version is not None and _zip_version(entry, pkg) == dir_version):
                removed.add(entry)
    # Spark's jars hold no Python code pyspark needs once pyspark itself resolves to a directory.
    remaining = [e for e in path if e not in removed]
    d = _first_dir_provider(remaining, "pyspark")
    if d is not None and not any(_kind(e) == "pyspark" for e in remaining[:d]):
        removed.update(e for e in path if _kind(e) == "jar")
    return [e for e in path if e in removed]


def strip_redundant_archives(
    path: list[str],
    importer_cache: MutableMapping[str, Any] | None = None,
) -> list[str]:
    """Remove :func:`redundant_archives` from ``path`` (in place) and their ``importer_cache`` entries.

    Cache keys for the archive itself and for sub-paths inside it (``.../pyspark.zip/pyspark``) are
    dropped. Returns the removed entries.
    """
    removed = redundant_archives(path)
    if not removed:
        return []
    gone = set(removed)
    path[:] = [e for e in path if e not in gone]
    if importer_cache is not None:
        prefixes = tuple(e.rstrip(os.sep) + os.sep for e in gone)
        for key in list(importer_cache):
            if key in gone or key.startswith(prefixes):
                del importer_cache[key]
    return removed


def _forget_modules_from(archives: Sequence[str]) -> None:
    """Drop modules already imported from ``archives`` so they re-import from the directory install.

    Running ``python -m dstreams.spark.worker_daemon`` imports the ``dstreams`` package first; if that import
    pulled in pyspark/py4j from the zips, those modules (and dstreams' own, which hold references to
    them) are forgotten so that the daemon and its workers use one consistent copy.
    """
    prefixes = tuple(a.rstrip(os.sep) + os.sep for a in archives)
    stale = [n for n, m in list(sys.modules.items()) if str(getattr(m, "__file__", "")).startswith(prefixes)]
    if not stale:
        return
    stale += [n for n in sys.modules if n == "dstreams" or n.startswith("dstreams.")]
    for name in stale:
        sys.modules.pop(name, None)


#: Exit code of a forked worker whose JVM side closed the socket (any non-zero code ends its reuse loop).
PEER_CLOSED = 3


#: pyspark.daemon's ``worker(sock, authenticated)``: the forked worker's task loop; its exit code.
WorkerFn = Callable[[socket.socket, bool], int]


def quiet_broken_pipe(worker: WorkerFn) -> WorkerFn:
    """Wrap pyspark.daemon's ``worker``: a JVM that closed the socket (shutdown) is a quiet exit.

    Without it every forked worker prints a ``BrokenPipeError`` traceback when the SparkContext stops.
    The wrapper returns a non-zero code then: pyspark.daemon's forked worker treats 0 as "the socket
    is still good, serve the next task on it", and a worker that did so on a closed socket would fail
    again at once, forever (a busy loop per leaked worker). Non-zero makes it exit quietly.

    It also freezes what a reused worker keeps between tasks (see :class:`Freezer`).
    """
    freezer = Freezer()

    def run(sock: socket.socket, authenticated: bool) -> int:
        try:
            code = worker(sock, authenticated)
        except BrokenPipeError:
            return PEER_CLOSED
        if code == 0:
            freezer.task_done()
        return code

    return run


class Freezer:
    """Keeps pyspark.daemon's per-task ``gc.collect()`` cheap in a reused worker.

    A reused worker runs a full garbage collection after every task; its cost grows with everything
    the worker holds (a worker that opened an S3 store holds boto3's models: ~80,000 objects, 50-250 ms
    of CPU per task, more than the task itself). After its 1st, 2nd, 4th, 8th... task, the worker
    collects once and then calls ``gc.freeze()`` on what survived (modules, clients, caches): later
    collections skip it. Only objects alive at that moment are frozen (a full collection runs just
    before), and frozen objects are still freed by reference counting; what is never collected is a
    reference cycle among them that becomes garbage later, which the doubling interval keeps rare.
    """

    def __init__(self) -> None:
        self.tasks = 0
        self.next_freeze = 1

    def task_done(self) -> None:
        self.tasks += 1
        if self.tasks >= self.next_freeze:
            gc.collect()
            gc.freeze()
            self.next_freeze *= 2


#: Environment variable naming modules (comma-separated) the daemon imports before it forks workers.
PRELOAD_ENV = "DSTREAMS_WORKER_PRELOAD"
#: The name Spark runs this module by (``spark.python.daemon.module``; ``python -m dstreams.spark.worker_daemon``).
DAEMON_MODULE = "dstreams.spark.worker_daemon"


def request_preload(sc: SparkContext, module: str) -> bool:
    """Ask the worker daemons of ``sc`` to import ``module`` (and call its ``warm_worker()``) before forking.

    Forked workers then inherit what the module loaded (e.g. boto3 and the S3 model: ~250 ms of CPU
    per worker otherwise). Only for contexts whose daemon is this module (``dstreams.spark.sparkconf``
    sets it); returns False otherwise. PySpark keys its worker pools by the workers' environment, so
    call it before the first Python task: a later call starts a second daemon for the new environment.
    """
    if sc.getConf().get("spark.python.daemon.module") != DAEMON_MODULE:
        return False
    names = [n for n in sc.environment.get(PRELOAD_ENV, "").split(",") if n]
    if module not in names:
        sc.environment[PRELOAD_ENV] = ",".join([*names, module])
    return True


def preload(names: str) -> None:
    """Import each module of ``names`` (comma-separated) and call its ``warm_worker()`` if it has one.

    A module that fails is reported on stderr and skipped: the workers then load it themselves.
    """
    import importlib

    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            warm = getattr(importlib.import_module(name), "warm_worker", None)
            if warm is not None:
                warm()
        except Exception as e:  # noqa: BLE001 - an optimisation only
            print(f"dstreams.spark.worker_daemon: could not preload {name}: {type(e).__name__}: {e}", file=sys.stderr)


def main() -> None:
    removed = strip_redundant_archives(sys.path, sys.path_importer_cache)
    if removed:
        _forget_modules_from(removed)
    import pyspark.daemon  # after the clean-up: resolves to the directory install

    preload(os.environ.get(PRELOAD_ENV, ""))
    gc.collect()
    gc.freeze()  # what the workers inherit is never scanned by their collections (nor copied on write by them)
    pyspark.daemon.worker = quiet_broken_pipe(pyspark.daemon.worker)  # looked up by manager() per fork
    pyspark.daemon.manager()  # reads sys.argv[1] (the worker module), which we leave as is


if __name__ == "__main__":
    main()
