"""The test-only fault points (dstreams/faults.py): the library never reads them from the environment; a
FaultPlan parses the variables the test apps are started with; driver-side and task-side points act as planned;
the task side travels with the jobs as a Spark local property (the batch runner carries it)."""

from __future__ import annotations

import ast
import signal
import threading
import time
from pathlib import Path

import pytest

from dstreams import faults
from dstreams.faults import KILL, NO_FAULTS, PAUSE, Fault, FaultPlan, SlowSpec
from dstreams.testing import manual_context, run_batches

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("dstreams", "api", "recovery")


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` constants of ``tree``."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                            and node.id == "environ")


def _environment_reads(tree: ast.Module) -> list[tuple[int, ast.AST]]:
    """(line, key expression) of every read of an environment variable in ``tree``: ``os.environ[k]``,
    ``os.environ.get/pop/setdefault(k)``, ``os.getenv(k)``, ``k in os.environ``."""
    reads: list[tuple[int, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            reads.append((node.lineno, node.slice))
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and _is_environ(f.value):
                reads.append((node.lineno, node.args[0]))
            elif (isinstance(f, ast.Attribute) and f.attr == "getenv") or (isinstance(f, ast.Name)
                                                                          and f.id == "getenv"):
                reads.append((node.lineno, node.args[0]))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            reads.append((node.lineno, node.left))
    return reads


def test_no_library_module_reads_a_fault_variable_from_the_environment():
    """Fault points are installed (dstreams.faults.install), never read from os.environ / os.getenv: every read of
    the environment in the library names its variable with a constant, and none is a ``DSTREAMS_FAULT_*``; only
    dstreams/faults.py names those at all (FaultPlan.from_mapping parses a test app's environment)."""
    offenders = []
    for path in (p for folder in LIBRARY for p in (ROOT / folder).rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=where)
        constants = _module_strings(tree)
        for line, key in _environment_reads(tree):
            name = key.value if isinstance(key, ast.Constant) else constants.get(getattr(key, "id", ""), "")
            if isinstance(name, str) and name.startswith("DSTREAMS_FAULT_"):
                offenders.append(f"{where}:{line} reads {name}")
        if where != "dstreams/faults.py":
            offenders += [f"{where}:{n.lineno} names {n.value}" for n in ast.walk(tree)
                          if isinstance(n, ast.Constant) and isinstance(n.value, str) and "DSTREAMS_FAULT_" in n.value]
    assert not offenders, offenders
    assert not (ROOT / "dstreams" / "task_faults.py").exists()


def test_the_check_sees_the_ways_a_variable_is_read():
    tree = ast.parse('import os\nX = "DSTREAMS_FAULT_KILL"\nos.environ.get(X)\nos.environ["A"]\nos.getenv("B")\n'
                     '"C" in os.environ\nos.environ.setdefault("D", "1")\n')
    keys = [k.value if isinstance(k, ast.Constant) else k.id for _, k in _environment_reads(tree)]  # type: ignore
    assert keys == ["X", "A", "B", "C", "D"]


# ---------------------------------------------------------------------------------------------- parsing


def test_an_empty_mapping_plans_nothing():
    assert FaultPlan.from_mapping({}) == NO_FAULTS
    assert FaultPlan.from_mapping({faults.KILL_POINT: " ", faults.SLOW_SECONDS: "3", faults.SLOW_FACTOR: "2"}) \
        == NO_FAULTS
    assert FaultPlan.from_mapping({faults.SLOW_EXECUTOR: "", faults.SLOW_PARTITION: " , "}).slow is None
    assert NO_FAULTS.task_side is None


def test_driver_kills_and_pauses_parse_with_their_pass():
    plan = FaultPlan.from_mapping({faults.KILL_POINT: "mid-batch", faults.PAUSE_POINT: "sink-write",
                                   faults.PAUSE_AFTER: "6"})
    assert plan.driver == (Fault("mid-batch", KILL, 1), Fault("sink-write", PAUSE, 6))
    assert plan.tasks == () and plan.slow is None and plan.task_side is None
    assert FaultPlan.from_mapping({faults.KILL_POINT: "checkpoint-write", faults.KILL_AFTER: "3"}).driver \
        == (Fault("checkpoint-write", KILL, 3),)


def test_task_kills_and_pauses_parse_with_their_marker():
    plan = FaultPlan.from_mapping({faults.TASK_KILL: "state-export:/tmp/m:1",
                                   faults.TASK_PAUSE: "kafka-before-commit:/x"})
    assert plan.tasks == (Fault("state-export", KILL, marker="/tmp/m:1"),
                          Fault("kafka-before-commit", PAUSE, marker="/x"))
    assert plan.driver == ()


def test_slowdowns_parse_targets_and_amounts():
    spec = FaultPlan.from_mapping({faults.SLOW_PARTITION: "1, 3"}).slow
    assert spec == SlowSpec(None, frozenset({1, 3}), 1.0, 1.0)  # 1 s by default
    assert spec.matches("7", 3) and not spec.matches("7", 2)
    spec = FaultPlan.from_mapping({faults.SLOW_EXECUTOR: "0,driver", faults.SLOW_SECONDS: "0.25"}).slow
    assert spec == SlowSpec(frozenset({"0", "driver"}), None, 0.25, 1.0)
    assert spec.matches("driver", 5) and not spec.matches("1", 5)
    spec = FaultPlan.from_mapping({faults.SLOW_EXECUTOR: "2", faults.SLOW_PARTITION: "0", faults.SLOW_FACTOR: "3"}).slow
    assert spec == SlowSpec(frozenset({"2"}), frozenset({0}), 0.0, 3.0)
    assert spec.matches("2", 0) and not spec.matches("2", 1) and not spec.matches("1", 0)  # both must match
    assert spec.delay(0.5) == pytest.approx(1.0)  # 3x as long: 2 x the elapsed 0.5 s more
    both = FaultPlan.from_mapping({faults.SLOW_PARTITION: "0", faults.SLOW_SECONDS: "1", faults.SLOW_FACTOR: "2"}).slow
    assert both is not None and both.delay(0.5) == pytest.approx(1.5)


@pytest.mark.parametrize("mapping", [
    {faults.SLOW_PARTITION: "one"},
    {faults.SLOW_PARTITION: "1", faults.SLOW_SECONDS: "-1"},
    {faults.SLOW_PARTITION: "1", faults.SLOW_SECONDS: "nan"},
    {faults.SLOW_PARTITION: "1", faults.SLOW_FACTOR: "0.5"},
    {faults.SLOW_EXECUTOR: "1", faults.SLOW_SECONDS: "soon"},
    {faults.KILL_POINT: "mid-batch", faults.KILL_AFTER: "0"},
    {faults.PAUSE_POINT: "sink-write", faults.PAUSE_AFTER: "second"},
    {faults.TASK_KILL: "state-export"},
    {faults.TASK_PAUSE: ":marker"},
])
def test_malformed_values_are_refused_naming_the_variable(mapping):
    with pytest.raises(ValueError) as e:
        FaultPlan.from_mapping(mapping)
    assert any(name in str(e.value) for name in mapping)


def test_the_task_side_round_trips_through_its_json():
    plan = FaultPlan(driver=(Fault("mid-batch", KILL),), tasks=(Fault("state-reload", PAUSE, marker="/m",
                                                                      where=(("partition", "1"),)),),
                     slow=SlowSpec(frozenset({"0"}), frozenset({2, 1}), 0.5, 2.0))
    text = plan.task_side
    assert text is not None and len(text) < 200
    assert FaultPlan.from_task_side(text) == FaultPlan(tasks=plan.tasks, slow=plan.slow)


# ---------------------------------------------------------------------------------------------- the driver side


@pytest.fixture
def signals(monkeypatch) -> list[tuple[str, str]]:
    """The signals the driver-side points would send, recorded instead."""
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(faults, "_signal_self", lambda sig, what: sent.append((sig.name, what)))
    return sent


def test_a_kill_is_due_from_its_pass_on_and_a_pause_at_its_pass_only(fault_plan, signals):
    fault_plan(FaultPlan(driver=(Fault("sink-write", KILL, 3), Fault("mid-batch", PAUSE, 2))))
    for _ in range(4):
        faults.reached("sink-write")
        faults.reached("mid-batch")
        faults.reached("checkpoint-write")
    assert signals == [("SIGSTOP", "at mid-batch #2"), ("SIGKILL", "at sink-write #3"),
                       ("SIGKILL", "at sink-write #4")]


def test_install_starts_the_counts_again_and_no_faults_takes_them_out(fault_plan, signals):
    assert faults.installed() == NO_FAULTS
    plan = FaultPlan(driver=(Fault("mid-batch", KILL, 2),))
    fault_plan(plan)
    assert faults.installed() is plan
    faults.reached("mid-batch")
    fault_plan(plan)
    faults.reached("mid-batch")
    assert signals == []
    fault_plan(NO_FAULTS)
    for _ in range(3):
        faults.reached("mid-batch")
    assert signals == []


def test_where_narrows_the_passes_that_count(fault_plan, signals):
    fault_plan(FaultPlan(driver=(Fault("sink-write", PAUSE, 1, where=(("batch", "3000"),)),)))
    faults.reached("sink-write", batch=2000)
    faults.reached("sink-write")
    assert signals == []
    faults.reached("sink-write", batch=3000)
    assert signals == [("SIGSTOP", "at sink-write #1")]


def test_a_pause_waits_until_no_folder_lock_of_the_recovery_layer_is_held(monkeypatch, tmp_path):
    """The recovery layer registers its folder locks' count: a pause taken while another thread holds one stops
    the process only once that lock is released (the stop itself is recorded instead of sent)."""
    from recovery.store.folder_lock import folder_lock, folder_locks_held

    assert folder_locks_held in faults._pause_guards
    stopped: list[int] = []
    monkeypatch.setattr(faults.signal, "pthread_kill", lambda tid, sig: stopped.append(folder_locks_held()))
    release, taken = threading.Event(), threading.Event()

    def hold() -> None:
        with folder_lock(str(tmp_path), timeout_s=5.0):
            taken.set()
            release.wait(5.0)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(5.0)
    threading.Timer(0.3, release.set).start()
    started = time.monotonic()
    faults._signal_self(signal.SIGSTOP, "at test")
    holder.join(5.0)
    assert stopped == [0] and time.monotonic() - started >= 0.25


def test_the_fixture_took_the_plan_out():
    assert faults.installed() == NO_FAULTS


# ---------------------------------------------------------------------------------------------- the task side


def test_a_task_fault_is_taken_once_by_the_task_that_removes_its_marker(monkeypatch, tmp_path):
    marker = tmp_path / "marker"
    plan = FaultPlan(tasks=(Fault("state-export", KILL, marker=str(marker)),
                            Fault("kafka-before-commit", PAUSE, marker=str(tmp_path / "p"))))
    monkeypatch.setattr(faults, "task_plan", lambda: plan)
    killed, stopped = [], []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: killed.append(sig))
    monkeypatch.setattr(faults.signal, "pthread_kill", lambda tid, sig: stopped.append(sig))
    faults.task_reached("state-export")  # not armed yet: no marker
    marker.write_text("armed")
    faults.task_reached("state-reload")
    faults.task_reached("state-export")
    faults.task_reached("state-export")
    assert killed == [signal.SIGKILL] and not marker.exists()
    (tmp_path / "p").write_text("armed")
    faults.task_reached("kafka-before-commit")
    assert stopped == [signal.SIGSTOP] and (tmp_path / "p.paused").read_text().isdigit()


def test_outside_a_task_nothing_is_carried_and_nothing_slows():
    assert faults.task_plan() == NO_FAULTS
    faults.task_reached("state-export")
    assert faults.maybe_slow_task(spec=SlowSpec(None, frozenset({0}), 30.0, 1.0)) == 0.0
    assert faults.maybe_slow_task() == 0.0


def _carried(_: object) -> list[FaultPlan]:
    return [faults.task_plan()]


def test_carry_sets_the_task_side_for_this_threads_jobs_and_clears_it(sc, fault_plan):
    plan = FaultPlan(driver=(Fault("mid-batch", KILL),), tasks=(Fault("state-export", KILL, marker="/nowhere"),),
                     slow=SlowSpec(None, frozenset({7}), 1.0, 1.0))
    fault_plan(plan)
    faults.carry(sc)
    try:
        assert sc.parallelize([0, 1], 2).mapPartitions(_carried).collect() == [FaultPlan(tasks=plan.tasks,
                                                                                           slow=plan.slow)] * 2
    finally:
        fault_plan(NO_FAULTS)
        faults.carry(sc)
    assert sc.getLocalProperty(faults.PROPERTY) is None
    assert sc.parallelize([0], 1).mapPartitions(_carried).collect() == [NO_FAULTS]


def test_the_batch_runner_carries_the_plan_installed_before_each_batch(sc, fault_plan):
    seen: list[list[FaultPlan]] = []
    plan = FaultPlan(tasks=(Fault("kafka-after-commit", KILL, marker="/nowhere"),))
    with manual_context(1, sc=sc) as ssc:
        ssc.queueStream([sc.parallelize([1, 2], 2) for _ in range(2)]).foreachRDD(
            lambda rdd: seen.append(rdd.mapPartitions(_carried).collect()))
        ssc.start()
        fault_plan(plan)
        run_batches(ssc, 1, timeout=120)
        fault_plan(NO_FAULTS)
        run_batches(ssc, 1, timeout=120)
    assert seen == [[plan, plan], [NO_FAULTS, NO_FAULTS]]


def test_a_slowdown_slows_only_the_chosen_tasks(sc):
    spec = SlowSpec(None, frozenset({1}), 0.05, 1.0)
    slept = sc.parallelize(range(4), 2).mapPartitions(lambda it: [faults.maybe_slow_task(spec=spec)]).collect()
    assert slept == [0.0, 0.05]
    spec = SlowSpec(frozenset({"driver"}), None, 0.01, 1.0)  # local[N]: tasks run on "driver"
    ids = sc.parallelize(range(2), 2).mapPartitions(
        lambda it: [(faults.current_executor_id(), faults.maybe_slow_task(spec=spec))]).collect()
    assert ids == [("driver", 0.01), ("driver", 0.01)]
    assert sorted(sc.parallelize(range(6), 2).mapPartitions(faults.slowed_partition).collect()) == list(range(6))
