"""The driver runtime's wiring: the recovery layer's part of a started context.

The composition root is :class:`dstreams.api.driver.StartedDriver` (``StreamingContext.start()`` builds one);
it calls :meth:`DriverRuntime.build` once, and :meth:`DriverRuntime.stop` at stop; nothing else in the code base
creates these objects or sets one on another. Wiring, in
construction order (every dependency goes in through a constructor):

1. with a checkpoint location, the **graph** is serialized first (a user function that cannot be
   serialized fails the start before anything is written); it is stored once this driver owns the
   location (:mod:`.graph_store`), so ``getOrCreate`` can restore it without calling ``setupFunc``;
2. the checkpoint location (:class:`StoreSpec`): the folder or ``s3://`` URL given to
   ``ssc.checkpoint()``, else a temporary folder removed at stop;
3. the scheduler's **event loop** (:class:`EventLoop`), the one thread that changes graph state;
4. the **first batch time** of a fresh start (:func:`~dstreams.scheduler.first_batch_time`; the zero time
   recorded in the metadata log is one batch interval earlier);
5. one :class:`StoreOutagePolicy` (how long to wait for an unavailable store), given to the journal, the
   checkpointer and the scheduler: one outage bound for the whole driver;
6. with a checkpoint location: the **metadata log** (:class:`MetadataLog`), which takes the next
   epoch (fencing) and returns the previous head if a driver ran here before; then the stored graph
   is written; the **journal** (:class:`Journal`) that writes the log as batches are generated and
   completed; the **write-ahead log** of sources that cannot replay;
7. the **checkpointer** (:class:`StoreCheckpointer`), which posts committed checkpoints to the event
   loop and checks the fence before each commit;
8. the **scheduler** (:class:`JobScheduler`) with all of the above and the fault-injection hook;
9. the **resume plan** (:func:`plan_resume`) when the metadata log had a previous head.

Sinks reach the fence and the checkpoint store's options through :meth:`DriverRuntime.check_owner`
and :attr:`RuntimeSettings`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from pyspark import SparkContext

from dstreams import config, faults
from dstreams.clock import Clock
from dstreams.contracts import Fence, NoFence
from dstreams.errors import DStreamsError
from dstreams.events import EventLoop
from dstreams.graph import DStreamGraph
from dstreams.listener_bus import ListenerBus
from dstreams.scheduler import JobScheduler, first_batch_time
from dstreams.time import BatchTime

from .checkpointer import StoreCheckpointer, StoreWriteAheadLog
from .graph_store import serialize_graph, write_graph
from .journal import Journal
from .metadata import MetadataLog
from .outage import StoreOutagePolicy, outage_seconds_from_env
from .resume import ResumePlan, plan_resume
from .store import local_path
from .storespec import StoreSpec

log = logging.getLogger(__name__)


class CheckpointInUseError(DStreamsError, RuntimeError):
    """The checkpoint location holds a previous run's metadata log and the context was not asked to resume."""


@dataclass(frozen=True)
class RuntimeSettings:
    """What the api layer decided before ``start()``: where to checkpoint, whether to resume, how many
    batches may run at once."""

    checkpoint_dir: str | None = None
    store_options: dict[str, Any] = field(default_factory=dict)
    resume: bool = False
    concurrent_batches: int = 1


