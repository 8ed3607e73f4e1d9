"""The controller's HTTP listener: ``/metrics``, ``/api/v1/...`` and the dashboard at ``/``.

Theory of operation
-------------------
* **Its own thread and event loop.**  Scrapes, page loads and floods of connections are served
  by a thread of the controller with an event loop of its own, so none of it sits in the
  controller's loop between two Kafka requests (the bootstrap listener and the group
  coordinator live there).  What only the controller's loop may read (metadata, groups,
  processes) is fetched from it with ``run_coroutine_threadsafe`` as plain data
  (``collector.controller_view``): a few hundred microseconds of its time per request.
* **h11 parses** (sans-io, strict): a request line or header block over ``MAX_HEAD`` bytes is
  431, anything malformed is 400, a request with a body is 413, a method other than GET is 405
  (with ``Allow: GET``), a target over ``MAX_TARGET`` 414, an HTTP version other than 1.0 and
  1.1 505, an unknown path 404.  Each error answer closes the connection.
* **Bounded**: at most ``MAX_CONNECTIONS`` connections at once (more are closed as soon as they
  are accepted), ``HEAD_TIMEOUT_S`` to send a request head (slowloris), ``IDLE_TIMEOUT_S``
  between keep-alive requests.
* **Read only.**  Nothing served changes the broker.  Every script and style of the dashboard is
  a file of this package (``static/``): the page needs no network access.
* A sampler task takes a reading every ``SAMPLE_S`` for rates and the charts' history.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

import h11

from shmq.limits import Throttled, install_loop_handler
from shmq.monitor.collector import Collector
from shmq.monitor.exposition import render

log = logging.getLogger("shmq.http")

MAX_HEAD = 8192            # request line and headers
MAX_TARGET = 2048          # the request target alone
MAX_CONNECTIONS = 128
HEAD_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 30.0
SAMPLE_S = 1.0
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATIC = {  # path -> (file in shmq/monitor/static, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/static/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/static/uPlot.min.css": ("uPlot.min.css", "text/css; charset=utf-8"),
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),
}
SECURITY_HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy",
     b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
     b"connect-src 'self'; frame-ancestors 'none'"),
    (b"referrer-policy", b"no-referrer"),
]


class MonitorServer:
    """The HTTP listener's thread.  ``start`` binds (raising OSError on failure) and serves."""

    def __init__(self, collector: Collector, host: str, port: int,
                 view: Callable[[], Any], main_loop: asyncio.AbstractEventLoop) -> None:
        self.collector = collector
        self.host, self.port = host, port
        self._view = view
        self._main = main_loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._stopped: asyncio.Event | None = None
        self._static: dict[str, bytes] = {}
        self.connections = 0
        self.refused = 0

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="shmq-http",
                                        daemon=True)
        self._thread.start()
        started.result(30)

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        loop = self._loop = asyncio.new_event_loop()
        install_loop_handler(loop, log)
        try:
            loop.run_until_complete(self._serve(started))
        except Exception as exc:  # noqa: BLE001 - a failed bind is the caller's to report
            if not started.done():
                started.set_exception(exc)
            else:
                log.exception("HTTP listener failed")
        finally:
            loop.close()

    async def _serve(self, started: concurrent.futures.Future[None]) -> None:
        self._stopped = asyncio.Event()
        for name, _ in STATIC.values():
            self._static[name] = resources.files("shmq.monitor").joinpath(
                "static", name).read_bytes()
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True, backlog=1024, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        sampler = asyncio.ensure_future(self._sample())
        started.set_result(None)
        await self._stopped.wait()
        sampler.cancel()
        self._server.close()
        await asyncio.gather(sampler, return_exceptions=True)

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopped.set)
            except RuntimeError:   # closed meanwhile
                pass
        if self._thread is not None:
            self._thread.join(10)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    # -- data from the controller's loop ------------------------------------------------------

    async def view(self) -> Any:
        async def build() -> Any:
            return self._view()

        fut = asyncio.run_coroutine_threadsafe(build(), self._main)
        return await asyncio.wait_for(asyncio.wrap_future(fut), 10)

    async def _sample(self) -> None:
        throttled = Throttled(log)
        while True:
            try:
                self.collector.sample(await self.view())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed reading must not end the sampler
                # the first with its traceback; then one line per interval (out of descriptors,
                # say, this failed every second)
                throttled(logging.ERROR, type(exc), "metrics sample failed: %s", exc,
                          exc_info=exc if not throttled.held(type(exc)) else None)
            await asyncio.sleep(SAMPLE_S)

    # -- connections --------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= MAX_CONNECTIONS:
            self.refused += 1
            writer.transport.abort()
            return
        self.connections += 1
        try:
            await self._connection(reader, writer)
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        except Exception:  # noqa: BLE001 - one connection's bug must not end the listener
            log.exception("HTTP connection failed")
        finally:
            self.connections -= 1
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        timeout = HEAD_TIMEOUT_S
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._refuse(conn, writer, exc.error_status_hint, str(exc))
                return
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(MAX_HEAD), timeout)
                conn.receive_data(data)   # b"" is the end of the stream
                continue
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return
            if not isinstance(event, h11.Request):
                return
            # a GET has no body: its EndOfMessage is already here (anything else is refused)
            timeout = HEAD_TIMEOUT_S
            headers = {k: v for k, v in event.headers}
            head = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
            if head > MAX_HEAD:   # h11 limits only a head that is still incomplete
                await self._refuse(conn, writer, 431, "request head too large")
                return
            if event.http_version not in (b"1.1", b"1.0"):
                await self._refuse(conn, writer, 505, "HTTP/1.1 only")
                return
            if event.method != b"GET":
                await self._refuse(conn, writer, 405, "only GET is served",
                                   [(b"allow", b"GET")], body=event.method != b"HEAD")
                return
            if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
                await self._refuse(conn, writer, 413, "a GET request has no body")
                return
            if len(event.target) > MAX_TARGET:
                await self._refuse(conn, writer, 414, "request target too long")
                return
            status, ctype, body = await self._route(event.target)
            await self._send(conn, writer, status, ctype, body)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                end = conn.next_event()   # the request's EndOfMessage
            except h11.RemoteProtocolError:
                return
            if not isinstance(end, h11.EndOfMessage):
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return
            timeout = IDLE_TIMEOUT_S

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int,
                    ctype: str, body: bytes, extra: list[tuple[bytes, bytes]] | None = None,
                    send_body: bool = True) -> None:
        headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()),
                   *SECURITY_HEADERS, *(extra or [])]
        if status >= 400:
            headers.append((b"connection", b"close"))
        data = conn.send(h11.Response(status_code=status, headers=headers))
        if send_body:   # an answer to HEAD has none (h11 enforces it)
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        await asyncio.wait_for(writer.drain(), IDLE_TIMEOUT_S)

    async def _refuse(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int,
                      reason: str, extra: list[tuple[bytes, bytes]] | None = None,
                      body: bool = True) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            await self._send(conn, writer, status, "text/plain; charset=utf-8",
                             (reason + "\n").encode(), extra, send_body=body)
        except h11.LocalProtocolError:
            pass

    # -- routes -------------------------------------------------------------------------------

    async def _route(self, target: bytes) -> tuple[int, str, bytes]:
        path = target.split(b"?", 1)[0].decode("ascii", "replace")
        if path in STATIC:
            name, ctype = STATIC[path]
            return 200, ctype, self._static[name]
        if path == "/metrics":
            return 200, PROMETHEUS_TYPE, render(self.collector, await self.view())
        if path == "/api/v1/history":
            return self._json({"interval_s": SAMPLE_S, "points": list(self.collector.history)})
        if path in ("/api", "/api/", "/api/v1", "/api/v1/"):
            return self._json({"endpoints": ["/api/v1/snapshot", "/api/v1/history",
                                             "/api/v1/topics", "/api/v1/groups",
                                             "/api/v1/processes", "/metrics"]})
        if path.startswith("/api/v1/"):
            part = path[len("/api/v1/"):]
            if part in ("snapshot", "topics", "groups", "processes", "requests"):
                snap = self.collector.snapshot(await self.view())
                return self._json(snap if part == "snapshot" else {part: snap[part]})
        return 404, "text/plain; charset=utf-8", b"not found\n"

    @staticmethod
    def _json(data: Any) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(data, separators=(",", ":")).encode()
