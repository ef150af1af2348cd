"""Pipelines whose types must NOT check (issue 41 item 6): each line marked ``# rejected`` must be an error of mypy
with the project's settings, and no other line may be (``tests/unit/test_typing.py``). Never run, never imported."""

from __future__ import annotations

import operator

from dstreams import DStream, StreamingContext
from dstreams.api.event_time import TimedDStream


def rejected(ssc: StreamingContext) -> None:
    numbers: DStream[int] = ssc.queueStream([[1, 2]])
    words: DStream[str] = ssc.textFileStream("in")
    pairs: DStream[tuple[str, int]] = words.map(lambda w: (w, 1))
    strings: DStream[int] = numbers.map(str)  # rejected
    words.reduceByKey(operator.add)  # rejected
    numbers.join(pairs)  # rejected
    pairs.reduceByKey(lambda a, b: a + "x")  # rejected
    numbers.filter(lambda n: n.upper())  # rejected
    counts: DStream[tuple[str, str]] = pairs.runningReduce(operator.add)  # rejected
    timed: TimedDStream[int] = words.withEventTime(float)  # rejected
    widened: DStream[bool] = numbers  # rejected
    del strings, counts, timed, widened
