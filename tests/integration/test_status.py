"""The status server: its JSON API and Prometheus metrics agree with ``ssc.batchInfos()`` on a real run.

One context runs four batches on a manual clock, with a checkpoint location (so the driver has an epoch), a
state stream checkpointed every 2 s, a window and an output that fails in one batch. The server is the one
``start()`` runs (the tests' SparkContext puts it on a free port). The last test fences the driver off with a
second metadata-log owner and sees it on the page's JSON and in the metrics.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import socket
import tempfile
import time
import types
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dstreams import ManualClock, StreamingContext
from dstreams.api.status.server import StatusServer, bind, public_url
from dstreams.recovery.metadata import MetadataLog
from dstreams.recovery.storespec import StoreSpec

TIMEOUT_S = 60
BATCHES = 4
FAILING_BATCH = 3  # the third batch's second output operation raises
RECORDS_PER_PARTITION, PARTITIONS = 3, 2  # every record a word of its own: the state grows by 6 keys a batch


def get(url: str) -> tuple[int, str, str]:
    """Status, content type and body of a GET (errors included)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def get_json(url: str) -> Any:
    status, content_type, body = get(url)
    assert status == 200, (url, status, body)
    assert content_type.startswith("application/json")
    return json.loads(body)


def wait_for(what: str, check, timeout_s: float = TIMEOUT_S) -> Any:
    """Poll ``check()`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def metrics(url: str) -> dict[str, Any]:
    """``/metrics`` parsed by prometheus_client's own parser: family name -> family."""
    status, content_type, body = get(url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(body)}


def sample(families: dict[str, Any], family: str, name: str | None = None, **labels: str) -> float:
    for s in families[family].samples:
        if s.name == (name or family) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((family, name, labels))


