"""The input contract's failure rule, for every source kind: fixing a batch has no effect on the node until the
whole batch is fixed (dstreams/nodes/input.py).

Each case feeds the same input to two nodes of one source kind: a fault-free run, and a run in which every
batch's ``compute`` fails once in the middle (a Redis connection error on the 2nd of 4 keys, a Spark call that
fails after a folder or prefix was listed, a write-ahead-log write that fails, ...) and is then called again, as
the scheduler's ``_ride_out`` does. Both runs must hold the same records batch by batch: nothing skipped, nothing
taken twice. A replayable source is then checked the same way on the replay path: a fresh node handed the
fault-free run's recorded offsets (a restarted driver) fails once while rebuilding each batch and, called
again, rebuilds the same batch.

``compute`` is called directly (no scheduler, no clock): the rule is about the node, and a case runs in seconds.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dstreams import StreamingContext
from dstreams.graph import GraphServices
from dstreams.nodes.input import InputNode
from dstreams.recovery.checkpointer import StoreWriteAheadLog
from dstreams.recovery.store import open_store
from dstreams.time import BatchTime

from ..support import MOTO_ENDPOINT, REDIS_URL, service_unavailable

BATCHES = 3
MOTO_OPTS = {"endpoint_url": MOTO_ENDPOINT, "access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


class InjectedFaultError(ConnectionError):
    """The error a case injects in the middle of fixing a batch."""


def fail_once(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str,
              when: Callable[..., bool] = lambda *a, **k: True) -> None:
    """Make ``owner.name(...)`` raise :class:`InjectedFaultError` on its first call for which ``when(...)`` holds."""
    real = getattr(owner, name)
    fired = [False]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not fired[0] and when(*args, **kwargs):
            fired[0] = True
            raise InjectedFaultError(f"injected: {name}{args[:1]!r} failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


class Case:
    """One source kind: where its input lives, how to feed batch ``i``, how to break ``compute`` half-way."""

    replayable = True

    def __init__(self, sc: Any, tmp_path: Any, request: pytest.FixtureRequest) -> None:
        self.sc, self.tmp_path, self.request = sc, tmp_path, request

    def location(self, run: str) -> Any:
        raise NotImplementedError

    def node(self, ssc: StreamingContext, location: Any) -> InputNode:
        raise NotImplementedError

    def feed(self, node: InputNode, location: Any, batch: int) -> None:
        raise NotImplementedError

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        """Arm a one-shot fault in the middle of fixing a new batch."""
        raise NotImplementedError

    def break_replaying(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        """Arm a one-shot fault in the middle of rebuilding a recorded batch."""
        fail_once(monkeypatch, node.graph.sc, "parallelize")

    def records(self, rows: list[Any], location: Any) -> list[Any]:
        return sorted(rows)


class RedisCase(Case):
    keys = 4

    def location(self, run: str) -> list[str]:
        prefix = self.request.getfixturevalue("redis_prefix")
        return [f"{prefix}{run}:{i}" for i in range(self.keys)]

    def node(self, ssc: StreamingContext, location: list[str]) -> InputNode:
        self.client = self.request.getfixturevalue("redis_client")
        for key in location:
            if not self.client.exists(key):
                self.client.xgroup_create(key, "made", "$", mkstream=True)  # an empty stream
        node = ssc.redisStream(location, url=REDIS_URL)._node
        node.start()
        return node

    def feed(self, node: InputNode, location: list[str], batch: int) -> None:
        for key in location:
            for j in range(3):
                self.client.xadd(key, {"n": f"{batch}-{j}"})

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        import redis

        real, second = node._client(), node.keys[1]

        class Client:
            """The real client, but ``XINFO STREAM`` of the 2nd key loses the connection once."""

            fired = False

            def xinfo_stream(self, key: str) -> Any:
                if key == second and not Client.fired:
                    Client.fired = True
                    raise redis.ConnectionError("injected: connection reset while reading the 2nd key")
                return real.xinfo_stream(key)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        monkeypatch.setattr(node, "_client", lambda: Client())

    def records(self, rows: list[Any], location: list[str]) -> list[Any]:
        return sorted((location.index(key), fields["n"]) for key, _id, fields in rows)


class FolderCase(Case):
    binary = False

    def location(self, run: str) -> str:
        path = self.tmp_path / run
        path.mkdir()
        return str(path)

    def node(self, ssc: StreamingContext, location: str) -> InputNode:
        stream = (ssc.binaryRecordsStream(location, 4) if self.binary else ssc.textFileStream(location))
        node = stream._node
        node.start()
        return node

    def feed(self, node: InputNode, location: str, batch: int) -> None:
        for j in range(3):
            name = os.path.join(location, f"b{batch}-{j}")
            with open(name + ".tmp", "wb") as f:
                f.write(b"".join(f"{batch}{j}{k}\n".encode() for k in range(2)))
            os.replace(name + ".tmp", name)  # appears whole (".tmp" is listed but renamed before a batch)

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        fail_once(monkeypatch, node.graph.sc, "binaryRecords" if self.binary else "textFile")

    break_replaying = break_fixing


class BinaryFolderCase(FolderCase):
    binary = True


class S3PrefixCase(Case):
    def location(self, run: str) -> str:
        bucket = getattr(self, "bucket", None)
        if bucket is None:
            boto3 = pytest.importorskip("boto3")
            client = boto3.client("s3", endpoint_url=MOTO_ENDPOINT, aws_access_key_id="testing",
                                  aws_secret_access_key="testing", region_name="us-east-1")
            bucket = self.bucket = f"contract-{uuid.uuid4().hex[:8]}"
            try:
                client.create_bucket(Bucket=bucket)
            except Exception as e:  # noqa: BLE001
                service_unavailable(f"moto server at {MOTO_ENDPOINT} is not reachable ({e}); "
                                    "run `bash scripts/services.sh start`")
        return f"s3://{bucket}/{run}/"

    def node(self, ssc: StreamingContext, location: str) -> InputNode:
        node = ssc.textFileStream(location, **MOTO_OPTS)._node
        node.start()
        return node

    def feed(self, node: InputNode, location: str, batch: int) -> None:
        store = open_store(location, **MOTO_OPTS)
        for j in range(3):
            store.put(f"b{batch}-{j}.txt", f"{batch}{j}a\n{batch}{j}b\n".encode())

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        fail_once(monkeypatch, node.graph.sc, "parallelize")


class SocketCase(Case):
    """The socket source with a write-ahead log. Its receiver is not started: the test hands lines over the
    way the receiving thread does (under the node's lock)."""

    def location(self, run: str) -> str:
        return f"memory://contract-wal-{uuid.uuid4().hex[:8]}"

    def node(self, ssc: StreamingContext, location: str) -> InputNode:
        node = ssc.socketTextStream("127.0.0.1", 9)._node
        ssc._graph._services = GraphServices(None, StoreWriteAheadLog(open_store(location)))  # type: ignore[arg-type]
        return node

    def feed(self, node: InputNode, location: str, batch: int) -> None:
        with node._lock:
            node._buffer.extend(f"{batch}-{j}" for j in range(4))

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        fail_once(monkeypatch, node.graph.sc, "parallelize")  # after the lines were written to the WAL

    def break_replaying(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        fail_once(monkeypatch, node.graph.wal, "read")


class SocketWalWriteCase(SocketCase):
    """The write-ahead log's write fails (the checkpoint store is down)."""

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        fail_once(monkeypatch, node.graph.wal, "write")


class GeneratorCase(Case):
    def location(self, run: str) -> None:
        return None

    def node(self, ssc: StreamingContext, location: None) -> InputNode:
        return ssc.generatorStream(5, 2, seed=7)._node

    def feed(self, node: InputNode, location: None, batch: int) -> None:
        pass

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        node._base = None  # the partitions RDD is built again: that call fails
        fail_once(monkeypatch, node.graph.sc, "parallelize")

    def break_replaying(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        self.break_fixing(monkeypatch, node)


class QueueCase(Case):
    """``queueStream(oneAtATime=False)``: the batch is the union of what is queued; the union fails once."""

    replayable = False

    def location(self, run: str) -> None:
        return None

    def node(self, ssc: StreamingContext, location: None) -> InputNode:
        return ssc.queueStream([], oneAtATime=False)._node

    def feed(self, node: InputNode, location: None, batch: int) -> None:
        for j in range(2):
            node.queue.append(self.sc.parallelize([f"{batch}-{j}-{k}" for k in range(3)], 1))

    def break_fixing(self, monkeypatch: pytest.MonkeyPatch, node: InputNode) -> None:
        fail_once(monkeypatch, node.graph.sc, "union")


CASES: dict[str, type[Case]] = {
    "redis": RedisCase,
    "text-folder": FolderCase,
    "binary-folder": BinaryFolderCase,
    "s3-prefix": S3PrefixCase,
    "socket-wal": SocketCase,
    "socket-wal-write": SocketWalWriteCase,
    "generator": GeneratorCase,
    "queue": QueueCase,
}
MARKS = {"redis": [pytest.mark.redis], "s3-prefix": [pytest.mark.s3]}


@pytest.fixture
def contexts(sc: Any) -> Iterator[Callable[[], StreamingContext]]:
    """New (never started) StreamingContexts, one per run."""
    made: list[StreamingContext] = []

    def make() -> StreamingContext:
        made.append(StreamingContext(sc, 1))
        return made[-1]

    yield make


def _batches(case: Case, node: InputNode, location: Any, feed: bool,
             fault: Callable[[pytest.MonkeyPatch, InputNode], None] | None) -> tuple[list[list[Any]], dict[int, Any]]:
    """Each batch's records (``compute`` called again after the injected fault) and recorded offsets."""
    out, offsets = [], {}
    for i in range(1, BATCHES + 1):
        t = BatchTime(i * 1000)
        if feed:
            case.feed(node, location, i)
        if fault is not None:
            with pytest.MonkeyPatch.context() as mp:
                fault(mp, node)
                with pytest.raises(Exception) as failed:  # the injected fault, however wrapped
                    node.compute(t)
                assert "injected" in str(failed.value) or "injected" in str(failed.value.__cause__), failed.value
        rdd = node.compute(t)
        assert rdd is not None
        out.append(case.records(rdd.collect(), location))
        offsets[t.ms] = node.offsets_at(t)
    return out, offsets


@pytest.mark.slow
@pytest.mark.parametrize("kind", [pytest.param(k, marks=MARKS.get(k, [])) for k in CASES])
def test_a_fault_half_way_through_a_batch_leaves_the_source_as_it_was(kind, sc, tmp_path, request, contexts):
    case = CASES[kind](sc, tmp_path, request)
    clean_at, faulty_at = case.location("clean"), case.location("faulty")
    clean, recorded = _batches(case, case.node(contexts(), clean_at), clean_at, True, None)
    assert all(clean), f"the fault-free run has an empty batch: {clean}"
    faulty, _ = _batches(case, case.node(contexts(), faulty_at), faulty_at, True, case.break_fixing)
    assert faulty == clean, "a batch fixed again after a fault half-way through holds other records"
    if case.replayable:
        node = case.node(contexts(), clean_at)  # a restarted driver over the fault-free run's input
        node.replay_from(recorded)
        replayed, _ = _batches(case, node, clean_at, False, case.break_replaying)
        assert replayed == clean, "a recorded batch rebuilt again after a fault holds other records"
