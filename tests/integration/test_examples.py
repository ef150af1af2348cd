"""The scripts in examples/ run, briefly, and print the right answers (issue 43, "Examples that run").

Each example runs as ``python examples/<name>.py <args>`` would, but in this process (``runpy``, as
``__main__``) on the suite's SparkContext: a JVM per example would cost 10-20 s each. For that, while an example
runs, ``pyspark.SparkContext(...)`` (what pyspark's examples call) returns the suite's context,
``StreamingContext.local`` returns it anyway (dstreams' ``create_spark_context`` reuses a running context), and
the context's ``stop()`` does nothing; ``print`` is captured (the examples print their results). A watcher thread
polls the example's output (and whatever else the test checks, e.g. the PostgreSQL table) and stops the running
StreamingContext once the test has what it needs; ``DSTREAMS_EXAMPLE_SECONDS`` / ``--seconds`` bound every run in
case it never does. One example also runs as a real subprocess (its own JVM, stopped with SIGTERM as a user's
Ctrl-C would).

The checks compare the output with a model of the input: the socket examples get known lines from a local
server on a free port; the generated-stream examples are recomputed from their own (deterministic) record
functions for the batch times they printed; the Redis and Kafka -> PostgreSQL pipelines must leave the table
equal to the totals of what the test wrote, also across a restart from their checkpoint.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import os
import random
import re
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: Upper bound of one example run (seconds): the watcher stops it much sooner once its output is right.
RUN_S = 120.0


# ---------------------------------------------------------------------------------------------- harness
class _Output(io.TextIOBase):
    """What the example prints (from any thread), readable while it runs."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self._lock:
            self._parts.append(s)
        return len(s)

    def getvalue(self) -> str:
        with self._lock:
            return "".join(self._parts)


def _shared_spark_context(sc: Any) -> type:
    """A stand-in for ``pyspark.SparkContext`` whose constructor returns the suite's context."""
    from pyspark import SparkContext

    class Shared(SparkContext):
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            return sc  # not an instance of Shared: __init__ is not called

    return Shared


def run_example(sc: Any, monkeypatch: pytest.MonkeyPatch, name: str, args: list[str], cwd: Path,
                done: Callable[[str], bool] | None = None, timeout_s: float = RUN_S,
                graceful: bool = True) -> tuple[str, dict[str, Any]]:
    """Run ``examples/<name>.py`` with ``args`` in this process; return what it printed and its globals.

    ``done(output)`` is polled by a watcher thread every 0.2 s (it may also act, e.g. write input); once it is
    true, or after ``timeout_s``, the running StreamingContext is stopped (gracefully: the batches generated so far
    run first; else the running one is cancelled), which ends the example.
    """
    import pyspark

    from dstreams import StreamingContext

    path = EXAMPLES / f"{name}.py"
    monkeypatch.setattr(pyspark, "SparkContext", _shared_spark_context(sc))
    monkeypatch.setattr(sc, "stop", lambda: None)
    monkeypatch.setattr(sys, "argv", [str(path), *args])
    monkeypatch.setenv("DSTREAMS_EXAMPLE_SECONDS", str(timeout_s))
    monkeypatch.chdir(cwd)
    out = _Output()
    real_print = builtins.print

    def capture_print(*values: object, sep: str | None = " ", end: str | None = "\n", file: Any = None,
                      flush: bool = False) -> None:
        # print() rather than sys.stdout is captured: pytest puts its own sys.stdout back whenever it suspends
        # capturing (e.g. around a live log line), from any thread, which would undo a redirect_stdout.
        if file is None or file is sys.stdout or file is sys.__stdout__:
            out.write((" " if sep is None else sep).join(map(str, values)) + ("\n" if end is None else end))
        else:
            real_print(*values, sep=sep, end=end, file=file, flush=flush)

    monkeypatch.setattr(builtins, "print", capture_print)
    finished = threading.Event()
    errors: list[BaseException] = []

    def watch() -> None:
        deadline = time.monotonic() + timeout_s + 30
        try:
            while not finished.wait(0.2) and time.monotonic() < deadline:
                if done is not None and done(out.getvalue()):
                    break
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        active = StreamingContext.getActive()
        if active is not None and not finished.is_set():
            active.stop(stopSparkContext=False, stopGraceFully=graceful)

    watcher = threading.Thread(target=watch, name=f"watch-{name}", daemon=True)
    watcher.start()
    try:
        result = runpy.run_path(str(path), run_name="__main__")
    finally:
        finished.set()
        watcher.join(60)
        active = StreamingContext.getActive()
        if active is not None:
            active.stop(stopSparkContext=False)
        monkeypatch.undo()
    if errors:
        raise errors[0]
    return out.getvalue(), result


