"""The journal's commits of the metadata log's head when the generator and the runner commit at once.

The generator (event loop) adds each new batch's offsets to the head's per-batch map while the runner
prunes the same map when a batch completes. A map read before the other's commit and written after it
drops what the other wrote: a batch whose offsets are gone from the head is rebuilt from new input after a
restart (its recorded input is never delivered again), which the randomized fault schedule found as input
shifted to later batches.
"""

from __future__ import annotations

import threading
from typing import Any

from dstreams.recovery.journal import Journal
from dstreams.recovery.metadata import MetadataLog
from dstreams.recovery.store import open_store
from dstreams.time import BatchTime, Duration


class _Input:
    """An input node as the journal sees it: offsets per batch, a source state that follows them."""

    key = "input-1"

    def batch_record(self, time: BatchTime) -> Any:
        return {"until": time.ms}

    def node_state(self) -> Any:
        return {"position": self.position}

    position = 0


class _Graph:
    batch_duration = Duration(1000)

    def __init__(self) -> None:
        self.inputs = [_Input()]
        self.nodes = list(self.inputs)

    def stateful_nodes(self) -> list:
        return []

    def max_input_remember(self) -> Duration:
        return Duration(1000)

    def batch_records(self, time: BatchTime) -> Any:
        from dstreams.graph import BatchRecords

        node = self.inputs[0]
        node.position = time.ms
        return BatchRecords({node.key: node.batch_record(time)}, {node.key: node.node_state()})


def _journal(tmp_path) -> tuple[Journal, MetadataLog]:
    metadata = MetadataLog(open_store(str(tmp_path / "cp")), "journal-test", ["graph"], 1000)
    metadata.take_over(zero_ms=0)
    return Journal(metadata, _Graph()), metadata  # type: ignore[arg-type]


def test_a_batch_generated_while_another_completes_keeps_its_offsets(tmp_path):
    journal, metadata = _journal(tmp_path)
    for t in (1000, 2000, 3000):
        journal.batch_generated(BatchTime(t))
    horizon = journal._replay_horizon
    generated = threading.Thread(target=journal.batch_generated, args=(BatchTime(4000),), daemon=True)

    def generate_meanwhile(*args: Any) -> Any:
        # The runner is between reading the head's offsets and committing them: the generator records batch
        # 4000 now (an engine that reads the map outside the log's lock lets it through at once).
        if not generated.is_alive() and generated.ident is None:
            generated.start()
            generated.join(0.5)
        return horizon(*args)

    journal._replay_horizon = generate_meanwhile  # type: ignore[method-assign]
    journal.batch_completed(BatchTime(3000))
    generated.join(30)
    assert not generated.is_alive()
    head = MetadataLog.read(open_store(str(tmp_path / "cp")))
    assert head is not None
    assert "4000" in head["offsets"], "the offsets of the batch generated meanwhile were dropped from the head"
    assert head["sources"] == {"input-1": {"position": 4000}}
    assert head["completed_through"] == 3000
    # pruned: batches at or before completed - remember - 2 batches (3000 - 1000 - 2000 = 0): none here
    assert sorted(head["offsets"], key=int) == ["1000", "2000", "3000", "4000"]
    assert metadata.head["offsets"] == head["offsets"]


def test_completion_prunes_offsets_no_restart_needs(tmp_path):
    journal, _ = _journal(tmp_path)
    for t in range(1000, 8000, 1000):
        journal.batch_generated(BatchTime(t))
    journal.batch_completed(BatchTime(6000))
    head = MetadataLog.read(open_store(str(tmp_path / "cp")))
    assert head is not None
    # horizon 6000 - 1000 (remember) - 2 * 1000 = 3000: batches after it are kept, and batch 7000 (not completed)
    assert sorted(head["offsets"], key=int) == ["4000", "5000", "6000", "7000"]


def test_drops_recorded_while_batches_complete_are_kept(tmp_path):
    journal, _ = _journal(tmp_path)
    journal.batch_generated(BatchTime(1000))
    journal.batch_dropped(BatchTime(1000), "boom")
    journal.batch_dropped(BatchTime(2000), "again")
    journal.batch_completed(BatchTime(2000))
    head = MetadataLog.read(open_store(str(tmp_path / "cp")))
    assert head is not None
    assert head["dropped"] == {"1000": "boom", "2000": "again"} and head["dropped_total"] == 2


class _Stateful:
    def __init__(self, key: str, interval_ms: int) -> None:
        self.key = key
        self.checkpoint_interval = Duration(interval_ms)

    def batch_record(self, time: BatchTime) -> None:
        return None


def test_offsets_are_kept_back_to_each_streams_checkpoint_where_a_restart_resumes(tmp_path):
    """Streams checkpointed at different intervals: a restart resumes each from its newest checkpoint at or
    before the oldest of their newest ones (recovery.resume) and replays input from there, so the offsets
    after that point stay recorded."""
    journal, _ = _journal(tmp_path)
    fast, slow = _Stateful("010-Fast", 3000), _Stateful("011-Slow", 5000)
    graph = journal.graph
    graph.nodes += [fast, slow]
    graph.stateful_nodes = lambda: [fast, slow]  # type: ignore[method-assign]
    for t in range(1000, 21000, 1000):
        journal.batch_generated(BatchTime(t))
        if t % 3000 == 0:
            journal.checkpoint_committed(fast.key, t)
        if t % 5000 == 0 and t <= 10000:  # the slow stream's checkpoint of 15 s failed, 20 s is not written yet
            journal.checkpoint_committed(slow.key, t)
        journal.batch_completed(BatchTime(t))
    head = MetadataLog.read(open_store(str(tmp_path / "cp")))
    assert head is not None
    # resume points: the slow stream at 10 s, the fast one at 9 s (its newest at or before 10 s);
    # horizon 9 s - 1 s (remember) - 2 batches = 6 s
    assert min(int(t) for t in head["offsets"]) == 7000


def test_after_a_restart_the_horizon_assumes_the_previous_checkpoint_of_each_interval(tmp_path):
    metadata = MetadataLog(open_store(str(tmp_path / "cp")), "journal-test", ["graph"], 1000)
    metadata.take_over(zero_ms=0)
    metadata.commit(checkpoints={"010-Fast": 12000, "011-Slow": 10000})  # what the previous driver recorded
    graph = _Graph()
    fast, slow = _Stateful("010-Fast", 4000), _Stateful("011-Slow", 5000)
    graph.nodes += [fast, slow]
    graph.stateful_nodes = lambda: [fast, slow]  # type: ignore[method-assign]
    journal = Journal(metadata, graph)  # type: ignore[arg-type]
    for t in range(1000, 14000, 1000):
        journal.batch_generated(BatchTime(t))
    journal.batch_completed(BatchTime(13000))
    head = MetadataLog.read(open_store(str(tmp_path / "cp")))
    assert head is not None
    # the fast stream's checkpoint at or before 10 s is not known to this driver: at 10 - 4 = 6 s or later;
    # horizon 6 s - 1 s - 2 s = 3 s
    assert min(int(t) for t in head["offsets"]) == 4000
