"""The stream graph: input nodes, output nodes, and what happens per batch.

Contract: nodes are added before ``start(zero_time)``; after it the graph is frozen (adding
raises). ``generate_jobs(time)`` builds, on the caller's thread and under the graph lock, one
:class:`Job` per output node that is valid at ``time``; ``clear_metadata(time)`` forgets old RDDs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .checkpoint import Checkpointer
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
    result: object = field(default=None, repr=False)

    def run(self) -> None:
        self.func()


class WriteAheadLog(Protocol):
    def write(self, key: str, records: list[Any]) -> str: ...

    def read(self, key: str) -> list[Any]: ...


class GraphFrozenError(RuntimeError):
    """Raised when streams or outputs are added after the context has started."""


class DStreamGraph:
    """Holds the nodes of one StreamingContext."""

    def __init__(self, sc: SparkContext, batch_duration: Duration | None) -> None:
        self.sc = sc
        self.batch_duration = batch_duration
        self.inputs: list[InputNode] = []
        self.outputs: list[OutputNode] = []
        self.zero_time: BatchTime | None = None
        self.remember_duration: Duration | None = None
        self.checkpointer: Checkpointer | None = None  # type: ignore[assignment]
        self.lock = threading.RLock()
        self.started = False
        self.nodes: list[DStreamNode] = []
        #: Write-ahead log for sources that cannot replay (``write(key, records) -> key``,
        #: ``read(key) -> records``); set when the checkpoint location is durable.
        self.wal: WriteAheadLog | None = None

    def register(self, node: DStreamNode) -> str:
        """Add ``node`` to the graph's registry; returns its stable key (position and type)."""
        with self.lock:
            self._check_open("a stream")
            self.nodes.append(node)
            return f"{len(self.nodes) - 1:03d}-{type(node).__name__}"

    def fingerprint(self) -> list[str]:
        """A description of the topology that a restarted driver must reproduce exactly."""
        out = []
        for n in self.nodes:
            deps = ",".join(d.key for d in n.dependencies)
            out.append(f"{n.key}[{n.describe()}]<-({deps})")
        return out

    # ------------------------------------------------------------------ building
    def _check_open(self, what: str) -> None:
        if self.started:
            raise GraphFrozenError(
                f"cannot add {what} after the StreamingContext has started: define every input, "
                "transformation and output operation before ssc.start()"
            )

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
    def validate(self) -> None:
        if self.batch_duration is None:
            raise ValueError("the batch duration is not set: pass it to StreamingContext(sc, batchDuration)")
        if not self.outputs:
            raise ValueError(
                "no output operations registered, so nothing to execute: add one such as pprint(), "
                "foreachRDD() or saveAsTextFiles() before ssc.start()"
            )
        for out in self.outputs:
            out.validate_at_start()

    def start(self, zero_time: BatchTime) -> None:
        with self.lock:
            self.validate()
            self.zero_time = zero_time
            for out in self.outputs:
                out.initialize(zero_time)
            for out in self.outputs:
                out.remember(self.remember_duration)
            self.started = True
            for node in self.inputs:
                node.start()

    def stop(self) -> None:
        """Stop the inputs, then unpersist what the engine cached for every node (see ``release``)."""
        with self.lock:
            for node in self.inputs:
                node.stop()
            for node in self.nodes:
                node.release()

    def generate_jobs(self, time: BatchTime) -> list[Job]:
        with self.lock:
            jobs: list[Job] = []
            for out in self.outputs:
                job = out.generate_job(time)
                if job is not None:
                    jobs.append(job)
            return jobs

    def input_records(self, time: BatchTime) -> dict[int, int]:
        """Records per input stream id in batch ``time``, for the sources that know it."""
        out: dict[int, int] = {}
        for node in self.inputs:
            n = node.records_at(time)
            if n is not None:
                out[node.id] = n
        return out

    def clear_metadata(self, time: BatchTime) -> None:
        with self.lock:
            for out in self.outputs:
                out.clear_metadata(time)
            for node in self.inputs:
                node.forget_before(time)

    def max_input_remember(self) -> Duration | None:
        return max((n.remember_duration for n in self.inputs if n.remember_duration), default=None)
