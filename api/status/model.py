"""What the status server shows, as JSON-able dicts: batches, streams, sources, state, errors.

Contract:

* :class:`BatchHistory` is a :class:`~dstreams.listener.StreamingListener` registered on the context's
  listener bus before the context starts. It keeps the completed batches of the last ``window_ms`` of
  batch time (10 minutes; at most ``max_batches``), the running totals (batches submitted, completed,
  failed; records per source) and the last errors of output operations. It reads the snapshots the
  events carry, so its numbers are those of ``ssc.batchInfos()``; it sees a batch once the bus delivered
  its event (``ssc.awaitBatch`` waits for that). Observers added with :meth:`BatchHistory.add_observer`
  (the metrics) are called on the bus thread with each completed batch's :class:`BatchInfo`.
* :class:`StatusModel` answers the server's requests from the history and from the running context's
  public parts (:class:`StatusSources`): the graph's nodes, the scheduler's first error, the
  checkpointer's committed checkpoints and errors, the metadata log's epoch and fence. It never runs a
  Spark job and never blocks on the checkpoint store: the size of a stateful stream's state is read from
  the manifest of its newest checkpoint (records and bytes of each part, written anyway) by one daemon
  thread (:class:`ManifestSizes`), and a request returns what was read so far.
* Times are epoch (or manual-clock) milliseconds, as in :class:`BatchInfo`; ``None`` is unknown.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time as _time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dstreams.clock import Clock
from dstreams.listener import BatchInfo, StreamingListener
from dstreams.listener_bus import ListenerBus
from dstreams.node import DStreamNode
from dstreams.nodes.auto_state import AutoPolicy
from dstreams.nodes.event_time import EventTimeNode, timed_ancestors
from dstreams.nodes.input import InputNode
from dstreams.nodes.output import OutputNode
from dstreams.nodes.state import StateNode
from dstreams.nodes.store_state import ExecutorStore
from dstreams.recovery.checkpointer import CheckpointError, load_manifest
from dstreams.time import Duration

if TYPE_CHECKING:
    from pyspark import SparkContext

    from dstreams.graph import DStreamGraph
    from dstreams.recovery.runtime import DriverRuntime

log = logging.getLogger(__name__)

#: How much batch time the timeline keeps (Spark's Streaming tab keeps a number of batches instead).
TIMELINE_MS = 10 * 60 * 1000
#: The batches kept at most (10 minutes of 100 ms batches, with room).
MAX_BATCHES = 10_000
#: The errors kept (newest first) and the characters kept of each message.
MAX_ERRORS = 20
MAX_ERROR_CHARS = 4000
#: The batch time over which a source's input rate is averaged.
RATE_WINDOW_MS = 60_000


@dataclass(frozen=True)
class StatusSources:
    """The running context's parts the status server reads (given by ``StreamingContext.start``)."""

    sc: SparkContext
    graph: DStreamGraph
    runtime: DriverRuntime
    clock: Clock
    bus: ListenerBus
    #: The location given to ``ssc.checkpoint()``; None: a temporary folder (removed at stop).
    checkpoint_dir: str | None
    #: The context's lifecycle state (``ssc.getState``).
    state: Callable[[], str]


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "\n... (truncated)"


def error_entry(time_ms: int, where: str, message: str, batch_time_ms: int | None = None) -> dict[str, Any]:
    """One entry of the errors list (see docs/guide/monitoring.md, ``/api/errors``)."""
    return {"time_ms": time_ms, "batch_time_ms": batch_time_ms, "where": where, "message": _short(message)}


