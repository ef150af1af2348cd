"""Issue 14: the event-time operators in a driver process killed with SIGKILL, twice, and resumed.

The driver (tests/fault/event_time_app.py, 2 s batches) reads ``id,ts,key,value`` lines from a folder
(``textFileStream``), times them with ``withEventTime(allowedLateness=4s)`` and writes, with exactly-once
``saveAsTextFiles``, each batch's input, a sliding ``reduceByKeyAndEventWindow(..., emit="final")`` (with
``invFunc``), a ``sessionWindow`` and ``lateRecords()``; checkpoints in a local folder, resumes with
``getOrCreate``.

A producer thread drops a file of out-of-order records into the folder every 0.5 s (while the driver
runs and while it is down), some of them older than the allowed lateness. The driver is killed twice, at
moments drawn from a seed (printed; ``DSTREAMS_TEST_SEED`` repeats a run): first by the fault hook at its
n-th batch (``mid-batch``) or by the test (SIGKILL to its process group at a random moment after a few
committed batches), then by the hook at its n-th data checkpoint write or metadata commit. After the last
restart the producer stops and writes one record far ahead in event time, which closes every window and
session. Then:

* every produced line is in exactly one committed ``input`` batch (the source is exactly-once);
* each batch's windows, sessions and late records (behind the watermark, and what the windows and the sessions
  each dropped) are what the pure-Python model of the rules of docs/guide/event-time.md
  (``model_run`` of tests/property/test_event_time_windows.py) gives for the batches as they were committed: the
  batch composition is up to timing, the results are a function of it;
* model-free: every record's value is in exactly one session or listed as late for sessions, and in each of
  its ``WINDOW / SLIDE`` windows or listed as late for that window.

The ``timers`` output (``track`` with many event-time and processing-time timers per key, set, replaced and
deleted by tag: :func:`~tests.fault.event_time_app.timers_fired`) is checked the same way: batch by batch against
:func:`timers_model`, the timer rule of docs/guide/state.md over the committed batches and their recorded
watermarks, and
model-free: each timer fired exactly once, and every bucket of the ``k`` keys once, with its sum.
"""

from __future__ import annotations

import ast
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest

from ..process_support import committed_batches, kill_group, tail, wait_for
from ..property.test_event_time_windows import GAP as MODEL_GAP
from ..property.test_event_time_windows import model_run
from . import event_time_app as app
from .event_time_app import BATCH, GAP, LATENESS, OUTPUTS, SLIDE, WINDOW, parse

pytestmark = [pytest.mark.slow, pytest.mark.fault]

APP = os.path.join(os.path.dirname(__file__), "event_time_app.py")
FLUSH_KEY = "zz-flush"


class Producer(threading.Thread):
    """Writes file ``i`` (atomically: rename into the folder) every 0.5 s until stopped.

    File ``i`` holds records around event second ``100 + i``: one of key ``k<n>`` (each ``k`` key is active
    for 3 event seconds, then quiet for 6: sessions that close), two of ``a``/``b`` up to 3 s out of order
    (inside the allowed lateness), every 2nd file one 5-12 s old (late or not, depending on the batch it
    lands in) and every 5th one 30 s old (late once the watermark is set).
    """

    def __init__(self, inbox: str, seed: int) -> None:
        super().__init__(daemon=True, name="event-time-producer")
        self.inbox, self.rng = inbox, random.Random(seed)
        self.lines: list[str] = []
        self.files = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def records(self, i: int) -> list[tuple[int, str]]:
        base, rng = 100 + i, self.rng
        recs = [(base, f"k{(i // 3) % 3}")] + [(base - rng.randint(0, 3), rng.choice("ab")) for _ in range(2)]
        if i % 2 == 1:
            recs.append((base - rng.randint(5, 12), rng.choice("ac")))
        if i % 5 == 4:
            recs.append((base - 30, "b"))
        return recs

    def write(self, recs: list[tuple[int, str]]) -> None:
        i = self.files
        lines = [f"{i}.{j},{ts},{key},{self.rng.randint(1, 3)}" for j, (ts, key) in enumerate(recs)]
        tmp = os.path.join(self.inbox, f".f-{i:06d}.tmp")
        with open(tmp, "w") as f:
            f.write("".join(x + "\n" for x in lines))
        os.rename(tmp, os.path.join(self.inbox, f"f-{i:06d}.txt"))
        self.lines += lines
        self.files += 1

    def run(self) -> None:
        try:
            while not self.stopped.wait(0.5):
                self.write(self.records(self.files))
        except BaseException as e:  # reported by the test
            self.error = e

    def flush(self) -> None:
        """After the producer stopped: one record far ahead in event time, closing every window and session."""
        self.write([(100 + self.files + 1000, FLUSH_KEY)])


