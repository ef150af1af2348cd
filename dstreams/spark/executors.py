"""Can the executors run dstreams' code? One tiny task at start says so, and fixes what it can.

Contract of :func:`ensure_executors_can_import`: run once per SparkContext (later calls return at once),
before the first batch. A task imports the modules the engine's tasks need. When the executors' Python
cannot find ``dstreams`` itself (a SparkContext whose workers run another interpreter, a cluster where
the package is not installed), the package is zipped and shipped to them with ``sc.addPyFile``, as
``--py-files`` would, and the probe runs again. When something else is missing there (a dependency such
as pyarrow or boto3), or shipping did not help, :class:`ExecutorEnvironmentError` says which module, which
interpreter the executors run, and how to fix it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterable
from typing import Any

from pyspark import SparkContext

from ..errors import DStreamsError

log = logging.getLogger(__name__)

#: What executors import when they run the engine's tasks and write checkpoints (the checkpoint and
#: sink code runs through the store layer, which needs tenacity; pyarrow for the Arrow paths).
PROBED_MODULES = ("dstreams.spark.partitioned", "dstreams.records", "tenacity", "pyarrow")
_SUBPACKAGES = ("api", "recovery")

_checked: set[int] = set()
_lock = threading.Lock()


class ExecutorEnvironmentError(DStreamsError, RuntimeError):
    """The executors' Python cannot import what dstreams' tasks need."""


def probe(it: Iterable[Any]) -> list[tuple[str, str]]:
    """Executor side: ``[(name, error)]`` for each module of :data:`PROBED_MODULES` that does not import,
    and ``("python", sys.executable)`` first."""
    for _ in it:  # read the input, or PySpark does not reuse this (now warm) worker
        pass
    out = [("python", sys.executable)]
    for name in PROBED_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 (reported to the driver)
            out.append((name, f"{type(e).__name__}: {e}"))
    return out


def _run_probe(sc: SparkContext) -> list[tuple[str, str]]:
    sc.setJobGroup("dstreams-executor-check", "dstreams: can the executors import dstreams?")
    try:
        return sc.parallelize([0], 1).mapPartitions(probe).collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]


def package_zip(folder: str | None = None) -> str:
    """A zip of the installed ``dstreams`` package (with its ``api`` and ``recovery`` subpackages at
    ``dstreams/api`` and ``dstreams/recovery``, as they import), for ``sc.addPyFile``."""
    spec = importlib.util.find_spec("dstreams")
    assert spec is not None and spec.submodule_search_locations
    roots = {"dstreams": list(spec.submodule_search_locations)[0]}
    for sub in _SUBPACKAGES:
        sub_spec = importlib.util.find_spec(f"dstreams.{sub}")
        if sub_spec is not None and sub_spec.submodule_search_locations:
            roots[f"dstreams/{sub}"] = list(sub_spec.submodule_search_locations)[0]
    fd, path = tempfile.mkstemp(prefix="dstreams-", suffix=".zip", dir=folder)
    os.close(fd)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc_root, root in roots.items():
            for dirpath, dirnames, filenames in os.walk(root):
                rel = os.path.relpath(dirpath, root)
                if rel != "." and (f"dstreams/{rel}" in roots or rel.startswith(("__pycache__", "."))
                                   or "__pycache__" in rel.split(os.sep)):
                    dirnames[:] = []
                    continue
                if arc_root == "dstreams" and rel == ".":
                    dirnames[:] = [d for d in dirnames if d not in _SUBPACKAGES]
                for name in filenames:
                    if name.endswith(".py"):
                        arc = os.path.normpath(os.path.join(arc_root, rel, name)).replace(os.sep, "/")
                        z.write(os.path.join(dirpath, name), arc)
    return path


def _failures(result: list[tuple[str, str]]) -> tuple[str, list[tuple[str, str]]]:
    python = next((v for k, v in result if k == "python"), "?")
    return python, [(k, v) for k, v in result if k != "python"]


def ensure_executors_can_import(sc: SparkContext) -> None:
    """See the module docstring. Raises :class:`ExecutorEnvironmentError` when it cannot be fixed."""
    with _lock:
        if id(sc) in _checked:
            return
        try:
            python, missing = _failures(_run_probe(sc))
        except Exception as e:  # the probe function itself could not be loaded: dstreams is missing there
            python, missing = "?", [("dstreams", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")]
        if missing and all("dstreams" in error or name == "dstreams" for name, error in missing):
            path = package_zip()
            log.warning("the executors cannot import dstreams (%s): shipping the package to them (%s), as "
                        "--py-files would", missing[0][1][:200], path)
            sc.addPyFile(path)
            try:
                python, missing = _failures(_run_probe(sc))
            except Exception as e:
                missing = [("dstreams", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")]
        if missing:
            detail = "; ".join(f"{name}: {error}" for name, error in missing)
            raise ExecutorEnvironmentError(
                f"the executors' Python ({python}) cannot run dstreams' tasks: {detail}. Run the executors with "
                f"an interpreter that has dstreams' dependencies installed: set PYSPARK_PYTHON (or the Spark conf "
                f"key spark.pyspark.python) to one, e.g. the driver's {sys.executable}, or install dstreams "
                "(pip install dstreams) into the executors' environment."
            )
        _checked.add(id(sc))
