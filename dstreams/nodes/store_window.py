"""``reduceByKeyAndWindow`` with an inverse function on the executor state store.

Chosen with ``spark.dstreams.state.store=executor`` when the window is updated incrementally (an inverse
function and a window of at least 5 slides: :meth:`ReducedWindowNode.incremental`'s rule; a shorter window
is recomputed from the cached batches each slide and keeps no state). The store holds, per key, the reduce of
the values of the window ending at the handle's version. Each slide reads and writes only the keys of the
batches that enter and leave the window: a key of a leaving batch gets ``invFunc(value, left)``, then a key of
an entering batch ``func(value, entered)`` (or ``entered`` when new), the batches each reduced on their own
first, oldest first, as :class:`~dstreams.nodes.reduced_window.ReducedWindowNode` does; ``filterFunc`` is
applied to the keys written (a key it refuses is deleted), so the outputs equal the RDD window's for a
deterministic ``filterFunc``. The window starts from an empty store: before the window is full no batch has
left it, so that equals the RDD window's first reduce.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.core.rdd import Partitioner

from ..node import DStreamNode
from ..statestore import PartitionStore, key_bytes, value_bytes
from ..time import BatchTime, Duration
from .reduced_window import reduce_segments
from .store_state import SegmentsUpdater, StoreStateNode
from .windowed import check_window

if TYPE_CHECKING:
    from ..graph import DStreamGraph


class StoreWindowNode(StoreStateNode):
    """``reduceByKeyAndWindow(func, invFunc, window, slide, ..., filterFunc)`` on the store (module docstring).
    The parent is the per-batch combined stream (as for :class:`ReducedWindowNode`)."""

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, func: Callable[[Any, Any], Any],
                 inv_func: Callable[[Any, Any], Any], window: Duration, slide: Duration, partitioner: Partitioner,
                 filter_func: Callable[[Any], bool] | None, local_dir: str | None, snapshot_every: int) -> None:
        check_window(parent.slide_duration, window, slide)
        super().__init__(graph, parent, partitioner, None, "reduceByKeyAndWindow", local_dir, snapshot_every)
        self.func = func
        self.inv_func = inv_func
        self.window = window
        self._slide = slide
        self.filter_func = filter_func
        parent.persist(StorageLevel.MEMORY_ONLY)

    def describe_params(self) -> list[str]:
        return [f"window={self.window.ms}", "inverse", *super().describe_params()]

    @property
    def slide_duration(self) -> Duration:
        return self._slide

    @property
    def parent_remember_duration(self) -> Duration:
        assert self.remember_duration is not None
        return self.remember_duration + self.window

    def batch_plan(self, time: BatchTime) -> tuple[list[RDD], SegmentsUpdater] | None:
        pslide, begin = self.parent.slide_duration, time - self.window
        old = self.parent.slice(begin - self._slide + pslide, begin)
        new = self.parent.slice(time - self._slide + pslide, time)
        if not old and not new:
            return None
        func, inv, keep, leaving = self.func, self.inv_func, self.filter_func, len(old)

        def apply(store: PartitionStore, segments: list[list[Any]]) -> tuple[dict[bytes, bytes | None],
                                                                             dict[bytes, bytes]]:
            left = reduce_segments(func, segments[:leaving])
            entered = reduce_segments(func, segments[leaving:])
            keys = {key_bytes(k): k for k in (*left, *entered)}
            old_values = store.get_many(keys)
            writes: dict[bytes, bytes | None] = {}
            for kb, k in keys.items():
                ob = old_values.get(kb)
                if ob is not None:
                    v = pickle.loads(ob)
                    if k in left:
                        v = inv(v, left[k])
                    if k in entered:
                        v = func(v, entered[k])
                elif k in entered:
                    v = entered[k]
                else:
                    continue  # left a window it was not in (filtered out earlier)
                if keep is not None and not keep((k, v)):
                    if ob is not None:
                        writes[kb] = None
                else:
                    writes[kb] = value_bytes(v)
            return writes, old_values

        return [*old, *new], apply


__all__ = ["StoreWindowNode"]
