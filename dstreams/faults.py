"""Test-only fault points: a test injects faults by installing a :class:`FaultPlan`; the library never reads one
from the environment.

Contract:

* A :class:`FaultPlan` (frozen) lists the faults a test wants. Its ``driver`` faults act in the process that
  installed the plan, at the driver-side points (:func:`reached`); its ``tasks`` faults and its ``slow`` down act
  inside Spark tasks (:func:`task_reached`, :func:`maybe_slow_task`). :meth:`FaultPlan.from_mapping` parses the
  variables listed in :data:`VARIABLES` (``DSTREAMS_FAULT_*``, the names the test apps have always been started
  with), so a test app does ``install(FaultPlan.from_mapping(os.environ))`` first thing; an in-process test uses
  the ``fault_plan`` fixture of ``tests/conftest.py``.
* :func:`install` replaces the process's plan (and its pass counts); :func:`installed` is the plan in force
  (empty, :data:`NO_FAULTS`, until one is installed). With no fault installed, :func:`reached` is an attribute
  test and :func:`carry` does nothing.
* The task side travels with the jobs: :func:`carry` sets (or clears) the Spark local property :data:`PROPERTY`
  (the task side as a small JSON) on the calling thread, and a thread that submits the engine's jobs calls it
  before it submits them (the batch runner before each batch, the checkpointer before each checkpoint, the restore
  pool before it reads checkpoints back). Tasks read it back with ``TaskContext.get().getLocalProperty``, on any
  master (a standalone cluster's executors too): a plan installed between two batches reaches the tasks of the next.

Driver-side points (a fault ``kill`` SIGKILLs the process at the ``after``-th pass and every later one, a fault
``pause`` SIGSTOPs it at the ``after``-th pass only, after writing ``dstreams fault injection: SIGSTOP at <point>
#<n>`` to stderr: every thread halts until a SIGCONT, a zombie driver in the making):

* ``mid-batch`` – a batch's first output operation has started (its Spark jobs may be running);
* ``checkpoint-write`` – a data checkpoint's parts are written but its manifest is not;
* ``after-metadata-commit`` – right after a conditional write of the metadata head;
* ``sink-write`` – an exactly-once sink found its batch not committed and is about to write it (its fence check
  passed: the next step may overwrite or delete);
* ``redis-sink-chunk`` – ``saveToRedisStream`` added a chunk of a batch's entries;
* ``postgres-sink-commit`` – ``saveToPostgres`` staged a batch and is inside its commit transaction.

Task-side points (a task fault names a marker file: the first task to reach the point while the marker exists
removes it and SIGKILLs its own Python worker, or, ``pause``, writes its pid into ``<marker>.paused`` and SIGSTOPs
itself; one fault, whichever task wins the removal): ``state-export`` (a snapshot of a partition's state store
written beside the store, not yet read), ``state-reload`` (a store reloaded from a checkpoint, inside its
transaction), ``state-loaded`` (a partition's store loaded with a state, an initial one, a checkpoint read back or
the auto policy's move, and closed, before the batch that builds on it applies), ``kafka-before-commit`` /
``kafka-after-commit`` (a Kafka sink task around its transaction's commit).

Stragglers: ``rdd.mapPartitions(slowed_partition)`` (a test app's stage) sleeps in the tasks that the plan's
:class:`SlowSpec` selects, by executor and/or partition; data is never changed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pyspark import SparkContext

T = TypeVar("T")

#: The Spark local property that carries a plan's task side to the tasks.
PROPERTY = "dstreams.faults"

KILL, PAUSE = "kill", "pause"

# The variables FaultPlan.from_mapping reads (a test app's environment; the library never reads them itself).
KILL_POINT = "DSTREAMS_FAULT_KILL"
KILL_AFTER = "DSTREAMS_FAULT_KILL_AFTER"
PAUSE_POINT = "DSTREAMS_FAULT_PAUSE"
PAUSE_AFTER = "DSTREAMS_FAULT_PAUSE_AFTER"
TASK_KILL = "DSTREAMS_FAULT_TASK_KILL"
TASK_PAUSE = "DSTREAMS_FAULT_TASK_PAUSE"
SLOW_EXECUTOR = "DSTREAMS_FAULT_SLOW_EXECUTOR"
SLOW_PARTITION = "DSTREAMS_FAULT_SLOW_PARTITION"
SLOW_SECONDS = "DSTREAMS_FAULT_SLOW_SECONDS"
SLOW_FACTOR = "DSTREAMS_FAULT_SLOW_FACTOR"

#: Every variable :meth:`FaultPlan.from_mapping` reads, with what it does.
VARIABLES: dict[str, str] = {
    KILL_POINT: "the driver SIGKILLs itself at this driver-side point",
    KILL_AFTER: f"the pass through `{KILL_POINT}`'s point that kills the driver (default 1)",
    PAUSE_POINT: "the driver stops itself with SIGSTOP at this driver-side point (resumed by the test with SIGCONT)",
    PAUSE_AFTER: f"the pass through `{PAUSE_POINT}`'s point that pauses the driver (default 1)",
    TASK_KILL: "`<point>:<marker file>`: the first task to reach this task-side point while the marker exists "
               "removes it and SIGKILLs its Python worker",
    TASK_PAUSE: f"`<point>:<marker file>`: as `{TASK_KILL}`, but the task writes its pid into `<marker>.paused` and "
                "stops its Python worker (SIGSTOP)",
    SLOW_EXECUTOR: "slow down the tasks on these executor ids (comma-separated; `driver` in `local[N]`)",
    SLOW_PARTITION: "slow down the tasks of these partitions (comma-separated indexes)",
    SLOW_SECONDS: f"extra seconds per slowed task (1 when neither this nor `{SLOW_FACTOR}` is set)",
    SLOW_FACTOR: "a slowed task takes this many times as long (>= 1)",
}

_DEFAULT_SLOW_SECONDS = 1.0


@dataclass(frozen=True)
class Fault:
    """One fault: ``action`` (:data:`KILL` or :data:`PAUSE`) at ``point``. A driver fault acts at the ``after``-th
    pass (a kill at every later one too); a task fault is claimed by the one task that removes ``marker``.
    ``where`` narrows the passes that count: each of its items must equal (as text) the same-named keyword the
    point passes to :func:`reached` / :func:`task_reached`."""

    point: str
    action: str
    after: int = 1
    marker: str | None = None
    where: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.action not in (KILL, PAUSE):
            raise ValueError(f"a fault's action is {KILL!r} or {PAUSE!r}, not {self.action!r}")
        if self.after < 1:
            raise ValueError(f"a fault's pass (after) counts from 1, not {self.after}")

    def matches(self, point: str, where: Mapping[str, Any]) -> bool:
        return self.point == point and all(str(where.get(k)) == v for k, v in self.where)


@dataclass(frozen=True)
class SlowSpec:
    """Which tasks to slow down and by how much.

    A task is slowed when it runs on one of ``executors`` (``None``: any executor) *and* computes one of
    ``partitions`` (``None``: any partition). Its extra delay is ``seconds + (factor - 1) * elapsed``, ``elapsed``
    being the time the task already spent, as measured by the caller.
    """

    executors: frozenset[str] | None
    partitions: frozenset[int] | None
    seconds: float
    factor: float

    def matches(self, executor_id: str | None, partition: int | None) -> bool:
        if self.executors is not None and executor_id not in self.executors:
            return False
        return self.partitions is None or partition in self.partitions

    def delay(self, elapsed_s: float = 0.0) -> float:
        return self.seconds + max(self.factor - 1.0, 0.0) * max(elapsed_s, 0.0)


@dataclass(frozen=True)
class FaultPlan:
    """The faults a test wants (module docstring): driver-side ``driver``, task-side ``tasks`` and ``slow``."""

    driver: tuple[Fault, ...] = ()
    tasks: tuple[Fault, ...] = ()
    slow: SlowSpec | None = field(default=None)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str]) -> FaultPlan:
        """The plan that :data:`VARIABLES` in ``mapping`` (a test app's ``os.environ``) ask for; blank or missing
        variables ask for nothing. Malformed values raise ValueError naming the variable."""
        driver = [Fault(p, action, _count(name, mapping.get(name, "")))
                  for point, name, action in ((KILL_POINT, KILL_AFTER, KILL), (PAUSE_POINT, PAUSE_AFTER, PAUSE))
                  if (p := mapping.get(point, "").strip())]
        tasks = [_task_fault(name, raw, action) for name, action in ((TASK_KILL, KILL), (TASK_PAUSE, PAUSE))
                 if (raw := mapping.get(name, "").strip())]
        return cls(tuple(driver), tuple(tasks), _slow_spec(mapping))

    @property
    def task_side(self) -> str | None:
        """The task side as the JSON that :func:`carry` sends (None: the plan has none)."""
        if not self.tasks and self.slow is None:
            return None
        slow = self.slow
        return json.dumps({
            "tasks": [[f.point, f.action, f.marker, [list(w) for w in f.where]] for f in self.tasks],
            "slow": None if slow is None else [None if slow.executors is None else sorted(slow.executors),
                                               None if slow.partitions is None else sorted(slow.partitions),
                                               slow.seconds, slow.factor],
        }, separators=(",", ":"))

    @classmethod
    def from_task_side(cls, text: str) -> FaultPlan:
        """The plan whose :attr:`task_side` is ``text`` (no driver faults)."""
        doc = json.loads(text)
        tasks = tuple(Fault(p, a, marker=m, where=tuple((k, v) for k, v in w)) for p, a, m, w in doc["tasks"])
        slow = doc["slow"]
        spec = None if slow is None else SlowSpec(None if slow[0] is None else frozenset(slow[0]),
                                                  None if slow[1] is None else frozenset(slow[1]),
                                                  float(slow[2]), float(slow[3]))
        return cls(tasks=tasks, slow=spec)


NO_FAULTS = FaultPlan()


def _count(name: str, raw: str) -> int:
    try:
        n = int(raw) if raw.strip() else 1
    except ValueError:
        raise ValueError(f"{name} must be a whole number >= 1, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {raw!r}")
    return n


def _task_fault(name: str, raw: str, action: str) -> Fault:
    point, _, marker = raw.partition(":")
    if not point or not marker:
        raise ValueError(f"{name} must be <point>:<marker file>, got {raw!r}")
    return Fault(point, action, marker=marker)


def _csv(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _non_negative(name: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not x >= 0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return x


def _slow_spec(mapping: Mapping[str, str]) -> SlowSpec | None:
    """The slowdown of ``mapping``: off unless SLOW_EXECUTOR or SLOW_PARTITION name something (both: both must
    match); with neither SLOW_SECONDS nor SLOW_FACTOR the delay is 1 s."""
    executors_raw = mapping.get(SLOW_EXECUTOR, "")
    partitions_raw = mapping.get(SLOW_PARTITION, "")
    executors = frozenset(_csv(executors_raw)) or None
    partition_list = _csv(partitions_raw)
    if executors is None and not partition_list:
        return None
    try:
        partitions = frozenset(int(p) for p in partition_list) or None
    except ValueError:
        raise ValueError(f"{SLOW_PARTITION} must be comma-separated integers, got {partitions_raw!r}") from None
    seconds_raw, factor_raw = mapping.get(SLOW_SECONDS, ""), mapping.get(SLOW_FACTOR, "")
    seconds = _non_negative(SLOW_SECONDS, seconds_raw) if seconds_raw else 0.0
    factor = _non_negative(SLOW_FACTOR, factor_raw) if factor_raw else 1.0
    if factor_raw and factor < 1.0:
        raise ValueError(f"{SLOW_FACTOR} must be >= 1, got {factor_raw!r}")
    if not seconds_raw and not factor_raw:
        seconds = _DEFAULT_SLOW_SECONDS
    return SlowSpec(executors, partitions, seconds, factor)


# --- the driver side -----------------------------------------------------------------------------------------

_plan: FaultPlan = NO_FAULTS
_task_json: str | None = None
_counts: dict[Fault, int] = {}
_lock = threading.Lock()
_carried = threading.local()


def install(plan: FaultPlan) -> None:
    """Make ``plan`` this process's plan, with fresh pass counts (``install(NO_FAULTS)`` takes faults out)."""
    global _plan, _task_json
    with _lock:
        _plan, _task_json = plan, plan.task_side
        _counts.clear()


def installed() -> FaultPlan:
    """The plan in force in this process."""
    return _plan


def reached(point: str, **where: Any) -> None:
    """A driver-side point: count a pass through ``point``; SIGKILL this process when a kill of the plan is due,
    SIGSTOP it when a pause is (module docstring)."""
    faults = _plan.driver
    if not faults:
        return
    for fault in faults:
        if not fault.matches(point, where):
            continue
        with _lock:
            n = _counts[fault] = _counts.get(fault, 0) + 1
        if fault.action == KILL and n >= fault.after:
            _signal_self(signal.SIGKILL, f"at {point} #{n}")
        if fault.action == PAUSE and n == fault.after:
            _signal_self(signal.SIGSTOP, f"at {point} #{n}")


def carry(sc: SparkContext) -> None:
    """Set the installed plan's task side as the local property :data:`PROPERTY` of the calling thread's jobs (or
    clear one this thread set before, once no plan has a task side). Call it before submitting jobs."""
    text = _task_json
    if text is None and not getattr(_carried, "set", False):
        return
    sc.setLocalProperty(PROPERTY, text)  # type: ignore[arg-type]  # None removes it (Spark's contract)
    _carried.set = text is not None


#: Counts of locks held that a pause waits out (:func:`hold_pauses_while`).
_pause_guards: list[Callable[[], int]] = []


def hold_pauses_while(held: Callable[[], int]) -> None:
    """Register ``held`` (how many locks of some kind this process holds now): a pause of the plan waits, up to 10 s,
    until every registered count is 0 before it stops the process, so that a frozen test driver holds none of them.
    The recovery layer registers its folder locks' count (the engine does not import that layer)."""
    if held not in _pause_guards:
        _pause_guards.append(held)


def _signal_self(sig: signal.Signals, what: str) -> None:
    sys.stderr.write(f"dstreams fault injection: {sig.name} {what}\n")
    sys.stderr.flush()
    if sig == signal.SIGSTOP:
        # A stop while another thread holds a lock that a driver started next would wait for (a local store's
        # folder lock, its journal or checkpointer writing, then failing that driver's start: a frozen holder is
        # never overridden) waits (bounded) for a moment when none is held: the layers that own such locks
        # register their count (:func:`hold_pauses_while`). A zombie frozen holding a lock is
        # tests/fault/test_frozen_lock_holder.py's case, not what the zombie-sink tests are about.
        deadline = time.monotonic() + 10.0
        while any(held() for held in _pause_guards) and time.monotonic() < deadline:
            time.sleep(0.001)
        # Aimed at this thread: it stops before it returns. Sent to the process, the stop is taken by whichever
        # thread the kernel wakes, and this one may go on for milliseconds (past the point) before it halts.
        signal.pthread_kill(threading.get_ident(), sig)
    else:
        os.kill(os.getpid(), sig)


# --- the task side -------------------------------------------------------------------------------------------

_parsed: dict[str, FaultPlan] = {}


def task_plan() -> FaultPlan:
    """Inside a Spark task: the task side carried by its job (:data:`NO_FAULTS` outside a task or without one)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    text = tc.getLocalProperty(PROPERTY) if tc is not None else None
    if not text:
        return NO_FAULTS
    plan = _parsed.get(text)
    if plan is None:
        plan = _parsed[text] = FaultPlan.from_task_side(text)
    return plan


def task_reached(point: str, **where: Any) -> None:
    """A task-side point: SIGKILL this task's process if a kill of the carried plan names ``point`` and this task
    removed its marker; SIGSTOP it (after writing its pid into ``<marker>.paused``) for a pause."""
    for fault in task_plan().tasks:
        if not fault.matches(point, where) or fault.marker is None or not _took(fault.marker):
            continue
        if fault.action == PAUSE:
            with open(fault.marker + ".paused.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(fault.marker + ".paused.tmp", fault.marker + ".paused")
            sys.stderr.write(f"dstreams fault injection: SIGSTOP of task process {os.getpid()} at {point}\n")
            sys.stderr.flush()
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # this thread halts before it returns
        else:
            sys.stderr.write(f"dstreams fault injection: SIGKILL of task process {os.getpid()} at {point}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def _took(marker: str) -> bool:
    """Whether this call removed ``marker`` (False: another task took it, or it is not armed yet)."""
    try:
        os.remove(marker)
    except FileNotFoundError:
        return False
    return True


def maybe_slow_task(elapsed_s: float = 0.0, spec: SlowSpec | None = None) -> float:
    """Inside a Spark task: sleep when ``spec`` (default: the carried plan's ``slow``) selects this task; returns
    the seconds slept (0.0 when off, outside a task, or not selected)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return 0.0
    spec = spec if spec is not None else task_plan().slow
    if spec is None:
        return 0.0
    partition = tc.partitionId()
    executor = current_executor_id() if spec.executors is not None else None
    if not spec.matches(executor, partition):
        return 0.0
    delay = spec.delay(elapsed_s)
    if delay > 0:
        sys.stderr.write(f"dstreams fault injection: slowing partition {partition} on executor {executor} "
                         f"by {delay:.3f} s\n")
        sys.stderr.flush()
        time.sleep(delay)
    return delay


def slowed_partition(iterator: Iterable[T]) -> Iterator[T]:
    """``rdd.mapPartitions(slowed_partition)``: passes records through, then :func:`maybe_slow_task`, given the time
    spent pulling the partition from upstream (so a slow ``factor`` scales the task's real work)."""
    start = time.monotonic()
    yield from iterator
    maybe_slow_task(time.monotonic() - start)


# --- which executor a task runs on ---------------------------------------------------------------------------

#: The main class of an executor JVM (standalone, ``local-cluster``, YARN, Kubernetes).
EXECUTOR_BACKEND = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_LOG_URL_EXECUTOR_RE = re.compile(r"[?&]executorId=([^&]+)")
_executor_id_cache: dict[int, str] = {}


def proc_cmdline(pid: int) -> list[str]:
    """The command line of process ``pid`` (Linux ``/proc``; empty when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def arg_after(argv: Sequence[str], flag: str) -> str | None:
    """The argument after ``flag`` in ``argv`` (None: no such flag)."""
    for i, a in enumerate(argv[:-1]):
        if a == flag:
            return argv[i + 1]
    return None


def current_executor_id() -> str:
    """The Spark executor id of the executor this Python worker serves (``"driver"`` in ``local[N]``).

    PySpark gives Python tasks no executor id, so it is found, in order: the ``SPARK_EXECUTOR_ID`` environment
    variable; the ``--executor-id`` argument of the nearest ancestor process that is an executor JVM (the Python
    worker is a child of the worker daemon, itself a child of the executor JVM; Linux ``/proc``); the
    ``executorId=`` of ``SPARK_LOG_URL_STDERR`` (standalone workers set it). Otherwise ``"driver"``. Cached per
    process.
    """
    pid = os.getpid()
    cached = _executor_id_cache.get(pid)
    if cached is not None:
        return cached
    found = os.environ.get("SPARK_EXECUTOR_ID") or None
    ancestor: int | None = pid
    for _ in range(8):
        if found is not None or ancestor is None or ancestor <= 1:
            break
        argv = proc_cmdline(ancestor)
        if EXECUTOR_BACKEND in argv:
            found = arg_after(argv, "--executor-id")
            break
        ancestor = _proc_ppid(ancestor)
    if found is None:
        for key in ("SPARK_LOG_URL_STDERR", "SPARK_LOG_URL_STDOUT"):
            m = _LOG_URL_EXECUTOR_RE.search(os.environ.get(key, ""))
            if m:
                found = m.group(1)
                break
    result = found or "driver"
    _executor_id_cache[pid] = result
    return result
