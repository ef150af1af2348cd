"""Event time: timestamps per record and a low watermark per stream, computed per batch.

**Records.** :class:`EventTimeNode` (``withEventTime(extract, allowedLateness)``) turns each record ``x``
of its parent into ``(event_ms, x)``: ``extract(x)`` is a number of seconds since the epoch (as
``time.time()``) or a ``datetime`` (a naive one is taken as UTC), kept as integer milliseconds. Nodes
downstream of it that keep event time (the timed ``map``/``filter``/... of the api, a timed ``union``)
carry the same ``(event_ms, value)`` records; the event-time operators read them.

**The low watermark** of an :class:`EventTimeNode` ``E`` at batch ``t`` (MillWheel's low watermark:
every record of ``E`` with an earlier event time has been seen) is fixed when batch ``t`` is generated,
from the data of the batches **before** ``t``::

    M(t)  = max event time of E's records in batches <= t - 1           (None before any record)
    W(t)  = max(W(t - 1), min(M(t) - allowedLateness, source caps at t))   (None while M is None)

where the source caps are what the input nodes upstream of ``E`` declare through
:meth:`~dstreams.nodes.input.InputNode.event_time_watermark` (None: no cap). ``W`` never goes back.
A record of batch ``t`` whose event time is below ``W(t)`` is **behind the watermark**: ``E`` counts
it (``lateRecords`` in the batch metrics) and the side stream :class:`LateRecordsNode` holds it. By
default ``E`` keeps it in its stream: lateness is decided per window by the operators downstream (a
record counts in each of its event-time windows or sessions that is still open and is late only for
those that closed, :mod:`dstreams.nodes.event_window`), as in Flink and Structured Streaming. With
``drop_late`` (``withEventTime(..., dropLate=True)``) ``E`` drops it from its stream instead, so that
no operator downstream (``track``, ``updateStateByKey`` on the plain records) sees it. A stream
derived from several event-time streams (a union, a join, ``transformWith``) has the **minimum** of
their watermarks (MillWheel's combination across inputs): :func:`watermark_at`.

*Why batch t - 1.* The maximum event time of batch ``t`` is known only once batch ``t``'s RDD has been
computed by a Spark job; using it for batch ``t`` itself would need a job while ``t`` is being built.
Batch ``t - 1``'s maximum is collected by the tasks of batch ``t - 1``'s own jobs (an accumulator in
``E``'s partition function, per partition), so in steady state fixing ``W(t)`` costs no Spark job. When
some partitions of ``t - 1`` were not computed by then (a backlog: ``t`` is built before ``t - 1`` ran;
an output that reads only part of a batch, as ``pprint``'s ``take``; a restarted driver), the generator
computes their statistics with one job over the parent's RDD of ``t - 1`` (deterministic: the same
records, the same watermark). Either way ``W(t)`` is a pure function of the input of the batches before
``t`` and the sources' caps.

**Replay.** The per-batch record (:class:`WatermarkRecord`: ``M(t)``, ``W(t)``, ``W(t - 1)``) goes into the
metadata log with batch ``t``'s input offsets (the journal asks the node's checkpoint data,
:meth:`EventTimeCheckpointData.batch_record`, before the batch runs). A restarted driver hands the recorded ones
back (:meth:`EventTimeCheckpointData.replay_records`): a replayed batch sees exactly the watermark recorded for it,
and the next new batch continues from the last record. Only the generator's thread (the event loop)
computes records; the runner threads read them (metrics) and nothing else.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark import RDD
from pyspark.accumulators import Accumulator, AccumulatorParam

from ..checkpoint_data import CheckpointData
from ..node import DStreamNode, OneParentNode
from ..spark import jvm
from ..time import BatchTime, Duration
from .input import InputNode

if TYPE_CHECKING:
    from ..graph import DStreamGraph

log = logging.getLogger(__name__)

_N = TypeVar("_N", bound=DStreamNode)

#: Per-partition statistics of one batch of an event-time stream: (max event ms or None, records, late).
PartitionStats = tuple[int | None, int, int]


def event_ms(value: Any) -> int:
    """An event time as integer milliseconds: ``value`` is seconds since the epoch or a ``datetime``."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return round(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"an event time must be seconds since the epoch (int or float) or a datetime, got {value!r:.100} "
            f"of type {type(value).__name__}: make withEventTime's function return one")
    return round(value * 1000)


def seconds(ms: int) -> int | float:
    """Milliseconds as the seconds users see (an int when whole, else a float)."""
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


