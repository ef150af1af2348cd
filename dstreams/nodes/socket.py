"""``socketTextStream``: lines read from a TCP server by a thread in the driver.

Contract: a background thread connects to ``host:port`` (reconnecting with backoff when the
connection fails or closes) and buffers each received line; batch ``t`` holds the lines received
before its generation and after the previous batch's. Lines are UTF-8 decoded with replacement of
invalid bytes, so a malformed line is kept, never dropped. A socket cannot be replayed: without
a write-ahead log its batches are at-most-once across a driver failure. With a durable checkpoint
location (``graph.wal``, set by the context), each batch's lines are written to it *before* the
batch is used, and a restarted driver replays them from there: every line that went into a batch
is processed exactly once; lines received in the last interval before a crash, not yet in a batch,
are lost.

Rate control: the socket is one receiver with one partition. With ``spark.streaming.receiver.maxRate``
(:data:`~dstreams.config.RECEIVER_MAX_RATE`) or backpressure, a batch takes at most its limit of the
oldest buffered lines (:meth:`InputNode.max_records_per_partition`); the others stay buffered, in
order, for the next batches. The receiving thread does not slow down: the buffer grows while lines
arrive faster than the limit, and what is buffered is lost in a driver crash.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from .. import config
from ..time import BatchTime
from .input import InputNode

if TYPE_CHECKING:
    from ..graph import DStreamGraph

log = logging.getLogger(__name__)


class SocketInputNode(InputNode):
    """``socketTextStream``: see the module docstring."""

    max_rate_setting = config.RECEIVER_MAX_RATE

    @property
    def replayable(self) -> bool:  # type: ignore[override]
        return self.graph.wal is not None

    def __init__(self, graph: DStreamGraph, host: str, port: int) -> None:
        super().__init__(graph)
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        self.host = host
        self.port = port
        self._buffer: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for name in ("_lock", "_stop", "_thread", "connected"):
            state.pop(name, None)
        state["_buffer"] = []
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._receive, name=f"dstreams-socket-{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _receive(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            try:
                with socket.create_connection((self.host, self.port), timeout=2.0) as s:
                    s.settimeout(0.2)
                    self.connected.set()
                    delay = 0.1
                    pending = b""
                    while not self._stop.is_set():
                        try:
                            chunk = s.recv(65536)
                        except TimeoutError:
                            continue
                        if not chunk:
                            break
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        if lines:
                            decoded = [ln.rstrip(b"\r").decode("utf-8", "replace") for ln in lines]
                            with self._lock:
                                self._buffer.extend(decoded)
                    if pending:
                        with self._lock:
                            self._buffer.append(pending.rstrip(b"\r").decode("utf-8", "replace"))
            except OSError as e:
                log.debug("socket source %s:%s: %s (retrying)", self.host, self.port, e)
            finally:
                self.connected.clear()
            self._stop.wait(delay)
            delay = min(delay * 2, 2.0)

    def compute(self, time: BatchTime) -> RDD | None:
        wal = self.graph.wal
        replayed = self.replayed_offsets(time)
        taken = 0  # lines to drop from the buffer once the batch is fixed
        if replayed is not None and wal is not None:
            lines = wal.read(replayed["wal"])
            offsets = replayed
        else:
            limit = self.max_records_per_partition(time, 1)
            with self._lock:
                lines = self._buffer[:limit] if limit is not None else list(self._buffer)
            # Written before the lines leave the buffer: a write that fails (the store is down) loses
            # nothing, and the batch is built again with the same lines and any that arrived since.
            offsets = {"wal": wal.write(f"wal/{self.key}/{time.ms:015d}", lines)} if wal is not None else None
            taken = len(lines)
        sc = self.graph.sc
        rdd = sc.parallelize(lines, min(len(lines), sc.defaultParallelism)) if lines else sc.emptyRDD()
        # The input contract's failure rule: the lines leave the buffer only once the batch's RDD is built
        # (only this method removes lines, from the front, so the first ``taken`` are still these).
        if taken:
            with self._lock:
                del self._buffer[:taken]
        self.report_batch(time, len(lines), offsets)
        return rdd