class BatchHistory(StreamingListener):
    """The completed batches of the last ``window_ms`` of batch time and the running totals (see the module
    docstring). Thread-safe: the bus thread writes, the server's threads read."""

    def __init__(self, window_ms: int = TIMELINE_MS, max_batches: int = MAX_BATCHES) -> None:
        self.window_ms = window_ms
        self._lock = threading.Lock()
        self._batches: deque[BatchInfo] = deque(maxlen=max_batches)
        self._observers: list[Callable[[BatchInfo], None]] = []
        self._errors: deque[dict[str, Any]] = deque(maxlen=MAX_ERRORS)
        self.submitted = 0
        self.completed = 0
        self.failed = 0
        self.dropped = 0
        self.records_total = 0
        #: Input stream id -> records in every completed batch so far.
        self.records_per_input: dict[int, int] = {}
        #: Input stream id -> offsets the source skipped as gone from its server (``recordsLost``) so far.
        self.lost_per_input: dict[int, int] = {}
        #: Per event-time stream id: the newest completed batch's watermark (ms, None before there is one)
        #: and the records dropped as late so far.
        self.watermarks: dict[int, int | None] = {}
        self.late_records: dict[int, int] = {}

    def add_observer(self, observer: Callable[[BatchInfo], None]) -> None:
        """Call ``observer(info)`` on the bus thread for every completed batch (after the history has it)."""
        self._observers.append(observer)

    # ------------------------------------------------------------------ listener callbacks (bus thread)
    def onBatchSubmitted(self, batchSubmitted: Any) -> None:
        with self._lock:
            self.submitted += 1

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        info: BatchInfo = batchCompleted.batchInfo()
        with self._lock:
            self._batches.append(info)
            horizon = info.batch_time_ms - self.window_ms
            while self._batches and self._batches[0].batch_time_ms <= horizon:
                self._batches.popleft()
            self.completed += 1
            self.records_total += info.num_records
            for sid, n in info.records_per_input.items():
                self.records_per_input[sid] = self.records_per_input.get(sid, 0) + n
            for sid, entries in info.input_metadata.items():
                lost = entries.get("recordsLost")
                if isinstance(lost, int) and lost > 0:
                    self.lost_per_input[sid] = self.lost_per_input.get(sid, 0) + lost
            for sid, m in info.event_time.items():
                self.watermarks[sid] = m.get("watermarkMs")
                self.late_records[sid] = self.late_records.get(sid, 0) + int(m.get("lateRecords") or 0)
            if info.failed:
                self.failed += 1
            if info.dropped:
                self.dropped += 1
            for op in info.output_operations.values():
                if op.failure_reason:
                    when = op.end_time_ms or info.processing_end_time_ms or _now_ms()
                    self._errors.appendleft(error_entry(when, f"output operation {op.output_id} ({op.output_name})",
                                                        op.failure_reason, info.batch_time_ms))
        for observer in self._observers:
            observer(info)

    # ------------------------------------------------------------------ reading (any thread)
    def batches(self, after_ms: int | None = None) -> list[BatchInfo]:
        """The kept batches, oldest first; with ``after_ms`` only those whose batch time is later."""
        with self._lock:
            kept = list(self._batches)
        if after_ms is None:
            return kept
        return [b for b in kept if b.batch_time_ms > after_ms]

    def batch(self, time_ms: int) -> BatchInfo | None:
        with self._lock:
            return next((b for b in reversed(self._batches) if b.batch_time_ms == time_ms), None)

    def errors(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._errors)

    def event_time(self) -> tuple[dict[int, int | None], dict[int, int]]:
        """The newest watermark and the late records so far of each event-time stream (by stream id)."""
        with self._lock:
            return dict(self.watermarks), dict(self.late_records)

    def totals(self) -> dict[str, int]:
        with self._lock:
            return {"batches_submitted": self.submitted, "batches_completed": self.completed,
                    "batches_failed": self.failed, "batches_dropped": self.dropped,
                    "batches_pending": max(0, self.submitted - self.completed),
                    "input_records": self.records_total}


def _now_ms() -> int:
    return int(_time.time() * 1000)


def batch_json(info: BatchInfo, source_keys: dict[int, str]) -> dict[str, Any]:
    """A batch as ``/api/batches`` lists it (the fields of :class:`BatchInfo`, in milliseconds)."""
    return {
        "batch_time_ms": info.batch_time_ms,
        "submission_time_ms": info.submission_time_ms,
        "processing_start_time_ms": info.processing_start_time_ms,
        "processing_end_time_ms": info.processing_end_time_ms,
        "scheduling_delay_ms": info.scheduling_delay_ms,
        "processing_delay_ms": info.processing_delay_ms,
        "total_delay_ms": info.total_delay_ms,
        "num_records": info.num_records,
        "input_records": {source_keys.get(sid, str(sid)): n for sid, n in info.records_per_input.items()},
        "failed": info.failed,
        "dropped": info.dropped,
        "attempts": info.attempts,
        "failure": info.failure,
        "job_group": info.job_group,
        "generation_ms": None if info.generation_ms is None else round(info.generation_ms, 3),
        "event_time": {str(sid): {"stream": m.get("stream"), "watermark_ms": m.get("watermarkMs"),
                                  "late_records": m.get("lateRecords"), "records": m.get("records")}
                       for sid, m in info.event_time.items()},
    }


