"""A lean HTTP/1.1 keep-alive client for the router's hot path: requests to the workers.

Why not aiohttp's client, which the router uses for everything else (health checks,
discovery, aborts, eviction feeds): per proxied request it built a request object, a
response object, a stream reader, a timer for the total timeout and a header multidict,
about a quarter of the router's CPU with fast upstreams. The proxy needs much less: POST a
bytes body, read a status and three headers, then the body at once (non-streamed) or piece
by piece as it arrives (SSE), framed by ``Content-Length``, ``chunked`` or the end of the
connection. This module does exactly that, with

* one :class:`Pool` per worker of idle keep-alive connections (LIFO: the warmest first);
* the request head and body in one write (one system call);
* a non-streamed answer that arrives in one read resolving one future: the proxy awaits
  once per request;
* no timer per request: a connect timeout only when a connection is opened, and one
  sweeper per pool that fails requests past their deadline;
* a reused connection that the worker closed while idle (keep-alive timeout: uvicorn's is
  5 s) retried once on a fresh connection, so a worker is never ejected for it;
* reading paused while more than ``framing.READ_HIGH_WATER`` bytes wait for a slow client.

A response that is abandoned before its end closes its connection, which is how an
upstream learns that nobody reads any more.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

from fairserve.router.framing import Response, UpstreamError, parse_head

MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE = 1024
"""Idle connections kept per worker (more are closed when they come back)."""


class _Stale(Exception):
    """A reused connection ended before any byte of the answer (idle close by the worker)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()  # once: each call costs a getpid system call
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        """It carried a whole exchange before (so the worker may have closed it while idle)."""
        self.deadline_s = math.inf
        self.progress_deadline_s = math.inf
        """When the next byte of the answer's body must have arrived (streams only)."""
        self.body_seen = False
        self._head = b""
        self._head_waiter: asyncio.Future[Response] | None = None
        self._resp: Response | None = None

    # ------------------------------------------------------------------ use
    def send(
        self, data: bytes, deadline_s: float, first_byte_deadline_s: float = math.inf
    ) -> asyncio.Future[Response]:
        """Write one request; the future resolves with the answer's head."""
        assert self.transport is not None
        waiter = self._head_waiter = self.loop.create_future()
        self.deadline_s = deadline_s
        self.progress_deadline_s = first_byte_deadline_s
        self.body_seen = False
        self.transport.write(data)
        return waiter

    @property
    def answered(self) -> bool:
        """The answer's head arrived (the worker is working on it, not hung before it)."""
        return self._resp is not None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self.pool.forget(self)

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def fail(self, error: UpstreamError) -> None:
        """End the request in flight with ``error`` and close the connection."""
        self._end(error, stale=False)
        self.close()

    # ------------------------------------------------------------------ protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        resp = self._resp
        if resp is None:
            if self._head_waiter is None:  # bytes nobody asked for: the stream is out of sync
                self.close()
                return
            data = self._parse_head(data)
            resp = self._resp
            if resp is None:
                return
        if data and self.progress_deadline_s != math.inf:
            self.body_seen = True
            self.progress_deadline_s = self.pool.clock() + self.pool.stall_timeout_s
        rest = resp.feed(data) if data else b""
        if resp.done:
            self._finished(resp, rest)
        else:
            if resp.needs_pause() and self.transport is not None:
                self.transport.pause_reading()
            resp.wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost ends what is pending

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self._resp
        if resp is not None and exc is None and resp.ends_with_connection():
            resp.finish()
            self._resp = None
        reason = f"connection lost: {exc}" if exc else "the worker closed the connection"
        stale = self.reused and not self._head
        self._end(UpstreamError(reason, unreachable=True), stale)
        self.pool.forget(self)

    # ------------------------------------------------------------------ internals
    def _parse_head(self, data: bytes) -> bytes:
        buf = self._head + data if self._head else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self.fail(UpstreamError("the worker's answer head is too large"))
            else:
                self._head = buf
            return b""
        self._head = b""
        try:
            resp = parse_head(buf[:end])
        except ValueError as exc:
            self.fail(UpstreamError(f"malformed answer from the worker: {exc}"))
            return b""
        if 100 <= resp.status < 200:  # an interim answer (103 Early Hints...): the real one follows
            return self._parse_head(buf[end + 4 :]) if len(buf) > end + 4 else b""
        resp.attach(self)
        self._resp = resp
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(resp)
        return buf[end + 4 :]

    def _finished(self, resp: Response, rest: bytes) -> None:
        self._resp = None
        resp.finish()
        self.deadline_s = math.inf
        self.progress_deadline_s = math.inf
        self.reused = True
        if resp.keep_alive and not rest and not self.closed:
            self.pool.give_back(self)
        else:
            self.close()

    def _end(self, error: UpstreamError, stale: bool) -> None:
        """Fail what waits on this connection; ``stale``: nothing of an answer arrived on a
        reused connection, so the request may go again on a fresh one."""
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(_Stale(str(error)) if stale else error)
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.fail(error)


