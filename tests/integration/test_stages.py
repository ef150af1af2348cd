"""State streams do not shuffle their state: stage counts per batch and the state's dependencies.

One pipeline carries four state streams (``runningReduce``, ``updateStateByKey``, ``track`` and an
incremental ``reduceByKeyAndWindow(add, sub, 5 s, 1 s)``), each with its own output, over batches
whose number of keys grows (batch ``i`` has ``4 * i`` keys). Every batch runs under its own Spark
job group, so the jobs of batch ``t`` are found with ``statusTracker().getJobIdsForGroup``.

How many stages the job of one output has at batch ``t`` (before the first checkpoint, at 10 s):

* **executed: exactly 2**, whatever ``t`` and the number of keys: the map side of the batch's
  pre-reduce/pre-group shuffle (the batch into the state's partitioner) and the result stage,
  in which each partition of the new state is the partition-wise merge of the cached previous
  state with the shuffled batch (a narrow dependency). A state that was shuffled each batch would
  add a shuffle map stage over the state, i.e. a third executed stage.
* **listed: t + 2**. Spark's DAGScheduler lists every shuffle reachable through narrow
  dependencies, cached or not, and marks those whose map output already exists as *skipped*
  (they still appear in ``stageIds``, with no task run). The state at ``t`` reaches, through the
  narrow merge chain, the states of every earlier batch and so the shuffles of batches
  ``1..t`` (the window reaches the per-batch reductions ``1..t`` the same way), plus the shuffle
  that once built the cached segment-marker RDD. So ``t + 1`` shuffle stages (``t`` of them
  skipped) and one result stage. The list grows until a checkpoint cuts the lineage (every 10 s by
  default; ``test_long_run`` checks that the lineage stays bounded), the executed work does not.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass

import pytest
from py4j.java_gateway import is_instance_of

from dstreams import ManualClock, StreamingContext
from dstreams.nodes.reduced_window import IncrementalWindow, ReducedWindowNode
from dstreams.nodes.state import StateNode

BATCHES = 8
CHECKED = (3, 8)
KINDS = ("runningReduce", "updateStateByKey", "track", "window")
INPUT_PARTITIONS = 3
STATE_PARTITIONS = 2


def _track_init(key, ev):
    return ev


def _track_update(key, state, ev):
    return state + ev


def _usbk(values, last):
    return sum(values) + (last or 0)


@dataclass
class StageCounts:
    executed: int
    listed: int
    ran: list[tuple[int, str, int]]  # (stage id, name, completed tasks) of the executed stages


@dataclass
class Observed:
    counts: dict[tuple[str, int], StageCounts]  # (kind, batch) -> counts of that output's job
    narrow: dict[str, tuple[bool, bool]]  # kind -> (previous reached narrowly, reached via a shuffle)
    debug: dict[str, str]  # kind -> toDebugString of the RDD at the last batch


def _jobs_of_group(sc, group: str, expected: int, timeout_s: float = 60.0):
    """The finished jobs of ``group`` (the status store is fed asynchronously: poll, bounded)."""
    tracker = sc.statusTracker()
    deadline = time.monotonic() + timeout_s
    while True:
        ids = sorted(tracker.getJobIdsForGroup(group))
        infos = [tracker.getJobInfo(i) for i in ids]
        if len(ids) >= expected and all(i is not None and i.status == "SUCCEEDED" for i in infos):
            return infos
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs of {group} not all finished after {timeout_s} s: {infos}")
        time.sleep(0.05)


def _stage_counts(sc, job) -> StageCounts:
    tracker = sc.statusTracker()
    stages = [tracker.getStageInfo(s) for s in job.stageIds]
    # Once the status store holds more than spark.ui.retainedStages stages (a whole test run does),
    # Spark evicts stages without a completion time first: the skipped ones. A stage whose info is
    # gone therefore did not run in this just-finished job; the stages that ran are the newest ones
    # in the store and are never the first evicted, so the executed count below stays exact.
    ran = [(s.stageId, s.name, s.numCompletedTasks) for s in stages if s is not None and s.numCompletedTasks > 0]
    return StageCounts(executed=len(ran), listed=len(stages), ran=sorted(ran))


def _previous_reached(sc, current, previous) -> tuple[bool, bool]:
    """Walk the JVM lineage of ``current``: is ``previous`` reached through narrow deps only / via a shuffle?"""
    gateway = sc._gateway
    target = previous.id()
    narrow = shuffled = False
    stack = [(current._jrdd.rdd(), False)]
    seen: set[tuple[int, bool]] = set()
    while stack:
        rdd, crossed = stack.pop()
        rid = rdd.id()
        if rid == target:
            if crossed:
                shuffled = True
            else:
                narrow = True
            continue  # not beyond the previous state: its own lineage is the earlier batches'
        if (rid, crossed) in seen:
            continue
        seen.add((rid, crossed))
        deps = rdd.dependencies()
        for i in range(deps.size()):
            dep = deps.apply(i)
            is_shuffle = is_instance_of(gateway, dep, "org.apache.spark.ShuffleDependency")
            stack.append((dep.rdd(), crossed or is_shuffle))
    return narrow, shuffled


def _state_node(stream):
    """The state (or window) node behind a public stream (``track`` adds a mapValues on top)."""
    node = stream._node
    while not isinstance(node, (StateNode, ReducedWindowNode)):
        (node,) = node.dependencies
    return node


@pytest.fixture(scope="module")
def observed(sc) -> Observed:
    inputs = [[(f"k{j}", j % 3 + 1) for j in range(4 * i)] for i in range(1, BATCHES + 1)]
    # Input batches have INPUT_PARTITIONS partitions, the state STATE_PARTITIONS: the task
    # counts then tell the shuffle of the batch from a shuffle of the state.
    clock = ManualClock()
    ssc = StreamingContext(sc, 1.0, clock=clock)
    pairs = ssc.queueStream([sc.parallelize(b, INPUT_PARTITIONS) for b in inputs])
    n = STATE_PARTITIONS
    streams = {
        "runningReduce": pairs.runningReduce(operator.add, n),
        "updateStateByKey": pairs.updateStateByKey(_usbk, n),
        "track": pairs.track(_track_init, _track_update, 30, n),
        "window": pairs.reduceByKeyAndWindow(operator.add, operator.sub, 5, 1, n),
    }
    window = _state_node(streams["window"])
    assert isinstance(getattr(window, "op", None), IncrementalWindow) or window.incremental()
    for s in streams.values():  # one output (one Spark job per batch) each, in this order
        s.foreachRDD(lambda rdd: rdd.collect())
    counts: dict[tuple[str, int], StageCounts] = {}
    narrow: dict[str, tuple[bool, bool]] = {}
    debug: dict[str, str] = {}
    ssc.start()
    try:
        for i in range(1, BATCHES + 1):
            clock.advance(1000)
            info = ssc.awaitBatch(i * 1000, 120.0)
            if i in CHECKED:
                jobs = _jobs_of_group(sc, info.job_group, len(streams))
                assert len(jobs) == len(streams), f"batch {i}: expected one job per output, got {jobs}"
                for kind, job in zip(streams, jobs, strict=True):  # outputs run in registration order
                    counts[(kind, i)] = _stage_counts(sc, job)
        for kind, s in streams.items():
            node = _state_node(s)
            current, previous = node.generated[BATCHES * 1000], node.generated[(BATCHES - 1) * 1000]
            narrow[kind] = _previous_reached(sc, current, previous)
            debug[kind] = current.toDebugString().decode()
    finally:
        ssc.stop(stopSparkContext=False)
    return Observed(counts, narrow, debug)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_state_is_not_shuffled_each_batch(observed: Observed, kind: str) -> None:
    for t in CHECKED:
        c = observed.counts[(kind, t)]
        assert c.executed == 2, (
            f"{kind} at batch {t}: {c.executed} stages ran, expected 2 (the batch's shuffle map stage and the "
            f"result stage that merges it with the cached state); executed stages: {c.ran}"
        )
        # Skipped stages are listed too: the shuffles of batches 1..t and the marker RDD's one.
        assert c.listed == t + 2, f"{kind} at batch {t}: {c.listed} stages listed, expected {t + 2}"
    early, late = observed.counts[(kind, CHECKED[0])], observed.counts[(kind, CHECKED[-1])]
    assert early.executed == late.executed  # the work per batch does not grow with the state or time
    # The executed shuffle map stage has one task per partition of the batch (3), the result stage one
    # per state partition (2). A shuffle of the state (e.g. a reduceByKey over state ∪ batch) would
    # need a map stage over the state's partitions too (3 + 2 tasks).
    for t in CHECKED:
        tasks = [n for _, _, n in observed.counts[(kind, t)].ran]
        assert tasks == [INPUT_PARTITIONS, STATE_PARTITIONS], (kind, t, observed.counts[(kind, t)].ran)


@pytest.mark.parametrize("kind", KINDS)
def test_previous_state_is_a_narrow_dependency(observed: Observed, kind: str) -> None:
    narrow, shuffled = observed.narrow[kind]
    assert narrow, f"{kind}: the RDD at batch {BATCHES} does not reach the previous one through narrow dependencies"
    assert not shuffled, f"{kind}: the previous state is reached through a shuffle:\n{observed.debug[kind]}"
