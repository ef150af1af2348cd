"""What happens to a batch that fails: the failure policy, and the errors a failed batch surfaces as.

Contract of :class:`FailurePolicy` (``spark.dstreams.batch.maxAttempts`` and ``spark.dstreams.batch.onFailure``):

* A batch that fails while it is built (a source, a driver-side function) or while it runs (an output operation)
  is tried again, after :func:`retry_delay` (0.5 s, 1 s, 2 s, ... at most 10 s), until it has had
  ``max_attempts`` tries.
* Past that, ``on_failure`` decides: ``stop`` stops the context with the batch not done (a restart with
  ``getOrCreate`` runs it again), ``dropInput`` drops the batch's input and goes on (state and windows never see
  it; a restart that replays the batch drops it again).
* A stop that comes while a failed batch waits for its next try ends the batch not done.

The policy only decides; the generator and the runners (``dstreams.scheduler.generator``,
``dstreams.scheduler.runner``) act on what it says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import DStreamsError, task_traceback
from ..time import BatchTime

#: What a failed batch's error says about going past a bad record (its second line).
WAYS_PAST_A_BAD_RECORD = (
    "If one record causes it: map/flatMap/filter/mapValues/flatMapValues(..., onError='deadLetter') (or "
    "spark.dstreams.onRecordError=deadLetter) route the records their function raises on to the dead letters "
    "(ssc.deadLetters()), saveToPostgres(..., onError='deadLetter') the rows its table refuses; "
    "spark.dstreams.batch.onFailure=dropInput drops a batch that keeps failing and goes on.")

#: After a failed try: ``retry`` (wait :meth:`FailurePolicy.delay`, then try again), ``stop`` (the context stops
#: with the batch not done) or ``drop`` (the batch's input is dropped and the stream goes on).
Step = Literal["retry", "stop", "drop"]


class BatchFailedError(DStreamsError, RuntimeError):
    """A batch's output operation failed inside Spark; the message carries the Python traceback.

    ``__cause__`` is the original error (a ``Py4JJavaError`` with the full JVM stack trace).
    """

    def __init__(self, batch_time: BatchTime, operation: str, detail: str) -> None:
        cause = last_line(detail)
        super().__init__(f"batch {batch_time.ms} failed in output operation {operation!r}: {cause}\n"
                         f"{WAYS_PAST_A_BAD_RECORD}\n{detail}")
        self.batch_time = batch_time
        self.operation = operation
        self.cause = cause


class BatchNotDoneError(DStreamsError, RuntimeError):
    """Waiting for a batch that will not complete: the context stopped on an error first (``__cause__``)."""


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (a traceback's exception line), at most 1,000 characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:1000] if lines else ""


def retry_delay(attempt: int) -> float:
    """Seconds to wait before try ``attempt + 1`` of a failed batch: 0.5, 1, 2, ... at most 10."""
    return min(10.0, 0.5 * 2 ** (attempt - 1))


def describe(error: BaseException) -> str:
    """The Python traceback inside a Spark task failure, else the error's own text."""
    tb = task_traceback(error)
    return tb if tb is not None else f"{type(error).__name__}: {error}"


def user_facing_error(error: BaseException, batch_time: BatchTime, operation: str) -> BaseException:
    """Errors raised in the driver stay as they are; task failures (:func:`dstreams.errors.task_traceback`) become
    :class:`BatchFailedError`."""
    tb = task_traceback(error)
    if tb is None:
        return error
    wrapped = BatchFailedError(batch_time, operation, tb)  # its first line: the output and the cause
    wrapped.__cause__ = error
    return wrapped


@dataclass(frozen=True)
class FailurePolicy:
    """How many tries a failing batch gets and what happens after the last (module docstring)."""

    max_attempts: int = 3
    on_failure: str = "stop"

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"spark.dstreams.batch.maxAttempts must be >= 1, got {self.max_attempts}")
        if self.on_failure not in ("stop", "dropInput"):
            raise ValueError(f"spark.dstreams.batch.onFailure must be 'stop' or 'dropInput', got {self.on_failure!r}")

    def after(self, attempts: int, stopping: bool = False) -> Step:
        """What to do after try number ``attempts`` failed (``stopping``: the context is being stopped)."""
        if attempts < self.max_attempts and not stopping:
            return "retry"
        if stopping or self.on_failure == "stop":
            return "stop"
        return "drop"

    @staticmethod
    def delay(attempts: int) -> float:
        """Seconds to wait before the try after try number ``attempts``."""
        return retry_delay(attempts)
