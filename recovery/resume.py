"""How a restarted driver resumes from the metadata log and the data checkpoints.

Contract of :func:`plan_resume`: given the previous head of the log, it picks for every stateful
stream the newest checkpoint that reads back intact (a corrupt or truncated one is skipped with a
warning, falling back to the one before; a manifest of another checkpoint format raises
:class:`~.checkpoint_format.CheckpointFormatError`), and returns the zero time of the original run, the first
batch to generate (the oldest restored checkpoint + one batch, so every later state is recomputed
from its checkpoint and replayed input). A stream whose newest checkpoint is later than that (the driver
died between two streams' checkpoints of one time; streams checkpointed at different intervals) also gets
its newest checkpoint before the first batch read back, so that its RDDs of the batches in between are
rebuilt from it and recorded input, never from its first batch (whose input is no longer recorded: a
source asked for it raises :class:`~dstreams.contracts.InputNotRecordedError` rather than take new
input). It returns a ``prepare`` function too, which installs the restored RDDs,
every node's recorded state and per-batch records (through each node's checkpoint data,
``dstreams.checkpoint_data``: ``restore_node_state``, ``replay_records``: a source's state and offsets, an
event-time stream's watermarks) once the graph is initialised. Batches between that first batch
and the clock's present (pending when the old driver died, or missed while it was down) are then
generated at once; outputs of batches that had already completed are written again, which the
exactly-once sinks turn into no-ops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import RDD, SparkContext

from dstreams import faults
from dstreams.contracts import Checkpointer
from dstreams.time import BatchTime

from .checkpoint_files import checkpoint_prefix, list_checkpoints, load_manifest, state_chain, verify_state_chain
from .checkpoint_format import CheckpointFormatError
from .checkpointer import reader_rdd
from .storespec import StoreSpec

if TYPE_CHECKING:
    from dstreams.graph import DStreamGraph
    from dstreams.node import DStreamNode

log = logging.getLogger(__name__)


@dataclass
class ResumePlan:
    zero: BatchTime
    first_batch: BatchTime
    prepare: Callable[[], None]
    restored: dict[str, int | None]
    #: Batches at or after ``first_batch`` whose input an earlier driver dropped (dropped again on replay).
    dropped: set[int] = field(default_factory=set)


#: A checkpoint read back: its time, its reader and its manifest.
Restored = tuple[int, RDD, dict[str, Any]]


def _restore_node(sc: SparkContext, spec: StoreSpec, node: DStreamNode, candidates: list[int]) -> Restored | None:
    faults.carry(sc)  # a test's task-side faults, to the tasks of the reads (a pool thread of its own)
    store = spec.open()
    for t in candidates:
        try:
            manifest = load_manifest(store, node.key, t)
            data = node.checkpoint_data
            reader = reader_rdd(sc, spec, checkpoint_prefix(node.key, t), manifest, data.partitioner)
            if not data.reads_to_verify(manifest):
                # The executor state store reads a checkpoint only where a store cannot get back to it on its own:
                # the parts of the chain must exist (their checksums are checked when read).
                verify_state_chain(store, manifest)
                return t, reader, manifest
            if node.storage_level is not None:
                reader.persist(node.storage_level)
            reader.count()  # reads and verifies every part now, so a bad one is skipped here
            return t, reader, manifest
        except CheckpointFormatError:
            raise  # not a damaged checkpoint to fall back from: the location is of another format
        except Exception as e:
            log.warning("checkpoint of %s at %d is unreadable (%s): falling back to the previous one",
                        node.name, t, str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
    return None


def _read_back(sc: SparkContext, spec: StoreSpec, nodes: list[DStreamNode],
               candidates: Callable[[DStreamNode], list[int]]) -> list[Restored | None]:
    """Each node's newest intact checkpoint among ``candidates(node)``, read back and verified by a Spark job of
    its own; the jobs run at once (a restart's time to its first batch: the driver-side cost of one job overlaps
    the others' tasks)."""
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(4, len(nodes)), thread_name_prefix="dstreams-restore") as pool:
        return list(pool.map(lambda n: _restore_node(sc, spec, n, candidates(n)), nodes))


