"""What a ``DStream`` needs of the context that owns its graph: the :class:`GraphOwner` interface.

A fluent ``DStream`` (``api/stream.py``, ``api/event_time.py``) is built while its context is INITIALIZED and
runs its outputs once the context is ACTIVE. It uses its context through this interface only, never through the
context's private attributes (``tests/unit/test_layers.py`` checks that); ``StreamingContext`` implements it. The
members are engine-facing, not part of PySpark's surface: snake_case, next to PySpark's camelCase names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from pyspark import SparkContext

T = TypeVar("T")


@dataclass(frozen=True)
class OutputEnvironment:
    """What a sink needs from its context when a batch is written: the checkpoint location (its store
    options are the default for ``s3://`` outputs) and the fence to check before committing."""

    checkpoint_dir: str | None
    store_options: dict[str, Any]
    check_owner: Callable[[], None]
    epoch: int | None = None  # this driver's epoch in the metadata log (None without a checkpoint location)


class GraphOwner(Protocol):
    """The context a ``DStream`` belongs to, as the stream uses it (``StreamingContext`` implements it)."""

    @property
    def sparkContext(self) -> SparkContext:
        """The SparkContext the streams run on (PySpark's name)."""
        ...

    @property
    def concurrent_batches(self) -> int:
        """How many batches may run at once (``concurrentBatches``, else ``spark.streaming.concurrentJobs``)."""
        ...

    def check_not_started(self, action: str) -> None:
        """Raise ``StreamingContextStateError`` naming ``action`` (e.g. ``"add a transformation"``) unless the
        context is INITIALIZED: the graph is fixed once it started, and a stopped context cannot be changed."""
        ...

    def output_environment(self) -> OutputEnvironment:
        """For a sink writing a batch: the checkpoint location and the fence (a no-op before the start and
        without a checkpoint location)."""
        ...

    def on_graph_thread(self, func: Callable[[], T]) -> T:
        """Run ``func`` (which reads or builds node RDDs) where the graph's state may be read: on the event
        loop once the context runs, else under the graph's lock; return its result."""
        ...
