"""Answers from the workers, as the router's upstream client reads them (``router.pool``).

A :class:`Response` is a status, three headers that matter (``Content-Length``,
``Transfer-Encoding``, ``Connection``) and a body framed by a length, by ``chunked``
encoding or by the end of the connection. Heads and chunked bodies are parsed by the same
strict rules as the lean front's requests (:mod:`fairserve.router.http11`): a malformed
answer is an :class:`UpstreamError`, never a guess and never an exception out of the
connection's ``data_received``. Its connection feeds it bytes as they arrive;
the proxy reads the body whole (:meth:`Response.read`) or piece by piece as it comes
(:meth:`Response.read_some`, for SSE).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from fairserve.router.head_memo import HeadMemo
from fairserve.router.http11 import ChunkedDecoder, HeadError, parse_response_head

READ_HIGH_WATER = 1 << 20
"""Body bytes buffered for the reader before reading from the worker pauses."""

_LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2


class UpstreamError(Exception):
    """A request to a worker failed; ``unreachable``: the worker could not be reached
    (refused, reset before any answer, timed out)."""

    def __init__(self, reason: str, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.unreachable = unreachable


class Carrier(Protocol):
    """The connection an answer arrives on."""

    def close(self) -> None: ...

    def resume(self) -> None: ...


class Response:
    """Status, framing headers and the body of one answer."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_error",
        "_mode",
        "_paused",
        "_pending",
        "_pieces",
        "_remaining",
        "_waiter",
        "content_type",
        "done",
        "keep_alive",
        "status",
    )

    def __init__(self, status: int, content_type: str, keep_alive: bool) -> None:
        self.status = status
        self.content_type = content_type
        self.keep_alive = keep_alive
        self.done = False
        """The whole body arrived (its connection went back to the pool or was closed)."""
        self._conn: Carrier | None = None
        self._mode = _UNTIL_CLOSE
        self._remaining = 0
        self._chunks: ChunkedDecoder | None = None
        self._pieces: list[bytes] = []
        self._pending = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ reading
    async def read(self) -> bytes:
        """The whole body (raises :class:`UpstreamError` when the answer is cut off)."""
        while not self.done and self._error is None:
            if self._paused and self._conn is not None:  # the whole body is wanted
                self._paused = False
                self._conn.resume()
            await self._wait()
        self._raise_if_failed()
        body = b"".join(self._pieces) if len(self._pieces) != 1 else self._pieces[0]
        self._pieces = []
        return body

    async def read_some(self) -> bytes:
        """The body bytes that arrived since the last call (waits for some); b"" at the
        end. Raises :class:`UpstreamError` when the answer is cut off."""
        while not self._pieces:
            self._raise_if_failed()
            if self.done:
                return b""
            await self._wait()
        pieces, self._pieces, self._pending = self._pieces, [], 0
        if self._paused and self._conn is not None:
            self._paused = False
            self._conn.resume()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def close(self) -> None:
        """Abandon the answer: a connection still carrying it is closed (the worker sees
        the client leave). A finished answer has already given its connection back."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def wake(self) -> None:
        """Let a waiting reader see what arrived."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ connection side
    def attach(self, conn: Carrier) -> None:
        self._conn = conn

    def finish(self) -> None:
        """The body ended: the connection is no longer this answer's."""
        self._conn = None
        self.wake()

    def needs_pause(self) -> bool:
        """True once when the unread body passes :data:`READ_HIGH_WATER` (the connection
        pauses reading; the reader resumes it)."""
        if self._pending > READ_HIGH_WATER and not self._paused:
            self._paused = True
            return True
        return False

    def ends_with_connection(self) -> bool:
        """At a clean end of the connection: True (and done) for a body framed by it."""
        if self._mode == _UNTIL_CLOSE:
            self.done = True
        return self.done

    # ------------------------------------------------------------------ framing
    def _frame(self, length: int | None, chunked: bool) -> None:
        if chunked:
            self._mode = _CHUNKED
            self._chunks = ChunkedDecoder()
        elif length is not None:
            self._mode, self._remaining = _LENGTH, length
            if length == 0:
                self.done = True
        else:
            self._mode, self.keep_alive = _UNTIL_CLOSE, False

    def feed(self, data: bytes) -> bytes:
        """Take body bytes; returns what is left after the end of the body."""
        if self._mode == _LENGTH:
            if len(data) < self._remaining:
                self._remaining -= len(data)
                self._add(data)
                return b""
            self._add(data[: self._remaining])
            rest = data[self._remaining :]
            self._remaining = 0
            self.done = True
            return rest
        if self._mode == _CHUNKED:
            return self._feed_chunked(data)
        self._add(data)
        return b""

    def _add(self, data: bytes) -> None:
        if data:
            self._pieces.append(data)
            self._pending += len(data)

    def _feed_chunked(self, data: bytes) -> bytes:
        assert self._chunks is not None
        if self._error is not None:
            return b""
        try:
            rest = self._chunks.feed(data, self._add)
        except HeadError as exc:
            conn = self._conn
            self.fail(UpstreamError(f"malformed chunked body from the worker: {exc}"))
            if conn is not None:
                conn.close()  # the stream is out of sync: the connection cannot be reused
            return b""
        if rest is None:
            return b""
        self.done = True
        return rest

    def fail(self, error: UpstreamError) -> None:
        """The connection failed before the end of the body (the first reason stays)."""
        if not self.done and self._error is None:
            self._error = error
        self._conn = None
        self.wake()


Announced = tuple[int, str, bool, int | None, bool]
"""What a head announces: status, content type, keep-alive, body length (None: none
given), chunked."""

HEAD_MEMO_ENTRIES = 64
"""Answer heads remembered (all forgotten when full)."""
HEAD_MEMO_MAX_BYTES = 1024
"""Longer heads are parsed every time."""
announced_by_head: HeadMemo[Announced] = HeadMemo(HEAD_MEMO_ENTRIES, HEAD_MEMO_MAX_BYTES)
"""Recent answer heads -> what they announce. Parsing a head by the strict rules costs
~4 us; a worker sends the same head bytes again and again: every stream within the second
of its ``Date`` header, and non-streamed answers of the same length. A head that breaks
the rules is never remembered (it raises each time)."""


def parse_head(head: bytes) -> Response:
    """The answer a head announces (raises ValueError, a :class:`HeadError`, for a head
    that breaks :mod:`~fairserve.router.http11`'s rules)."""
    announced = announced_by_head.get(head)
    if announced is None:
        announced = announce(head)
        announced_by_head.remember(head, announced)
    status, content_type, keep_alive, length, chunked = announced
    resp = Response(status, content_type, keep_alive)
    resp._frame(length, chunked)
    return resp


def announce(head: bytes) -> Announced:
    """What ``head`` announces, parsed by :mod:`~fairserve.router.http11`'s rules (a body
    of length 0 for the statuses that have none)."""
    parsed = parse_response_head(head)
    status, length, chunked = parsed.status, parsed.content_length, parsed.chunked
    if status in (204, 304) or 100 <= status < 200:
        length, chunked = 0, False
    return status, parsed.content_type, parsed.keep_alive, None if chunked else length, chunked
