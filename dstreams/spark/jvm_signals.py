"""SIGTERM and SIGINT that reach the driver's JVM are handed to the Python driver, not acted on.

A Python driver has a JVM beside it in two ways, and in both a stop signal can reach the JVM:

* ``python script.py``: PySpark starts the JVM as a child in the driver's process group (ignoring
  SIGINT). A signal sent to the whole group (``kill -TERM -<pgid>``, systemd's default ``KillMode``, a
  container runtime) also reaches the JVM;
* ``spark-submit script.py``: the JVM is the parent and starts the Python driver. Orchestrators signal
  the process they started, the JVM, and Ctrl-C in a terminal reaches both.

A JVM's default reaction to SIGTERM/SIGINT is to run its shutdown hooks, which stop the SparkContext
under the Python driver: a graceful stop (:mod:`dstreams.api.shutdown`) then fails with "SparkContext
has been shutdown" and the exit code is not 0. :func:`forward_signals` installs, in the JVM, a handler
(:data:`SOURCE`, compiled by Janino like :mod:`dstreams.spark.jvm_compiled`) that instead sends the same
signal to the Python driver process, whose handler decides what a stop means. Contract:

* only the signals named are taken over (those the Python driver's :class:`~dstreams.api.shutdown.SignalStop`
  took over); a signal the JVM inherited as ignored (SIGINT under ``python script.py``) stays ignored;
* each forward logs one line on the JVM's stderr; the JVM itself keeps running and exits when the Python
  driver does (``spark-submit`` waits for it and takes its exit code; under ``python script.py`` the JVM
  ends when the driver's end of its stdin closes);
* a signal sent to a whole process group arrives at the Python driver twice (once from the kernel,
  once forwarded, milliseconds apart): the Python handler counts a repeat within
  :data:`dstreams.api.shutdown.DUPLICATE_WINDOW_S` as the same signal;
* :meth:`JvmSignalForwarder.restore` puts the JVM's previous handlers back (after a stop, so that a
  later signal acts as it did before the stream ran).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from py4j.protocol import Py4JError

from .jvm_compiled import compiled_class

log = logging.getLogger(__name__)

CLASS_NAME = "dstreams.jvm.SignalForwarder"

SOURCE = """
package dstreams.jvm;

import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import sun.misc.Signal;
import sun.misc.SignalHandler;

public class SignalForwarder implements SignalHandler {
    private long pid;
    private final Map previous = new HashMap();

    /** The process the signals go to (its decimal id). */
    public void setTarget(String processId) {
        pid = Long.parseLong(processId);
    }

    /** Take over the signal NAME (TERM, INT); whether this handler is now the JVM's. */
    public synchronized boolean install(String name) {
        SignalHandler before = Signal.handle(new Signal(name), this);
        if (before == SignalHandler.SIG_IGN) {
            Signal.handle(new Signal(name), before);
            return false;
        }
        previous.put(name, before);
        return true;
    }

    public synchronized void restore() {
        Iterator names = previous.keySet().iterator();
        while (names.hasNext()) {
            String name = (String) names.next();
            Signal.handle(new Signal(name), (SignalHandler) previous.get(name));
        }
        previous.clear();
    }

    public void handle(Signal signal) {
        String name = signal.getName();
        System.err.println("dstreams: SIG" + name + " reached the driver JVM; forwarded to the Python driver (pid "
            + pid + "), which stops the stream");
        try {
            new ProcessBuilder(new String[] {"kill", "-" + name, Long.toString(pid)}).start().waitFor();
        } catch (Exception e) {
            System.err.println("dstreams: could not forward SIG" + name + " to pid " + pid + ": " + e);
        }
    }
}
"""


class JvmSignalForwarder:
    """The JVM-side forwarder of one running stream (see the module docstring)."""

    def __init__(self, handle: Any, names: list[str]) -> None:
        self._handle = handle
        #: The signals (``TERM``, ``INT``) the JVM now forwards.
        self.names = names

    def restore(self) -> None:
        """Give the JVM its previous handlers back; a JVM already gone is not an error."""
        try:
            self._handle.restore()
        except Exception as e:  # noqa: BLE001 - the JVM may be stopping: nothing left to restore
            log.debug("could not restore the JVM's signal handlers: %s", e)


def forward_signals(jvm: Any, anchor: Any, names: Iterable[str], pid: int | None = None) -> JvmSignalForwarder | None:
    """Make the JVM behind ``jvm`` forward the signals ``names`` (``"TERM"``, ``"INT"``) to the Python
    process ``pid`` (default: this one); the class is loaded next to ``anchor``'s (a Spark object).

    None when nothing was taken over (every signal ignored by the JVM) or the handler cannot be installed
    (no Janino, a JVM without ``sun.misc.Signal``): one warning then, and the JVM keeps its own handling."""
    try:
        handle = compiled_class(jvm, anchor, SOURCE, CLASS_NAME).newInstance()
        handle.setTarget(str(os.getpid() if pid is None else pid))
        taken = [name for name in names if handle.install(name)]
    except (Py4JError, AttributeError) as e:
        log.warning("dstreams: the driver JVM keeps its own SIGTERM/SIGINT handling (%s): a signal sent to the "
                    "JVM or to the whole process group stops the SparkContext at once, so a graceful stop "
                    "started by it cannot finish its batches (they are redone on restart)",
                    str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    return JvmSignalForwarder(handle, taken) if taken else None