class LineServer:
    """A TCP server on a free port of 127.0.0.1, like ``nc -lk``: client ``i`` (in the order they connect) is sent
    the lines ``per_client[i]`` as soon as it connects, and the connection is kept open."""

    def __init__(self, *per_client: list[str]) -> None:
        self._lines = list(per_client)
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.clients: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="line-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # timeout, or closed
                continue
            i = len(self.clients)
            self.clients.append(conn)
            lines = self._lines[i] if i < len(self._lines) else []
            if lines:
                conn.sendall(("\n".join(lines) + "\n").encode())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for c in [*self.clients, self._sock]:
            c.close()


@pytest.fixture
def line_server() -> Iterator[Callable[..., LineServer]]:
    servers: list[LineServer] = []

    def make(*per_client: list[str]) -> LineServer:
        servers.append(LineServer(*per_client))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def pprint_batches(out: str) -> list[list[Any]]:
    """The records of every batch that ``DStream.pprint`` printed, in order."""
    batches = []
    for block in out.split("-------------------------------------------\nTime: ")[1:]:
        records = []
        for line in block.split("-------------------------------------------\n", 1)[1].splitlines():
            if not line.strip():
                break
            records.append(ast.literal_eval(line))
        batches.append(records)
    return batches


def summed(batches: list[list[tuple[str, int]]]) -> Counter:
    total: Counter = Counter()
    for batch in batches:
        for word, n in batch:
            total[word] += n
    return total


LINES = ["hello world", "hello spark streaming", "the quick brown fox", "hello again the world"]
WORDS = Counter(w for line in LINES for w in line.split(" "))  # 9 distinct words: pprint shows them all


# ---------------------------------------------------------------------------------------------- pyspark's examples
def test_network_wordcount_counts_the_lines_a_socket_sends(sc, monkeypatch, tmp_path, line_server):
    server = line_server(LINES)
    out, _ = run_example(sc, monkeypatch, "network_wordcount", ["127.0.0.1", str(server.port)], tmp_path,
                         done=lambda o: summed(pprint_batches(o)) == WORDS)
    # The lines may straddle two batches: every word counted once in all.
    assert summed(pprint_batches(out)) == WORDS, out[-3000:]


@pytest.mark.slow
def test_stateful_network_wordcount_keeps_running_counts_from_its_initial_state(sc, monkeypatch, tmp_path,
                                                                                line_server):
    server = line_server(LINES)
    expected = sorted((WORDS + Counter({"hello": 1, "world": 1})).items())

    def done(o: str) -> bool:
        batches = pprint_batches(o)
        return bool(batches) and sorted(batches[-1]) == expected

    out, _ = run_example(sc, monkeypatch, "stateful_network_wordcount", ["127.0.0.1", str(server.port)], tmp_path,
                         done=done)
    batches = pprint_batches(out)
    assert batches and sorted(batches[-1]) == expected, out[-3000:]
    # Before the lines came, the state is the initial one; it only grows.
    assert all(dict(b).get("hello", 0) >= 1 for b in batches), out[-3000:]
    assert (tmp_path / "checkpoint").is_dir()  # pyspark's example checkpoints to ./checkpoint