@dataclass(frozen=True)
class WatermarkRecord:
    """What batch ``t`` of an event-time stream was built with (recorded in the metadata log).

    ``max_event_ms``: the maximum event time of the batches before ``t`` (None: no record yet);
    ``watermark_ms``: ``W(t)``, the low watermark in force for batch ``t`` (None: none yet);
    ``previous_ms``: ``W(t - 1)`` (what the previous batch was built with).
    """

    max_event_ms: int | None
    watermark_ms: int | None
    previous_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {"max": self.max_event_ms, "wm": self.watermark_ms, "prev": self.previous_ms}

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> WatermarkRecord:
        def opt(v: Any) -> int | None:
            return None if v is None else int(v)

        return WatermarkRecord(opt(raw.get("max")), opt(raw.get("wm")), opt(raw.get("prev")))


EMPTY_RECORD = WatermarkRecord(None, None, None)


class _StatsParam(AccumulatorParam):
    """Accumulates ``{batch ms: {partition: PartitionStats}}``; idempotent (a retried or speculative task
    reports the same statistics for its partition), merged in place so the driver can prune old batches."""

    def zero(self, value: dict[int, dict[int, PartitionStats]]) -> dict[int, dict[int, PartitionStats]]:
        return {}

    def addInPlace(self, value1: dict[int, dict[int, PartitionStats]],
                   value2: dict[int, dict[int, PartitionStats]]) -> dict[int, dict[int, PartitionStats]]:
        for t, parts in value2.items():
            value1.setdefault(t, {}).update(parts)
        return value1


class EventStamp:
    """``withEventTime(extract, onError="deadLetter")``'s guarded step: ``x -> (event ms, x)``, raising (inside the
    dead-letter guard) when ``extract`` raises or returns no event time."""

    def __init__(self, extract: Callable[[Any], Any]) -> None:
        self.extract = extract

    def __call__(self, x: Any) -> tuple[int, Any]:
        return event_ms(self.extract(x)), x


def _tag_partition(extract: Callable[[Any], Any] | None, watermark: int | None, keep: str, time_ms: int,
                   acc: Accumulator | None) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    """Partition function over the records ``x`` of a partition, by ``keep``: ``"all"``: ``(event_ms, x)``
    for every record; ``"on-time"``: for the records at or above ``watermark``; ``"late"``: the records
    below it, ``x`` as they are. Reports the partition's statistics to ``acc`` once the partition has been
    read to its end. ``extract`` None: the records are ``(event_ms, x)`` already (:class:`EventStamp`)."""

    def run(index: int, it: Iterable[Any]) -> Iterator[Any]:
        n = late = 0
        top: int | None = None
        for x in it:
            if extract is None:
                ts, x = x
            else:
                ts = event_ms(extract(x))
            n += 1
            if watermark is not None and ts < watermark:
                late += 1
                if keep == "late":
                    yield x
                elif keep == "all":
                    yield (ts, x)
                continue
            if top is None or ts > top:
                top = ts
            if keep != "late":
                yield (ts, x)
        if acc is not None:
            acc.add({time_ms: {index: (top, n, late)}})

    return run


class _LastReport:
    """Stands in for the accumulator of :func:`_tag_partition`: keeps what the partition reported."""

    def __init__(self) -> None:
        self.value: dict[int, dict[int, PartitionStats]] = {}

    def add(self, value: dict[int, dict[int, PartitionStats]]) -> None:
        self.value = value


def _stats_partition(extract: Callable[[Any], Any] | None, watermark: int | None
                     ) -> Callable[[int, Iterable[Any]], Iterable[tuple[int, PartitionStats]]]:
    """Partition function: ``[(index, statistics)]`` of a partition, counted as :func:`_tag_partition` counts."""

    def run(index: int, it: Iterable[Any]) -> Iterable[tuple[int, PartitionStats]]:
        report = _LastReport()
        for _ in _tag_partition(extract, watermark, "on-time", 0, report)(index, it):  # type: ignore[arg-type]
            pass
        return [(index, report.value[0][index])]

    return run


