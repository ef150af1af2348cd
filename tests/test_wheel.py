"""The package as users get it: a wheel built from the checkout, installed (not editable) into a fresh virtualenv
outside the checkout, with its dependencies from the package index (or pip's cache), as ``pip install`` does.

From that virtualenv and a working folder outside the checkout, a small program imports dstreams, checks that it
came from the virtualenv (not the checkout), that the status page's files are found in the installed package and
served by the status server, and runs a tiny pipeline (``queueStream`` -> ``saveAsTextFiles``) to completion on
``StreamingContext.local``. The build itself must print no setuptools warning (a package-data folder missing from
``packages`` used to warn, and a future setuptools drops such folders from the wheel).

Cost (2 cores, dependencies in pip's cache): about a minute, most of it installing pyspark (~300 MB unpacked).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: What the program run in the new virtualenv does; prints one line ``OK <json>`` at the end.
PROGRAM = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    import dstreams
    from dstreams import ManualClock, StreamingContext
    from dstreams.api.status import server

    checkout = sys.argv[1]
    where = os.path.realpath(dstreams.__file__)
    assert where.startswith(os.path.realpath(sys.prefix)), f"dstreams imported from {where}, not the venv"
    assert not where.startswith(os.path.realpath(checkout)), f"dstreams imported from the checkout: {where}"
    for name in ("index.html", "app.js", "style.css"):
        assert server._static(name), f"the status page's {name} is missing from the installed package"

    out = os.path.join(os.getcwd(), "out", "words")
    clock = ManualClock()
    ssc = StreamingContext.local(1, master="local[2]", appName="wheel-test",
                                 conf={"spark.dstreams.ui.port": "0"}, clock=clock)
    sc = ssc.sparkContext
    batches = [sc.parallelize(["a b", "b c"], 2), sc.parallelize(["c"], 1)]
    counts = ssc.queueStream(batches).flatMap(str.split).map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b)
    counts.saveAsTextFiles(out)
    ssc.start()
    try:
        url = ssc.uiWebUrl
        assert url, "the status server did not start"
        page = urllib.request.urlopen(url + "/", timeout=30).read().decode()
        script = urllib.request.urlopen(url + "/static/app.js", timeout=30).read()
        assert "<html" in page.lower() and script, "the status server did not serve the page's files"
        for i in (1, 2):
            clock.advance(1000)
            ssc.awaitBatch(i * 1000, 120)  # raises when the batch has not completed in 120 s
    finally:
        ssc.stop(stopSparkContext=True)
    result = {}
    for ms in (1000, 2000):
        folder = f"{out}-{ms}"
        assert os.path.exists(os.path.join(folder, "_SUCCESS")), f"{folder} was not committed"
        lines = []
        for part in sorted(os.listdir(folder)):
            if part.startswith("part-"):
                with open(os.path.join(folder, part)) as f:
                    lines += [line.strip() for line in f if line.strip()]
        result[ms] = sorted(lines)
    print("OK " + json.dumps(result), flush=True)
    """
)

#: Setuptools' warnings that mean the build is misconfigured (the byte-compiling notes are not).
BUILD_WARNING = re.compile(r"(BuildBackendWarning|SetuptoolsDeprecationWarning|SetuptoolsWarning|"
                           r"is absent from the `packages`|Package would be ignored)")


def _clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell with ``venv`` activated: nothing of the checkout's virtualenv."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PYSPARK_", "VIRTUAL_ENV", "DSTREAMS_", "PYTEST", "SPARK_HOME"))}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = str(venv / "bin" / "python")
    env["PYSPARK_DRIVER_PYTHON"] = str(venv / "bin" / "python")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    return proc


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    timings: dict[str, float] = {}
    start = time.monotonic()
    dist = tmp_path / "dist"
    build = _run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir", "-w", str(dist),
                  str(ROOT)], timeout=300, cwd=tmp_path)
    warnings = [line.strip() for line in (build.stdout + build.stderr).splitlines() if BUILD_WARNING.search(line)]
    assert not warnings, "building the wheel warned:\n" + "\n".join(warnings)
    wheels = list(dist.glob("dstreams-*.whl"))
    assert len(wheels) == 1, wheels
    timings["build"] = time.monotonic() - start

    venv = tmp_path / "venv"
    t = time.monotonic()
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, cwd=tmp_path)  # no --system-site-packages
    env = _clean_env(venv)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", str(wheels[0])], timeout=600, cwd=tmp_path, env=env)
    timings["install"] = time.monotonic() - t

    work = tmp_path / "work"
    work.mkdir()
    (work / "program.py").write_text(PROGRAM)
    t = time.monotonic()
    proc = _run([python, "program.py", str(ROOT)], timeout=300, cwd=work, env=env)
    timings["pipeline"] = time.monotonic() - t
    ok = [line for line in proc.stdout.splitlines() if line.startswith("OK ")]
    assert ok, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(ok[-1][3:])
    assert result == {"1000": ["('a', 1)", "('b', 2)", "('c', 1)"], "2000": ["('c', 1)"]}
    print("wheel test timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
