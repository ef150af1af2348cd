"""The progress line: one line on a terminal, rewritten in place after every batch, for people watching a job.

Contract:

* :class:`ProgressLine` is a :class:`~dstreams.listener.StreamingListener`. After each completed batch it shows,
  on one line: the batch time, how many batches completed (and failed), the batch's input records, its
  processing time, its scheduling delay and total delay, the batches submitted and not completed yet (when
  there are any), and the status page's URL when there is one. For example::

      dstreams 14:03:07  12 batches  10,000 records  processing 312 ms  delay 4 ms / 316 ms total  http://host:4050

* On a terminal the line is rewritten in place (a carriage return, padded over the previous text, never wider
  than the terminal, so that it never wraps: the URL is left out first, then the end is cut), at most every
  ``min_interval_s`` (0.2 s): a faster stream shows its newest batch. On a stream that is not a terminal (forced
  on, see below) each update is a line of its own.
* Wiring, as for the status server: ``StreamingContext.start`` reads :meth:`ProgressLine.settings` before it
  builds anything (an invalid value fails the start cleanly), then :meth:`ProgressLine.start` registers the line
  on the context's listener bus before the first batch; ``stop`` calls :meth:`ProgressLine.close`, which shows
  the newest batch and ends the line, so that what is printed next starts on a line of its own (it never
  raises; events after it are ignored).
* On or off: ``spark.dstreams.ui.showProgress`` (:data:`dstreams.config.UI_SHOW_PROGRESS`) ``true`` forces it
  on, ``false`` off; unset, it is on when its stream (stderr) is a terminal, so logs, pipes and CI see nothing.
* It writes from the listener bus' thread; writes and ``close`` are serialised by a lock. A write that fails
  (a closed stream) turns the line off, never the stream.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time as _time
from collections.abc import Callable
from typing import Any, TextIO

from dstreams import config
from dstreams.listener import BatchInfo, StreamingListener
from dstreams.listener_bus import ListenerBus

#: Minimum seconds between two rewrites of the line.
MIN_INTERVAL_S = 0.2
#: How long ``close`` waits for the bus to deliver the batches already completed.
CLOSE_WAIT_S = 1.0


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an open terminal."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


def format_duration(ms: int | float | None) -> str:
    """``312 ms``, ``4.2 s``, ``2m05s``; ``-`` when unknown."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{int(ms)} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(int(ms // 1000), 60)
    return f"{minutes}m{seconds:02d}s"


def format_batch_time(ms: int, interval_ms: int | None) -> str:
    """The batch time as local time of day, with milliseconds when the batch interval is not whole seconds."""
    text = _time.strftime("%H:%M:%S", _time.localtime(ms / 1000))
    if interval_ms is not None and interval_ms % 1000:
        text += f".{ms % 1000:03d}"
    return text


