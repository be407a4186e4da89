"""What a client sees while the router drains (``RouterServer.stop``, on SIGTERM; issue 18
item 13 and "A drain"): new connections are refused at once; a new request on an open
connection gets 503 "the router is shutting down" and the connection closes; requests in
flight finish if they can within the drain timeout, and past it end with a clear error: a
503 when no byte of the answer went out, else an SSE error event and a properly ended
stream. Never a stream cut without a word."""

from __future__ import annotations

import asyncio
import json

import pytest

from fairserve.router.server import RouterServer
from tests.router.helpers import router_config, sim_workers
from tests.router.test_http_strict import exchange, status_of
from tests.worker.helpers import run


def _request(body: dict[str, object], extra: bytes = b"") -> bytes:
    data = json.dumps(body).encode()
    return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%b\r\n%b" % (
        len(data),
        extra,
        data,
    )


async def _read_to_close(reader: asyncio.StreamReader, timeout_s: float = 10.0) -> bytes:
    out = b""
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(65536):
            out += chunk
    return out


@pytest.mark.parametrize("lean_front", [True, False], ids=["lean-front", "aiohttp-only"])
def test_past_the_drain_timeout_requests_in_flight_end_with_a_clear_error(
    lean_front: bool,
) -> None:
    long = {"prompt": "a", "max_tokens": 400}  # about 16 s at speed 1.0

    async def body() -> None:
        async with sim_workers(1, speed=1.0) as workers:
            server = RouterServer(router_config([w.url for w in workers], lean_front=lean_front))
            await server.start()
            host, port = server.url.removeprefix("http://").split(":")
            streamed = await asyncio.open_connection(host, int(port))
            streamed[1].write(_request({**long, "stream": True}))
            whole = await asyncio.open_connection(host, int(port))
            whole[1].write(_request(long))
            idle = await asyncio.open_connection(host, int(port))
            await asyncio.sleep(0.5)
            stopping = asyncio.create_task(server.stop(drain_timeout_s=1.0))
            await asyncio.sleep(0.2)
            with pytest.raises(ConnectionRefusedError):  # new connections: refused at once
                await asyncio.open_connection(host, int(port))
            idle[1].write(_request({"prompt": "a", "max_tokens": 1}))  # open connection
            raw = await _read_to_close(idle[0])
            assert status_of(raw) == 503 and b"the router is shutting down" in raw, raw[:300]
            assert not await stopping  # not all finished in time
            raw = await _read_to_close(whole[0])
            assert status_of(raw) == 503 and b"the router is shutting down" in raw, raw[:300]
            raw = await _read_to_close(streamed[0])
            assert status_of(raw) == 200, raw[:300]
            assert b"the router is shutting down" in raw[-400:], raw[-400:]  # the last event
            assert b"[DONE]" not in raw
            if b"chunked" in raw.partition(b"\r\n\r\n")[0].lower():
                assert raw.endswith(b"0\r\n\r\n")  # a properly ended stream
            for _, writer in (streamed, whole, idle):
                writer.close()

    run(body())


def test_a_request_that_fits_in_the_drain_timeout_completes() -> None:
    async def body() -> None:
        async with sim_workers(1, speed=1.0) as workers:  # 10 tokens take about 0.4 s
            server = RouterServer(router_config([w.url for w in workers]))
            await server.start()
            sending = asyncio.create_task(
                exchange(server.url, _request({"prompt": "a", "max_tokens": 10}))
            )
            await asyncio.sleep(0.1)
            assert await server.stop(drain_timeout_s=5.0)
            assert status_of(await sending) == 200

    run(body())