def _values(lines: list[str]) -> list:
    return sorted(ast.literal_eval(x) for x in lines)


@pytest.mark.timeout(600)
def test_event_time_outputs_are_exactly_once_across_two_kills(tmp_path):
    assert GAP == MODEL_GAP  # the model's session gap
    seed = int(os.environ.get("DSTREAMS_TEST_SEED", time.time_ns() % 100_000))
    print(f"seed {seed} (DSTREAMS_TEST_SEED={seed} repeats the kill points and the records)")
    rng = random.Random(seed)
    inbox, ckpt, out = tmp_path / "inbox", str(tmp_path / "ckpt"), str(tmp_path / "out")
    inbox.mkdir()
    log_path = str(tmp_path / "driver.log")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    for k in ("DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER"):
        env.pop(k, None)

    def start(**fault: str) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            log.write(f"---- driver start {fault}\n".encode())
            return subprocess.Popen([sys.executable, APP, str(inbox), ckpt, out], env={**env, **fault},
                                    stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
                                    start_new_session=True)

    began = time.monotonic()

    def phase(what: str) -> None:  # shown with -s, and with the output of a failed test
        print(f"{time.monotonic() - began:6.1f} s  {what}, {batches()} batches committed", flush=True)

    def batches(name: str = "input") -> int:
        return len(committed_batches(out, name))

    def kill(proc: subprocess.Popen, point: str, n: int) -> None:
        """The driver dies at ``point``: by the fault hook on its ``n``-th pass (the driver was started with
        it), or, for ``"test"``, by a SIGKILL to its process group at a random moment of the batch after
        ``n`` more committed batches."""
        if point == "test":
            target = batches() + n
            wait_for(lambda: batches() >= target, 180, f"{target} committed batches", proc, log_path)
            time.sleep(rng.uniform(0, BATCH))
            kill_group(proc)
            return
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the driver did not reach {point} within 180 s\n{tail(log_path, 4000)}") from None
        finally:
            kill_group(proc)
        with open(log_path, errors="replace") as f:
            own = f.read().rsplit("---- driver start", 1)[-1]  # this driver's part of the log
        assert proc.returncode == -signal.SIGKILL, own[-4000:]
        assert f"SIGKILL at {point}" in own, own[-4000:]

    def started(point: str, n: int) -> subprocess.Popen:
        return start() if point == "test" else start(DSTREAMS_FAULT_KILL=point, DSTREAMS_FAULT_KILL_AFTER=str(n))

    # Two kills (each restart costs a JVM start and a catch-up: the test stays near 100 s on a loaded
    # machine): mid-batch or at a random moment, then at a data checkpoint write or a metadata commit.
    kills = [rng.choice([("mid-batch", rng.randint(4, 7)), ("test", rng.randint(3, 5))]),
             rng.choice([("checkpoint-write", rng.randint(1, 3)), ("after-metadata-commit", rng.randint(4, 12))])]
    print(f"kills: {kills}")
    producer = Producer(str(inbox), seed)
    proc = started(*kills[0])
    try:
        # Files present when the first driver starts are ignored (new files only): produce once it runs.
        wait_for(lambda: batches() >= 1, 180, "the first committed batch", proc, log_path)
        producer.start()
        phase("first batch; producing")
        kill(proc, *kills[0])
        phase(f"killed at {kills[0]}")
        proc = started(*kills[1])
        kill(proc, *kills[1])
        phase(f"killed at {kills[1]}")
        proc = start()
        target = batches() + 1
        wait_for(lambda: batches() >= target, 180, "a batch after the last restart", proc, log_path)
        producer.stopped.set()
        producer.join(10)
        assert not producer.is_alive() and producer.error is None, producer.error
        producer.flush()
        phase("producer stopped; flush record written")
        flush_line = producer.lines[-1]

        def flush_batch() -> int | None:
            return next((t for t, lines in committed_batches(out, "input").items() if flush_line in lines), None)

        wait_for(lambda: flush_batch() is not None, 180, "the flush record", proc, log_path)
        # Its watermark (of the next batch) closes every window and session but the flush record's own.
        last = flush_batch() + BATCH * 1000
        wait_for(lambda: all(last in committed_batches(out, name) for name in OUTPUTS), 180,
              f"every output of batch {last}", proc, log_path)
        phase("every window and session closed")
        wait_for(lambda: last in committed_batches(out, "timers"), 180, f"the timers of batch {last}", proc, log_path)
    finally:
        producer.stopped.set()
        kill_group(proc)
    with open(os.path.join(ckpt, "meta", "head.json")) as f:
        head = json.load(f)
    assert head["epoch"] == 3, head["epoch"]  # three drivers, each took over the checkpoint
    zero = head["zero_ms"]
    times = list(range(zero + BATCH * 1000, last + 1, BATCH * 1000))
    got = {name: committed_batches(out, name) for name in OUTPUTS}
    for name in OUTPUTS:
        missing = [t for t in times if t not in got[name]]
        assert not missing, f"{name}: batches not committed: {missing}"

    # The source: every produced line in exactly one batch.
    read = [line for t in times for line in got["input"][t]]
    assert not [x for x, n in Counter(read).items() if n > 1], "lines read twice"
    assert sorted(read) == sorted(producer.lines)

    check_timers(out, ckpt, times, [[parse(line) for line in got["input"][t]] for t in times])

    # The operators: what the model gives for these batches, batch by batch; and the watermark recorded for
    # each batch in its audit record (meta/batches/<time>.json) is the rule's: the maximum event time of the
    # batches before it minus the lateness (ms; None before the first record).
    inputs = [[parse(line) for line in got["input"][t]] for t in times]
    top = None
    for t, batch in zip(times, inputs, strict=True):
        with open(os.path.join(ckpt, "meta", "batches", f"{t:015d}.json")) as f:
            recorded = json.load(f)["offsets"]
        (mark,) = [v for k, v in recorded.items() if k.endswith("EventTimeNode")]
        assert mark["wm"] == (None if top is None else (top - LATENESS) * 1000), f"watermark of batch {t}: {mark}"
        top = max([r[0] for r in batch] + ([] if top is None else [top]), default=None)
    want = model_run(inputs, LATENESS, WINDOW, SLIDE)
    for i, t in enumerate(times, start=1):
        assert _values(got["windows"][t]) == want["final"][i], f"windows of batch {t} (#{i})"
        assert _values(got["sessions"][t]) == want["sessions"][i], f"sessions of batch {t} (#{i})"
        assert _values(got["late"][t]) == want["late"][i], f"late records of batch {t} (#{i})"
        assert _values(got["windowlate"][t]) == want["window_late"][i], f"window late records of batch {t} (#{i})"
        assert _values(got["sessionlate"][t]) == want["session_late"][i], f"session late records of {t} (#{i})"

    # Model-free: every value counted once: in one session or as late for sessions; in each of its WINDOW / SLIDE
    # windows or as late for that window.
    records = [r for batch in inputs for r in batch]
    late = [r for t in times for r in _values(got["late"][t])]
    sessions = [s for t in times for s in _values(got["sessions"][t])]
    windows = [w for t in times for w in _values(got["windows"][t])]
    session_late = [r for t in times for r in _values(got["sessionlate"][t])]
    window_late = [r for t in times for r in _values(got["windowlate"][t])]
    total = sum(v for _, k, v in records if k != FLUSH_KEY)
    assert sum(v for _, v in sessions) == total - sum(kv[1] for kv, _, _ in session_late)
    assert sum(v for _, v in windows) == total * (WINDOW // SLIDE) - sum(kv[1] * len(m) for kv, _, m in window_late)
    assert len({s[0] for s in sessions}) == len(sessions) and len({w[0] for w in windows}) == len(windows)
    assert late and len(sessions) >= 5 and len(windows) >= 20, (len(late), len(sessions), len(windows))


# ---------------------------------------------------------------------- timers
def timers_model(inputs: list[list[tuple[int, str, int]]], times: list[int], marks: list[int | None],
                 ) -> dict[int, list[tuple]]:
    """The records the timers output must hold per batch time, by the rule of docs/guide/state.md
    ("Timers in ``track``"):
    batch ``t`` applies its events of the ``k`` keys (init/update; the app's functions do not depend on their
    order), then fires the key's due timers (event-time ones at or below the batch's recorded watermark, then
    processing-time ones at or below ``t``; each kind by (time, tag)), taken when the firing starts: one that a
    callback of the batch set, replaced or deleted (here: the object in the table is no longer the one taken)
    does not fire. A state of None drops the key and its timers."""
    from dstreams import Timer, TrackUpdate

    rank = {"event": 0, "processing": 1}
    keys: dict[str, tuple[Any, dict[str, Timer]]] = {}  # key -> (state, tag -> Timer as set)
    want: dict[int, list[tuple]] = {}

    def apply(result: Any, table: dict[str, Timer], emitted: list[tuple]) -> Any:
        if not isinstance(result, TrackUpdate):
            return result
        assert result.eventTime is None and result.processingTime is None  # the app names every timer
        emitted.extend(result.emit)
        for tag, timer in (result.timers or {}).items():
            if timer is None:
                table.pop(tag, None)
            else:
                table[tag] = timer
        return result.state

    for t, batch, wm in zip(times, inputs, marks, strict=True):
        events: dict[str, list[tuple[int, int]]] = {}
        for ts, k, v in sorted(r for r in batch if app.timer_keys(r)):
            assert wm is None or ts * 1000 >= wm, f"batch {t}: {k}'s record at {ts} s is behind the watermark {wm}"
            events.setdefault(k, []).append((ts, v))
        emitted: list[tuple] = []
        for k in sorted(set(keys) | set(events)):
            state, table = keys.pop(k, (None, {}))
            for ev in events.get(k, []):
                result = app.timers_init(k, ev) if state is None else app.timers_update(k, state, ev)
                state = apply(result, table, emitted)
                if state is None:
                    table = {}
            limit = {"event": wm, "processing": t}  # a timer is due at or below its kind's limit
            due = sorted((rank[timer.kind], round(timer.time * 1000), tag, timer) for tag, timer in table.items()
                         if limit[timer.kind] is not None and round(timer.time * 1000) <= limit[timer.kind])
            for _, ms, tag, timer in due:
                if state is None:
                    break
                if table.get(tag) is not timer:
                    continue  # deleted or replaced by an earlier callback of this batch
                del table[tag]
                fired = Timer(timer.kind, ms // 1000 if ms % 1000 == 0 else ms / 1000, tag)
                state = apply(app.timers_fired(k, state, fired), table, emitted)
            if state is not None:
                keys[k] = (state, table)
        want[t] = sorted(emitted)
    return want


def check_timers(out: str, ckpt: str, times: list[int], inputs: list[list[tuple[int, str, int]]]) -> None:
    """The timers output: what :func:`timers_model` gives for the committed batches, batch by batch; and,
    model-free, each timer fired once and every bucket of the ``k`` keys' records once, with its sum."""
    got = committed_batches(out, "timers")
    missing = [t for t in times if t not in got]
    assert not missing, f"timers: batches not committed: {missing}"
    marks = []
    for t in times:
        with open(os.path.join(ckpt, "meta", "batches", f"{t:015d}.json")) as f:
            (mark,) = [v for k, v in json.load(f)["offsets"].items() if k.endswith("EventTimeNode")]
        marks.append(mark["wm"])
    want = timers_model(inputs, times, marks)
    for i, t in enumerate(times, start=1):
        assert _values(got[t]) == want[t], f"timers of batch {t} (#{i})"

    fired = [r for t in times for r in _values(got[t])]
    once = Counter((key, tag, time) for key, _, _, tag, time, _ in fired)
    assert [x for x, n in once.items() if n > 1] == [], "timers fired twice"
    sums: Counter = Counter()
    for ts, k, v in (r for batch in inputs for r in batch if app.timer_keys(r)):
        sums[(k, f"b{ts // app.BUCKET}")] += v
    buckets = {(key, tag): value for key, _, kind, tag, _, value in fired if tag.startswith("b")}
    assert buckets == dict(sums), "each bucket of the k keys once, with the sum of its values"
    tags = Counter(tag[0] for _, _, _, tag, _, _ in fired)
    assert tags["i"] == len({k for k, _ in sums}) and tags["p"] >= 5, tags  # every key idle at the end
