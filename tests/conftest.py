"""Shared fixtures: one SparkContext for the whole test run (a context costs seconds to start)."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def sc():
    from dstreams.sparkconf import create_spark_context

    local_dir = tempfile.mkdtemp(prefix="dstreams-spark-local-", dir=os.environ.get("DSTREAMS_TEST_TMP"))
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={local_dir}",
        "spark.default.parallelism": "2",
        "spark.sql.shuffle.partitions": "2",
    }
    context = create_spark_context("local[2]", "dstreams-tests", conf)
    yield context
    context.stop()


@pytest.fixture(autouse=True)
def _no_active_context_leak():
    """Every test must stop the StreamingContexts it starts."""
    yield
    from dstreams import StreamingContext

    active = StreamingContext.getActive()
    if active is not None:
        active.stop(stopSparkContext=False)
        pytest.fail("a test left a StreamingContext active")
