"""A SparkContext the user built (``StreamingContext(sc, 1)``, as a pyspark.streaming script does).

dstreams sets, on the running context, the low-latency defaults Spark still reads (per task, or when a
Python worker pool starts); it names the others in one warning line with the ``--conf`` flags to pass.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from pyspark import SparkConf

from dstreams import StreamingContext
from dstreams.spark import sparkconf
from dstreams.spark.sparkconf import (
    DAEMON_MODULE_KEY,
    MAX_SOCKET_DIR,
    UDS_DIR_KEY,
    UDS_KEY,
    RunningContextTuning,
    plan_running_context,
)

LOCALITY = "spark.locality.wait"
LOGGER = "dstreams.spark.sparkconf"


def _conf(master: str, **keys: str) -> SparkConf:
    conf = SparkConf(loadDefaults=False).setMaster(master).setAppName("users")
    for k, v in keys.items():
        conf.set(k.replace("_", "."), v)
    return conf


def _plan(conf: SparkConf, *, started: bool = False, tmpdir: str = "/tmp") -> RunningContextTuning:
    return plan_running_context(conf, python_exec=sys.executable, python_workers_started=started,
                                java_tmpdir=tmpdir)


# ------------------------------------------------------------------------------------------ the plan (pure)


def test_a_local_context_gets_everything_it_lacks_and_misses_nothing():
    plan = _plan(_conf("local[2]"))
    assert plan.applied == {DAEMON_MODULE_KEY: "dstreams.spark.worker_daemon", UDS_KEY: "true", LOCALITY: "0"}
    assert plan.missing == {}
    assert plan.missing_line("local[2]") is None


def test_keys_the_user_set_are_left_alone():
    conf = _conf("local[2]")
    conf.set(DAEMON_MODULE_KEY, "pyspark.daemon").set(UDS_KEY, "false").set(LOCALITY, "3s")
    plan = _plan(conf)
    assert plan.applied == {} and plan.missing == {}


def test_the_worker_daemon_only_for_workers_running_this_interpreter():
    plan = plan_running_context(_conf("local[2]"), python_exec="/nonexistent/python2",
                                python_workers_started=False, java_tmpdir="/tmp")
    assert DAEMON_MODULE_KEY not in plan.applied and DAEMON_MODULE_KEY not in plan.missing
    assert plan.applied[UDS_KEY] == "true"


def test_unix_sockets_are_missing_once_a_worker_pool_runs_with_the_same_daemon():
    conf = _conf("local[2]")
    conf.set(DAEMON_MODULE_KEY, "pyspark.daemon")  # the user's choice: the pool's key will not change
    plan = _plan(conf, started=True)
    assert plan.missing == {UDS_KEY: "true"}
    # with the daemon module changing, the next task starts a new pool, which reads the socket switch
    assert _plan(_conf("local[2]"), started=True).applied[UDS_KEY] == "true"


def test_a_java_tmpdir_too_long_for_socket_paths_puts_the_sockets_in_tmp():
    plan = _plan(_conf("local[2]"), tmpdir="/x" * MAX_SOCKET_DIR)
    assert plan.applied[UDS_DIR_KEY] == "/tmp" and plan.applied[UDS_KEY] == "true"


@pytest.mark.parametrize("master", ["local-cluster[2,1,1024]", "spark://127.0.0.1:7077", "yarn"])
def test_cluster_masters_take_only_driver_side_settings_and_name_the_rest(master):
    plan = _plan(_conf(master))
    assert plan.applied == {LOCALITY: "0"}  # read by the driver's scheduler per task set
    assert plan.missing[UDS_KEY] == "true" and plan.missing["spark.speculation"] == "true"
    assert (DAEMON_MODULE_KEY in plan.missing) == master.startswith("local")
    line = plan.missing_line(master)
    assert line is not None and "\n" not in line
    for k, v in plan.missing.items():
        assert f"--conf {k}={v}" in line


# ------------------------------------------------------------------------- on the shared SparkContext


def test_a_tuned_context_is_left_alone_and_logs_nothing(sc, caplog):
    before = dict(sc._conf.getAll())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        StreamingContext(sc, 1)
    assert [r for r in caplog.records if r.name == LOGGER] == []
    assert dict(sc._conf.getAll()) == before


def test_settings_removed_from_the_running_context_are_applied_again(sc, caplog, monkeypatch):
    """The shared context with its runtime-settable keys removed stands for a user-made local context."""
    jconf = sc._jsc.sc().conf()
    keys = (DAEMON_MODULE_KEY, UDS_KEY, LOCALITY)
    saved = {k: jconf.get(k) for k in keys}
    monkeypatch.setattr(sparkconf, "_warned_contexts", set())
    try:
        for k in keys:
            jconf.remove(k)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            StreamingContext(sc, 1)
        conf = sc._conf  # the live conf (getConf() also loads the JVM's system properties)
        assert {k: conf.get(k) for k in keys} == saved == {
            DAEMON_MODULE_KEY: "dstreams.spark.worker_daemon", UDS_KEY: "true", LOCALITY: "0"}
        lines = [r for r in caplog.records if r.name == LOGGER]
        assert [r.levelno for r in lines] == [logging.INFO], [r.getMessage() for r in lines]
        assert all(f"{k}={v}" in lines[0].getMessage() for k, v in saved.items())
        assert sc.parallelize(range(4), 2).map(lambda x: x * 2).sum() == 12
    finally:
        for k, v in saved.items():
            jconf.set(k, v)


# ------------------------------------------------- separately configured contexts (one subprocess, ~15 s)

_APP = textwrap.dedent(
    """
    import json, logging, os, subprocess, sys
    from pyspark import SparkConf, SparkContext
    from dstreams import StreamingContext

    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append((r.levelname, r.getMessage()))
    logging.getLogger("dstreams.spark.sparkconf").addHandler(handler)
    logging.getLogger("dstreams.spark.sparkconf").setLevel(logging.INFO)

    def daemons(sc):
        jvm_pid = sc._jvm.ProcessHandle.current().pid()
        out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(jvm_pid)], capture_output=True,
                             text=True).stdout
        found = []
        for line in out.splitlines():
            pid, args = line.strip().split(None, 1)
            if "daemon" in args:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
                uds = [e.decode() for e in env if e.startswith(b"PYTHON_UNIX_DOMAIN_ENABLED=")]
                found.append({"args": args, "uds": uds})
        return found

    # 1. what a pyspark.streaming script does: a plain local context, then StreamingContext(sc, 1)
    sc = SparkContext("local[2]", "user-made")
    sc.setLogLevel("ERROR")
    StreamingContext(sc, 1)
    assert sc.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10
    local = {"logs": records[:], "daemons": daemons(sc)}
    sc.stop()

    # 2. a local-cluster context: executor-side settings cannot be applied to a running one
    del records[:]
    sc = SparkContext(conf=SparkConf().setMaster("local-cluster[1,1,512]").setAppName("user-made-cluster")
                      .set("spark.executor.memory", "512m"))
    sc.setLogLevel("ERROR")
    StreamingContext(sc, 1)
    StreamingContext(sc, 1)  # said once per context
    cluster = {"logs": records[:], "locality": sc.getConf().get("spark.locality.wait")}
    sc.stop()
    print("RESULT " + json.dumps({"local": local, "cluster": cluster}))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_user_made_context_gets_the_worker_daemon_and_a_cluster_one_logs_what_to_pass(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_GATEWAY_PORT")}
    env["PYSPARK_PYTHON"] = sys.executable  # the workers run this interpreter, where dstreams is installed
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", _APP], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=110)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])

    local = result["local"]
    assert [level for level, _ in local["logs"]] == ["INFO"], local["logs"]  # applied; nothing missing
    assert f"{DAEMON_MODULE_KEY}=dstreams.spark.worker_daemon" in local["logs"][0][1]
    # the JVM started dstreams' daemon, with Unix sockets on, and never pyspark's own
    assert [d["args"].split()[1:3] for d in local["daemons"]] == [["-m", "dstreams.spark.worker_daemon"]]
    assert [e.lower() for e in local["daemons"][0]["uds"]] == ["python_unix_domain_enabled=true"]

    cluster = result["cluster"]
    warnings = [msg for level, msg in cluster["logs"] if level == "WARNING"]
    assert len(warnings) == 1, cluster["logs"]
    for flag in (f"--conf {DAEMON_MODULE_KEY}=dstreams.spark.worker_daemon", f"--conf {UDS_KEY}=true",
                 "--conf spark.speculation=true"):
        assert flag in warnings[0], warnings[0]
    assert cluster["locality"] == "0"


# ------------------------------------------------------------------ the benchmark's user-context mode


def test_the_benchmarks_user_context_mode_runs_each_engine_on_a_plain_context():
    from benchmarks.__main__ import engines_to_run
    from benchmarks.engines import ENGINES, UNTUNED_ENGINES

    assert engines_to_run(None, user_context=True) == ["dstreams-user", "pyspark.streaming-defaults"]
    assert engines_to_run(["dstreams", "ss-sql"], user_context=True) == ["dstreams-user", "ss-sql"]
    assert engines_to_run(None, user_context=False) == list(ENGINES)
    assert {"dstreams-user", "pyspark.streaming-defaults"} <= UNTUNED_ENGINES
    assert ENGINES["dstreams-user"] is ENGINES["dstreams"]  # the same workload code, another context
