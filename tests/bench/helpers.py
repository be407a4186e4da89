"""Bench test helpers: small workloads, a real worker, and a scripted upstream.

The worker is the real simulated worker (``tests/worker/helpers``) at high speed; the
scripted upstream is a tiny aiohttp server whose answer depends on the client header, so
errors, hangs and identities can be checked where the bench cannot see them itself.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from fairserve.worker.server import WorkerServer
from fairserve.workloads import SyntheticWorkload, loads_workload
from tests.worker.helpers import make_config


def workload(clients: str, duration_s: float = 1.0, seed: int = 5) -> SyntheticWorkload:
    text = f'name = "bench-test"\nduration_s = {duration_s}\nseed = {seed}\n{clients}'
    return loads_workload(text, "bench-test.toml")


def single(name: str, rate_per_s: float, prefix: int = 0, inputs: int = 20, out: int = 8) -> str:
    return (
        f'[[clients]]\nname = "{name}"\narrival = "uniform"\nrate_per_s = {rate_per_s}\n'
        f"shared_prefix_tokens = {prefix}\ninput_tokens = {inputs}\noutput_tokens = {out}\n"
    )


def multi_turn(name: str, rate_per_s: float, turns: int = 3) -> str:
    return (
        f'[[clients]]\nname = "{name}"\nprogram = "multi-turn"\narrival = "uniform"\n'
        f"rate_per_s = {rate_per_s}\nturns = {turns}\nshared_prefix_tokens = 30\n"
        "input_tokens = 12\noutput_tokens = 6\n"
    )


@asynccontextmanager
async def worker(**config: Any) -> AsyncIterator[tuple[WorkerServer, str]]:
    """A simulated worker on an ephemeral port (50× faster than real time)."""
    server = WorkerServer(make_config(**config), "127.0.0.1", 0)
    url = await server.start()
    try:
        yield server, url
    finally:
        await server.stop()


@contextmanager
def worker_thread() -> Iterator[str]:
    """A worker served from its own thread and event loop, for code that runs
    ``asyncio.run`` itself (the CLI); yields its URL."""
    ready: list[str] = []
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        async with worker() as (_, url):
            ready.append(url)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10), "worker thread did not start"
    try:
        yield ready[0]
    finally:
        stop.set()
        thread.join(10)


# ---------------------------------------------------------------------- scripted upstream
FAILING = {"bob": 429, "carol": 500}
"""Clients the scripted upstream refuses, with the status it answers them."""
HANGING = "slow"


@dataclass
class Upstream:
    """What the scripted upstream saw: the headers of every generation request."""

    url: str = ""
    headers: list[dict[str, str]] = field(default_factory=list)


UPSTREAM = web.AppKey("upstream", Upstream)


async def _completions(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM]
    upstream.headers.append(dict(request.headers))
    client = request.headers.get("X-Fairserve-Client", "")
    if client in FAILING:
        status = FAILING[client]
        body = {"error": {"message": f"scripted {status} for {client}", "code": status}}
        return web.json_response(body, status=status)
    if client == HANGING:
        await asyncio.sleep(3600)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for word in (" a", " b", " c"):
        await response.write(_sse({"choices": [{"index": 0, "text": word}]}))
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": None}
    await response.write(_sse({"choices": [], "usage": usage}))
    await response.write(b"data: [DONE]\n\n")
    return response


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


@asynccontextmanager
async def scripted_upstream() -> AsyncIterator[Upstream]:
    app = web.Application()
    upstream = Upstream()
    app[UPSTREAM] = upstream
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    upstream.url = f"http://127.0.0.1:{port}"
    try:
        yield upstream
    finally:
        await runner.cleanup()
