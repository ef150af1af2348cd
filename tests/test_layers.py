"""The layering rule of docs/architecture.md, enforced on the imports.

* engine modules (``dstreams/``, ``dstreams/nodes/``) import neither ``dstreams.api`` nor ``dstreams.recovery``;
* ``recovery/`` does not import ``dstreams.api``;
* no import cycles among the project's modules (module-level imports);
* importing an engine module (what an executor does when it unpickles one) loads neither the api nor the
  recovery layer, nor boto3 or tenacity.

Imports under ``if TYPE_CHECKING:`` are type annotations only and do not count.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"dstreams": "dstreams", "api": "dstreams.api", "recovery": "dstreams.recovery"}
#: The demo is an application of the library (the README's first command), not part of the engine.
APPLICATIONS = {"dstreams.demo"}
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


def _imports(module: str, path: Path, top_level_only: bool) -> set[str]:
    """Project modules imported by ``module`` (resolving relative imports and the facade's names)."""
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
    modules = _modules()
    return {m for m in found if m in modules}


def _layer(module: str) -> str:
    if module.startswith("dstreams.api"):
        return "api"
    if module.startswith("dstreams.recovery"):
        return "recovery"
    return "engine"


def test_layers_import_only_downwards():
    modules = _modules()
    assert len(modules) > 30, "the module list looks wrong"
    violations = []
    for module, path in modules.items():
        if module in APPLICATIONS or module == "dstreams":
            continue
        layer = _layer(module)
        for imported in _imports(module, path, top_level_only=False):
            target = _layer(imported)
            if layer == "engine" and target in ("api", "recovery"):
                violations.append(f"{module} (engine) imports {imported} ({target})")
            if layer == "recovery" and target == "api":
                violations.append(f"{module} (recovery) imports {imported} (api)")
    assert not violations, "layering rule broken (see docs/architecture.md):\n" + "\n".join(violations)


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