def batch_detail_json(info: BatchInfo, source_keys: dict[int, str], spark_jobs: list[dict[str, Any]]
                      ) -> dict[str, Any]:
    """One batch as ``/api/batches/<time>`` returns it: the list's fields, its output operations, what
    each source reported (``input_metadata``) and its Spark jobs (found by its job group)."""
    out = batch_json(info, source_keys)
    out["output_operations"] = [
        {"id": op.output_id, "name": op.output_name, "description": op.output_description,
         "start_time_ms": op.start_time_ms, "end_time_ms": op.end_time_ms, "duration_ms": op.duration_ms,
         "failure_reason": op.failure_reason, "records_written": op.records_written}
        for _, op in sorted(info.output_operations.items())
    ]
    out["input_metadata"] = {source_keys.get(sid, str(sid)): {k: _jsonable(v) for k, v in m.items()}
                             for sid, m in info.input_metadata.items()}
    out["cleanup_ms"] = None if info.cleanup_ms is None else round(info.cleanup_ms, 3)
    out["spark_jobs"] = spark_jobs
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


#: The StreamingContext/DStream method that makes nodes whose own name is their class's.
_METHODS = {"GeneratorInputNode": "generatorStream", "QueueInputNode": "queueStream", "SocketInputNode":
            "socketTextStream", "FileInputNode": "textFileStream", "RedisStreamsInputNode": "redisStream",
            "WindowedNode": "window", "UnionNode": "union"}


def node_label(node: DStreamNode) -> str:
    """The name the page shows: the operator's name where the node knows it (``map#2``, ``runningReduce#3``,
    an output operation's function), else the node's own (``GeneratorInputNode#1``)."""
    if isinstance(node, OutputNode):
        return f"{node.label}#{node.id}"
    method = _METHODS.get(type(node).__name__)
    if method == "textFileStream" and getattr(node, "record_length", None) is not None:
        method = "binaryRecordsStream"
    return f"{method}#{node.id}" if method else node.name


def node_kind(node: DStreamNode) -> str:
    """``source``, ``window``, ``state``, ``output`` or ``transform`` (every other stream)."""
    if isinstance(node, InputNode):
        return "source"
    if isinstance(node, OutputNode):
        return "output"
    if isinstance(getattr(node, "window", None), Duration):
        return "window"
    if node.must_checkpoint:
        return "state"
    return "transform"


def kept_in(node: DStreamNode) -> dict[str, Any]:
    """Where a stateful stream keeps its state: ``kept_in`` is ``rdd`` or ``executor`` (the executor state store),
    ``picked_by_size`` whether ``spark.dstreams.state.store=auto`` chose it (then ``moved_at_ms``: the batch it
    moved into the store at, or None)."""
    backend = node.backend if isinstance(node, StateNode) else None
    if isinstance(backend, AutoPolicy):
        return {"kept_in": "executor" if backend.switched_at is not None else "rdd", "picked_by_size": True,
                "moved_at_ms": backend.switched_at}
    return {"kept_in": "executor" if isinstance(backend, ExecutorStore) else "rdd", "picked_by_size": False,
            "moved_at_ms": None}


