"""Where the proxy writes an answer: aiohttp's response objects, or the lean front.

:func:`fairserve.router.proxy.serve` writes through a :class:`Responder`, so one proxy
serves both HTTP servers of the router: aiohttp (every route, and any request the front
hands over) and :mod:`fairserve.router.front` (the generation routes' common case).
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class Responder(Protocol):
    """One client's answer: whole (JSON) or streamed (SSE)."""

    def answer(self, status: int, body: bytes) -> None:
        """A whole JSON answer (sent when the handler returns)."""

    async def open_stream(self) -> None:
        """Start an SSE answer (status 200 and its headers)."""

    async def write(self, data: bytes) -> None:
        """Stream bytes (waits while the client reads slowly)."""

    async def write_eof(self) -> None:
        """End the stream."""


class AiohttpResponder:
    """A :class:`Responder` on aiohttp: ``response`` is what the handler returns."""

    __slots__ = ("request", "response")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    def answer(self, status: int, body: bytes) -> None:
        self.response = web.Response(body=body, status=status, content_type="application/json")

    async def open_stream(self) -> None:
        out = web.StreamResponse(headers=SSE_HEADERS)
        await out.prepare(self.request)
        self.response = out

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)

    async def write_eof(self) -> None:
        assert self.response is not None
        await self.response.write_eof()
