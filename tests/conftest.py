"""Shared fixtures: one SparkContext for the whole test run (a context costs seconds to start), and the
Redis fixtures (``redis_url``, ``redis_client``, ``redis_prefix``), ``postgres_dsn`` and ``kafka_bootstrap``.

Also the services rule (see tests/support.py): ``--require-services`` (or ``CI=true`` /
``DSTREAMS_REQUIRE_SERVICES=1``) turns a missing server into a failure, and the run ends with a line
per server saying how many tests ran against it (the Ceph RADOS Gateway, the Redis server). A test runs
against Ceph when it uses an ``rgw_bucket`` fixture, is parametrised with the ``"rgw"`` backend, or is
marked ``ceph``; against Redis when it uses the ``redis_url`` fixture (``redis_client`` does) or is
marked ``redis``; against PostgreSQL when it uses ``postgres_dsn``; against the Kafka broker when it uses
``kafka_bootstrap`` or is marked ``kafka``. In required mode, tests of a server
collected but none run against it fails the session.

Parallel runs (pytest-xdist, ``scripts/test.sh``: ``-n 2 --dist loadgroup``): each worker has its own session
``sc`` and counts the outcomes of the tests it ran per server; the workers send those counts to the controller
(``pytest_testnodedown``), which prints the lines and applies the rule above to the whole run. Two markers say
what may not overlap (``scripts/test.sh`` honours both): ``serial``, a test that takes a shared service down
(the project's gateway, its Kafka broker) or compares timings, runs alone after the parallel part
(``--serial-tests=skip`` leaves those out of a run, ``--serial-tests=only`` runs only them); and the tests that
run one after another on one worker, beside the rest (the fault tests, the standalone clusters of loopback hosts,
the wheel built in the checkout: :data:`ONE_WORKER_FOLDERS`, :data:`ONE_WORKER_MODULES`).
"""

from __future__ import annotations

import os
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from .support import (
    KAFKA_BOOTSTRAP,
    POSTGRES_DSN,
    REDIS_URL,
    REQUIRE_ENV,
    RGW_ENDPOINT,
    require_kafka,
    required_by,
    service_unavailable,
    services_required,
)

if TYPE_CHECKING:
    import redis

    from dstreams.faults import FaultPlan

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@dataclass
class _Service:
    """A server that some tests run against, and what happened to those tests in this run."""

    marker: str  # added to every test that uses the server
    short: str  # "Ceph": "3 Ceph tests skipped"
    title: str  # "the Ceph RADOS Gateway": "tests ran against the Ceph RADOS Gateway at ..."
    endpoint: str
    fixtures: frozenset[str]  # a test using one of these runs against the server
    param: str | None = None  # so does a test parametrised with this value
    collected: set[str] = field(default_factory=set)  # node ids that will run (after -k / -m)
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> passed | failed | skipped | error
    skip_reasons: dict[str, int] = field(default_factory=dict)

    def used_by(self, item: pytest.Item) -> bool:
        if item.get_closest_marker(self.marker) or self.fixtures & set(getattr(item, "fixturenames", ())):
            return True
        if self.param is None:
            return False
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        return any(isinstance(value, str) and value == self.param for value in params)

    def to_wire(self) -> dict[str, object]:
        """What a pytest-xdist worker sends its controller (plain data): see :meth:`merge`."""
        return {"collected": sorted(self.collected), "outcomes": dict(self.outcomes),
                "skip_reasons": dict(self.skip_reasons)}

    def merge(self, sent: dict) -> None:
        """Adds a worker's :meth:`to_wire`: every worker collects every test, and reports the ones it ran."""
        self.collected.update(sent["collected"])
        self.outcomes.update(sent["outcomes"])
        for reason, n in sent["skip_reasons"].items():
            self.skip_reasons[reason] = self.skip_reasons.get(reason, 0) + n

    def counts(self) -> dict[str, int]:
        counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for outcome in self.outcomes.values():
            counts[outcome] += 1
        return counts

    def problem(self, config: pytest.Config) -> str | None:
        """In required mode: why the run did not test against this server, else None."""
        if not services_required() or config.option.collectonly or not self.collected:
            return None
        counts = self.counts()
        if counts["passed"] + counts["failed"] == 0:
            return (
                f"{len(self.collected)} {self.short} tests were collected but none ran against {self.title} "
                f"at {self.endpoint} (services are required: {required_by()})"
            )
        return None


