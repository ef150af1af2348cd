"""The Redis Streams source against the project's real Redis server (scripts/services.sh).

Each stream key is a partition; a batch's ranges are fixed before it runs and recorded as its offsets.
"""

from __future__ import annotations

import operator
import os
import threading
import time

import pytest

from dstreams import ManualClock, StreamingContext
from dstreams.recovery.metadata import GraphChangedError
from dstreams.testing import collect, manual_context, run_batches
from dstreams.time import from_user_time

from ..recovery_app import read_outputs
from ..support import scaled

pytestmark = pytest.mark.redis


def _add(client, key: str, n: int, start: int = 0) -> list[str]:
    return [client.xadd(key, {"n": str(start + i), "k": key}) for i in range(n)]


def _eval_calls(client) -> int:
    """How many EVAL commands the server ran (its command statistics)."""
    return int(client.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))


def test_each_batch_reads_the_entries_added_since_the_last_one(sc, redis_url, redis_client, redis_prefix):
    keys = [f"{redis_prefix}a", f"{redis_prefix}b"]
    ids = {k: _add(redis_client, k, 5) for k in keys}
    with manual_context(1, sc=sc) as ssc:
        seen = collect(ssc.redisStream(keys, url=redis_url), sort=True)
        ssc.start()
        run_batches(ssc, 1)
        _add(redis_client, keys[1], 3, start=5)
        run_batches(ssc, 2)
        infos = {i.batchTime().milliseconds(): i for i in ssc.batchInfos()}
    assert seen[1000] == sorted((k, i, {"n": str(j), "k": k}) for k in keys for j, i in enumerate(ids[k]))
    assert [r[2]["n"] for r in seen[2000]] == ["5", "6", "7"] and seen[3000] == []
    assert infos[1000].numRecords() == 10 and infos[2000].numRecords() == 3 and infos[3000].numRecords() == 0


def test_start_positions_latest_and_explicit_ids(sc, redis_url, redis_client, redis_prefix):
    a, b = f"{redis_prefix}a", f"{redis_prefix}b"
    ids_a = _add(redis_client, a, 4)
    _add(redis_client, b, 2)
    with manual_context(1, sc=sc) as ssc:
        latest = collect(ssc.redisStream([a, b], url=redis_url, startFrom="latest").map(lambda r: r[2]["n"]),
                         sort=True)
        explicit = collect(ssc.redisStream([a], url=redis_url, startFrom={a: ids_a[1]}).map(lambda r: r[2]["n"]),
                           sort=True)
        ssc.start()
        _add(redis_client, b, 1, start=2)
        run_batches(ssc, 1)
    assert latest[1000] == ["2"]
    assert explicit[1000] == ["2", "3"]


def test_max_rate_per_partition_drains_a_backlog_in_bounded_batches(sc, redis_url, redis_client, redis_prefix):
    keys = [f"{redis_prefix}{i}" for i in range(2)]
    for k in keys:
        _add(redis_client, k, 25)
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.redisStream(keys, url=redis_url, maxRatePerPartition=10)
        counts = collect(stream.map(lambda r: (r[0], 1)).reduceByKey(operator.add), sort=True)
        everything = collect(stream.map(lambda r: (r[0], int(r[2]["n"]))), sort=True)
        evals_before = _eval_calls(redis_client)
        ssc.start()
        run_batches(ssc, 4)
    assert [counts[t] for t in (1000, 2000, 3000, 4000)] == [
        [(k, n) for k in keys] for n in (10, 10, 5)] + [[]]
    # The limit script walks the entries only where the backlog exceeds the limit (batches 1 and 2); the
    # third batch's 5 entries fit, known from the stream's entries-added count.
    assert _eval_calls(redis_client) - evals_before == 2 * len(keys)
    read = sorted(x for t in everything for x in everything[t])
    assert read == sorted((k, i) for k in keys for i in range(25))  # each entry exactly once


