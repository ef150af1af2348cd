"""The Kafka benchmark's load and its eyes: a rate-controlled producer and a read_committed latency measurer.

Both run in their own processes (``multiprocessing``, spawn) beside the engine under test, so that neither shares
an interpreter with the orchestrator or the engine. Contract:

* :func:`produce_loop` writes the generator's 100-byte lines (:func:`dstreams.nodes.generator.text_records`, seed
  :data:`benchmarks.workloads.SEED`: the very lines of ``python -m benchmarks run``, the same sequence for every
  engine) to the input topic's partitions in turn, at the rate held in :attr:`LoadControl.rate` (records per
  second; 0 pauses), paced every :data:`TICK_S`. Records have no key; their Kafka timestamp (create time, set by
  librdkafka when the record is produced) is the produce time the latency is measured from. It counts what it
  produced and when it produced its last record (:class:`LoadControl`).
* :func:`measure_loop` reads the output topic from its start with ``isolation.level=read_committed`` (what an
  exactly-once sink's consumer sees) and takes the time a record arrives as the time it became visible. Each output
  record names the newest input it covers (:func:`parse_reference`): its key is that input's timestamp (Grep: the
  matching line's own produce time), or its value ends with ``" <timestamp>"`` (Structured Streaming, Quix
  Streams: the newest input record counted in the row) or with ``" o:<partition>:<until>,..."`` (dstreams: the
  batch's offset ranges; the newest input is the newest of the records at ``until - 1``, fetched from the input
  topic when the statistics are asked for, so the engine does no extra work). Latencies are kept as per-second
  histograms (1 ms bins) by arrival second; :class:`MeasureClient` asks for the statistics of a time window.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

#: Seconds between two pacing decisions of the producer.
TICK_S = 0.002
#: Records per generated chunk of lines (per partition).
CHUNK = 50_000
#: Every blocking client call of the load processes is bounded by this.
CLIENT_TIMEOUT_S = 10.0
#: A statistics request waits at most this long for the measurer's answer.
ANSWER_TIMEOUT_S = 60.0


def producer_config(bootstrap: str) -> dict[str, Any]:
    """librdkafka settings of the load producer: small linger for latency, a large queue for the high rates."""
    return {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000, "acks": 1,
            "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1_048_576,
            "enable.idempotence": False}


def line_chunks(partition: int) -> Iterator[list[bytes]]:
    """The generator's lines for ``partition`` as encoded chunks of :data:`CHUNK`, forever (deterministic)."""
    from dstreams.nodes.generator import text_records

    from .workloads import SEED

    chunk = 0
    while True:
        yield [line.encode() for line in text_records(SEED, chunk * 1000, partition, CHUNK)]
        chunk += 1


@dataclass
class LoadControl:
    """Shared values between the orchestrator and the producer process."""

    rate: Any  # mp.Value("d"): records per second; 0 pauses
    produced: Any  # mp.Value("q"): records handed to the producer so far
    last_ms: Any  # mp.Value("d"): wall time (ms) of the last record produced
    errors: Any  # mp.Value("q"): delivery errors
    stop: Any  # mp.Event

    @classmethod
    def make(cls, ctx: Any) -> LoadControl:
        return cls(ctx.Value("d", 0.0), ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Value("q", 0), ctx.Event())