_SERVICES = (
    _Service("ceph", "Ceph", "the Ceph RADOS Gateway", RGW_ENDPOINT, frozenset({"rgw_bucket"}), param="rgw"),
    _Service("redis", "Redis", "the Redis server", REDIS_URL, frozenset({"redis_url"})),
    _Service("postgres", "PostgreSQL", "the PostgreSQL server", POSTGRES_DSN, frozenset({"postgres_dsn"})),
    _Service("kafka", "Kafka", "the Kafka broker", KAFKA_BOOTSTRAP, frozenset({"kafka_bootstrap"})),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-services",
        action="store_true",
        default=False,
        help=f"fail (do not skip) tests whose server is not available; same as {REQUIRE_ENV}=1",
    )
    parser.addoption(
        "--serial-tests",
        choices=("all", "skip", "only"),
        default="all",
        help="the tests marked serial (they must run alone): all (default) runs them with the rest, skip leaves "
        "them out (the parallel part of scripts/test.sh), only runs only them (its serial part)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ceph: runs against the Ceph RADOS Gateway (added automatically)")
    config.addinivalue_line("markers", "redis: runs against the Redis server (added automatically)")
    config.addinivalue_line("markers", "postgres: runs against the PostgreSQL server (added automatically)")
    config.addinivalue_line("markers", "kafka: runs against the Kafka broker (added automatically)")
    if config.getoption("--require-services"):
        os.environ[REQUIRE_ENV] = "1"  # also seen by subprocesses and tests/support.py


#: A test parametrised with one of these values runs against an S3 server (the moto server, the Ceph RADOS Gateway):
#: marker ``s3`` (``scripts/test.sh --fast`` leaves such tests out: it starts no server).
S3_PARAMS = frozenset({"moto", "rgw"})


#: The tests that run on one pytest-xdist worker, one after another (scope ``heavy``): every test of
#: ``tests/fault/`` (driver processes and their JVMs started, killed and started again, executors lost, clusters:
#: three of them at once on two cores took three times as long and ran past their timeouts), and the modules
#: that start a Spark standalone cluster on the loopback hosts (tests/standalone_cluster.py: two clusters never
#: run at once) or build the wheel in the checkout (``pip wheel`` writes ``build/`` and ``*.egg-info`` there).
#: The other workers run the rest beside them, each test on its own (:func:`pytest_xdist_make_scheduler`).
ONE_WORKER_FOLDERS = ("tests/fault/",)
ONE_WORKER_MODULES = frozenset({
    "tests/integration/test_submit_packed.py",
    "tests/integration/test_wheel.py",
})
ONE_WORKER_SCOPE = "heavy"


def xdist_scope(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes: :data:`ONE_WORKER_SCOPE` for the tests of
    :data:`ONE_WORKER_FOLDERS` and :data:`ONE_WORKER_MODULES`, each other test on its own."""
    module = nodeid.split("::", 1)[0]
    return ONE_WORKER_SCOPE if module in ONE_WORKER_MODULES or module.startswith(ONE_WORKER_FOLDERS) else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 (xdist's Producer, scheduler)
    """``--dist loadgroup``: xdist's load-scope scheduling with :func:`xdist_scope` as the scope. (Not the
    ``xdist_group`` marks: pytest-xdist 3.8 puts the group in ``item._nodeid``, which pytest 9 no longer reads,
    so those marks group nothing.) Other ``--dist`` modes: xdist's own scheduler."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _OneWorkerScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return _OneWorkerScopes(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _select_serial(config, items)
    for item in items:
        for service in _SERVICES:
            if not item.get_closest_marker(service.marker) and service.used_by(item):
                item.add_marker(getattr(pytest.mark, service.marker))
        callspec = getattr(item, "callspec", None)
        params = {v for v in callspec.params.values() if isinstance(v, str)} if callspec is not None else set()
        if not item.get_closest_marker("s3") and S3_PARAMS & params:
            item.add_marker(pytest.mark.s3)


def _select_serial(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--serial-tests=skip|only``: deselect the tests marked ``serial``, or all the others."""
    choice = config.getoption("--serial-tests")
    if choice == "all":
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (keep if (item.get_closest_marker("serial") is not None) == (choice == "only") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests of each server that will run (after -k / -m deselection)."""
    for service in _SERVICES:
        service.collected.clear()
        service.collected.update(item.nodeid for item in session.items if item.get_closest_marker(service.marker))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for service in _SERVICES:
        if report.nodeid not in service.collected:
            continue
        if report.when == "call" or report.outcome != "passed":
            if report.skipped:
                outcome = "skipped"
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                reason = reason.removeprefix("Skipped: ")
                service.skip_reasons[reason] = service.skip_reasons.get(reason, 0) + 1
            elif report.failed:
                outcome = "failed" if report.when == "call" else "error"
            else:
                outcome = "passed"
            service.outcomes.setdefault(report.nodeid, outcome)  # the first non-passing phase decides


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:  # a pytest-xdist worker: the controller judges the whole run
        worker_output["dstreams_services"] = {service.marker: service.to_wire() for service in _SERVICES}
        return
    if any(service.problem(session.config) for service in _SERVICES) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error: object) -> None:  # noqa: ANN001 (xdist's WorkerController)
    """pytest-xdist's controller: a worker ended; add what its tests did against each server."""
    sent = getattr(node, "workeroutput", {}).get("dstreams_services", {})
    for service in _SERVICES:
        if service.marker in sent:
            service.merge(sent[service.marker])


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # noqa: ANN001
    if config.option.collectonly:
        return
    for service in _SERVICES:
        if service.collected:
            _write_service_summary(terminalreporter, config, service)


