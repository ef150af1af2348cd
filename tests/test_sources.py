"""Sources: queue, text and binary files in a folder, TCP socket, deterministic generator."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from dstreams import ManualClock, StreamingContext

from .support import collector


def _start(sc):
    clock = ManualClock()
    return StreamingContext(sc, 1, clock=clock), clock


def _step(ssc, clock, i, timeout=120):
    clock.advance(1000)
    ssc.awaitBatch(ssc.startTime.ms + i * 1000, timeout)


def test_queue_stream_all_at_once_and_default(sc):
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    got: dict[str, list] = {}
    ssc.queueStream([[1], [2, 3]], oneAtATime=False).foreachRDD(collector(got, "all"))
    ssc.queueStream([[7]], default=[0]).foreachRDD(collector(got, "default"))
    ssc.start()
    try:
        for i in range(2):
            _step(ssc, clock, i)
    finally:
        ssc.stop(stopSparkContext=False)
    assert got == {"all": [[1, 2, 3], []], "default": [[7], [0]]}


def test_text_file_stream_each_new_file_in_exactly_one_batch(sc, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "old.txt").write_text("ignored\n")
    ssc, clock = _start(sc)
    got: dict[str, list] = {}
    ssc.textFileStream(str(folder)).foreachRDD(collector(got, "lines"))
    ssc.start()

    def put(name, text):
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / name)  # appear atomically

    try:
        put("a.txt", "a1\na2\n")
        _step(ssc, clock, 0)
        _step(ssc, clock, 1)
        put("b.txt", "b1\n")
        put("c.txt", "c1\nc2\n")
        (folder / "_partial").write_text("skipped\n")
        _step(ssc, clock, 2)
    finally:
        ssc.stop(stopSparkContext=False)
    assert got["lines"] == [["a1", "a2"], [], ["b1", "c1", "c2"]]


def test_text_file_stream_missing_folder_is_a_clear_error(sc, tmp_path):
    ssc, clock = _start(sc)
    ssc.textFileStream(str(tmp_path / "nope")).pprint()
    with pytest.raises(FileNotFoundError, match="create it first"):
        ssc.start()
    ssc.stop(stopSparkContext=False)


def test_binary_records_stream(sc, tmp_path):
    ssc, clock = _start(sc)
    got: dict[str, list] = {}
    ssc.binaryRecordsStream(str(tmp_path), 4).foreachRDD(collector(got, "recs"))
    ssc.start()
    try:
        (tmp_path / "r.bin").write_bytes(b"aaaabbbbcccc")
        _step(ssc, clock, 0)
    finally:
        ssc.stop(stopSparkContext=False)
    assert got["recs"] == [[b"aaaa", b"bbbb", b"cccc"]]


class _LineServer:
    """A TCP server on loopback that sends what the test gives it to every client."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.conn: socket.socket | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(30)
        try:
            self.conn, _ = self.sock.accept()
            self.ready.set()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        assert self.ready.wait(30), "the socket source never connected"
        assert self.conn is not None
        self.conn.sendall(data)

    def close(self) -> None:
        if self.conn:
            self.conn.close()
        self.sock.close()
        self.thread.join(5)