@pytest.mark.slow
def test_queue_stream_counts_each_queued_rdd_and_stops_by_itself(sc, monkeypatch, tmp_path):
    out, _ = run_example(sc, monkeypatch, "queue_stream", [], tmp_path)
    batches = pprint_batches(out)
    full = [b for b in batches if b]
    assert len(full) == 5, out[-3000:]  # five queued RDDs, one per batch; the batches after them are empty
    assert all(sorted(b) == [(k, 100) for k in range(10)] for b in full), out[-3000:]


@pytest.mark.slow
def test_sql_network_wordcount_runs_a_query_on_every_batch(sc, monkeypatch, tmp_path, line_server):
    server = line_server(LINES)

    def totals(o: str) -> Counter:
        total: Counter = Counter()
        for word, n in re.findall(r"^\|\s*(\S+)\|\s*(\d+)\|$", o, re.M):  # show()'s rows: |hello|    2|
            total[word] += int(n)
        return total

    out, _ = run_example(sc, monkeypatch, "sql_network_wordcount", ["127.0.0.1", str(server.port)], tmp_path,
                         done=lambda o: totals(o) == WORDS)
    assert totals(out) == WORDS, out[-3000:]
    assert "|word|total|" in out.replace(" ", ""), out[-3000:]


@pytest.mark.slow
def test_recoverable_network_wordcount_is_restored_from_its_checkpoint(sc, monkeypatch, tmp_path, line_server):
    first = ["hello a world", "b hello"]
    second = ["world again c", "a a world"]
    server = line_server(first, second)
    output = tmp_path / "out.txt"
    args = ["127.0.0.1", str(server.port), str(tmp_path / "checkpoint"), str(output)]

    def by_time(o: str) -> dict[str, Counter]:
        """Each printed batch's counts, by batch time (a batch replayed after the restart prints the same)."""
        batches: dict[str, Counter] = {}
        for t, counts in re.findall(r"^Counts at time (\S+ \S+) (\[.*\])$", o, re.M):
            assert batches.setdefault(t, Counter(dict(ast.literal_eval(counts)))) == Counter(dict(ast.literal_eval(
                counts))), f"batch {t} printed different counts twice"
        return batches

    def total(*outputs: str) -> Counter:
        merged: dict[str, Counter] = {}
        for o in outputs:
            for t, counts in by_time(o).items():
                assert merged.setdefault(t, counts) == counts, f"batch {t} gave different counts after the restart"
        return sum(merged.values(), Counter())

    def dropped(o: str) -> int:
        found = re.findall(r"^Dropped (\d+) word\(s\) totally$", o, re.M)
        return int(found[-1]) if found else -1

    run1 = Counter({"hello": 2, "world": 1})
    out1, _ = run_example(sc, monkeypatch, "recoverable_network_wordcount", args, tmp_path,
                          done=lambda o: total(o) == run1 and dropped(o) == 2)
    assert "Creating new context" in out1, out1[-3000:]
    assert total(out1) == run1 and dropped(out1) == 2, out1[-3000:]

    # Started again: the stream comes from the checkpoint (createContext is not called) and goes on. A batch the
    # first run left pending would run again first, with the same counts (its lines are in the write-ahead log).
    both = run1 + Counter({"world": 2, "again": 1})

    def drops_by_time(o: str) -> dict[str, int]:
        """How many words each batch dropped (the accumulator's total is printed after each batch)."""
        before, drops = 0, {}
        for t, n in re.findall(r"^Counts at time (\S+ \S+) .*\nDropped (\d+) word", o, re.M):
            drops[t], before = int(n) - before, int(n)
        return drops

    def replayed(o: str) -> int:
        """The words dropped again by batches of the first run that ran again after the restart."""
        first = drops_by_time(out1)
        return sum(first.get(t, 0) for t in by_time(o))

    out2, _ = run_example(sc, monkeypatch, "recoverable_network_wordcount", args, tmp_path,
                          done=lambda o: total(out1, o) == both and dropped(o) == 3 + replayed(o))
    assert "Creating new context" not in out2, out2[-3000:]
    assert total(out1, out2) == both, out2[-3000:]
    # The accumulator is made again by the restarted driver (pyspark's singleton): it counts this run's drops.
    assert dropped(out2) == 3 + replayed(out2), out2[-3000:]
    # The output file has the lines of both runs (the first run made it; the restored one appends).
    assert total(output.read_text()) == both, output.read_text()