class Pool:
    """Keep-alive connections to one worker, ``http://HOST:PORT`` (or https)."""

    def __init__(
        self,
        url: str,
        connect_timeout_s: float,
        request_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        stall_timeout_s: float = math.inf,
    ) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.host_header = parts.netloc.encode("idna")
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.opened = 0
        """Connections opened so far (tests check reuse with it)."""
        self.clock = clock
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    def head(self, path: str) -> bytes:
        """The constant start of a POST to ``path`` (callers cache it)."""
        return (
            f"POST {path} HTTP/1.1\r\nHost: ".encode()
            + self.host_header
            + b"\r\nContent-Type: application/json\r\n"
        )

    async def post(
        self,
        head: bytes,
        headers: bytes,
        body: bytes,
        first_byte_timeout_s: float = math.inf,
    ) -> Response:
        """Send ``head`` (from :meth:`head`), extra header lines and ``body``; the answer
        once its head arrived. Raises :class:`UpstreamError`.

        ``first_byte_timeout_s`` (streams): the first byte of the answer's body must come
        within it, and from then on a byte every ``stall_timeout_s``; otherwise the request
        fails as stalled (the caller ejects the worker and, if nothing reached the client
        yet, retries elsewhere)."""
        data = b"%b%bContent-Length: %d\r\n\r\n%b" % (head, headers, len(body), body)
        while True:
            conn = self._take()
            if conn is None:
                conn = await self._connect()
            self._busy.add(conn)
            if self._sweeper is None:
                self._arm_sweeper()
            now = self.clock()
            waiter = conn.send(data, now + self.request_timeout_s, now + first_byte_timeout_s)
            try:
                return await waiter
            except _Stale:
                continue  # the worker had closed this idle connection: a fresh one
            except BaseException:
                conn.close()  # cancelled or failed before the head: the connection is unusable
                raise

    def _take(self) -> _Connection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self) -> _Connection:
        if self._closed:
            raise UpstreamError("the router is shutting down")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                transport, conn = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self.ssl
                )
        except TimeoutError:
            raise UpstreamError("connect timed out", unreachable=True) from None
        except OSError as exc:
            raise UpstreamError(_describe(exc), unreachable=True) from None
        conn.transport = transport  # uvloop may call connection_made only after this
        self.opened += 1
        return conn

    def give_back(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        if self._closed or len(self._idle) >= MAX_IDLE:
            conn.close()
        else:
            self._idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._busy.discard(conn)

    def fail_unanswered(self, reason: str) -> int:
        """Fail the requests whose answer has not begun (the worker was ejected: they are
        retried elsewhere rather than wait for it); returns how many."""
        waiting = [c for c in self._busy if not c.answered]
        for conn in waiting:
            conn.fail(UpstreamError(reason, unreachable=True))
        return len(waiting)

    def close(self) -> None:
        """Close every connection (router shutdown)."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in [*self._idle, *self._busy]:
            conn.fail(UpstreamError("the router is shutting down"))
        self._idle.clear()

    # ------------------------------------------------------------------ deadlines
    def _arm_sweeper(self) -> None:
        if self._sweeper is None and not self._closed:
            period_s = min(1.0, self.request_timeout_s / 4, self.stall_timeout_s / 4)
            self._sweeper = asyncio.get_running_loop().call_later(period_s, self._sweep)

    def _sweep(self) -> None:
        """Fail the requests past their deadline; re-arms itself while any is in flight."""
        self._sweeper = None
        now = self.clock()
        for conn in [c for c in self._busy if c.deadline_s <= now]:
            conn.fail(UpstreamError("timed out", unreachable=True))
        for conn in [c for c in self._busy if c.progress_deadline_s <= now]:
            if conn.body_seen:
                reason = f"stalled: no byte of the stream for {self.stall_timeout_s:g}s"
            else:
                reason = "stalled: no first byte within the first-byte timeout"
            conn.fail(UpstreamError(reason, unreachable=True))
        if self._busy:
            self._arm_sweeper()


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def header_value(value: str) -> bytes | None:
    """``value`` as a header value, or None when it cannot be one (control characters,
    not Latin-1): the worker still gets the client in the body's ``routing_key``."""
    if not value.isprintable():
        return None
    try:  # no context manager: this runs for every request
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return None
