"""The documentation cannot drift from the code.

* The site builds with ``mkdocs build --strict`` (a broken link, a missing anchor or API reference, a page left out
  of the navigation fails it).
* Every ```` ```python ```` block of ``README.md`` and ``docs/`` runs. The blocks of one page run in order in one
  namespace (a later block may use what an earlier one defined), on the suite's shared SparkContext. A block is not
  run when the line before its fence says why: ``<!-- not run: needs a Kafka broker -->``. Other fences (``bash``,
  ``text``...) are never run. A failing block fails the test with the page, the block's number and its line.
* The tables the code owns are checked: the metrics page names every metric ``api/status/metrics.py`` defines; the
  errors page every exception class of the library; every repository path a page names (``tests/...``,
  ``examples/...``) exists.

While a page's blocks run, ``SparkContext.stop`` is a no-op (a snippet's ``ssc.stop()`` must not stop the shared
context) and ``awaitTermination()`` without a timeout waits at most 3 s (a snippet written as an application).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..support import library_errors

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not run:\s*\S.*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


def _blocks(path: Path) -> list[tuple[int, int, str, bool]]:
    """``(number, line, code, runs)`` for each python block of the page (numbered from 1 in page order)."""
    lines = path.read_text().split("\n")
    out: list[tuple[int, int, str, bool]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang == "python":
            j = start - 1
            while j >= 0 and not lines[j].strip():  # the marker may stand a blank line above the fence
                j -= 1
            before = lines[j].strip() if j >= 0 else ""
            out.append((len(out) + 1, start + 1, textwrap.dedent("\n".join(body)), not NOT_RUN.match(before)))
    return out


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


RUNNABLE = [p for p in PAGES if any(runs for *_, runs in _blocks(p))]


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, on every build
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").exists()
    settings = (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()
    assert "spark.dstreams.batch.maxAttempts" in settings  # the generated table is there


def test_every_python_block_parses():
    for page in PAGES:
        for number, line, code, _runs in _blocks(page):
            try:
                ast.parse(code)
            except SyntaxError as e:  # a block that is not run must still be Python
                pytest.fail(f"{_name(page)}, python block {number} (line {line}) is not valid Python: {e}")


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_the_python_blocks_of_a_page_run(page: Path, sc, monkeypatch):
    from pyspark import SparkContext

    from dstreams import StreamingContext

    monkeypatch.setattr(SparkContext, "stop", lambda self: None)
    await_termination = StreamingContext.awaitTermination

    def bounded(self, timeout=None):  # noqa: ANN001, ANN202
        if timeout is None:
            self.awaitTerminationOrTimeout(3)
            return None
        return await_termination(self, timeout)

    monkeypatch.setattr(StreamingContext, "awaitTermination", bounded)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    try:
        for number, line, code, runs in _blocks(page):
            if not runs:
                continue
            try:
                exec(compile(code, f"{_name(page)}:block{number}", "exec"), namespace)  # noqa: S102
            except Exception as e:  # noqa: BLE001
                pytest.fail(f"{_name(page)}, python block {number} (line {line}) raised "
                            f"{type(e).__name__}: {e}")
    finally:
        active = StreamingContext.getActive()
        if active is not None:
            active.stop(stopSparkContext=False)


# ----------------------------------------------------------------------------- tables the code owns


def _metric_names_in_code() -> set[str]:
    """Every metric name ``api/status/metrics.py`` defines, counters with Prometheus' ``_total``."""
    text = (ROOT / "api" / "status" / "metrics.py").read_text()
    names: set[str] = set()
    for kind, name in re.findall(r'(Counter|CounterMetricFamily|Histogram|GaugeMetricFamily|InfoMetricFamily)\(\s*'
                                 r'(?:f?"([a-z_{}]+)")', text):
        names.add(f"{name}_total" if kind.startswith("Counter") else name)
    for name in re.findall(r'"(dstreams_[a-z_]+_seconds)",\s*\n?\s*"', text):  # the histograms of one table
        names.add(name)
    if any("{name}" in n for n in names):  # dstreams_last_batch_{name}_seconds
        names = {n for n in names if "{name}" not in n}
        names |= {f"dstreams_last_batch_{n}_seconds" for n in re.findall(r'\("([a-z_]+)", last\.', text)}
    names.discard("dstreams")
    names.add("dstreams_info")  # InfoMetricFamily("dstreams", ...) is exposed as dstreams_info
    return names


def test_the_metrics_page_names_every_metric():
    in_code = _metric_names_in_code()
    assert {"dstreams_batches_completed_total", "dstreams_batch_processing_seconds",
            "dstreams_last_batch_total_delay_seconds", "dstreams_state_caught_up_total"} <= in_code
    page = (DOCS / "reference" / "metrics.md").read_text()
    documented = set(re.findall(r"`(dstreams_[a-z_]+)(?:\{[^`]*\})?`", page))
    assert not in_code - documented, f"metrics missing from docs/reference/metrics.md: {sorted(in_code - documented)}"
    assert not documented - in_code, f"docs/reference/metrics.md names metrics the code does not define: " \
                                     f"{sorted(documented - in_code)}"


def test_the_errors_page_names_every_error_of_the_library():
    page = (DOCS / "reference" / "errors.md").read_text()
    missing = sorted({cls.__name__ for cls in library_errors().values()} - set(re.findall(r"`(\w+)`", page)))
    assert not missing, f"errors missing from docs/reference/errors.md (say what to do about each): {missing}"


PATH = re.compile(r"`((?:tests|examples|benchmarks|scripts|dstreams|api|recovery|docs)/[A-Za-z0-9_./-]*[A-Za-z0-9_])"
                  r"(?:::[^`]*|\[[^`]*\])?`")


def test_every_repository_path_the_docs_name_exists():
    missing = []
    for page in [*PAGES, ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"]:
        if not page.exists():
            continue
        for m in PATH.finditer(page.read_text()):
            target = m.group(1)
            if any(ch in target for ch in "*<>") or target.startswith("benchmarks/results/") and "." not in target:
                continue
            if not (ROOT / target).exists():
                missing.append(f"{_name(page)}: {target}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def test_the_relative_links_of_the_top_level_files_resolve():
    """README.md, CONTRIBUTING.md and CHANGELOG.md are read on the repository's page, outside the site's build."""
    missing = []
    for page in (ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"):
        if not page.exists():
            continue
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{_name(page)}: {target}")
    assert not missing, "broken relative links:\n" + "\n".join(missing)
