"""One error base class and one place that tells what a failed task failed with (dstreams/errors.py, issue 41)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PythonException

import dstreams
from dstreams.errors import DStreamsError, failed_in_jvm_with, failed_with, is_task_failure, task_traceback
from dstreams.recovery.store.errors import (
    PreconditionFailed,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
    TransientStoreError,
)
from dstreams.statestore import StateStoreError

from ..support import library_errors

#: A standard class some errors had before DStreamsError: each keeps it, so code that catches it still does.
STANDARD_BASES = {
    "KafkaConfigError": ValueError,
    "KafkaDecodeError": ValueError,
    "CorruptCheckpointError": ValueError,
    "GraphChangedError": ValueError,
    "ForeignCheckpointError": ValueError,
    "StorePermissionError": PermissionError,
    "PreconditionFailed": FileExistsError,
    "BatchFailedError": RuntimeError,
    "StateStoreError": RuntimeError,
    "StreamingContextStateError": RuntimeError,
}


def test_every_public_error_of_the_library_derives_from_dstreams_error():
    errors = library_errors()
    assert len(errors) >= 30, sorted(errors)  # the walk found the modules (kafka, recovery, api included)
    assert {"dstreams.kafka.errors.KafkaDataLossError", "dstreams.recovery.store.errors.StoreError",
            "dstreams.api.context.StreamingContextStateError",
            "dstreams.scheduler.failure.BatchFailedError"} <= set(errors)
    outside = sorted(name for name, cls in errors.items() if not issubclass(cls, DStreamsError))
    assert not outside, f"errors that do not derive from DStreamsError: {outside}"


def test_the_errors_keep_their_standard_classes():
    by_name = {cls.__name__: cls for cls in library_errors().values()}
    for name, base in STANDARD_BASES.items():
        assert issubclass(by_name[name], base), (name, base)
    with pytest.raises(ValueError):  # an except ValueError written before DStreamsError still catches it
        raise by_name["KafkaConfigError"]("bootstrap.servers is missing")


def test_dstreams_error_is_exported():
    assert "DStreamsError" in dstreams.__all__
    assert dstreams.DStreamsError is DStreamsError
    assert DStreamsError.__bases__ == (Exception,)


# ---------------------------------------------------------------- failed_with: on the driver, by type


def _raised_from(error: BaseException, cause: BaseException, implicit: bool = False) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            if implicit:
                raise error  # noqa: B904 - the cause as __context__, as an error raised while handling another
            raise error from inner
    except BaseException as outer:
        return outer


def test_failed_with_by_type_on_the_driver():
    assert failed_with(StateStoreError("x"), StateStoreError)
    assert failed_with(StorePermissionError("x"), StoreError)  # a subclass
    assert failed_with(_raised_from(RuntimeError("wrapped"), StateStoreError("inner")), StateStoreError)
    assert failed_with(_raised_from(RuntimeError("wrapped"), StateStoreError("inner"), implicit=True),
                       StateStoreError)
    assert failed_with(TransientStoreError("x"), StoreUnavailableError, TransientStoreError)
    assert not failed_with(ValueError("a bug"), StateStoreError)
    assert not failed_with(StoreUnavailableError("x"), StateStoreError)
    # An error raised on the driver is known by its type, never by its text.
    assert not failed_with(RuntimeError("StateStoreError: mentioned in a message"), StateStoreError)
    assert not is_task_failure(RuntimeError("x"))
    assert task_traceback(ValueError("Traceback (most recent call last): not a task")) is None


def test_failed_with_a_cycle_of_causes_ends():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert not failed_with(a, StateStoreError)


# ---------------------------------------------------------------- failed_with: in a task, by the failure's text


def _task_failure(sc, error: BaseException) -> Py4JJavaError:
    def fail(_: int) -> int:
        raise error

    with pytest.raises(Py4JJavaError) as raised:
        sc.parallelize([1], 1).map(fail).collect()
    return raised.value


def test_failed_with_an_error_raised_in_a_task(sc):
    failure = _task_failure(sc, StateStoreError("partition 0: no version 7"))
    assert is_task_failure(failure)
    assert failed_with(failure, StateStoreError)
    assert failed_with(_raised_from(RuntimeError("the batch failed"), failure), StateStoreError)  # a cause of it
    assert not failed_with(failure, StoreUnavailableError, TransientStoreError)
    tb = task_traceback(failure)
    assert tb is not None and tb.startswith("Traceback (most recent call last):")
    assert "StateStoreError: partition 0: no version 7" in tb
    assert "\tat org.apache" not in tb  # the JVM's stack is not part of the Python traceback


def test_failed_with_a_subclass_raised_in_a_task(sc):
    """A task that raised a subclass of the asked type counts, as ``isinstance`` would on the driver."""
    failure = _task_failure(sc, TransientStoreError("503 Slow Down"))
    assert failed_with(failure, StoreError)
    assert failed_with(failure, TransientStoreError)
    assert not failed_with(failure, StorePermissionError, PreconditionFailed)


def test_a_name_inside_a_longer_word_is_not_a_match(sc):
    failure = _task_failure(sc, ValueError("see MyStateStoreErrors and StateStoreErrorCount"))
    assert not failed_with(failure, StateStoreError)


def test_a_dataframe_task_failure_counts_too():
    """A DataFrame action reports a failed Python task as ``pyspark.errors.PythonException``."""
    failure = PythonException(
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in f\n"
        "dstreams.recovery.store.errors.StoreUnavailableError: the store kept failing for 30 s\n")
    assert is_task_failure(failure)
    assert failed_with(failure, StoreUnavailableError)
    assert not failed_with(failure, StateStoreError)
    assert "StoreUnavailableError: the store kept failing" in (task_traceback(failure) or "")


def test_a_java_exception_is_found_in_the_failure_s_text(sc, tmp_path):
    sc.parallelize(["a"], 1).saveAsTextFile(str(tmp_path / "out"))
    with pytest.raises(Py4JJavaError) as raised:
        sc.parallelize(["b"], 1).saveAsTextFile(str(tmp_path / "out"))
    assert failed_in_jvm_with(raised.value, "FileAlreadyExistsException")
    assert not failed_in_jvm_with(raised.value, "AlreadyExists")
    assert not failed_in_jvm_with(RuntimeError("FileAlreadyExistsException"), "FileAlreadyExistsException")


ROOT = Path(__file__).resolve().parents[2]
#: An error's class name compared with a name or looked for in a text: what only dstreams/errors.py may do.
BY_NAME = re.compile(r"""__name__\s*[!=]=\s*["']\w*(?:Error|Exception)["']"""
                     r"""|["']\w*(?:Error|Exception)["']\s+(?:not\s+)?in\b""")


def test_only_the_errors_module_tells_errors_by_their_names():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("dstreams", "api", "recovery") for path in sorted((ROOT / folder).rglob("*.py"))
             if path != ROOT / "dstreams" / "errors.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if BY_NAME.search(line)]
    assert not found, "classify errors with dstreams.errors.failed_with / failed_in_jvm_with:\n" + "\n".join(found)