def test_a_decoder_error_names_the_key_and_entry(sc, redis_url, redis_client, redis_prefix):
    key = f"{redis_prefix}bad"
    good = redis_client.xadd(key, {"v": "1"})
    bad = redis_client.xadd(key, {"v": "not a number"})
    with manual_context(1, sc=sc) as ssc:
        ssc.redisStream(key, url=redis_url, decoder=lambda k, i, f: int(f["v"])).foreachRDD(lambda rdd: rdd.count())
        ssc.start()
        with pytest.raises(Exception) as err:
            run_batches(ssc, 1, check=False)
            ssc.awaitTerminationOrTimeout(5)
    assert key in str(err.value) and bad in str(err.value) and good not in str(err.value)


def test_missing_keys_fail_at_start_or_are_waited_for(sc, redis_url, redis_client, redis_prefix):
    key = f"{redis_prefix}later"
    with manual_context(1, sc=sc) as ssc:
        ssc.redisStream(key, url=redis_url).foreachRDD(lambda rdd: None)
        with pytest.raises(ValueError, match="do not exist.*missingKeys='wait'"):
            ssc.start()
    with manual_context(1, sc=sc) as ssc:
        seen = collect(ssc.redisStream(key, url=redis_url, missingKeys="wait").map(lambda r: r[2]["n"]), sort=True)
        ssc.start()
        run_batches(ssc, 1)
        _add(redis_client, key, 2)
        run_batches(ssc, 1)
    assert seen[1000] == [] and seen[2000] == ["0", "1"]


def test_a_server_down_at_start_is_waited_for_within_the_outage_bound(sc, redis_url, redis_client, redis_prefix):
    """Redis restarting while a driver starts: ``start()`` waits (as a batch would) instead of failing."""
    from urllib.parse import urlsplit

    from benchmarks.chaos_proxy import FaultProxy
    from dstreams.recovery.outage import OUTAGE_WAITS

    key = f"{redis_prefix}down"
    _add(redis_client, key, 3)
    upstream = urlsplit(redis_url)
    proxy = FaultProxy("redis", upstream.hostname or "127.0.0.1", upstream.port or 6379)
    proxy.down()
    try:
        with manual_context(1, sc=sc) as ssc:
            seen = collect(ssc.redisStream(key, url=f"redis://127.0.0.1:{proxy.port}{upstream.path}").map(
                lambda r: r[2]["n"]), sort=True)
            waits_before = OUTAGE_WAITS.total()
            errors: list[BaseException] = []

            def start() -> None:
                try:
                    ssc.start()
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            starter = threading.Thread(target=start, name="test-start")
            starter.start()
            try:
                deadline = time.monotonic() + 60
                while OUTAGE_WAITS.total() == waits_before and starter.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert not errors, errors
                assert starter.is_alive() and OUTAGE_WAITS.total() > waits_before, "start() did not wait for the source"
                proxy.up()
                starter.join(60)
                assert not starter.is_alive() and not errors, errors
                run_batches(ssc, 1)
            finally:
                proxy.up()
                starter.join(60)
    finally:
        proxy.close()
    assert seen[1000] == ["0", "1", "2"]


def test_trimmed_entries_fail_clearly_or_are_skipped_on_request(sc, redis_url, redis_client, redis_prefix):
    key = f"{redis_prefix}trim"
    _add(redis_client, key, 10)
    redis_client.xtrim(key, maxlen=4, approximate=False)  # entries 0..5 are gone before anything read them
    with manual_context(1, sc=sc) as ssc:
        ssc.redisStream(key, url=redis_url).foreachRDD(lambda rdd: None)
        ssc.start()
        ssc.clock.advance(1000)
        with pytest.raises(Exception, match=f"{key}.*trimmed.*onTrimmed='skip'"):
            ssc.awaitTerminationOrTimeout(30)
    with manual_context(1, sc=sc) as ssc:
        seen = collect(ssc.redisStream(key, url=redis_url, onTrimmed="skip").map(lambda r: int(r[2]["n"])), sort=True)
        ssc.start()
        run_batches(ssc, 1)
    assert seen[1000] == [6, 7, 8, 9]


