"""Issue 22: a batch is done only when every one of its outputs has committed.

A failed batch is tried again (``spark.dstreams.batch.maxAttempts``) from its first output that had not
run; past that, the context stops with the batch not done (a restart with ``getOrCreate`` runs it again),
or, opted in with ``spark.dstreams.batch.onFailure=dropInput``, the batch's input is dropped and recorded so.
A batch cut by a stop runs none of its later outputs. Every test compares the committed outputs with what a
fault-free run writes.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest

from dstreams import BatchFailedError, ManualClock, StreamingContext
from dstreams.recovery.metadata import HEAD
from dstreams.recovery.store import open_store
from dstreams.testing import manual_context, run_batches

from ..recovery_app import read_outputs as _read_folders

TIMEOUT_S = 120.0


def read_outputs(out: str, prefix: str) -> dict[int, list[str]]:
    """The committed folders ``<prefix>-<batch ms>`` under ``out``: batch ms -> sorted lines."""
    if not os.path.isdir(out):
        return {}
    return {int(name.rsplit("-", 1)[1]): lines for name, lines in _read_folders(out).items()
            if name.startswith(prefix + "-")}


def _head(cpd: str) -> dict:
    return json.loads(open_store(cpd).get(HEAD))


def _write_input(inputd: str, t_ms: int, text: str) -> None:
    path = os.path.join(inputd, f"f{t_ms}.txt")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


class Flaky:
    """A driver-side output that raises while the file ``broken`` exists, and once for each ``fail-once-<t>``
    file (consumed); otherwise it records what it saw. Picklable (the graph is stored with the checkpoint)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, t, rdd) -> None:  # noqa: ANN001
        ms = round(t.timestamp() * 1000)
        once = os.path.join(self.folder, f"fail-once-{ms}")
        if os.path.exists(os.path.join(self.folder, "broken")):
            raise RuntimeError(f"the sink is down (batch {ms})")
        if os.path.exists(once):
            os.remove(once)
            raise RuntimeError(f"the sink failed once (batch {ms})")
        with open(os.path.join(self.folder, f"seen-{ms}"), "w") as f:
            f.write(json.dumps(sorted(rdd.collect())))


def _setup(sc, inputd: str, out: str, flaky: Flaky, clock: ManualClock, every: int = 2):  # noqa: ANN001
    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        words = ssc.textFileStream(inputd).flatMap(str.split).map(lambda w: (w, 1))
        counts = words.updateStateByKey(lambda vs, s: sum(vs, s or 0))
        counts.checkpoint(every)
        counts.map(lambda kv: f"{kv[0]},{kv[1]}").saveAsTextFiles(os.path.join(out, "counts"))
        counts.foreachRDD(flaky)
        return ssc

    return setup


def _counts(out: str) -> dict[int, list[str]]:
    return {t: sorted(lines) for t, lines in read_outputs(out, "counts").items()}


EXPECTED = {1000: ["a,2", "b,1"], 2000: ["a,3", "b,1", "c,1"], 3000: ["a,3", "b,2", "c,1"]}
INPUTS = {1000: "a b a\n", 2000: "a c\n", 3000: "b\n"}


@pytest.fixture
def folders(tmp_path):
    inputd, out, cpd, marks = (str(tmp_path / n) for n in ("in", "out", "cp", "marks"))
    os.makedirs(inputd)
    os.makedirs(marks)
    return inputd, out, cpd, marks


def _step(ssc: StreamingContext, inputd: str, t_ms: int, check: bool = True) -> None:
    """Write batch ``t_ms``'s input and run that batch (the next one); ``check``: no output failed."""
    _write_input(inputd, t_ms, INPUTS[t_ms])
    [info] = run_batches(ssc, 1, timeout=TIMEOUT_S, check=check)
    assert info.batch_time.ms == t_ms


@pytest.mark.slow
def test_a_failed_batch_is_tried_again_from_the_output_that_failed(sc, folders):
    inputd, out, cpd, marks = folders
    open(os.path.join(marks, "fail-once-2000"), "w").close()
    ssc = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock()))
    ssc.start()
    try:
        for t in (1000, 2000, 3000):
            _step(ssc, inputd, t, check=t != 2000)  # batch 2000's output fails once
        assert ssc.awaitTerminationOrTimeout(0.01) is False  # no error: the retry went through
        infos = {i.batch_time_ms: i for i in ssc.batchInfos()}
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=True)
    assert _counts(out) == EXPECTED
    assert [infos[t].attempts for t in (1000, 2000, 3000)] == [1, 2, 1]
    assert infos[2000].failure is not None and "the sink failed once" in infos[2000].failure
    assert not os.path.exists(os.path.join(marks, "fail-once-2000"))
    assert sorted(f for f in os.listdir(marks) if f.startswith("seen-")) == ["seen-1000", "seen-2000", "seen-3000"]


