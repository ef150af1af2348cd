"""A 1,000-batch run on the ManualClock: cached RDDs, driver memory, node metadata and lineage stay flat.

Pipeline: a tiny generator source (5 records per batch) -> ``(word, 1)`` -> ``runningReduce(add)``
and ``reduceByKeyAndWindow(add, sub, 5 s, 1 s)`` (incremental) -> their union -> ``map`` to the values
-> one action per batch that counts and sums them (one Spark job per batch, to keep the run short).

Measured at batch ``EARLY`` (after warm-up) and at the last batch, and compared with a tolerance:

* the JVM's persistent (cached) RDDs, ``len(sc._jsc.getPersistentRDDs())``;
* the Python driver's live memory (``tracemalloc``, started after warm-up, after a ``gc.collect()``);
* ``len(node.generated)`` of every node of the graph (what ``clear_metadata`` must forget);
* the lineage of the state and window RDDs (``toDebugString`` length, max over the 10 batches before
  each measurement point, i.e. over one checkpoint interval): checkpoints every 10 s cut it.
"""

from __future__ import annotations

import gc
import operator
import os
import time
import tracemalloc
from collections import deque

import pytest

from dstreams import ManualClock, StreamingContext

from ..support import scaled, state_node

#: 1,000 batches by default (about 5 min on an idle 2-core machine); 300 at the CI scale (``tests/support.py``'s
#: :func:`~tests.support.ci_scale`) to stay in its time budget (``DSTREAMS_LONG_RUN_BATCHES`` overrides either).
BATCHES = int(os.environ.get("DSTREAMS_LONG_RUN_BATCHES") or scaled(1000, 300))
EARLY = max(50, BATCHES // 5)
RECORDS_PER_BATCH = 5
WINDOW_S = 5
CHECKPOINT_EVERY = 10  # batches: the default checkpoint interval of a 1 s state stream


def first_word(line: str) -> tuple[str, int]:
    return (line.split()[0], 1)


def nonzero(kv) -> bool:
    return kv[1] != 0


def count_and_sum(acc: tuple[int, int], v: int) -> tuple[int, int]:
    return (acc[0] + 1, acc[1] + v)


def add_pairs(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] + b[0], a[1] + b[1])


def graph_nodes(ssc) -> list:
    """Every node reachable from the graph's outputs."""
    seen: dict[int, object] = {}
    stack = list(ssc._graph.outputs)
    while stack:
        node = stack.pop()
        if node.id not in seen:
            seen[node.id] = node
            stack.extend(node.dependencies)
    return list(seen.values())


