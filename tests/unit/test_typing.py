"""``DStream`` is generic as ``pyspark.streaming``'s (issue 41 item 6), checked by mypy at the project's settings.

One mypy run (``scripts/typecheck.py``: pyproject.toml's ``[tool.mypy]``) over the library and two files that are
never run: ``tests/unit/typing_check.py``, whose every line must type-check, and ``tests/unit/typing_reject.py``, whose
lines marked ``# rejected`` must each be an error and whose other lines must not.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ACCEPTED = "tests/unit/typing_check.py"
REJECTED = "tests/unit/typing_reject.py"


def test_the_typed_pipelines_check_and_the_wrong_ones_do_not():
    run = subprocess.run([sys.executable, "scripts/typecheck.py", "dstreams", "api", "recovery", ACCEPTED, REJECTED],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert run.stdout.strip().endswith("source files"), run.stdout + run.stderr  # mypy ran to its summary
    elsewhere = [e for e in errors if not e.startswith(f"{REJECTED}:")]
    assert not elsewhere, "must type-check:\n" + "\n".join(elsewhere)
    lines = (ROOT / REJECTED).read_text().splitlines()
    marked = {i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# rejected")}
    assert len(marked) >= 8
    found = {int(m.group(1)) for e in errors if (m := re.match(rf"{re.escape(REJECTED)}:(\d+):", e))}
    assert found == marked, (f"lines of {REJECTED} that must be errors and are not: {sorted(marked - found)}; "
                             f"errors on lines not marked: {sorted(found - marked)}\n" + "\n".join(errors))
