"""Speculation and retries cannot fork state (issue 42, item 3): two attempts of one state partition and batch.

Structured Streaming had to give every state version a unique id (its checkpoint format v2, SPARK-49374) because a
rerun applied a changelog on the wrong snapshot. Here a batch's task on a state partition (:mod:`dstreams.nodes.
store_state`) checks that its host's store is at the version the batch builds on, *of this driver run and history*
(the batches dropped at or before it, :mod:`dstreams.state_lineage`), catches up from the changelog
(``changelogs/<node>/<version>/<vid>-p<partition>``, written before the store commits, ``vid`` naming the run and the
history) when it is not, and applies; a store of this run and history at or past the batch says "applied already".
So two attempts can only write one history if every ``(vid, version)`` a store or the changelog holds has one content.

These tests call the engine's own task functions (the closures ``compute`` and ``checkpoint_data.export`` hand to Spark,
captured in this process) as *attempts on hosts*: each host is its own local folder of stores, and the attempts are
interleaved at the dangerous points through the changelog they write (an attempt held just before or just after its
changelog write, or failing after it):

* both attempts apply, one writes its changelog and commits, then the other (on a host without the store, which
  catches up from the changelog first);
* a slow attempt (a zombie) writes its changelog and commits after the next batch was applied on another host;
* an attempt fails between its changelog write and its commit; the retry runs on another host;
* two attempts of one checkpoint part (a snapshot, then a delta) on a host that applied the batches and one that
  caught up: identical bytes (the manifest names one attempt's checksum, and the other may write last).

After each, every host's store, the changelog and a fresh host caught up from it hold the model's state (the
running counts computed from the input alone). The process-level run with real speculation on a cluster of hosts is
``tests/fault/test_elastic.py::test_speculation_and_executors_joining_and_lost_mid_stream_keep_one_history`` (one
cluster run for speculation and for executors that come and go).

And a batch whose input was dropped (``spark.dstreams.batch.onFailure=dropInput``), which is applied again as the
same version: a store on another host that applied it before the drop holds another history of that version (it is
caught up, not built on), and a zombie attempt of it from before the drop writes its changelog under the id of its own
history, beside the redo's, so a host catching up reads the redo's (found here as a fork, fixed by the lineage).
"""

from __future__ import annotations

import collections
import contextlib
import operator
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.nodes import store_state
from dstreams.nodes.store_state import ExecutorStore
from dstreams.recovery.codec import encode_partition
from dstreams.state_lineage import EMPTY
from dstreams.statestore import DELTA, FILE_SNAPSHOT, PART_HEADER, PartitionStore, StateStoreError, file_rows
from dstreams.time import BatchTime

pytestmark = pytest.mark.slow  # each test runs a few Spark jobs (the batches' input): 5-30 s on a loaded machine

PARTITIONS = 2
WAIT_S = 60.0  # bound of every wait on another attempt's thread


def words(seed: int, t: int, partition: int, n: int) -> list[str]:
    """Deterministic words of one generator partition of the batch at ``t`` ms (keys come back batch after batch)."""
    return [f"w{(t // 1000 * 5 + partition * 3 + i * i) % 11}" for i in range(n)]


def _summed(pairs: list[tuple[Any, int]]) -> dict[Any, int]:
    """Per key, the sum of its counts (a partition of the pre-combined batch may hold a key once per map task)."""
    total: collections.Counter[Any] = collections.Counter()
    for k, n in pairs:
        total[k] += n
    return dict(total)