class EventTimeNode(OneParentNode):
    """``withEventTime(extract, allowedLateness)``: see the module docstring."""

    label = "withEventTime"
    stamped = False

    def __init__(self, graph: DStreamGraph, parent: DStreamNode, extract: Callable[[Any], Any],
                 lateness: Duration, drop_late: bool = False, stamped: bool = False) -> None:
        """``stamped``: the parent's records are ``(event ms, record)`` already (``extract`` was applied upstream,
        inside a dead-letter guard: :class:`EventStamp`)."""
        super().__init__(graph, parent)
        if lateness.ms < 0:
            raise ValueError(f"allowedLateness must not be negative, got {lateness}")
        self.extract = extract
        self.stamped = stamped
        self.lateness = lateness
        self.drop_late = drop_late
        self._records: dict[int, WatermarkRecord] = {}
        self._replay: dict[int, WatermarkRecord] = {}
        self._acc: Accumulator | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_records={}, _replay={}, _acc=None)
        return state

    @property
    def record_extract(self) -> Callable[[Any], Any] | None:
        """What the partition functions call on a parent record: ``extract``, or None when the records are stamped."""
        return None if self.stamped else self.extract

    def describe_params(self) -> list[str]:
        return [f"lateness={self.lateness.ms}", *(["dropLate"] if self.drop_late else [])]

    # ----------------------------------------------------------------- the per-batch record
    def _accumulator(self) -> Accumulator:
        if self._acc is None:
            self._acc = self.graph.sc.accumulator({}, _StatsParam())
        return self._acc

    def _known(self, t: int) -> WatermarkRecord | None:
        rec = self._records.get(t)
        if rec is None and t in self._replay:
            rec = self._records[t] = self._replay.pop(t)
        return rec

    def record_at(self, time: BatchTime) -> WatermarkRecord:
        """The watermark record of batch ``time`` (computed once, on the generator's thread; may run one
        Spark job for the statistics of the batch before, see the module docstring)."""
        assert self.zero_time is not None
        slide = self.slide_duration.ms
        rec = self._known(time.ms)
        if rec is not None:
            return rec
        todo = [time.ms]
        while True:  # walk back to a known record (or the first batch), then forward
            prev = todo[-1] - slide
            if prev <= self.zero_time.ms or self._known(prev) is not None:
                break
            todo.append(prev)
        for t in reversed(todo):
            prev = t - slide
            base = self._known(prev) if prev > self.zero_time.ms else None
            if base is None:
                rec = EMPTY_RECORD
            else:
                top = _max(base.max_event_ms, self._batch_max(BatchTime(prev), base.watermark_ms))
                candidate = None if top is None else top - self.lateness.ms
                cap = self._source_cap(BatchTime(t))
                if candidate is not None and cap is not None:
                    candidate = min(candidate, cap)
                rec = WatermarkRecord(top, _max(base.watermark_ms, candidate), base.watermark_ms)
            self._records[t] = rec
        assert rec is not None
        return rec

    def _source_cap(self, time: BatchTime) -> int | None:
        caps = [c for n in upstream_inputs(self) if (c := n.event_time_watermark(time)) is not None]
        return min(caps) if caps else None

    def _batch_max(self, time: BatchTime, watermark: int | None) -> int | None:
        """The maximum event time of batch ``time`` (its records at or above ``watermark``)."""
        stats = self.batch_stats(time)
        parent = self.parent.get_or_compute(time)
        if parent is None:
            return None
        n = jvm.num_partitions(parent)
        missing = [i for i in range(n) if i not in stats]
        if missing:
            log.debug("%s: computing the event-time statistics of %d partition(s) of batch %d", self.name,
                      len(missing), time.ms)
            job = parent.mapPartitionsWithIndex(_stats_partition(self.record_extract, watermark))
            for index, s in self.graph.sc.runJob(job, lambda it: list(it), missing):
                stats[index] = s
            self._accumulator().add({time.ms: {i: stats[i] for i in missing}})
        top: int | None = None
        for s in stats.values():
            top = _max(top, s[0])
        return top

    def batch_stats(self, time: BatchTime) -> dict[int, PartitionStats]:
        """The statistics the tasks reported so far for batch ``time``, by partition (a copy)."""
        if self._acc is None:
            return {}
        return dict(self._acc.value.get(time.ms, {}))

    # ----------------------------------------------------------------- recovery and metrics
    @property
    def checkpoint_data(self) -> EventTimeCheckpointData:
        """The stream's checkpoint data: its watermark record per batch."""
        return EventTimeCheckpointData(self)

    def event_time_metrics(self, time: BatchTime) -> dict[str, Any] | None:
        """What batch ``time`` saw: ``stream`` (its name), ``watermarkMs`` (the watermark the batch was built
        with, None before there is one), ``lateRecords`` (behind the watermark) and ``records`` (counted by the
        tasks of the partitions computed so far) and ``partitionsCounted``. Reads only: safe on a runner
        thread."""
        rec = self._records.get(time.ms)
        if rec is None:
            return None
        stats = self.batch_stats(time)
        return {
            "stream": self.name,
            "watermarkMs": rec.watermark_ms,
            "lateRecords": sum(s[2] for s in stats.values()),
            "records": sum(s[1] for s in stats.values()),
            "partitionsCounted": len(stats),
        }

    # ----------------------------------------------------------------- generation
    def compute(self, time: BatchTime) -> RDD | None:
        rec = self.record_at(time)
        rdd = self.parent.get_or_compute(time)
        if rdd is None:
            return None
        return rdd.mapPartitionsWithIndex(
            _tag_partition(self.record_extract, rec.watermark_ms, "on-time" if self.drop_late else "all", time.ms,
                           self._accumulator()))

    def forget_records(self, time: BatchTime) -> None:
        """The watermark records and task statistics of the batches that left the remember window at ``time`` (the
        newest record is kept: the next batch builds on it). Called by ``clear_metadata``."""
        assert self.remember_duration is not None
        horizon = time.ms - self.remember_duration.ms
        newest = max(self._records, default=None)
        for t in [t for t in self._records if t <= horizon and t != newest]:
            del self._records[t]
        if self._acc is not None:
            value = self._acc.value
            for t in [t for t in list(value) if t <= horizon]:
                value.pop(t, None)


