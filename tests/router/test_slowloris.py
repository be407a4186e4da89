"""Slowloris at the router's front door (issue 18 item 13 and "Must show"): 500 connections
that send nothing, half a head or half a body do not stop the router serving others, and
are closed after the idle timeout, on the lean front and on the aiohttp-only path alike;
the front's connection cap makes room by closing the longest-idle connection and refuses
(503) only when every connection is busy."""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

import pytest

from fairserve.router.guard import ConnectionLimits
from fairserve.router.server import RouterServer
from tests.router.helpers import router_config, sim_workers
from tests.router.test_http_strict import BODY, GOOD, exchange, status_of
from tests.worker.helpers import run

IDLE_S = 1.0
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"
PARTIAL_BODY = GOOD[: -len(BODY) // 2]
STALLED_CHUNKED = (
    b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"pr'
)


async def _open(url: str, first: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    if first:
        writer.write(first)
    return reader, writer


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """What the server sent before closing (raises TimeoutError if it did not close)."""
    out = b""
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(65536):
            out += chunk
    return out


async def _closed_after(reader: asyncio.StreamReader, timeout_s: float) -> tuple[bytes, float]:
    """What the server sent before closing, and when it closed (monotonic seconds)."""
    out = await _closed_within(reader, timeout_s)
    return out, time.monotonic()


async def _start(workers: list[Any], lean_front: bool, **limits: Any) -> RouterServer:
    server = RouterServer(
        router_config([w.url for w in workers], lean_front=lean_front),
        ConnectionLimits(**{"idle_timeout_s": IDLE_S, **limits}),
    )
    await server.start()
    return server


@pytest.mark.parametrize("lean_front", [True, False], ids=["lean-front", "aiohttp-only"])
def test_500_idle_connections_neither_block_others_nor_stay_open(lean_front: bool) -> None:
    count = 500
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * count + 200:
        pytest.skip(f"needs {2 * count + 200} file descriptors, the limit is {soft}")
    kinds = [b"", PARTIAL_HEAD, PARTIAL_BODY, STALLED_CHUNKED]

    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _start(workers, lean_front)
            try:
                opened_s = time.monotonic()
                idle = [await _open(server.url, kinds[i % len(kinds)]) for i in range(count)]
                closing = [
                    asyncio.create_task(_closed_after(reader, IDLE_S + 6.0)) for reader, _ in idle
                ]
                for _ in range(5):  # others are served meanwhile, promptly
                    started_s = time.monotonic()
                    assert status_of(await exchange(server.url, GOOD)) == 200
                    assert time.monotonic() - started_s < 0.5
                ends = await asyncio.gather(*closing)
                first_close_s = min(closed_s for _, closed_s in ends)
                assert first_close_s - opened_s >= IDLE_S * 0.9  # none before the timeout
                answers = [answer for answer, _ in ends]
                for (_, writer), kind, answer in zip(idle, kinds * count, answers, strict=False):
                    writer.close()
                    if kind in (PARTIAL_BODY, STALLED_CHUNKED):  # the head arrived: 408
                        assert status_of(answer) == 408, (kind, answer[:200])
                    else:  # nothing of a request arrived: closed without an answer
                        assert answer == b"", (kind, answer[:200])
                assert status_of(await exchange(server.url, GOOD)) == 200
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


def test_the_cap_closes_the_longest_idle_connection_to_admit_a_new_one() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _start(workers, True, idle_timeout_s=60.0, max_connections=10)
            assert server.front is not None
            try:
                idle = [await _open(server.url, b"") for _ in range(10)]
                await asyncio.sleep(0.1)
                for _ in range(3):
                    assert status_of(await exchange(server.url, GOOD)) == 200
                assert await _closed_within(idle[0][0], 2.0) == b""  # the oldest made room
                assert len(server.front.connections) <= 10
                for _, writer in idle:
                    writer.close()
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


def test_the_cap_also_reclaims_trickling_connections_handed_to_aiohttp() -> None:
    """Half-sent heads go to aiohttp at once; they still count, and still make room."""

    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _start(workers, True, idle_timeout_s=60.0, max_connections=10)
            try:
                trickling = [await _open(server.url, PARTIAL_HEAD) for _ in range(10)]
                await asyncio.sleep(0.2)
                for _ in range(3):
                    assert status_of(await exchange(server.url, GOOD)) == 200
                assert await _closed_within(trickling[0][0], 2.0) == b""  # the oldest
                for _, writer in trickling:
                    writer.close()
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503() -> None:
    stream = b'{"prompt": "a", "max_tokens": 40, "stream": true}'  # about 1.6 s at speed 1.0
    busy = GOOD.replace(b"Length: %d" % len(BODY), b"Length: %d" % len(stream)).replace(
        BODY, stream
    )

    async def body() -> None:
        async with sim_workers(1, speed=1.0) as workers:
            server = await _start(workers, True, idle_timeout_s=60.0, max_connections=2)
            try:
                streams = [await _open(server.url, busy) for _ in range(2)]
                await asyncio.sleep(0.3)
                raw = await exchange(server.url, GOOD)
                assert status_of(raw) == 503, raw[:200]
                assert b"too many open connections" in raw
                for reader, writer in streams:  # the busy ones finish
                    async with asyncio.timeout(10.0):
                        await reader.readuntil(b"data: [DONE]")
                    writer.close()
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())
