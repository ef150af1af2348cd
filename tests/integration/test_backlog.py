"""A backlog drains: batches built while checkpoints are adopted behind a queue do not recompute it.

Regression (issue 12, seen after a 60 s store outage): a checkpoint adopted while many batches were
queued rebuilt the state chain after it, but the queued jobs kept computing the old chain; every batch
generated next built on the rebuilt RDDs, which nothing had computed, and recomputed the whole backlog
from the checkpoint: 30+ tasks per batch instead of 2-4, and a backlog that grew instead of draining.
"""

from __future__ import annotations

import operator
import threading

import pytest

from dstreams.testing import collect, manual_context, run_batches
from dstreams.time import from_user_time

from ..support import state_node


def _tasks_per_batch(sc, ctx_id: int, times: list[int]) -> dict[int, int]:
    """Completed tasks of each batch's jobs (checkpoint writes have their own job group)."""
    tracker = sc.statusTracker()
    out = {}
    for ms in times:
        n = 0
        for job in tracker.getJobIdsForGroup(f"dstreams-{ctx_id}-{ms}"):
            for stage in tracker.getJobInfo(job).stageIds:
                info = tracker.getStageInfo(stage)
                if info is not None:
                    n += info.numCompletedTasks
        out[ms] = n
    return out


@pytest.mark.slow
def test_batches_generated_during_a_backlog_compute_one_step_each(sc, tmp_path):
    total = 30
    gate, held = threading.Event(), threading.Event()

    def hold(time, rdd) -> None:
        if from_user_time(time).ms == 2000:
            held.set()
            assert gate.wait(60), "the test never released batch 2"

    with manual_context(1, sc=sc, checkpoint=str(tmp_path / "ckpt")) as ssc:
        pairs = ssc.queueStream([[("k", 1), (f"w{i % 4}", 1)] for i in range(total)])
        counts = pairs.runningReduce(operator.add).checkpoint("2s")
        counts.foreachRDD(hold)
        seen = collect(counts, sort=True)
        ssc.start()
        clock = ssc.clock  # moved by hand: batch 2 is held while a backlog queues behind it, then drains
        try:
            clock.advance(2000)
            assert held.wait(60)
            clock.advance(14_000)  # batches 3..16 queue up behind batch 2
            ssc._scheduler.events.wait_idle(30)
            gate.set()
            for k in range(17, total + 1):  # keep generating while 14 batches wait
                ssc.awaitBatch((k - 14) * 1000, 120)
                clock.advance(1000)
            ssc.awaitBatch(total * 1000, 120)
            tasks = _tasks_per_batch(sc, ssc._scheduler.ctx_id, [k * 1000 for k in range(3, total + 1)])
        finally:
            gate.set()
    assert seen[total * 1000] == [("k", total), ("w0", 8), ("w1", 8), ("w2", 7), ("w3", 7)]
    # One step of the chain is a few tasks (2 partitions: the input's map side and the merge). The first
    # batch rebuilt after an adoption also recomputes the steps that ran while the checkpoint was being
    # written (one or two on a busy machine). Recomputing the backlog would cost 30+ tasks.
    assert max(tasks.values()) <= 16, tasks
    assert sorted(tasks.values())[len(tasks) // 2] <= 6, tasks


@pytest.mark.slow
def test_empty_intervals_leave_a_running_state_as_it_was_without_a_spark_stage(sc, tmp_path):
    """A batch with no partition (an empty folder listing, the missed intervals of a downtime) hands the
    previous state on as it is: its output job runs one task per state partition, no state stage, and the
    cache of the state stays with the newest batch that holds it when the older batches are forgotten."""
    empty = 9
    with manual_context(1, sc=sc, checkpoint=str(tmp_path / "ckpt")) as ssc:
        batches = [sc.parallelize([("a", 1), ("b", 2)], 2)] + [sc.emptyRDD() for _ in range(empty)]
        batches.append(sc.parallelize([("a", 10)], 2))
        counts = ssc.queueStream(batches).runningReduce(operator.add, 2).checkpoint("4s")
        seen = collect(counts, sort=True)
        node = state_node(counts)
        ssc.start()
        run_batches(ssc, empty + 1, timeout=120)
        ssc._checkpointer.flush(60)
        last_empty = (empty + 1) * 1000
        held = node.generated[last_empty]
        assert held is node.generated[last_empty - 1000]  # the same RDD: nothing computed for it
        assert min(node.generated) > 2000 and held.is_cached  # older batches forgotten, the cache kept
        run_batches(ssc, 1, timeout=120)
        tasks = _tasks_per_batch(sc, ssc._scheduler.ctx_id, [2000, 3000, last_empty, (empty + 2) * 1000])
    assert ssc._scheduler.error is None and ssc._checkpointer.errors == []
    assert {t: seen[t] for t in (1000, 2000, last_empty)} == {t: [("a", 1), ("b", 2)] for t in (1000, 2000, last_empty)}
    assert seen[(empty + 2) * 1000] == [("a", 11), ("b", 2)]
    assert tasks[2000] == tasks[3000] == tasks[last_empty] == 2, tasks  # the collect of 2 cached partitions
    assert tasks[(empty + 2) * 1000] > 2, tasks  # a batch with data merges again
