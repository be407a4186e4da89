"""The router's upstream HTTP/1.1 client (``router.pool``) against scripted servers: framing,
keep-alive reuse, stale connections, failures, deadlines and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from fairserve.router.framing import Response, UpstreamError
from fairserve.router.pool import Pool, header_value
from tests.worker.helpers import run
from tests.worker.processes import free_port

Script = Callable[["_Recorder", asyncio.StreamWriter], Awaitable[None]]
BODY = b'{"prompt": "hi"}'


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[tuple[Pool, list[bytes]]]:
    """A server running ``script`` per connection; a pool to it; the request heads seen."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await script(_Recorder(reader, heads), writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool(f"http://127.0.0.1:{port}", connect_timeout_s=2.0, request_timeout_s=5.0)
    try:
        yield pool, heads
    finally:
        pool.close()
        server.close()


class _Recorder:
    """A StreamReader that records every request head it reads."""

    def __init__(self, reader: asyncio.StreamReader, heads: list[bytes]) -> None:
        self.reader, self.heads = reader, heads

    async def request(self) -> bytes:
        head = await self.reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        return await self.reader.readexactly(length)


async def _post(pool: Pool, body: bytes = BODY) -> Response:
    return await pool.post(pool.head("/v1/completions"), b"X-Test: 1\r\n", body)


def _answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%b\r\n%b" % (len(body), extra, body)


def test_content_length_answers_reuse_one_connection() -> None:
    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await reader.request()
            writer.write(_answer(b"echo " + body))

    async def body() -> None:
        async with scripted(script) as (pool, heads):
            for _ in range(3):
                resp = await _post(pool)
                assert resp.status == 200 and await resp.read() == b"echo " + BODY
            assert pool.opened == 1
            assert heads[0].startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"X-Test: 1\r\n" in heads[0] and b"Content-Length: 16\r\n" in heads[0]

    run(body())


def test_chunked_answer_split_anywhere_streams_its_pieces() -> None:
    payload = b"data: one\n\ndata: two\n\n"
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (payload[:9], payload[9:]))
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n"

    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.request()
            for i in range(len(wire)):  # one byte per write: every boundary is crossed
                writer.write(wire[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0)

    async def body() -> None:
        async with scripted(script) as (pool, _):
            for _ in range(2):
                resp = await _post(pool)
                got = b""
                while piece := await resp.read_some():
                    got += piece
                assert got == payload and resp.done
            assert pool.opened == 1  # the chunked answer ended cleanly: kept alive

    run(body())


def test_close_delimited_answer_reads_to_the_end_and_is_not_reused() -> None:
    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        writer.write(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"a": 1}')
        await writer.drain()

    async def body() -> None:
        async with scripted(script) as (pool, _):
            for _ in range(2):
                resp = await _post(pool)
                assert await resp.read() == b'{"a": 1}'
            assert pool.opened == 2

    run(body())


def test_idle_connection_closed_by_the_worker_is_retried_on_a_fresh_one() -> None:
    """A keep-alive timeout at the worker must not fail (or eject) anything."""

    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        writer.write(_answer(b"{}"))  # keep-alive advertised, then closed while idle
        await writer.drain()

    async def body() -> None:
        async with scripted(script) as (pool, heads):
            for _ in range(3):
                resp = await _post(pool)
                assert await resp.read() == b"{}"
                await asyncio.sleep(0.05)  # the close reaches the pool while idle...
            assert pool.opened == 3 and len(heads) == 3

    run(body())


def test_close_racing_the_request_on_a_reused_connection_is_retried() -> None:
    """The worker's close arrives only after the next request was written."""
    connections = 0

    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.request()
        writer.write(_answer(b"{}"))
        await writer.drain()
        if connections == 1:
            await reader.request()  # read the second request, then close without answering

    async def body() -> None:
        async with scripted(script) as (pool, _):
            assert await (await _post(pool)).read() == b"{}"
            assert await (await _post(pool)).read() == b"{}"
            assert pool.opened == 2

    run(body())


def test_fresh_connection_closed_before_the_answer_is_an_unreachable_error() -> None:
    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()

    async def body() -> None:
        async with scripted(script) as (pool, _):
            with pytest.raises(UpstreamError) as info:
                await _post(pool)
            assert info.value.unreachable

    run(body())


def test_refused_connection_is_unreachable() -> None:
    async def body() -> None:
        pool = Pool(f"http://127.0.0.1:{free_port()}", 1.0, 5.0)
        with pytest.raises(UpstreamError) as info:
            await _post(pool)
        assert info.value.unreachable
        pool.close()

    run(body())


def test_answer_cut_off_mid_body_raises_on_read() -> None:
    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
        await writer.drain()

    async def body() -> None:
        async with scripted(script) as (pool, _):
            resp = await _post(pool)
            with pytest.raises(UpstreamError):
                await resp.read()

    run(body())


def test_request_past_its_deadline_times_out() -> None:
    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        await asyncio.sleep(5)

    async def body() -> None:
        async with scripted(script) as (pool, _):
            pool.request_timeout_s = 0.2
            with pytest.raises(UpstreamError, match="timed out") as info:
                await _post(pool)
            assert info.value.unreachable

    run(body())


def test_cancelled_request_closes_its_connection() -> None:
    """The worker sees the client leave (EOF) when the caller is cancelled."""
    saw_eof = asyncio.Event()

    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        if await reader.reader.read(1) == b"":
            saw_eof.set()

    async def body() -> None:
        async with scripted(script) as (pool, _):
            task = asyncio.create_task(_post(pool))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(saw_eof.wait(), 2.0)

    run(body())


def test_abandoned_stream_closes_its_connection() -> None:
    saw_eof = asyncio.Event()

    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        if await reader.reader.read(1) == b"":
            saw_eof.set()

    async def body() -> None:
        async with scripted(script) as (pool, _):
            resp = await _post(pool)
            assert await resp.read_some() == b"hello"
            resp.close()
            await asyncio.wait_for(saw_eof.wait(), 2.0)
            assert pool.opened == 1

    run(body())


def test_malformed_status_line_is_an_error() -> None:
    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        writer.write(b"NOT HTTP\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def body() -> None:
        async with scripted(script) as (pool, _):
            with pytest.raises(UpstreamError, match="malformed"):
                await _post(pool)

    run(body())


def test_header_values_refuse_control_characters() -> None:
    assert header_value("alice") == b"alice"
    assert header_value("caf\u00e9") == "caf\u00e9".encode("latin-1")
    assert header_value("bob\r\nX-Evil: 1") is None
    assert header_value("\u4e2d") is None  # not Latin-1


def test_interim_answers_are_skipped() -> None:
    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"HTTP/1.1 103 Early Hints\r\n\r\n" + _answer(b"{}"))
        await writer.drain()
        await asyncio.sleep(1)

    async def body() -> None:
        async with scripted(script) as (pool, _):
            resp = await _post(pool)
            assert resp.status == 200 and await resp.read() == b"{}"

    run(body())


def test_large_streamed_body_read_slowly_arrives_whole() -> None:
    """More than the read high-water mark waits unread: reading pauses, then resumes."""
    piece = bytes(range(256)) * 256  # 64 KiB

    async def script(reader: _Recorder, writer: asyncio.StreamWriter) -> None:
        await reader.request()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(48):  # 3 MiB
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(2)

    async def body() -> None:
        async with scripted(script) as (pool, _):
            resp = await _post(pool)
            await asyncio.sleep(0.3)  # let it buffer past the high-water mark
            parts = []
            while data := await resp.read_some():
                parts.append(data)
            assert b"".join(parts) == piece * 48 and resp.done

    run(body())
