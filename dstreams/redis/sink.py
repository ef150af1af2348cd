"""Exactly-once output into a Redis stream: entry ids derived from the batch, refused by Redis when written twice.

Contract of :func:`save_to_redis_stream` (the sink behind ``DStream.saveToRedisStream``):

* **Ids.** Record ``i`` of partition ``p`` of batch ``t`` is added as entry ``<t ms>-<p * 2**32 + i>``. The ids
  are a pure function of the batch and of the record's place in it (user functions are deterministic, so a
  re-run of ``t`` produces the same records in the same places), they grow with the batch time, and inside a
  batch with the partition, then the position: a stream written by this sink holds its batches in order, and an
  entry's id says which batch wrote it (its time part is the batch time, for readers that use ids as event time).
* **Exactly once.** Redis refuses an explicit id at or below the stream's last generated id ("equal or smaller").
  The sink therefore writes a batch's entries *in id order*, from the driver, in chunks of ``chunk_size`` entries;
  each chunk is one server-side script (atomic, like ``MULTI``/``EXEC``, and one round trip) that reads the
  stream's last generated id, treats the chunk's entries at or below it as already written, **checks that they
  are there** (the same ids, the same fields) and adds the rest. A batch re-run after a failure or a driver
  restart thus adds nothing that is there and completes what a kill cut off: the chunks of a write cut off
  after chunk ``c`` are found written up to ``c`` and the rest is added, with no duplicate and no gap. Because
  each chunk is idempotent, a chunk resent after a lost connection (the client's retries, then the store's retry
  policy, :class:`~dstreams.recovery.retry.RetryPolicy`) is safe too. The batch is done when the last chunk
  returned: the scheduler records it complete only then (a batch is done only when its outputs committed).
* **Why from the driver.** Ids must reach Redis in increasing order, so the partitions of a batch cannot be
  written in parallel by the executors (partition 1's entries would make partition 0's look written). The
  executors encode the records (user functions, field conversion) in one Spark job; the driver collects the
  encoded batch and writes it in order. The batch must fit in the driver's memory (it is a micro-batch).
* **Another writer on the same key** breaks the id order the sink relies on. Entries another writer added with
  higher ids (``XADD *`` uses the wall clock, which is ahead of the batch time) make this batch's ids "already
  written" though they are not: the check finds our entries missing and the batch **fails** with
  :class:`RedisStreamConflictError` naming the key, the batch and the first id that should be there (after the
  batch's retries the context stops with it not done; nothing is lost silently). The same happens when entries
  this sink wrote were trimmed (``XTRIM``/``MAXLEN``/``XDEL``) before a re-run of their batch checked them, and
  when another writer added the same ids with other fields (two jobs writing one key). Give each job its own key.
* **Batches in order.** Batch ``t + 1``'s entries must not be written before batch ``t``'s: the sink refuses a
  context with ``concurrentBatches > 1``.
* **Fencing.** ``guard()`` (the metadata log's ``check_owner``) is called before the first chunk. A zombie driver
  paused after that check can only add entries of its batch that the owner did not write yet, with the same
  ids and (deterministic functions) the same fields, which the owner then finds written: the stream is the same.
* **Records written** (``OutputOperationInfo.records_written``): the entries this write added (0 for a re-run
  that found the batch written).
* **Refused records.** A record that cannot be encoded (not a mapping or tuple of ``fields``, a value that is not
  str, bytes, int or float) or whose entry is larger than ``max_entry_bytes`` (field names and values; the default
  is Redis's own limit on one value, 512 MiB) fails the batch, naming the batch, the partition, the position and
  the way past it. With ``dead_letters`` (``onError="deadLetter"``) it is written instead to the dead-letter
  stream ``dead_letter_key`` (default ``<key>:dead-letters``) as one entry of the fields ``output``, ``batch_ms``,
  ``part``, ``row``, ``record`` (JSON, other values as their ``repr``, cut to :data:`DEAD_RECORD_CHARS`) and
  ``error``, with the id the record would have had: that stream's entries are written by the same idempotent
  chunks, before the batch's entries, so they too are exactly once through re-runs and restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from pyspark import RDD

from dstreams import faults
from dstreams.errors import DStreamsError
from dstreams.output_records import add_written
from dstreams.recovery.retry import RetryPolicy
from dstreams.recovery.store.errors import TransientStoreError

log = logging.getLogger(__name__)

#: Entries of one partition are numbered ``p * STRIDE + i``: a partition may hold up to 2**32 records.
STRIDE = 2**32
#: Partitions above this would make the id's sequence exceed 2**53 (the script compares ids as Lua numbers).
MAX_PARTITIONS = 2**21
#: Entries per script call: bounds how long one call blocks the server (about 1 ms per 1,000 small entries).
DEFAULT_CHUNK_SIZE = 1000

#: The default bound of one entry's size (field names and values): Redis refuses a value above 512 MiB
#: (``proto-max-bulk-len``), so a larger entry would fail the write anyway.
DEFAULT_MAX_ENTRY_BYTES = 512 * 1024 * 1024
#: How much of a refused record a dead-letter entry keeps (characters of its JSON).
DEAD_RECORD_CHARS = 65536

#: A record, encoded on an executor: (entry id, [field, value, field, value, ...]).
Entry = tuple[str, list[bytes]]
Fields = Sequence[str] | Callable[[Any], Mapping[str, Any]] | None


class RedisStreamConflictError(DStreamsError, RuntimeError):
    """Entries of a batch are missing or different below the stream's last id: another writer (or a trim)."""