def test_a_restarted_driver_reads_every_entry_exactly_once(sc, redis_url, redis_client, redis_prefix, tmp_path):
    keys = [f"{redis_prefix}{i}" for i in range(3)]
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")

    def build(clock: ManualClock) -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.checkpoint(ckpt)
        entries = ssc.redisStream(keys, url=redis_url)
        entries.map(lambda r: f"{r[0]} {r[2]['n']}").saveAsTextFiles(os.path.join(out, "lines"))
        return ssc

    for k in keys:
        _add(redis_client, k, 3)
    clock = ManualClock()
    first = StreamingContext.getOrCreate(ckpt, lambda: build(clock))
    first.start()
    try:
        run_batches(first, 2)
        for k in keys:
            _add(redis_client, k, 2, start=3)
        run_batches(first, 1)
    finally:
        first.stop(stopSparkContext=False)  # the driver "dies" after batch 3
    for k in keys:
        _add(redis_client, k, 4, start=5)  # written while the driver is down
    clock2 = ManualClock(5_500)
    second = StreamingContext.getOrCreate(ckpt, lambda: pytest.fail("setupFunc called"), clock=clock2)
    second.start()
    try:
        for t in (4000, 5000, 6000):
            if t > 5_500:
                clock2.advance(1000)
            second.awaitBatch(t, 60)
    finally:
        second.stop(stopSparkContext=False)
    lines = []
    for name in sorted(os.listdir(out)):
        if os.path.exists(os.path.join(out, name, "_SUCCESS")):
            for part in sorted(os.listdir(os.path.join(out, name))):
                if part.startswith("part-"):
                    with open(os.path.join(out, name, part)) as f:
                        lines += f.read().splitlines()
    assert sorted(lines) == sorted(f"{k} {i}" for k in keys for i in range(9))


def test_entries_trimmed_under_a_recorded_batch_are_skipped_after_the_restart_the_error_names(
        sc, redis_url, redis_client, redis_prefix, tmp_path, monkeypatch):
    """Batch 2 is recorded in the metadata log and not done when the driver stops; entries of its range are then
    trimmed. The restart from the stored graph fails with TrimmedEntriesError (the stored onTrimmed='fail'); the
    restart that error names (getOrCreate(..., rebuildGraph=True) with onTrimmed='skip') replays batch 2 without
    the trimmed entries and goes on: every entry not trimmed is written exactly once. A changed key list is
    refused on that path (it is the topology); onTrimmed is not."""
    monkeypatch.setenv("DSTREAMS_BATCH_MAX_ATTEMPTS", "1")  # a failed batch stops the context at once
    a, b = keys = [f"{redis_prefix}ta", f"{redis_prefix}tb"]
    ckpt, out, hold = str(tmp_path / "ckpt"), str(tmp_path / "out"), str(tmp_path / "hold-batch-2")

    def build(clock: ManualClock, stream_keys: list[str], on_trimmed: str = "fail") -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        ssc.checkpoint(ckpt)
        entries = ssc.redisStream(stream_keys, url=redis_url, onTrimmed=on_trimmed)

        def held(t, rdd) -> None:  # while the file exists, batch 2 fails before its entries are read
            if from_user_time(t).ms == 2000 and os.path.exists(hold):
                raise RuntimeError("batch 2 held")

        entries.foreachRDD(held)
        entries.map(lambda r: f"{r[0]} {r[2]['n']}").saveAsTextFiles(os.path.join(out, "lines"))
        return ssc

    for k in keys:
        _add(redis_client, k, 3)
    clock = ManualClock()
    first = StreamingContext.getOrCreate(ckpt, lambda: build(clock, keys))
    first.start()
    try:
        run_batches(first, 1)
        for k in keys:
            _add(redis_client, k, 3, start=3)
        open(hold, "w").close()
        clock.advance(1000)
        with pytest.raises(Exception, match="batch 2 held"):
            first.awaitTerminationOrTimeout(60)
    finally:
        first.stop(stopSparkContext=False)
    os.remove(hold)
    redis_client.xtrim(a, maxlen=1, approximate=False)  # a's entries 3 and 4, in recorded batch 2, are gone

    stored = StreamingContext.getOrCreate(ckpt, lambda: pytest.fail("setupFunc called"), clock=ManualClock(2000))
    stored.start()
    try:
        with pytest.raises(Exception, match=r"trimmed.* restart with StreamingContext.getOrCreate\(path, setupFunc, "
                                            r"rebuildGraph=True\) where setupFunc passes redisStream\(\.\.\., "
                                            r"onTrimmed='skip'\)") as failed:
            stored.awaitTerminationOrTimeout(60)
        assert a in str(failed.value)
    finally:
        stored.stop(stopSparkContext=False)

    other_keys = StreamingContext.getOrCreate(ckpt, lambda: build(ManualClock(2000), [a, b, f"{redis_prefix}tc"],
                                                                  "skip"), rebuildGraph=True)
    with pytest.raises(GraphChangedError, match="keys="):
        other_keys.start()
    other_keys.stop(stopSparkContext=False)

    clock3 = ManualClock(2000)
    rebuilt = StreamingContext.getOrCreate(ckpt, lambda: build(clock3, keys, "skip"), rebuildGraph=True)
    rebuilt.start()
    try:
        rebuilt.awaitBatch(2000, 60)
        for k in keys:
            _add(redis_client, k, 2, start=6)
        clock3.advance(1000)
        rebuilt.awaitBatch(3000, 60)
    finally:
        rebuilt.stop(stopSparkContext=False)
    lines = [line for name, got in read_outputs(out).items() if name.startswith("lines-") for line in got]
    assert sorted(lines) == sorted([f"{a} {n}" for n in (0, 1, 2, 5, 6, 7)] + [f"{b} {n}" for n in range(8)])


