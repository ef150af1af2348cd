"""A fault-injecting TCP proxy for the chaos schedule (``python -m benchmarks chaos``).

The chaos run's driver and executors reach the Ceph RADOS Gateway and the run's own Redis server only
through a :class:`FaultProxy` each (the app is given the proxy's address), so that the orchestrator can
break the path without touching the shared services that other people's tests use:

* :meth:`FaultProxy.down` closes the listening socket and aborts (RST) every open connection: a new
  connection is refused (``ECONNREFUSED``) and a request in flight fails with a reset, exactly what a
  client sees when the server process stops. :meth:`FaultProxy.up` listens again on the same port.
* :meth:`FaultProxy.cut` aborts every open connection and keeps listening: a dropped connection (a load
  balancer or NAT timing out, a server-side ``CLIENT KILL``). Clients that reconnect get through.

Contract: bytes are forwarded unchanged in both directions; a connection whose upstream cannot be reached
is closed at once (the client sees the same as a stopped server); every method is thread-safe and returns
once the change is in effect (the proxy's event loop runs in a daemon thread of its own); :meth:`close`
stops the thread and is idempotent. Counters (``connections``, ``aborted``, ``refused_upstream``) are for
the run's report.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

#: Bytes read per chunk from either side.
_CHUNK = 65536
#: Every call into the proxy's loop waits at most this long.
_CALL_TIMEOUT_S = 10.0


def free_port(start: int | None = None, end: int | None = None) -> int:
    """A TCP port on 127.0.0.1 nobody listens on: the first free one in ``[start, end)`` when given, else
    one the kernel picks. Raises RuntimeError when the range has none."""
    candidates = range(start, end) if start is not None and end is not None else [0]
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            # Nothing may be listening there either (another process with SO_REUSEADDR would let us bind).
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.settimeout(0.2)
                if probe.connect_ex(("127.0.0.1", s.getsockname()[1])) == 0:
                    continue
            return int(s.getsockname()[1])
    raise RuntimeError(f"no free TCP port in [{start}, {end})")


class FaultProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``; see the module docstring."""

    def __init__(self, name: str, upstream_host: str, upstream_port: int, port: int | None = None) -> None:
        self.name = name
        self.upstream = (upstream_host, upstream_port)
        self.port = port if port is not None else free_port()
        self.connections = 0
        self.aborted = 0
        self.refused_upstream = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._transports: set[asyncio.BaseTransport] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{name}", daemon=True)
        self._closed = False
        self._thread.start()
        self.up()

    # ------------------------------------------------------------------------------------ public, thread-safe
    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def is_up(self) -> bool:
        return self._server is not None

    def up(self) -> None:
        """Listen (again) on the proxy's port; a no-op when it listens already."""
        self._call(self._up())

    def down(self) -> None:
        """Stop listening and abort every open connection (a stopped server, as clients see it)."""
        self._call(self._down())

    def cut(self) -> int:
        """Abort every open connection, keep listening; returns how many were cut."""
        return int(self._call(self._cut()))

    def close(self) -> None:
        """Down for good; the loop and its thread stop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._call(self._down())
        with contextlib.suppress(Exception):
            self._call(self._cancel_tasks())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CALL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "port": self.port, "upstream": f"{self.upstream[0]}:{self.upstream[1]}",
                "connections": self.connections, "aborted": self.aborted,
                "refused_upstream": self.refused_upstream}

    # ------------------------------------------------------------------------------------ the loop's side
    def _call(self, coro: Any) -> Any:
        if self._closed and not self._thread.is_alive():
            coro.close()
            raise RuntimeError(f"proxy {self.name} is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CALL_TIMEOUT_S)

    async def _up(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # no new connections; open ones are aborted below
        await self._cut()

    async def _cut(self) -> int:
        transports = list(self._transports)
        self._transports.clear()
        for t in transports:
            if not t.is_closing():
                t.abort()  # RST, not FIN: the peer sees "connection reset"
        self.aborted += len(transports)
        return len(transports)

    async def _cancel_tasks(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        client_t = writer.transport
        self._transports.add(client_t)
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5.0)
        except (OSError, asyncio.TimeoutError):
            self.refused_upstream += 1
            self._transports.discard(client_t)
            client_t.abort()
            return
        if client_t.is_closing():  # cut while connecting upstream
            up_writer.transport.abort()
            return
        up_t = up_writer.transport
        self._transports.add(up_t)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for t in (client_t, up_t):
                self._transports.discard(t)
                if not t.is_closing():
                    t.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, RuntimeError):
            writer.transport.abort()  # one side broke: so does the other, as on a direct connection
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof() and not writer.transport.is_closing():
                    writer.write_eof()
