"""The router's HTTP front: the generation routes' common case on a lean HTTP/1.1 server,
everything else on aiohttp.

Why: with fast upstreams, aiohttp's server side (a request object, header multidicts, a
payload stream, a task, a writer and a response object per request, routing, middleware)
was about a third of the router's CPU per proxied request. The front serves the requests
that matter for throughput itself, with one buffer and one header mapping per request, one
task per connection, and one write per answer.

**What the front serves.** ``POST`` to ``/v1/chat/completions``, ``/v1/completions`` or
``/generate`` over HTTP/1.0 or 1.1, with a ``Content-Length`` body within the size limit
and no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``, whose head (at most 8190 bytes)
arrives whole and passes :mod:`~fairserve.router.http11`'s strict rules. Anything else
(other routes and methods, chunked or oversize bodies, heads that break a rule or arrive
in pieces) is handed over, with the connection and the bytes read so far, to aiohttp's
protocol, which answers exactly as it always did (404, 405, 413, 400...); the connection
then stays with aiohttp. So the two paths refuse the same bytes with the same status by
construction (``tests/router/test_http_strict_fuzz.py`` checks it).

**What it keeps from aiohttp.** A client that disconnects cancels its handler (aiohttp's
``handler_cancellation``), which aborts the upstream request; keep-alive and pipelined
requests (served in order); back-pressure on streamed answers (writes wait while the
socket's buffer is full); errors in the OpenAI shape with the statuses and messages of the
handlers (``handlers.error_response``).
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from multidict import CIMultiDictProxy

from fairserve.core.openai_api import ApiError, Route, error_body, internal_error
from fairserve.router import guard, handlers, http11, proxy
from fairserve.router.front_head import Head, parse_head
from fairserve.router.guard import ConnectionLimits

if TYPE_CHECKING:
    from fairserve.router.service import Router

log = logging.getLogger("fairserve.router")

MAX_HEAD_BYTES = http11.MAX_FIELD_BYTES
"""A longer request head goes to aiohttp (which serves it or answers 400 by its limits)."""
_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"


class Front:
    """The protocol factory of the router's listening socket.

    Connections idle for ``idle_timeout_s`` (no request in progress; a request whose bytes
    stopped arriving counts as idle) are closed by one periodic sweep, as aiohttp closes
    idle keep-alive connections, so that leaked client connections do not pile up and a
    client trickling its request (slowloris) holds its socket for a bounded time; one whose
    body was still arriving gets 408 first. At most ``max_connections`` are open (those
    handed to aiohttp included): past it the longest-idle one (else the oldest one handed
    to aiohttp and not being served) is closed to admit a new one, and when every one is
    busy the new one gets 503 and is closed."""

    def __init__(
        self,
        router: Router,
        fallback: Callable[[], asyncio.Protocol],
        limits: ConnectionLimits | None = None,
        in_flight: guard.InFlight | None = None,
    ) -> None:
        limits = limits or ConnectionLimits()
        self.in_flight = in_flight or guard.InFlight()
        """The aiohttp path's requests being served (their connections are not idle)."""
        self.router = router
        self.fallback = fallback
        """aiohttp's protocol factory (``web.Server``), for the requests handed over."""
        self.max_body_bytes = router.config.max_body_bytes
        self.idle_timeout_s = limits.idle_timeout_s
        self.max_connections = limits.max_connections
        self.refused = 0
        """Connections answered 503 because every open one was busy."""
        self.connections: set[FrontConnection] = set()
        self.handed_over = 0
        self._sweeper: asyncio.TimerHandle | None = None

    def __call__(self) -> FrontConnection:
        if self._sweeper is None:
            self._arm()
        return FrontConnection(self)

    def close(self) -> None:
        """Close every connection still with the front; a request in flight (the drain
        timeout passed) ends with 503 "the router is shutting down", or with that error as
        the last event of a stream already under way, and its handler is cancelled."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.end_with(guard.shutting_down())

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(min(10.0, self.idle_timeout_s / 2), self._sweep)

    def _sweep(self) -> None:
        deadline_s = time.monotonic() - self.idle_timeout_s
        for conn in [c for c in self.connections if c.idle_since_s < deadline_s]:
            conn.time_out()
        self._arm()

    def admit(self, conn: FrontConnection) -> bool:
        """Count a new connection in, making room at the cap; False: refused (503)."""
        handed_over = getattr(self.fallback, "connections", [])
        if len(self.connections) + len(handed_over) >= self.max_connections:
            victim = self._idlest(handed_over)
            if victim is None:
                self.refused += 1
                conn.refuse(ApiError(503, "too many open connections; try again later"))
                return False
            victim.close()
        self.connections.add(conn)
        return True

    def _idlest(self, handed_over: list[Any]) -> FrontConnection | asyncio.BaseTransport | None:
        """The connection to close to make room: the front's longest idle, else the oldest
        one handed to aiohttp that no handler is serving (a head or keep-alive wait)."""
        idle = [c for c in self.connections if not c.busy]
        if idle:
            return min(idle, key=lambda c: c.idle_since_s)
        for handler in handed_over:  # aiohttp's Server keeps them oldest first
            transport = getattr(handler, "transport", None)
            if (
                transport is not None
                and not transport.is_closing()
                and transport not in self.in_flight.transports
            ):
                return cast(asyncio.BaseTransport, transport)
        return None


class FrontConnection(asyncio.Protocol):
    """One client connection; also the :class:`~fairserve.router.answer.Responder` of the
    request it is serving (one at a time)."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.idle_since_s = time.monotonic()
        """When the last request ended (infinity while one is being served)."""
        self._buf: bytes | bytearray = b""
        self._head: Head | None = None
        self._task: asyncio.Task[None] | None = None
        """The connection's serving task: it serves one request after another and waits
        for the next in between. One task per connection, not per request: creating and
        collecting a task (asyncio registers each in a weak set) cost ~1-2 us a request;
        a waiting task holds ~1 KB, ~10 MB at the 10,000 connections ``guard`` allows."""
        self._serving = False
        """A request is being served (or handed to the task and about to be)."""
        self._request: tuple[Route, CIMultiDictProxy[str], bytes] | None = None
        """The next request, handed from ``_next`` to the task."""
        self._waiter: asyncio.Future[None] | None = None
        """Set while the task waits for the next request."""
        self._handed_over = False
        self._closed = False
        self._read_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        # The request being served:
        self._keep_alive = True
        self._http10 = False
        self._started = False
        """Bytes of the answer went out (an error can no longer be answered)."""
        self._streaming = False
        """The answer is an SSE stream."""

    # ------------------------------------------------------------------ protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        """Kept: ``get_running_loop`` costs a ``getpid`` system call per request."""
        self.front.admit(self)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            if type(buf) is bytes:
                buf = bytearray(buf)
            buf += data
            self._buf = buf
        else:
            self._buf = buf = data
        if not self._serving:
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

    @property
    def busy(self) -> bool:
        """A request is being served."""
        return self._serving

    def time_out(self) -> None:
        """Close an idle connection; a request whose head arrived but whose body did not
        gets 408 first (as on the aiohttp path)."""
        if self._head is not None and not self.busy:
            self._keep_alive, self._http10, self._started = False, self._head.http10, False
            self._error(guard.timed_out(), close=True)
        self.close()

    def end_with(self, exc: ApiError) -> None:
        """End the request in flight, if any, with ``exc`` (its answer, or the last event of
        its stream), then close; nothing more is written after it."""
        transport = self.transport
        if self.busy and transport is not None and not self._closed:
            if not self._started:
                self._error(exc, close=True)
            elif self._streaming and not transport.is_closing():
                event = b"data: " + json.dumps(error_body(exc)).encode() + b"\n\n"
                chunked = b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event)
                transport.write(event if self._http10 else chunked)
        self.close()

    def refuse(self, exc: ApiError) -> None:
        """Answer ``exc`` before any request and close."""
        self._keep_alive = False
        self._error(exc, close=True)
        self.close()

    # ------------------------------------------------------------------ requests
    def _next(self) -> None:
        """Start serving the next complete request in the buffer, if any."""
        head = self._head
        if head is None:
            end = self._buf.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
            if end < 0:
                # The front serves heads that arrive whole. A partial one goes to aiohttp,
                # whose incremental parser refuses a bad prefix at once, as the aiohttp path
                # does, and whose keep-alive timeout ends one that trickles.
                self._hand_over()
                return
            head = parse_head(bytes(self._buf[:end]), end + 4, self.front.max_body_bytes)
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
        self._streaming = False
        self.idle_since_s = math.inf
        self._serving = True
        self._request = (head.route, head.headers, bytes(body))
        waiter = self._waiter
        if waiter is not None:  # the task waits for it
            self._waiter = None
            waiter.set_result(None)
        elif self._task is None:  # the first request (else the task is ending the last one)
            loop = self._loop or asyncio.get_running_loop()
            self._task = loop.create_task(self._run())

    def _hand_over(self) -> None:
        """Give this connection and what it sent so far to aiohttp."""
        transport = self.transport
        if transport is None or self._closed:
            return
        self.front.connections.discard(self)
        self.front.handed_over += 1
        self._handed_over = True
        if self._waiter is not None and self._task is not None:
            self._task.cancel()  # idle: nothing more comes to it
        protocol = self.front.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        buf, self._buf = self._buf, b""
        if buf:
            protocol.data_received(bytes(buf))
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    async def _run(self) -> None:
        """The connection's requests, one after another (ends when the connection does:
        closed, not kept alive, handed to aiohttp, or cancelled)."""
        loop = self._loop or asyncio.get_running_loop()
        while True:
            request = self._request
            if request is None:
                waiter = self._waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
                request = self._request
                if request is None:  # never: the waiter is woken with a request
                    return
            self._request = None
            if not await self._serve(*request):
                return

    async def _serve(self, route: Route, headers: CIMultiDictProxy[str], raw: bytes) -> bool:
        """``handlers._generation``'s handler, on the front; whether the connection serves
        more requests."""
        router = self.front.router
        try:
            handlers.check_open(router)
            call = handlers.prepare_call(router, route, headers, raw)
            del headers, raw  # not held for the whole answer (memory per request in flight)
            await proxy.serve(router, call, self)
        except ApiError as exc:
            self._error(exc, close=router.draining)  # draining: no more requests here
        except asyncio.CancelledError:
            raise
        except ConnectionError:  # the client left while the answer was being written
            self._keep_alive = False
        except Exception as exc:  # the client gets an error id; the log one line
            self._error(internal_error(log, exc, f"serving {route}"), close=True)
        self._serving = False
        self.idle_since_s = time.monotonic()
        if self._closed or self.transport is None:
            return False
        if not self._keep_alive:
            self.transport.close()
            return False
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        if self._buf:
            self._next()
        return not self._handed_over

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
        self._started = self._streaming = True
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


_REASONS: dict[int, bytes] = {s.value: s.phrase.encode() for s in http.HTTPStatus}


def _reason(status: int) -> bytes:
    return _REASONS.get(status, b"Unknown")
