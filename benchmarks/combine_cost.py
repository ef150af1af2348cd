"""The map-side combine per partition: the engine's dict fold against an Arrow group-by and two dict variants.

Run from the repository root::

    python -m benchmarks.combine_cost                 # ~1 min; --repeat N, --pairs N

Contract: in this process (no Spark), each candidate reduces one partition's ``--pairs`` (100,000 by
default) ``(key, value)`` tuples by key with ``operator.add`` and returns ``(key, sum)`` pairs; cases:
1,000 / 10,000 / 100,000 distinct keys drawn uniformly (seeded); ``str`` keys (``"w<i>"``, every pair's
key a new string object whose hash is not cached yet, as the words a ``flatMap`` splits from lines are:
hashing them is part of a real combine's cost) or ``int`` keys; values all ``1`` (WordCount's,
``countByValue``'s) or ints in ``[1, 100)`` (already-reduced counts, as the post-shuffle merge and a
window's panes see). Candidates:

* ``dict``: :func:`dstreams.spark.partitioned.combiner` with ``operator.add``, the engine's fold
  (:func:`dstreams.spark.partitioned.fold`: ``+`` inlined, the key read with ``acc[k]`` in a ``try`` until many
  keys are new, then ``k in acc``);
* ``before``: the engine's combine before that fold (``dict.get`` with a sentinel, ``operator.add``
  called for a repeated key);
* ``inline``: chunks of 4,096 records; a chunk of exact 2-tuples (checked with C loops: ``list.count``
  over ``map(type, ...)`` and ``map(len, ...)``) folded with ``+`` inlined and no per-record check, any
  other chunk record by record as ``dict`` does;
* ``count``: as ``inline``, but a chunk of exact ``(key, 1)`` pairs is counted by CPython's C loop behind
  ``Counter`` (``collections._count_elements``);
* ``arrow``: chunks of 65,536 pairs checked (exact 2-tuples, one exact key type ``str`` or ``int``,
  exact ``int`` values, no int64 overflow of a sum), turned into an Arrow table and reduced with pyarrow's
  hash group-by (``Table.group_by(...).aggregate``), the chunks' results grouped again, then turned back
  into Python pairs (``to_pylist``).

Every candidate's result is checked equal to ``dict``'s, value types included, and in the same order but
for ``arrow`` (its group-by does not keep the keys' first-seen order). The
repetitions run the candidates round-robin (each on freshly made pairs), so that they share the
machine's load, and time each run in CPU time of this process (``time.process_time``: waiting for a core
that other processes hold does not count; their cache pressure still does); each figure is the median
(and the minimum) over ``--repeat`` runs, in CPU milliseconds per partition; ratios are medians against
``dict``. Writes ``benchmarks/results/combine_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import random
import statistics
import sys
import time
from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "combine_cost.json"
CHUNK = 4096
ARROW_CHUNK = 65_536
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_MISSING = object()
Combine = Callable[[Iterable[Any]], Iterable[tuple[Any, Any]]]


def _exact_pairs(chunk: list[Any]) -> bool:
    """Whether every record of ``chunk`` is an exact 2-tuple (C loops: ``list.count`` over ``map``)."""
    n = len(chunk)
    return list(map(type, chunk)).count(tuple) == n and list(map(len, chunk)).count(2) == n


def _all_ones(chunk: list[Any]) -> bool:
    """Whether every pair of ``chunk`` (exact 2-tuples) has the value int 1 (not ``True``, not ``1.0``)."""
    values = list(map(_SECOND, chunk))
    n = len(chunk)
    return values.count(1) == n and list(map(type, values)).count(int) == n


def _fold_inline(acc: dict[Any, Any], chunk: list[Any]) -> None:
    """Fold a chunk of exact pairs into ``acc`` with ``+`` inlined."""
    get = acc.get
    missing = _MISSING
    for k, v in chunk:
        old = get(k, missing)
        acc[k] = v if old is missing else old + v


def _fold_checked(acc: dict[Any, Any], chunk: list[Any]) -> None:
    """Fold any chunk, checking each record as the engine's combiner does (its error for a non-pair)."""
    from dstreams.spark.partitioned import require_pair

    get = acc.get
    missing = _MISSING
    for x in chunk:
        k, v = x if (type(x) is tuple and len(x) == 2) else require_pair(x, "combine_cost")
        old = get(k, missing)
        acc[k] = v if old is missing else old + v