class _HeldChangelog:
    """The stream's real changelog, with a hook around each write: ``hold[(version, host)]`` is an event the
    writing attempt waits for before it writes (``after=False``) or after (``after=True``); ``fail`` makes the
    attempts of a version raise after their write (a task that dies between its changelog write and its commit)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.hold: dict[tuple[int, str], tuple[threading.Event, threading.Event, bool]] = {}
        self.fail: set[int] = set()
        self.writes: list[tuple[int, int, str]] = []

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (the engine pickles a persisted RDD's function at once): the plain changelog, without the hooks."""
        return (_identity, (self.inner,))

    def write(self, run: str, version: int, partition: int, entries: list[tuple[bytes, bytes | None]]) -> None:
        host = os.path.basename(_current_host.get(threading.get_ident(), "?"))
        held = self.hold.get((version, host))
        if held is not None and not held[2]:
            held[0].set()
            assert held[1].wait(WAIT_S), "the held attempt was never released"
        self.inner.write(run, version, partition, entries)
        self.writes.append((version, partition, host))
        if held is not None and held[2]:
            held[0].set()
            assert held[1].wait(WAIT_S), "the held attempt was never released"
        if version in self.fail:
            raise OSError(f"injected: the task dies after writing the changelog of {version}, before its commit")

    def read(self, run: str, version: int, partition: int) -> list[tuple[bytes, bytes | None]]:
        return self.inner.read(run, version, partition)

    def checkpoint_state(self, time_ms: int, partition: int) -> Any:
        return self.inner.checkpoint_state(time_ms, partition)


def _identity(x: Any) -> Any:
    return x


#: thread id -> the host folder the attempt on that thread runs on (for the changelog hook's bookkeeping).
_current_host: dict[int, str] = {}


