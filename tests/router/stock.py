"""A tiny "stock" OpenAI-compatible upstream: no fairserve extension, FCFS slots.

It stands for SGLang without the plugin, vLLM or any OpenAI-compatible engine: a fixed
number of requests run at once (``slots``), each for ``service_s`` wall seconds, the rest
wait in arrival order. It answers ``/health`` and ``/v1/models`` and nothing of the
fairserve extension (404), so the router puts its own fair queue in front of it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tests.router.helpers import bind_runner


class LoopbackUpstream:
    """An aiohttp upstream on loopback answering ``/health`` and ``/v1/models``; the
    test upstreams add their generation routes (:meth:`routes`)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.url = ""
        self._runner: web.AppRunner | None = None

    def routes(self) -> list[web.RouteDef]:
        return []

    async def start(self) -> str:
        app = web.Application()
        health = [web.get("/health", self.health), web.get("/v1/models", self.models)]
        app.add_routes([*self.routes(), *health])
        self._runner, self.url = await bind_runner(app)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model}]})


class StockUpstream(LoopbackUpstream):
    def __init__(self, slots: int = 2, service_s: float = 0.0, model: str = "stock") -> None:
        super().__init__(model)
        self.slots = asyncio.Semaphore(slots)
        self.service_s = service_s
        self.seen: list[dict[str, Any]] = []
        self.clients: list[str | None] = []

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self.completion),
            web.post("/v1/chat/completions", self.completion),
        ]

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(body)
        self.clients.append(request.headers.get("X-Fairserve-Client"))
        async with self.slots:
            if self.service_s:
                await asyncio.sleep(self.service_s)
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            return web.json_response(answer(chat))  # no usage: the router fills it in
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("hello", " there"):
            await resp.write(b"data: " + json.dumps(chunk(chat, word)).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


def answer(chat: bool) -> dict[str, Any]:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": "hello there"}}
    else:
        choice = {"index": 0, "text": "hello there"}
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{**choice, "finish_reason": "stop"}],
    }


def chunk(chat: bool, word: str) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
    return {"id": "x", "object": "chunk", "choices": [choice]}
