"""The layering rule of docs/internals/architecture.md, enforced on the imports.

* engine modules (``dstreams/``: the streaming model and its Spark plumbing ``dstreams/spark/``) import neither
  ``dstreams.api`` nor ``dstreams.recovery`` nor a connector;
* ``recovery/`` imports neither ``dstreams.api`` nor a connector;
* the connectors (:data:`CONNECTORS`: each external system's source, sink and exactly-once protocol in one package)
  may import the engine and recovery, not ``dstreams.api``; the api imports them;
* **the streaming model reaches the Spark plumbing through a named interface only**: modules of ``dstreams/``
  (outside ``dstreams/spark/``), ``dstreams/nodes/`` and ``recovery/`` import of ``dstreams.spark`` only
  :data:`SPARK_INTERFACE` (``dstreams.spark.partitioned``: partitioning and the shuffle/combine data path;
  ``dstreams.spark.jvm``: the JVM fast path). The rest of ``dstreams/spark/`` (the SparkConf, the JVM's
  class-data sharing and compiled classes, the worker daemon, the executor check, the Arrow functions) is
  for ``api/``, the layer that starts Spark and owns the user-facing operators;
* the plumbing does not import the streaming model: ``dstreams/spark/`` imports of the rest of the project
  only the leaf modules :data:`PLUMBING_MAY_IMPORT` (the settings table, the per-record partition functions,
  the errors' base class),
  and its ``__init__`` imports nothing (the worker daemon runs as ``python -m`` before it cleans ``sys.path``);
* no import cycles among the project's modules (module-level imports);
* importing an engine module (what an executor does when it unpickles one) loads neither the api nor the
  recovery layer, nor boto3 or tenacity.
* inside the api layer, ``DStream`` and the other parts use the ``StreamingContext`` through a named interface
  (``dstreams.api.owner.GraphOwner``, ``dstreams.api.shutdown.Stoppable``), never through its private
  attributes: :data:`CONTEXT_INTERFACES`.

Why this rule and not "the model imports nothing of Spark": the operators compute RDDs, so the model needs
Spark's data path (partitioners, shuffles, the one-round-trip JVM builds); what it must not know is how Spark
is configured, started and served (conf, JVM archives and classes, workers, executors). ``dstreams/examples/``
(``examples/``) holds applications, and ``dstreams.testing`` is the harness users test their applications with:
they may import any layer, and nothing of the library imports them.

Imports under ``if TYPE_CHECKING:`` are type annotations only and do not count.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"dstreams": "dstreams", "api": "dstreams.api", "recovery": "dstreams.recovery",
           "examples": "dstreams.examples"}
#: Applications of the library (the demo: the README's first command), not part of it.
APPLICATIONS = ("dstreams.examples", "dstreams.testing")
#: The connectors: one package per external system, holding its source, its sink and its exactly-once protocol.
CONNECTORS = ("dstreams.kafka", "dstreams.redis", "dstreams.postgres", "dstreams.files")
#: The Spark plumbing's package and the modules of it the streaming model and recovery may import.
SPARK = "dstreams.spark"
SPARK_INTERFACE = {SPARK, f"{SPARK}.partitioned", f"{SPARK}.jvm"}
#: What the plumbing may import of the rest of the project (leaf modules that import nothing of it).
PLUMBING_MAY_IMPORT = {"dstreams", "dstreams.config", "dstreams.records", "dstreams.errors"}
#: ``from dstreams import X`` resolves X lazily to these modules (dstreams/__init__.py).
FACADE = {"StreamingContext": "dstreams.api.context", "StreamingContextStateError": "dstreams.api.context",
          "DStream": "dstreams.api.stream"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path, top_level_only: bool, known_only: bool = True) -> set[str]:
    """Project modules imported by ``module`` (resolving relative imports and the facade's names); with
    ``known_only=False`` every imported name, also of modules that are not files of the project."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt], nested: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse, nested)
                continue
            if isinstance(node, ast.Import):
                if not (nested and top_level_only):
                    found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if nested and top_level_only:
                    continue
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                found.add(target)
                for a in node.names:
                    found.add(f"{target}.{a.name}")
                    if target == "dstreams" and a.name in FACADE:
                        found.add(FACADE[a.name])
            for child_field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, child_field, None)
                if isinstance(children, list) and children and isinstance(children[0], ast.AST):
                    is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    stmts = [c for c in children if isinstance(c, ast.stmt)]
                    for h in children:
                        if isinstance(h, ast.ExceptHandler):
                            stmts.extend(h.body)
                    visit(stmts, nested or is_def and not isinstance(node, ast.ClassDef))

    visit(tree.body, False)
    if not known_only:
        return found
    modules = _modules()
    return {m for m in found if m in modules}


