"""Prometheus metrics of one running StreamingContext, in a registry of its own.

Contract:

* :class:`StatusMetrics` owns a ``prometheus_client.CollectorRegistry`` per context (never the global one),
  so that several contexts in one process (tests, a notebook) do not clash. ``/metrics`` serves it.
* Batch metrics are observed from the listener bus (:meth:`StatusMetrics.observe`, called by
  :class:`~dstreams.api.status.model.BatchHistory` for every completed batch): counters and histograms
  that match ``ssc.batchInfos()``. The rest is read when scraped (:meth:`StatusMetrics.collect`) from the
  same public parts the status page reads: state sizes as of each stateful stream's newest checkpoint,
  checkpoint ages and failures, the driver's epoch and fence, the listener bus' dropped events.
* Data-checkpoint writes are observed from the checkpointer (``StoreCheckpointer.add_write_observer``, on its
  writer thread): ``dstreams_checkpoint_write_seconds{outcome}``, ``committed`` or ``failed``.
* Store retries and store-outage waits are the recovery layer's process-wide counters
  (:data:`dstreams.recovery.retry.STORE_RETRIES`, :data:`dstreams.recovery.outage.OUTAGE_WAITS`, see
  :mod:`dstreams.recovery.counters`), read when scraped: the driver process' own since it started (executors
  retry in their own processes).
* Names follow Prometheus' conventions: ``dstreams_`` prefix, base units (seconds, bytes), ``_total`` for
  counters; labels ``source`` (an input stream's key) and ``stream`` (a stateful stream's key), the keys
  that stay the same when a restarted driver rebuilds the graph. docs/reference/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

import dstreams
from dstreams.listener import BatchInfo
from dstreams.recovery.checkpointer import CheckpointWrite
from dstreams.recovery.outage import OUTAGE_WAITS
from dstreams.recovery.retry import STORE_RETRIES

from .model import StatusModel

#: Delays and processing times, seconds (a 100 ms batch to a 5-minute backlog).
SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: The driver's own time per batch, seconds.
DRIVER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: A data checkpoint's write, seconds (a small state to a store outage ridden out).
CHECKPOINT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

class StatusMetrics:
    """The context's registry: batch counters and histograms observed per batch, the rest collected when
    scraped (see the module docstring)."""

    def __init__(self, model: StatusModel) -> None:
        self.model = model
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.batches_completed = Counter("dstreams_batches_completed", "Batches completed (failed ones included).",
                                         registry=r)
        self.batches_failed = Counter("dstreams_batches_failed", "Batches that failed for good (a failed output "
                                      "operation after every attempt, or dropped).", registry=r)
        self.batches_dropped = Counter("dstreams_batches_dropped", "Batches whose input was dropped after they failed "
                                       "(spark.dstreams.batch.onFailure=dropInput), replays of a drop included.",
                                       registry=r)
        self.batch_retries = Counter("dstreams_batch_retries", "Tries of a failed batch after its first "
                                     "(spark.dstreams.batch.maxAttempts).", registry=r)
        self.input_records = Counter("dstreams_input_records", "Records read by each source, in completed batches.",
                                     ["source"], registry=r)
        self.input_records_lost = Counter(
            "dstreams_input_records_lost", "Offsets a source skipped because they were gone from its server "
            "(Kafka with failOnDataLoss=False: retention, a deleted topic), in completed batches.", ["source"],
            registry=r)
        self.output_records = Counter("dstreams_output_records", "Records written by each output operation whose "
                                      "sink reports them (saveAsTextFiles, saveToStore), in completed batches.",
                                      ["output", "name"], registry=r)
        #: Histograms of each completed batch: (its BatchInfo attribute in ms, the histogram).
        self.histograms: list[tuple[str, Histogram]] = [
            (attribute, Histogram(name, doc, buckets=buckets, registry=r)) for attribute, name, doc, buckets in (
                ("processing_delay_ms", "dstreams_batch_processing_seconds",
                 "Processing time of each batch (its output operations).", SECONDS_BUCKETS),
                ("scheduling_delay_ms", "dstreams_batch_scheduling_delay_seconds",
                 "Time each batch waited from its submission to the start of its processing.", SECONDS_BUCKETS),
                ("total_delay_ms", "dstreams_batch_total_delay_seconds",
                 "Scheduling delay plus processing time of each batch (submission to end of processing).",
                 SECONDS_BUCKETS),
                ("generation_ms", "dstreams_batch_generation_seconds",
                 "Driver time spent building each batch's RDDs and jobs.", DRIVER_BUCKETS),
            )]
        for key in model.source_keys.values():  # every source shows, with 0, from the start
            self.input_records.labels(source=key)
            self.input_records_lost.labels(source=key)
        self.checkpoint_writes = Histogram(
            "dstreams_checkpoint_write_seconds", "Duration of each data-checkpoint write (parts and manifest; waits "
            "for an unavailable store included), by outcome: committed or failed (given up).", ["outcome"],
            buckets=CHECKPOINT_BUCKETS, registry=r)
        for outcome in ("committed", "failed"):
            self.checkpoint_writes.labels(outcome=outcome)
        self._checkpointer = model.sources.runtime.checkpointer
        self._checkpointer.add_write_observer(self.observe_checkpoint_write)
        r.register(self)

    def close(self) -> None:
        """Stop observing the checkpointer."""
        self._checkpointer.remove_write_observer(self.observe_checkpoint_write)

    def observe_checkpoint_write(self, write: CheckpointWrite) -> None:
        """Count one data-checkpoint write that ended (called on the checkpointer's writer thread)."""
        self.checkpoint_writes.labels(outcome="committed" if write.committed else "failed").observe(write.seconds)

    # ------------------------------------------------------------------ per batch (listener bus thread)
    def observe(self, info: BatchInfo) -> None:
        """Count one completed batch (called by the history for each ``onBatchCompleted``)."""
        self.batches_completed.inc()
        if info.failed:
            self.batches_failed.inc()
        if info.dropped:
            self.batches_dropped.inc()
        if info.attempts > 1:
            self.batch_retries.inc(info.attempts - 1)
        keys = self.model.source_keys
        for sid, n in info.records_per_input.items():
            self.input_records.labels(source=keys.get(sid, str(sid))).inc(n)
        for sid, entries in info.input_metadata.items():
            lost = entries.get("recordsLost")
            if isinstance(lost, int) and lost > 0:
                self.input_records_lost.labels(source=keys.get(sid, str(sid))).inc(lost)
        for op in info.output_operations.values():
            if op.records_written is not None:
                self.output_records.labels(output=str(op.output_id), name=op.output_name).inc(op.records_written)
        for attribute, histogram in self.histograms:
            ms = getattr(info, attribute)
            if ms is not None:
                histogram.observe(ms / 1000.0)

    # ------------------------------------------------------------------ when scraped
    def collect(self) -> Iterator[Metric]:
        """The metrics read when scraped (a custom collector of the registry)."""
        model = self.model
        overview = model.overview()
        yield InfoMetricFamily("dstreams", "The application and the dstreams version.",
                               value={"app": str(overview["app_name"]), "master": str(overview["master"] or ""),
                                      "version": dstreams.__version__})
        totals = model.history.totals()
        yield CounterMetricFamily("dstreams_batches_submitted", "Batches generated and queued to run.",
                                  value=totals["batches_submitted"])
        yield GaugeMetricFamily("dstreams_batches_pending", "Batches submitted and not completed yet.",
                                value=totals["batches_pending"])
        if overview["batch_interval_ms"] is not None:
            yield GaugeMetricFamily("dstreams_batch_interval_seconds", "The batch interval.",
                                    value=overview["batch_interval_ms"] / 1000.0)
        yield from self._last_batch()
        yield from self._event_time()
        yield from self._state()
        yield from self._driver()

    def _last_batch(self) -> Iterator[Metric]:
        batches = self.model.history.batches()
        if not batches:
            return
        last = batches[-1]
        yield GaugeMetricFamily("dstreams_last_completed_batch_time_seconds",
                                "Batch time of the newest completed batch (epoch seconds).",
                                value=last.batch_time_ms / 1000.0)
        for name, value, doc in (
            ("processing", last.processing_delay_ms, "Processing time"),
            ("scheduling_delay", last.scheduling_delay_ms, "Scheduling delay"),
            ("total_delay", last.total_delay_ms, "Total delay"),
        ):
            if value is not None:
                yield GaugeMetricFamily(f"dstreams_last_batch_{name}_seconds", f"{doc} of the newest completed batch.",
                                        value=value / 1000.0)

    def _event_time(self) -> Iterator[Metric]:
        watermarks, late = self.model.history.event_time()
        keys = {n.id: n.key for n in self.model.nodes}
        mark = GaugeMetricFamily("dstreams_watermark_seconds", "Low watermark of an event-time stream in the newest "
                                 "completed batch (epoch seconds of event time).", labels=["stream"])
        dropped = CounterMetricFamily("dstreams_late_records", "Records of an event-time stream dropped as later "
                                      "than its watermark (or sent to lateRecords()).", labels=["stream"])
        for sid, total in sorted(late.items()):
            label = [keys.get(sid, str(sid))]
            dropped.add_metric(label, total)
            watermark = watermarks.get(sid)
            if watermark is not None:
                mark.add_metric(label, watermark / 1000.0)
        yield from (mark, dropped)

    def _state(self) -> Iterator[Metric]:
        keys = GaugeMetricFamily("dstreams_state_keys", "Keys in a stateful stream's state: on the executor state "
                                 "store as its tasks last reported them, else as of its newest checkpoint.",
                                 labels=["stream"])
        size = GaugeMetricFamily("dstreams_state_bytes", "Size of a stateful stream's state: the executor state "
                                 "store's files on disk, else the serialized size as of its newest checkpoint.",
                                 labels=["stream"])
        disk = GaugeMetricFamily("dstreams_state_disk_bytes", "Bytes of a stream's executor state stores on the "
                                 "executors' disks (spark.dstreams.state.store=executor).", labels=["stream"])
        ckpt = GaugeMetricFamily("dstreams_checkpoint_bytes", "Bytes of a stateful stream's newest committed "
                                 "checkpoint (the executor state store writes the keys changed since the one "
                                 "before, or a snapshot).", labels=["stream"])
        age = GaugeMetricFamily("dstreams_checkpoint_age_seconds", "Time since the batch time of a stateful "
                                "stream's newest committed checkpoint.", labels=["stream"])
        newest = GaugeMetricFamily("dstreams_checkpoint_last_batch_time_seconds", "Batch time of a stateful "
                                   "stream's newest committed checkpoint (epoch seconds).", labels=["stream"])
        caught_up = CounterMetricFamily("dstreams_state_caught_up", "Times a task brought a partition's executor "
                                        "state store up to date from the state changelog (a task on another host "
                                        "than the store, a store lost or behind; spark.dstreams.state.changelog).",
                                        labels=["stream"])
        streams: dict[str, Any] = self.model.streams()
        for node in streams["nodes"]:
            state = node["state"]
            if state is None:
                continue
            label = [node["key"]]
            if state["keys"] is not None:
                keys.add_metric(label, state["keys"])
                size.add_metric(label, state["bytes"])
            if state.get("store") is not None:
                disk.add_metric(label, state["store"]["disk_bytes"])
                if state["store"].get("changelog"):
                    caught_up.add_metric(label, state["store"]["caught_up"])
            if state.get("checkpoint_bytes") is not None:
                ckpt.add_metric(label, state["checkpoint_bytes"])
            if state["newest_checkpoint_ms"] is not None:
                age.add_metric(label, state["newest_checkpoint_age_ms"] / 1000.0)
                newest.add_metric(label, state["newest_checkpoint_ms"] / 1000.0)
        yield from (keys, size, disk, ckpt, age, newest, caught_up)
        yield CounterMetricFamily("dstreams_checkpoint_failures", "Data checkpoints that failed or were given up.",
                                  value=self.model.sources.runtime.checkpointer.error_count)

    def _driver(self) -> Iterator[Metric]:
        driver = self.model.driver()
        if driver["epoch"] is not None:
            yield GaugeMetricFamily("dstreams_driver_epoch", "The driver's epoch in the metadata log (fencing).",
                                    value=driver["epoch"])
        fenced = 1 if driver["fenced"] else 0
        yield GaugeMetricFamily("dstreams_driver_fenced", "1 once another driver took over this checkpoint "
                                "location (this one stops committing).", value=fenced)
        yield CounterMetricFamily("dstreams_fencing_events", "Times this driver found itself fenced off.",
                                  value=fenced)
        retries = CounterMetricFamily("dstreams_store_retries", "Checkpoint-store operations of the driver retried "
                                      "after a transient error.", labels=["operation"])
        for op, n in sorted(STORE_RETRIES.snapshot().items()):
            retries.add_metric([op], n)
        yield retries
        yield CounterMetricFamily("dstreams_store_outage_waits", "Waits of the driver for an unavailable store "
                                  "(spark.dstreams.store.outageSeconds).", value=OUTAGE_WAITS.total())
        yield CounterMetricFamily("dstreams_listener_events_dropped", "Listener events dropped (the listener bus' "
                                  "queue was full).", value=self.model.sources.bus.dropped)