@pytest.mark.slow
def test_a_backlog_of_a_million_entries_drains_in_bounded_batches(sc, redis_url, redis_client, redis_prefix):
    keys = [f"{redis_prefix}{i}" for i in range(4)]
    # A million entries (4 keys x 250,000, 60,000 a key per batch); at the CI scale (tests/support.py's ci_scale)
    # 200,000 (50,000 a key, 12,000 per batch): the same shape, four full batches, the rest, then none.
    per_key, rate = scaled((250_000, 60_000), (50_000, 12_000))
    for k in keys:
        for start in range(0, per_key, 10_000):
            pipe = redis_client.pipeline(transaction=False)
            for i in range(start, start + 10_000):
                pipe.xadd(k, {"n": i})
            pipe.execute()
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.redisStream(keys, url=redis_url, maxRatePerPartition=rate)
        per_batch = collect(stream.map(lambda r: (r[0], (1, int(r[2]["n"]), int(r[2]["n"])))).reduceByKey(
            lambda a, b: (a[0] + b[0], min(a[1], b[1]), max(a[2], b[2]))), sort=True)
        ssc.start()
        run_batches(ssc, 6)
        infos = {i.batchTime().milliseconds(): i for i in ssc.batchInfos()}
    for k in keys:
        ranges = [dict(per_batch[t]).get(k) for t in sorted(per_batch)]
        assert [r[0] if r else 0 for r in ranges] == [rate] * 4 + [per_key - 4 * rate, 0]
        # consecutive, in order: batch b holds entries [b * rate, (b + 1) * rate)
        assert [(r[1], r[2]) for r in ranges if r] == [(b * rate, min(per_key, (b + 1) * rate) - 1) for b in range(5)]
    assert [infos[t].numRecords() for t in sorted(infos)] == [4 * rate] * 4 + [4 * (per_key - 4 * rate), 0]


def test_commit_to_group_moves_a_consumer_group_for_monitoring_tools(sc, redis_url, redis_client, redis_prefix):
    keys = [f"{redis_prefix}g{i}" for i in range(2)]
    ids = {k: _add(redis_client, k, 3) for k in keys}
    redis_client.xgroup_create(keys[0], "watch", "0-0")  # an existing group is moved; a missing one is created
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.redisStream(keys, url=redis_url, commitToGroup="watch")
        got = collect(stream.map(lambda r: r[1]), sort=True)
        with pytest.raises(ValueError, match="commitToGroup must be a consumer group name"):
            ssc.redisStream(keys, url=redis_url, commitToGroup="")
        ssc.start()
        run_batches(ssc, 1)
        assert stream._node.wait_group_positions(30)  # the groups move on the source's own thread
        positions = {k: redis_client.xinfo_groups(k)[0]["last-delivered-id"] for k in keys}
        assert positions == {k: ids[k][-1] for k in keys}
        more = {k: _add(redis_client, k, 2, start=3) for k in keys}
        run_batches(ssc, 2)
    assert {k: redis_client.xinfo_groups(k)[0]["last-delivered-id"] for k in keys} == {k: more[k][-1] for k in keys}
    assert all(len(redis_client.xinfo_groups(k)) == 1 for k in keys)
    assert redis_client.xpending(keys[0], "watch")["pending"] == 0  # nothing delivered through the group
    assert sorted(got[1000]) == sorted(i for k in keys for i in ids[k])