def produce_loop(bootstrap: str, topic: str, partitions: int, control: LoadControl) -> None:
    """The producer process (module contract): paces ``control.rate`` records per second into ``topic``."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap))
    errors = 0

    def delivered(err: Any, _msg: Any) -> None:
        nonlocal errors
        if err is not None:
            errors += 1

    sources = [line_chunks(p) for p in range(partitions)]
    buffers = [next(s) for s in sources]
    positions = [0] * partitions
    produce = producer.produce
    rate = 0.0
    step_start = time.monotonic()
    sent_in_step = 0
    total = 0
    part = 0
    while not control.stop.is_set():
        wanted = control.rate.value
        now = time.monotonic()
        if wanted != rate:
            rate, step_start, sent_in_step = wanted, now, 0
        due = int(rate * (now - step_start)) - sent_in_step
        if due <= 0:
            producer.poll(0)
            time.sleep(TICK_S)
            continue
        due = min(due, max(1000, int(rate * 0.05)))  # catch up in slices, keep polling the delivery reports
        for _ in range(due):
            buf, pos = buffers[part], positions[part]
            try:
                produce(topic, buf[pos], partition=part, on_delivery=delivered)
            except BufferError:
                producer.poll(0.01)
                break
            pos += 1
            if pos == len(buf):
                buffers[part], pos = next(sources[part]), 0
            positions[part] = pos
            part = (part + 1) % partitions
            sent_in_step += 1
            total += 1
        producer.poll(0)
        with control.produced.get_lock():
            control.produced.value = total
        control.last_ms.value = time.time() * 1000.0
        control.errors.value = errors
    producer.flush(CLIENT_TIMEOUT_S)
    control.errors.value = errors


# ------------------------------------------------------------------------------------------------ measurer
def parse_reference(key: bytes | None, value: bytes | None, by_key: bool) -> int | str | None:
    """The newest input an output record covers: a timestamp (ms), an offsets tag (``"o:..."``) or None."""
    if by_key:
        return int(key) if key else None
    if not value:
        return None
    ref = value.rsplit(b" ", 1)[-1]
    if ref.startswith(b"o:"):
        return ref[2:].decode()
    return int(ref)


def parse_tag(tag: str) -> list[tuple[int, int]]:
    """``"p:until,p:until"`` -> ``[(partition, until), ...]``."""
    out = []
    for part in tag.split(","):
        if part:
            p, u = part.split(":")
            out.append((int(p), int(u)))
    return out


class _Resolver:
    """Timestamps of input records by offset (dstreams' offsets tags), fetched once each."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dstreams-bench-resolver",
                                  "enable.auto.commit": False, "isolation.level": "read_committed",
                                  "fetch.wait.max.ms": 10})
        self.cache: dict[tuple[int, int], int | None] = {}
        self.tags: dict[str, int | None] = {}

    def record_ts(self, partition: int, offset: int) -> int | None:
        from confluent_kafka import TopicPartition

        key = (partition, offset)
        if key not in self.cache:
            self.consumer.assign([TopicPartition(self.topic, partition, offset)])
            deadline = time.monotonic() + CLIENT_TIMEOUT_S
            ts = None
            while time.monotonic() < deadline:
                m = self.consumer.poll(0.5)
                if m is not None and not m.error() and m.offset() == offset:
                    ts = m.timestamp()[1]
                    break
            self.cache[key] = ts
        return self.cache[key]

    def newest(self, tag: str) -> int | None:
        if tag not in self.tags:
            stamps = [self.record_ts(p, u - 1) for p, u in parse_tag(tag) if u > 0]
            known = [s for s in stamps if s is not None]
            self.tags[tag] = max(known) if known else None
        return self.tags[tag]


@dataclass
class WindowStats:
    """Latency statistics of the output records that became visible in a window of wall time."""

    records: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    #: ``(second since the window's start, median latency ms, records)`` for each second with output.
    per_second: list[tuple[int, float, int]]
    #: Newest input (ms) covered by any output seen so far, and the newest output's arrival time (ms).
    newest_covered_ms: float | None
    last_arrival_ms: float | None


def _percentile(hist: Counter[int], q: float) -> float | None:
    total = sum(hist.values())
    if not total:
        return None
    rank = q * (total - 1)
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        if seen > rank:
            return float(value)
    return float(max(hist))