class EventTimeCheckpointData(CheckpointData):
    """An event-time stream's checkpoint data (``dstreams.checkpoint_data``): the record of a batch is its watermark
    record (:class:`WatermarkRecord`), fixed once while the batch is built; a restarted driver's recorded ones are
    handed out again as the batches are rebuilt."""

    node: EventTimeNode

    def batch_record(self, time: BatchTime) -> dict[str, Any] | None:
        return self.node.record_at(time).to_json()

    def replay_records(self, records: Mapping[int, Any]) -> None:
        self.node._replay = {int(t): WatermarkRecord.from_json(r) for t, r in records.items()}


class LateRecordsNode(OneParentNode):
    """``lateRecords()`` of an event-time stream: the records of an :class:`EventTimeNode`'s parent that are
    behind the watermark of their batch (event time below it), as they were."""

    label = "lateRecords"
    parent: EventTimeNode

    def compute(self, time: BatchTime) -> RDD | None:
        source = self.parent
        rec = source.record_at(time)
        rdd = source.parent.get_or_compute(time)
        if rdd is None:
            return None
        return rdd.mapPartitionsWithIndex(
            _tag_partition(source.record_extract, rec.watermark_ms, "late", time.ms, None))


class WatermarkNode(OneParentNode):
    """``watermarks()``: one record per batch, the low watermark in force for that batch (seconds since the
    epoch, or None before there is one)."""

    label = "watermarks"

    def __init__(self, graph: DStreamGraph, parent: DStreamNode) -> None:
        if not timed_ancestors(parent):
            raise ValueError("this stream has no event time upstream: call withEventTime(extract) first")
        super().__init__(graph, parent)

    def compute(self, time: BatchTime) -> RDD | None:
        wm = watermark_at(self.parent, time)
        return self.graph.sc.parallelize([None if wm is None else seconds(wm)], 1)


# ---------------------------------------------------------------------- the graph's view
def _upstream(node: DStreamNode, wanted: type[_N]) -> list[_N]:
    """The nearest nodes of type ``wanted`` at or upstream of ``node`` (each once; the walk stops at them),
    in key order."""
    seen: set[int] = set()
    out: list[_N] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, wanted):
            out.append(n)
        else:
            stack.extend(n.dependencies)
    return sorted(out, key=lambda n: n.key)


def upstream_inputs(node: DStreamNode) -> list[InputNode]:
    """The input nodes ``node`` reads from, directly or through others."""
    return _upstream(node, InputNode)


def timed_ancestors(node: DStreamNode) -> list[EventTimeNode]:
    """The nearest event-time nodes upstream of ``node`` (``node`` itself if it is one): the streams whose
    watermarks ``node``'s watermark is the minimum of."""
    return _upstream(node, EventTimeNode)


def _min_all(values: list[int | None]) -> int | None:
    if not values or any(v is None for v in values):
        return None
    return min(v for v in values if v is not None)


def watermark_at(node: DStreamNode, time: BatchTime) -> int | None:
    """The low watermark (ms) of ``node`` for batch ``time``: the minimum over its event-time ancestors
    (None while any of them has none). Call on the generator's thread."""
    return _min_all([e.record_at(time).watermark_ms for e in timed_ancestors(node)])


def previous_watermark_at(node: DStreamNode, time: BatchTime) -> int | None:
    """The watermark ``node`` had for the batch before ``time`` (what that batch was built with)."""
    return _min_all([e.record_at(time).previous_ms for e in timed_ancestors(node)])
