"""The one owner of a started ``StreamingContext``: everything ``start()`` builds, and its one ``close()``.

Contract. Constructing a :class:`StartedDriver` reads and checks the settings and serializes the graph for the
checkpoint (a bad setting or a function that cannot be serialized raises there, before anything runs: the
context stays INITIALIZED, as after Spark's validation). :meth:`StartedDriver.start` then builds, in this
order, and owns from then on:

1. the executors' preparation: a preload request for the S3 store module (an ``s3://`` checkpoint location)
   and the check that the executors can import dstreams (``dstreams.spark.executors``);
2. the :class:`~dstreams.recovery.runtime.DriverRuntime` (metadata log and fencing, journal, checkpointer,
   scheduler, event loop, resume plan; ``DriverRuntime.build`` wires those);
3. the JVM's preparation for short batches (``dstreams.spark.jvm.prepare``) and the speculation note in the log;
4. the status server (page, ``/api``, ``/metrics``; ``spark.dstreams.ui.enabled``) and the progress line;
5. the outputs' claims (``OutputNode.on_start``, once the epoch is taken: ``saveToPostgres`` ends older drivers'
   sessions of its output and raises its fence; ``saveToKafka`` (exactly once) fences the older producers of each
   output partition's ``transactional.id`` and writes its ledger entry again under the new epoch; so a zombie cannot
   commit even before this driver's first commit);
6. the runtime's start (the first batch is generated from here on);
7. the SIGTERM/SIGINT handlers (``spark.dstreams.stopOnSignal``), with the JVM forwarding those signals.

:meth:`StartedDriver.close` undoes all of it in reverse order: the signal handlers, the runtime (graceful:
after the generated batches ran; then the checkpointer), the graph's sources, the status server and the
progress line. It is idempotent and never leaves a thread behind. A ``start()`` that fails at any step calls
``close()`` on what was built so far before the error propagates, so a failed start leaves nothing running
(the SparkContext and the listener bus belong to the ``StreamingContext``).

``StreamingContext`` keeps PySpark's surface and its lifecycle states (INITIALIZED, ACTIVE, STOPPED) and holds
one ``StartedDriver`` while ACTIVE; nothing else of a started context is built or torn down elsewhere.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import SparkContext

from dstreams import config
from dstreams.clock import Clock
from dstreams.graph import DStreamGraph
from dstreams.listener_bus import ListenerBus
from dstreams.recovery.runtime import DriverRuntime, RuntimeSettings
from dstreams.recovery.store import is_store_url
from dstreams.spark import jvm
from dstreams.spark.executors import ensure_executors_can_import
from dstreams.spark.jvm_signals import JvmSignalForwarder, forward_signals
from dstreams.spark.sparkconf import speculation_available
from dstreams.spark.worker_daemon import request_preload

from .progress import ProgressLine
from .shutdown import SignalStop, Stoppable
from .status import StatusServer, StatusSources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverSetup:
    """What a started driver is built from (the ``StreamingContext``'s parts and settings)."""

    sc: SparkContext
    graph: DStreamGraph
    clock: Clock
    bus: ListenerBus
    settings: RuntimeSettings
    #: Objects the checkpointed graph refers to by name (the StreamingContext user functions captured).
    graph_refs: dict[int, str]
    #: The context, for the status page's state and the signal handlers' stop.
    context: Stoppable
    get_state: Callable[[], str]


class StartedDriver:
    """Everything a started context runs (module docstring): construct it (which reads and checks the settings,
    starting nothing), then :meth:`start` it."""

    def __init__(self, setup: DriverSetup) -> None:
        """Read the settings of what :meth:`start` builds; a bad one raises here, before anything runs."""
        self.setup = setup
        conf = setup.sc.getConf()
        self._status_settings = StatusServer.settings(conf)
        self._progress_stream = ProgressLine.settings(conf)
        self._stop_on_signal: str = config.get(config.STOP_ON_SIGNAL, conf)
        setup.graph.require_batch_duration()
        #: The graph as the checkpoint stores it (a function that cannot be serialized fails here, as in Spark's
        #: validation before start).
        self._stored_graph = DriverRuntime.serialized_graph(setup.sc, setup.graph, setup.settings, setup.graph_refs)
        self.runtime: DriverRuntime | None = None
        self.status: StatusServer | None = None
        self.progress: ProgressLine | None = None
        self.signals: SignalStop | None = None
        self._closed = False

    def start(self) -> None:
        """Build and start everything (module contract); on any error, close what was built and re-raise."""
        try:
            self._build()
        except BaseException:
            try:
                self.close(graceful=False, timeout_s=10.0)
            except BaseException:  # noqa: BLE001 - the start's own error is the one to raise
                log.warning("cleaning up after a failed start()", exc_info=True)
            raise

    def _build(self) -> None:
        s = self.setup
        conf = s.sc.getConf()
        if is_store_url(s.settings.checkpoint_dir):
            request_preload(s.sc, "dstreams.recovery.store.s3")
        ensure_executors_can_import(s.sc)
        self.runtime = DriverRuntime.build(s.sc, s.graph, s.clock, s.bus, s.settings, graph_refs=s.graph_refs,
                                           stored_graph=self._stored_graph)
        _log_speculation(conf)
        jvm.prepare(s.sc)
        self.status = StatusServer.start(StatusSources(s.sc, s.graph, self.runtime, s.clock, s.bus,
                                                       s.settings.checkpoint_dir, s.get_state),
                                          self._status_settings)
        batch = s.graph.batch_duration
        self.progress = ProgressLine.start(s.bus, self._progress_stream, self.status.url if self.status else None,
                                           batch.ms if batch else None)
        for out in s.graph.outputs:  # the epoch is taken: sinks that fence their output claim it now
            if out.on_start is not None:
                out.on_start()
        self.runtime.start()
        self.signals = SignalStop.install(s.context, self._stop_on_signal, self._forward_jvm_signals)

    def _forward_jvm_signals(self, signums: Sequence[int]) -> JvmSignalForwarder | None:
        """Have the driver's JVM send ``signums`` on to this process instead of acting on them."""
        sc: Any = self.setup.sc
        return forward_signals(sc._jvm, sc._jsc, [signal.Signals(n).name[3:] for n in signums])

    def close(self, graceful: bool, timeout_s: float) -> None:
        """Stop everything :meth:`start` built, in reverse order (module contract); idempotent. Errors of one
        part do not keep the others running: the first is raised once all are stopped."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None

        def attempt(what: str, action: Callable[[], None]) -> None:
            nonlocal first
            try:
                action()
            except BaseException as e:  # noqa: BLE001 - every part is stopped; the first error is raised
                log.warning("stopping %s failed", what, exc_info=True)
                first = first or e

        signals, self.signals = self.signals, None
        if signals is not None:
            attempt("the signal handlers", signals.uninstall)
        runtime = self.runtime
        if runtime is not None:
            attempt("the scheduler and the checkpointer", lambda: runtime.stop(graceful=graceful, timeout_s=timeout_s))
        attempt("the sources", self.setup.graph.stop)
        status, self.status = self.status, None
        if status is not None:
            attempt("the status server", status.close)
        progress, self.progress = self.progress, None
        if progress is not None:
            attempt("the progress line", progress.close)
        if first is not None:
            raise first


def _log_speculation(conf: Any) -> None:
    master = conf.get("spark.master", "") or ""
    if not speculation_available(conf):
        log.info("speculative execution of stragglers is unavailable with master %s (Spark never "
                 "speculates in local mode); run on a cluster master for it", master)
    elif conf.get("spark.speculation", "false") != "true":
        log.warning("speculative execution is off on %s: slow tasks (stragglers) delay whole batches; "
                    "set spark.speculation=true (dstreams.spark.sparkconf.tuned_conf does)", master)
