"""Stopping on signals (api/shutdown.py) and what a graceful stop records.

The process-level behaviour (SIGTERM to a real driver on Ceph, exit 0, a restart resuming exactly once) is
in tests/fault/test_signal_process.py; here the handlers are driven in this process with ``signal.raise_signal``.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from dstreams import ManualClock, StreamingContext, config
from dstreams.api.shutdown import SignalStop


class _FakeContext:
    """Records the stop a signal asks for."""

    def __init__(self, awaited: bool = False, stop_s: float = 0.0) -> None:
        self.stops: list[tuple[bool, bool]] = []
        self.awaited = awaited
        self.stop_s = stop_s
        self.stopped = threading.Event()

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        time.sleep(self.stop_s)
        self.stops.append((stopSparkContext, stopGraceFully))
        self.stopped.set()

    def main_thread_awaited(self) -> bool:
        return self.awaited


@pytest.fixture
def default_handlers():
    """Python's default handlers for the test, the previous ones back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _wait_for_exit(timeout_s: float = 10.0) -> None:
    """Sleep in the main thread until the stop thread's SystemExit reaches it (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise AssertionError(f"no SystemExit within {timeout_s} s")


def test_sigterm_stops_gracefully_then_ends_a_main_thread_that_never_awaited(default_handlers):
    ctx = _FakeContext()
    stopper = SignalStop.install(ctx, "graceful")
    assert stopper is not None and signal.getsignal(signal.SIGTERM) == stopper._handle
    with pytest.raises(SystemExit) as exited:
        signal.raise_signal(signal.SIGTERM)
        _wait_for_exit()
    assert exited.value.code == 0
    assert ctx.stops == [(True, True)]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the previous handlers are back


def test_a_main_thread_in_await_termination_returns_by_itself(default_handlers):
    ctx = _FakeContext(awaited=True)
    stopper = SignalStop.install(ctx, "immediate")
    signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: the stream stops instead
    assert stopper.wait(10) and ctx.stops == [(True, False)]
    time.sleep(0.2)  # no SystemExit arrives: the application's own code goes on after awaitTermination()


def test_a_second_signal_while_stopping_exits_at_once(default_handlers):
    ctx = _FakeContext(awaited=True, stop_s=1.0)
    exits: list[int] = []
    stopper = SignalStop(ctx, "graceful", {signal.SIGTERM: signal.SIG_DFL}, exit_now=exits.append)
    signal.signal(signal.SIGTERM, stopper._handle)
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGTERM)
    assert exits == [128 + signal.SIGTERM]
    assert stopper.wait(10)


def test_handlers_of_the_application_are_left_alone_and_off_installs_none(default_handlers):
    def mine(signum, frame):  # noqa: ARG001
        pass

    assert SignalStop.install(_FakeContext(), "off") is None
    signal.signal(signal.SIGTERM, mine)
    stopper = SignalStop.install(_FakeContext(), "graceful")
    assert stopper is not None and signal.getsignal(signal.SIGTERM) is mine  # SIGINT only
    assert signal.getsignal(signal.SIGINT) == stopper._handle
    stopper.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, mine)
    assert SignalStop.install(_FakeContext(), "graceful") is None  # both are the application's
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(SignalStop.install(_FakeContext(), "graceful")))
    worker.start()
    worker.join(10)
    assert outcome == [None]  # signals can only be handled in the main thread


def test_after_a_stop_from_code_the_default_behaviour_is_back(default_handlers, sc):
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    ssc.queueStream([[1]]).foreachRDD(lambda rdd: None)
    ssc.start()
    assert signal.getsignal(signal.SIGINT) != signal.default_int_handler
    ssc.stop(stopSparkContext=False)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_signal_settings_are_checked():
    assert config.get(config.STOP_ON_SIGNAL, {}) == "graceful"
    with pytest.raises(ValueError, match="spark.dstreams.stopOnSignal='later' is not one of graceful"):
        config.get(config.STOP_ON_SIGNAL, {"spark.dstreams.stopOnSignal": "later"})
    assert config.get(config.GRACEFUL_STOP_TIMEOUT, {"spark.streaming.gracefulStopTimeout": "20000"}) == 20.0
    assert config.get(config.GRACEFUL_STOP_TIMEOUT, {"spark.dstreams.gracefulStopTimeout": "2min"}) == 120.0
    with pytest.raises(ValueError, match="gracefulStopTimeout='soon'"):
        config.get(config.GRACEFUL_STOP_TIMEOUT, {"spark.dstreams.gracefulStopTimeout": "soon"})


def test_pyspark_own_sigint_handler_is_taken_over_and_given_back(default_handlers):
    def pyspark_handler(signum, frame):  # noqa: ARG001 - stands for the one SparkContext() installs
        raise KeyboardInterrupt

    pyspark_handler.__module__ = "pyspark.core.context"
    signal.signal(signal.SIGINT, pyspark_handler)
    ctx = _FakeContext(awaited=True)
    stopper = SignalStop.install(ctx, "graceful")
    assert stopper is not None and signal.getsignal(signal.SIGINT) == stopper._handle
    signal.raise_signal(signal.SIGINT)  # a graceful stop, not PySpark's cancel-everything KeyboardInterrupt
    assert stopper.wait(10) and ctx.stops == [(True, True)]
    stopper.uninstall()
    assert signal.getsignal(signal.SIGINT) is pyspark_handler


class _Forwarding:
    def __init__(self) -> None:
        self.names = ["TERM", "INT"]
        self.restored = 0

    def restore(self) -> None:
        self.restored += 1


def test_while_the_jvm_forwards_one_copy_of_the_first_signal_is_not_a_second_signal(default_handlers):
    ctx = _FakeContext(awaited=True, stop_s=1.0)
    exits: list[int] = []
    forwarding = _Forwarding()
    stopper = SignalStop(ctx, "graceful", {signal.SIGTERM: signal.SIG_DFL}, exit_now=exits.append,
                         forward=lambda signums: forwarding)
    stopper.take_over()
    assert stopper.forwarding is forwarding and signal.getsignal(signal.SIGTERM) == stopper._handle
    signal.raise_signal(signal.SIGTERM)  # the process group's copy
    signal.raise_signal(signal.SIGTERM)  # the JVM's forwarded copy: the same signal
    assert exits == []
    signal.raise_signal(signal.SIGTERM)  # a real second signal
    assert exits == [128 + signal.SIGTERM]
    assert stopper.wait(10) and ctx.stops == [(True, True)]
    stopper.uninstall()
    assert forwarding.restored == 0  # a signal started the stop: the JVM keeps forwarding until the end


def test_a_stop_from_code_gives_the_jvm_its_handlers_back(default_handlers):
    forwarding = _Forwarding()
    stopper = SignalStop.install(_FakeContext(), "graceful", lambda signums: forwarding)
    assert stopper is not None and stopper.forwarding is forwarding
    stopper.uninstall()
    assert forwarding.restored == 1 and stopper.forwarding is None


@pytest.mark.timeout(60)
def test_the_jvm_forwards_sigterm_to_the_driver_instead_of_shutting_down(sc):
    """A real SIGTERM to this test run's JVM reaches the process named as the driver (a ``sleep`` here) and
    the JVM lives on; its previous handler is back afterwards."""
    import os
    import subprocess

    from dstreams.spark.jvm_signals import forward_signals

    stand_in = subprocess.Popen(["sleep", "60"])
    forwarder = None
    try:
        forwarder = forward_signals(sc._jvm, sc._jsc, ["TERM"], pid=stand_in.pid)
        assert forwarder is not None and forwarder.names == ["TERM"]
        jvm_pid = int(sc._jvm.java.lang.ProcessHandle.current().pid())
        os.kill(jvm_pid, signal.SIGTERM)
        assert stand_in.wait(timeout=20) == -signal.SIGTERM
        assert sc.parallelize([1, 2, 3]).count() == 3  # the JVM did not run its shutdown hooks
    finally:
        if forwarder is not None:
            forwarder.restore()
        stand_in.kill()
        stand_in.wait(timeout=10)
