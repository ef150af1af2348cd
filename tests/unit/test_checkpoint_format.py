"""One format number (issue 41 item 4): everything a checkpoint location holds carries ``dstreams.contracts.FORMAT``
(the metadata log's head, the stored graph, the manifests, every encoded part: data checkpoints, state changelog
objects; the state snapshots' store files: ``tests/integration/test_state_store.py``); a location (or an object in
it) of another format is refused with ``CheckpointFormatError``, whose message names the object and both formats
and says what to do, and a new checkpoint location then starts; nothing reads another format. (The executor state
store's local files of another format are deleted and rebuilt: ``tests/integration/test_state_store.py``.)"""

from __future__ import annotations

import json
import os

import pytest

from dstreams import DStreamsError, ManualClock, StreamingContext
from dstreams.contracts import FORMAT
from dstreams.recovery.changelog import StoreChangelog, changelog_key
from dstreams.recovery.checkpoint_files import MANIFEST, checkpoint_prefix, list_checkpoints, load_manifest
from dstreams.recovery.checkpoint_format import CheckpointFormatError
from dstreams.recovery.codec import CorruptCheckpointError, decode_partition, encode_partition
from dstreams.recovery.graph_store import GRAPH_KEY, MAGIC, read_graph
from dstreams.recovery.metadata import HEAD, ForeignCheckpointError, MetadataLog
from dstreams.recovery.store import open_store
from dstreams.recovery.storespec import StoreSpec

from ..recovery_app import read_outputs

WHAT_TO_DO = "(?s)checkpoint format.*new checkpoint location.*version that wrote it"


def _set_head_format(store, fmt) -> None:
    head = json.loads(store.get(HEAD))
    head["format"] = fmt
    store.put(HEAD, json.dumps(head).encode())


def test_the_error_is_a_dstreams_error_and_a_value_error():
    assert issubclass(CheckpointFormatError, DStreamsError) and issubclass(CheckpointFormatError, ValueError)


def test_a_head_of_another_format_is_refused_before_anything_is_taken_over():
    store = open_store("memory://format-head")
    MetadataLog(store, "app", ["a"], 1000).take_over(0)
    assert json.loads(store.get(HEAD))["format"] == FORMAT
    for other in (FORMAT - 1, FORMAT + 1, str(FORMAT)):
        _set_head_format(store, other)
        with pytest.raises(CheckpointFormatError, match=WHAT_TO_DO) as refused:
            MetadataLog(store, "app", ["a"], 1000).take_over(0)
        assert f"format {other!r}" in str(refused.value) and HEAD in str(refused.value)
        assert json.loads(store.get(HEAD))["epoch"] == 1  # refused: nothing written
        with pytest.raises(CheckpointFormatError):
            MetadataLog.read(store)
    _set_head_format(store, FORMAT)
    assert MetadataLog(store, "app", ["a"], 1000).take_over(0) is not None


def test_a_head_that_is_not_a_dstreams_log_is_foreign_not_another_format():
    store = open_store("memory://format-foreign")
    store.put(HEAD, json.dumps({"something": "else"}).encode())
    with pytest.raises(ForeignCheckpointError, match="not a dstreams metadata log"):
        MetadataLog.read(store)


def test_a_part_of_another_format_is_refused_and_a_damaged_one_is_corrupt():
    data, sha, _ = encode_partition([("k", 1)])
    assert data[4] == FORMAT and decode_partition(data, sha) == [("k", 1)]
    other = data[:4] + bytes([FORMAT + 1]) + data[5:]
    with pytest.raises(CheckpointFormatError, match=WHAT_TO_DO):
        decode_partition(other, sha, "checkpoints/x/part-00000")
    with pytest.raises(CorruptCheckpointError):
        decode_partition(data[:-1] + bytes([data[-1] ^ 1]), sha)


def test_a_state_changelog_object_of_another_format_is_refused():
    """A task catching a store up reads the changelog objects of the versions since a checkpoint: one of another
    format is refused with the error naming the object (not taken for a missing or damaged one)."""
    spec = StoreSpec("memory://format-changelog")
    changelog = StoreChangelog(spec, "000-StoreStateNode")
    entries = [(b"k", b"v"), (b"gone", None)]
    changelog.write("run", 1000, 0, entries)
    assert changelog.read("run", 1000, 0) == entries
    key = changelog_key("000-StoreStateNode", "run", 1000, 0)
    data = spec.open().get(key)
    assert data[4] == FORMAT
    spec.open().put(key, data[:4] + bytes([FORMAT - 1]) + data[5:])
    with pytest.raises(CheckpointFormatError, match=f"(?s){key} was written in checkpoint format {FORMAT - 1}.*"
                                                     f"reads checkpoint format {FORMAT} only.*new checkpoint location"):
        changelog.read("run", 1000, 0)