def _wait_buffered(node, n, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with node._lock:
            if len(node._buffer) >= n:
                return
        time.sleep(0.01)
    raise TimeoutError(f"socket source did not receive {n} lines in {timeout} s")


def test_socket_text_stream(sc):
    server = _LineServer()
    ssc, clock = _start(sc)
    got: dict[str, list] = {}
    stream = ssc.socketTextStream("127.0.0.1", server.port)
    stream.foreachRDD(collector(got, "lines"))
    stream.count().foreachRDD(collector(got, "count"))
    ssc.start()
    try:
        server.send("héllo\nworld\r\n".encode() + b"bad \xff byte\n")
        _wait_buffered(stream._node, 3)
        _step(ssc, clock, 0)
        _step(ssc, clock, 1)
        server.send(b"last\n")
        _wait_buffered(stream._node, 1)
        _step(ssc, clock, 2)
        infos = ssc.batchInfos()
    finally:
        ssc.stop(stopSparkContext=False)
        server.close()
    assert got["lines"] == [["bad \ufffd byte", "héllo", "world"], [], ["last"]]
    assert got["count"] == [[3], [], [1]]
    assert [i.numRecords() for i in infos] == [3, 0, 1]


def test_socket_bad_port(sc):
    ssc, _ = _start(sc)
    with pytest.raises(ValueError, match="port"):
        ssc.socketTextStream("localhost", 70000)


@pytest.mark.slow
def test_generator_stream_is_deterministic_and_sized(sc):
    outs = []
    for _ in range(2):
        clock = ManualClock()
        ssc = StreamingContext(sc, 1, clock=clock)
        got: dict[str, list] = {}
        g = ssc.generatorStream(50, 3, seed=7)
        g.foreachRDD(collector(got, "recs"))
        g.map(len).reduce(max).foreachRDD(collector(got, "maxlen"))
        ssc.start()
        try:
            _step(ssc, clock, 0)
            _step(ssc, clock, 1)
        finally:
            ssc.stop(stopSparkContext=False)
        outs.append(got)
    assert outs[0] == outs[1]
    assert [len(b) for b in outs[0]["recs"]] == [150, 150]
    assert outs[0]["recs"][0] != outs[0]["recs"][1]  # batches differ
    assert outs[0]["maxlen"] == [[100], [100]]


def test_generator_custom_record_func(sc):
    def records(seed, t, partition, n):
        return [(partition, t, i) for i in range(n)]

    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    got: dict[str, list] = {}
    ssc.generatorStream(2, 2, recordFunc=records).foreachRDD(collector(got, "r"))
    ssc.start()
    try:
        _step(ssc, clock, 0)
        t = ssc.startTime.ms
    finally:
        ssc.stop(stopSparkContext=False)
    assert got["r"] == [[(0, t, 0), (0, t, 1), (1, t, 0), (1, t, 1)]]


def test_a_backlog_of_small_files_is_read_in_few_tasks(sc, tmp_path):
    """Files that arrived together (a restart after a downtime) are spread over the default parallelism, not
    one task (and one output part) per file."""
    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    got: list[tuple[int, list[str]]] = []
    ssc.textFileStream(str(tmp_path)).foreachRDD(lambda rdd: got.append((rdd.getNumPartitions(), rdd.collect())))
    ssc.start()
    try:
        for i in range(12):
            (tmp_path / f".f{i}").write_text(f"line-{i}\n")
            os.replace(tmp_path / f".f{i}", tmp_path / f"f{i:02d}.txt")
        clock.set_time(1000)
        ssc.awaitBatch(1000, 60)
    finally:
        ssc.stop(stopSparkContext=False)
    partitions, lines = got[0]
    assert partitions <= max(1, sc.defaultParallelism) and sorted(lines) == sorted(f"line-{i}" for i in range(12))


@pytest.mark.slow
def test_a_batch_sliced_again_is_rebuilt_from_its_files_and_an_old_one_takes_nothing_new(sc, tmp_path):
    """A source builds a batch it fixed again only from the offsets it had: ``slice()`` within the remember
    window returns the same files; past it, :class:`InputNotRecordedError` (never new files, which no batch
    would then deliver)."""
    from dstreams.contracts import InputNotRecordedError

    folder = tmp_path / "in"
    folder.mkdir()
    ssc, clock = _start(sc)
    got: dict[str, list] = {}
    lines = ssc.textFileStream(str(folder), maxFilesPerBatch=1)
    lines.foreachRDD(collector(got, "lines"))
    ssc.remember(3)
    ssc.start()
    try:
        for i in range(12):
            (folder / f"f{i:02d}.txt").write_text(f"x{i}\n")
        for i in range(6):
            _step(ssc, clock, i)
        start = ssc.startTime.ms
        recent = [r.collect() for r in lines.slice((start + 4000) / 1000, (start + 5000) / 1000)]
        assert recent == [["x4"], ["x5"]]
        with pytest.raises(InputNotRecordedError, match="slice"):
            lines.slice(start / 1000, (start + 1000) / 1000)  # forgotten: older than the remember window
        _step(ssc, clock, 6)
    finally:
        ssc.stop(stopSparkContext=False)
    assert got["lines"] == [[f"x{i}"] for i in range(7)]
