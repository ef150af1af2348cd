"""The old names of modules that moved: each imports (and runs as ``python -m``) the module at its new place.

Contract: ``import dstreams.<old>`` returns the very module object of its new place (``dstreams.sparkconf is
dstreams.spark.sparkconf``): same functions, same classes, same module state, private names included. So

* user code keeps working: ``from dstreams.sparkconf import create_spark_context, tuned_conf`` (the README's
  import before the Spark plumbing got its own package);
* ``spark.python.daemon.module=dstreams.worker_daemon``, the name Spark runs the worker daemon by (the
  library sets it; users pass it to ``spark-submit``), and ``python -m dstreams.spark.jvm_cds``, keep running;
* a graph stored by an older version (``meta/graph.pkl``, cloudpickle refers to module-level functions by
  module and name, e.g. ``dstreams.partitioned.fold``) still loads.

The library itself imports the new names only (``tests/test_layers.py``). :func:`install` is called by
``dstreams/__init__.py``; it imports nothing beyond the standard library.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

#: Old module name -> the module's name now.
MOVED: dict[str, str] = {
    **{f"dstreams.{m}": f"dstreams.spark.{m}" for m in (
        "arrow", "executors", "jvm", "jvm_cds", "jvm_compiled", "jvm_signals", "partitioned", "sparkconf",
        "worker_daemon")},
    # The demo is an application of the library, no part of the engine; old checkpoints name its outputs.
    "dstreams.demo": "dstreams.examples.demo",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Finds the old names of :data:`MOVED`; the loaded "module" is the new one (put in ``sys.modules``)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        spec = importlib.util.find_spec(new)
        return importlib.util.spec_from_loader(fullname, self, origin=spec.origin if spec else None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns what ``sys.modules`` holds under the name once this returns.
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m <old name>`` (runpy): code that runs the new module as ``__main__`` under its own
        name (its relative imports resolve in its package; ``sys.argv[0]`` is its file)."""
        new = MOVED[fullname]
        source = f"import runpy\nrunpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n"
        return compile(source, f"<{fullname}, moved to {new}>", "exec")

    def get_source(self, fullname: str) -> str | None:
        return None

    def is_package(self, fullname: str) -> bool:
        return False


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once (first: no stale copy of an old module left in an
    installation or on ``sys.path`` can shadow the module at its new place)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
