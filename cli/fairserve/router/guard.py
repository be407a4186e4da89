"""Connection limits shared by the router's two HTTP paths (the lean front and aiohttp):
how long a client may take to send a request, how many connections may be open, and what
an ``Expect: 100-continue`` for an oversize body gets.

Why: a client that opens connections and trickles (or never finishes) its request holds a
socket, a buffer and, on the aiohttp path, a task, for as long as it likes (slowloris).
Both paths now close a connection whose request has not arrived within
:attr:`ConnectionLimits.idle_timeout_s` (aiohttp's ``keepalive_timeout`` for heads, a
bounded body read here for bodies), and the front caps the number of open connections.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError

from fairserve.core.openai_api import ApiError, error_body
from fairserve.router import handlers, http11

IDLE_TIMEOUT_S = 75.0
"""aiohttp's classic keep-alive timeout (and nginx's): long enough for any proxy in front."""


def default_max_connections() -> int:
    """Half the process's file-descriptor limit (the other half is for the workers'
    connections, logs and the trace), at least 64 and at most 10,000."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(64, min(10_000, soft // 2))


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a request may take to arrive and how many connections may be open."""

    idle_timeout_s: float = IDLE_TIMEOUT_S
    """A connection without a request in progress (idle between requests, or whose head or
    body is still arriving) is closed after this long; a request whose body has not arrived
    by then gets 408."""
    max_connections: int = field(default_factory=default_max_connections)
    """Open client connections; past it the longest-idle one is closed to admit a new one,
    or, when all are busy, the new one gets 503 and is closed (lean front only)."""

    def __post_init__(self) -> None:
        if not self.idle_timeout_s > 0:
            raise ValueError(
                f"idle_timeout_s: expected a positive number, got {self.idle_timeout_s}"
            )
        if self.max_connections < 1:
            raise ValueError(f"max_connections: expected >= 1, got {self.max_connections}")

    def runner_options(self) -> dict[str, Any]:
        """aiohttp's ``AppRunner`` options: its parser limits pinned to :mod:`http11`'s (so
        both paths refuse the same heads), the keep-alive timeout, which also bounds how
        long a head may take to arrive, and the lingering time (how long the unread rest of
        a refused body is read and dropped before closing; aiohttp's 10 s at most)."""
        return {
            "keepalive_timeout": self.idle_timeout_s,
            "lingering_time": min(10.0, self.idle_timeout_s),
            "max_line_size": http11.MAX_FIELD_BYTES,
            "max_field_size": http11.MAX_FIELD_BYTES,
            "max_headers": http11.MAX_HEADERS,
            "logger": QuietBadRequests(logging.getLogger("aiohttp.server")),
        }


class QuietBadRequests(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, except that a request its parser refuses (the client's
    fault, answered 400) is one debug line instead of an ERROR with a traceback: any client
    could otherwise fill the log. Other errors are logged as before."""

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            message = str(exc.message).splitlines()[0] if exc.message else type(exc).__name__
            self.debug("%s: %s %s", str(msg) % args, exc.code, message[:200])
            return
        super().exception(msg, *args, **kwargs)


TIMED_OUT = "the request did not arrive in time"


def timed_out() -> ApiError:
    return ApiError(408, TIMED_OUT)


def body_deadline(timeout_s: float) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware that reads a POST or PUT body within ``timeout_s`` before the handler
    runs (the handler then reads it from memory); a body that trickles gets 408 and the
    connection is closed."""

    @web.middleware
    async def bounded_body(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method in ("POST", "PUT") and request.match_info.http_exception is None:
            try:
                await asyncio.wait_for(request.read(), timeout_s)
            except TimeoutError:
                response = handlers.error_response(timed_out())
                response.force_close()
                return response
        return await handler(request)

    return bounded_body


def expect_within_limit(max_body_bytes: int) -> Callable[[web.Request], Awaitable[Any]]:
    """aiohttp's ``expect_handler``: ``100 Continue`` only for a body within the limit; a
    larger declared body gets 413 at once (and the connection is closed), so the client
    never sends it."""

    async def expect(request: web.Request) -> web.StreamResponse | None:
        length = request.content_length
        if length is not None and length > max_body_bytes:
            response = handlers.error_response(too_large(max_body_bytes))
            response.force_close()
            return response
        if request.version != HttpVersion11:
            return None
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            return handlers.error_response(ApiError(417, f"unsupported Expect: {expect[:60]}"))
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer proper has not started (as aiohttp does)
        return None

    return expect


def too_large(max_body_bytes: int) -> ApiError:
    return ApiError(413, f"request body is too large: the limit is {max_body_bytes} bytes")


def shutting_down() -> ApiError:
    """The error of a request still in flight when the drain timeout passes (the same
    message as ``handlers.check_open``'s refusal of new requests while draining)."""
    return ApiError(503, "the router is shutting down", headers={"Retry-After": "1"})


class InFlight:
    """The aiohttp path's requests in flight, so that a drain that times out ends each with
    a clear error, as the lean front does: 503 when no byte of the answer went out, else a
    last SSE error event and the end of the stream. Requests that arrive while draining get
    their 503 with ``Connection: close``."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.transports: set[asyncio.BaseTransport] = set()
        """The connections of the requests being served (busy, not idle)."""
        self.ending = False

    def end_all(self) -> None:
        """Cancel every handler in flight; each answers :func:`shutting_down`."""
        self.ending = True
        for task in list(self.tasks):
            task.cancel()

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def tracked(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            task = asyncio.current_task()
            assert task is not None
            self.tasks.add(task)
            transport = request.transport
            if transport is not None:
                self.transports.add(transport)
            try:
                response = await handler(request)
            except asyncio.CancelledError:
                if not self.ending:
                    raise
                task.uncancel()
                return await _end_with(request, shutting_down())
            finally:
                self.tasks.discard(task)
                if transport is not None:
                    self.transports.discard(transport)
            if request.app[handlers.ROUTER].draining:
                response.force_close()
            return response

        return tracked


async def _end_with(request: web.Request, exc: ApiError) -> web.StreamResponse:
    """The answer of a request cut short by ``exc``: an error response when nothing of the
    answer went out; else ``exc`` as the stream's last event, and the connection closed."""
    writer = request.writer
    if writer.output_size == 0:
        response = handlers.error_response(exc)
        response.force_close()
        return response
    event = b"data: " + json.dumps(error_body(exc)).encode() + b"\n\n"
    try:
        await writer.write(event)
        await writer.write_eof()
    finally:
        if request.transport is not None:
            request.transport.close()
    raise asyncio.CancelledError
