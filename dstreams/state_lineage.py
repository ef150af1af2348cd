"""Which dropped batches a store-backed state's history went through: what tells two histories of one version apart.

A batch whose input was dropped (``spark.dstreams.batch.onFailure=dropInput``) is applied again without it as the
same version ``t``; a store (or a changelog object) that holds ``t`` as applied *before* the drop is another history of
``t`` and of every version after it. Two histories of one version of one driver run differ exactly in the dropped
batches they went through (the input of every other batch is a pure function of its recorded offsets, and a batch
is dropped once: the drop is recorded and a restart replays it), so a version is identified by its driver run and
the set of dropped batches at or before it (:class:`Lineage`): a store keeps the lineage of its version
(:attr:`dstreams.statestore.PartitionStore.lineage`), each task compares it with the driver's at the versions it
builds on or reads, and the changelog object of a version is named by :meth:`Lineage.vid`, so that what an attempt
from before a drop writes is never read as the redone version (issue 42, item 3).

The dropped batches before a **floor** (the oldest version the driver's tasks compare at: the checkpoint catch-ups
start from, or the store's log floor) are folded into one digest (a hash chain over them, oldest first), so a
lineage stays small however many batches a stream drops, and two lineages still compare equal at any version from
their floors on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


def _fold(digest: str, drop: int) -> str:
    return hashlib.sha256(f"{digest}:{drop}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Lineage:
    """The dropped batches of a history: those before ``floor`` as a digest (``folded``, "": none), the others
    explicitly (``drops``, ascending)."""

    floor: int = 0
    folded: str = ""
    drops: tuple[int, ...] = ()

    def with_drops(self, drops: Iterable[int]) -> Lineage:
        """This lineage and the batches ``drops`` dropped after it (those before its floor are already in it)."""
        extra = {d for d in drops if d >= self.floor} - set(self.drops)
        return self if not extra else Lineage(self.floor, self.folded, tuple(sorted({*self.drops, *extra})))

    def upto(self, version: int) -> Lineage:
        """The lineage of ``version`` (the drops after it are not in its history)."""
        if not self.drops or self.drops[-1] <= version:
            return self
        return Lineage(self.floor, self.folded, tuple(d for d in self.drops if d <= version))

    def pruned(self, floor: int) -> Lineage:
        """The same history with the drops before ``floor`` folded (a lower floor than this one's: unchanged)."""
        if floor <= self.floor:
            return self
        digest = self.folded
        for d in self.drops:
            if d < floor:
                digest = _fold(digest, d)
        return Lineage(floor, digest, tuple(d for d in self.drops if d >= floor))

    def digest(self, version: int) -> str | None:
        """The digest of the drops at or before ``version`` ("": none), None: unknown (folded past it)."""
        if version < self.floor and self.folded:
            return None
        digest = self.folded if version >= self.floor else ""
        for d in self.drops:
            if d > version:
                break
            digest = _fold(digest, d)
        return digest

    def agrees(self, other: Lineage | None, version: int) -> bool:
        """Whether ``other`` (None: no drops) has the same history at ``version``: False only when both digests are
        known and differ (a store's lineage that cannot tell is trusted, as before lineages existed)."""
        mine, theirs = self.digest(version), (other or EMPTY).digest(version)
        return mine is None or theirs is None or mine == theirs

    def misses(self, other: Lineage | None, version: int) -> bool:
        """Whether ``other`` went through a drop at or before ``version`` that this lineage (a task's, built by the
        driver before that drop) does not know: the task is superseded."""
        return any(self.floor <= d <= version and d not in self.drops for d in (other or EMPTY).drops)

    def vid(self, run: str, version: int) -> str:
        """The id of ``version`` of driver run ``run`` with this history: ``run`` itself when no batch at or before it
        was dropped, else ``run`` and the drops' digest (the changelog object's name)."""
        digest = self.digest(version)
        if digest is None:
            raise ValueError(f"the lineage {self} cannot name version {version} (folded past it)")
        return f"{run}.{digest[:16]}" if digest else run

    # ------------------------------------------------------------------ stored (a store's meta, a manifest)
    def to_json(self) -> list[Any] | None:
        return None if not self.folded and not self.drops else [self.floor, self.folded, list(self.drops)]

    @classmethod
    def from_json(cls, value: Any) -> Lineage:
        if not value:
            return EMPTY
        floor, folded, drops = value
        return cls(int(floor), str(folded), tuple(int(d) for d in drops))


EMPTY = Lineage()

__all__ = ["EMPTY", "Lineage"]