@pytest.mark.slow
def test_a_batch_that_keeps_failing_stops_the_context_and_a_restart_runs_it_again(sc, folders, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "2")
    inputd, out, cpd, marks = folders
    first = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock()))
    first.start()
    try:
        _step(first, inputd, 1000)
        open(os.path.join(marks, "broken"), "w").close()
        _write_input(inputd, 2000, INPUTS[2000])
        first.clock.set_time(2000)
        with pytest.raises(RuntimeError, match="the sink is down"):
            first.awaitTermination(TIMEOUT_S)
        assert first.getState() == "STOPPED"  # the context stopped itself, with the batch not done
        infos = {i.batch_time_ms: i for i in first.batchInfos()}
        assert infos[2000].attempts == 2 and not infos[2000].dropped
        assert _head(cpd)["completed_through"] == 1000, "a failed batch must not be recorded as done"
    finally:
        first.stop(stopSparkContext=False)
    assert sc._jsc is not None  # the SparkContext outlives a stop after a failure
    assert 2000 not in _counts(out) or _counts(out)[2000] == EXPECTED[2000]

    os.remove(os.path.join(marks, "broken"))
    second = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock()),
                                          clock=ManualClock(2000))
    second.start()
    try:
        second.awaitBatch(2000, TIMEOUT_S)
        _step(second, inputd, 3000)
        assert second.awaitTerminationOrTimeout(0.01) is False
    finally:
        second.stop(stopSparkContext=False, stopGraceFully=True)
    assert _counts(out) == EXPECTED
    assert _head(cpd)["completed_through"] == 3000


def test_the_error_of_a_failed_batch_names_the_output_and_the_cause(sc, tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.queueStream([sc.parallelize([1, 0, 2], 2)])
        stream.saveAsTextFiles(str(tmp_path / "fine"))
        stream.map(lambda x: 1 // x).saveToStore(str(tmp_path / "broken"))
        ssc.start()
        ssc.clock.set_time(1000)
        with pytest.raises(BatchFailedError) as raised:
            ssc.awaitTermination(TIMEOUT_S)
    first_line = str(raised.value).splitlines()[0]
    assert "saveToStore(" in first_line and "broken" in first_line, first_line
    assert "ZeroDivisionError" in first_line, first_line
    assert raised.value.cause.startswith("ZeroDivisionError")
    # the second line names the ways past a bad record (tests/integration/test_dead_letters.py takes them)
    assert "onError='deadLetter'" in str(raised.value).splitlines()[1]


@pytest.mark.slow
def test_a_batch_that_cannot_be_built_stops_the_context_with_it_not_done(sc, folders, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "2")
    inputd, out, cpd, marks = folders
    broken = os.path.join(marks, "broken")

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=ManualClock())

        def check(rdd):  # noqa: ANN001, ANN202 - runs on the driver while the batch is built
            if os.path.exists(broken):
                raise RuntimeError("the lookup table is missing")
            return rdd

        ssc.textFileStream(inputd).transform(check).saveAsTextFiles(os.path.join(out, "lines"))
        return ssc

    first = StreamingContext.getOrCreate(cpd, setup)
    first.start()
    try:
        _step(first, inputd, 1000)
        open(broken, "w").close()
        _write_input(inputd, 2000, "late line\n")
        first.clock.set_time(2000)
        with pytest.raises(RuntimeError, match="lookup table is missing"):
            first.awaitTermination(TIMEOUT_S)
        assert first.getState() == "STOPPED"
        assert _head(cpd)["completed_through"] == 1000
        assert "2000" not in _head(cpd)["offsets"], "a batch that was not built must not be recorded"
    finally:
        first.stop(stopSparkContext=False)
    os.remove(broken)
    second = StreamingContext.getOrCreate(cpd, setup, clock=ManualClock(2000))
    second.start()
    try:
        second.awaitBatch(2000, TIMEOUT_S)
    finally:
        second.stop(stopSparkContext=False, stopGraceFully=True)
    lines = read_outputs(out, "lines")
    assert lines[1000] == ["a b a"] and lines[2000] == ["late line"]


@pytest.mark.slow
@pytest.mark.parametrize("state_store", ["rdd", "executor"])
def test_drop_input_is_an_opt_in_that_drops_the_batch_everywhere_and_records_it(sc, folders, monkeypatch,
                                                                                 state_store):
    """With the state in RDDs or in the executor store (which had applied the batch before its last output
    failed: the store goes back a version and applies it again without the dropped records)."""
    monkeypatch.setenv("DSTREAMS_STATE_STORE", state_store)
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "dropInput")
    inputd, out, cpd, marks = folders
    first = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock()))
    first.start()
    try:
        _step(first, inputd, 1000)
        open(os.path.join(marks, "broken"), "w").close()
        _step(first, inputd, 2000, check=False)
        os.remove(os.path.join(marks, "broken"))
        with pytest.raises(RuntimeError, match="the sink is down"):
            first.awaitTerminationOrTimeout(0.01)  # the error is reported; the stream goes on
        _step(first, inputd, 3000)
        infos = {i.batch_time_ms: i for i in first.batchInfos()}
        assert first.getState() == "ACTIVE"
    finally:
        first.stop(stopSparkContext=False, stopGraceFully=True)
    assert infos[2000].dropped and infos[2000].attempts == 2 and not infos[3000].dropped
    head = _head(cpd)
    assert head["completed_through"] == 3000
    assert list(head["dropped"]) == ["2000"] and head["dropped_total"] == 1
    assert open_store(cpd).exists("meta/dropped/000000000002000.json")
    # Batch 2000's input ("a c") is dropped from the state too: batch 3000 counts as if it never came.
    # Its first output (saveAsTextFiles) had committed before the failure and stays.
    counts = _counts(out)
    assert counts[1000] == EXPECTED[1000] and counts[2000] == EXPECTED[2000]
    assert counts[3000] == ["a,2", "b,2"]