class ManifestSizes:
    """The size of each stateful stream's state as of its newest committed checkpoint, read from the
    checkpoint's manifest (the records and bytes of every part) by one daemon thread.

    :meth:`get` returns what was read for ``(node key, checkpoint time)`` or None, and asks the thread to
    read it when it has not: a request never waits for the store (it may be slow, or down).
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._sizes: dict[str, tuple[int, dict[str, int] | None]] = {}
        self._wanted: dict[str, int] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self, node_key: str, time_ms: int) -> dict[str, int] | None:
        """``{"keys": records, "bytes": serialized bytes}`` of that checkpoint, or None (not read yet, or
        unreadable)."""
        with self._lock:
            known = self._sizes.get(node_key)
            if known is not None and known[0] == time_ms:
                return known[1]
            if self._stopped.is_set():
                return None
            self._wanted[node_key] = time_ms
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dstreams-status-state-sizes", daemon=True)
                self._thread.start()
        self._wake.set()
        return known[1] if known is not None else None

    def stop(self) -> None:
        """End the thread (a read in progress finishes in the background; it is a daemon)."""
        self._stopped.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stopped.is_set():
                with self._lock:
                    if not self._wanted:
                        break
                    key, t = self._wanted.popitem()
                self._read(key, t)

    def _read(self, key: str, t: int) -> None:
        sizes: dict[str, int] | None
        try:
            manifest = load_manifest(self._store, key, t)
            parts = manifest.get("parts", [])
            header = 1 if "state" in manifest else 0  # a store-format part starts with its header record
            sizes = {"keys": sum(int(p["keys"]) if "keys" in p else max(0, int(p.get("records", 0)) - header)
                                 for p in parts),
                     "bytes": sum(int(p.get("bytes", 0)) for p in parts)}
        except FileNotFoundError:  # deleted meanwhile: a newer one is committed
            return
        except Exception as e:  # noqa: BLE001 - shown as unknown; the stream is not concerned
            log.debug("status: could not read the manifest of %s at %d: %s", key, t, e)
            sizes = None
        with self._lock:
            self._sizes[key] = (t, sizes)


def _watermark(node: DStreamNode, newest: dict[int, int | None]) -> int | None:
    """``node``'s watermark as of the newest completed batch: the minimum over the event-time streams it
    reads (None while it reads none, or one of them has none yet)."""
    found = [newest.get(e.id) for e in timed_ancestors(node)]
    if not found or any(w is None for w in found):
        return None
    return min(w for w in found if w is not None)


def _error_text(error: BaseException | CheckpointError) -> str:
    """``"<type>: <message>"`` of an engine error (a failed checkpoint write is already kept as that text)."""
    return str(error) if isinstance(error, CheckpointError) else f"{type(error).__name__}: {error}"


def _listed(error: BaseException, entries: list[dict[str, Any]]) -> bool:
    """Whether ``error`` is one of the failed output operations in ``entries`` (as the first error of a run
    usually is): the batch it names, or its last traceback line."""
    batch_time = getattr(getattr(error, "batch_time", None), "ms", None)
    line = f"{type(error).__name__}: {error}".splitlines()[0]
    return any(e["batch_time_ms"] == batch_time or line in e["message"] for e in entries)


def _committed(checkpointer: Any) -> dict[str, list[int]]:
    """A copy of the checkpointer's committed checkpoint times per node key (another thread changes them)."""
    for _ in range(5):
        try:
            return {k: list(v) for k, v in list(checkpointer.committed.items())}
        except RuntimeError:  # changed while copied
            continue
    return {}


