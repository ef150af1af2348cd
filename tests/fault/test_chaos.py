"""Issues 22 and 40: the short randomized fault schedule (``python -m benchmarks chaos``) on the real Ceph gateway
and a real Kafka broker.

The command runs the chaos pipeline (benchmarks/chaos_app.py: Redis Streams and an ``s3://`` prefix in,
``updateStateByKey``, ``reduceByKeyAndWindow`` with an inverse, an event-time window, a session window,
``saveToStore`` to Ceph, ``saveAsTextFiles``, and exactly once into a Redis stream and a PostgreSQL table
out; and in the same driver a Kafka -> ``updateStateByKey`` -> ``saveToKafka`` branch, ``--kafka``) through a
seeded 1.5-minute schedule (faults 9-13 s apart) in which every fault kind comes once (driver SIGKILL, a kill
inside an output, SIGTERM, the gateway down, a Redis server restart, dropped Redis connections, an executor JVM
killed on ``local-cluster``, a user function that fails once, a PostgreSQL restart, a Kafka broker restart, a
driver killed inside a Kafka write, a poison line in an input file that the parser routes to the dead letters),
with its own Redis and PostgreSQL servers, Kafka broker (the jars
``scripts/services.sh start kafka`` gathered; with ``DSTREAMS_TEST_KAFKA_BOOTSTRAP`` that broker instead, never
restarted: no broker restart then) and fault proxies (the shared services are not touched), then runs the same
pipeline without faults over the batches the chaos run committed. The test reads the command's JSON: every fault
was injected, every output's committed batches equal the fault-free run's batch by batch, every input record is in
exactly one committed batch, and a read_committed consumer of the Kafka output sees every committed input record
once, in input order per key, with the running counts 1, 2, 3, ... ``DSTREAMS_TEST_SEED`` picks another seed (the
schedule is a function of it).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from ..support import KAFKA_BOOTSTRAP, RGW_ENDPOINT, kafka_is_external, require_kafka, scaled, service_unavailable

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.s3, pytest.mark.ceph, pytest.mark.kafka]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED = int(os.environ.get("DSTREAMS_TEST_SEED") or 7)
# A dense schedule: faults 9-13 s apart over 1.5 min, one of each kind (the first round), and at most 5 s of waiting
# for a steady stream before each fault (3x before the first and after the last; DSTREAMS_TEST_CHAOS_STEADY_WAIT_S to
# choose). After a restart the pipeline catches its backlog up at about 2 batches per batch interval, so it is rarely
# steady within 30 s even on a quiet machine, and a longer wait only spaces the faults out. Measured on a quiet
# machine (2026-11-26): 330 s with the benchmark's short schedule (gaps of 14-20 s over 2 min, 10 s waits; 110
# batches for the reference to replay), 263 s with these gaps and 10 s waits, 241 s with 5 s waits (73 batches).
# Harsher too: a fault more often meets the recovery from the one before. With the Kafka branch and its two kinds the
# round is 11 faults (the last at 108 s for seed 7); measured back to back on a 2-core machine that other jobs loaded
# (2026-11-27, load 1-7): 269 s with it (31 batches), 269 s without it (29 batches).
MINUTES = 1.5
GAP = "9,13"
# At the CI scale (tests/support.py's ci_scale) 2 s: in a run measured at load 4 (2026-11-29) every one of these waits
# ran out (none of the 12 faults found a steady stream within 5 s, nor the start and the end within 15 s), so they
# only added 90 s; the faults, their order and their parameters are the same.
STEADY_WAIT_S = float(os.environ.get("DSTREAMS_TEST_CHAOS_STEADY_WAIT_S") or scaled(5, 2))
RUN_TIMEOUT_S = 1500  # ~4 min on a quiet machine: set-up, 2 min of faults and recoveries, the reference


def _kafka() -> str:
    """``--kafka``: ``own`` (a broker of the run's own, from the jars of ``scripts/services.sh start kafka``), or the
    external broker of ``DSTREAMS_TEST_KAFKA_BOOTSTRAP`` (never restarted)."""
    pytest.importorskip("confluent_kafka")
    if kafka_is_external():
        return require_kafka()
    from benchmarks.chaos import KAFKA_JARS

    if not any(KAFKA_JARS.glob(".complete-*")):
        service_unavailable(f"the Kafka broker's jars are not in {KAFKA_JARS} (the chaos run starts and restarts a "
                            "broker of its own from them); run `bash scripts/services.sh start kafka`")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        service_unavailable("Java is not installed (the chaos run's Kafka broker needs Java 17+); run "
                            "`bash scripts/services.sh start kafka`")
    return "own"


def _services() -> None:
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=RGW_ENDPOINT, aws_access_key_id="AKTEST", aws_secret_access_key="SKTEST",
                          region_name="us-east-1", config=Config(s3={"addressing_style": "path"},
                                                                 retries={"max_attempts": 1}, connect_timeout=2))
    try:
        client.list_buckets()
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"Ceph RGW at {RGW_ENDPOINT} is not reachable ({e}); run `bash scripts/services.sh start`")
    if shutil.which("redis-server") is None:
        service_unavailable("redis-server is not installed (the chaos run starts and restarts its own); "
                            "run `bash scripts/services.sh start redis`")
    if shutil.which("pg_ctl") is None and not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        service_unavailable("PostgreSQL is not installed (the chaos run starts and restarts its own cluster); "
                            "run `bash scripts/services.sh start postgres`")


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds executor JVMs through /proc")
def test_short_chaos_schedule_commits_what_a_fault_free_run_commits(tmp_path):
    _services()
    kafka = _kafka()
    out = tmp_path / "chaos.json"
    log_path = tmp_path / "chaos.log"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, "-m", "benchmarks", "chaos", "--seed", str(SEED), "--minutes", str(MINUTES),
           "--gap", GAP, "--steady-wait", str(STEADY_WAIT_S), "--json", str(out), "--workdir", str(tmp_path / "work"),
           "--rgw", RGW_ENDPOINT, "--kafka", kafka]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)  # the command's own teardown stops its drivers, Redis server and proxies
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
            raise AssertionError(f"chaos run still running after {RUN_TIMEOUT_S} s\n"
                                 f"{log_path.read_text(errors='replace')[-4000:]}") from None
    text = log_path.read_text(errors="replace")
    assert out.exists(), f"no results (rc={rc})\n{text[-4000:]}"
    doc = json.loads(out.read_text())
    assert "error" not in doc, f"{doc['error']}\n{text[-4000:]}"

    # Every kind of fault was injected as planned (a broker restart only when the broker is the run's own).
    kinds = {f["kind"] for f in doc["schedule"]}
    assert kinds == {"driver-kill", "driver-kill-in-output", "driver-term", "gateway-down", "redis-restart",
                     "redis-drop", "executor-kill", "user-fail", "postgres-restart", "kafka-kill", "poison-record"} | (
        {"kafka-restart"} if kafka == "own" else set()), (kafka, KAFKA_BOOTSTRAP)
    not_injected = [f for f in doc["schedule"] if f["outcome"] != "injected"]
    assert not not_injected, not_injected
    unfired = [f for f in doc["schedule"] if f["kind"] == "user-fail" and not f["detail"].get("fired")]
    assert not unfired, unfired  # the marked batch's first attempt failed

    # Batch by batch, every output equals the fault-free run's; nothing lost, nothing twice.
    cmp_ = doc["comparison"]
    # Not vacuous: the comparison covered batches. How many depends on the machine's load (faults come on a wall
    # clock: 29-31 batches on a quiet 2-core machine, 3-12 at a load of 5-15), so the floor is low.
    assert cmp_["batches_compared"] >= 3, cmp_["batches_compared"]
    for name, o in cmp_["outputs"].items():
        assert not o["missing"] and not o["missing_in_reference"] and not o["differ"], (name, o, cmp_["mismatches"])
    totals = cmp_["totals"]
    assert totals["lost"] == 0 and totals["duplicated"] == 0 and totals["unexpected"] == 0, totals
    assert totals["records_seen"] == totals["expected_records"] > 0
    assert totals["final_counts_equal_input"]
    for name in ("events", "stream", "table"):  # the exactly-once sinks too: every record once, batch by batch
        o = totals["by_output"][name]
        assert o["lost"] == o["duplicated"] == o["unexpected"] == 0 and o["records_seen"] == totals["expected_records"]
    assert {"stream", "table", "dead"} <= set(cmp_["outputs"])
    # The poison line the poison-record fault wrote into an input file: once in the dead letters, through the faults
    # (the dead output equals the reference's batch by batch, checked above with the other outputs).
    dead = cmp_["dead_letters"]
    assert dead["poison_lines"] == 1 and dead["seen"] == 1, dead
    assert not dead["missing"] and not dead["duplicated"] and not dead["unexpected"], dead
    # The Kafka output, as a read_committed consumer sees it: per key every committed input record of the offset
    # ranges the batches read (one after the other from offset 0) once, in input order, counted 1, 2, 3, ... (the
    # fault-free result), through the broker restart and the kill inside a write.
    k = cmp_["kafka"]
    assert k["batches_with_ranges"] >= cmp_["batches_compared"] and not k["range_gaps"], k
    assert k["expected_records"] > 0 and k["output_records"] == k["expected_records"], k
    assert k["lost"] == k["duplicated"] == k["unexpected"] == 0, k
    assert not k["keys_differ"] and not k["bad_counts"] and not k["malformed"] and k["ok"], k
    assert doc["kafka_run"]["broker_restarts"] == (1 if kafka == "own" else 0), doc["kafka_run"]
    assert cmp_["ok"] and doc["ok"] and rc == 0

    # Every restarted driver committed a batch unless the next fault ended it first (a Redis restart while it
    # started, a kill before its first batch: its successor is another recovery), and the figures were measured.
    recoveries = doc["recoveries"]
    assert recoveries, doc
    ended = {r["prev_pid"] for r in recoveries}
    silent = [r for r in recoveries if r["first_commit_s"] is None and r["pid"] not in ended]
    assert not silent, silent
    assert recoveries[-1]["first_commit_s"] is not None, recoveries[-1]
