"""The package as users get it: a wheel built from the checkout, installed (not editable) into a fresh virtualenv
outside the checkout, with its dependencies from the package index (or pip's cache), as ``pip install`` does.

From that virtualenv and a working folder outside the checkout, a small program imports dstreams, checks that it
came from the virtualenv (not the checkout), that the status page's files are found in the installed package and
served by the status server, and runs a tiny pipeline (``queueStream`` -> ``saveAsTextFiles``) to completion on
``StreamingContext.local``. The build itself must print no setuptools warning (a package-data folder missing from
``packages`` used to warn, and a future setuptools drops such folders from the wheel).

A second test runs a Redis + PostgreSQL pipeline from the same installation (the ``redis`` and ``postgres`` extras
installed with the wheel): ``redisStream`` in, ``saveToRedisStream`` and ``saveToPostgres`` out.

Cost (2 cores, dependencies in pip's cache): building ~4 s, installing ~20 s (most of it pyspark, ~300 MB
unpacked), each pipeline ~15-20 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .conftest import BuiltWheel

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

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
    inside = os.path.join(os.path.realpath(checkout), "")  # with the separator: /tmp/x-bt is not in /tmp/x
    assert not where.startswith(inside), f"dstreams imported from the checkout: {where}"
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

#: A Redis + PostgreSQL pipeline run from the installed package: words added to a Redis stream are read with
#: ``redisStream``, counted per batch and written to another stream (``saveToRedisStream``) and to a table
#: (``saveToPostgres``). Arguments: the Redis URL, a key prefix, the DSN, the table. Prints ``OK`` at the end.
SERVICES_PROGRAM = textwrap.dedent(
    """
    import sys
    import psycopg, redis
    from dstreams import ManualClock, StreamingContext

    url, prefix, dsn, table = sys.argv[1:5]
    r = redis.Redis.from_url(url, decode_responses=True)
    for w in "a b a c a".split():
        r.xadd(prefix + "words", {"w": w})
    clock = ManualClock()
    ssc = StreamingContext.local(1, master="local[2]", appName="wheel-services",
                                 conf={"spark.dstreams.ui.enabled": "false"}, clock=clock)
    counts = ssc.redisStream(prefix + "words", url=url, decoder=lambda k, i, f: f["w"]).map(
        lambda w: (w, 1)).reduceByKey(lambda a, b: a + b)
    counts.saveToRedisStream(url, prefix + "counts", fields=["word", "n"])
    counts.saveToPostgres(dsn, table)
    ssc.start()
    try:
        clock.advance(1000)
        ssc.awaitBatch(1000, 120)
    finally:
        ssc.stop(stopSparkContext=True)
    stream = sorted((f["word"], int(f["n"])) for _, f in r.xrange(prefix + "counts"))
    with psycopg.connect(dsn) as conn:
        rows = sorted(conn.execute(f"SELECT word, n FROM {table}").fetchall())
    assert stream == rows == [("a", 3), ("b", 1), ("c", 1)], (stream, rows)
    print("OK", flush=True)
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


@dataclass
class Installed:
    """The wheel installed into a fresh virtualenv: its python, the environment to run it in, a work folder outside
    the checkout, and how long each step took."""

    python: str
    env: dict[str, str]
    work: Path
    timings: dict[str, float]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, dstreams_wheel: BuiltWheel) -> Installed:
    """The wheel (built once per session: ``dstreams_wheel``, tests/integration/conftest.py; no setuptools warning
    allowed) installed with the ``redis`` and ``postgres`` extras, dependencies from the package index or pip's
    cache, into a new virtualenv (no system site-packages)."""
    tmp = tmp_path_factory.mktemp("wheel")
    warnings = [line.strip() for line in dstreams_wheel.output.splitlines() if BUILD_WARNING.search(line)]
    assert not warnings, "building the wheel warned:\n" + "\n".join(warnings)
    wheels = [dstreams_wheel.path]
    timings = {"build": dstreams_wheel.seconds}

    venv = tmp / "venv"
    t = time.monotonic()
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, cwd=tmp)  # no --system-site-packages
    env = _clean_env(venv)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", f"{wheels[0]}[redis,postgres]"], timeout=600, cwd=tmp, env=env)
    timings["install"] = time.monotonic() - t
    work = tmp / "work"
    work.mkdir()
    return Installed(python, env, work, timings)


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_runs_outside_the_checkout(installed: Installed) -> None:
    (installed.work / "program.py").write_text(PROGRAM)
    t = time.monotonic()
    proc = _run([installed.python, "program.py", str(ROOT)], timeout=300, cwd=installed.work, env=installed.env)
    elapsed = time.monotonic() - t
    ok = [line for line in proc.stdout.splitlines() if line.startswith("OK ")]
    assert ok, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(ok[-1][3:])
    assert result == {"1000": ["('a', 1)", "('b', 2)", "('c', 1)"], "2000": ["('c', 1)"]}
    print("wheel test timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in installed.timings.items())
          + f", pipeline {elapsed:.1f}")


@pytest.mark.timeout(600)
def test_a_redis_and_postgres_pipeline_runs_from_the_wheel(installed: Installed, redis_url, redis_client,
                                                            redis_prefix, postgres_dsn) -> None:
    import psycopg

    schema = f"wheel_{redis_prefix.split(':')[1]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.counts (word text PRIMARY KEY, n int NOT NULL)")
    try:
        (installed.work / "services.py").write_text(SERVICES_PROGRAM)
        t = time.monotonic()
        proc = _run([installed.python, "services.py", redis_url, redis_prefix, postgres_dsn, f"{schema}.counts"],
                    timeout=300, cwd=installed.work, env=installed.env)
        assert "OK" in proc.stdout.splitlines(), proc.stdout[-4000:] + proc.stderr[-4000:]
        print(f"wheel Redis + PostgreSQL pipeline: {time.monotonic() - t:.1f} s")
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.timeout(300)
def test_the_demo_runs_from_the_wheel(installed: Installed) -> None:
    """``python -m dstreams.examples.demo`` (the main job) for 4 s of batches, from the folder outside the checkout."""
    t = time.monotonic()
    env = {**installed.env, "DSTREAMS_UI_PORT": "0"}
    proc = _run([installed.python, "-m", "dstreams.examples.demo", "--seconds", "4", "--rate", "1000",
                 "--master", "local[2]"], timeout=240, cwd=installed.work, env=env)
    assert "running count" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(f"wheel demo: {time.monotonic() - t:.1f} s")