def _in(module: str, package: str | tuple[str, ...]) -> bool:
    packages = (package,) if isinstance(package, str) else package
    return any(module == p or module.startswith(p + ".") for p in packages)


def _layer(module: str) -> str:
    if _in(module, "dstreams.api"):
        return "api"
    if _in(module, "dstreams.recovery"):
        return "recovery"
    if _in(module, CONNECTORS):
        return "connectors"
    return "engine"


def test_layers_import_only_downwards():
    modules = _modules()
    assert len(modules) > 30, "the module list looks wrong"
    violations = []
    for module, path in modules.items():
        if _in(module, APPLICATIONS) or module == "dstreams":
            continue
        layer = _layer(module)
        for imported in _imports(module, path, top_level_only=False):
            if _in(imported, APPLICATIONS):
                violations.append(f"{module} imports {imported} (an application: nothing of the library may)")
            target = _layer(imported)
            if layer == "engine" and target in ("api", "recovery", "connectors"):
                violations.append(f"{module} (engine) imports {imported} ({target})")
            if layer == "recovery" and target in ("api", "connectors"):
                violations.append(f"{module} (recovery) imports {imported} ({target})")
            if layer == "connectors" and target == "api":
                violations.append(f"{module} (connectors) imports {imported} (api)")
    assert not violations, "layering rule broken (see docs/internals/architecture.md):\n" + "\n".join(violations)


def test_the_model_uses_the_spark_plumbing_through_its_interface_only():
    modules = _modules()
    violations = []
    for module, path in modules.items():
        if _in(module, SPARK) or _in(module, APPLICATIONS) or _layer(module) == "api":
            continue
        for imported in _imports(module, path, top_level_only=False):
            if _in(imported, SPARK) and imported not in SPARK_INTERFACE:
                violations.append(f"{module} imports {imported}, not one of {sorted(SPARK_INTERFACE)}")
    assert not violations, ("the Spark plumbing's interface (see docs/internals/architecture.md):\n"
                            + "\n".join(violations))


def test_the_spark_plumbing_does_not_import_the_streaming_model():
    modules = _modules()
    plumbing = {m: p for m, p in modules.items() if _in(m, SPARK)}
    assert {f"{SPARK}.jvm", f"{SPARK}.sparkconf", f"{SPARK}.worker_daemon"} <= set(plumbing)
    violations = [f"{module} imports {imported}" for module, path in plumbing.items()
                  for imported in _imports(module, path, top_level_only=False)
                  if not _in(imported, SPARK) and imported not in PLUMBING_MAY_IMPORT]
    assert not violations, "dstreams/spark/ imports the streaming model:\n" + "\n".join(violations)
    init = ast.parse((ROOT / "dstreams" / "spark" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, (ast.Import, ast.ImportFrom))], \
        "dstreams/spark/__init__.py must import nothing (the worker daemon imports it before cleaning sys.path)"


def test_no_import_cycles():
    modules = _modules()
    graph = {m: {i for i in _imports(m, p, top_level_only=True) if i != m} for m, p in modules.items()}
    # Importing a submodule first imports its packages: do not count the package -> its own submodule edge
    # as a cycle through the facade (dstreams/__init__ imports nothing at module level).
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                dfs(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles[:10])