def _write_service_summary(terminalreporter, config: pytest.Config, service: _Service) -> None:  # noqa: ANN001
    counts = service.counts()
    ran = counts["passed"] + counts["failed"]
    detail = [f"{counts['passed']} passed"]
    detail += [f"{counts['failed']} failed"] if counts["failed"] else []
    detail += [f"{counts['error']} errored in set-up or tear-down"] if counts["error"] else []
    detail += [f"{counts['skipped']} skipped"] if counts["skipped"] else []
    not_reached = len(service.collected) - len(service.outcomes)
    detail += [f"{not_reached} not run"] if not_reached else []
    line = f"dstreams: {ran} tests ran against {service.title} at {service.endpoint} ({', '.join(detail)})"
    ok = ran > 0 and counts["failed"] + counts["error"] == 0
    terminalreporter.write_line(line, bold=True, green=ok, yellow=not ok)
    for reason, n in sorted(service.skip_reasons.items(), key=lambda kv: -kv[1])[:3]:
        terminalreporter.write_line(f"dstreams:   {n} {service.short} tests skipped: {reason}", yellow=True)
    problem = service.problem(config)
    if problem:
        terminalreporter.write_line(f"dstreams: ERROR: {problem}", red=True, bold=True)


@pytest.fixture(scope="session")
def sc():
    from dstreams.spark.sparkconf import create_spark_context

    local_dir = tempfile.mkdtemp(prefix="dstreams-spark-local-", dir=os.environ.get("DSTREAMS_TEST_TMP"))
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={local_dir}",
        "spark.default.parallelism": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.dstreams.ui.port": "0",  # every test's status server on a free port: parallel runs never clash
    }
    context = create_spark_context("local[2]", "dstreams-tests", conf)
    yield context
    context.stop()


@pytest.fixture(autouse=True)
def _no_active_context_leak():
    """Every test must stop the StreamingContexts it starts."""
    yield
    from dstreams import StreamingContext

    active = StreamingContext.getActive()
    if active is not None:
        active.stop(stopSparkContext=False)
        pytest.fail("a test left a StreamingContext active")


# ---------------------------------------------------------------- Redis (scripts/services.sh starts it)


@pytest.fixture
def fault_plan() -> Iterator[Callable[[FaultPlan], None]]:
    """Installs fault points in this process for the test (``dstreams.faults``): ``fault_plan(FaultPlan(...))``
    (again to change the plan, ``fault_plan(NO_FAULTS)`` to take it out); the test's end takes it out. The task side
    reaches the tasks of the batches (and checkpoints) that start after it."""
    from dstreams import faults

    yield faults.install
    faults.install(faults.NO_FAULTS)


@pytest.fixture
def redis_url() -> str:
    """The test Redis server's URL, once it answered PING within 2 s; otherwise the test skips, or fails
    when services are required (tests/support.py)."""
    try:
        import redis
    except ImportError:
        service_unavailable("redis-py is not installed: pip install -e '.[test]'")
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as e:
        service_unavailable(f"Redis server at {REDIS_URL} is not reachable ({e}); run `bash scripts/services.sh start`")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def postgres_dsn() -> str:
    """The test PostgreSQL server's DSN, once it answered within 5 s; otherwise the test skips, or fails when
    services are required (tests/support.py)."""
    try:
        import psycopg
    except ImportError:
        service_unavailable("psycopg is not installed: pip install -e '.[test]'")
    try:
        psycopg.connect(POSTGRES_DSN, connect_timeout=5).close()
    except psycopg.Error as e:
        service_unavailable(f"PostgreSQL at {POSTGRES_DSN} is not reachable ({e}); run "
                            "`bash scripts/services.sh start postgres`")
    return POSTGRES_DSN


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own: ``redis_client`` deletes every key under it afterwards."""
    return f"dstreams-test:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def redis_client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    """A client of the test Redis server (strings decoded); the test's keys (``redis_prefix``) are deleted
    after it."""
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10, socket_connect_timeout=2)
    try:
        yield client
    finally:
        try:
            keys = list(client.scan_iter(match=f"{redis_prefix}*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
        except redis.RedisError as e:  # e.g. the test left the server down: nothing to fail the test for
            warnings.warn(f"could not delete the test's Redis keys {redis_prefix}* at {redis_url}: {e}", stacklevel=1)
        finally:
            client.close()


# ---------------------------------------------------------------- Kafka (scripts/services.sh starts it)


@pytest.fixture(scope="module")
def kafka_bootstrap() -> str:
    """The test Kafka broker's bootstrap servers, once it answered a metadata request within 5 s (checked once per
    module); otherwise the tests skip, or fail when services are required (tests/support.py)."""
    return require_kafka()
