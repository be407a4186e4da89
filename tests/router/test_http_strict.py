"""Strict HTTP/1.1 at the router's front door (issue 18, items 3, 12 and 13): every head
that aiohttp's parser (llhttp) refuses is refused the same way by the lean front, the
upstream framing refuses malformed answers without raising out of ``data_received``, and an
``Expect: 100-continue`` for a body over the limit gets 413, never ``100 Continue``."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from fairserve.router import http11
from fairserve.router.framing import UpstreamError, parse_head
from fairserve.router.server import RouterServer
from tests.router.helpers import router_config, sim_workers
from tests.worker.helpers import run

BODY = b'{"prompt": "a", "max_tokens": 1}'


def request(headers: bytes, *, line: bytes = b"POST /v1/completions HTTP/1.1") -> bytes:
    """A request for one token, with ``headers`` (CRLF-terminated lines) before its
    Content-Length: served (200) unless its head is refused."""
    return line + b"\r\n" + headers + b"Content-Length: %d\r\n\r\n%b" % (len(BODY), BODY)


GOOD = request(b"Host: x\r\n")


REFUSED: dict[str, bytes] = {
    "bare LF in a value": request(b"Host: x\nX-Fairserve-Client: evil\r\n"),
    "bare CR in a value": request(b"Host: x\rX-Fairserve-Client: evil\r\n"),
    "NUL in a value": request(b"Host: x\x00y\r\n"),
    "control byte in a value": request(b"Host: x\r\nX-A: a\x01b\r\n"),
    "DEL in a value": request(b"Host: x\r\nX-A: a\x7fb\r\n"),
    "space in a name": request(b"Host: x\r\nX A: b\r\n"),
    "space before the colon": request(b"Host : x\r\n"),
    "non-token name": request(b"Host: x\r\nX(A): b\r\n"),
    "empty name": request(b"Host: x\r\n: b\r\n"),
    "no Host on 1.1": request(b""),
    "duplicate Host": request(b"Host: x\r\nHost: y\r\n"),
    "obs-fold": request(b"Host: x\r\nX-A: b\r\n c\r\n"),
    "Content-Length and Transfer-Encoding": request(b"Host: x\r\nTransfer-Encoding: chunked\r\n"),
    "duplicate Content-Length": request(b"Host: x\r\nContent-Length: %d\r\n" % len(BODY)),
    "signed Content-Length": GOOD.replace(b"Length: ", b"Length: +"),
    "empty Content-Length": GOOD.replace(b"Length: %d" % len(BODY), b"Length: "),
    "list Content-Length": GOOD.replace(b"Length: %d" % len(BODY), b"Length: 2, 2"),
    "10,000 headers": request(b"Host: x\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(10000))),
    "129 headers": request(b"Host: x\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(127))),
    "100 KiB URI": request(
        b"Host: x\r\n", line=b"POST /v1/completions?" + b"a" * 102400 + b" HTTP/1.1"
    ),
    "control byte in the query": request(
        b"Host: x\r\n", line=b"POST /v1/completions?a=\x01 HTTP/1.1"
    ),
    "header value over 8190 bytes": request(b"Host: x\r\nX-A: " + b"a" * 8191 + b"\r\n"),
    "lower-case version": request(b"Host: x\r\n", line=b"POST /v1/completions http/1.1"),
    "HTTP/1.2": request(b"Host: x\r\n", line=b"POST /v1/completions HTTP/1.2"),
}


async def exchange(url: str, data: bytes, wait_s: float = 3.0) -> bytes:
    """Send ``data`` on a fresh connection; the first answer that came back (its head, and
    its body when it has a Content-Length), or what came until the server closed or
    ``wait_s`` passed without a byte."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    out = b""
    try:
        writer.write(data)
        await writer.drain()
        while not _complete(out):
            chunk = await asyncio.wait_for(reader.read(65536), wait_s)
            if not chunk:
                break
            out += chunk
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return out


def _complete(raw: bytes) -> bool:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def status_of(raw: bytes) -> int | None:
    """The status of the first answer in ``raw`` (None: no answer)."""
    if not raw.startswith(b"HTTP/1."):
        return None
    return int(raw[9:12])


async def start_pair(workers: list[Any], **overrides: Any) -> tuple[RouterServer, RouterServer]:
    """A router with the lean front and one with the front disabled (aiohttp only)."""
    urls = [w.url for w in workers]
    lean = RouterServer(router_config(urls, **overrides))
    plain = RouterServer(router_config(urls, lean_front=False, **overrides))
    await lean.start()
    await plain.start()
    return lean, plain


def test_refused_heads_get_the_same_status_on_both_paths() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            lean, plain = await start_pair(workers)
            try:
                for name, data in REFUSED.items():
                    got_plain = status_of(await exchange(plain.url, data))
                    got_lean = status_of(await exchange(lean.url, data))
                    assert got_plain in (400, 413, 414, 431), (name, got_plain)
                    assert got_lean == got_plain, (name, got_lean, got_plain)
                http10 = request(b"", line=b"POST /v1/completions HTTP/1.0")  # Host optional
                for data in (GOOD, http10):
                    assert status_of(await exchange(lean.url, data)) == 200
                    assert status_of(await exchange(plain.url, data)) == 200
                assert lean.front is not None and lean.front.handed_over == len(REFUSED)
            finally:
                await lean.stop(drain_timeout_s=1.0)
                await plain.stop(drain_timeout_s=1.0)

    run(body())


