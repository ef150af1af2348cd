"""Fixtures of the integration tests: ``dstreams_wheel``, the wheel built from the checkout once per test session
for the two modules that use it (``test_wheel.py`` installs it into a fresh virtualenv, ``test_submit_packed.py``
ships it to a standalone cluster). Both run on one pytest-xdist worker (``ONE_WORKER_MODULES`` in
``tests/conftest.py``: ``pip wheel`` writes ``build/`` and ``*.egg-info`` in the checkout), so one build serves
both.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BuiltWheel:
    """The dstreams wheel built from the checkout: the file (read it, copy it; never change it: the session shares
    it), what the build printed (verbose: ``test_wheel.py`` looks for setuptools' warnings in it) and how long it
    took."""

    path: Path
    output: str
    seconds: float


@pytest.fixture(scope="session")
def dstreams_wheel(tmp_path_factory: pytest.TempPathFactory) -> BuiltWheel:
    """``pip wheel -v --no-deps --no-cache-dir`` of the checkout, once per session (:class:`BuiltWheel`)."""
    tmp = tmp_path_factory.mktemp("wheel-build")
    dist = tmp / "dist"
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir", "-w", str(dist), str(ROOT)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    wheels = list(dist.glob("dstreams-*.whl"))
    assert len(wheels) == 1, wheels
    return BuiltWheel(wheels[0], proc.stdout + proc.stderr, time.monotonic() - start)
