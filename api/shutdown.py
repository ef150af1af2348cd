"""Stopping a running stream on SIGTERM and SIGINT (``spark.dstreams.stopOnSignal``).

Contract:

* :meth:`SignalStop.install` is called by ``StreamingContext.start()``. It takes over SIGTERM and SIGINT
  only in the main thread, and only for a signal whose handler is still Python's default (``SIG_DFL``
  for SIGTERM, ``default_int_handler`` for SIGINT) or PySpark's (the SIGINT handler a ``SparkContext``
  made in the main thread installs: it cancels every job): a handler the application installed is left alone.
  With ``off`` nothing is installed.
* The first signal starts the stop on a thread of its own (``dstreams-signal-stop``), never inside the
  handler: the main thread may be inside a Py4J call when the signal arrives, and a nested call on the
  same connection would deadlock. ``graceful`` is ``ssc.stop(stopSparkContext=True, stopGraceFully=True)``:
  no new batch is generated, the generated ones finish and commit (outputs, metadata log, the checkpoints
  due), within ``spark.dstreams.gracefulStopTimeout``; ``immediate`` cancels the running batch (redone
  on restart from the metadata log; exactly-once outputs are never half-written).
* Then the process exits 0 (1 if the stop failed): a main thread blocked in ``awaitTermination()``
  returns from it and the script ends as it would after ``ssc.stop()``; a main thread that never called
  ``awaitTermination*`` (a loop of its own) gets ``SystemExit`` raised in it.
* A second signal while the stop runs exits at once with code 128 + the signal number (``os._exit``:
  the batch in flight is redone on restart).
* The driver's JVM does not act on the signals taken over: once the handlers are in place,
  :meth:`SignalStop.take_over` (``install``'s last step) asks it (``forward``, given at construction, see
  :mod:`dstreams.spark.jvm_signals`) to send them on to this process instead of stopping the SparkContext
  under the graceful stop (a signal to the whole process group, or to the ``spark-submit`` JVM alone).
  A group signal then arrives twice, milliseconds apart: while the JVM forwards, one repeat of the first
  signal within :data:`DUPLICATE_WINDOW_S` of it is the same signal, not a second one.
* ``uninstall()`` (a stop from code, in the main thread) puts the previous handlers back, the JVM's
  too. After a stop from another thread the handlers stay and behave as the previous ones did.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: The signals a running stream stops on.
SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: A repeat of the first signal this soon after it, while the JVM forwards signals, is that signal
#: delivered twice (to the process group and forwarded by the JVM), not a request to exit at once.
DUPLICATE_WINDOW_S = 1.5


class Stoppable(Protocol):
    """What a :class:`SignalStop` needs of a ``StreamingContext``."""

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None: ...

    def main_thread_awaited(self) -> bool:
        """Whether the main thread waits in ``awaitTermination*`` (it returns by itself after the stop)."""
        ...


class Forwarding(Protocol):
    """The JVM's forwarding of signals to this process (:class:`dstreams.spark.jvm_signals.JvmSignalForwarder`)."""

    names: list[str]

    def restore(self) -> None: ...


#: Asks the driver's JVM to forward the given signals here; what it took over, or None.
ForwardFn = Callable[[Sequence[int]], "Forwarding | None"]


def _is_pyspark_handler(handler: Any) -> bool:
    """PySpark's own SIGINT handler (a ``SparkContext`` made in the main thread installs one that cancels
    every job and raises ``KeyboardInterrupt``): not the application's, and it would break a graceful stop."""
    return callable(handler) and (getattr(handler, "__module__", None) or "").split(".")[0] == "pyspark"


def _is_default(signum: int, handler: Any) -> bool:
    if signum == signal.SIGINT:
        return handler is signal.default_int_handler or _is_pyspark_handler(handler)
    return handler == signal.SIG_DFL


