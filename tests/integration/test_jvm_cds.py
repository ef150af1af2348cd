"""The driver JVM's class-data-sharing archive (dstreams/spark/jvm_cds.py): built once, mapped by the drivers dstreams'
conf starts, left alone where the user chose JVM options of their own, never where the JVM already runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark import SparkConf

from dstreams.spark import jvm_cds


def test_the_archive_option_is_added_to_the_users_options_unless_they_chose_cds():
    archive = Path("/cache/spark-driver-0123.jsa")
    assert jvm_cds.with_archive(None, archive) == f"-XX:SharedArchiveFile={archive} {jvm_cds.QUIET}"
    assert jvm_cds.with_archive("-Xmx2g", archive).startswith("-Xmx2g -XX:SharedArchiveFile=")
    assert jvm_cds.with_archive("-Xshare:off", archive) is None
    assert jvm_cds.with_archive("-XX:SharedArchiveFile=/mine.jsa", archive) is None
    assert jvm_cds.with_archive(None, Path("/a folder/x.jsa")) is None  # Spark splits the options on spaces


def test_no_archive_for_a_jvm_that_already_runs_or_when_turned_off(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_CACHE_DIR", str(tmp_path))
    path = jvm_cds.archive_path()
    assert path is not None and path.parent == tmp_path and path.name.startswith("spark-driver-")
    path.write_bytes(b"x")
    conf = SparkConf(loadDefaults=False)
    assert not jvm_cds.apply(conf)  # this test run's JVM is running: its options can no longer change
    assert conf.get(jvm_cds.DRIVER_OPTIONS_KEY) is None
    off = SparkConf(loadDefaults=False).set("spark.dstreams.jvm.classDataSharing", "off")
    assert not jvm_cds.apply(off)
    with pytest.raises(ValueError, match="classDataSharing='sometimes' is not auto or off"):
        jvm_cds.apply(SparkConf(loadDefaults=False).set("spark.dstreams.jvm.classDataSharing", "sometimes"))


DRIVER = """
import sys
from pyspark import SparkConf
from dstreams.spark.sparkconf import create_spark_context
conf = SparkConf().set("spark.driver.extraJavaOptions", "-Xlog:class+load=info:file=" + sys.argv[1])
sc = create_spark_context("local[1]", "cds-test", conf)
assert sc.parallelize(range(10), 2).map(lambda x: x * 2).sum() == 90
sc.stop()
"""


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_driver_started_with_dstreams_conf_loads_spark_from_the_archive(tmp_path):
    """Builds the archive when missing (scripts/test.sh builds it first, so that the suite's drivers start
    faster), then a fresh driver process loads Spark's classes from it: the JVM's class-loading log says so."""
    archive = jvm_cds.build()
    assert archive.is_file() and archive.stat().st_size > jvm_cds.MIN_ARCHIVE_BYTES
    classes = tmp_path / "classes.log"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", DSTREAMS_CLASS_DATA_SHARING="auto")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    out = subprocess.run([sys.executable, "-c", DRIVER, str(classes)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    loaded = classes.read_text(errors="replace")
    spark_context = [x for x in loaded.splitlines() if " org.apache.spark.SparkContext source:" in x]
    assert spark_context and spark_context[0].endswith("source: shared objects file (top)"), spark_context
    assert "[warning][cds" not in out.stdout + out.stderr  # a mismatch would be silent, a match is too


def test_each_pyspark_installation_has_its_own_archive(tmp_path, monkeypatch):
    """The JVM takes an archive only with the class path it was made with: a second virtualenv (a fresh clone's)
    must not find the first one's archive, nor delete it."""
    monkeypatch.setenv("DSTREAMS_CACHE_DIR", str(tmp_path))
    here = jvm_cds.archive_path()
    monkeypatch.setattr(jvm_cds, "_jars", lambda: Path("/elsewhere/site-packages/pyspark/jars"))
    elsewhere = jvm_cds.archive_path()
    assert here is not None and elsewhere is not None and here != elsewhere
    assert here.name.split("-")[2] != elsewhere.name.split("-")[2]  # the installation's part of the name


def test_a_virtualenv_made_again_at_the_same_place_gets_a_new_archive(tmp_path, monkeypatch):
    """The same jars at the same place with new modification times (pip installs pyspark again into a fresh
    virtualenv at the path of an old one): the JVM would refuse the old archive silently, so the key changes."""
    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"classes")
    monkeypatch.setattr(jvm_cds, "_jars", lambda: jars)
    before = jvm_cds.archive_key()
    os.utime(jars / "spark-core.jar", ns=(1, 1))
    after = jvm_cds.archive_key()
    assert before is not None and after is not None and before != after
    assert before.split("-")[0] == after.split("-")[0]  # the same installation's place: the old one is replaced


def test_a_dead_builders_half_written_archive_is_not_taken_for_a_live_one(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    assert not jvm_cds._being_built(tmp_path / f"spark-driver-a-b.jsa.tmp-{dead.pid}")
    assert jvm_cds._being_built(tmp_path / f"spark-driver-a-b.jsa.tmp-{os.getpid()}")
    assert not jvm_cds._being_built(tmp_path / "spark-driver-a-b.jsa")