def test_a_slow_consumer_group_update_does_not_delay_batch_generation(sc, redis_url, redis_client, redis_prefix,
                                                                      monkeypatch):
    """commitToGroup moves the groups on the source's own thread: while Redis does not answer an XGROUP SETID,
    later batches are generated and run, and the positions they reach coalesce into one update per key."""
    keys = [f"{redis_prefix}slow{i}" for i in range(2)]
    ends = {1: {k: _add(redis_client, k, 2)[-1] for k in keys}}
    entered, release = threading.Event(), threading.Event()
    calls: list[tuple[str, str]] = []
    with manual_context(1, sc=sc) as ssc:
        stream = ssc.redisStream(keys, url=redis_url, commitToGroup="watch")
        stream.foreachRDD(lambda rdd: rdd.count())
        node = stream._node
        real = node._client()

        class SlowGroupClient:
            """The real client, but an XGROUP SETID hangs until the test releases it (a Redis that stalls)."""

            def xgroup_setid(self, key: str, group: str, entry_id: str):
                calls.append((key, entry_id))
                entered.set()
                release.wait(120)
                return real.xgroup_setid(key, group, entry_id)

            def __getattr__(self, name: str):
                return getattr(real, name)

        monkeypatch.setattr(node, "_client", lambda: SlowGroupClient())
        ssc.start()
        try:
            run_batches(ssc, 1)
            assert entered.wait(30), "batch 1's group update never started"
            for b in (2, 3):  # generated and run while batch 1's update hangs
                ends[b] = {k: _add(redis_client, k, 2, start=2 * b)[-1] for k in keys}
                run_batches(ssc, 1, timeout=30)
            assert calls == [(keys[0], ends[1][keys[0]])]
            release.set()
            assert node.wait_group_positions(30)
        finally:
            release.set()
    assert {k: redis_client.xinfo_groups(k)[0]["last-delivered-id"] for k in keys} == ends[3]
    # batch 2's positions were overtaken by batch 3's while they waited: one update per key, never backwards
    assert calls == [(k, ends[1][k]) for k in keys] + [(k, ends[3][k]) for k in keys]


def test_the_group_writer_coalesces_logs_a_failed_update_and_stops_with_what_is_pending(caplog):
    from dstreams.nodes.group_positions import GroupPositionWriter
    from dstreams.redis.source import id_after

    moved: list[tuple[str, str]] = []
    entered, gate = threading.Event(), threading.Event()

    def move(key: str, entry_id: str) -> None:
        entered.set()
        gate.wait(30)
        if entry_id == "1-0":
            raise ConnectionError("injected: Redis went away")
        moved.append((key, entry_id))

    writer = GroupPositionWriter("test-group-writer", move, "consumer group 'g'", newer=id_after)
    try:
        writer.offer({"k": "1-0"})
        assert entered.wait(30)  # the update of k hangs ...
        writer.offer({"k": "2-0", "j": "3-0"})  # ... while two batches complete
        writer.offer({"k": "4-0", "j": "0-5"})  # j's older id never moves its group back
        gate.set()
    finally:
        writer.stop(30)  # applies what is pending first
    assert moved == [("k", "4-0"), ("j", "3-0")]  # one update per key, the newest
    assert "could not move the consumer group 'g' of stream key 'k' to 1-0" in caplog.text