def plan_resume(sc: SparkContext, spec: StoreSpec, graph: DStreamGraph, previous: dict[str, Any],
                checkpointer: Checkpointer) -> ResumePlan:
    assert graph.batch_duration is not None
    batch = graph.batch_duration.ms
    zero = BatchTime(int(previous["zero_ms"]))
    completed = previous.get("completed_through")
    store = spec.open()
    restored: dict[str, int | None] = {}
    rdds: dict[str, list[Restored]] = {}  # per node: the checkpoints read back, oldest first
    found: dict[str, list[int]] = {}
    nodes = graph.stateful_nodes()
    candidates: dict[str, list[int]] = {}
    for node in nodes:
        candidates[node.key] = found[node.key] = list_checkpoints(store, node.key)
        if completed is not None:
            candidates[node.key] = [t for t in candidates[node.key] if t <= completed]
    results = _read_back(sc, spec, nodes, lambda n: candidates[n.key])
    for node, got in zip(nodes, results, strict=True):
        if got is None:
            restored[node.key] = None
            log.warning("no usable checkpoint of %s: its state is recomputed from the first batch", node.name)
        else:
            restored[node.key] = got[0]
            rdds[node.key] = [got]
    if restored and all(t is not None for t in restored.values()):
        # The streams resume from the oldest of their newest checkpoints. A stream whose newest checkpoint is
        # later (the driver died between two streams' checkpoints of one time, or the streams checkpoint at
        # different intervals) is rebuilt for the batches before it from its newest checkpoint before the
        # first batch, read back too: without it, the stream's RDDs of those batches would be computed from
        # its first batch on, from input no longer recorded.
        before = min(t for t in restored.values() if t is not None)
        ahead = [n for n in nodes if (restored[n.key] or 0) > before]
        older = _read_back(sc, spec, ahead, lambda n: [t for t in candidates[n.key] if t <= before])
        for node, got in zip(ahead, older, strict=True):
            if got is None:
                log.warning("%s has no usable checkpoint at or before %d, where the other streams resume: its "
                            "state is recomputed from the first batch", node.name, before)
                restored[node.key] = None
                rdds.pop(node.key, None)
            else:
                rdds[node.key].insert(0, got)
    elif restored:
        # Some stream has no checkpoint: every stream is recomputed from the first batch. A stream that has a
        # checkpoint at the zero time (the executor state store's initial state, which the stored graph does not
        # hold) starts from it; the others from their definition, as before.
        ahead = [n for n in nodes if restored[n.key] is not None]
        at_zero = _read_back(sc, spec, ahead, lambda n: [t for t in candidates[n.key] if t <= zero.ms])
        for node, got in zip(ahead, at_zero, strict=True):
            if got is not None:
                rdds[node.key].insert(0, got)
    if restored:
        if any(t is None for t in restored.values()):
            first = zero.ms + batch
        else:
            first = min(t for t in restored.values() if t is not None) + batch
    else:
        first = (completed if completed is not None else zero.ms) + batch
    # The chain each restored checkpoint builds on (a store-backed state's deltas), handed to its node.
    chains: dict[str, list[int]] = {}
    for key, t in restored.items():
        if t is not None:
            try:
                chains[key] = state_chain(load_manifest(store, key, t))
            except Exception as e:  # noqa: BLE001 - it was just read back: only a vanished object fails here
                log.warning("the manifest of %s at %d could not be read again (%s): its next checkpoint is a "
                            "snapshot", key, t, e)
    offsets: dict[str, Any] = previous.get("offsets", {})
    sources: dict[str, Any] = previous.get("sources", {})
    def prepare() -> None:
        # After the graph started: whether a source replays can depend on its services (a socket's
        # write-ahead log).
        for source in graph.inputs:
            if not source.replayable:
                log.warning("%s cannot be replayed: batches re-run after this restart see new input, not the "
                            "original (use a file, generator or other replayable source for exactly-once)",
                            source.name)
        by_key = {n.key: n for n in graph.stateful_nodes()}
        for key, readers in rdds.items():
            data = by_key[key].checkpoint_data
            for t, rdd, manifest in readers:
                data.manifest(t, manifest)
                data.restore(BatchTime(t), rdd)
        for key, restored_at in restored.items():
            checkpointer.resumed(by_key[key], restored_at, found[key])
            if restored_at is not None and key in rdds:
                by_key[key].checkpoint_data.restored(restored_at, chains.get(key, []))
        for node in graph.nodes:  # the metadata log's records: each node's state, then its per-batch records
            data = node.checkpoint_data
            if node.key in sources:
                data.restore_node_state(sources[node.key])
            recorded = {int(t): o[node.key] for t, o in offsets.items() if node.key in o}
            if recorded:
                data.replay_records(recorded)

    log.info("resuming from batch %d (zero %d, completed through %s, checkpoints %s)",
             first, zero.ms, completed, restored)
    dropped = {int(t) for t in previous.get("dropped", {}) if int(t) >= first}
    return ResumePlan(zero, BatchTime(first), prepare, restored, dropped)
