"""Test helpers: routers in-process on ephemeral ports, in front of simulated workers."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from fairserve.router.config import RouterConfig
from fairserve.router.server import RouterServer
from fairserve.worker.runtime import WorkerRuntime
from fairserve.worker.server import WorkerServer
from tests.worker.helpers import make_config

FAST = {"health_interval_s": 0.1, "eviction_interval_s": 0.1, "sample_interval_s": 0.1}


def router_config(urls: list[str], **overrides: Any) -> RouterConfig:
    values: dict[str, Any] = {"worker_urls": tuple(urls), "port": 0, **FAST}
    values.update(overrides)
    return RouterConfig(**values)


@asynccontextmanager
async def sim_workers(count: int = 2, **config: Any) -> AsyncIterator[list[WorkerServer]]:
    async with AsyncExitStack() as stack:
        servers = []
        for _ in range(count):
            server = WorkerServer(make_config(**{"speed": 200.0, **config}), "127.0.0.1", 0)
            await server.start()
            stack.push_async_callback(server.stop)
            servers.append(server)
        yield servers


@asynccontextmanager
async def routed(
    urls: list[str], **overrides: Any
) -> AsyncIterator[tuple[RouterServer, aiohttp.ClientSession]]:
    """A router in front of ``urls`` and a client session whose base URL is the router."""
    server = RouterServer(router_config(urls, **overrides))
    url = await server.start()
    try:
        async with aiohttp.ClientSession(
            base_url=url, timeout=aiohttp.ClientTimeout(total=15)
        ) as session:
            yield server, session
    finally:
        await server.stop(drain_timeout_s=2.0)


@asynccontextmanager
async def sim_router(
    count: int = 2, worker: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[tuple[RouterServer, aiohttp.ClientSession, list[WorkerServer]]]:
    async with (
        sim_workers(count, **(worker or {})) as workers,
        routed([w.url for w in workers], **overrides) as (server, session),
    ):
        yield server, session, workers


async def bind_runner(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"


def chat(content: str = "hello world", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


async def post(
    session: aiohttp.ClientSession, path: str, body: Any = None, **kw: Any
) -> tuple[int, Any, dict[str, str]]:
    """Status, parsed JSON (or text) and headers of a POST."""
    async with session.post(path, json=body, **kw) as resp:
        text = await resp.text()
        try:
            payload: Any = json.loads(text)
        except ValueError:
            payload = text
        return resp.status, payload, dict(resp.headers)


async def get_json(session: aiohttp.ClientSession, path: str, **kw: Any) -> tuple[int, Any]:
    async with session.get(path, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def poll(
    condition: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def leave_while_running(session: aiohttp.ClientSession, runtime: WorkerRuntime) -> None:
    """Send a long non-streamed request, leave (close the connection) once the worker runs
    it, and wait until the worker has aborted it: only the router's ``/abort_request`` can
    end it, since a non-streamed answer writes nothing before its end."""
    waiting = asyncio.create_task(session.post("/v1/chat/completions", json=chat(max_tokens=2000)))

    async def running() -> bool:
        return bool(runtime.state()["running"] >= 1)

    await poll(running, what="the worker to start the request")
    waiting.cancel()  # closes the client's connection

    async def aborted() -> bool:
        engine = runtime.state()["engine"]
        return bool(engine["aborted"] >= 1 and runtime.state()["running"] == 0)

    await poll(aborted, what="the worker to abort the request")
