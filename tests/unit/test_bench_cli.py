"""``python -m benchmarks`` lists and runs the benchmarks a user runs (issue 41 item 9); one-off studies stay out.

The CLI's list (``benchmarks.__main__.BENCHMARKS``): each entry names a module of the package with a ``main(argv)``
(or one of the CLI's own commands), and ``python -m benchmarks <name> --help`` reaches that benchmark's options.
The studies ``benchmarks/README.md`` lists under "Studies" are modules of the package, and none is in the list.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.__main__ import BENCHMARKS, BY_NAME, listing

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks" / "README.md"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_without_arguments_it_lists_every_benchmark_by_group():
    run = _cli()
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == listing().strip()
    for b in BENCHMARKS:
        assert re.search(rf"^  {re.escape(b.name)} ", run.stdout, re.M), b.name
    groups = [line[:-1] for line in run.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert groups == list(dict.fromkeys(b.group for b in BENCHMARKS))
    assert {"run", "state", "recovery", "kafka", "event-time", "floor"} <= set(BY_NAME)  # workloads, state, peers


def test_every_listed_benchmark_has_a_main_and_its_help_runs():
    for b in BENCHMARKS:
        if b.module is not None:
            module = importlib.import_module(f"benchmarks.{b.module}")
            assert callable(getattr(module, "main", None)), f"benchmarks.{b.module} has no main(argv)"
    for name in ("run", "state", "track-state"):
        run = _cli(name, "--help")
        assert run.returncode == 0 and "usage:" in run.stdout, (name, run.stdout, run.stderr)


def test_an_unknown_name_fails_with_the_list():
    run = _cli("window_cost")
    assert run.returncode == 2
    assert "no benchmark named 'window_cost'" in run.stderr and "python -m benchmarks.record_cost" in run.stderr
    assert "  state " in run.stderr


def test_the_studies_are_modules_and_not_in_the_list():
    text = README.read_text()
    section = text.split("\n## Studies", 1)[1].split("\n## ", 1)[0]
    studies = set(re.findall(r"`python -m benchmarks\.(\w+)", section))
    assert {"record_cost", "combine_cost", "batch_timeline"} <= studies, studies
    listed = {b.module for b in BENCHMARKS}
    for study in studies:
        assert (ROOT / "benchmarks" / f"{study}.py").exists(), study
        assert study not in listed, f"the one-off study {study} is in the CLI's list"
    assert not (ROOT / "benchmarks" / "event_time_ab.py").exists()  # an A/B of an older checkout: removed
