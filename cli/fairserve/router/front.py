"""The router's HTTP front: the generation routes' common case on a lean HTTP/1.1 server,
everything else on aiohttp.

Why: with fast upstreams, aiohttp's server side (a request object, header multidicts, a
payload stream, a task, a writer and a response object per request, routing, middleware)
was about a third of the router's CPU per proxied request. The front serves the requests
that matter for throughput itself, with one buffer, one header mapping and one task per
request, and one write per answer.

**What the front serves.** ``POST`` to ``/v1/chat/completions``, ``/v1/completions`` or
``/generate`` over HTTP/1.0 or 1.1, with a ``Content-Length`` body within the size limit
and no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``. Anything else (other routes and
methods, chunked or oversize bodies, heads it cannot parse) is handed over, with the
connection and the bytes read so far, to aiohttp's protocol, which answers exactly as it
always did (404, 405, 413, 400...); the connection then stays with aiohttp.

**What it keeps from aiohttp.** A client that disconnects cancels its handler (aiohttp's
``handler_cancellation``), which aborts the upstream request; keep-alive and pipelined
requests (served in order); back-pressure on streamed answers (writes wait while the
socket's buffer is full); errors in the OpenAI shape with the statuses and messages of the
handlers (``handlers.error_response``).
"""

from __future__ import annotations

import asyncio
import http
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from multidict import CIMultiDict

from fairserve.core.openai_api import ApiError, Route
from fairserve.router import handlers, proxy

if TYPE_CHECKING:
    from fairserve.router.service import Router

log = logging.getLogger("fairserve.router")

ROUTES: dict[bytes, Route] = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completions",
    b"/generate": "generate",
}
MAX_HEAD_BYTES = 8190
IDLE_TIMEOUT_S = 75.0
"""Close a connection without a request in progress for this long (aiohttp's keep-alive)."""
"""A longer request head goes to aiohttp (which answers 400 or 431 as it sees fit)."""
_HAND_OVER_HEADERS = (b"transfer-encoding", b"expect", b"upgrade")
_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"


