"""A source's consumer-group positions, moved off the event loop (``commitToGroup`` of the Redis Streams and
Kafka sources).

Contract: :class:`GroupPositionWriter` (below). The groups are for monitoring only: a write that fails is logged and
dropped, and nothing here ever holds up batch generation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

#: How long ``stop()`` waits for the group writer to apply the positions it holds.
GROUP_WRITER_STOP_S = 5.0


class GroupPositionWriter:
    """``commitToGroup`` off the event loop: one daemon thread per source moves each key's consumer group to
    the newest position handed to it.

    :meth:`offer` (the event loop, after each completed batch) only records the positions and returns: a
    Redis that is slow or down (the client's retries take seconds) never delays batch generation. Positions
    coalesce: per key only the newest one waits (bounded by the number of keys), so after an outage the
    group jumps to where the stream is, with one call per key. A position is never moved backwards, and an
    update that fails is logged and dropped (the groups are for monitoring only; the next batch's position
    goes on). ``move(key, entry_id)`` does one update (with the client's own retries). ``newer(a, b)`` says
    whether position ``a`` is past ``b`` (the Redis source compares entry ids; the Kafka source offers all its
    partitions' offsets under one key, a batch's positions being past the batch's before it).
    """

    def __init__(self, name: str, move: Callable[[str, Any], None], what: str,
                 newer: Callable[[Any, Any], bool]) -> None:
        self._move = move
        self._newer = newer
        self._what = what
        self._cond = threading.Condition()
        self._pending: dict[str, Any] = {}
        self._offered: dict[str, Any] = {}  # the newest id offered per key: a group never moves back
        self._busy = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, positions: Mapping[str, Any]) -> None:
        """Move these keys' group to these ids, later and in the background (never blocks on Redis)."""
        with self._cond:
            if self._stopping:
                return
            for key, entry_id in positions.items():
                newest = self._offered.get(key)
                if newest is None or self._newer(entry_id, newest):
                    self._pending[key] = self._offered[key] = entry_id
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every position offered so far was applied or dropped within ``timeout_s``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout_s)

    def stop(self, timeout_s: float) -> None:
        """Apply what is pending, then end the thread; waits at most ``timeout_s`` (then logs and leaves the
        daemon thread to finish its current call)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("the %s was still being moved %.1f s after stop(); the last positions may not be shown "
                        "(for monitoring only)", self._what, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping)
                if not self._pending:
                    return
                work, self._pending = self._pending, {}
                self._busy = True
            try:
                for key, entry_id in work.items():
                    try:
                        self._move(key, entry_id)
                    except Exception as e:  # noqa: BLE001 - monitoring only: never fails the stream
                        log.warning("could not move the %s of stream key %r to %s (for monitoring only; the "
                                    "stream goes on): %s", self._what, key, entry_id, e)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