# ---------------------------------------------------------------------------------------------- the paper's apps
BATCH_LINE = re.compile(r"^batch (\d+) \(\d\d:\d\d:\d\d\): (.*)$", re.M)


@pytest.mark.slow
def test_page_views_running_counts_equal_the_generated_views(sc, monkeypatch, tmp_path):
    seed, rate = 13, 200
    args = ["--batch", "500ms", "--rate", str(rate), "--seed", str(seed), "--seconds", str(RUN_S)]
    out, module = run_example(sc, monkeypatch, "page_views", args, tmp_path,
                              done=lambda o: len(BATCH_LINE.findall(o)) >= 4)
    batches = [(int(ms), text) for ms, text in BATCH_LINE.findall(out)]
    assert len(batches) >= 4, out[-3000:]
    times = [ms for ms, _ in batches]
    assert times == list(range(times[0], times[-1] + 1, 500)), times  # every batch printed, in order
    model: Counter = Counter()
    for ms, text in batches:
        for p in range(module["PARTITIONS"]):
            model.update(e.url for e in module["page_views"](seed, ms, p, rate // module["PARTITIONS"]))
        total, counts = re.fullmatch(r"(\d+) views so far: (.*)", text).groups()
        assert int(total) == sum(model.values())
        assert dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in counts.split()) == dict(model), (ms, text)


@pytest.mark.slow
def test_top_k_over_a_sliding_window_equals_the_model(sc, monkeypatch, tmp_path):
    seed, rate, k = 17, 200, 3
    batch_ms, window_ms = 500, 2000
    args = ["--batch", "500ms", "--window", "2s", "--slide", "1s", "--rate", str(rate), "--k", str(k),
            "--seed", str(seed), "--seconds", str(RUN_S)]
    window_line = re.compile(r"^window to (\d+) \(\d\d:\d\d:\d\d\): (\d+) queries; top \d+: (.*)$", re.M)
    out, module = run_example(sc, monkeypatch, "top_k", args, tmp_path,
                              done=lambda o: len(window_line.findall(o)) >= 4)
    windows = window_line.findall(out)
    assert len(windows) >= 4, out[-3000:]

    def batch_terms(ms: int) -> Counter:
        parts = module["PARTITIONS"]
        return Counter(q for p in range(parts) for q in module["queries"](seed, ms, p, rate // parts))

    full = 0
    for end, total, top in windows:
        end, total = int(end), int(total)
        # The window holds the batches in (end - window, end] since the stream started: as many as total / rate.
        n = total // rate
        assert total == n * rate and 1 <= n <= window_ms // batch_ms, (end, total)
        full += n == window_ms // batch_ms
        model = sum((batch_terms(end - i * batch_ms) for i in range(n)), Counter())
        expected = sorted(model.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        assert top == " ".join(f"{t}={c}" for t, c in expected), (end, top, expected)
    assert full >= 2, out[-3000:]  # the window has slid past its first full length: the inverse was used


@pytest.mark.slow
def test_sessions_with_track_follow_the_timeout(sc, monkeypatch, tmp_path):
    seed, rate, top = 19, 100, 3
    args = ["--batch", "500ms", "--timeout", "1500ms", "--rate", str(rate), "--top", str(top), "--seed", str(seed),
            "--seconds", str(RUN_S)]
    out, module = run_example(sc, monkeypatch, "sessions", args, tmp_path,
                              done=lambda o: len(BATCH_LINE.findall(o)) >= 6)
    batches = [(int(ms), text) for ms, text in BATCH_LINE.findall(out)]
    assert len(batches) >= 6, out[-3000:]
    assert [ms for ms, _ in batches] == list(range(batches[0][0], batches[-1][0] + 1, 500))
    # The model: per user (start, end, clicks, pages, last batch with a click); dropped 1500 ms after that batch.
    state: dict[str, list[Any]] = {}
    ended = 0
    for ms, text in batches:
        parts = module["PARTITIONS"]
        for p in range(parts):
            for c in module["clicks"](seed, ms, p, rate // parts):
                s = state.get(c.user)
                if s is None:
                    state[c.user] = [c.ts, c.ts, 1, {c.page}, ms]
                else:
                    s[0], s[1], s[2], s[4] = min(s[0], c.ts), max(s[1], c.ts), s[2] + 1, ms
                    s[3].add(c.page)
        for user in [u for u, s in state.items() if ms - s[4] >= 1500]:
            del state[user]
            ended += 1
        busiest = sorted(state.items(), key=lambda kv: (-kv[1][2], kv[0]))[:top]
        expected = (f"{len(state)} live sessions; busiest: "
                    + ", ".join(f"{u} {s[2]} clicks {len(s[3])} pages {s[1] - s[0]:.1f} s" for u, s in busiest))
        assert text == expected, (ms, text, expected)
    assert ended > 0  # sessions did time out during the run


@pytest.mark.slow
def test_event_time_windows_count_every_click_once_or_list_it_as_late(sc, monkeypatch, tmp_path):
    seed, rate = 23, 100
    args = ["--batch", "500ms", "--window", "1s", "--lateness", "500ms", "--rate", str(rate), "--seed", str(seed),
            "--seconds", str(RUN_S)]
    out, module = run_example(sc, monkeypatch, "event_time", args, tmp_path,
                              done=lambda o: o.count("  window ") >= 4 and o.count("  late: ") >= 2)
    header = re.compile(r"^batch (\d+) \(\d\d:\d\d:\d\d\): watermark (.*)$")
    batches: list[int] = []
    watermarks: list[str] = []
    emitted: dict[tuple[str, str], int] = {}  # (page, "HH:MM:SS-HH:MM:SS") -> count
    late: Counter = Counter()
    for line in out.splitlines():
        if m := header.match(line):
            batches.append(int(m.group(1)))
            watermarks.append(m.group(2))
        elif line.startswith("  window "):
            bounds, *counts = line.split()[1:]
            assert watermarks[-1] != "none yet" and bounds.split("-")[1] <= watermarks[-1], line  # closed
            for kv in counts:
                page, n = kv.split("=")
                assert (page, bounds) not in emitted, line  # each window once
                emitted[(page, bounds)] = int(n)
        elif line.startswith("  late: "):
            for page, bounds, n in re.findall(r"([^\s(,]+) (\S+-\S+) x(\d+)", line):
                late[(page, bounds)] += int(n)
    assert batches == list(range(batches[0], batches[-1] + 1, 500)), batches
    known = [w for w in watermarks if w != "none yet"]
    assert known == sorted(known) and watermarks[0] == "none yet", watermarks  # never goes back
    assert len(emitted) >= 4 and late, out[-3000:]
    model: Counter = Counter()  # every click of every batch that ran, by (page, its window)
    for ms in batches:
        for p in range(module["PARTITIONS"]):
            for c in module["clicks"](seed, ms, p, rate // module["PARTITIONS"]):
                start = int(c.ts // 1)
                model[(c.page, f"{module['hms'](start)}-{module['hms'](start + 1)}")] += 1
    for key, n in emitted.items():
        # A closed window's clicks are in its count or were listed as late (arrived after it closed).
        assert n + late[key] == model[key], (key, n, late[key], model[key])
    assert set(late) <= set(model)


# ---------------------------------------------------------------------------------------------- into PostgreSQL
@pytest.fixture
def pg_schema(postgres_dsn: str) -> Iterator[str]:
    """A schema of this test's own, dropped afterwards."""
    import psycopg

    schema = f"ex_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schema
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _table_rows(dsn: str, table: str) -> dict[str, tuple[int, int]]:
    import psycopg

    with psycopg.connect(dsn, connect_timeout=10) as conn:
        if conn.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None:
            return {}
        return {c: (n, cents) for c, n, cents in conn.execute(f"SELECT customer, orders, amount_cents FROM {table}")}


def _orders(n: int, rng: random.Random) -> list[tuple[str, int]]:
    return [(rng.choice(["alice", "bob", "carol", "dave"]), rng.randrange(100, 10_000)) for _ in range(n)]


def _totals(orders: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for customer, cents in orders:
        totals[customer][0] += 1
        totals[customer][1] += cents
    return {c: (n, cents) for c, (n, cents) in totals.items()}


def test_redis_to_postgres_upserts_the_totals_exactly_once_across_a_restart(sc, monkeypatch, tmp_path, redis_client,
                                                                             redis_prefix, redis_url, postgres_dsn,
                                                                             pg_schema):
    key, table = f"{redis_prefix}orders", f"{pg_schema}.order_totals"
    rng = random.Random(29)
    args = ["--redis", redis_url, "--key", key, "--postgres", postgres_dsn, "--table", table, "--produce", "0",
            "--batch", "500ms", "--checkpoint", str(tmp_path / "checkpoint"), "--seconds", str(RUN_S)]
    written = _orders(40, rng)
    for customer, cents in written:
        redis_client.xadd(key, {"customer": customer, "amount_cents": cents})
    out1, _ = run_example(sc, monkeypatch, "redis_to_postgres", args, tmp_path,
                          done=lambda o: _table_rows(postgres_dsn, table) == _totals(written), graceful=False)
    assert _table_rows(postgres_dsn, table) == _totals(written), out1[-3000:]
    assert re.search(r"^batch \d+ .*customers updated: ", out1, re.M), out1[-3000:]

    # Stopped at once (a batch may be cut half-way: it runs again on the restart). More orders while it is down;
    # the restarted stream reads only those (a re-read would count twice), and the table ends with all of them once.
    more = _orders(25, rng)
    for customer, cents in more:
        redis_client.xadd(key, {"customer": customer, "amount_cents": cents})
    out2, _ = run_example(sc, monkeypatch, "redis_to_postgres", args, tmp_path,
                          done=lambda o: _table_rows(postgres_dsn, table) == _totals(written + more), graceful=False)
    assert _table_rows(postgres_dsn, table) == _totals(written + more), out2[-3000:]
    cents = sum(c for _, c in written + more)
    assert f"{table}: 4 customers, 65 orders, {cents / 100:.2f} in all" in out2, out2[-3000:]


def test_kafka_to_postgres_upserts_the_totals_exactly_once_across_a_restart(sc, monkeypatch, tmp_path, kafka_bootstrap,
                                                           postgres_dsn, pg_schema):
    from ..kafka_support import create_topic, produce

    topic, table = create_topic(kafka_bootstrap, partitions=2, prefix="ex"), f"{pg_schema}.order_totals"
    rng = random.Random(31)
    written = _orders(50, rng)
    produce(kafka_bootstrap, topic, [(c, json.dumps({"customer": c, "amount_cents": n})) for c, n in written])
    args = ["--kafka", kafka_bootstrap, "--topic", topic, "--postgres", postgres_dsn, "--table", table,
            "--produce", "0", "--batch", "500ms", "--checkpoint", str(tmp_path / "checkpoint"), "--seconds", str(RUN_S)]
    out1, _ = run_example(sc, monkeypatch, "kafka_to_postgres", args, tmp_path,
                          done=lambda o: _table_rows(postgres_dsn, table) == _totals(written), graceful=False)
    assert _table_rows(postgres_dsn, table) == _totals(written), out1[-3000:]

    # More orders while it is down; restarted from its checkpoint it goes on from the offsets it had reached.
    more = _orders(30, rng)
    produce(kafka_bootstrap, topic, [(c, json.dumps({"customer": c, "amount_cents": n})) for c, n in more])
    out2, _ = run_example(sc, monkeypatch, "kafka_to_postgres", args, tmp_path,
                          done=lambda o: _table_rows(postgres_dsn, table) == _totals(written + more), graceful=False)
    assert _table_rows(postgres_dsn, table) == _totals(written + more), out2[-3000:]
    cents = sum(c for _, c in written + more)
    assert f"{table}: 4 customers, 80 orders, {cents / 100:.2f} in all" in out2, out2[-3000:]


def test_direct_kafka_wordcount_counts_the_words_written_to_its_topic(sc, monkeypatch, tmp_path, kafka_bootstrap):
    """pyspark 2.4's example with only its imports changed (``from dstreams.kafka import KafkaUtils``)."""
    from ..kafka_support import create_topic, produce

    source = (EXAMPLES / "direct_kafka_wordcount.py").read_text()
    assert "from dstreams.kafka import KafkaUtils" in source and "from pyspark.streaming" not in source
    topic = create_topic(kafka_bootstrap, partitions=2, prefix="ex")
    sent = [False]

    def done(o: str) -> bool:
        # The stream starts at the latest offsets (pyspark 2.4's default): write once a batch has run.
        if "Time:" in o and not sent[0]:
            produce(kafka_bootstrap, topic, [(None, "hello kafka"), (None, "kafka kafka hello")], partition=0)
            sent[0] = True
        return summed(pprint_batches(o)) == Counter({"kafka": 3, "hello": 2})

    out, _ = run_example(sc, monkeypatch, "direct_kafka_wordcount", [kafka_bootstrap, topic], tmp_path, done=done)
    assert summed(pprint_batches(out)) == Counter({"kafka": 3, "hello": 2}), out[-3000:]


# ---------------------------------------------------------------------------------------------- a real process
@pytest.mark.slow
def test_network_wordcount_runs_as_a_script_and_stops_on_sigterm(tmp_path, line_server):
    """``python examples/network_wordcount.py HOST PORT``: its own SparkContext and JVM; SIGTERM (what Ctrl-C or a
    supervisor sends) stops it gracefully with exit code 0."""
    server = line_server(LINES)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               DSTREAMS_EXAMPLE_SECONDS=str(RUN_S))
    log_path = tmp_path / "out.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, str(EXAMPLES / "network_wordcount.py"), "127.0.0.1",
                                 str(server.port)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and summed(pprint_batches(log_path.read_text())) != WORDS:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.3)
            assert summed(pprint_batches(log_path.read_text())) == WORDS, log_path.read_text()[-3000:]
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(60) == 0, log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def test_every_example_is_tested_and_documented():
    """A new example gets a test here, and every example says at the top what it shows and how to run it."""
    tested = {"network_wordcount", "stateful_network_wordcount", "queue_stream", "sql_network_wordcount",
              "recoverable_network_wordcount", "page_views", "top_k", "sessions", "event_time", "redis_to_postgres",
              "kafka_to_postgres", "direct_kafka_wordcount", "demo"}
    scripts = {p.stem for p in EXAMPLES.glob("*.py")} - {"__init__"}
    assert scripts == tested, scripts ^ tested
    for name in scripts - {"demo"}:
        doc = ast.get_docstring(ast.parse((EXAMPLES / f"{name}.py").read_text()))
        assert doc and "python" in doc, f"examples/{name}.py: its docstring should say how to run it"