class SignalStop:
    """The SIGTERM/SIGINT handlers of one running context (see the module docstring)."""

    def __init__(self, ssc: Stoppable, mode: str, previous: dict[int, Any],
                 exit_now: Callable[[int], None] = os._exit, forward: ForwardFn | None = None) -> None:
        """Handlers for the signals in ``previous`` (signal -> the handler they replace), inactive until
        :meth:`take_over`; ``forward`` asks the driver's JVM to send those signals on here (None: the JVM is not
        asked)."""
        self._ssc = ssc
        self.mode = mode
        self._previous = previous
        self._exit_now = exit_now
        self._lock = threading.Lock()
        #: Set by the first signal; the stop thread runs from then on.
        self.stopping = False
        self._done = threading.Event()
        self.exit_code = 0
        self._thread: threading.Thread | None = None
        self._detached = False
        self._forward = forward
        self._forwarding: Forwarding | None = None
        self._first: tuple[int, float] | None = None

    @classmethod
    def install(cls, ssc: Stoppable, mode: str, forward: ForwardFn | None = None) -> SignalStop | None:
        """Take over the signals that still have Python's default handler, and ask the JVM (``forward``) to
        send those on here; None when nothing was taken over (``mode == "off"``, not the main thread, or
        the application handles both signals itself)."""
        if mode == "off" or threading.current_thread() is not threading.main_thread():
            return None
        previous: dict[int, Any] = {s: signal.getsignal(s) for s in SIGNALS if _is_default(s, signal.getsignal(s))}
        if not previous:
            return None
        stopper = cls(ssc, mode, previous, forward=forward)
        stopper.take_over()
        return stopper

    def take_over(self) -> None:
        """The lifecycle step after construction (main thread): install the handlers, then have the JVM forward
        the signals here (only once the handlers are in place, so that no forwarded signal meets Python's
        default handler)."""
        for s in self._previous:
            signal.signal(s, self._handle)
        if self._forward is not None:
            self._forwarding = self._forward(list(self._previous))

    @property
    def forwarding(self) -> Forwarding | None:
        """The JVM's forwarding of the signals taken over (:meth:`take_over`), while it lasts."""
        return self._forwarding

    def uninstall(self) -> None:
        """Put the previous handlers back (in the main thread; elsewhere the handlers only stop acting).
        The JVM's handlers go back too, unless a signal started the stop: the process is ending, and a
        second signal must still reach this process to exit at once."""
        self._detached = True
        forwarding = self._forwarding
        if forwarding is not None and not self.stopping:
            self._forwarding = None
            forwarding.restore()
        if threading.current_thread() is not threading.main_thread():
            return
        for s, handler in self._previous.items():
            if signal.getsignal(s) == self._handle:
                signal.signal(s, handler)

    def wait(self, timeout_s: float) -> bool:
        """Wait for a stop started by a signal to finish; whether it did."""
        return self._done.wait(timeout_s)

    # ------------------------------------------------------------------ the handler (main thread)
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._done.is_set():  # the stop finished while the main thread ran code of its own: end it
            self.uninstall()
            raise SystemExit(self.exit_code)
        now = time.monotonic()
        with self._lock:
            second = self.stopping
            if not second and not self._detached:
                self.stopping = True
                self._first = (signum, now)
        if self._detached and not second:
            self._act_as_before(signum, frame)
            return
        if second and self._is_duplicate(signum, now):
            first_at = self._first[1] if self._first else now
            self._first = None  # one copy only: the next repeat is a second signal
            log.info("%s again %.2f s after the first: the same signal, sent to the process group and forwarded "
                     "by the JVM (send it again to exit at once)", name, now - first_at)
            return
        if second:
            log.warning("%s again while stopping: exiting now (code %d); batches in flight are redone on restart",
                        name, 128 + signum)
            self._exit_now(128 + signum)
            return
        how = ("finishing the generated batches (a second signal exits at once)" if self.mode == "graceful"
               else "cancelling the running batch")
        log.warning("%s received: stopping the stream, %s", name, how)
        self._thread = threading.Thread(target=self._stop, args=(signum,), name="dstreams-signal-stop")
        self._thread.start()

    def _is_duplicate(self, signum: int, now: float) -> bool:
        first = self._first
        return (self._forwarding is not None and first is not None and first[0] == signum
                and now - first[1] < DUPLICATE_WINDOW_S)

    def _act_as_before(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if previous is signal.default_int_handler:
            raise KeyboardInterrupt
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    # ------------------------------------------------------------------ the stop (its own thread)
    def _stop(self, signum: int) -> None:
        try:
            self._ssc.stop(stopSparkContext=True, stopGraceFully=self.mode == "graceful")
            log.warning("stream stopped after %s", signal.Signals(signum).name)
        except BaseException:
            log.exception("stopping the stream after %s failed", signal.Signals(signum).name)
            self.exit_code = 1
        self._done.set()
        main = threading.main_thread()
        if main.is_alive() and not self._ssc.main_thread_awaited():
            _thread.interrupt_main(signal.Signals(signum))  # runs _handle in the main thread, which raises SystemExit
