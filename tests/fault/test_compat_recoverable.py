"""pyspark's own recoverable_network_wordcount.py example, with one import changed, survives a SIGKILL.

The example ships in the pyspark wheel; the test reads it from there at run time, swaps
``from pyspark.streaming import StreamingContext`` for ``from dstreams import StreamingContext`` and
runs it as a separate driver process (``python script.py host port checkpoint output``, the master
coming from ``PYSPARK_SUBMIT_ARGS`` as for any pyspark script run outside spark-submit) against a
small TCP line server in the test. After a few batches the driver and its JVM are killed with
SIGKILL; started again on the same checkpoint, ``StreamingContext.getOrCreate`` must restore the
stream graph (the example's functions) without calling ``createContext``: "Creating new context" is
not printed and the output file, which the example deletes only when it creates a new context,
keeps its lines, while new counts are appended to it.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pyspark
import pytest

from ..process_support import kill_group, tail, wait_for

EXAMPLE = Path(pyspark.__file__).parent / "examples/src/main/python/streaming/recoverable_network_wordcount.py"
PYSPARK_IMPORT = "from pyspark.streaming import StreamingContext"
DSTREAMS_IMPORT = "from dstreams import StreamingContext"
CREATED = "Creating new context"
COUNTS = re.compile(r"^Counts at time (?P<time>\S+ \S+) (?P<counts>\[.*\])$")
WAIT_S = 240  # a driver and its JVM start in ~10-20 s when quiet; the machine may be shared
_FAULT_ENV = ("DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER")

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.timeout(2 * WAIT_S + 150)]


class LineServer:
    """A TCP server that sends ``self.line`` to every connected client every ``interval`` seconds."""

    def __init__(self, line: str, interval: float = 0.3) -> None:
        self.line = line
        self.interval = interval
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._accepter = threading.Thread(target=self._accept, name="line-server-accept", daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._send, args=(conn,), name="line-server-send", daemon=True)
            with self._lock:
                self.connections += 1
                self._conns.append(conn)
                self._threads.append(thread)
            thread.start()

    def _send(self, conn: socket.socket) -> None:
        try:
            while not self._stop.wait(self.interval):
                conn.sendall((self.line + "\n").encode())
        except OSError:
            pass  # the client went away (e.g. the driver was killed)
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        self._accepter.join(timeout=10)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        for thread in threads:
            thread.join(timeout=10)


def _script(tmp_path: Path) -> Path:
    assert EXAMPLE.is_file(), f"the pyspark wheel does not ship {EXAMPLE}"
    source = EXAMPLE.read_text()
    assert source.count(PYSPARK_IMPORT) == 1, "the example's import is not where the test expects it"
    script = tmp_path / "recoverable_network_wordcount.py"
    script.write_text(source.replace(PYSPARK_IMPORT, DSTREAMS_IMPORT))
    return script


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FAULT_ENV}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "spark-local").mkdir(exist_ok=True)
    env.update(
        PYSPARK_SUBMIT_ARGS="--master local[2] pyspark-shell",  # the example's SparkContext names no master
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONUNBUFFERED="1",  # "Creating new context" must reach the log before the SIGKILL
        TMPDIR=str(tmp_path / "tmp"),
        SPARK_LOCAL_DIRS=str(tmp_path / "spark-local"),
    )
    return env


def _start(args: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(cwd), start_new_session=True)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _parse(line: str) -> tuple[datetime, dict[str, int]]:
    m = COUNTS.match(line)
    assert m, f"not a counts line: {line!r}"
    return datetime.fromisoformat(m["time"]), dict(ast.literal_eval(m["counts"]))


def test_pyspark_recoverable_wordcount_resumes_after_sigkill(tmp_path):
    script = _script(tmp_path)
    env = _env(tmp_path)
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out.txt"
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    server = LineServer("a x y")  # the example drops a, b and c
    args = [sys.executable, str(script), "127.0.0.1", str(server.port), str(checkpoint), str(output)]
    try:
        first = _start(args, env, log1, tmp_path)
        try:
            def counted_before() -> bool:
                lines = [ln for ln in _lines(output) if COUNTS.match(ln)]  # a line being written may not match
                return len(lines) >= 3 and any("x" in _parse(ln)[1] for ln in lines)

            wait_for(counted_before, WAIT_S, "3 counts lines (some with data) from the first run", first, log1,
                     step=0.3)
        finally:
            kill_group(first)
        assert first.returncode == -signal.SIGKILL, tail(log1)
        before = _lines(output)
        before_text = output.read_text()

        server.line = "a x z"  # only the second run can see z: its z counts are new ones
        second = _start(args, env, log2, tmp_path)
        try:
            def counted_after() -> bool:
                lines = _lines(output)
                new = lines[len(before):] if lines[:len(before)] == before else lines
                return sum(1 for ln in new if COUNTS.match(ln) and "z" in _parse(ln)[1]) >= 3

            wait_for(counted_after, WAIT_S, "3 more counts lines (with z) after the restart", second, log2,
                     step=0.3)
        finally:
            kill_group(second)
    finally:
        server.stop()

    first_log, second_log = log1.read_text(errors="replace"), log2.read_text(errors="replace")
    assert CREATED in first_log, first_log[-6000:]
    assert CREATED not in second_log, "the restarted driver called createContext\n" + second_log[-6000:]

    # The restarted driver did not delete the output file: it starts with the lines from before the kill.
    after_text = output.read_text()
    assert after_text.startswith(before_text), (before_text[-2000:], after_text[:4000])
    after = _lines(output)
    assert after[:len(before)] == before
    new = after[len(before):]

    parsed_before = [_parse(ln) for ln in before]
    parsed_new = [_parse(ln) for ln in new]  # every appended line is a counts line
    for _, counts in parsed_before + parsed_new:
        assert "a" not in counts, counts  # the exclude list (a broadcast) still applies after the restore
        assert all(isinstance(v, int) and v > 0 for v in counts.values()), counts
    # Before the kill: "a x y" lines, so x and y are counted together.
    assert any(c for _, c in parsed_before)
    for _, counts in parsed_before:
        assert set(counts) <= {"x", "y"} and counts.get("x") == counts.get("y"), counts
    # After the restart: counting goes on with the new lines, in batches later than any before the kill.
    last_before = max(t for t, _ in parsed_before)
    z_batches = [(t, c) for t, c in parsed_new if "z" in c]
    assert len(z_batches) >= 3, new
    for t, counts in z_batches:
        assert t > last_before, (t, last_before)
        assert set(counts) == {"x", "z"} and counts["x"] == counts["z"], counts
    assert server.connections >= 2  # both drivers read from the server