class ProgressLine(StreamingListener):
    """The progress line (see the module docstring).

    :param stream: where to write (a terminal: rewritten in place; else one line per update).
    :param status_url: the status page's URL, shown at the end of the line (None: not shown).
    :param batch_interval_ms: the context's batch interval (shows milliseconds in batch times when it has some).
    :param min_interval_s: minimum seconds between two updates (0: every batch).
    :param width: the line's maximum width; default: the terminal's width (a non-terminal: no limit).
    :param monotonic: the clock for ``min_interval_s`` (tests inject one).
    :param bus: the listener bus it is registered on (:meth:`start` registers it), left by :meth:`close`.
    """

    def __init__(self, stream: TextIO, *, status_url: str | None = None, batch_interval_ms: int | None = None,
                 min_interval_s: float = MIN_INTERVAL_S, width: int | None = None,
                 monotonic: Callable[[], float] = _time.monotonic, bus: ListenerBus | None = None) -> None:
        self.stream = stream
        self.status_url = status_url
        self.batch_interval_ms = batch_interval_ms
        self.min_interval_s = min_interval_s
        self.in_place = is_terminal(stream)
        self._width = width
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._bus = bus  # the bus it listens on (close() leaves it); None: registered by its caller, if at all
        self._submitted = 0
        self._completed = 0
        self._failed = 0
        self._latest: BatchInfo | None = None  # the newest completed batch not shown yet
        self._shown_at: float | None = None
        self._last_len = 0  # characters of the line on screen (in place only)
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    @staticmethod
    def settings(conf: config.ConfLike | None, stream: TextIO | None = None) -> TextIO | None:
        """Where the line goes, ``stream`` (default ``sys.stderr``), or None when it is off:
        ``spark.dstreams.ui.showProgress`` of ``conf`` (else its environment variable) when set, else whether
        ``stream`` is a terminal. ``ValueError`` naming the key for an invalid value."""
        stream = sys.stderr if stream is None else stream
        forced = config.get(config.UI_SHOW_PROGRESS, conf)
        on = is_terminal(stream) if forced is None else bool(forced)
        return stream if on else None

    @classmethod
    def start(cls, bus: ListenerBus, stream: TextIO | None, status_url: str | None,
              batch_interval_ms: int | None = None) -> ProgressLine | None:
        """A progress line on ``stream`` (what :meth:`settings` returned) registered on ``bus``, or None when
        ``stream`` is None (off). Call it before the first batch; :meth:`close` it when the context stops."""
        if stream is None:
            return None
        line = cls(stream, status_url=status_url, batch_interval_ms=batch_interval_ms, bus=bus)
        bus.add(line)
        return line

    def close(self) -> None:
        """Show the newest completed batch, end the line and stop listening (idempotent, never raises)."""
        bus = self._bus
        if bus is not None:
            bus.wait_until_empty(CLOSE_WAIT_S)  # the batches completed before the stop (False on the bus thread)
            try:
                bus.remove(self)
            except ValueError:
                pass
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._latest is not None:
                self._show_locked()
            if self.in_place and self._last_len:
                self._write_locked("\n")

    # ------------------------------------------------------------------ listener callbacks (bus thread)
    def onBatchSubmitted(self, batchSubmitted: Any) -> None:
        with self._lock:
            self._submitted += 1

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        info: BatchInfo = batchCompleted.batchInfo()
        with self._lock:
            if self._closed:
                return
            self._completed += 1
            if info.failed:
                self._failed += 1
            self._latest = info
            now = self._monotonic()
            if self._shown_at is None or now - self._shown_at >= self.min_interval_s:
                self._shown_at = now
                self._show_locked()

    # ------------------------------------------------------------------ rendering
    def render(self, info: BatchInfo, with_url: bool = True) -> str:
        """The line for ``info`` (the newest completed batch), with the counts seen so far (and the status page's
        URL, with ``with_url``)."""
        parts = [f"dstreams {format_batch_time(info.batch_time_ms, self.batch_interval_ms)}",
                 f"{self._completed:,} batch{'es' if self._completed != 1 else ''}"]
        if self._failed:
            parts.append(f"{self._failed:,} failed")
        pending = self._submitted - self._completed
        if pending > 0:
            parts.append(f"{pending:,} queued")
        parts.append(f"{info.num_records:,} record{'s' if info.num_records != 1 else ''}")
        parts.append(f"processing {format_duration(info.processing_delay_ms)}")
        parts.append(f"delay {format_duration(info.scheduling_delay_ms)} / "
                     f"{format_duration(info.total_delay_ms)} total")
        if self.status_url and with_url:
            parts.append(self.status_url)
        return "  ".join(parts)

    def _max_width(self) -> int | None:
        if self._width is not None:
            return self._width
        if not self.in_place:
            return None
        return max(20, shutil.get_terminal_size(fallback=(100, 24)).columns - 1)

    def _show_locked(self) -> None:
        info, self._latest = self._latest, None
        if info is None:
            return
        text = self.render(info)
        width = self._max_width()
        if width is not None and len(text) > width:
            text = self.render(info, with_url=False)
        if width is not None and len(text) > width:
            text = text[:width - 3] + "..."
        if not self.in_place:
            self._write_locked(text + "\n")
            return
        pad = max(0, self._last_len - len(text))
        self._write_locked("\r" + text + " " * pad)
        self._last_len = len(text)

    def _write_locked(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream: the line goes away, the stream goes on
            self._closed = True
