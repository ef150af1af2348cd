"""The stream graph: input nodes, output nodes, and what happens per batch.

Contract: nodes are added before ``start(zero_time, services)``; after it the graph is frozen
(adding raises). ``start`` hands the graph the runtime services its nodes use (the checkpointer,
the write-ahead log); they are fixed for the run. ``generate_jobs(time)`` builds one :class:`Job`
per output node that is valid at ``time``; ``clear_metadata(time)`` forgets old RDDs. Both run on
the scheduler's event loop (:mod:`dstreams.events`), the only thread that changes node state once
the context has started; the graph lock only guards the registry against concurrent definitions.

What recovery reads of the graph goes through :meth:`DStreamGraph.batch_records`,
:meth:`DStreamGraph.stateful_nodes` and :meth:`DStreamGraph.fingerprint`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .contracts import Checkpointer, WriteAheadLog
from .errors import DStreamsError
from .time import BatchTime, Duration

if TYPE_CHECKING:
    from pyspark import SparkContext

    from .node import DStreamNode
    from .nodes.input import InputNode
    from .nodes.output import OutputNode


@dataclass
class Job:
    """One output operation of one batch: ``run()`` executes the Spark work."""

    time: BatchTime
    output_id: int
    name: str
    description: str
    func: Callable[[], None]

    def run(self) -> None:
        self.func()


@dataclass(frozen=True)
class GraphServices:
    """What the nodes of a started graph use: the checkpointer and, when the checkpoint location
    is durable, the write-ahead log of sources that cannot replay."""

    checkpointer: Checkpointer
    wal: WriteAheadLog | None = None


@dataclass(frozen=True)
class BatchRecords:
    """What one batch records in the metadata log, per node key: each node's ``batch_record`` (an input's
    offsets, an event-time stream's watermark) and ``node_state`` (a source's state)."""

    offsets: dict[str, Any]
    sources: dict[str, Any]


@runtime_checkable
class HoldsOwnRDDs(Protocol):
    """A node that persisted RDDs of its own beside the ones the engine keeps for it (a store-backed state's handle
    at the zero time): when the context stops, after the node's :meth:`~dstreams.node.DStreamNode.release`, the
    graph has it unpersist those too."""

    def release_own_rdds(self) -> None:
        """Unpersist the RDDs the node persisted itself (they stay usable: recomputed on demand)."""


class GraphFrozenError(DStreamsError, RuntimeError):
    """Raised when streams or outputs are added after the context has started."""


def not_started_message(action: str) -> str:
    """Why ``action`` (``"add an input stream"``, ``"call remember()"``...) is refused once the context has
    started: the one wording of that rule, raised by the graph (:class:`GraphFrozenError`) and by the
    ``StreamingContext`` (its lifecycle state)."""
    return (f"cannot {action} after the StreamingContext has started: define every input, transformation "
            "and output operation before ssc.start()")


class DStreamGraph:
    """Holds the nodes of one StreamingContext."""

    def __init__(self, sc: SparkContext, batch_duration: Duration | None) -> None:
        self.sc = sc
        self.batch_duration = batch_duration
        self.inputs: list[InputNode] = []
        self.outputs: list[OutputNode] = []
        self.zero_time: BatchTime | None = None
        self.remember_duration: Duration | None = None
        self.lock = threading.RLock()
        self.started = False
        self.nodes: list[DStreamNode] = []
        self._services: GraphServices | None = None
        #: Batch times (ms) whose input was dropped in this run (:meth:`drop_input`): a node that keeps state outside
        #: its RDDs (the executor store) undoes what it applied for them when it is computed again.
        self.dropped_times: set[int] = set()
        #: The streams of dead letters of the graph's operators (``onError="deadLetter"``), in definition order, and
        #: how many of them ``ssc.deadLetters()`` united (None: not called); :meth:`validate` checks it took all.
        self.dead_letter_nodes: list[DStreamNode] = []
        self.dead_letters_united: int | None = None

    # ------------------------------------------------------------------ checkpointing the graph itself
    def __getstate__(self) -> dict[str, Any]:
        """What is stored in the checkpoint: the nodes and settings, not the SparkContext, lock or services."""
        if self.started:
            raise RuntimeError("a started graph is not serialized: the graph is checkpointed before it starts")
        state = dict(self.__dict__)
        state.update(sc=None, lock=None, _services=None, dropped_times=set())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("dropped_times", set())
        state.setdefault("dead_letter_nodes", [])
        state.setdefault("dead_letters_united", None)
        self.__dict__.update(state)
        self.lock = threading.RLock()

    def bind(self, sc: SparkContext) -> None:
        """Attach a graph restored from a checkpoint to the SparkContext it will run on (once)."""
        if self.sc is not None:
            raise RuntimeError("this graph already runs on a SparkContext")
        self.sc = sc

    @property
    def checkpointer(self) -> Checkpointer | None:
        """The checkpointer given to :meth:`start` (None before)."""
        return self._services.checkpointer if self._services is not None else None

    @property
    def wal(self) -> WriteAheadLog | None:
        """The write-ahead log given to :meth:`start`: set when the checkpoint location is durable."""
        return self._services.wal if self._services is not None else None

    def register(self, node: DStreamNode, key_name: str) -> str:
        """Add ``node`` to the graph's registry; returns its stable key: its position and ``key_name``, its type."""
        with self.lock:
            self._check_open("a stream")
            self.nodes.append(node)
            return f"{len(self.nodes) - 1:03d}-{key_name}"

    def fingerprint(self) -> list[str]:
        """A description of the topology that a restarted driver must reproduce exactly: per node, its key, its
        parameters (:meth:`~dstreams.node.DStreamNode.describe`) and its dependencies' keys. The metadata log keeps
        it in the checkpoint's head and refuses a restart whose graph describes itself otherwise."""
        out = []
        for n in self.nodes:
            deps = ",".join(d.key for d in n.dependencies)
            out.append(f"{n.key}[{n.describe()}]<-({deps})")
        return out

    # ------------------------------------------------------------------ building
    def _check_open(self, what: str) -> None:
        if self.started:
            raise GraphFrozenError(not_started_message(f"add {what}"))

    def add_input(self, node: InputNode) -> None:
        with self.lock:
            self._check_open("an input stream")
            self.inputs.append(node)

    def add_output(self, node: OutputNode) -> None:
        with self.lock:
            self._check_open("an output operation")
            self.outputs.append(node)

    def remember(self, duration: Duration) -> None:
        self.remember_duration = duration

    # ------------------------------------------------------------------ running
    def require_batch_duration(self) -> Duration:
        """The batch duration; a ``ValueError`` that names the fix when it is not set (an input stream and
        ``start()`` need it)."""
        if self.batch_duration is None:
            raise ValueError("the batch duration is not set: pass it to StreamingContext(sc, batchDuration)")
        return self.batch_duration

    def validate(self) -> None:
        self.require_batch_duration()
        if not self.outputs:
            raise ValueError(
                "no output operations registered, so nothing to execute: add one such as pprint(), "
                "foreachRDD() or saveAsTextFiles() before ssc.start()"
            )
        for out in self.outputs:
            out.validate_at_start()
        united = self.dead_letters_united
        if united is not None and united != len(self.dead_letter_nodes):
            raise ValueError(
                f"ssc.deadLetters() was called when {united} operator(s) routed dead letters, and "
                f"{len(self.dead_letter_nodes) - united} more were defined after it: call ssc.deadLetters() after "
                "defining every operator made with onError='deadLetter' (or under spark.dstreams.onRecordError="
                "deadLetter), or save each operator's own stream.deadLetters()")

    def start(self, zero_time: BatchTime, services: GraphServices,
              ride_out: Callable[[str, Callable[[], Any]], Any] | None = None) -> None:
        """Initialise every node at ``zero_time`` and start the inputs, in order. ``ride_out(what, func)`` runs
        each input's ``start()`` (the scheduler passes one that waits out an unavailable source or store, as for
        a batch): a source's ``start`` must therefore be safe to call again after it raised."""
        with self.lock:
            self.validate()
            self._services = services
            self.zero_time = zero_time
            for out in self.outputs:
                out.initialize(zero_time)
            for out in self.outputs:
                out.remember(self.remember_duration)
            self.started = True
            for node in self.inputs:
                if ride_out is None:
                    node.start()
                else:
                    ride_out(f"starting the source {node.name}", node.start)

    def stop(self) -> None:
        """Stop the inputs, then unpersist what the engine cached for every node (see ``release``)."""
        with self.lock:
            for source in self.inputs:
                source.stop()
            for node in self.nodes:
                node.release()
                if isinstance(node, HoldsOwnRDDs):
                    node.release_own_rdds()

    def generate_jobs(self, time: BatchTime) -> list[Job]:
        with self.lock:
            jobs: list[Job] = []
            for out in self.outputs:
                job = out.generate_job(time)
                if job is not None:
                    jobs.append(job)
            return jobs

    def downstream_of(self, node: DStreamNode) -> list[DStreamNode]:
        """The nodes that read ``node``'s RDDs, directly or through others (registration order,
        which is topological: a node is registered after the nodes it reads)."""
        reached = {id(node)}
        out: list[DStreamNode] = []
        for n in self.nodes:
            if any(id(d) in reached for d in n.dependencies):
                reached.add(id(n))
                out.append(n)
        return out

    def rebuild_jobs(self, adopted: DStreamNode, times: list[BatchTime]) -> dict[int, list[Job]]:
        """The jobs of the batches at ``times`` (generated, not started), built again after
        ``adopted`` adopted a checkpoint (its own RDDs after the checkpoint are already rebuilt).

        Every RDD downstream of ``adopted`` at those times is built again, oldest batch first, so
        that the queued jobs compute the cut lineage one batch after the other: each job caches its
        batch's state for the next. Left as they were, the queued jobs would compute the old chain
        while the batches generated next build on the new one, which nothing has computed: each of
        them would recompute the whole backlog from the checkpoint. Input offsets are not touched
        (inputs are upstream). Functions given to ``transform`` run again for those batches. The
        checkpoints due at those times are marked again with the rebuilt RDDs (the ones computed).
        """
        with self.lock:
            downstream = self.downstream_of(adopted)
            for node in downstream:
                for t in times:
                    node.forget(t)
            jobs: dict[int, list[Job]] = {}
            checkpointer = self.checkpointer
            for t in sorted(times):
                jobs[t.ms] = self.generate_jobs(t)
                if checkpointer is not None and adopted.checkpoint_due(t):
                    rdd = adopted.generated.get(t.ms)
                    if rdd is not None:
                        checkpointer.mark(adopted, t, rdd)
            return jobs

    def drop_input(self, dropped: BatchTime, later: list[BatchTime]) -> dict[int, list[Job]]:
        """Build batch ``dropped`` again as if no input had arrived in its interval, and the jobs of the
        batches at ``later`` (generated, not started) on top of it.

        Every input's RDD at ``dropped`` becomes an empty RDD (what the input fixed for the batch, its
        offsets, stays recorded: that input is consumed and dropped); every other node forgets its RDDs at
        ``dropped`` and ``later``, so the state and windows of later batches never see the dropped records. The
        stateful nodes at ``dropped`` and ``later`` are built again at once, so the checkpoints due at those
        times are marked with the rebuilt RDDs. Returns the rebuilt jobs of ``later`` by batch time (ms).
        """
        with self.lock:
            self.dropped_times.add(dropped.ms)
            inputs = {id(n) for n in self.inputs}
            for source in self.inputs:
                source.forget(dropped)
                source.generated[dropped.ms] = self.sc.emptyRDD()
            for node in self.nodes:
                if id(node) not in inputs:
                    for t in (dropped, *later):
                        node.forget(t)
            for node in self.stateful_nodes():
                node.get_or_compute(dropped)
            jobs: dict[int, list[Job]] = {}
            for t in sorted(later):
                jobs[t.ms] = self.generate_jobs(t)
            return jobs

    def input_records(self, time: BatchTime) -> dict[int, int]:
        """Records per input stream id in batch ``time``, for the sources that know it."""
        out: dict[int, int] = {}
        for node in self.inputs:
            n = node.records_at(time)
            if n is not None:
                out[node.id] = n
        return out

    def batch_records(self, time: BatchTime) -> BatchRecords:
        """What batch ``time`` records, by node key: every node's ``batch_record`` and ``node_state`` (its checkpoint
        data's, :mod:`dstreams.checkpoint_data`). Call on the event loop."""
        offsets: dict[str, Any] = {}
        sources: dict[str, Any] = {}
        for node in self.nodes:
            data = node.checkpoint_data
            o = data.batch_record(time)
            if o is not None:
                offsets[node.key] = o
            s = data.node_state()
            if s is not None:
                sources[node.key] = s
        return BatchRecords(offsets, sources)

    def stateful_nodes(self) -> list[DStreamNode]:
        """The nodes whose state chain is checkpointed (``must_checkpoint``), in graph order."""
        return [n for n in self.nodes if n.must_checkpoint]

    def clear_metadata(self, time: BatchTime) -> None:
        with self.lock:
            for out in self.outputs:
                out.clear_metadata(time)
            for node in self.inputs:
                node.forget_before(time)

    def max_input_remember(self) -> Duration | None:
        return max((n.remember_duration for n in self.inputs if n.remember_duration), default=None)
