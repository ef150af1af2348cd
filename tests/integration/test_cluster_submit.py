"""``spark-submit``: the submitted master and ``--conf`` values reach dstreams' tuned conf (docs/guide/cluster.md).

Under ``spark-submit`` the driver JVM runs before Python starts, with the user's ``--master`` and
``--conf`` as system properties. ``dstreams.spark.sparkconf.tuned_conf`` must read them (a SparkConf made
before PySpark connects to that JVM cannot), so that the master is the submitted one, dstreams'
speculation defaults apply on a non-local master, and the user's ``--conf`` wins over those defaults.
No SparkContext is started: the script only builds the conf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json
from dstreams.spark.sparkconf import tuned_conf
conf = tuned_conf("local[*]", "submitted")
keys = ["spark.master", "spark.app.name", "spark.speculation", "spark.speculation.multiplier",
        "spark.speculation.quantile", "spark.locality.wait"]
print("CONF " + json.dumps({k: conf.get(k) for k in keys}))
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_spark_submit_master_and_conf_reach_tuned_conf(tmp_path):
    import pyspark

    app = tmp_path / "app.py"
    app.write_text(SCRIPT)
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    args = [submit, "--master", "local-cluster[2,1,1024]", "--conf", "spark.speculation.multiplier=2",
            "--conf", f"spark.pyspark.driver.python={sys.executable}", str(app)]
    proc = subprocess.run(args, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=150)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("CONF ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    conf = json.loads(lines[-1][len("CONF "):])
    assert conf["spark.master"] == "local-cluster[2,1,1024]"  # the submitted master, not the argument
    assert conf["spark.speculation"] == "true"  # dstreams' default off local masters
    assert conf["spark.speculation.multiplier"] == "2"  # the user's --conf wins over the default 1.4
    assert conf["spark.speculation.quantile"] == "0.5"
    assert conf["spark.locality.wait"] == "0"