def debug_len(rdd) -> int:
    return len(rdd.toDebugString())


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_thousand_batches_keep_memory_metadata_and_lineage_flat(sc, monkeypatch) -> None:
    started = time.monotonic()
    # The status page keeps the batches of the last 10 minutes (at most 10,000): bounded, but it grows
    # between batch 200 and batch 1,000 of this 1 s manual clock. Off here, so that growth measured below
    # is growth that would go on for ever (tests/integration/test_status.py covers the page's bounds).
    monkeypatch.setenv("DSTREAMS_UI_ENABLED", "false")
    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    pairs = ssc.generatorStream(RECORDS_PER_BATCH, 1).map(first_word)
    running = pairs.runningReduce(operator.add, 1)
    window = pairs.reduceByKeyAndWindow(operator.add, operator.sub, WINDOW_S, 1, 1, filterFunc=nonzero)
    results: deque[tuple[int, int, int]] = deque(maxlen=1)  # (batch ms, records, sum of values)

    def count_values(t, rdd) -> None:
        n, total = rdd.aggregate((0, 0), count_and_sum, add_pairs)
        results.append((round(t.timestamp() * 1000), n, total))

    running.union(window).map(operator.itemgetter(1)).foreachRDD(count_values)
    nodes = graph_nodes(ssc)
    state_node = running._node
    window_node = window._node

    lineage: dict[str, list[int]] = {"early": [], "late": []}
    at: dict[str, dict] = {}
    cached_before = len(sc._jsc.getPersistentRDDs())
    ssc.start()
    # The scheduler keeps the metrics of the last 1,000 batches: legitimately bounded, but it would
    # still grow between batch 200 and batch 1,000. Keep 50 in this test so that any growth measured
    # below is growth that would go on for ever.
    ssc._scheduler.tracker.infos = deque(maxlen=50)
    try:
        for i in range(1, BATCHES + 1):
            clock.advance(1000)
            ssc.awaitBatch(i * 1000, 120.0)
            if EARLY - 10 < i <= EARLY or BATCHES - 10 < i:
                phase = "early" if i <= EARLY else "late"
                lineage[phase].append(max(debug_len(state_node.generated[i * 1000]),
                                          debug_len(window_node.generated[i * 1000])))
            if i == EARLY // 2:
                gc.collect()
                tracemalloc.start()
            if i in (EARLY, BATCHES):
                gc.collect()
                at["early" if i == EARLY else "late"] = {
                    "memory": tracemalloc.get_traced_memory()[0],
                    "persistent": len(sc._jsc.getPersistentRDDs()) - cached_before,
                    "generated": {n.name: len(n.generated) for n in nodes},
                    "elapsed_s": round(time.monotonic() - started, 1),
                }
    finally:
        tracemalloc.stop()
        ssc.stop(stopSparkContext=False)

    early, late = at["early"], at["late"]
    print(f"\nlong run: early={early} late={late} lineage={lineage} "
          f"total {time.monotonic() - started:.1f} s")

    # The pipeline computed the right thing all along: the running total of every record so far
    # plus the records of the last 5 batches.
    t, _, total = results[-1]
    assert t == BATCHES * 1000
    assert total == RECORDS_PER_BATCH * BATCHES + RECORDS_PER_BATCH * WINDOW_S

    # Cached RDDs: the same few (remembered state, window and per-batch reductions), not one more
    # per batch. Unpersisting is asynchronous, hence a small tolerance.
    assert late["persistent"] <= early["persistent"] + 3, (early["persistent"], late["persistent"])
    assert early["persistent"] < 100, early["persistent"]  # this stream's own, not earlier tests' (shared sc)

    # Every node forgets what it no longer needs: same dict sizes, bounded by its remember duration.
    for node in nodes:
        name = node.name
        assert late["generated"][name] <= early["generated"][name] + 1, (name, early["generated"], late["generated"])
        bound = node.remember_duration.ms // node.slide_duration.ms + 2
        assert late["generated"][name] <= bound, (name, late["generated"][name], bound)

    # Driver memory: what was alive at batch 200 and is still alive at batch 1,000 plus anything that
    # accumulated in between; 800 batches of a leak of one small object graph per batch (an RDD
    # object with its JVM handle is a few KB) would exceed this.
    growth = late["memory"] - early["memory"]
    assert growth < 512 * 1024, f"driver memory grew by {growth} bytes between batch {EARLY} and {BATCHES}"

    # Lineage: bounded by the checkpoints (the longest lineage in one checkpoint interval is the same
    # at the end as after warm-up; RDD ids have more digits by then, hence the tolerance).
    assert max(lineage["late"]) <= 1.2 * max(lineage["early"]) + 200, lineage


def reaches(sc, rdd, target_id: int) -> bool:
    """Whether the JVM lineage of ``rdd`` (through any dependency) reaches the RDD ``target_id``."""
    stack, seen = [rdd._jrdd.rdd()], set()
    while stack:
        r = stack.pop()
        rid = r.id()
        if rid == target_id:
            return True
        if rid in seen:
            continue
        seen.add(rid)
        deps = r.dependencies()
        stack.extend(deps.apply(i).rdd() for i in range(deps.size()))
    return False


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lineage_is_cut_when_batches_are_generated_before_the_checkpoint_commits(sc) -> None:
    """After a checkpoint has committed, new state RDDs must not reach back to the first batches."""
    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    running = ssc.queueStream([], default=sc.parallelize([("a", 1)], 1)).runningReduce(operator.add, 1)
    seen: list[tuple[int, list]] = []
    running.foreachRDD(lambda t, rdd: seen.append((round(t.timestamp() * 1000), rdd.collect())))
    node = state_node(running)
    ssc.start()
    try:
        # A backlog: batches 1..12 are due at once, so the generator builds them ahead of the runner
        # (as with a real clock when processing is slower than the batch interval).
        clock.advance(12_000)
        ssc.awaitBatch(12_000, 300.0)
        first = node.generated[1000]
        ssc._checkpointer.flush(120.0)  # the checkpoint of batch 10 has committed
        assert node.checkpoint_interval.ms == 10_000
        clock.advance(1000)
        ssc.awaitBatch(13_000, 120.0)
        latest = node.generated[13_000]
        assert seen[-1] == (13_000, [("a", 13)])
        assert not reaches(sc, latest, first.id()), (
            "the state at 13 s still reaches the state of batch 1 although the checkpoint at 10 s committed: "
            f"lineage of {len(latest.toDebugString())} characters")
    finally:
        ssc.stop(stopSparkContext=False)