# KEYS[1]: the stream. ARGV[1]: the number of entries; then per entry: id, 2 * fields, field, value, ...
# Returns {added, found}, or {-1, found, expected} when fewer of the entries at or below the last id are there
# than expected, or {-2, index} when the entry at that index (1-based) has another id or other fields.
_SCRIPT = """
local key = KEYS[1]
local last_ms, last_seq = -1, -1
if redis.call('EXISTS', key) == 1 then
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      local ms, seq = string.match(info[i + 1], '^(%d+)-(%d+)$')
      last_ms, last_seq = tonumber(ms), tonumber(seq)
    end
  end
end
local n = tonumber(ARGV[1])
local ids, starts, counts = {}, {}, {}
local pos = 2
for e = 1, n do
  ids[e] = ARGV[pos]
  counts[e] = tonumber(ARGV[pos + 1])
  starts[e] = pos + 2
  pos = pos + 2 + counts[e]
end
local k = 0
while k < n do
  local ms, seq = string.match(ids[k + 1], '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if ms > last_ms or (ms == last_ms and seq > last_seq) then break end
  k = k + 1
end
if k > 0 then
  local found = redis.call('XRANGE', key, ids[1], ids[k])
  if #found ~= k then return {-1, #found, k} end
  for e = 1, k do
    local entry = found[e]
    if entry[1] ~= ids[e] or #entry[2] ~= counts[e] then return {-2, e} end
    for j = 1, counts[e] do
      if entry[2][j] ~= ARGV[starts[e] + j - 1] then return {-2, e} end
    end
  end
end
for e = k + 1, n do
  redis.call('XADD', key, ids[e], unpack(ARGV, starts[e], starts[e] + counts[e] - 1))
end
return {n - k, k}
"""


def entry_id(batch_ms: int, partition: int, index: int) -> str:
    """The id of record ``index`` of ``partition`` in the batch at ``batch_ms``."""
    return f"{batch_ms}-{partition * STRIDE + index}"


def _value(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, bool):
        raise TypeError("a bool (write it as a str or an int)")
    if isinstance(v, int):
        return str(v).encode()
    if isinstance(v, float):
        return repr(v).encode()
    raise TypeError(f"a {type(v).__name__} (field values must be str, bytes, int or float)")