class Front:
    """The protocol factory of the router's listening socket.

    Connections idle for ``idle_timeout_s`` (no request in progress; a request whose bytes
    stopped arriving counts as idle) are closed by one periodic sweep, as aiohttp closes
    idle keep-alive connections, so that leaked client connections do not pile up."""

    def __init__(
        self,
        router: Router,
        fallback: Callable[[], asyncio.Protocol],
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.router = router
        self.fallback = fallback
        """aiohttp's protocol factory (``web.Server``), for the requests handed over."""
        self.max_body_bytes = router.config.max_body_bytes
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[FrontConnection] = set()
        self.handed_over = 0
        self._sweeper: asyncio.TimerHandle | None = None

    def __call__(self) -> FrontConnection:
        if self._sweeper is None:
            self._arm()
        return FrontConnection(self)

    def close(self) -> None:
        """Close every connection still with the front (in-flight handlers are cancelled)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.close()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(min(10.0, self.idle_timeout_s / 2), self._sweep)

    def _sweep(self) -> None:
        deadline_s = time.monotonic() - self.idle_timeout_s
        for conn in [c for c in self.connections if c.idle_since_s < deadline_s]:
            conn.close()
        self._arm()


class _Head:
    """A parsed request head the front serves."""

    __slots__ = ("body_end", "headers", "http10", "keep_alive", "route", "start")

    def __init__(
        self,
        route: Route,
        headers: CIMultiDict[str],
        start: int,
        length: int,
        http10: bool,
        keep_alive: bool,
    ) -> None:
        self.route = route
        self.headers = headers
        self.start = start
        self.body_end = start + length
        self.http10 = http10
        self.keep_alive = keep_alive


class FrontConnection(asyncio.Protocol):
    """One client connection; also the :class:`~fairserve.router.answer.Responder` of the
    request it is serving (one at a time)."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.idle_since_s = time.monotonic()
        """When the last request ended (infinity while one is being served)."""
        self._buf: bytes | bytearray = b""
        self._head: _Head | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._read_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        # The request being served:
        self._keep_alive = True
        self._http10 = False
        self._started = False
        """Bytes of the answer went out (an error can no longer be answered)."""

    # ------------------------------------------------------------------ protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.front.connections.add(self)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            if type(buf) is bytes:
                buf = bytearray(buf)
            buf += data
            self._buf = buf
        else:
            self._buf = buf = data
        if self._task is None:
            self._next()
        elif len(buf) > self.front.max_body_bytes + MAX_HEAD_BYTES and self.transport:
            self._read_paused = True  # pipelined requests piling up behind a slow one
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # like aiohttp: close; connection_lost cancels what is in flight

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.front.connections.discard(self)
        if self._task is not None:
            self._task.cancel()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ requests
    def _next(self) -> None:
        """Start serving the next complete request in the buffer, if any."""
        head = self._head
        if head is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    self._hand_over()
                return
            head = _parse_head(bytes(self._buf[:end]), end + 4, self.front.max_body_bytes)
            if head is None:
                self._hand_over()
                return
            self._head = head
        buf = self._buf
        if len(buf) < head.body_end:
            return  # the rest of the body is on its way
        body = buf[head.start : head.body_end]
        self._buf = buf[head.body_end :]
        self._head = None
        self._keep_alive, self._http10, self._started = head.keep_alive, head.http10, False
        self.idle_since_s = math.inf
        self._task = asyncio.get_running_loop().create_task(
            self._serve(head.route, head.headers, bytes(body))
        )

    def _hand_over(self) -> None:
        """Give this connection and what it sent so far to aiohttp."""
        transport = self.transport
        if transport is None or self._closed:
            return
        self.front.connections.discard(self)
        self.front.handed_over += 1
        protocol = self.front.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        buf, self._buf = self._buf, b""
        if buf:
            protocol.data_received(bytes(buf))
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    async def _serve(self, route: Route, headers: CIMultiDict[str], raw: bytes) -> None:
        """``handlers._generation``'s handler, on the front."""
        router = self.front.router
        try:
            handlers.check_open(router)
            call = handlers.prepare_call(router, route, headers, raw)
            await proxy.serve(router, call, self)
        except ApiError as exc:
            self._error(exc)
        except asyncio.CancelledError:
            raise
        except ConnectionError:  # the client left while the answer was being written
            self._keep_alive = False
        except Exception:
            log.exception("error while serving %s", route)
            self._error(ApiError(500, "internal error in the router"), close=True)
        self._task = None
        self.idle_since_s = time.monotonic()
        if self._closed or self.transport is None:
            return
        if not self._keep_alive:
            self.transport.close()
            return
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        if self._buf:
            self._next()

    # ------------------------------------------------------------------ responder
    def answer(self, status: int, body: bytes) -> None:
        self._started = True
        if self.transport is None or self._closed:
            return
        self.transport.write(
            b"HTTP/1.1 %d %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b\r\n%b"
            % (status, _reason(status), len(body), self._connection_header(), body)
        )

    async def open_stream(self) -> None:
        self._started = True
        self._check_open()
        assert self.transport is not None
        if self._http10:  # no chunked encoding in HTTP/1.0: the end of the connection ends it
            self._keep_alive = False
            self.transport.write(_SSE_HEAD + b"Connection: close\r\n\r\n")
        else:
            self.transport.write(_SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        await self._drained()

    async def write(self, data: bytes) -> None:
        self._check_open()
        assert self.transport is not None
        if data:
            self.transport.write(data if self._http10 else b"%x\r\n%b\r\n" % (len(data), data))
        await self._drained()

    async def write_eof(self) -> None:
        self._check_open()
        assert self.transport is not None
        if not self._http10:
            self.transport.write(b"0\r\n\r\n")

    # ------------------------------------------------------------------ internals
    def _connection_header(self) -> bytes:
        if not self._keep_alive:
            return b"Connection: close\r\n"
        return b"Connection: keep-alive\r\n" if self._http10 else b""

    def _check_open(self) -> None:
        if self._closed or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")

    async def _drained(self) -> None:
        while self._write_paused and not self._closed:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await self._drain
            finally:
                self._drain = None
        self._check_open()

    def _wake_writer(self) -> None:
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _error(self, exc: ApiError, close: bool = False) -> None:
        """The answer to a refused request (or close, when an answer already started)."""
        if self._started or close:
            self._keep_alive = False
        if self._started:
            return
        response = handlers.error_response(exc)
        self._started = True
        if self.transport is None or self._closed:
            return
        extra = b"".join(
            f"{name}: {value}\r\n".encode("latin-1")
            for name, value in response.headers.items()
            if name.lower() not in ("content-length", "content-type")
        )
        body = cast(bytes, response.body)
        self.transport.write(
            b"HTTP/1.1 %d %b\r\nContent-Type: %b\r\nContent-Length: %d\r\n%b%b\r\n%b"
            % (
                exc.status,
                _reason(exc.status),
                response.headers.get("Content-Type", "application/json").encode("latin-1"),
                len(body),
                extra,
                self._connection_header(),
                body,
            )
        )


def _parse_head(head: bytes, start: int, max_body_bytes: int) -> _Head | None:
    """The request head if the front serves it, else None (aiohttp will)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST":
        return None
    route = ROUTES.get(parts[1].partition(b"?")[0])
    version = parts[2]
    if route is None or version not in (b"HTTP/1.1", b"HTTP/1.0"):
        return None
    length: int | None = None
    connection = b""
    pairs: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in b" \t" or name[:1] in b" \t":
            return None  # malformed, or an obsolete folded line
        key = name.lower()
        value = value.strip()
        if key == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif key == b"connection":
            connection = value.lower()
        elif key in _HAND_OVER_HEADERS:
            return None
        pairs.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))
    if length is None or length > max_body_bytes:
        return None
    http10 = version == b"HTTP/1.0"
    keep_alive = b"keep-alive" in connection if http10 else b"close" not in connection
    return _Head(route, CIMultiDict(pairs), start, length, http10, keep_alive)


_REASONS: dict[int, bytes] = {s.value: s.phrase.encode() for s in http.HTTPStatus}


def _reason(status: int) -> bytes:
    return _REASONS.get(status, b"Unknown")