@pytest.mark.slow
def test_a_replayed_dropped_batch_is_dropped_again(sc, folders, monkeypatch):
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "dropInput")
    inputd, out, cpd, marks = folders
    # No state checkpoint before batch 10000: a restart replays every batch from the first.
    first = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock(), every=10))
    first.start()
    try:
        _step(first, inputd, 1000)
        open(os.path.join(marks, "fail-once-2000"), "w").close()
        _step(first, inputd, 2000, check=False)
        _step(first, inputd, 3000)
    finally:
        first.stop(stopSparkContext=False, stopGraceFully=True)
    assert _head(cpd)["dropped"] == {"2000": "foreachRDD: RuntimeError: the sink failed once (batch 2000)"}
    assert _counts(out)[3000] == ["a,2", "b,2"]
    shutil.rmtree(os.path.join(out, "counts-3000"))  # so that the replay writes batch 3000 again
    second = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock(), every=10),
                                          clock=ManualClock(3000))
    second.start()
    try:
        second.awaitBatch(3000, TIMEOUT_S)
        infos = {i.batch_time_ms: i for i in second.batchInfos()}
    finally:
        second.stop(stopSparkContext=False, stopGraceFully=True)
    assert infos[2000].dropped and not infos[1000].dropped and not infos[3000].dropped
    assert _counts(out)[3000] == ["a,2", "b,2"], "the replay must drop batch 2000's input again"
    assert _head(cpd)["dropped_total"] == 1


@pytest.mark.slow
def test_a_batch_cut_by_a_stop_runs_none_of_its_later_outputs(sc, folders, monkeypatch):
    monkeypatch.setenv("DSTREAMS_GRACEFUL_STOP_TIMEOUT", "1s")
    monkeypatch.setenv("DSTREAMS_CHECKPOINT_GRAPH", "off")  # the outputs below hold thread events
    inputd, out, cpd, marks = folders
    started, release = threading.Event(), threading.Event()
    later_ran: list[int] = []

    def slow_first(t, rdd) -> None:  # noqa: ANN001
        if round(t.timestamp() * 1000) == 2000:
            started.set()
            release.wait(TIMEOUT_S)

    with manual_context(1, sc=sc, checkpoint=cpd) as ssc:
        lines = ssc.textFileStream(inputd)
        lines.foreachRDD(slow_first)
        lines.foreachRDD(lambda t, rdd: later_ran.append(round(t.timestamp() * 1000)))
        ssc.start()
        try:
            _step(ssc, inputd, 1000)
            _write_input(inputd, 2000, INPUTS[2000])
            ssc.clock.set_time(2000)
            assert started.wait(TIMEOUT_S)
            stopper = threading.Thread(target=ssc.stop, kwargs={"stopSparkContext": False, "stopGraceFully": True})
            stopper.start()
            deadline = time.monotonic() + TIMEOUT_S
            while ssc._scheduler is not None and not ssc._scheduler._stop_running.is_set():
                assert time.monotonic() < deadline, "the graceful stop did not time out"
                time.sleep(0.02)
            release.set()
            stopper.join(TIMEOUT_S)
            assert not stopper.is_alive()
        finally:
            release.set()
    assert later_ran == [1000], "an output of a batch cut by a stop must not start"
    assert _head(cpd)["completed_through"] == 1000, "a batch cut by a stop must not be recorded as done"