def _id_seconds(record) -> float:
    """The event time a producer put in the entry id (ms), in seconds."""
    return int(record[1].split("-")[0]) / 1000.0


def _event_time_run(sc, redis_url, keys, mode, feed) -> tuple[dict[int, list], dict[int, list], dict[int, list]]:
    """Batches of ``redisStream(keys, eventTimeFromIds=mode)`` with event time = entry id; ``feed(i)`` adds the
    entries of batch i before it runs. Returns (watermarks, kept ids, late ids) per batch time."""
    with manual_context(1, sc=sc) as ssc:
        timed = ssc.redisStream(keys, url=redis_url, eventTimeFromIds=mode).withEventTime(_id_seconds, "0s")
        marks = collect(timed.watermarks(), sort=True)
        kept = collect(timed.map(lambda r: r[1]), sort=True)
        late = collect(timed.lateRecords().map(lambda r: r[1]), sort=True)
        feed(1)  # the keys exist before the stream starts
        ssc.start()
        for i in range(1, 4):
            if i > 1:
                feed(i)
            run_batches(ssc, 1)
    return marks, kept, late


def test_explicit_ids_a_lagging_key_holds_the_watermark_back(sc, redis_url, redis_client, redis_prefix):
    """Key a runs ahead (event times 10-20 s, then 30 s), key b lags (5 s, then 6 s): without the source's
    watermark, batch 2's watermark (20 s, the newest event time seen) would drop b's 6 s entry as late."""
    a, b = f"{redis_prefix}a", f"{redis_prefix}b"
    entries = {1: [(a, "10000-0"), (a, "20000-0"), (b, "5000-0")], 2: [(a, "30000-0"), (b, "6000-0")], 3: []}

    def feed(i: int) -> None:
        for key, entry_id in entries[i]:
            redis_client.xadd(key, {"v": "1"}, id=entry_id)

    marks, kept, late = _event_time_run(sc, redis_url, [a, b], "explicit", feed)
    # batch 2: min(newest seen 20 s, positions a 20 s / b 5 s) = 5 s; batch 3: min(30 s, a 30 s / b 6 s) = 6 s
    assert [marks[t] for t in (1000, 2000, 3000)] == [[None], [5.0], [6.0]]
    assert kept[2000] == ["30000-0", "6000-0"] and all(v == [] for v in late.values())


def test_without_the_source_watermark_the_lagging_entry_is_late(sc, redis_url, redis_client, redis_prefix):
    a, b = f"{redis_prefix}a", f"{redis_prefix}b"
    entries = {1: [(a, "10000-0"), (a, "20000-0"), (b, "5000-0")], 2: [(a, "30000-0"), (b, "6000-0")], 3: []}

    def feed(i: int) -> None:
        for key, entry_id in entries[i]:
            redis_client.xadd(key, {"v": "1"}, id=entry_id)

    marks, _, late = _event_time_run(sc, redis_url, [a, b], None, feed)
    assert marks[2000] == [20.0] and late[2000] == ["6000-0"]


def test_auto_ids_an_idle_key_does_not_hold_the_watermark(sc, redis_url, redis_client, redis_prefix):
    """With XADD * the server's clock bounds every later id, so an idle (caught-up) key declares that clock."""
    a, idle = f"{redis_prefix}a", f"{redis_prefix}idle"
    redis_client.xadd(idle, {"v": "0"})  # one old entry, then nothing
    added: list[str] = []

    def feed(i: int) -> None:
        added.append(redis_client.xadd(a, {"v": str(i)}))

    marks, _, late = _event_time_run(sc, redis_url, [a, idle], "auto", feed)
    newest_before_3 = max(int(x.split("-")[0]) for x in added[:2]) / 1000.0
    assert marks[3000] == [newest_before_3]  # the newest event time seen, not the idle key's old entry
    assert all(v == [] for v in late.values())


def test_event_time_from_ids_is_checked(sc, redis_url, redis_prefix):
    with manual_context(1, sc=sc) as ssc, pytest.raises(ValueError, match="eventTimeFromIds must be None, 'auto'"):
        ssc.redisStream(f"{redis_prefix}a", url=redis_url, eventTimeFromIds="ids")