def post_status(url: str) -> int:
    request = urllib.request.Request(url, data=b"x", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture(scope="module")
def run(sc):
    """Runs the context, reads every endpoint while it is active (the tests' autouse fixture wants no context
    left active after a test), fences it off, reads again, stops it. The tests check what was read."""
    checkpoint_dir = tempfile.mkdtemp(prefix="dstreams-status-", dir=os.environ.get("DSTREAMS_TEST_TMP"))
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.checkpoint(checkpoint_dir)
    words = ssc.generatorStream(RECORDS_PER_PARTITION, PARTITIONS,
                                recordFunc=lambda seed, t, p, n: [f"w{t}-{p}-{j}" for j in range(n)])
    counts = words.map(lambda w: (w, 1)).runningReduce(operator.add)
    counts.checkpoint("2s")
    counts.foreachRDD(lambda rdd: rdd.count())
    calls: list[int] = []

    def fail_once(rdd):
        calls.append(1)
        if len(calls) == FAILING_BATCH:
            raise ValueError("status test: this output fails on purpose")

    words.window(2, 1).foreachRDD(fail_once)
    r = types.SimpleNamespace(clock=clock, checkpoint_dir=checkpoint_dir)
    with pytest.MonkeyPatch.context() as mp:  # the failing batch is dropped (one try) and the stream goes on
        mp.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
        mp.setenv("DSTREAMS_BATCH_ON_FAILURE", "dropInput")
        ssc.start()
    try:
        r.start = start = ssc.startTime.ms
        for i in range(BATCHES):
            clock.advance(1000)
            ssc.awaitBatch(start + i * 1000, TIMEOUT_S)
        ssc._checkpointer.flush(TIMEOUT_S)
        r.url = url = ssc.uiWebUrl
        r.app_name = ssc.sparkContext.appName
        r.infos = [i.snapshot() for i in ssc.batchInfos()]
        r.clock_ms = clock.time_ms()
        r.batches = get_json(url + "/api/batches")
        r.newer = get_json(url + f"/api/batches?after={start + 1000}")
        r.bad_after = get(url + "/api/batches?after=soon")
        r.failing = start + (FAILING_BATCH - 1) * 1000
        r.detail = get_json(url + f"/api/batches/{r.failing}")
        r.no_batch = get(url + "/api/batches/12345")

        def state_known() -> Any:
            streams = get_json(url + "/api/streams")
            state = next(n for n in streams["nodes"] if n["kind"] == "state")["state"]
            return streams if state["keys"] is not None else None

        r.streams = wait_for("the state size read from the newest checkpoint's manifest", state_known)
        r.status = get_json(url + "/api/status")
        r.errors = get_json(url + "/api/errors")
        r.writes = list(ssc._checkpointer.recent_writes)  # flushed above: no write runs now
        r.metrics = metrics(url)
        r.files = {path: get(url + path) for path in ("/", "/static/app.js", "/static/style.css",
                                                      "/static/..%2Fserver.py", "/static/model.py", "/nothing")}
        r.api_index = get_json(url + "/api")
        r.post = post_status(url + "/api/status")
        # A second driver takes the checkpoint location over: this one fails its next commit and stops generating.
        store = StoreSpec(checkpoint_dir).open()
        head = MetadataLog.read(store)
        MetadataLog(store, head["app"], head["fingerprint"], head["batch_ms"]).take_over(head["zero_ms"])
        clock.advance(1000)
        r.fenced_driver = wait_for("the fence to show",
                                   lambda: (d := get_json(url + "/api/status")["driver"])["fenced"] and d)
        r.fenced_errors = get_json(url + "/api/errors")
        r.fenced_metrics = metrics(url)
    finally:
        ssc.stop(stopSparkContext=False)
    r.url_after_stop = ssc.uiWebUrl
    try:
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()
        r.port_released = False
    except OSError:
        r.port_released = True
    return r


def test_the_server_runs_with_the_context(run):
    assert run.url.startswith("http://127.0.0.1:")  # SPARK_LOCAL_IP (tests/conftest.py), port 0: a free one
    assert run.url_after_stop is None and run.port_released


def test_the_batches_are_those_of_batch_infos(run):
    infos = run.infos
    assert [i.batch_time_ms for i in infos] == [run.start + k * 1000 for k in range(BATCHES)]
    assert [b["batch_time_ms"] for b in run.batches] == [i.batch_time_ms for i in infos]
    for b, info in zip(run.batches, infos, strict=True):
        assert b["num_records"] == info.num_records == info.numRecords() == RECORDS_PER_PARTITION * PARTITIONS
        assert b["scheduling_delay_ms"] == info.scheduling_delay_ms == info.schedulingDelay()
        assert b["processing_delay_ms"] == info.processing_delay_ms == info.processingDelay()
        assert b["total_delay_ms"] == info.total_delay_ms == info.totalDelay()
        assert b["submission_time_ms"] == info.submissionTime()
        assert b["processing_start_time_ms"] == info.processingStartTime()
        assert b["processing_end_time_ms"] == info.processingEndTime()
        assert b["input_records"] == {"000-GeneratorInputNode": info.num_records}
        assert b["failed"] == info.failed == (info.batch_time_ms == run.failing)
        assert b["dropped"] == info.dropped == (info.batch_time_ms == run.failing)
        assert b["attempts"] == info.attempts == 1
        assert (b["failure"] is None) == (info.batch_time_ms != run.failing)
        assert b["job_group"] == info.job_group
    assert [b["batch_time_ms"] for b in run.newer] == [i.batch_time_ms for i in infos[2:]]
    assert run.bad_after[0] == 400 and "after must be a batch time" in run.bad_after[2]


def test_one_batch_in_detail(run):
    ops = run.detail["output_operations"]
    assert [op["id"] for op in ops] == [0, 1]
    assert ops[0]["failure_reason"] is None
    assert "this output fails on purpose" in ops[1]["failure_reason"]
    info = next(i for i in run.infos if i.batch_time_ms == run.failing)
    assert ops[1]["duration_ms"] == info.output_operations[1].duration_ms
    jobs = run.detail["spark_jobs"]  # found by the batch's job group; the tests' Spark UI is off: no links
    assert jobs and all(isinstance(j["id"], int) and j["url"] is None for j in jobs)
    assert run.no_batch[0] == 404 and "no batch" in run.no_batch[2]


def test_the_status_document(run):
    s = run.status
    app = s["app"]
    assert app["state"] == "ACTIVE" and app["batch_interval_ms"] == 1000 and app["app_name"] == run.app_name
    assert app["first_batch_time_ms"] == run.start
    assert app["last_completed_batch_ms"] == run.start + (BATCHES - 1) * 1000
    assert app["status_url"] == run.url and app["spark_ui_url"] is None  # the tuned conf turns Spark's UI off
    assert s["driver"] == {"epoch": 1, "fenced": False, "checkpoint_location": run.checkpoint_dir,
                           "checkpoint_location_temporary": False, "metadata_log": True}
    records = sum(i.num_records for i in run.infos)
    assert s["totals"] == {"batches_submitted": BATCHES, "batches_completed": BATCHES, "batches_failed": 1,
                           "batches_dropped": 1, "batches_pending": 0, "input_records": records,
                           "listener_events_dropped": 0}
    [source] = s["sources"]
    assert source["key"] == "000-GeneratorInputNode" and source["records_total"] == records
    assert source["rate_per_s"] == pytest.approx(records / BATCHES)  # 1 s batches
    assert s["timeline_ms"] == 600_000
    [error] = s["errors"]
    assert error["batch_time_ms"] == run.failing
    assert error["where"] == "output operation 1 (fail_once)" and "fails on purpose" in error["message"]
    assert run.errors == s["errors"]


def test_the_stream_graph_with_kinds_state_and_watermarks(run):
    streams = run.streams
    nodes = {n["key"]: n for n in streams["nodes"]}
    # runningReduce's state (picked by size: spark.dstreams.state.store=auto), then its public view
    assert [n["kind"] for n in streams["nodes"]] == ["source", "transform", "state", "transform", "output", "window",
                                                     "output"]
    assert streams["edges"] == [[d, n["key"]] for n in streams["nodes"] for d in n["depends_on"]]
    assert all(n["watermark"] is None for n in streams["nodes"])  # no event time in this graph
    state = nodes["002-AutoRunningReduceNode"]
    assert state["name"].startswith("runningReduce#") and state["stateful"]
    newest = run.start + 3000  # checkpoints every 2 s of batch time: 2000 and 4000
    st = state["state"]
    assert st["newest_checkpoint_ms"] == newest and st["size_as_of_ms"] == newest
    assert (st["kept_in"], st["picked_by_size"], st["moved_at_ms"]) == ("rdd", True, None)  # small: not moved
    # Every record a new word, but those of the failing batch, whose input was dropped (onFailure=dropInput).
    assert st["keys"] == (BATCHES - 1) * RECORDS_PER_PARTITION * PARTITIONS
    assert st["bytes"] > 0 and st["checkpoint_interval_ms"] == 2000
    assert st["newest_checkpoint_age_ms"] == run.clock_ms - newest
    assert nodes["005-WindowedNode"]["window_ms"] == 2000 and nodes["005-WindowedNode"]["state"] is None
    assert nodes["000-GeneratorInputNode"]["input"]["records_total"] == sum(i.num_records for i in run.infos)
    assert nodes["006-OutputNode"]["name"] == "fail_once#" + str(nodes["006-OutputNode"]["id"])


def test_metrics_parse_and_match_the_batches(run):
    infos, m = run.infos, run.metrics
    assert sample(m, "dstreams_batches_completed", "dstreams_batches_completed_total") == len(infos)
    assert sample(m, "dstreams_batches_submitted", "dstreams_batches_submitted_total") == len(infos)
    assert sample(m, "dstreams_batches_failed", "dstreams_batches_failed_total") == 1
    assert sample(m, "dstreams_batches_dropped", "dstreams_batches_dropped_total") == 1
    assert sample(m, "dstreams_batch_retries", "dstreams_batch_retries_total") == 0
    assert sample(m, "dstreams_batches_pending") == 0
    assert sample(m, "dstreams_input_records", "dstreams_input_records_total", source="000-GeneratorInputNode") == sum(
        i.num_records for i in infos)
    for family, field in (("dstreams_batch_processing_seconds", "processing_delay_ms"),
                          ("dstreams_batch_scheduling_delay_seconds", "scheduling_delay_ms"),
                          ("dstreams_batch_total_delay_seconds", "total_delay_ms")):
        assert m[family].type == "histogram"
        assert sample(m, family, family + "_count") == len(infos)
        assert sample(m, family, family + "_sum") == pytest.approx(sum(getattr(i, field) for i in infos) / 1000.0)
        assert sample(m, family, family + "_bucket", le="+Inf") == len(infos)
    last = infos[-1]
    assert sample(m, "dstreams_last_batch_processing_seconds") == pytest.approx(last.processing_delay_ms / 1000)
    assert sample(m, "dstreams_last_completed_batch_time_seconds") == last.batch_time_ms / 1000
    assert sample(m, "dstreams_batch_interval_seconds") == 1.0
    stream = "002-AutoRunningReduceNode"
    assert sample(m, "dstreams_state_keys", stream=stream) == (BATCHES - 1) * RECORDS_PER_PARTITION * PARTITIONS
    assert sample(m, "dstreams_state_bytes", stream=stream) == run.streams["nodes"][2]["state"]["bytes"]
    assert sample(m, "dstreams_checkpoint_age_seconds", stream=stream) == pytest.approx(
        (run.clock_ms - run.start - 3000) / 1000)
    assert sample(m, "dstreams_checkpoint_failures", "dstreams_checkpoint_failures_total") == 0
    family = "dstreams_checkpoint_write_seconds"
    assert m[family].type == "histogram" and run.writes and all(w.committed for w in run.writes)
    assert {w.node_key for w in run.writes} == {stream}
    assert sample(m, family, family + "_count", outcome="committed") == len(run.writes)
    assert sample(m, family, family + "_sum", outcome="committed") == pytest.approx(sum(w.seconds for w in run.writes))
    assert sample(m, family, family + "_count", outcome="failed") == 0
    assert sample(m, "dstreams_driver_epoch") == 1
    assert sample(m, "dstreams_driver_fenced") == 0
    assert sample(m, "dstreams_fencing_events", "dstreams_fencing_events_total") == 0
    assert sample(m, "dstreams_listener_events_dropped", "dstreams_listener_events_dropped_total") == 0
    assert sample(m, "dstreams_info", app=run.app_name) == 1


def test_the_page_and_its_files_are_served_from_the_package(run):
    status, content_type, body = run.files["/"]
    assert status == 200 and content_type.startswith("text/html")
    assert 'src="static/app.js"' in body and 'href="static/style.css"' in body and "https://" not in body
    for path, kind in (("/static/app.js", "text/javascript"), ("/static/style.css", "text/css")):
        status, content_type, body = run.files[path]
        assert status == 200 and content_type.startswith(kind) and body
        assert "http://" not in body.replace("http://www.w3.org/2000/svg", "") and "https://" not in body
    for path in ("/static/..%2Fserver.py", "/static/model.py", "/nothing"):
        assert run.files[path][0] == 404, path
    assert set(run.api_index) >= {"/api/status", "/api/batches", "/metrics"}
    assert run.post == 405


def test_a_fenced_driver_shows_on_the_page_and_in_the_metrics(run):
    assert run.fenced_driver["epoch"] == 1 and run.fenced_driver["fenced"]
    assert any(e["where"] == "driver (fenced)" and "FencedError" in e["message"] for e in run.fenced_errors)
    assert sample(run.fenced_metrics, "dstreams_driver_fenced") == 1
    assert sample(run.fenced_metrics, "dstreams_fencing_events", "dstreams_fencing_events_total") == 1


# ---------------------------------------------------------------- without a running context


def test_a_taken_port_moves_the_server_to_the_next_free_one():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        if port >= 65535:
            pytest.skip("the free port the kernel gave is the last one")
        server = bind("127.0.0.1", port, retries=16)
        assert server is not None
        try:
            assert server.server_address[1] > port
        finally:
            server.server_close()
        assert bind("127.0.0.1", port, retries=0) is None  # no other port may be tried


def test_settings_disabled_or_invalid():
    assert StatusServer.settings({"spark.dstreams.ui.enabled": "false"}) is None
    assert StatusServer.start(types.SimpleNamespace(), None) is None
    settings = StatusServer.settings({"spark.dstreams.ui.port": "4060", "spark.port.maxRetries": "3"})
    assert (settings.port, settings.port_retries) == (4060, 3)
    with pytest.raises(ValueError, match=r"spark\.dstreams\.ui\.port='80000' is not a port number"):
        StatusServer.settings({"spark.dstreams.ui.port": "80000"})


def test_an_invalid_port_fails_the_start_before_anything_runs(sc, monkeypatch):
    monkeypatch.setenv("DSTREAMS_UI_PORT", "-1")
    monkeypatch.setattr(sc, "getConf", lambda: {})  # the variable counts when the conf does not set the key
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    ssc.queueStream([[1]]).foreachRDD(lambda rdd: None)
    with pytest.raises(ValueError, match="DSTREAMS_UI_PORT='-1' is not a port number"):
        ssc.start()
    assert ssc.getState() == "INITIALIZED" and ssc._runtime is None


def test_the_printed_url(monkeypatch):
    monkeypatch.delenv("SPARK_PUBLIC_DNS", raising=False)
    assert public_url("0.0.0.0", 4050, "driver-host") == "http://driver-host:4050"
    assert public_url("10.1.2.3", 4051, "driver-host") == "http://10.1.2.3:4051"
    assert public_url("::1", 4050, None) == "http://[::1]:4050"
    monkeypatch.setenv("SPARK_PUBLIC_DNS", "status.example")
    assert public_url("0.0.0.0", 4050, "driver-host") == "http://status.example:4050"


def test_store_retries_and_outage_waits_are_counted_by_the_recovery_layer():
    """The process-wide counters the metrics read (recovery/retry.py, recovery/outage.py) count the real code's
    retries (by operation) and outage waits, whatever the log level."""
    from dstreams.recovery.outage import OUTAGE_WAITS, StoreOutagePolicy
    from dstreams.recovery.retry import STORE_RETRIES, RetryPolicy
    from dstreams.recovery.store.errors import StoreUnavailableError, TransientStoreError

    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise TransientStoreError("throttled")
        return "ok"

    retries, waits = STORE_RETRIES.snapshot(), OUTAGE_WAITS.total()
    store_log = logging.getLogger("dstreams.recovery.store")
    level = store_log.level
    store_log.setLevel(logging.CRITICAL)  # counted even when the warnings are not logged
    try:
        assert RetryPolicy(total_seconds=5, initial=0.001, maximum=0.001).call(
            flaky, op="put", key="k", where="memory://x") == "ok"
    finally:
        store_log.setLevel(level)
    assert StoreOutagePolicy(outage_seconds=100).retry_delay(StoreUnavailableError("down"), 0.0, "writing y") > 0
    assert StoreOutagePolicy(outage_seconds=100).retry_delay(ValueError("not an outage"), 0.0, "writing y") is None
    after = STORE_RETRIES.snapshot()
    assert after.get("put", 0) - retries.get("put", 0) == 2
    assert {op: n for op, n in after.items() if op != "put"} == {op: n for op, n in retries.items() if op != "put"}
    assert OUTAGE_WAITS.total() - waits == 1


def test_event_counts_are_thread_safe_and_only_grow():
    import threading

    from dstreams.recovery.counters import EventCounts

    counts = EventCounts("test")
    threads = [threading.Thread(target=lambda: [counts.add("a") for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    counts.add("b", 3)
    assert counts.snapshot() == {"a": 4000, "b": 3} and counts.total() == 4003
    with pytest.raises(ValueError, match="only grow"):
        counts.add("a", -1)



def test_event_time_watermarks_and_late_records_on_the_page_and_in_the_metrics(sc):
    """Each stream's watermark is that of the event-time streams it reads, as of the newest completed batch;
    the late records of an event-time stream add up over batches."""
    batches = [[(10, "a1"), (12, "a2")], [(20, "a3")], [(15, "kept"), (8, "late")], [], [(40, "a4")], [(25, "late")]]
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    source = ssc.queueStream([sc.parallelize(b, 2) for b in batches])
    timed = source.withEventTime(lambda r: r[0], allowedLateness="5s")
    windowed = timed.map(lambda r: (r[1], 1)).reduceByKeyAndEventWindow(operator.add, "10s", "5s")
    windowed.foreachRDD(lambda rdd: rdd.count())  # runs the jobs whose tasks count the late records
    ssc.start()
    try:
        for i in range(1, len(batches) + 1):
            clock.set_time(i * 1000)
            ssc.awaitBatch(i * 1000, TIMEOUT_S)
        url = ssc.uiWebUrl
        streams = wait_for("the newest batch on the page",
                           lambda: (s := get_json(url + "/api/streams")) and any(
                               n.get("late_records_total") == 2 for n in s["nodes"]) and s)
        newest_batch = get_json(url + f"/api/batches/{len(batches) * 1000}")
        families = metrics(url)
    finally:
        ssc.stop(stopSparkContext=False)
    nodes = {n["type"]: n for n in streams["nodes"]}
    # The newest batch (6 s) was built with the watermark from the batches before it: max event time 40 s - 5 s.
    assert nodes["EventTimeNode"]["watermark"] == 35_000 and nodes["EventTimeNode"]["late_records_total"] == 2
    assert nodes["QueueInputNode"]["watermark"] is None  # upstream of the event time
    assert all(n["watermark"] == 35_000 for n in streams["nodes"] if n["type"] not in ("QueueInputNode",))
    assert "late_records_total" not in nodes["QueueInputNode"]
    key = nodes["EventTimeNode"]["key"]
    (entry,) = newest_batch["event_time"].values()
    assert entry["watermark_ms"] == 35_000 and entry["late_records"] == 1
    assert sample(families, "dstreams_watermark_seconds", stream=key) == 35.0
    assert sample(families, "dstreams_late_records", "dstreams_late_records_total", stream=key) == 2
