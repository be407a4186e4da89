"""A real HTTP upstream on loopback that fails the way broken workers do, switchable live.

Modes: ``ok`` (answers like a stock engine), ``hang`` (accepts and reads, never answers,
``/health`` included: a SIGSTOPped or wedged worker), ``stall`` (a stream starts, then no
byte ever again; ``/health`` fine), ``html`` (200 with an HTML error page), ``garbage`` (200
``application/json`` that is not JSON), ``error`` (500 on generation, ``/health`` fine).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from aiohttp import web

from tests.router.stock import LoopbackUpstream, answer, chunk

Mode = Literal["ok", "hang", "stall", "html", "garbage", "error"]
FOREVER_S = 3600.0


class FaultyUpstream(LoopbackUpstream):
    def __init__(self, mode: Mode = "ok") -> None:
        super().__init__("default")
        self.mode: Mode = mode
        self.generations = 0
        """Generation requests that reached it."""

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/chat/completions", self.chat)]

    async def health(self, request: web.Request) -> web.Response:
        if self.mode == "hang":
            await asyncio.sleep(FOREVER_S)
        return await super().health(request)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        self.generations += 1
        mode = self.mode
        if mode == "hang":
            await asyncio.sleep(FOREVER_S)
        if mode == "html":
            html = "<html><body><h1>502 Bad Gateway</h1></body></html>"
            return web.Response(text=html, content_type="text/html")
        if mode == "garbage":
            return web.Response(body=b'{"choices": [oops', content_type="application/json")
        if mode == "error":
            return web.json_response({"error": "boom"}, status=500)
        if not body.get("stream"):
            return web.json_response(answer(chat=True))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + json.dumps(chunk(True, "hello")).encode() + b"\n\n")
        if mode == "stall":
            await asyncio.sleep(FOREVER_S)
        await resp.write(b"data: " + json.dumps(chunk(True, " there")).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp
