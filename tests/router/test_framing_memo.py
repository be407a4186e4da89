"""The upstream client remembers recent answer heads (``framing.parse_head``): an answer
built from a remembered head is the one a fresh parse gives, a head that breaks the rules
raises every time, and the memory stays bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.router import framing
from fairserve.router.framing import HEAD_MEMO_ENTRIES, HEAD_MEMO_MAX_BYTES, Response, parse_head
from fairserve.router.http11 import HeadError


def _fields(resp: Response) -> tuple[object, ...]:
    """What an answer's head decided about it (status, type, connection, framing)."""
    return (
        resp.status,
        resp.content_type,
        resp.keep_alive,
        resp.done,
        resp._mode,
        resp._remaining,
        resp._chunks is not None,
    )


def _fresh(head: bytes) -> Response:
    """The answer by the rules alone, nothing remembered."""
    status, content_type, keep_alive, length, chunked = framing.announce(head)
    resp = Response(status, content_type, keep_alive)
    resp._frame(length, chunked)
    return resp


_LINES = st.sampled_from(
    [
        b"Content-Type: application/json",
        b"content-type: text/event-stream; charset=utf-8",
        b"Content-Length: 0",
        b"Content-Length: 299",
        b"Content-Length: 12x",
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: gzip",
        b"Connection: close",
        b"Connection: keep-alive",
        b"date: Sun, 06 Dec 2026 06:15:01 GMT",
        b"server: uvicorn",
        b"X-Bad\x01: value",
        b" folded",
    ]
)
_HEADS = st.builds(
    lambda version, status, lines: b"\r\n".join([b"HTTP/1.%d %d OK" % (version, status), *lines]),
    st.sampled_from([0, 1]),
    st.sampled_from([100, 200, 204, 304, 404, 500]),
    st.lists(_LINES, max_size=4),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(heads=st.lists(_HEADS, min_size=1, max_size=6))
def test_a_remembered_head_gives_the_answer_a_fresh_parse_gives(heads: list[bytes]) -> None:
    for head in heads + heads:  # the second time from memory, where it was remembered
        try:
            expected = _fields(_fresh(head))
        except HeadError:
            try:
                parse_head(head)
            except HeadError:
                continue
            raise AssertionError(f"{head!r} was accepted once remembered") from None
        assert _fields(parse_head(head)) == expected


def test_a_head_that_breaks_the_rules_raises_every_time() -> None:
    bad = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2"
    for _ in range(2):
        try:
            parse_head(bad)
        except HeadError:
            continue
        raise AssertionError("accepted")
    assert bad not in framing.announced_by_head


def test_the_memory_is_bounded_and_long_heads_are_not_remembered() -> None:
    for n in range(HEAD_MEMO_ENTRIES * 3):
        parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: %d" % n)
        assert len(framing.announced_by_head) <= HEAD_MEMO_ENTRIES
    long = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: " + b"a" * HEAD_MEMO_MAX_BYTES
    assert parse_head(long).status == 200
    assert long not in framing.announced_by_head


def test_each_answer_is_a_new_response() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2"
    first, second = parse_head(head), parse_head(head)
    assert first is not second
    first.feed(b"ok")
    assert first.done and not second.done