@pytest.mark.slow
def test_a_batch_failed_for_good_is_the_last_that_starts_even_while_the_next_is_being_built(sc, monkeypatch):
    """Batch 1000 fails for good exactly while batch 2000 is being built on the event loop (a driver-side
    ``transform`` holds it until the failure is in): batch 2000 is neither queued nor started, although nobody
    stopped the context yet (the script has not called ``awaitTermination``)."""
    from dstreams import StreamingListener

    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "stop")  # without a checkpoint location the default goes on
    monkeypatch.setenv("DSTREAMS_CHECKPOINT_GRAPH", "off")  # the functions below hold thread events
    building_2000, built_2000 = threading.Event(), threading.Event()
    ran: list[int] = []
    submitted: list[int] = []

    class Submitted(StreamingListener):
        def onBatchSubmitted(self, batchSubmitted) -> None:  # noqa: ANN001
            submitted.append(batchSubmitted.batchInfo().batchTime().milliseconds())

    def hold_2000(t, rdd):  # noqa: ANN001, ANN202 - runs on the driver while batch t is built
        if round(t.timestamp() * 1000) == 2000:
            building_2000.set()
            deadline = time.monotonic() + TIMEOUT_S
            while ssc._scheduler.fatal_error is None and time.monotonic() < deadline:
                time.sleep(0.01)
            built_2000.set()
        return rdd

    def output(t, rdd) -> None:  # noqa: ANN001
        ms = round(t.timestamp() * 1000)
        if ms == 1000:
            assert building_2000.wait(TIMEOUT_S)
            raise RuntimeError("batch 1000 fails for good")
        ran.append(ms)

    with manual_context(1, sc=sc) as ssc:
        ssc.addStreamingListener(Submitted())
        ssc.queueStream([sc.parallelize([i]) for i in range(5)]).transform(hold_2000).foreachRDD(output)
        ssc.start()
        ssc.clock.set_time(3000)  # batches 1000, 2000, 3000 are due at once
        assert built_2000.wait(TIMEOUT_S)
        assert ssc._scheduler.events.wait_idle(TIMEOUT_S)  # batch 2000 was generated to its end
        deadline = time.monotonic() + 2
        while not ran and time.monotonic() < deadline:  # had it been queued, the idle runner takes it at once
            time.sleep(0.05)
        assert ran == [], f"batches started after batch 1000 failed for good: {ran}"
        with pytest.raises(RuntimeError, match="batch 1000 fails for good"):
            ssc.awaitTermination(TIMEOUT_S)
    assert ran == []
    assert 2000 not in submitted and 3000 not in submitted, submitted


@pytest.mark.slow
def test_a_dropped_batch_is_recorded_before_its_error_reaches_a_plain_script(sc, folders, monkeypatch):
    """Under dropInput a plain script ends on ``awaitTermination``'s error (the process exits: nothing of the
    context runs after it). The drop is recorded before that error is raised, so the restart goes past the
    batch (replayed without its input) instead of failing on it again, and every output agrees with a run in
    which batch 2000's input never came."""
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("DSTREAMS_BATCH_ON_FAILURE", "dropInput")
    inputd, out, cpd, marks = folders
    first = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock(), every=10))
    first.start()
    try:
        _step(first, inputd, 1000)
        open(os.path.join(marks, "broken"), "w").close()
        _write_input(inputd, 2000, INPUTS[2000])
        first.clock.set_time(2000)
        with pytest.raises(RuntimeError, match="the sink is down"):
            first.awaitTermination(TIMEOUT_S)
        # What a plain script's end does: no graceful stop, the event loop gets no further.
        first._scheduler.events.stop(0)
        assert _head(cpd)["dropped"] == {"2000": "foreachRDD: RuntimeError: the sink is down (batch 2000)"}
    finally:
        first.stop(stopSparkContext=False)
    os.remove(os.path.join(marks, "broken"))
    second = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, Flaky(marks), ManualClock(), every=10),
                                          clock=ManualClock(2000))
    second.start()
    try:
        second.awaitBatch(2000, TIMEOUT_S)
        _step(second, inputd, 3000)
        assert second.awaitTerminationOrTimeout(0.01) is False, "the replayed drop must not fail again"
    finally:
        second.stop(stopSparkContext=False, stopGraceFully=True)
    counts = _counts(out)
    assert counts[1000] == EXPECTED[1000] and counts[3000] == ["a,2", "b,2"]
    seen = {int(n.split("-")[1]): json.loads(open(os.path.join(marks, n)).read())
            for n in os.listdir(marks) if n.startswith("seen-")}
    assert sorted(seen) == [1000, 3000] and seen[3000] == [["a", 2], ["b", 2]]
