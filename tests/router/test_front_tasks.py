"""The lean front serves a connection's requests with one task (``FrontConnection._run``),
not one per request, and that task ends with the connection however it ends: closed by the
client, handed to aiohttp, or not kept alive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, cast

from fairserve.router.server import RouterServer
from tests.router.helpers import router_config, sim_workers
from tests.worker.helpers import run


def _post(body: dict[str, Any], extra: str = "") -> bytes:
    payload = json.dumps(body).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%b\r\n%b" % (len(payload), extra.encode(), payload)
    )


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One Content-Length answer: its status and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    lines = head.decode().split("\r\n")
    length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


class _FrontTasks:
    """A task factory that notes the tasks created for the front's connections."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        if getattr(coro, "__qualname__", "").startswith("FrontConnection."):
            self.tasks.append(task)
        return task


def _serve_and_count(requests: list[bytes], pause_s: float) -> tuple[list[int], _FrontTasks]:
    """Send ``requests`` one at a time on one connection (``pause_s`` idle between them);
    the statuses and the front's tasks, once the connection has closed."""
    counted = _FrontTasks()

    async def body() -> list[int]:
        asyncio.get_running_loop().set_task_factory(cast(Any, counted))
        async with sim_workers(1) as workers:
            server = RouterServer(router_config([w.url for w in workers]))
            await server.start()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                statuses = []
                for request in requests:
                    writer.write(request)
                    statuses.append((await _answer(reader))[0])
                    await asyncio.sleep(pause_s)
                writer.close()
                await asyncio.sleep(0.05)  # the router sees the connection end
                return statuses
            finally:
                await server.stop(drain_timeout_s=1.0)

    return run(body()), counted


def test_keep_alive_requests_share_one_task_that_ends_with_the_connection() -> None:
    request = _post({"prompt": "a", "max_tokens": 2})
    statuses, counted = _serve_and_count([request] * 4, pause_s=0.02)
    assert statuses == [200] * 4
    assert len(counted.tasks) == 1
    assert counted.tasks[0].done()


def test_a_connection_handed_to_aiohttp_after_idling_ends_its_task() -> None:
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    statuses, counted = _serve_and_count([_post({"prompt": "a", "max_tokens": 2}), health], 0.02)
    assert statuses == [200, 200]
    assert len(counted.tasks) == 1
    assert counted.tasks[0].done()


def test_a_connection_not_kept_alive_ends_its_task() -> None:
    close = _post({"prompt": "a", "max_tokens": 2}, extra="Connection: close\r\n")
    statuses, counted = _serve_and_count([close], pause_s=0.0)
    assert statuses == [200]
    assert len(counted.tasks) == 1 and counted.tasks[0].done()
