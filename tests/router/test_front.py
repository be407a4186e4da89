"""The router's lean HTTP front (``router.front``) over raw sockets: what it serves itself,
what it hands to aiohttp, pipelining, bodies in pieces, HTTP/1.0, and answers identical to
the aiohttp path's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fairserve.router.server import RouterServer
from tests.router.helpers import chat, router_config, sim_workers
from tests.worker.helpers import run


async def _send(url: str, data: bytes, *, pieces: int = 1, pause_s: float = 0.0) -> bytes:
    """Write ``data`` (in ``pieces``), then read until the server closes or 3 s pass."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    step = -(-len(data) // pieces)
    for i in range(0, len(data), step):
        writer.write(data[i : i + step])
        await writer.drain()
        await asyncio.sleep(pause_s)
    out = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 3.0):
            out += chunk
    except TimeoutError:
        pass
    writer.close()
    return out


def _post(path: str, body: Any, *, version: str = "1.1", extra: str = "") -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n{extra}\r\n"
    )
    return head.encode() + payload


def _answers(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Consecutive Content-Length answers in ``raw``: (status, headers, body)."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        length = int(headers["content-length"])
        out.append((int(lines[0].split()[1]), headers, rest[:length]))
        raw = rest[length:]
    return out


async def _router(workers: list[Any], **overrides: Any) -> RouterServer:
    server = RouterServer(router_config([w.url for w in workers], **overrides))
    await server.start()
    return server


def test_pipelined_requests_are_answered_in_order_by_the_front() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _router(workers)
            try:
                first = _post("/v1/completions", {"prompt": "a", "max_tokens": 2})
                second = _post(
                    "/v1/chat/completions", chat(max_tokens=3), extra="Connection: close\r\n"
                )
                answers = _answers(await _send(server.url, first + second))
                assert [a[0] for a in answers] == [200, 200]
                usage = [json.loads(a[2])["usage"]["completion_tokens"] for a in answers]
                assert usage == [2, 3]
                assert answers[1][1]["connection"] == "close"
                assert server.front is not None and server.front.handed_over == 0
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


def test_a_body_arriving_in_pieces_is_read_whole() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _router(workers)
            try:
                data = _post("/v1/completions", {"prompt": "x " * 300, "max_tokens": 2},
                             extra="Connection: close\r\n")  # fmt: skip
                [(status, _, answer)] = _answers(
                    await _send(server.url, data, pieces=5, pause_s=0.02)
                )
                assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 2
                assert server.front is not None and server.front.handed_over == 0
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


def test_other_requests_are_handed_to_aiohttp() -> None:
    """Chunked or oversize bodies, other methods and paths: aiohttp answers as always."""
    chunk = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    chunked = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(chunk), chunk)
    )
    cases = [
        (chunked, 200, None),
        (_post("/v1/completions", {"prompt": "x" * 300}, extra="Connection: close\r\n"), 413,
         "request body is too large: the limit is 200 bytes"),
        (b"GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, None),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 200, None),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, None),
    ]  # fmt: skip

    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _router(workers, max_body_bytes=200)
            try:
                for data, status, message in cases:
                    raw = await _send(server.url, data)
                    assert raw.startswith(b"HTTP/1.1 %d " % status), raw[:200]
                    if message is not None:
                        assert message in raw.decode()
                assert server.front is not None and server.front.handed_over == len(cases)
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


def test_http10_answers_and_closes() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _router(workers)
            try:
                plain = await _send(
                    server.url, _post("/v1/completions", {"prompt": "a"}, version="1.0")
                )
                [(status, headers, _)] = _answers(plain)
                assert status == 200 and headers["connection"] == "close"
                stream = {"prompt": "a", "max_tokens": 3, "stream": True}
                raw = await _send(server.url, _post("/v1/completions", stream, version="1.0"))
                head, _, events = raw.partition(b"\r\n\r\n")
                assert b"text/event-stream" in head and b"chunked" not in head.lower()
                assert events.rstrip().endswith(b"data: [DONE]")
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


BAD_REQUESTS = [
    _post("/v1/completions", {"max_tokens": 2}),
    _post("/v1/chat/completions", {"messages": "hi"}),
    _post("/v1/completions", {"prompt": "a", "model": 5}),  # any name is served by one model
    _post("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}),
    _post("/v1/completions", {"prompt": "a", "user": 5}),
    _post("/v1/completions", {"prompt": "a"}, extra="X-Fairserve-Client: \r\n"),
    _post("/v1/completions", {"prompt": "a"}, extra="Authorization: Bearer wrong\r\n"),
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{bad}",
]


def test_errors_are_the_same_on_both_paths() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            clients = {"good": _client()}
            trusted = {"clients": clients, "trust_identity_header": True}  # the body errors
            lean = await _router(workers, **trusted)
            plain = await _router(workers, lean_front=False, **trusted)
            try:
                for data in BAD_REQUESTS:
                    data = data.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
                    [(s1, h1, b1)] = _answers(await _send(lean.url, data))
                    [(s2, h2, b2)] = _answers(await _send(plain.url, data))
                    assert 400 <= s1 < 500 and (s1, json.loads(b1)) == (s2, json.loads(b2))
                    assert h1.get("content-type") == h2.get("content-type")
                assert lean.front is not None and lean.front.handed_over == 0
            finally:
                await lean.stop(drain_timeout_s=1.0)
                await plain.stop(drain_timeout_s=1.0)

    run(body())


def _client() -> Any:
    from fairserve.router.config import ClientEntry

    return ClientEntry("good")


def test_stop_lets_the_request_in_flight_finish() -> None:
    async def body() -> None:
        async with sim_workers(1, speed=1.0) as workers:  # 40 tokens take about 1.6 s
            server = await _router(workers)
            data = _post("/v1/completions", {"prompt": "a", "max_tokens": 40, "stream": True})
            sending = asyncio.create_task(_send(server.url, data))
            await asyncio.sleep(0.3)
            assert server.router.active == 1
            assert await server.stop(drain_timeout_s=5.0)
            raw = await sending
            assert raw.startswith(b"HTTP/1.1 200 OK") and b"data: [DONE]" in raw
            assert raw.count(b"data: {") == 40

    run(body())


def test_idle_connections_are_closed_but_busy_ones_are_not() -> None:
    async def body() -> None:
        async with sim_workers(1, speed=1.0) as workers:  # 40 tokens take about 1.6 s
            server = await _router(workers)
            assert server.front is not None
            server.front.idle_timeout_s = 0.3  # before the first connection arms the sweep
            try:
                host, port = server.url.removeprefix("http://").split(":")
                idle_reader, idle_writer = await asyncio.open_connection(host, int(port))
                stream = {"prompt": "a", "max_tokens": 40, "stream": True}
                busy = asyncio.create_task(_send(server.url, _post("/v1/completions", stream)))
                assert await asyncio.wait_for(idle_reader.read(), 3.0) == b""  # closed
                idle_writer.close()
                raw = await busy  # the stream outlives the idle timeout
                assert raw.startswith(b"HTTP/1.1 200 OK") and b"data: [DONE]" in raw
                assert raw.count(b"data: {") == 40
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())


class _Transport:
    """Records writes; stands for a socket whose client reads slowly."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_stream_writes_wait_while_the_client_reads_slowly() -> None:
    from fairserve.router.front import Front, FrontConnection

    async def body() -> None:
        async with sim_workers(1) as workers:
            server = await _router(workers)
            try:
                conn = FrontConnection(Front(server.router, lambda: asyncio.Protocol()))
                transport = _Transport()
                conn.connection_made(transport)  # type: ignore[arg-type]
                await conn.open_stream()
                conn.pause_writing()  # the socket buffer is full
                writing = asyncio.create_task(conn.write(b"data: x\n\n"))
                await asyncio.sleep(0.05)
                assert not writing.done() and transport.written[-1] == b"9\r\ndata: x\n\n\r\n"
                conn.resume_writing()
                await asyncio.wait_for(writing, 1.0)
                conn.pause_writing()
                blocked = asyncio.create_task(conn.write(b"y"))
                await asyncio.sleep(0.05)
                conn.connection_lost(None)  # the client left: the writer is released
                try:
                    await asyncio.wait_for(blocked, 1.0)
                    raise AssertionError("a write to a closed connection succeeded")
                except ConnectionResetError:
                    pass
            finally:
                await server.stop(drain_timeout_s=1.0)

    run(body())