def before_add(it: Iterable[Any]) -> Iterable[tuple[Any, Any]]:
    """The engine's combine before issue 16's fold (kept as the reference): ``dict.get`` with a sentinel
    and a call of ``operator.add`` for a repeated key, one check per record."""
    from dstreams.spark.partitioned import require_pair

    func = operator.add
    acc: dict[Any, Any] = {}
    get = acc.get
    missing = _MISSING
    for x in it:
        if type(x) is tuple and len(x) == 2:
            k, v = x
        else:
            k, v = require_pair(x, "combine_cost")
        old = get(k, missing)
        acc[k] = v if old is missing else func(old, v)
    return acc.items()


def count_add(it: Iterable[Any]) -> Iterable[tuple[Any, Any]]:
    """``operator.add`` by key: exact ``(key, 1)`` chunks counted in C, others as :func:`inline_add`.

    The same result as the dict fold: a new key gets ``0 + 1`` (the int 1), a known one ``old + 1``.
    """
    acc: dict[Any, Any] = {}
    source = iter(it)
    while chunk := list(islice(source, CHUNK)):
        if not _exact_pairs(chunk):
            _fold_checked(acc, chunk)
        elif _all_ones(chunk):
            _count_elements(acc, map(_FIRST, chunk))
        else:
            _fold_inline(acc, chunk)
    return acc.items()


def inline_add(it: Iterable[Any]) -> Iterable[tuple[Any, Any]]:
    """``operator.add`` by key, in chunks: a chunk of exact pairs (checked in C) folded with ``+`` inlined
    and no per-record check; any other chunk checked record by record."""
    acc: dict[Any, Any] = {}
    source = iter(it)
    while chunk := list(islice(source, CHUNK)):
        if _exact_pairs(chunk):
            _fold_inline(acc, chunk)
        else:
            _fold_checked(acc, chunk)
    return acc.items()


