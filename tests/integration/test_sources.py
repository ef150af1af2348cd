"""Sources: queue, text and binary files in a folder, TCP socket, deterministic generator."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from dstreams.testing import collect, manual_context, run_batches


def test_queue_stream_all_at_once_and_default(sc):
    with manual_context(1, sc=sc) as ssc:
        got = {"all": collect(ssc.queueStream([[1], [2, 3]], oneAtATime=False), sort=True),
               "default": collect(ssc.queueStream([[7]], default=[0]), sort=True)}
        ssc.start()
        run_batches(ssc, 2, timeout=120)
    assert got == {"all": {1000: [1, 2, 3], 2000: []}, "default": {1000: [7], 2000: [0]}}


def test_text_file_stream_each_new_file_in_exactly_one_batch(sc, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "old.txt").write_text("ignored\n")
    def put(name, text):
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / name)  # appear atomically

    with manual_context(1, sc=sc) as ssc:
        got = collect(ssc.textFileStream(str(folder)), sort=True)
        ssc.start()
        put("a.txt", "a1\na2\n")
        run_batches(ssc, 2, timeout=120)
        put("b.txt", "b1\n")
        put("c.txt", "c1\nc2\n")
        (folder / "_partial").write_text("skipped\n")
        run_batches(ssc, 1, timeout=120)
    assert got == {1000: ["a1", "a2"], 2000: [], 3000: ["b1", "c1", "c2"]}


def test_text_file_stream_missing_folder_is_a_clear_error(sc, tmp_path):
    with manual_context(1, sc=sc) as ssc:
        ssc.textFileStream(str(tmp_path / "nope")).pprint()
        with pytest.raises(FileNotFoundError, match="create it first"):
            ssc.start()


def test_binary_records_stream(sc, tmp_path):
    with manual_context(1, sc=sc) as ssc:
        got = collect(ssc.binaryRecordsStream(str(tmp_path), 4), sort=True)
        ssc.start()
        (tmp_path / "r.bin").write_bytes(b"aaaabbbbcccc")
        run_batches(ssc, 1, timeout=120)
    assert got == {1000: [b"aaaa", b"bbbb", b"cccc"]}


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
    try:
        with manual_context(1, sc=sc) as ssc:
            stream = ssc.socketTextStream("127.0.0.1", server.port)
            lines, count = collect(stream, sort=True), collect(stream.count())
            ssc.start()
            server.send("héllo\nworld\r\n".encode() + b"bad \xff byte\n")
            _wait_buffered(stream._node, 3)
            run_batches(ssc, 2, timeout=120)
            server.send(b"last\n")
            _wait_buffered(stream._node, 1)
            run_batches(ssc, 1, timeout=120)
            infos = ssc.batchInfos()
    finally:
        server.close()
    assert lines == {1000: ["bad \ufffd byte", "héllo", "world"], 2000: [], 3000: ["last"]}
    assert count == {1000: [3], 2000: [], 3000: [1]}
    assert [i.numRecords() for i in infos] == [3, 0, 1]


def test_socket_bad_port(sc):
    with manual_context(1, sc=sc) as ssc, pytest.raises(ValueError, match="port"):
        ssc.socketTextStream("localhost", 70000)


@pytest.mark.slow
def test_generator_stream_is_deterministic_and_sized(sc):
    outs = []
    for _ in range(2):
        with manual_context(1, sc=sc) as ssc:
            g = ssc.generatorStream(50, 3, seed=7)
            got = {"recs": collect(g, sort=True), "maxlen": collect(g.map(len).reduce(max))}
            ssc.start()
            run_batches(ssc, 2, timeout=120)
        outs.append(got)
    assert outs[0] == outs[1]
    assert [len(outs[0]["recs"][t]) for t in (1000, 2000)] == [150, 150]
    assert outs[0]["recs"][1000] != outs[0]["recs"][2000]  # batches differ
    assert outs[0]["maxlen"] == {1000: [100], 2000: [100]}


def test_generator_custom_record_func(sc):
    def records(seed, t, partition, n):
        return [(partition, t, i) for i in range(n)]

    with manual_context(1, sc=sc) as ssc:
        got = collect(ssc.generatorStream(2, 2, recordFunc=records), sort=True)
        ssc.start()
        run_batches(ssc, 1, timeout=120)
        t = ssc.startTime.ms
    assert got == {t: [(0, t, 0), (0, t, 1), (1, t, 0), (1, t, 1)]}


def test_a_backlog_of_small_files_is_read_in_few_tasks(sc, tmp_path):
    """Files that arrived together (a restart after a downtime) are spread over the default parallelism, not
    one task (and one output part) per file."""
    got: list[tuple[int, list[str]]] = []
    with manual_context(1, sc=sc) as ssc:
        ssc.textFileStream(str(tmp_path)).foreachRDD(lambda rdd: got.append((rdd.getNumPartitions(), rdd.collect())))
        ssc.start()
        for i in range(12):
            (tmp_path / f".f{i}").write_text(f"line-{i}\n")
            os.replace(tmp_path / f".f{i}", tmp_path / f"f{i:02d}.txt")
        run_batches(ssc, 1)
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
    with manual_context(1, sc=sc) as ssc:
        lines = ssc.textFileStream(str(folder), maxFilesPerBatch=1)
        got = collect(lines, sort=True)
        ssc.remember(3)
        ssc.start()
        for i in range(12):
            (folder / f"f{i:02d}.txt").write_text(f"x{i}\n")
        run_batches(ssc, 6, timeout=120)
        start = ssc.startTime.ms
        recent = [r.collect() for r in lines.slice((start + 4000) / 1000, (start + 5000) / 1000)]
        assert recent == [["x4"], ["x5"]]
        with pytest.raises(InputNotRecordedError, match="slice"):
            lines.slice(start / 1000, (start + 1000) / 1000)  # forgotten: older than the remember window
        run_batches(ssc, 1, timeout=120)
    assert got == {(i + 1) * 1000: [f"x{i}"] for i in range(7)}