def _rewrite_graph_format(store, fmt) -> None:
    raw = store.get(GRAPH_KEY)
    head, _, payload = raw[len(MAGIC):].partition(b"\n")
    header = json.loads(head)
    header["format"] = fmt
    store.put(GRAPH_KEY, MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload)


def _rewrite_manifest_format(store, node_key: str, t: int, fmt) -> None:
    key = f"{checkpoint_prefix(node_key, t)}/{MANIFEST}"
    manifest = json.loads(store.get(key))
    manifest["format"] = fmt
    store.put(key, json.dumps(manifest, sort_keys=True).encode())


def _setup(sc, inputd: str, out: str, clock: ManualClock):
    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=clock)
        counts = ssc.textFileStream(inputd).map(lambda w: (w.strip(), 1)).updateStateByKey(
            lambda vs, s: sum(vs, s or 0))
        counts.checkpoint(1)
        counts.map(lambda kv: f"{kv[0]},{kv[1]}").saveAsTextFiles(os.path.join(out, "counts"))
        return ssc

    return setup


def _step(ssc: StreamingContext, inputd: str, t_ms: int, text: str) -> None:
    with open(os.path.join(inputd, f"f{t_ms}.txt"), "w") as f:
        f.write(text)
    ssc.clock.set_time(t_ms)
    ssc.awaitBatch(t_ms, 120)


@pytest.mark.slow
def test_a_checkpoint_location_of_another_format_is_refused_at_start_and_resumes_with_its_own(sc, tmp_path):
    """A real run's location: its head, its stored graph and its manifests carry the format; with any of them
    changed, getOrCreate (or start) refuses the location with what to do, and doing it (a new checkpoint location)
    starts; set back, the restart resumes the state."""
    inputd, out, cpd = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "cp")
    os.makedirs(inputd)
    first = StreamingContext.getOrCreate(cpd, _setup(sc, inputd, out, ManualClock()))
    first.start()
    try:
        for t in (1000, 2000):
            _step(first, inputd, t, "a\nb\na\n")
        first._checkpointer.flush(60)
    finally:
        first.stop(stopSparkContext=False, stopGraceFully=True)
    store = open_store(cpd)
    (node_key,) = {k.split("/")[1] for k in store.list("checkpoints/")}
    newest = list_checkpoints(store, node_key)[0]
    assert load_manifest(store, node_key, newest)["format"] == FORMAT
    assert read_graph(store).header["format"] == FORMAT

    def unused_setup() -> StreamingContext:
        raise AssertionError("setupFunc must not be called: the location is refused or its graph is restored")

    _set_head_format(store, FORMAT + 1)
    with pytest.raises(CheckpointFormatError, match=WHAT_TO_DO):
        StreamingContext.getOrCreate(cpd, unused_setup, clock=ManualClock(2000))
    # What the error says to do: a new checkpoint location starts (setupFunc builds the graph), without the state.
    inputd2, out2, cpd2 = str(tmp_path / "in2"), str(tmp_path / "out2"), str(tmp_path / "cp2")
    os.makedirs(inputd2)
    fresh = StreamingContext.getOrCreate(cpd2, _setup(sc, inputd2, out2, ManualClock(2000)))
    fresh.start()
    try:
        _step(fresh, inputd2, 3000, "a\n")
    finally:
        fresh.stop(stopSparkContext=False)
    assert read_outputs(out2)["counts-3000"] == ["a,1"]
    assert json.loads(open_store(cpd2).get(HEAD))["format"] == FORMAT
    _set_head_format(store, FORMAT)

    _rewrite_graph_format(store, FORMAT + 1)
    with pytest.raises(CheckpointFormatError, match=f"(?s){GRAPH_KEY}.*new checkpoint location"):
        StreamingContext.getOrCreate(cpd, unused_setup, clock=ManualClock(2000))
    _rewrite_graph_format(store, FORMAT)

    _rewrite_manifest_format(store, node_key, newest, FORMAT + 1)
    refused = StreamingContext.getOrCreate(cpd, unused_setup, clock=ManualClock(2000))
    with pytest.raises(CheckpointFormatError, match=f"(?s){MANIFEST}.*new checkpoint location"):
        refused.start()  # not skipped as a damaged checkpoint: the restart stops
    refused.stop(stopSparkContext=False)
    _rewrite_manifest_format(store, node_key, newest, FORMAT)

    second = StreamingContext.getOrCreate(cpd, unused_setup, clock=ManualClock(2000))
    second.start()
    try:
        _step(second, inputd, 3000, "a\nc\n")
    finally:
        second.stop(stopSparkContext=False)
    assert sorted(read_outputs(out)["counts-3000"]) == ["a,5", "b,2", "c,1"]
