"""The status server: a WSGI application on the standard library's ``wsgiref``, one thread per request.

Contract:

* :meth:`StatusServer.start` runs while a StreamingContext is active (``StreamingContext.start`` calls it
  before the first batch, ``stop`` calls :meth:`StatusServer.close`). It returns None when
  ``spark.dstreams.ui.enabled`` is off, or when no port could be bound (a warning says so; the stream
  runs without it: a monitoring page never stops a job).
* Address: like Spark's UI, it binds to ``SPARK_LOCAL_IP`` when set, else to every address; port
  ``spark.dstreams.ui.port`` (4050), and when that is taken the next ones, up to ``spark.port.maxRetries``
  (16) more; port 0 takes any free port. Its URL names ``SPARK_PUBLIC_DNS``, else the address it bound
  to, else ``spark.driver.host``. The URL is logged once at start (a WARNING-level line, so that it shows
  with Python's default logging) and is ``ssc.uiWebUrl``.
* Routes (all GET; see docs/guide/monitoring.md): ``/`` the page, ``/static/<file>`` its script and style (shipped in
  the package: no network access), ``/api`` the list of endpoints, ``/api/status``, ``/api/batches``
  (``?after=<batch ms>``: only newer batches), ``/api/batches/<batch ms>``, ``/api/streams``,
  ``/api/errors``, ``/metrics`` (Prometheus text format, served by ``prometheus_client``'s WSGI app).
  JSON is never cached by the browser. A request that fails answers 500 with the error as JSON.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app

from dstreams import config

from .metrics import StatusMetrics
from .model import BatchHistory, StatusModel, StatusSources

log = logging.getLogger("dstreams.status")

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

#: Files of the page, served from the package (``static/``).
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
#: Spark's default for ``spark.port.maxRetries``: how many ports after the first are tried.
DEFAULT_PORT_RETRIES = 16
#: How often the serving thread checks for a shutdown (bounds how long ``close`` waits for it).
POLL_INTERVAL_S = 0.1

API_INDEX = {
    "/api/status": "the application, the driver (epoch, checkpoint location), totals, sources, the stream graph "
                   "with state sizes and checkpoints, the last errors",
    "/api/batches": "the completed batches of the last 10 minutes, oldest first (?after=<batch ms>: newer ones only)",
    "/api/batches/<batch ms>": "one batch: its output operations, what each source reported, its Spark jobs",
    "/api/streams": "the stream graph: nodes (kind, state, watermark) and edges",
    "/api/errors": "the last errors, newest first",
    "/metrics": "Prometheus metrics (text exposition format)",
}


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One daemon thread per request (a slow client never holds up the others nor the driver's exit)."""

    daemon_threads = True