class Stream:
    """A store-backed ``runningReduce`` (2 partitions, changelog on) on the session's ``local[2]`` context, started on
    a ManualClock that never moves: its batches are applied only by :meth:`attempt`, in this process."""

    def __init__(self, sc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("DSTREAMS_STATE_STORE", "executor")
        monkeypatch.setenv("DSTREAMS_STATE_CHANGELOG", "on")
        monkeypatch.delenv("DSTREAMS_STATE_LOCAL_DIR", raising=False)
        self.tmp = tmp_path
        self.ssc = StreamingContext(sc, 1, clock=ManualClock())
        self.ssc.checkpoint(str(tmp_path / "ckpt"))
        pairs = self.ssc.generatorStream(6, 2, seed=1, recordFunc=words).map(lambda w: (w, 1))
        pairs.runningReduce(operator.add, PARTITIONS).foreachRDD(lambda rdd: None)
        self.ssc.start()
        (self.node,) = [n for n in self.ssc._graph.nodes
                       if isinstance(getattr(n, "backend", None), ExecutorStore)]
        self.changelog = _HeldChangelog(self.node.backend.state_changelog())
        self.node.backend._changelog = self.changelog  # what the task closures built from now on write through
        self.inputs: dict[int, list[dict[Any, int]]] = {}  # batch -> per partition, the batch's counts per key
        self.dropped: set[int] = set()
        self._batch_rdd: Any = None  # the batch's records RDD of the last task function captured

    def close(self) -> None:
        self.ssc.stop(stopSparkContext=False)

    def host(self, name: str) -> Path:
        path = self.tmp / "hosts" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ------------------------------------------------------------------ the engine's task functions
    def _captured(self, build: Callable[[], Any]) -> Callable[..., Any]:
        """The function the engine hands to ``segmented_merge`` while ``build`` runs (the last one: the batch's)."""
        seen: list[Callable[..., Any]] = []
        original = store_state.segmented_merge

        def capture(sc: Any, groups: Any, partitioner: Any, merge: Callable[..., Any], with_index: bool = False) -> Any:
            seen.append(merge)
            if groups[1:] and groups[1][0] is not None:
                self._batch_rdd = groups[1][0]
            return original(sc, groups, partitioner, merge, with_index)

        store_state.segmented_merge = capture  # type: ignore[assignment]
        try:
            self._batch_rdd = None
            build()
        finally:
            store_state.segmented_merge = original  # type: ignore[assignment]
        assert seen, "the state node built no batch (segmented_merge not called)"
        return seen[-1]

    def task(self, t: int, host: str, drop: bool = False) -> Callable[[int], list[int]]:
        """Batch ``t``'s task function as the engine builds it for a task on ``host`` (``drop``: the batch's input
        dropped, as ``spark.dstreams.batch.onFailure=dropInput`` does after it failed): ``run(partition)``."""
        folder = str(self.host(host))
        self.node.backend.local_dir = folder  # captured by the closure, as the executor's folder would be
        if drop:
            graph = self.ssc._graph
            apply = self._captured(lambda: graph.drop_input(BatchTime(t), []))
            self.dropped.add(t)
        else:
            apply = self._captured(lambda: self.node.compute(BatchTime(t)))
        batch = self._batch_rdd
        assert batch is not None
        parts = batch.glom().collect()  # the batch's records per partition (stateless: no store is touched)
        self.inputs[t] = [_summed(p) for p in parts]
        base = self.base(t)

        def run(partition: int) -> list[int]:
            _current_host[threading.get_ident()] = folder
            return list(apply(partition, [[base], parts[partition]]))

        return run

    def base(self, t: int) -> int:
        """The version batch ``t`` builds on (every batch of this source has records)."""
        return t - 1000

    def apply(self, t: int, host: str, partitions: range = range(PARTITIONS)) -> None:
        run = self.task(t, host)
        for p in partitions:
            assert run(p) == [t]

    def export(self, t: int, host: str) -> Callable[[int], list[Any]]:
        """The checkpoint of ``t``'s task function (:meth:`StoreCheckpointData.export`) on ``host``."""
        self.node.backend.local_dir = str(self.host(host))
        captured: list[Callable[..., Any]] = []

        class Handle:
            def mapPartitionsWithIndex(self, f: Callable[..., Any]) -> None:  # noqa: N802 - the RDD method's name
                captured.append(f)

        self.node.checkpoint_data.export(t, Handle())
        (f,) = captured
        return lambda partition: list(f(partition, iter([t])))

    # ------------------------------------------------------------------ what the state must be
    def model(self, version: int, partition: int) -> dict[Any, int]:
        """The running counts of ``partition`` through ``version``, from the batches' input alone."""
        total: collections.Counter[Any] = collections.Counter()
        for t, parts in self.inputs.items():
            if t <= version and t not in self.dropped:
                total.update(parts[partition])
        return dict(total)

    def changed(self, version: int, partition: int) -> dict[Any, int]:
        """What batch ``version`` changed in ``partition``, per the model."""
        after = self.model(version, partition)
        return {k: after[k] for k in (self.inputs[version][partition] if version not in self.dropped else ())}

    def store(self, host: str, partition: int) -> tuple[int | None, str | None, dict[Any, Any]]:
        """(version, run, state) of ``host``'s store of ``partition``."""
        return self.store_and_vid(host, partition)[:3]

    def store_and_vid(self, host: str, partition: int) -> tuple[int | None, str | None, dict[Any, Any], str | None]:
        """(version, run, state, the id of its version's history) of ``host``'s store of ``partition``."""
        store = PartitionStore.open(str(self.host(host)), self.node.backend.store_id(), partition)
        try:
            run, version = store.run, store.version
            vid = None if run is None or version is None else store.lineage.vid(run, version)
            return version, run, {pickle.loads(k): pickle.loads(v) for k, v in store.items()}, vid
        finally:
            store.close()

    def vid(self, version: int) -> str:
        """The id of ``version`` in the stream's history (the batches dropped so far at or before it)."""
        return EMPTY.with_drops(self.dropped).vid(self.node.backend._run, version)

    def changelog_entries(self, version: int, partition: int) -> dict[Any, Any]:
        entries = self.changelog.inner.read(self.vid(version), version, partition)
        return {pickle.loads(k): None if v is None else pickle.loads(v) for k, v in entries}

    def changelog_objects(self) -> list[str]:
        from dstreams.recovery.store import open_store

        return sorted(open_store(str(self.tmp / "ckpt")).list(f"changelogs/{self.node.key}/"))

    def assert_one_history(self, version: int, hosts: list[str]) -> None:
        """One history through ``version``: every ``host``'s store is at a version of this run and history at or before
        ``version`` that the stream applied and holds the model's state at it; the changelog object of every batch and
        partition through ``version`` in the stream's history is the model's change of its batch, and every other
        object is of this run and of another history of a version at or after a dropped batch (an attempt from before
        the drop: never read); and a fresh host brought to ``version`` from the checkpoint and the changelog (the
        state's view task on it) reads the model's state."""
        for host in hosts:
            for p in range(PARTITIONS):
                at, run, state, vid = self.store_and_vid(host, p)
                assert at in self.inputs and at <= version and run == self.node.backend._run, (host, p, at, run)
                assert vid == self.vid(at), (host, p, at, vid)
                assert state == self.model(at, p), (host, p, at)
        for t in sorted(self.inputs):
            if t <= version:
                for p in range(PARTITIONS):
                    assert self.changelog_entries(t, p) == self.changed(t, p), (t, p)
        fresh = f"fresh-{version}"
        read = self.view(version, fresh)
        for p in range(PARTITIONS):
            assert read(p) == self.model(version, p), (fresh, p)
        root = f"changelogs/{self.node.key}/"
        names = {n[len(root):] for n in self.changelog_objects()}
        ours = {f"{t:015d}/{self.vid(t)}-p{p:05d}" for t in self.inputs if t <= version for p in range(PARTITIONS)}
        assert ours <= names, sorted(ours - names)
        for name in names - ours:
            t = int(name.split("/")[0])
            assert name.split("/")[1].startswith(self.node.backend._run), name  # one run
            assert t > version or any(d <= t for d in self.dropped), name  # another history: from before a drop

    def view(self, version: int, host: str) -> Callable[[int], dict[Any, Any]]:
        """The whole state at ``version`` as the view's task on ``host`` reads it (catching up where needed)."""
        self.node.backend.local_dir = str(self.host(host))
        handle = self.node.get_or_compute(BatchTime(version))
        captured: list[Callable[..., Any]] = []
        original = handle.mapPartitionsWithIndex

        def capture(f: Callable[..., Any], preservesPartitioning: bool = False) -> Any:  # noqa: N803 - PySpark's
            captured.append(f)
            return original(f, preservesPartitioning)

        handle.mapPartitionsWithIndex = capture
        try:
            self.node.backend.view(BatchTime(version))
        finally:
            del handle.mapPartitionsWithIndex
        (f,) = captured
        return lambda p: dict(f(p, iter([version])))


@pytest.fixture
def stream(sc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stream]:
    s = Stream(sc, tmp_path, monkeypatch)
    try:
        yield s
    finally:
        s.close()


@contextlib.contextmanager
def attempt_in_thread(run: Callable[[int], list[int]], partition: int) -> Iterator[dict[str, Any]]:
    """``run(partition)`` on its own thread (an attempt on another executor); its result or error in the dict, joined
    (bounded) when the block ends."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = run(partition)
        except BaseException as e:  # noqa: BLE001 - checked by the test
            result["error"] = e

    thread = threading.Thread(target=target, name=f"attempt-p{partition}", daemon=True)
    thread.start()
    try:
        yield result
    finally:
        thread.join(WAIT_S)
        assert not thread.is_alive(), "an attempt did not end"


def _hold(stream: Stream, version: int, host: str, after: bool) -> tuple[threading.Event, threading.Event]:
    reached, release = threading.Event(), threading.Event()
    stream.changelog.hold[(version, host)] = (reached, release, after)
    return reached, release


# ---------------------------------------------------------------------------------------------- attempts racing
@pytest.mark.parametrize("after", [False, True], ids=["held-before-its-changelog", "held-after-its-changelog"])
def test_two_attempts_that_both_apply_and_commit_keep_one_history(stream, after):
    """Batch 3's attempt on host A (the partition's store there) applies and is held at its changelog write; a
    speculative copy on host B (no store: it catches up from the changelog) applies, writes the changelog and
    commits; then A's attempt writes and commits too. Both stores, the changelog and a fresh host agree with the
    model, and later batches on either host build on the same state."""
    stream.apply(1000, "a")
    stream.apply(2000, "a")
    original, copy = stream.task(3000, "a"), stream.task(3000, "b")
    reached, release = _hold(stream, 3000, "a", after)
    with attempt_in_thread(original, 0) as first:
        assert reached.wait(WAIT_S), "the original attempt never reached its changelog write"
        assert copy(0) == [3000]  # the speculative copy wins the race
        assert stream.store("a", 0)[0] == 2000  # the original has not committed (its transaction is open)
        release.set()
    assert first == {"value": [3000]}, first
    assert copy(1) == [3000] and original(1) == [3000]  # partition 1: the copy first, the original finds it applied
    assert stream.node.store_metrics()["caught_up"] >= 1  # B caught up from the changelog
    stream.assert_one_history(3000, ["a", "b"])
    stream.apply(4000, "b")
    stream.apply(5000, "a")  # A is at 3000 of this run: it applies 4000 from the changelog, then 5000
    stream.apply(6000, "b")
    stream.assert_one_history(6000, ["a", "b"])
    assert [stream.store(h, 0)[0] for h in ("a", "b")] == [5000, 6000]


def test_two_attempts_on_one_host_serialise_on_the_stores_lock_and_the_second_finds_it_applied(stream):
    """A retry or a recomputation on the same host as an attempt still inside its transaction (held after its
    changelog write) waits on the store's write lock; once the first commits, the second says "applied already" and
    writes nothing (its changelog write is never reached)."""
    stream.apply(1000, "a")
    first, second = stream.task(2000, "a"), stream.task(2000, "a")
    reached, release = _hold(stream, 2000, "a", after=True)
    with attempt_in_thread(first, 0) as done_first:
        assert reached.wait(WAIT_S)
        with attempt_in_thread(second, 0) as done_second:
            time.sleep(1.0)  # a bounded look: the second attempt must still be waiting on the lock
            assert done_second == {}, done_second
            writes = len(stream.changelog.writes)
            release.set()
    assert done_first == {"value": [2000]} and done_second == {"value": [2000]}, (done_first, done_second)
    assert len(stream.changelog.writes) == writes  # the second attempt applied nothing
    assert stream.task(2000, "a")(1) == [2000]
    stream.assert_one_history(2000, ["a"])


def test_a_zombie_attempt_that_commits_after_later_batches_elsewhere_keeps_one_history(stream):
    """Batch 3's attempt on host A stalls before its changelog write (a frozen executor); the batch completes on
    host B and batch 4 runs there; then the zombie wakes up, writes batch 3's changelog again and commits its store
    at 3. A later batch on A brings it from 3 to 4 through the changelog: one history everywhere."""
    stream.apply(1000, "a")
    stream.apply(2000, "a")
    zombie = stream.task(3000, "a")
    reached, release = _hold(stream, 3000, "a", after=False)
    with attempt_in_thread(zombie, 0) as woke:
        assert reached.wait(WAIT_S)
        stream.apply(3000, "b")
        stream.apply(4000, "b")
        release.set()
    assert woke == {"value": [3000]}, woke
    assert stream.store("a", 0)[0] == 3000  # the zombie committed, behind the stream
    stream.assert_one_history(4000, ["b"])
    assert stream.task(4000, "a")(1) == [4000]  # partition 1 on A: 2000 -> 4000 through the changelog
    stream.apply(5000, "a")  # partition 0: 3000 (the zombie's) -> 4000 from the changelog -> 5000
    stream.assert_one_history(5000, ["a", "b"])


def test_an_attempt_that_dies_between_its_changelog_and_its_commit_leaves_no_version(stream):
    """Batch 3's attempt on A writes its changelog and fails before its store commits (a task killed there): A's
    store stays at 2; the retry on B catches up and applies 3 (same changelog object, same content); a later batch
    on A catches up from 2."""
    stream.apply(1000, "a")
    stream.apply(2000, "a")
    failing = stream.task(3000, "a")
    stream.changelog.fail.add(3000)
    with pytest.raises(OSError, match="injected"):
        failing(0)
    stream.changelog.fail.clear()
    assert stream.store("a", 0)[0] == 2000  # rolled back with its transaction
    assert stream.changelog_entries(3000, 0) == stream.changed(3000, 0)  # what the dead attempt wrote
    stream.apply(3000, "b")
    stream.apply(4000, "a")
    stream.assert_one_history(4000, ["a", "b"])
    assert [stream.store(h, 0)[0] for h in ("a", "b")] == [4000, 3000]


@pytest.mark.parametrize("kind", ["snapshot", "delta"])
def test_two_attempts_of_a_checkpoint_part_write_the_same_bytes(stream, kind):
    """The checkpoint of batch 4 is written by a task per partition; a speculative copy writes the same object key,
    and the manifest names the checksum of whichever attempt Spark took. So the attempt on host A (which applied every
    batch) and the one on host C (no store: it catches up from the changelog first) must write identical bytes, a
    snapshot (the store file as of 4) or a delta (the changes since the checkpoint at 2), and both the model."""
    for t in range(1000, 5000, 1000):
        stream.apply(t, "a")
    if kind == "delta":
        stream.node.backend._chain = [2000]  # as the adoption of a committed checkpoint at 2000 leaves it
    parts = {host: [stream.export(4000, host)(p) for p in range(PARTITIONS)] for host in ("a", "c")}
    for p in range(PARTITIONS):
        a, c = parts["a"][p], parts["c"][p]
        assert a[0] == c[0] and a[0][:2] == (PART_HEADER, FILE_SNAPSHOT if kind == "snapshot" else DELTA), a[0]
        assert encode_partition(a)[1] == encode_partition(c)[1], f"partition {p}: two attempts, two checksums"
        if kind == "snapshot":
            path = stream.tmp / f"part-{p}.sqlite"
            path.write_bytes(a[0][3])
            state = {pickle.loads(k): pickle.loads(v) for k, v in file_rows(str(path))}
            assert state == stream.model(4000, p)
        else:
            before, after = stream.model(2000, p), stream.model(4000, p)
            assert {pickle.loads(k): pickle.loads(v) for k, v in a[1:]} == {
                k: v for k, v in after.items() if before.get(k) != v}


# ---------------------------------------------------------------------------------------------- dropped input
def test_a_dropped_batch_redone_on_another_host_leaves_no_stale_store_behind(stream):
    """Batch 3 applies on host B (with its records), then fails on an output and its input is dropped; the redo
    (no records) runs on host A. Batch 4's task then runs on B: B's store must not build on its pre-drop batch 3 (it
    holds batch 3 of another history: it catches up from the changelog first)."""
    stream.apply(1000, "a")
    stream.apply(2000, "a")
    stream.apply(3000, "b")
    redo = stream.task(3000, "a", drop=True)
    assert [redo(p) for p in range(PARTITIONS)] == [[3000]] * PARTITIONS
    caught_up = stream.node.store_metrics()["caught_up"]
    stream.apply(4000, "b")
    assert stream.node.store_metrics()["caught_up"] == caught_up + PARTITIONS
    stream.assert_one_history(4000, ["a", "b"])


def test_a_zombie_from_before_a_drop_cannot_overwrite_the_redos_changelog(stream):
    """Batch 3's attempt on host B (with its records) stalls before its changelog write; the batch fails, its input
    is dropped and the redo commits on host A; then the zombie wakes up and writes batch 3's changelog. A fresh host
    catching up must read the redo's change, not the zombie's (written under the id of its own history)."""
    stream.apply(1000, "a")
    stream.apply(2000, "a")
    zombie = stream.task(3000, "b")
    reached, release = _hold(stream, 3000, "b", after=False)
    with attempt_in_thread(zombie, 0) as woke:
        assert reached.wait(WAIT_S)
        redo = stream.task(3000, "a", drop=True)
        assert [redo(p) for p in range(PARTITIONS)] == [[3000]] * PARTITIONS
        release.set()
    assert woke == {"value": [3000]}, woke
    assert (3000, 0, "b") in stream.changelog.writes  # the zombie wrote its changelog object, after the redo's
    stream.apply(4000, "a")
    stream.assert_one_history(4000, ["a"])


def test_the_harness_sees_a_store_that_disagrees_with_the_model(stream):
    """The comparison can fail: one value of a store changed behind the engine's back is caught by
    :meth:`Stream.assert_one_history`; and a task on a host without the store and without a changelog to catch up
    from refuses the batch."""
    stream.apply(1000, "a")
    store = PartitionStore.open(str(stream.host("a")), stream.node.backend.store_id(), 0)
    try:
        with store.transaction():
            kb, vb = next(store.items())
            store.write_many(1000, {kb: pickle.dumps(pickle.loads(vb) + 1)}, {kb: vb}, log=False)
    finally:
        store.close()
    with pytest.raises(AssertionError):
        stream.assert_one_history(1000, ["a"])
    stream.node.backend._changelog = None  # no changelog: nothing to catch up from
    with pytest.raises(StateStoreError, match="cannot be applied"):
        stream.task(2000, "d")(0)