def encode_record(record: Any, fields: Fields) -> list[bytes]:
    """The flat ``[field, value, ...]`` list of one record: ``fields`` None takes the record as a mapping,
    a sequence of names zips it with the record (a tuple), a function maps the record to a mapping."""
    if callable(fields):
        mapping = fields(record)
    elif fields is not None:
        if not isinstance(record, (tuple, list)) or len(record) != len(fields):
            raise TypeError(f"the record {record!r:.200} is not a tuple of {len(fields)} values for the fields "
                            f"{list(fields)}")
        mapping = dict(zip(fields, record, strict=True))
    else:
        mapping = record
    if not isinstance(mapping, Mapping) or not mapping:
        raise TypeError(f"the record {record!r:.200} is not a non-empty mapping of field -> value (pass fields="
                        "[names] for tuples, or a function returning a dict)")
    flat: list[bytes] = []
    for name, value in mapping.items():
        if not isinstance(name, str):
            raise TypeError(f"field name {name!r} of the record {record!r:.200} is not a str")
        try:
            flat += [name.encode("utf-8"), _value(value)]
        except TypeError as e:
            raise TypeError(f"field {name!r} of the record {record!r:.200} is {e}") from None
    return flat


def dead_letter_fields(output: str, batch_ms: int, p: int, i: int, record: Any, error: str) -> list[bytes]:
    """A refused record's dead-letter entry (module docstring)."""
    import json

    try:
        text = json.dumps(record, default=repr)
    except (TypeError, ValueError):  # a circular structure, a float key...
        text = json.dumps(repr(record))
    if len(text) > DEAD_RECORD_CHARS:
        text = text[:DEAD_RECORD_CHARS - 3] + "..."
    values = {"output": output, "batch_ms": str(batch_ms), "part": str(p), "row": str(i), "record": text,
              "error": error}
    return [b for name, value in values.items() for b in (name.encode(), value.encode("utf-8", "replace"))]


def encode_partition(batch_ms: int, fields: Fields, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
                     dead_letters: str | None = None) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    """The executor side: each record of partition ``p`` as ``(id, flat fields)``. A record that cannot be encoded or
    whose entry is larger than ``max_entry_bytes`` fails the task naming the batch, the partition, the record's
    position and the way past it; with ``dead_letters`` (the output's name) it becomes ``(id, dead-letter fields,
    True)`` instead (:func:`dead_letter_fields`)."""

    def encode(p: int, records: Iterable[Any]) -> Iterator[Any]:
        if p >= MAX_PARTITIONS:
            raise ValueError(f"saveToRedisStream: partition {p} of batch {batch_ms}: at most {MAX_PARTITIONS} "
                             "partitions (repartition the stream)")
        for i, record in enumerate(records):
            eid = entry_id(batch_ms, p, i)
            try:
                flat = encode_record(record, fields)
                size = sum(len(b) for b in flat)
                if size > max_entry_bytes:
                    raise ValueError(f"its entry is {size} bytes, larger than maxEntryBytes={max_entry_bytes}")
            except Exception as e:
                if dead_letters is not None:
                    error = f"{type(e).__name__}: {e}"
                    yield eid, dead_letter_fields(dead_letters, batch_ms, p, i, record, error), True
                    continue
                raise type(e)(f"saveToRedisStream: batch {batch_ms}, partition {p}, record {i}: {e}. "
                              "saveToRedisStream(..., onError='deadLetter') writes such records to a dead-letter "
                              "stream instead and goes on with the batch") from None
            yield eid, flat

    return encode


def _chunks(entries: list[Entry], size: int) -> Iterator[list[Entry]]:
    for start in range(0, len(entries), size):
        yield entries[start:start + size]


def _script_args(chunk: list[Entry]) -> list[Any]:
    args: list[Any] = [len(chunk)]
    for eid, flat in chunk:
        args += [eid, len(flat), *flat]
    return args