class DriverRuntime:
    """The wired driver runtime of one started context (see the module docstring)."""

    def __init__(self, scheduler: JobScheduler, checkpointer: StoreCheckpointer, events: EventLoop,
                 fence: Fence, metadata: MetadataLog | None, journal: Journal | None,
                 plan: ResumePlan | None, first_batch: BatchTime, temp_dir: str | None) -> None:
        self.first_batch = first_batch
        self.scheduler = scheduler
        self.checkpointer = checkpointer
        self.events = events
        self.fence = fence
        self.metadata = metadata
        self.journal = journal
        self.plan = plan
        self._temp_dir = temp_dir

    @staticmethod
    def serialized_graph(sc: SparkContext, graph: DStreamGraph, settings: RuntimeSettings,
                         graph_refs: dict[int, str] | None = None) -> bytes | None:
        """The graph as it will be stored in the checkpoint location (None: not stored), serialized now: a user
        function that cannot be serialized raises ``GraphNotSerializableError`` before anything runs.

        ``graph_refs`` maps objects a user function may capture (the StreamingContext) to the names they
        are stored under in the checkpointed graph."""
        store_graph = settings.checkpoint_dir is not None and config.get(config.CHECKPOINT_GRAPH, sc.getConf())
        return serialize_graph(graph, sc.getConf(), graph_refs or {}) if store_graph else None

    @classmethod
    def build(cls, sc: SparkContext, graph: DStreamGraph, clock: Clock, bus: ListenerBus,
              settings: RuntimeSettings, graph_refs: dict[int, str] | None = None, *,
              stored_graph: bytes | None = None) -> DriverRuntime:
        """Wire the runtime; with a checkpoint location, take over its metadata log (and plan a resume).

        ``stored_graph``: what :meth:`serialized_graph` returned, written to the location once it is taken
        over (computed here from ``graph_refs`` when not given).
        """
        batch = graph.require_batch_duration()
        if stored_graph is None:
            stored_graph = cls.serialized_graph(sc, graph, settings, graph_refs)
        spec, temp_dir = _checkpoint_location(settings)
        events = EventLoop("dstreams-generator")
        first = first_batch_time(clock, batch)
        metadata: MetadataLog | None = None
        journal: Journal | None = None
        previous: dict[str, Any] | None = None
        wal: StoreWriteAheadLog | None = None
        fence: Fence = NoFence()
        outage = StoreOutagePolicy(outage_seconds_from_env(sc.getConf()))  # this context's conf, not the active one
        if settings.checkpoint_dir is not None:
            store = spec.open()
            if MetadataLog.read(store) is not None and not settings.resume:
                raise CheckpointInUseError(
                    f"the checkpoint location {settings.checkpoint_dir} already holds the metadata log of a previous "
                    "run: resume it with StreamingContext.getOrCreate(path, setupFunc), or use an empty location"
                )
            assert sc.appName is not None, "a running SparkContext has an application name (Spark requires one)"
            metadata = MetadataLog(store, sc.appName, graph.fingerprint(), batch.ms, fault_hook=faults.reached)
            previous = metadata.take_over(zero_ms=first.ms - batch.ms)
            if stored_graph is not None:
                write_graph(store, stored_graph)
            journal = Journal(metadata, graph, outage=outage)
            wal = StoreWriteAheadLog(store)
            fence = metadata
        checkpointer = StoreCheckpointer(sc, spec, events, fence, outage=outage, fault_hook=faults.reached)
        scheduler = JobScheduler(graph, clock, bus, checkpointer, events,
                                 concurrent_batches=settings.concurrent_batches, journal=journal, wal=wal,
                                 fault_hook=faults.reached, outage=outage,
                                 max_attempts=config.get(config.BATCH_MAX_ATTEMPTS, sc.getConf()),
                                 on_failure=_on_failure(config.get(config.BATCH_ON_FAILURE, sc.getConf()), settings))
        plan = plan_resume(sc, spec, graph, previous, checkpointer) if previous is not None else None
        return cls(scheduler, checkpointer, events, fence, metadata, journal, plan, first, temp_dir)

    def start(self) -> None:
        """Start generating: from the resume plan's first batch, else from the clock's next boundary."""
        if self.plan is not None:
            self.scheduler.start(self.plan.first_batch, self.plan.zero, self.plan.prepare, self.plan.dropped)
        else:
            # The same first batch as recorded in the metadata log: the zero time must match.
            self.scheduler.start(self.first_batch)

    def check_owner(self) -> None:
        """Raise ``FencedError`` when another driver has taken over (sinks call it before committing)."""
        self.fence.check_owner()

    def stop(self, graceful: bool, timeout_s: float) -> None:
        """Stop the scheduler (graceful: after the generated batches ran), then the checkpointer."""
        try:
            if self.journal is not None and not graceful:
                self.journal.close()  # a batch waiting for an unavailable store gives up now
            self.scheduler.stop(graceful=graceful, timeout_s=timeout_s)
        finally:
            self.checkpointer.close(wait=graceful)
            if self._temp_dir:
                shutil.rmtree(self._temp_dir, ignore_errors=True)


def _on_failure(mode: str, settings: RuntimeSettings) -> str:
    """``spark.dstreams.batch.onFailure`` resolved: ``auto`` is ``stop`` when a metadata log lets a restart run
    the failed batch again (a checkpoint location), else ``dropInput`` (PySpark's behaviour: go on)."""
    if mode != "auto":
        return mode
    return "stop" if settings.checkpoint_dir is not None else "dropInput"


def _checkpoint_location(settings: RuntimeSettings) -> tuple[StoreSpec, str | None]:
    directory = settings.checkpoint_dir
    temp_dir: str | None = None
    if directory is None:
        temp_dir = tempfile.mkdtemp(prefix="dstreams-checkpoint-")
        directory = temp_dir
        log.info("no checkpoint directory set: stateful streams checkpoint into %s (removed at stop)", directory)
    else:
        local = local_path(directory)
        if local is not None:
            os.makedirs(local, exist_ok=True)
            directory = os.path.abspath(local)
    return StoreSpec(directory, dict(settings.store_options)), temp_dir