class StatusModel:
    """Builds the JSON documents of the status server (see the module docstring and docs/guide/monitoring.md)."""

    def __init__(self, sources: StatusSources, history: BatchHistory, status_url: str | None = None) -> None:
        self.sources = sources
        self.history = history
        self.status_url = status_url
        graph = sources.graph
        self.nodes: list[DStreamNode] = list(graph.nodes)
        self.source_keys: dict[int, str] = {n.id: n.key for n in graph.inputs}
        self.sizes = ManifestSizes(sources.runtime.checkpointer.store)
        # Fixed for the run: read once here (each read of the SparkContext's conf is a Py4J round trip).
        conf = sources.sc.getConf()
        assert sources.sc.appName is not None, "a running SparkContext has an application name (Spark requires one)"
        self.app_name: str = sources.sc.appName
        self.spark_app_id: str | None = conf.get("spark.app.id")
        self.master: str | None = conf.get("spark.master")
        self._spark_ui_url: str | None = None
        self._spark_ui_read = False
        self._jobs: dict[int, list[int]] = {}
        self._jobs_lock = threading.Lock()
        self._seen_errors: dict[int, dict[str, Any]] = {}
        self._errors_lock = threading.Lock()

    def close(self) -> None:
        self.sizes.stop()

    # ------------------------------------------------------------------ pieces
    @property
    def spark_ui_url(self) -> str | None:
        """The Spark UI's URL (``sc.uiWebUrl``), None when it is disabled (dstreams' tuned conf disables it)."""
        if not self._spark_ui_read:
            try:
                self._spark_ui_url = self.sources.sc.uiWebUrl
            except Exception:  # noqa: BLE001 - the SparkContext may be stopping
                self._spark_ui_url = None
            self._spark_ui_read = True
        return self._spark_ui_url

    def spark_jobs(self, info: BatchInfo) -> list[dict[str, Any]]:
        """The Spark jobs of a completed batch (its job group), with their Spark UI links when the UI runs."""
        with self._jobs_lock:
            ids = self._jobs.get(info.batch_time_ms)
        if ids is None:
            try:
                ids = sorted(self.sources.sc.statusTracker().getJobIdsForGroup(info.job_group))
            except Exception:  # noqa: BLE001 - the SparkContext may be stopping
                return []
            with self._jobs_lock:
                if len(self._jobs) >= 2 * MAX_BATCHES:
                    self._jobs.clear()
                self._jobs[info.batch_time_ms] = ids
        ui = self.spark_ui_url
        return [{"id": i, "url": f"{ui.rstrip('/')}/jobs/job/?id={i}" if ui else None} for i in ids]

    def batch_interval_ms(self) -> int | None:
        batch = self.sources.graph.batch_duration
        return batch.ms if batch is not None else None

    def driver(self) -> dict[str, Any]:
        """The driver's epoch and fence (from the metadata log) and the checkpoint location."""
        runtime = self.sources.runtime
        metadata = runtime.metadata
        head = metadata.head if metadata is not None else {}
        return {
            "epoch": head.get("epoch"),
            "fenced": bool(metadata.fenced) if metadata is not None else False,
            "checkpoint_location": runtime.checkpointer.spec.url,
            "checkpoint_location_temporary": self.sources.checkpoint_dir is None,
            "metadata_log": metadata is not None,
        }

    def overview(self) -> dict[str, Any]:
        sched = self.sources.runtime.scheduler
        return {
            "app_name": self.app_name,
            "spark_app_id": self.spark_app_id,
            "master": self.master,
            "state": self.sources.state(),
            "batch_interval_ms": self.batch_interval_ms(),
            "first_batch_time_ms": sched.start_time.ms if sched.start_time is not None else None,
            "last_generated_batch_ms": sched.last_generated.ms if sched.last_generated is not None else None,
            "last_completed_batch_ms": sched.last_completed.ms if sched.last_completed is not None else None,
            "clock_ms": self.sources.clock.time_ms(),
            "spark_ui_url": self.spark_ui_url,
            "status_url": self.status_url,
        }

    def checkpoint_info(self, committed: dict[str, list[int]], node: DStreamNode) -> dict[str, Any] | None:
        """State size and newest checkpoint of a stateful stream (None for a stream that keeps no state)."""
        if not node.must_checkpoint:
            return None
        times = committed.get(node.key, [])
        newest = times[-1] if times else None
        sizes = self.sizes.get(node.key, newest) if newest is not None else None
        now = self.sources.clock.time_ms()
        store = node.store_metrics() if isinstance(node, StateNode) else None
        kept = kept_in(node)
        if store is not None:  # the executor state store: live figures, not the checkpoint's (a delta)
            return {**kept,
                "keys": store["keys"],
                "bytes": store["disk_bytes"],
                "size_as_of_ms": store["as_of_ms"],
                "store": store,
                "checkpoint_bytes": sizes["bytes"] if sizes else None,
                "checkpoint_interval_ms": node.checkpoint_interval.ms if node.checkpoint_interval else None,
                "newest_checkpoint_ms": newest,
                "newest_checkpoint_age_ms": max(0, now - newest) if newest is not None else None,
                "checkpoints_kept": len(times),
            }
        return {**kept,
            "keys": sizes["keys"] if sizes else None,
            "bytes": sizes["bytes"] if sizes else None,
            "size_as_of_ms": newest if sizes else None,
            "store": None,
            "checkpoint_bytes": sizes["bytes"] if sizes else None,
            "checkpoint_interval_ms": node.checkpoint_interval.ms if node.checkpoint_interval else None,
            "newest_checkpoint_ms": newest,
            "newest_checkpoint_age_ms": max(0, now - newest) if newest is not None else None,
            "checkpoints_kept": len(times),
        }

    def source_rates(self, batches: Iterable[BatchInfo] | None = None) -> dict[int, float | None]:
        """Records per second of batch time of each source over the last minute of batches."""
        kept = list(batches) if batches is not None else self.history.batches()
        interval = self.batch_interval_ms()
        if not kept or not interval:
            return {sid: None for sid in self.source_keys}
        horizon = kept[-1].batch_time_ms - RATE_WINDOW_MS
        recent = list(itertools.takewhile(lambda b: b.batch_time_ms > horizon, reversed(kept)))
        seconds = len(recent) * interval / 1000.0
        return {sid: round(sum(b.records_per_input.get(sid, 0) for b in recent) / seconds, 3)
                for sid in self.source_keys}

    def streams(self, rates: dict[int, float | None] | None = None) -> dict[str, Any]:
        """The graph: every stream with its kind, what it reads, its state and its watermark (the minimum of
        the newest completed batch's watermarks of the event-time streams it reads; None without one)."""
        committed = _committed(self.sources.runtime.checkpointer)
        rates = self.source_rates() if rates is None else rates
        totals = dict(self.history.records_per_input)
        watermarks, late = self.history.event_time()
        nodes = []
        for n in self.nodes:
            kind = node_kind(n)
            window = getattr(n, "window", None)
            entry: dict[str, Any] = {
                "id": n.id,
                "key": n.key,
                "name": node_label(n),
                "type": n.key_name,
                "kind": kind,
                "stateful": bool(n.must_checkpoint),
                "slide_ms": n.slide_duration.ms,
                "window_ms": window.ms if isinstance(window, Duration) else None,
                "depends_on": [d.key for d in n.dependencies],
                "state": self.checkpoint_info(committed, n),
                "watermark": _watermark(n, watermarks),
            }
            if isinstance(n, EventTimeNode):
                entry["late_records_total"] = late.get(n.id, 0)
            if isinstance(n, InputNode):
                entry["input"] = {"records_total": totals.get(n.id, 0), "rate_per_s": rates.get(n.id)}
            if isinstance(n, OutputNode):
                entry["output_id"] = n.output_id
            nodes.append(entry)
        edges = [[d.key, n.key] for n in self.nodes for d in n.dependencies]
        return {"nodes": nodes, "edges": edges}

    def sources_json(self, rates: dict[int, float | None] | None = None) -> list[dict[str, Any]]:
        rates = self.source_rates() if rates is None else rates
        totals = dict(self.history.records_per_input)
        lost = dict(self.history.lost_per_input)
        return [{"id": n.id, "key": n.key, "name": node_label(n), "type": n.key_name,
                 "records_total": totals.get(n.id, 0), "rate_per_s": rates.get(n.id),
                 "records_lost": lost.get(n.id, 0)}
                for n in self.sources.graph.inputs]

    def errors(self) -> list[dict[str, Any]]:
        """The last errors, newest first: failed output operations, the error ``awaitTermination`` raises (a
        batch that could not be built, fencing, a store down past the bound) and failed checkpoints."""
        runtime = self.sources.runtime
        history = self.history.errors()
        found: list[tuple[str, BaseException | CheckpointError]] = []
        first = runtime.scheduler.error
        if first is not None and not _listed(first, history):
            found.append(("driver (awaitTermination raises it)", first))
        found.extend(("checkpoint", e) for e in list(runtime.checkpointer.errors)[-MAX_ERRORS:])
        driver = self.driver()
        now = _now_ms()
        with self._errors_lock:
            # An engine error has no time of its own: the time it was first seen here stands in for it.
            seen = {id(e): self._seen_errors.get(id(e)) or error_entry(now, where, _error_text(e))
                    for where, e in found}
            if driver["fenced"]:  # the first error may be another one: fencing is always listed
                seen[0] = self._seen_errors.get(0) or error_entry(
                    now, "driver (fenced)", f"FencedError: another driver took over {driver['checkpoint_location']}: "
                    f"this driver (epoch {driver['epoch']}) stops without committing anything more")
            self._seen_errors = seen
            engine = list(seen.values())
        merged = sorted([*history, *engine], key=lambda x: x["time_ms"], reverse=True)
        return merged[:MAX_ERRORS]

    # ------------------------------------------------------------------ documents
    def batches(self, after_ms: int | None = None) -> list[dict[str, Any]]:
        return [batch_json(b, self.source_keys) for b in self.history.batches(after_ms)]

    def batch(self, time_ms: int) -> dict[str, Any] | None:
        info = self.history.batch(time_ms)
        if info is None:
            return None
        return batch_detail_json(info, self.source_keys, self.spark_jobs(info))

    def status(self) -> dict[str, Any]:
        """Everything but the batches (``/api/status``)."""
        rates = self.source_rates()
        return {
            "app": self.overview(),
            "driver": self.driver(),
            "totals": {**self.history.totals(), "listener_events_dropped": self.sources.bus.dropped},
            "sources": self.sources_json(rates),
            "streams": self.streams(rates),
            "errors": self.errors(),
            "timeline_ms": self.history.window_ms,
        }