def arrow_add(it: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """``operator.add`` by key with pyarrow's hash group-by, for exact (str or int key, int value) pairs.

    An exact result needs the checks: every record an exact 2-tuple, every key exactly ``str`` (or exactly
    ``int``: no ``bool``, no subclass), every value exactly ``int``, no int64 overflow of a sum. This
    benchmark's pairs pass them; a production path would fall back to the dict fold otherwise.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    tables = []
    source = iter(it)
    while chunk := list(islice(source, ARROW_CHUNK)):
        if set(map(type, chunk)) != {tuple} or set(map(len, chunk)) != {2}:
            raise TypeError("not exact pairs")
        keys, values = list(map(_FIRST, chunk)), list(map(_SECOND, chunk))
        key_types, value_types = set(map(type, keys)), set(map(type, values))
        if len(key_types) != 1 or key_types - {str, int} or value_types != {int}:
            raise TypeError("not str/int keys with int values")
        key_type = pa.string() if str in key_types else pa.int64()
        values_arr = pa.array(values, pa.int64())
        lo_hi = pc.min_max(values_arr)
        if max(abs(lo_hi["min"].as_py()), abs(lo_hi["max"].as_py()), 1) * len(values) >= 2**63:
            raise OverflowError("a sum could overflow int64")
        table = pa.table({"k": pa.array(keys, key_type), "v": values_arr})
        tables.append(table.group_by("k", use_threads=False).aggregate([("v", "sum")])
                      .rename_columns(["k", "v"]))
    if not tables:
        return iter(())
    out = tables[0]
    if len(tables) > 1:
        out = pa.concat_tables(tables).group_by("k", use_threads=False).aggregate([("v", "sum")])
    return zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True)


def make_pairs(count: int, distinct: int, str_keys: bool, ones: bool, seed: int = 16) -> list[tuple[Any, int]]:
    """``count`` pairs over ``distinct`` keys; each ``str`` key a new object (no cached hash)."""
    rng = random.Random(seed)
    draw = rng.randrange
    if str_keys:
        return [(f"w{draw(distinct)}", 1 if ones else draw(1, 100)) for _ in range(count)]
    return [(draw(distinct) * 7919, 1 if ones else draw(1, 100)) for _ in range(count)]


def same_result(out: list[tuple[Any, Any]], expected: list[tuple[Any, Any]], ordered: bool) -> bool:
    """The same (key, value) pairs with the same types; in the same order too when ``ordered`` (Arrow's
    group-by does not keep the keys' first-seen order, which the dict folds do)."""
    if not ordered:
        out, expected = sorted(out), sorted(expected)
    return out == expected and [type(v) for _, v in out] == [type(v) for _, v in expected]


def candidates() -> dict[str, Combine]:
    from dstreams.spark.partitioned import combiner

    return {"dict": combiner(operator.add, "combine_cost"), "before": before_add, "inline": inline_add,
            "count": count_add, "arrow": arrow_add}


def measure(pairs: int, repeat: int, distincts: tuple[int, ...] = (1_000, 10_000, 100_000)
            ) -> list[dict[str, Any]]:
    runs = candidates()
    names = list(runs)
    rows = []
    for ones in (True, False):
        for str_keys in (True, False):
            for distinct in distincts:
                expected = list(runs["dict"](make_pairs(pairs, distinct, str_keys, ones)))
                times: dict[str, list[float]] = {n: [] for n in names}
                for rep in range(repeat):
                    for name in names[rep % len(names):] + names[:rep % len(names)]:
                        data = make_pairs(pairs, distinct, str_keys, ones)  # fresh keys each run
                        t0 = time.process_time()
                        out = list(runs[name](data))
                        times[name].append((time.process_time() - t0) * 1e3)
                        if not same_result(out, expected, ordered=name != "arrow"):
                            raise AssertionError(f"{name} differs from dict: {distinct} keys, str={str_keys}")
                row: dict[str, Any] = {"values": "1" if ones else "1..99", "keys": "str" if str_keys else "int",
                                       "distinct": distinct}
                for name, ts in times.items():
                    row[name] = {"median_ms": statistics.median(ts), "min_ms": min(ts)}
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.combine_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    load = os.getloadavg()
    rows = measure(args.pairs, args.repeat)
    names = list(candidates())
    print(f"{args.pairs:,} pairs per partition, operator.add; median (min) CPU ms; ratio = median / dict's; "
          f"load average at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    print(f"{'values':6s} {'keys':4s} {'distinct':>8s} " + " ".join(f"{n:>13s}" for n in names) + " "
          + " ".join(f"{n + '/dict':>11s}" for n in names[1:]))
    for r in rows:
        base = r["dict"]["median_ms"]
        cells = " ".join(f"{r[n]['median_ms']:6.1f} ({r[n]['min_ms']:4.1f})" for n in names)
        ratios = " ".join(f"{r[n]['median_ms'] / base:11.2f}" for n in names[1:])
        print(f"{r['values']:6s} {r['keys']:4s} {r['distinct']:8,d} {cells} {ratios}")
    command = "python -m benchmarks.combine_cost " + " ".join(sys.argv[1:] if argv is None else argv)
    doc = {"benchmark": "combine_cost", "command": command.strip(),
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
           "load_average_start_end": [load[0], os.getloadavg()[0]],
           "pairs": args.pairs, "repeat": args.repeat, "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