def test_over_limit_body_with_expect_gets_413_not_100_continue() -> None:
    data = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Content-Length: 5000\r\n\r\n"
    )

    async def body() -> None:
        async with sim_workers(1) as workers:
            lean, plain = await start_pair(workers, max_body_bytes=200)
            try:
                for server in (lean, plain):
                    raw = await exchange(server.url, data)
                    assert raw.startswith(b"HTTP/1.1 413 "), raw[:100]
                    assert b"100 Continue" not in raw
                    message = json.loads(raw.partition(b"\r\n\r\n")[2])["error"]["message"]
                    assert message == "request body is too large: the limit is 200 bytes"
                small = data.replace(b"5000", b"2")  # within the limit: go ahead
                raw = await exchange(lean.url, small, wait_s=0.5)
                assert raw.startswith(b"HTTP/1.1 100 Continue"), raw[:100]
            finally:
                await lean.stop(drain_timeout_s=1.0)
                await plain.stop(drain_timeout_s=1.0)

    run(body())


# ---------------------------------------------------------------------- the parser itself
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_parser_refuses(name: str) -> None:
    head = REFUSED[name].partition(b"\r\n\r\n")[0]
    with pytest.raises(http11.HeadError):
        http11.parse_request_head(head)


def test_parser_reads_a_good_head() -> None:
    head = http11.parse_request_head(
        b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nX-A:  a\tb \r\n"
        b"x-a: c\r\nContent-Length: 12\r\nConnection: Keep-Alive, Close"
    )
    assert (head.method, head.target, head.http10) == (b"POST", b"/v1/completions?x=1", False)
    assert head.content_length == 12 and head.chunked is False
    assert head.headers.getall("X-A") == ["a\tb", "c"]
    assert head.keep_alive is False  # "close" is a token of Connection


@pytest.mark.parametrize(
    ("version", "connection", "keep_alive"),
    [
        (b"1.1", b"", True),
        (b"1.1", b"xclose", True),  # a token, not a substring
        (b"1.1", b"keep-alive, close", False),
        (b"1.0", b"", False),
        (b"1.0", b"keep-alivex", False),
        (b"1.0", b"foo, Keep-Alive", True),
    ],
)
def test_connection_is_matched_by_token(
    version: bytes, connection: bytes, keep_alive: bool
) -> None:
    head = b"POST / HTTP/" + version + b"\r\nHost: x"
    if connection:
        head += b"\r\nConnection: " + connection
    assert http11.parse_request_head(head).keep_alive is keep_alive


def test_response_heads_are_parsed_strictly() -> None:
    ok = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive")
    assert ok.status == 200 and ok.keep_alive
    for bad in (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10",
        b"HTTP/1.1 200 OK\r\nX-A: a\nContent-Length: 2",
        b"HTTP/1.1 200 OK\r\nX A: b",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 abc OK",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip",
    ):
        with pytest.raises(ValueError):
            parse_head(bad)
    closing = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: xclose")
    assert closing.keep_alive  # "xclose" is not "close"


def _chunked() -> Any:
    return parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")


@pytest.mark.parametrize(
    "data",
    [
        b"zz\r\n",  # not hex
        b"-1\r\n",
        b" \r\n",
        b"1" * 40 + b"\r\n",  # more hex digits than any size
        b"1" * 5000,  # a size line that never ends
        b"2\r\nabXY",  # no CRLF after the data
    ],
    ids=["not-hex", "negative", "blank", "40-digits", "endless-line", "no-crlf-after-data"],
)
def test_bad_chunks_fail_the_answer_without_raising(data: bytes) -> None:
    async def body() -> None:
        resp = _chunked()
        assert resp.feed(data) == b""  # no exception out of the connection's data_received
        with pytest.raises(UpstreamError, match="chunk"):
            await resp.read()

    run(body())


def test_chunked_body_with_extensions_and_trailers() -> None:
    async def body() -> None:
        resp = _chunked()
        rest = resp.feed(b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\nNEXT")
        assert rest == b"NEXT" and resp.done
        assert await resp.read() == b"abcde"

    run(body())


def test_refused_heads_leave_no_traceback_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """A malformed request is the client's fault: one debug line, not an ERROR with a
    traceback per request (which lets any client flood the log)."""

    async def body() -> None:
        async with sim_workers(1) as workers:
            lean, plain = await start_pair(workers)
            try:
                for data in list(REFUSED.values())[:6]:
                    assert status_of(await exchange(lean.url, data)) == 400
                    assert status_of(await exchange(plain.url, data)) == 400
            finally:
                await lean.stop(drain_timeout_s=1.0)
                await plain.stop(drain_timeout_s=1.0)

    with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        run(body())
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    assert any("400" in r.getMessage() for r in caplog.records)  # still said, quietly


def test_a_worker_answering_a_malformed_chunked_body_gets_a_clear_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bad chunk size fails that answer (a 5xx in the OpenAI shape, promptly), never
    an exception out of the upstream connection's ``data_received``."""
    from aiohttp import web

    from tests.router.helpers import bind_runner

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        request.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n"
        )
        await asyncio.sleep(30)
        raise AssertionError("the router should have given up on this answer")

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "default"}]})

    async def body() -> None:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/chat/completions", chat),
                web.get("/health", health),
                web.get("/v1/models", models),
            ]
        )
        runner, url = await bind_runner(app)
        server = RouterServer(router_config([url]))
        try:
            await server.start()
            data = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
            raw = await exchange(
                server.url,
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b"
                % (len(data), data),
                wait_s=5.0,
            )
            assert status_of(raw) in (502, 503), raw[:300]
            assert json.loads(raw.partition(b"\r\n\r\n")[2])["error"]["message"]
        finally:
            await server.stop(drain_timeout_s=1.0)
            await runner.shutdown()
            await runner.cleanup()

    with caplog.at_level(logging.ERROR):
        run(body())
    raised = [r for r in caplog.records if "data_received" in r.getMessage() or r.exc_info]
    assert not raised, [r.getMessage() for r in raised]