def measure_loop(bootstrap: str, topic: str, input_topic: str, by_key: bool, conn: Connection,
                 ready: Any) -> None:
    """The measurer process (module contract); answers :class:`MeasureClient`'s requests on ``conn``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dstreams-bench-measure",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 20, "fetch.min.bytes": 1})
    md = consumer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    consumer.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    resolver = _Resolver(bootstrap, input_topic)
    seconds: dict[int, Counter[int]] = {}
    tagged: list[tuple[float, str]] = []  # (arrival ms, offsets tag), resolved when asked
    newest = 0.0
    last_arrival = 0.0
    ready.set()

    def resolve() -> None:
        nonlocal newest
        keep: list[tuple[float, str]] = []
        for arrival, tag in tagged:
            ts = resolver.newest(tag)
            if ts is None:
                keep.append((arrival, tag))
                continue
            seconds.setdefault(int(arrival // 1000), Counter())[max(0, round(arrival - ts))] += 1
            newest = max(newest, ts)
        tagged[:] = keep

    def stats(t0: float, t1: float) -> WindowStats:
        resolve()
        hist: Counter[int] = Counter()
        per_second = []
        for sec in range(int(t0 // 1000), int(-(-t1 // 1000))):
            h = seconds.get(sec)
            if h:
                hist.update(h)
                per_second.append((sec - int(t0 // 1000), _percentile(h, 0.5) or 0.0, sum(h.values())))
        return WindowStats(sum(hist.values()), _percentile(hist, 0.5), _percentile(hist, 0.9),
                           _percentile(hist, 0.99), float(max(hist)) if hist else None, per_second,
                           newest or None, last_arrival or None)

    while True:
        msgs = consumer.consume(10_000, 0.02)
        if msgs:
            now = time.time() * 1000.0
            sec = int(now // 1000)
            hist = seconds.setdefault(sec, Counter())
            lat: list[int] = []
            for m in msgs:
                if m.error():
                    continue
                ref = parse_reference(m.key(), m.value(), by_key)
                if ref is None:
                    continue
                if isinstance(ref, str):
                    tagged.append((now, ref))
                else:
                    lat.append(max(0, round(now - ref)))
                    if ref > newest:
                        newest = ref
            hist.update(lat)
            last_arrival = now
        if conn.poll():
            request = conn.recv()
            if request[0] == "stop":
                break
            if request[0] == "stats":
                conn.send(stats(request[1], request[2]))
    consumer.close()
    resolver.consumer.close()


class MeasureClient:
    """The orchestrator's handle on a measurer process (started by :meth:`start`, stopped by :meth:`stop`)."""

    def __init__(self, ctx: Any, bootstrap: str, topic: str, input_topic: str, by_key: bool) -> None:
        self.conn, child = ctx.Pipe()
        self.ready = ctx.Event()
        self.proc = ctx.Process(target=measure_loop, args=(bootstrap, topic, input_topic, by_key, child, self.ready),
                                name="kafka-bench-measure", daemon=True)

    def start(self, timeout_s: float = 60.0) -> None:
        self.proc.start()
        if not self.ready.wait(timeout_s):
            raise TimeoutError(f"the latency measurer did not start within {timeout_s:.0f} s")

    def stats(self, t0_ms: float, t1_ms: float) -> WindowStats:
        self.conn.send(("stats", t0_ms, t1_ms))
        if not self.conn.poll(ANSWER_TIMEOUT_S):
            raise TimeoutError(f"the latency measurer did not answer within {ANSWER_TIMEOUT_S:.0f} s")
        return self.conn.recv()

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class LoadProducer:
    """The orchestrator's handle on the producer process."""

    def __init__(self, ctx: Any, bootstrap: str, topic: str, partitions: int) -> None:
        self.control = LoadControl.make(ctx)
        self.proc = ctx.Process(target=produce_loop, args=(bootstrap, topic, partitions, self.control),
                                name="kafka-bench-producer", daemon=True)

    def start(self) -> None:
        self.proc.start()

    def set_rate(self, rate: float) -> None:
        self.control.rate.value = float(rate)

    @property
    def produced(self) -> int:
        return int(self.control.produced.value)

    @property
    def last_ms(self) -> float:
        return float(self.control.last_ms.value)

    @property
    def errors(self) -> int:
        return int(self.control.errors.value)

    def alive(self) -> bool:
        return self.proc.is_alive()

    def stop(self, timeout_s: float = 20.0) -> None:
        self.control.rate.value = 0.0
        self.control.stop.set()
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


def spawn_context() -> Any:
    """The multiprocessing context of the load processes: spawn (no Kafka client state crosses a fork)."""
    return mp.get_context("spawn")


def growth_ms(per_second: list[tuple[int, float, int]]) -> float:
    """Least-squares growth of the per-second median latency over the window (slope x span), in ms."""
    if len(per_second) < 3:
        return 0.0
    xs = [float(s) for s, _, _ in per_second]
    ys = [m for _, m, _ in per_second]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return slope * (xs[-1] - xs[0])
