"""The progress line (api/progress.py): what it shows, in place on a terminal, and when it is on.

Unit tests on a fake terminal (a StringIO that says it is a TTY) and a real listener bus; the last test runs a
context on the manual clock with the line forced on and checks the line the context's own hook registered.
"""

from __future__ import annotations

import io
import operator

import pytest

from dstreams import ManualClock, StreamingContext, config
from dstreams.api.progress import ProgressLine, format_duration
from dstreams.listener import (
    BatchInfo,
    OutputOperationInfo,
    StreamingListenerBatchCompleted,
    StreamingListenerBatchSubmitted,
)
from dstreams.listener_bus import ListenerBus

WAIT_S = 30


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batch(t_ms: int, records: int = 1234, submitted: int | None = None, start: int | None = None,
          end: int | None = None, failed: bool = False) -> BatchInfo:
    info = BatchInfo(t_ms, t_ms + 2 if submitted is None else submitted, num_records=records)
    info.processing_start_time_ms = info.submission_time_ms + 5 if start is None else start
    info.processing_end_time_ms = info.processing_start_time_ms + 300 if end is None else end
    op = OutputOperationInfo(t_ms, 0, "foreachRDD", "")
    op.failure_reason = "boom" if failed else None
    info.output_operations[0] = op
    return info


def screen(raw: str) -> str:
    """What a terminal shows of ``raw`` on its last line: each carriage return starts the line over."""
    line: list[str] = []
    for chunk in raw.split("\n")[-1].split("\r"):
        line[:len(chunk)] = list(chunk)
    return "".join(line).rstrip()


def test_the_line_shows_the_batch_its_delays_and_the_status_url():
    out = FakeTerminal()
    line = ProgressLine(out, status_url="http://driver:4050", min_interval_s=0, width=200)
    line.onBatchSubmitted(StreamingListenerBatchSubmitted(batch(1_000)))
    line.onBatchCompleted(StreamingListenerBatchCompleted(batch(1_000, records=10_000, submitted=1_002,
                                                                start=1_006, end=1_318)))
    shown = screen(out.getvalue())
    assert shown.startswith("dstreams ") and "\n" not in out.getvalue()
    assert "1 batch " in shown and "10,000 records" in shown and "processing 312 ms" in shown
    assert "delay 4 ms / 316 ms total" in shown and shown.endswith("http://driver:4050")


def test_it_is_rewritten_in_place_and_ended_by_close():
    out = FakeTerminal()
    bus = ListenerBus()
    line = ProgressLine(out, min_interval_s=0, width=200)
    bus.add(line)
    line._bus = bus
    for i in range(1, 4):
        bus.post("onBatchSubmitted", StreamingListenerBatchSubmitted(batch(i * 1000)))
    for i in range(1, 3):
        bus.post("onBatchCompleted", StreamingListenerBatchCompleted(batch(i * 1000, records=i, failed=i == 2,
                                                                           end=i * 1000 + 2_000)))
    assert bus.wait_until_empty(WAIT_S)
    raw = out.getvalue()
    assert raw.count("\r") == 2 and "\n" not in raw
    shown = screen(raw)
    assert "2 batches  1 failed  1 queued  2 records" in shown and "processing 2.0 s" in shown
    line.close()
    line.close()  # idempotent
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1
    bus.post("onBatchCompleted", StreamingListenerBatchCompleted(batch(3000)))  # no longer registered
    assert bus.wait_until_empty(WAIT_S)
    line.onBatchCompleted(StreamingListenerBatchCompleted(batch(4000)))  # closed: ignored
    assert out.getvalue() == raw + "\n"
    bus.stop()


def test_a_shorter_line_pads_over_the_longer_one_and_a_long_one_is_cut_to_the_width():
    out = FakeTerminal()
    line = ProgressLine(out, status_url="http://driver:4050", min_interval_s=0, width=100)
    line.onBatchCompleted(StreamingListenerBatchCompleted(batch(1000)))
    assert "http://driver:4050" not in out.getvalue() and len(out.getvalue()) <= 101  # the URL goes first
    out = FakeTerminal()
    line = ProgressLine(out, min_interval_s=0, width=60)
    line.onBatchCompleted(StreamingListenerBatchCompleted(batch(1000, records=123_456_789, end=1000 + 125_000)))
    first = out.getvalue()
    assert len(first) == 1 + 60 and first.endswith("...")
    line.onBatchCompleted(StreamingListenerBatchCompleted(batch(2000, records=1, end=2010)))
    second = out.getvalue()[len(first):]
    assert second.startswith("\r") and len(second) == 1 + 60  # spaces wipe what the previous line left
    assert screen(out.getvalue()) == second[1:].rstrip()


