"""The library's error base class, and the one place that tells what a failed task failed with.

Every error dstreams raises on purpose derives from :class:`DStreamsError` (besides the standard class it has
always had: a ``ValueError`` stays a ``ValueError``), so ``except DStreamsError`` catches them all.

An error raised inside a Spark task does not reach the driver as itself: the executor's Python worker sends its
traceback as text, and the driver gets a ``Py4JJavaError`` (an RDD action) or a ``pyspark.errors.PythonException``
(a DataFrame action) whose text holds that traceback. What the task raised is then known only from that text.
:func:`failed_with` is the one function that answers "did this fail with one of these error types": by type for
errors raised on the driver (and their causes), and for a task failure by finding the types' names (or their
subclasses' names) in its text; :func:`failed_in_jvm_with` does the same for a Java exception thrown in Spark's
JVM. No other module matches error names in text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator


class DStreamsError(Exception):
    """The base class of every error dstreams raises on purpose: ``except DStreamsError`` catches them all.

    Each error keeps the standard class it had before (``KafkaConfigError`` is a ``ValueError``,
    ``StorePermissionError`` a ``PermissionError``), so code that catches those still does."""


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what caused it (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_task_failure(error: BaseException) -> bool:
    """Whether ``error`` is how Spark reports a failed task to the driver (``Py4JJavaError`` from an RDD action,
    ``pyspark.errors.PythonException`` from a DataFrame action): the task's own error is only in its text."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PythonException

    return isinstance(error, (Py4JJavaError, PythonException))


def task_traceback(error: BaseException) -> str | None:
    """The Python worker's traceback inside a Spark task failure, or None (not a task failure, or one without a
    Python traceback: a JVM-side failure)."""
    if not is_task_failure(error):
        return None
    text = str(error)
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    end = text.find("\n\tat ", start)
    return text[start:end if end > 0 else None].rstrip()


def failed_with(error: BaseException, *types: type[BaseException]) -> bool:
    """Whether ``error`` or one of its causes is one of ``types``: an instance (raised on the driver), or a task
    failure whose text names one of ``types`` or of their subclasses (raised in a task; see the module
    docstring for why text is all there is then)."""
    names: re.Pattern[str] | None = None
    for e in causes(error):
        if isinstance(e, types):
            return True
        if is_task_failure(e):
            names = names or _names_pattern(types)
            if names.search(str(e)):
                return True
    return False


def failed_in_jvm_with(error: BaseException, java_class: str) -> bool:
    """Whether ``error`` or one of its causes is a Spark failure whose text names the Java exception class
    ``java_class`` (a simple name, such as Hadoop's ``FileAlreadyExistsException``, whose ``mapred`` and ``fs``
    packages both have one), thrown in the JVM of the driver or of a task: a Java exception reaches Python only as
    the text of a ``Py4JJavaError``."""
    pattern = _words((java_class,))
    return any(is_task_failure(e) and pattern.search(str(e)) for e in causes(error))


def _names_pattern(types: tuple[type[BaseException], ...]) -> re.Pattern[str]:
    """The class names of ``types`` and of all their subclasses, each as a whole word."""
    names: set[str] = set()
    pending = list(types)
    while pending:
        cls = pending.pop()
        if cls.__name__ not in names:
            names.add(cls.__name__)
            pending.extend(cls.__subclasses__())
    return _words(names)


def _words(names: Iterable[str]) -> re.Pattern[str]:
    """Any of ``names``, each as a whole word (``StateStoreError`` is not found in ``MyStateStoreErrors``)."""
    return re.compile(r"(?<!\w)(?:" + "|".join(sorted(map(re.escape, names))) + r")(?!\w)")
