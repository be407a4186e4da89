"""A live cluster for the tuner's tests: simulated workers and a router in a background
thread (its own event loop), plus a bounded closed-loop load generator.

``fairserve tune`` is synchronous (``urllib``, ``time.sleep``), as operators run it; the
servers therefore live in another thread so the command can block while they serve.

The load: closed request loops per client (``load``: client → concurrency) of equal,
uncached prompts, so DLPM's charges equal the service the router counts. With a heavy
client (many loops) and a light one (few, but always some waiting), DLPM serves a quantum's
worth of the heavy client's requests per turn and at most the light client's few: a small
quantum keeps their service equal (Jain's index near 1), a large one lets the heavy client
take Q/cost requests for every handful of the light one's.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fairserve.sim.profile import profile_from_toml
from fairserve.worker.server import WorkerServer
from tests.e2e.helpers import PROFILE_TOML
from tests.router.helpers import routed
from tests.worker.helpers import make_config

TOKEN = "tuning-secret"
HEAVY_LIGHT = {"heavy": 192, "light": 24}
PROMPT_TOKENS = 256
OUTPUT_TOKENS = 8


@dataclass
class Live:
    """What a test gets: the router's URL, its admin token and the worker URLs."""

    url: str
    token: str
    worker_urls: list[str]
    requests: dict[str, int] = field(default_factory=dict)
    """Finished requests per client of the load generator."""


def _prompt(client: str, n: int) -> list[int]:
    """Distinct token ids per request (nothing cached), deterministic."""
    base = (sum(map(ord, client)) * 7919 + n * 104729) % 20000
    return [2000 + (base + i * 37) % 30000 for i in range(PROMPT_TOKENS)]


async def _client_loop(
    session: aiohttp.ClientSession, client: str, counter: Iterator[int], live: Live
) -> None:
    headers = {"X-Fairserve-Client": client}
    while True:
        n = next(counter)
        body = {
            "input_ids": _prompt(client, n),
            "sampling_params": {"max_new_tokens": OUTPUT_TOKENS},
        }
        try:
            async with session.post("/generate", json=body, headers=headers) as resp:
                await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            await asyncio.sleep(0.01)
            continue
        live.requests[client] = live.requests.get(client, 0) + 1


async def _serve(
    ready: asyncio.Future[Live],
    stop: asyncio.Event,
    workers: int,
    speed: float,
    load: dict[str, int],
    worker_overrides: dict[str, Any],
) -> None:
    async with AsyncExitStack() as stack:
        # The end-to-end tests' slow GPU: at ``speed`` 20 a worker does ~9k tokens per wall
        # second, so the workers (not this process's event loop) are the bottleneck and
        # requests queue inside them, where the quantum decides.
        profile = profile_from_toml(PROFILE_TOML, name="e2e-slow")
        servers = []
        for _ in range(workers):
            config = make_config(
                profile=profile, speed=speed, admin_token=TOKEN, **worker_overrides
            )
            server = WorkerServer(config, "127.0.0.1", 0)
            await server.start()
            stack.push_async_callback(server.stop)
            servers.append(server)
        urls = [s.url for s in servers]
        router, _ = await stack.enter_async_context(routed(urls, admin_token=TOKEN))
        # No connection limit: aiohttp's default (100) would let one client's loops hold
        # every connection and starve the other's before the router ever saw them.
        session = await stack.enter_async_context(
            aiohttp.ClientSession(
                base_url=router.url,
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        )
        live = Live(router.url, TOKEN, urls)
        tasks = []
        for client, concurrency in load.items():
            counter = itertools.count()
            for _ in range(concurrency):
                tasks.append(asyncio.create_task(_client_loop(session, client, counter, live)))
        ready.set_result(live)
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextmanager
def live_cluster(
    workers: int = 2,
    speed: float = 20.0,
    load: dict[str, int] | None = None,
    **worker_overrides: Any,
) -> Iterator[Live]:
    """Servers (and ``load``: client → concurrent request loops) until the block ends."""
    loop = asyncio.new_event_loop()
    ready: asyncio.Future[Live] = loop.create_future()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(
                _serve(ready, stop, workers, speed, load or {}, worker_overrides)
            )
        except BaseException as exc:  # surfaced to the test below
            failure.append(exc)
            if not ready.done():
                loop.call_soon_threadsafe(ready.set_exception, exc)
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="live-cluster", daemon=True)
    thread.start()
    live = asyncio.run_coroutine_threadsafe(_wait(ready), loop).result(20)
    try:
        yield live
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(20)
        assert not thread.is_alive(), "live cluster did not stop"
        if failure:
            raise failure[0]


async def _wait(ready: asyncio.Future[Live]) -> Live:
    return await ready