def test_updates_are_throttled_and_close_shows_the_newest_batch():
    out, clock = FakeTerminal(), FakeClock()
    line = ProgressLine(out, min_interval_s=0.25, width=200, monotonic=clock)
    for i in range(1, 5):
        line.onBatchCompleted(StreamingListenerBatchCompleted(batch(i * 100, records=i)))
        clock.now += 0.125
    assert out.getvalue().count("\r") == 2  # the first, then the one 0.25 s later
    assert "3 batches" in out.getvalue() and "4 batches" not in out.getvalue()
    line.close()
    assert "4 batches" in screen(out.getvalue().rstrip("\n")) and out.getvalue().endswith("\n")


def test_not_a_terminal_each_update_is_a_line_of_its_own():
    out = io.StringIO()
    line = ProgressLine(out, min_interval_s=0)
    for i in (1, 2):
        line.onBatchCompleted(StreamingListenerBatchCompleted(batch(i * 1000)))
    line.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue() and out.getvalue().endswith("\n")
    assert "1 batch " in lines[0] and "2 batches" in lines[1]


def test_a_closed_stream_turns_the_line_off_never_the_stream():
    out = FakeTerminal()
    line = ProgressLine(out, min_interval_s=0)
    out.close()
    line.onBatchCompleted(StreamingListenerBatchCompleted(batch(1000)))  # no error
    line.close()


def test_on_when_a_terminal_unless_the_conf_says_otherwise(monkeypatch):
    monkeypatch.delenv(config.UI_SHOW_PROGRESS.env, raising=False)
    key = config.UI_SHOW_PROGRESS.key
    terminal, pipe = FakeTerminal(), io.StringIO()
    assert ProgressLine.settings({}, terminal) is terminal
    assert ProgressLine.settings({}, pipe) is None
    assert ProgressLine.settings({key: "false"}, terminal) is None
    assert ProgressLine.settings({key: "true"}, pipe) is pipe
    monkeypatch.setattr("sys.stderr", terminal)
    assert ProgressLine.settings(None) is terminal  # stderr by default
    monkeypatch.setenv(config.UI_SHOW_PROGRESS.env, "off")
    assert ProgressLine.settings({}, terminal) is None
    with pytest.raises(ValueError, match=key):
        ProgressLine.settings({key: "sometimes"}, terminal)
    bus = ListenerBus()
    assert ProgressLine.start(bus, None, "http://x:1") is None
    assert not bus.has_listeners
    started = ProgressLine.start(bus, pipe, "http://x:1", 500)
    assert started is not None and bus.has_listeners and started.status_url == "http://x:1"
    started.close()
    assert not bus.has_listeners
    bus.stop()


@pytest.mark.parametrize("ms, text", [(None, "-"), (0, "0 ms"), (999, "999 ms"), (1000, "1.0 s"),
                                      (4_250, "4.2 s"), (125_000, "2m05s")])
def test_durations(ms, text):
    assert format_duration(ms) == text


def test_durations_of_batch_times_show_milliseconds_when_the_interval_has_some():
    from dstreams.api.progress import format_batch_time

    assert format_batch_time(1_500, 1000).count(":") == 2 and "." not in format_batch_time(1_500, 1000)
    assert format_batch_time(1_500, 500).endswith(".500")


def test_a_started_context_shows_the_line_and_ends_it_when_stopped(sc, capsys, monkeypatch):
    """The hook in ``StreamingContext.start``/``stop``: forced on, the line goes to stderr (not a terminal here: one
    line per update), with the status page's URL, and is ended by ``stop``."""
    monkeypatch.setenv(config.UI_SHOW_PROGRESS.env, "true")
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    ssc.generatorStream(2, 2).map(lambda w: (w, 1)).reduceByKey(operator.add).foreachRDD(lambda rdd: rdd.count())
    ssc.start()
    try:
        start = ssc.startTime.ms
        for i in range(2):
            clock.advance(1000)
            ssc.awaitBatch(start + i * 1000, WAIT_S)
        url = ssc.uiWebUrl
    finally:
        ssc.stop(stopSparkContext=False)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("dstreams ")]
    assert lines and "2 batches" in lines[-1] and "4 records" in lines[-1], err
    assert url is None or lines[-1].endswith(url)
