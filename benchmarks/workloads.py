"""The paper's three workloads, written once against the DStream API that dstreams and ``pyspark.streaming`` share.

Contract:

* Input: 100-byte text lines of common words made inside the executors by
  :func:`dstreams.nodes.generator.text_records` (deterministic in seed, batch, partition).
* ``build(ssc, lines, interval_s, sink)`` registers the workload's output on a stream of lines and
  works unchanged on a ``dstreams`` and on a ``pyspark.streaming`` ``StreamingContext``: the very same
  Python functions run in both engines.
* Grep counts the lines containing :data:`PATTERN`; WordCount keeps per-word counts over a 30 s window
  sliding by one batch with an inverse function; TopKCount takes the 10 most frequent words of that
  window. Each output brings a small result to the driver (``sink``), as a real job would.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from dstreams.nodes.generator import text_records

PATTERN = "error"
WINDOW_S = 30.0
TOP_K = 10
SEED = 7

Sink = Callable[[Any], None]


def grep_match(line: str) -> bool:
    """Grep's predicate: the line contains :data:`PATTERN`."""
    return PATTERN in line


def word_pairs(line: str) -> list[tuple[str, int]]:
    """WordCount's map: ``(word, 1)`` for every word of the line."""
    return [(w, 1) for w in line.split()]


def top_k(pairs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """The :data:`TOP_K` most frequent words (ties by word), computed on the driver from a small RDD."""
    return sorted(pairs, key=lambda kv: (-kv[1], kv[0]))[:TOP_K]


def positive(kv: tuple[str, int]) -> bool:
    """Filter for the windowed counts: drop words whose count fell back to zero."""
    return kv[1] > 0


def build_grep(ssc: Any, lines: Any, interval_s: float, sink: Sink) -> None:
    lines.filter(grep_match).foreachRDD(lambda rdd: sink(rdd.count()))


def _windowed_counts(lines: Any, interval_s: float) -> Any:
    parallelism = lines.context().sparkContext.defaultParallelism
    return lines.flatMap(word_pairs).reduceByKeyAndWindow(
        operator.add, operator.sub, WINDOW_S, interval_s, parallelism, positive
    )


def build_wordcount(ssc: Any, lines: Any, interval_s: float, sink: Sink) -> None:
    _windowed_counts(lines, interval_s).foreachRDD(lambda rdd: sink(len(rdd.collect())))


def build_topk(ssc: Any, lines: Any, interval_s: float, sink: Sink) -> None:
    _windowed_counts(lines, interval_s).foreachRDD(lambda rdd: sink(top_k(rdd.collect())))


# ------------------------------------------------------------------- dstreams' vectorized (Arrow) path
def arrow_grep_count(batch: Any) -> list[int]:
    """Grep on an Arrow chunk of lines: the number of lines containing :data:`PATTERN`."""
    import pyarrow.compute as pc

    return [pc.sum(pc.match_substring(batch.column(0), PATTERN)).as_py() or 0]


def arrow_word_counts(batch: Any) -> list[tuple[str, int]]:
    """WordCount's map on an Arrow chunk: ``(word, count in the chunk)`` per distinct word."""
    import pyarrow.compute as pc

    counts = pc.value_counts(pc.list_flatten(pc.utf8_split_whitespace(batch.column(0))))
    return list(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))


def build_grep_arrow(ssc: Any, lines: Any, interval_s: float, sink: Sink) -> None:
    lines.mapArrowBatches(arrow_grep_count).foreachRDD(lambda rdd: sink(sum(rdd.collect())))


def _windowed_counts_arrow(lines: Any, interval_s: float) -> Any:
    parallelism = lines.context().sparkContext.defaultParallelism
    return lines.mapArrowBatches(arrow_word_counts).reduceByKeyAndWindow(
        operator.add, operator.sub, WINDOW_S, interval_s, parallelism, positive
    )


def build_wordcount_arrow(ssc: Any, lines: Any, interval_s: float, sink: Sink) -> None:
    _windowed_counts_arrow(lines, interval_s).foreachRDD(lambda rdd: sink(len(rdd.collect())))


def build_topk_arrow(ssc: Any, lines: Any, interval_s: float, sink: Sink) -> None:
    _windowed_counts_arrow(lines, interval_s).foreachRDD(lambda rdd: sink(top_k(rdd.collect())))


@dataclass(frozen=True)
class Workload:
    name: str
    #: Per-record Python functions: runs on dstreams and on pyspark.streaming unchanged.
    build: Callable[[Any, Any, float, Sink], None]
    #: The same workload through dstreams' ``mapArrowBatches`` (vectorized with pyarrow.compute).
    build_arrow: Callable[[Any, Any, float, Sink], None]
    windowed: bool


WORKLOADS: dict[str, Workload] = {
    "grep": Workload("grep", build_grep, build_grep_arrow, False),
    "wordcount": Workload("wordcount", build_wordcount, build_wordcount_arrow, True),
    "topk": Workload("topk", build_topk, build_topk_arrow, True),
}


def partition_records(seed: int, time_ms: int, partition: int, n: int) -> Iterator[str]:
    """The generator both DStream engines use (dstreams' default ``generatorStream`` record function)."""
    return text_records(seed, time_ms, partition, n)


# ----------------------------------------------------------------------------------- Structured Streaming
#: Words of the generator, for the SQL version of the text (same vocabulary, same line length).
def vocabulary() -> list[str]:
    from dstreams.nodes.generator import _WORDS

    return list(_WORDS)


def line_pool(size: int = 256) -> list[str]:
    """A pool of the generator's 100-byte lines (Structured Streaming picks its lines from it)."""
    return sorted(set(text_records(SEED, 0, 0, 4096)))[:size]
