"""The state changelog: each batch's changes of each partition of a store-backed state stream, in the checkpoint
store next to its checkpoints (``spark.dstreams.state.changelog``; the engine's
:class:`dstreams.contracts.StateChangelog`).

Layout: ``changelogs/<node key>/<version, 15 digits>/<vid>-p<partition, 5 digits>``, one object per batch, history
and partition (:mod:`.codec`, checksummed), written by the task that applied the batch, before its store commits.
The version id ``vid`` (:meth:`dstreams.state_lineage.Lineage.vid`) is the driver run's token, followed by a digest of
the batches dropped (``spark.dstreams.batch.onFailure=dropInput``) at or before the version when there are any
(``<run>.<16 hex digits>``). The run keeps two drivers on one location apart: a fenced driver's tasks write under
their own run and the new owner never reads them. The digest keeps two histories of one run apart: a batch whose
input was dropped is applied again as the same version, and what an attempt from before the drop writes (a zombie
task, a store on another host) goes to another object than the redone version's, which is the one read.

A task whose partition store is not at the version its batch builds on (another host, a store lost or left behind)
reads the newest checkpoint the driver adopted (:meth:`StoreChangelog.checkpoint_state`) and the versions since
(:meth:`StoreChangelog.read`): the state the batch builds on, without a Spark job. Before the stream's first checkpoint
is adopted it starts from the empty state at the zero time; a state loaded there (an ``initialRDD``) or when a stream
moves into the store is itself an object of that version, written by the task that loaded the partition.

Deletion (:func:`delete_changelogs_through`): when the checkpointer deletes a stream's checkpoint at ``t`` (no
batch in flight, no RDD in the remember window and no restart reads it any more), the changelogs of versions at
or before ``t`` go with it, every run's: what is kept reaches back from every kept checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .checkpoint_files import load_manifest, read_state_partition, state_layers
from .codec import decode_partition, encode_partition
from .storespec import StoreSpec


def changelog_root(node_key: str) -> str:
    return f"changelogs/{node_key}/"


def changelog_key(node_key: str, vid: str, version: int, partition: int) -> str:
    return f"{changelog_root(node_key)}{version:015d}/{vid}-p{partition:05d}"


@dataclass(frozen=True)
class StoreChangelog:
    """:class:`dstreams.contracts.StateChangelog` in the checkpoint store ``spec`` for the stream ``node_key``."""

    spec: StoreSpec
    node_key: str

    def write(self, vid: str, version: int, partition: int, entries: list[tuple[bytes, bytes | None]]) -> None:
        data, _, _ = encode_partition(entries)
        self.spec.open().put(changelog_key(self.node_key, vid, version, partition), data)

    def read(self, vid: str, version: int, partition: int) -> list[tuple[bytes, bytes | None]]:
        key = changelog_key(self.node_key, vid, version, partition)
        return decode_partition(self.spec.open().get(key), None, key)

    def checkpoint_state(self, time_ms: int, partition: int) -> Iterable[tuple[bytes, bytes]]:
        store = self.spec.open()
        return read_state_partition(self.spec, state_layers(store, load_manifest(store, self.node_key, time_ms)),
                                    partition)


def delete_changelogs_through(store: Any, node_key: str, time_ms: int) -> int:
    """Delete the changelogs of ``node_key`` at versions at or before ``time_ms`` (every run's); returns how many."""
    root = changelog_root(node_key)
    doomed = []
    for key in store.list(root):
        version = key[len(root):].partition("/")[0]
        if version.isdigit() and int(version) <= time_ms:
            doomed.append(key)
    for key in doomed:
        store.delete(key)
    return len(doomed)