class _ThreadingWSGIServerV6(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """Requests are logged at DEBUG (wsgiref prints each one to stderr)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class' name
        log.debug("status server: " + format, *args)


def _static(name: str) -> bytes | None:
    """A file of the page, or None when there is no such file."""
    if "/" in name or name.startswith(".") or os.path.splitext(name)[1] not in STATIC_TYPES:
        return None
    try:
        return (resources.files(__package__) / "static" / name).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def make_app(model: StatusModel, metrics: StatusMetrics) -> WsgiApp:
    """The WSGI application serving ``model`` and ``metrics`` (routes in the module docstring)."""
    metrics_app = make_wsgi_app(metrics.registry)

    def respond(start_response: StartResponse, status: str, body: bytes, content_type: str,
                cache: bool = False) -> list[bytes]:
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body))),
                   ("Cache-Control", "max-age=60" if cache else "no-store")]
        start_response(status, headers)
        return [body]

    def as_json(start_response: StartResponse, value: Any, status: str = "200 OK") -> list[bytes]:
        body = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        return respond(start_response, status, body, "application/json; charset=utf-8")

    def route(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path in ("/", "/index.html"):
            page = _static("index.html")
            assert page is not None, "the status page is missing from the package (dstreams/api/status/static)"
            return respond(start_response, "200 OK", page, STATIC_TYPES[".html"])
        if path.startswith("/static/"):
            name = path[len("/static/"):]
            data = _static(name)
            if data is None:
                return as_json(start_response, {"error": f"no such file: {name}"}, "404 Not Found")
            return respond(start_response, "200 OK", data, STATIC_TYPES[os.path.splitext(name)[1]], cache=True)
        if path in ("/api", "/api/"):
            return as_json(start_response, API_INDEX)
        if path == "/api/status":
            return as_json(start_response, model.status())
        if path == "/api/streams":
            return as_json(start_response, model.streams())
        if path == "/api/errors":
            return as_json(start_response, model.errors())
        if path == "/api/batches":
            after = parse_qs(environ.get("QUERY_STRING", "")).get("after")
            try:
                after_ms = int(after[0]) if after else None
            except ValueError:
                return as_json(start_response, {"error": "after must be a batch time in ms, e.g. ?after=1000"},
                               "400 Bad Request")
            return as_json(start_response, model.batches(after_ms))
        if path.startswith("/api/batches/"):
            raw = path[len("/api/batches/"):]
            batch = model.batch(int(raw)) if raw.isdigit() else None
            if batch is None:
                return as_json(start_response, {"error": f"no batch {raw!r} in the last 10 minutes of batches"},
                               "404 Not Found")
            return as_json(start_response, batch)
        return as_json(start_response, {"error": f"no such page: {path}", "endpoints": API_INDEX}, "404 Not Found")

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Length", "0")])
            return [b""]
        try:
            return route(environ, start_response)
        except Exception as e:  # noqa: BLE001 - one request fails, the server and the stream go on
            log.warning("status server: %s failed", environ.get("PATH_INFO"), exc_info=True)
            body = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
            start_response("500 Internal Server Error", [("Content-Type", "application/json"),
                                                         ("Content-Length", str(len(body)))], None)
            return [body]

    return app


def bind_address() -> str:
    """Where Spark's UI binds: ``SPARK_LOCAL_IP``, else every address."""
    return os.environ.get("SPARK_LOCAL_IP") or "0.0.0.0"


def bind(host: str, port: int, retries: int) -> WSGIServer | None:
    """A server bound to ``host``, on ``port`` or the first free one of the next ``retries`` ports (port 0: any
    free port); None when they are all taken. It serves nothing yet: its port decides the URL the application
    is built with, which the caller then hands it (``WSGIServer.set_app``, as ``wsgiref.make_server`` does)
    before serving."""
    server_class = _ThreadingWSGIServerV6 if ":" in host else _ThreadingWSGIServer
    candidates = [0] if port == 0 else range(port, min(65535, port + retries) + 1)
    for p in candidates:
        try:
            return server_class((host, p), _QuietHandler)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            log.debug("status server: port %d is taken, trying the next one", p)
    return None


def public_url(host: str, port: int, driver_host: str | None) -> str:
    """The URL to print: ``SPARK_PUBLIC_DNS``, else the bound address, else the driver's host."""
    name = os.environ.get("SPARK_PUBLIC_DNS")
    if not name:
        name = host if host not in ("0.0.0.0", "::", "") else (driver_host or socket.gethostname())
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"
    return f"http://{name}:{port}"


@dataclass(frozen=True)
class StatusSettings:
    """Where the server listens: ``port`` (0: any free one) and how many ports after it may be tried."""

    port: int
    port_retries: int


class StatusServer:
    """The running status server of one StreamingContext (see the module docstring)."""

    def __init__(self, sources: StatusSources, history: BatchHistory, model: StatusModel, metrics: StatusMetrics,
                 httpd: WSGIServer, url: str) -> None:
        self.sources = sources
        self.history = history
        self.model = model
        self.metrics = metrics
        self._httpd: WSGIServer | None = httpd  # None once closed
        self.url = url
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": POLL_INTERVAL_S},
                                        name="dstreams-status-server", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError(f"the status server that was at {self.url} is closed: it has no port")
        return int(self._httpd.server_address[1])

    @staticmethod
    def settings(conf: config.ConfLike) -> StatusSettings | None:
        """The server's settings in ``conf`` (a SparkConf), None when it is disabled; ``ValueError`` naming the
        key for an invalid ``spark.dstreams.ui.*`` value. ``StreamingContext.start`` reads them before it
        builds anything, so that a wrong value fails the start cleanly."""
        if not config.get(config.UI_ENABLED, conf):
            return None
        try:
            retries = max(0, int(conf.get("spark.port.maxRetries") or DEFAULT_PORT_RETRIES))
        except ValueError:
            retries = DEFAULT_PORT_RETRIES
        return StatusSettings(config.get(config.UI_PORT, conf), retries)

    @classmethod
    def start(cls, sources: StatusSources, settings: StatusSettings | None) -> StatusServer | None:
        """Start serving ``sources`` (a context about to start) with ``settings`` (:meth:`settings`), or None:
        disabled, or no free port. Registers the history listener on the context's bus, so call it before the
        first batch is generated."""
        if settings is None:
            return None
        port, retries = settings.port, settings.port_retries
        conf = sources.sc.getConf()
        host = bind_address()
        try:
            httpd = bind(host, port, retries)
        except OSError as e:
            httpd = None
            log.warning("the dstreams status server could not bind to %s:%d (%s); the stream runs without it", host,
                        port, e)
        else:
            if httpd is None:
                log.warning("the dstreams status server found no free port from %d to %d on %s (set %s, or %s=0 "
                            "for any free port); the stream runs without it", port, port + retries, host,
                            config.UI_PORT.key, config.UI_PORT.key)
        if httpd is None:
            return None
        url = public_url(host, int(httpd.server_address[1]), conf.get("spark.driver.host"))
        try:
            history = BatchHistory()
            model = StatusModel(sources, history, url)
            metrics = StatusMetrics(model)
            history.add_observer(metrics.observe)
            httpd.set_app(make_app(model, metrics))
        except BaseException:
            httpd.server_close()
            raise
        sources.bus.add(history)
        log.warning("dstreams status page at %s (JSON: %s/api, Prometheus: %s/metrics; %s=false turns it off)",
                    url, url, url, config.UI_ENABLED.key)
        return cls(sources, history, model, metrics, httpd, url)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and release the port; idempotent. The history stops listening."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        try:
            httpd.shutdown()
            self._thread.join(timeout_s)
        finally:
            httpd.server_close()
            try:
                self.sources.bus.remove(self.history)
            except ValueError:
                pass
            self.metrics.close()
            self.model.close()
