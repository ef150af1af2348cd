"""Redis Streams source: the direct approach (no receivers), each stream key a partition, entry ids as offsets.

Contract (``StreamingContext.redisStream``):

* **A batch is a pure function of its ranges.** While batch ``t`` is generated (on the event loop), the
  driver fixes, for every key, the range ``(after, until]`` of entry ids the batch holds and how many
  entries that is; the ranges are the batch's offsets, written to the metadata log before the batch runs
  (the input contract of :mod:`.input`). The executors read exactly those ranges with ``XRANGE``, one
  task per key. Lineage recomputation, speculation and a restarted driver (which rebuilds unfinished
  batches from the recorded ranges) all read the same entries: with the exactly-once sinks, every entry
  counts once end to end.
* **Where a batch ends.** Without a rate limit, at the key's newest entry (``XINFO STREAM``, O(1)). With
  one (``maxRatePerPartition`` records per second, or the engine's rate control when the input contract
  offers it), at the last of the first ``limit`` entries after ``after``, found by a short server-side
  script that returns only that id and the count.
* **Start position** (``startFrom``): ``"earliest"`` (every entry), ``"latest"`` (entries added after
  the stream starts), or a dict ``{key: id}``: the entries *after* that id, as ``XREAD`` reads (keys
  not in the dict start at the earliest). A restarted driver continues where the last generated batch
  ended (``node_state``).
* **Records**: ``(key, entry_id, fields)`` with ``fields`` a ``dict`` of ``str`` (UTF-8), or what
  ``decoder(key, entry_id, fields)`` returns. A decoder that raises fails the task with the key and
  entry id in the message.
* **Bad input.** A missing key fails at ``start()`` (or, with ``missingKeys="wait"``, counts as empty
  until it appears). Entries the server trimmed (``XTRIM``, ``MAXLEN``, ``XDEL``) before this stream read
  them fail the batch with the key and the gap, unless ``onTrimmed="skip"`` (then the stream goes on
  from the oldest remaining entry and logs what was lost); a range that lost entries between its
  definition and its read (the executors find fewer entries than recorded, e.g. a batch recorded before a
  driver crash and replayed after it) is handled the same way: it fails the task, or with ``onTrimmed="skip"``
  the executor logs how many entries were lost and the batch holds the ones that remain. A context restored
  from a checkpoint keeps the options it was started with: to switch to ``onTrimmed="skip"`` on restart, use
  ``StreamingContext.getOrCreate(path, setupFunc, rebuildGraph=True)`` with a ``setupFunc`` that passes it (the
  option is not part of the graph's topology; the keys are, and a changed key list is refused).
* **Fixing a batch changes nothing until the batch is fixed** (the input contract's failure rule): the ranges
  are fixed on copies of the positions; a connection error on any key leaves the positions as they were.
  An unreachable server raises :class:`~dstreams.contracts.SourceUnavailableError` after the
  client's retries; the driver rides it out like a store outage (``spark.dstreams.store.outageSeconds``),
  in ``start()`` too (the scheduler runs every source's ``start`` through its outage wait).
* **Positions for monitoring tools** (``commitToGroup="<group>"``): after each completed batch the driver
  moves the consumer group ``<group>`` of every key to the end of that batch's range (``XGROUP SETID``;
  the group is created at the key's current position if it does not exist), so that ``XINFO GROUPS``
  and Redis dashboards show how far the stream has read. It only moves forward, and it is for watching
  only: the positions the stream resumes from are the metadata log's, and a failed update is logged,
  never fails a batch. Entries are not delivered through the group (no ``XREADGROUP``, no pending list).
  The updates run on a background thread of the source (:class:`GroupPositionWriter`), not on the
  scheduler's event loop: a slow or unreachable Redis never delays batch generation; while it is slow the
  positions coalesce (the newest per key waits), and ``stop()`` applies the last ones (bounded wait).
* **A low watermark from the entry ids** (``eventTimeFromIds``, for event time; MillWheel's injector
  watermark of a log): when the producers' entry ids *are* the records' event times (``"explicit"``: they
  ``XADD`` with the event time in ms as the id; ``"auto"``: ``XADD *``, the server's append time is the
  event time, i.e. ingestion time) and the stream's ``withEventTime`` extracts that time, the source
  declares (:meth:`~dstreams.nodes.input.InputNode.event_time_watermark`) that batch ``t`` and later hold
  no event time below the minimum over keys of how far batch ``t - 1`` read each key: ids only grow per
  key, so an entry not read yet is newer than its key's position. A key that lags (a backlog, a rate limit)
  thus holds the watermark back instead of having its entries dropped as late. A key that had nothing more
  to read: with ``"auto"`` its next id is at least the server's clock when the batch was fixed (``TIME``,
  asked before ``XINFO``), so an idle key does not hold the watermark; with ``"explicit"`` it holds it at
  its newest id (as an idle MillWheel injector does). A replayed batch declares its key positions only (a
  lower, still sound bound); the watermark itself is recorded in the metadata log with each batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from dstreams.contracts import SourceUnavailableError
from dstreams.errors import DStreamsError
from dstreams.nodes.group_positions import GROUP_WRITER_STOP_S, GroupPositionWriter
from dstreams.nodes.input import InputNode
from dstreams.records import consume
from dstreams.time import BatchTime

if TYPE_CHECKING:
    from dstreams.graph import DStreamGraph

log = logging.getLogger(__name__)

Decoder = Callable[[str, str, dict[str, str]], Any]

#: What ``eventTimeFromIds`` accepts (besides None).
EVENT_TIME_ID_MODES = ("auto", "explicit")

#: Entries per ``XRANGE`` call, in the executors and in the driver's limit script.
READ_CHUNK = 10_000

#: ``KEYS[1]`` the stream, ``ARGV``: the exclusive start id, the limit (> 0), the chunk size. Returns
#: ``{count, last id}`` of the first ``limit`` entries after the start (the start id when none).
_LIMIT_SCRIPT = """
local after, limit, chunk = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local n, last = 0, after
while n < limit do
  local want = math.min(chunk, limit - n)
  local r = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', want)
  if #r == 0 then break end
  n = n + #r
  last = r[#r][1]
  if #r < want then break end
end
return {n, last}
"""

_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def id_after(a: str, b: str) -> bool:
    """Whether stream entry id ``a`` comes after ``b``."""
    return _parse_id(a) > _parse_id(b)


def client(url: str) -> Any:
    """One redis-py client per URL and process (driver or Python worker), with bounded retries."""
    with _clients_lock:
        c = _clients.get(url)
        if c is None:
            try:
                import redis
                from redis.backoff import ExponentialBackoff
                from redis.retry import Retry
            except ImportError:  # pragma: no cover - an installation problem
                raise ImportError("the Redis Streams source needs redis-py: pip install 'dstreams[redis]' "
                                  "(or pip install redis)") from None
            c = redis.Redis.from_url(
                url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5,
                retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), 5),
                retry_on_error=[redis.ConnectionError, redis.TimeoutError])
            _clients[url] = c
        return c


def _unavailable(url: str, what: str, error: BaseException) -> SourceUnavailableError:
    return SourceUnavailableError(f"Redis at {url} is unavailable while {what}: {type(error).__name__}: {error}")


def _is_connection_error(error: BaseException) -> bool:
    import redis

    return isinstance(error, (redis.ConnectionError, redis.TimeoutError))


#: How the trimmed-entries errors name the way out (the options of a restored graph are the stored ones).
SKIP_TRIMMED_HOW = (
    "To go on without them (they are lost): restart with StreamingContext.getOrCreate(path, setupFunc, "
    "rebuildGraph=True) where setupFunc passes redisStream(..., onTrimmed='skip') (without a checkpoint: pass "
    "onTrimmed='skip'). A context restored from a checkpoint keeps the options it was started with; "
    "rebuildGraph=True builds the graph from setupFunc, checks that its topology (the stream keys) is the stored "
    "one's, and the batches recorded before the restart then skip what was trimmed too. To lose nothing, keep "
    "entries until the stream has read them (trim below its position)")


def read_range(url: str, key: str, after: str, until: str, count: int | None, decoder: Decoder | None,
               on_trimmed: str = "fail") -> Iterator[Any]:
    """The entries of ``key`` in ``(after, until]`` (executor side), checking that ``count`` came back.

    Fewer entries than ``count`` (entries trimmed or deleted after the range was fixed, e.g. under a batch
    recorded before a driver restart) raise :class:`TrimmedEntriesError`, or with ``on_trimmed="skip"`` are
    logged (with how many were lost) and the entries that remain are the range's records.
    """
    c = client(url)
    seen = 0
    start = after
    while True:
        try:
            chunk = c.xrange(key, min=f"({start}", max=until, count=READ_CHUNK)
        except Exception as e:
            if _is_connection_error(e):
                raise _unavailable(url, f"reading {key} ({after}, {until}]", e) from e
            raise
        for entry_id, fields in chunk:
            seen += 1
            if decoder is None:
                yield (key, entry_id, fields)
            else:
                try:
                    yield decoder(key, entry_id, fields)
                except Exception as e:
                    raise ValueError(f"the decoder failed on the Redis stream entry {key} {entry_id} "
                                     f"({type(e).__name__}: {e}); fields: {str(fields)[:200]}") from e
        if len(chunk) < READ_CHUNK:
            break
        start = chunk[-1][0]
    if count is not None and seen != count:
        if on_trimmed == "skip":
            log.warning("stream key %r: the batch range (%s, %s] held %d entries when it was defined and the "
                        "server returned %d: %d entries were trimmed or deleted before they were read "
                        "(onTrimmed='skip': they are lost)", key, after, until, count, seen, count - seen)
            return
        raise TrimmedEntriesError(
            f"stream key {key!r}: {count - seen} of the {count} entries of the batch range ({after}, {until}] were "
            f"trimmed or deleted before they were read. {SKIP_TRIMMED_HOW}")


class TrimmedEntriesError(DStreamsError, RuntimeError):
    """Entries the stream had not read yet were removed from the server."""


class RedisStreamsInputNode(InputNode):
    """``redisStream``: see the module docstring for the contract."""

    def __init__(self, graph: DStreamGraph, url: str, keys: Sequence[str], start_from: str | Mapping[str, str],
                 decoder: Decoder | None, max_rate_per_partition: float | None, on_trimmed: str,
                 missing_keys: str, commit_to_group: str | None = None,
                 event_time_from_ids: str | None = None) -> None:
        # Checked before the node joins the graph: a bad argument leaves no half-made source behind.
        if isinstance(keys, str):
            keys = [keys]
        keys = list(keys)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"redisStream needs one or more stream keys (non-empty strings), got {keys!r}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"redisStream keys must be distinct, got {keys!r}")
        if isinstance(start_from, str) and start_from not in ("earliest", "latest"):
            raise ValueError(f"startFrom must be 'earliest', 'latest' or a dict {{key: entry id}}, got {start_from!r}")
        if isinstance(start_from, Mapping):
            unknown = sorted(set(start_from) - set(keys))
            if unknown:
                raise ValueError(f"startFrom names keys that are not read by this stream: {unknown}")
            for k, v in start_from.items():
                try:
                    _parse_id(str(v))
                except ValueError:
                    raise ValueError(
                        f"startFrom[{k!r}] = {v!r} is not a stream entry id like '1700000000000-0'") from None
        if on_trimmed not in ("fail", "skip"):
            raise ValueError(f"onTrimmed must be 'fail' or 'skip', got {on_trimmed!r}")
        if missing_keys not in ("fail", "wait"):
            raise ValueError(f"missingKeys must be 'fail' or 'wait', got {missing_keys!r}")
        if max_rate_per_partition is not None and max_rate_per_partition <= 0:
            raise ValueError(f"maxRatePerPartition must be positive, got {max_rate_per_partition}")
        if commit_to_group is not None and (not isinstance(commit_to_group, str) or not commit_to_group):
            raise ValueError(f"commitToGroup must be a consumer group name (a non-empty string), "
                             f"got {commit_to_group!r}")
        if event_time_from_ids not in (None, *EVENT_TIME_ID_MODES):
            raise ValueError(f"eventTimeFromIds must be None, 'auto' (XADD * ids: append time as event time) or "
                             f"'explicit' (the producers' ids are the event times in ms), got {event_time_from_ids!r}")
        super().__init__(graph)
        self.commit_to_group = commit_to_group
        self.event_time_from_ids = event_time_from_ids
        #: Per batch time: the watermark the next batch may declare (ms), see the module docstring.
        self._next_caps: dict[int, int] = {}
        #: Per key, whether the batch being fixed read up to the key's newest entry.
        self._caught_up: dict[str, bool] = {}
        self.url = url
        self.keys = keys
        self.start_from = dict(start_from) if isinstance(start_from, Mapping) else start_from
        self.decoder = decoder
        self.max_rate_per_partition = max_rate_per_partition
        self.on_trimmed = on_trimmed
        self.missing_keys = missing_keys
        #: The id each key's next batch starts after (the end of the last generated batch).
        self.positions: dict[str, str] = {}
        #: ``entries-added`` of each key up to its position, when known (exact record counts per batch).
        self.added: dict[str, int] = {}
        self._restored = False

    #: With ``commitToGroup``, the thread that moves the groups (made by ``start()``, stopped by ``stop()``).
    _group_writer: GroupPositionWriter | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_next_caps={}, _caught_up={})  # per run: a restored graph starts without them
        state.pop("_group_writer", None)  # a thread: each run starts its own
        return state

    def event_time_watermark(self, time: BatchTime) -> int | None:
        """With ``eventTimeFromIds``: the minimum over keys of how far the batch before ``time`` read them
        (see the module docstring); None otherwise, or before the first batch."""
        if self.event_time_from_ids is None:
            return None
        return self._next_caps.get(time.ms - self.slide_duration.ms)

    def _record_cap(self, time: BatchTime, ranges: list[tuple[str, str, str, int | None]],
                    server_ms: int | None) -> None:
        caps = []
        for key, _after, until, _count in ranges:
            position = _parse_id(until)[0]
            if server_ms is not None and self._caught_up.get(key, False):
                position = max(position, server_ms)
            caps.append(position)
        self._next_caps[time.ms] = min(caps)
        horizon = time.ms - 100 * self.slide_duration.ms
        for t in [t for t in self._next_caps if t < horizon]:
            del self._next_caps[t]

    def _server_ms(self) -> int:
        """The Redis server's clock (``TIME``), ms."""
        try:
            seconds, micros = self._client().time()
        except Exception as e:
            if _is_connection_error(e):
                raise _unavailable(self.url, "reading the server's clock", e) from e
            raise
        return int(seconds) * 1000 + int(micros) // 1000

    def describe_params(self) -> list[str]:
        return [f"keys={','.join(self.keys)}"]

    def batch_completed(self, info: Any) -> None:
        """Rate control (the input contract), then, with ``commitToGroup``, the end of the completed batch's
        ranges handed to the group writer (:class:`GroupPositionWriter`: on the event loop, this never waits
        for Redis)."""
        super().batch_completed(info)
        writer = self._group_writer
        offsets = self.offsets_at(BatchTime(info.batch_time_ms)) if writer is not None else None
        if writer is None or info.failed or not isinstance(offsets, dict):
            return
        writer.offer({str(key): str(until) for key, _after, until, _count in offsets.get("ranges", [])})

    def wait_group_positions(self, timeout_s: float) -> bool:
        """Whether, within ``timeout_s``, every position handed to the group writer so far was applied (or its
        update failed and was logged); True at once without ``commitToGroup`` or before ``start()``."""
        writer = self._group_writer
        return True if writer is None else writer.wait_idle(timeout_s)

    def _move_group(self, key: str, entry_id: str) -> None:
        assert self.commit_to_group is not None
        self._set_group_position(key, self.commit_to_group, entry_id)

    def _set_group_position(self, key: str, group: str, entry_id: str) -> None:
        import redis

        r = self._client()
        try:
            r.xgroup_setid(key, group, entry_id)
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e).upper():
                raise
            r.xgroup_create(key, group, entry_id)

    # ----------------------------------------------------------------- driver side
    def _client(self) -> Any:
        return client(self.url)

    def _info(self, key: str) -> dict[str, Any] | None:
        """``XINFO STREAM key`` (None when the key does not exist)."""
        import redis

        try:
            return self._client().xinfo_stream(key)
        except redis.ResponseError as e:
            if "no such key" in str(e).lower():
                return None
            raise
        except Exception as e:
            if _is_connection_error(e):
                raise _unavailable(self.url, f"reading the stream {key!r}", e) from e
            raise

    def start(self) -> None:
        missing = []
        for key in self.keys:
            info = self._info(key)
            if info is None:
                missing.append(key)
            if self._restored and key in self.positions:
                continue
            if isinstance(self.start_from, dict) and key in self.start_from:
                self.positions[key] = str(self.start_from[key])
            elif self.start_from == "latest" and info is not None:
                self.positions[key] = str(info["last-generated-id"])
                self.added[key] = int(info.get("entries-added", 0))
            else:
                self.positions[key] = "0-0"
                self.added[key] = 0
        if missing and self.missing_keys == "fail":
            raise ValueError(
                f"the Redis stream key(s) {missing} do not exist at {self.url}: create them first (XADD, or "
                "XGROUP CREATE <key> <group> $ MKSTREAM), fix the key names, or pass missingKeys='wait' to read "
                "them once they appear")
        if self.commit_to_group is not None and self._group_writer is None:  # last: a failed start leaves none
            self._group_writer = GroupPositionWriter(f"dstreams-redis-group-{self.key}", self._move_group,
                                                     f"consumer group {self.commit_to_group!r} at {self.url}",
                                                     newer=id_after)

    def stop(self) -> None:
        """Stop the group writer (it applies the positions it holds first, for at most
        :data:`GROUP_WRITER_STOP_S`)."""
        writer, self._group_writer = self._group_writer, None
        if writer is not None:
            writer.stop(GROUP_WRITER_STOP_S)

    def node_state(self) -> Any:
        return {"positions": dict(self.positions), "added": dict(self.added)}

    def restore_node_state(self, state: Any) -> None:
        if isinstance(state, dict) and isinstance(state.get("positions"), dict):
            self.positions = {str(k): str(v) for k, v in state["positions"].items()}
            self.added = {str(k): int(v) for k, v in (state.get("added") or {}).items()}
            self._restored = True

    def _limit(self, time: BatchTime) -> int | None:
        """Maximum entries per key for batch ``time`` (None: unlimited)."""
        limits: list[int] = []
        if self.max_rate_per_partition is not None:
            seconds = self.slide_duration.ms / 1000.0
            limits.append(max(1, int(self.max_rate_per_partition * seconds)))
        n = self.max_records_per_partition(time, len(self.keys))  # the input contract's rate control
        if n is not None:
            limits.append(max(1, int(n)))
        return min(limits) if limits else None

    def _check_trimmed(self, key: str, after: str, info: dict[str, Any], added: dict[str, int]) -> None:
        """Fail (or, with ``onTrimmed="skip"``, log and go on) when entries after ``after`` were removed.

        Two signs: ``XDEL`` removed an entry after the position (``max-deleted-entry-id``), or the oldest
        entry is past the position and fewer entries remain than were added since (``XTRIM``/``MAXLEN``;
        known when the count up to the position is known). Going on reads what remains after the position.
        ``added`` is the batch's working copy of :attr:`added`.
        """
        deleted = str(info.get("max-deleted-entry-id") or "0-0")
        first = info.get("first-entry")
        first_id = str(first[0]) if first else None
        gap = None
        if id_after(deleted, after):
            gap = f"entries after {after} up to {deleted} were deleted"
        elif first_id is not None and id_after(first_id, after) and key in added:
            expected = int(info.get("entries-added", 0)) - added[key]
            length = int(info.get("length", 0))
            if length < expected:
                gap = f"{expected - length} entries after {after} were trimmed"
        if gap is None:
            return
        if self.on_trimmed == "skip":
            log.warning("stream key %r: %s before this stream read them; going on from the oldest remaining entry "
                        "%s (onTrimmed='skip': those entries are lost)", key, gap, first_id)
            added.pop(key, None)  # the count up to the position is no longer known
            return
        raise TrimmedEntriesError(
            f"stream key {key!r}: {gap} (XTRIM, MAXLEN, XDEL) before this stream read them; the oldest remaining "
            f"entry is {first_id}. {SKIP_TRIMMED_HOW}")

    def _fix_range(self, key: str, after: str, limit: int | None,
                   added: dict[str, int]) -> tuple[str, int | None, bool]:
        """The end of ``key``'s next range after ``after``, its entry count (None: unknown) and whether it
        reaches the key's newest entry. Changes nothing on the node: ``added`` is the batch's working copy of
        :attr:`added` (the input contract's failure rule)."""
        info = self._info(key)
        if info is None:
            if self.missing_keys == "fail":
                raise ValueError(f"the Redis stream key {key!r} no longer exists at {self.url}")
            return after, 0, True
        self._check_trimmed(key, after, info, added)
        newest = str(info["last-generated-id"])
        if not id_after(newest, after):
            return after, 0, True
        known, total = added.get(key), info.get("entries-added")
        backlog = int(total) - known if known is not None and total is not None else None
        if limit is None or (backlog is not None and backlog <= limit):
            # Everything up to the newest entry: no walk over the entries (the limit script's cost is per
            # entry, on the server and before the batch can start), also when a known backlog fits the limit.
            added.pop(key, None)
            if total is not None:
                added[key] = int(total)
            return newest, backlog, True
        try:
            count, last = self._client().eval(_LIMIT_SCRIPT, 1, key, after, limit, READ_CHUNK)
        except Exception as e:
            if _is_connection_error(e):
                raise _unavailable(self.url, f"finding the end of the next batch of {key!r}", e) from e
            raise
        if key in added:
            added[key] += int(count)
        return str(last), int(count), str(last) == newest

    def compute(self, time: BatchTime) -> RDD | None:
        """Batch ``time``'s ranges, fixed on copies of the positions and counts: the node moves to the end of
        the ranges only once every key's range is fixed and the RDD is built (a connection error on the 2nd
        of 4 keys leaves it as it was, and a new call fixes the same ranges, up to the entries added since)."""
        positions, added = dict(self.positions), dict(self.added)
        caught_up: dict[str, bool] = {}
        replayed = self.replayed_offsets(time)
        if replayed is not None:
            ranges = [(str(k), str(a), str(u), None if n is None else int(n)) for k, a, u, n in replayed["ranges"]]
            for key, _, until, _ in ranges:
                if id_after(until, positions.get(key, "0-0")):
                    positions[key] = until
            limit = replayed.get("limit")
            server_ms = None
        else:
            limit = self._limit(time)
            # Asked before the keys' XINFO: an entry added after it has an auto id at or past this clock.
            server_ms = self._server_ms() if self.event_time_from_ids == "auto" else None
            ranges = []
            for key in self.keys:
                after = positions.get(key, "0-0")
                until, count, caught_up[key] = self._fix_range(key, after, limit, added)
                ranges.append((key, after, until, count))
                positions[key] = until
        rdd = self.read(ranges)
        # The batch is fixed: commit it in one step that cannot fail.
        self.positions, self.added, self._caught_up = positions, added, caught_up
        counts = [n for _, _, _, n in ranges]
        total = sum(n for n in counts if n is not None) if all(n is not None for n in counts) else None
        offsets: dict[str, Any] = {"ranges": [list(r) for r in ranges]}
        if limit is not None:
            offsets["limit"] = limit
        if self.event_time_from_ids is not None:
            self._record_cap(time, ranges, server_ms)
        self.report_batch(time, total, offsets)
        return rdd

    def read(self, ranges: list[tuple[str, str, str, int | None]]) -> RDD:
        """One partition per key: partition ``i`` reads ``ranges[i]`` (an empty range reads nothing; entries
        trimmed since the range was fixed fail the task, or are skipped with ``onTrimmed="skip"``)."""
        url, decoder, on_trimmed = self.url, self.decoder, self.on_trimmed
        work = list(ranges)

        def part(i: int, it: Iterable[Any]) -> Iterator[Any]:
            consume(it)
            key, after, until, count = work[i]
            if after == until or count == 0:
                return iter(())
            return read_range(url, key, after, until, count, decoder, on_trimmed)

        sc = self.graph.sc
        return sc.parallelize(range(len(work)), len(work)).mapPartitionsWithIndex(part)