_scripts: dict[int, Any] = {}


def _script(client: Any) -> Any:
    """The sink's script registered with ``client`` (redis-py sends ``EVALSHA``, and loads it when the server does
    not know it, e.g. after a restart)."""
    script = _scripts.get(id(client))
    if script is None:
        script = _scripts[id(client)] = client.register_script(_SCRIPT)
    return script


def write_chunk(client: Any, key: str, chunk: list[Entry], batch_ms: int) -> tuple[int, int]:
    """Write one chunk with the script; returns (added, found already written). Raises
    :class:`RedisStreamConflictError` when entries at or below the stream's last id are not ours, and
    :class:`TransientStoreError` for a lost connection (the chunk is idempotent: resending it is safe)."""
    import redis

    try:
        script = _script(client)
        result = [int(x) for x in script(keys=[key], args=_script_args(chunk))]
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise TransientStoreError(f"Redis connection lost while writing batch {batch_ms} to the stream {key!r}: "
                                  f"{type(e).__name__}: {e}") from e
    if result[0] == -1:
        raise RedisStreamConflictError(
            f"saveToRedisStream: batch {batch_ms} looks written to the stream {key!r} (its last id is at or above "
            f"{chunk[result[2] - 1][0]}), but only {result[1]} of the {result[2]} entries from {chunk[0][0]} on are "
            "there: another writer added entries with higher ids to this key, or entries of this batch were "
            "trimmed (XTRIM, MAXLEN, XDEL) before it was re-run. The sink needs the key to itself: give it its "
            "own key")
    if result[0] == -2:
        eid = chunk[result[1] - 1][0]
        raise RedisStreamConflictError(
            f"saveToRedisStream: the entry {eid} of batch {batch_ms} in the stream {key!r} has other fields than "
            "this batch's record: another writer added entries with this sink's ids (two jobs writing one key?), "
            "or the stream's functions are not deterministic. The sink needs the key to itself")
    return result[0], result[1]


def save_to_redis_stream(rdd: RDD, batch_ms: int, url: str, key: str, fields: Fields = None,
                         guard: Callable[[], None] | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
                         policy: RetryPolicy | None = None, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
                         dead_letter_key: str | None = None) -> int:
    """Write the records of ``rdd`` (batch ``batch_ms``) to the stream ``key`` at ``url`` exactly once (see the
    module docstring); returns the entries added (0 when the batch was already written). With ``dead_letter_key``
    the records refused go there (module docstring, "Refused records")."""
    from .source import client as redis_client

    output = f"saveToRedisStream({key})"
    encoded = rdd.mapPartitionsWithIndex(encode_partition(
        batch_ms, fields, max_entry_bytes, output if dead_letter_key is not None else None)).collect()
    dead: list[Entry] = [(e[0], e[1]) for e in encoded if len(e) == 3]
    entries: list[Entry] = [e for e in encoded if len(e) == 2] if dead else encoded
    if guard is not None:
        guard()
    faults.reached("sink-write")
    client = redis_client(url)
    policy = policy or RetryPolicy.from_env()
    added = found = 0
    for target, items in ((dead_letter_key, dead), (key, entries)):
        for chunk in _chunks(items, chunk_size):
            assert target is not None, "records are refused (dead) only when there is a dead_letter_key"
            a, f = policy.call(partial(write_chunk, client, target, chunk, batch_ms), op="xadd", key=target,
                               where=url)
            if target == key:
                added += a
                found += f
            if a:
                faults.reached("redis-sink-chunk")
    if dead:
        log.warning("saveToRedisStream: batch %d: %d records refused went to the dead-letter stream %s", batch_ms,
                    len(dead), dead_letter_key)
    if found:
        log.info("saveToRedisStream: batch %d: %d entries of %s were already written, %d added", batch_ms, found,
                 key, added)
    add_written(added)
    return added