def test_the_rule_checker_sees_a_violation(tmp_path):
    """The checker is not vacuous: an engine-style module importing recovery is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from dstreams.recovery.store import open_store\nfrom ..api import context\n")
    found = _imports("dstreams.nodes.bad", bad, top_level_only=False)
    assert "dstreams.recovery.store" in found and "dstreams.api.context" in found


def test_importing_an_engine_module_loads_no_api_or_recovery():
    code = ("import sys, dstreams.spark.partitioned, dstreams.nodes.state, dstreams.records\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('dstreams.api', 'dstreams.recovery'))"
            " or m.split('.')[0] in ('boto3', 'tenacity', 'botocore'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"an engine import loaded: {out.stdout.strip()}"


def test_the_facade_still_exports_pyspark_names():
    code = "from dstreams import StreamingContext, DStream, StreamingListener; print(StreamingContext.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "dstreams.api.context"


# ---------------------------------------------------------------- the api's parts use the context's interfaces

#: api modules -> the interface through which they use the ``StreamingContext`` (its module and name). The
#: context itself (``dstreams.api.context``) is the one api module that may touch its private attributes.
CONTEXT_INTERFACES = {
    "dstreams.api.stream": ("dstreams.api.owner", "GraphOwner"),
    "dstreams.api.event_time": ("dstreams.api.owner", "GraphOwner"),
    "dstreams.api.shutdown": ("dstreams.api.shutdown", "Stoppable"),
    "dstreams.api.driver": ("dstreams.api.shutdown", "Stoppable"),
}
#: The names the api modules give a context: a variable ``ssc``, or an attribute ``_ssc``/``context`` of an
#: object (``self._ssc``, ``setup.context``).
CONTEXT_VARIABLES = {"ssc", "streaming_context"}
CONTEXT_ATTRIBUTES = {"_ssc", "ssc", "context", "_context"}


def _names_a_context(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in CONTEXT_VARIABLES) or (
        isinstance(node, ast.Attribute) and node.attr in CONTEXT_ATTRIBUTES)


def _context_uses(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, attribute)`` of every attribute read or called on an expression that names a context."""
    return sorted((n.lineno, n.attr) for n in ast.walk(ast.parse(source, filename))
                  if isinstance(n, ast.Attribute) and _names_a_context(n.value))


def _interface_members(module: str, name: str) -> dict[str, object]:
    interface = getattr(importlib.import_module(module), name)
    return {k: v for k, v in vars(interface).items() if not k.startswith("_")}


def test_api_modules_use_the_context_through_its_interface_only():
    """DStream and the other api parts call the ``StreamingContext`` only through a named interface
    (``GraphOwner``, ``Stoppable``) and never through its private attributes (docs/internals/architecture.md)."""
    modules = _modules()
    violations = []
    for module, path in modules.items():
        if not _in(module, "dstreams.api") or module == "dstreams.api.context":
            continue
        interface = CONTEXT_INTERFACES.get(module)
        members = _interface_members(*interface) if interface else {}
        for line, attr in _context_uses(path.read_text(), str(path)):
            if attr.startswith("_"):
                violations.append(f"{module}:{line} uses the context's private {attr!r}")
            elif interface and attr not in members:
                violations.append(f"{module}:{line} uses the context's {attr!r}, not a member of {interface[1]}")
    assert not violations, "\n".join(violations)
    assert _context_uses(modules["dstreams.api.stream"].read_text()), "the checker finds no use at all in DStream"


def test_the_context_implements_the_interfaces_its_parts_use():
    from dstreams.api.context import StreamingContext

    for module, name in set(CONTEXT_INTERFACES.values()):
        members = _interface_members(module, name)
        assert members, f"{name} has no public members"
        for member, declared in members.items():
            implemented = inspect.getattr_static(StreamingContext, member, None)
            assert implemented is not None, f"StreamingContext does not implement {name}.{member}"
            assert isinstance(implemented, property) == isinstance(declared, property), \
                f"StreamingContext.{member}: {name} declares a {type(declared).__name__}"


def test_the_context_use_checker_sees_a_violation():
    """The checker is not vacuous: private reads through a local alias and through ``self._ssc`` are found; a
    public member, a stream's own private attribute and a context passed on are not uses."""
    source = ("ssc = self._ssc\n"
              "n = ssc._concurrent\n"
              "self._ssc._check_not_started('add a transformation')\n"
              "self._ssc.sparkContext\n"
              "self._node.slice(1, 2)\n"
              "DStream(node, self._ssc)\n"
              "setup.context._main_thread_awaited()\n")
    assert _context_uses(source) == [(2, "_concurrent"), (3, "_check_not_started"), (4, "sparkContext"),
                                     (7, "_main_thread_awaited")]


def test_every_package_of_the_checkout_is_in_the_wheel() -> None:
    """``pyproject.toml``'s ``packages`` lists every folder of the library that has an ``__init__.py`` (under its
    installed name), so none is left out of the wheel (``dstreams.kafka`` once was)."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert found <= listed, f"missing from pyproject.toml's packages: {sorted(found - listed)}"
