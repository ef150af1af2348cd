"""The start-up check that executors can import dstreams (and the package shipped to them when not)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from dstreams.spark import executors


def test_package_zip_holds_the_importable_layout(tmp_path):
    path = executors.package_zip(str(tmp_path))
    names = set(zipfile.ZipFile(path).namelist())
    for required in ("dstreams/__init__.py", "dstreams/spark/partitioned.py", "dstreams/nodes/state.py",
                     "dstreams/api/context.py", "dstreams/recovery/store/__init__.py"):
        assert required in names
    assert not any("__pycache__" in n or not n.endswith(".py") for n in names)


def test_the_check_runs_once_per_spark_context(sc):
    executors._checked.discard(id(sc))
    executors.ensure_executors_can_import(sc)
    assert id(sc) in executors._checked
    assert dict(executors._run_probe(sc))["python"]  # the executors report their interpreter


_SCRIPT = textwrap.dedent("""
    import sys
    from pyspark import SparkConf, SparkContext
    from dstreams import StreamingContext
    from dstreams.spark.executors import ExecutorEnvironmentError
    conf = SparkConf().setMaster("local[1]").setAppName("probe").set("spark.pyspark.python", sys.argv[1])
    sc = SparkContext(conf=conf)
    ssc = StreamingContext(sc, 1)
    ssc.generatorStream(1, 1).count().pprint()
    try:
        ssc.start()
    except ExecutorEnvironmentError as e:
        print("ERROR:", e)
    else:
        print("STARTED")
        ssc.stop(stopSparkContext=False)
    sc.stop()
""")


@pytest.mark.fault
def test_executors_on_another_python_get_the_package_or_one_clear_error(tmp_path):
    """Executors running the system Python (no dstreams, no tenacity there): dstreams is shipped, and what
    cannot be shipped (a dependency) is named in one error that says how to fix it."""
    other = "/usr/bin/python3"
    if not os.path.exists(other) or os.path.realpath(other) == os.path.realpath(sys.executable):
        pytest.skip("needs a second Python interpreter at /usr/bin/python3")
    has = subprocess.run([other, "-c", "import tenacity, pyarrow"], capture_output=True, timeout=60).returncode == 0
    script = tmp_path / "probe_app.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": other}
    out = subprocess.run([sys.executable, str(script), other], capture_output=True, text=True, timeout=240,
                         env=env, cwd=str(tmp_path))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "shipping the package" in text, text[-4000:]
    if has:
        assert "STARTED" in out.stdout, text[-4000:]
    else:
        assert "ERROR:" in out.stdout and "PYSPARK_PYTHON" in out.stdout, text[-4000:]
        assert "tenacity" in out.stdout or "pyarrow" in out.stdout, text[-4000:]
