"""Shared fixtures: one SparkContext for the whole test run (a context costs seconds to start).

Also the services rule (see tests/support.py): ``--require-services`` (or ``CI=true`` /
``DSTREAMS_REQUIRE_SERVICES=1``) turns a missing server into a failure, and the run ends with a line
saying how many tests ran against the Ceph RADOS Gateway. A test runs against Ceph when it uses an
``rgw_bucket`` fixture, is parametrised with the ``"rgw"`` backend, or is marked ``ceph``; in required
mode, Ceph tests collected but none run against it fails the session.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from .support import REQUIRE_ENV, RGW_ENDPOINT, required_by, services_required

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

_CEPH_FIXTURES = {"rgw_bucket"}
_CEPH_PARAM = "rgw"
_ceph_collected: set[str] = set()
_ceph_outcomes: dict[str, str] = {}  # nodeid -> passed | failed | skipped | error
_ceph_skip_reasons: dict[str, int] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-services",
        action="store_true",
        default=False,
        help=f"fail (do not skip) tests whose server is not available; same as {REQUIRE_ENV}=1",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ceph: runs against the Ceph RADOS Gateway (added automatically)")
    if config.getoption("--require-services"):
        os.environ[REQUIRE_ENV] = "1"  # also seen by subprocesses and tests/support.py


def _uses_ceph(item: pytest.Item) -> bool:
    if item.get_closest_marker("ceph") or _CEPH_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(isinstance(value, str) and value == _CEPH_PARAM for value in params)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.get_closest_marker("ceph") and _uses_ceph(item):
            item.add_marker(pytest.mark.ceph)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The Ceph tests that will run (after -k / -m deselection)."""
    _ceph_collected.clear()
    _ceph_collected.update(item.nodeid for item in session.items if item.get_closest_marker("ceph"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid not in _ceph_collected:
        return
    if report.when == "call" or report.outcome != "passed":
        if report.skipped:
            outcome = "skipped"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            _ceph_skip_reasons[reason] = _ceph_skip_reasons.get(reason, 0) + 1
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
        else:
            outcome = "passed"
        _ceph_outcomes.setdefault(report.nodeid, outcome)  # the first non-passing phase decides


def _ceph_counts() -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome in _ceph_outcomes.values():
        counts[outcome] += 1
    return counts


def _ceph_problem(config: pytest.Config) -> str | None:
    """In required mode: why the run did not test against Ceph, else None."""
    if not services_required() or config.option.collectonly or not _ceph_collected:
        return None
    counts = _ceph_counts()
    if counts["passed"] + counts["failed"] == 0:
        return (
            f"{len(_ceph_collected)} Ceph tests were collected but none ran against the Ceph RADOS Gateway "
            f"at {RGW_ENDPOINT} (services are required: {required_by()})"
        )
    return None


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _ceph_problem(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # noqa: ANN001
    if not _ceph_collected or config.option.collectonly:
        return
    counts = _ceph_counts()
    ran = counts["passed"] + counts["failed"]
    detail = [f"{counts['passed']} passed"]
    detail += [f"{counts['failed']} failed"] if counts["failed"] else []
    detail += [f"{counts['error']} errored in set-up or tear-down"] if counts["error"] else []
    detail += [f"{counts['skipped']} skipped"] if counts["skipped"] else []
    not_reached = len(_ceph_collected) - len(_ceph_outcomes)
    detail += [f"{not_reached} not run"] if not_reached else []
    line = f"dstreams: {ran} tests ran against the Ceph RADOS Gateway at {RGW_ENDPOINT} ({', '.join(detail)})"
    ok = ran > 0 and counts["failed"] + counts["error"] == 0
    terminalreporter.write_line(line, bold=True, green=ok, yellow=not ok)
    for reason, n in sorted(_ceph_skip_reasons.items(), key=lambda kv: -kv[1])[:3]:
        terminalreporter.write_line(f"dstreams:   {n} Ceph tests skipped: {reason}", yellow=True)
    problem = _ceph_problem(config)
    if problem:
        terminalreporter.write_line(f"dstreams: ERROR: {problem}", red=True, bold=True)


@pytest.fixture(scope="session")
def sc():
    from dstreams.sparkconf import create_spark_context

    local_dir = tempfile.mkdtemp(prefix="dstreams-spark-local-", dir=os.environ.get("DSTREAMS_TEST_TMP"))
    conf = {
        "spark.local.dir": local_dir,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={local_dir}",
        "spark.default.parallelism": "2",
        "spark.sql.shuffle.partitions": "2",
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
